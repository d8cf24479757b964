"""ortlearn.api: onnxruntime.training.api's Module/Optimizer/LinearLRScheduler."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from ortlearn import api, artifacts
from ortlearn.graph import make_model

N_HIDDEN = 32


def _digits_model(rng):
    """Gemm-Relu-Gemm: 64 pixels -> 32 hidden units -> 10 logits (float32)."""
    params = {
        "fc1.weight": (rng.normal(size=(N_HIDDEN, 64)) / 8).astype(np.float32),
        "fc1.bias": np.zeros(N_HIDDEN, np.float32),
        "fc2.weight": (rng.normal(size=(10, N_HIDDEN)) / np.sqrt(N_HIDDEN)).astype(np.float32),
        "fc2.bias": np.zeros(10, np.float32),
    }
    nodes = [helper.make_node("Gemm", ["input", "fc1.weight", "fc1.bias"], ["fc1"], transB=1),
             helper.make_node("Relu", ["fc1"], ["relu"]),
             helper.make_node("Gemm", ["relu", "fc2.weight", "fc2.bias"], ["logits"], transB=1)]
    graph = helper.make_graph(
        nodes, "digits", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    return make_model(graph, [helper.make_opsetid("", 18)]), params


@pytest.fixture(scope="module")
def digits_artifacts(tmp_path_factory):
    directory = tmp_path_factory.mktemp("digits")
    model, params = _digits_model(np.random.default_rng(0))
    artifacts.generate_artifacts(
        model, requires_grad=list(params), loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW, artifact_directory=directory,
        additional_output_names=["logits"])
    return directory, params


def _open(directory):
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state,
                        str(directory / "eval_model.onnx"), device="cpu")
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    return state, module, optimizer


def test_digits_classifier_as_an_onnxruntime_training_user_writes_it(digits_artifacts, tmp_path):
    directory, _ = digits_artifacts
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y.astype(np.int64), test_size=0.25,
                                                        random_state=0)
    state, model, optimizer = _open(directory)
    optimizer.set_learning_rate(0.01)
    rng = np.random.default_rng(0)

    losses = []
    for _ in range(15):
        model.train()
        order = rng.permutation(len(X_train))
        for start in range(0, len(order), 32):
            batch = order[start:start + 32]
            loss, _ = model(X_train[batch], y_train[batch])
            optimizer.step()
            model.lazy_reset_grad()
        model.eval()
        losses.append(float(model(X_test, y_test)[0]))
    assert losses[-1] < losses[0] < 1.0

    model.export_model_for_inferencing(str(tmp_path / "digits.onnx"), ["logits"])
    session = ort.InferenceSession(str(tmp_path / "digits.onnx"),
                                   providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input": X_test})[0]
    accuracy = np.mean(logits.argmax(axis=1) == y_test)
    assert accuracy > 0.93
    np.testing.assert_allclose(logits, model(X_test, y_test)[1], rtol=1e-5, atol=1e-5)


def test_call_returns_one_array_or_a_tuple(tmp_path):
    model, params = _digits_model(np.random.default_rng(1))
    artifacts.generate_artifacts(model, requires_grad=list(params),
                                 loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    _, module, _ = _open(tmp_path)
    X = np.random.default_rng(2).random((5, 64), dtype=np.float32)
    y = np.arange(5, dtype=np.int64)
    loss = module(X, y)  # one user output: the loss itself, not a tuple
    # OrtValues in, an OrtValue out (as in onnxruntime-training)
    as_ortvalue = module(ort.OrtValue.ortvalue_from_numpy(X), ort.OrtValue.ortvalue_from_numpy(y))
    assert isinstance(as_ortvalue, ort.OrtValue) and as_ortvalue.numpy() == loss
    assert isinstance(loss, np.ndarray) and loss.shape == ()
    logits = X @ params["fc1.weight"].T + params["fc1.bias"]
    logits = np.maximum(logits, 0) @ params["fc2.weight"].T + params["fc2.bias"]
    log_softmax = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(loss, -log_softmax[np.arange(5), y].mean(), rtol=1e-5)


def test_modes_names_and_parameter_buffers(digits_artifacts):
    directory, params = digits_artifacts
    state, module, optimizer = _open(directory)
    assert module.training
    assert module.input_names() == ["input", "labels"]  # onnxruntime-training's name
    assert module.output_names() == ["loss", "logits"]
    assert module.eval() is module and not module.training
    assert module.output_names() == ["loss", "logits"]
    assert module.train() is module and module.training

    size = sum(p.size for p in params.values())
    assert module.get_parameters_size() == size
    assert module.get_parameters_size(trainable_only=False) == size
    buffer = module.get_contiguous_parameters()
    assert isinstance(buffer, ort.OrtValue) and buffer.shape() == [size]
    expected = np.concatenate([p.ravel() for p in params.values()])
    np.testing.assert_array_equal(buffer.numpy(), expected)

    module.copy_buffer_to_parameters(ort.OrtValue.ortvalue_from_numpy(expected * 0.5))
    np.testing.assert_array_equal(state.parameters["fc2.bias"].data, params["fc2.bias"] * 0.5)
    np.testing.assert_array_equal(state.parameters["fc1.weight"].data,
                                  params["fc1.weight"] * 0.5)


def test_optimizer_learning_rate_and_linear_scheduler(digits_artifacts):
    directory, _ = digits_artifacts
    _, module, optimizer = _open(directory)
    assert optimizer.get_learning_rate() == pytest.approx(1e-3)
    optimizer.set_learning_rate(0.5)
    assert optimizer.get_learning_rate() == pytest.approx(0.5)

    scheduler = api.LinearLRScheduler(optimizer, warmup_step_count=2, total_step_count=4,
                                      initial_lr=0.1)
    rates = [optimizer.get_learning_rate()]
    X = np.zeros((2, 64), np.float32)
    y = np.zeros(2, np.int64)
    for _ in range(5):
        module(X, y)
        optimizer.step()
        module.lazy_reset_grad()
        scheduler.step()
        rates.append(optimizer.get_learning_rate())
    # onnxruntime-training 1.19.2's rates (measured): its scheduler gets the two counts
    # swapped, so the rate rises over total_step_count steps and drops to 0 after.
    np.testing.assert_allclose(rates, [0.0, 0.025, 0.05, 0.075, 0.0, 0.0], atol=1e-8)


def test_errors(digits_artifacts):
    directory, _ = digits_artifacts
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state)
    with pytest.raises(ValueError, match="expects 2 input"):
        module(np.zeros((1, 64), np.float32))
    module.eval()
    with pytest.raises(ValueError, match="needs an eval model"):
        module(np.zeros((1, 64), np.float32), np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="Unknown device"):
        api.Module(str(directory / "training_model.onnx"), state, device="gpu0")
    model = onnx.load(directory / "training_model.onnx")
    assert model.graph.input[-1].name == "lazy_reset_grad"
