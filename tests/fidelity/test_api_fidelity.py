"""ortlearn.api, CheckpointState and onnxblock's checkpoint functions behave as
onnxruntime-training 1.19 does (nominal checkpoints, gradients, OrtValue calls, non-float
inputs, error classes). Each expectation was checked against onnxruntime-training 1.19.2."""

import io
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn import api, artifacts, onnxblock
from ortlearn.exceptions import NominalCheckpointError, TrainingApiError

torch = pytest.importorskip("torch")

N_IN, N_HIDDEN, N_CLASSES = 4, 3, 2
PARAMS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
TRAINABLE, FROZEN = PARAMS[:3], PARAMS[3:]


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(N_IN, N_HIDDEN)
        self.fc2 = torch.nn.Linear(N_HIDDEN, N_CLASSES)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return _Net()


@pytest.fixture(scope="module")
def base_model(net):
    """The torch model exported as onnxruntime-training's docs export it."""
    f = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notices
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(net, (torch.randn(5, N_IN),), f, input_names=["input"],
                          output_names=["output"],
                          dynamic_axes={"input": {0: "N"}, "output": {0: "N"}},
                          do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                          dynamo=False, opset_version=18)
    model = onnx.load_from_string(f.getvalue())
    assert [t.name for t in model.graph.initializer] == PARAMS
    return model


@pytest.fixture(scope="module")
def art(base_model, tmp_path_factory):
    directory = tmp_path_factory.mktemp("fidelity")
    artifacts.generate_artifacts(
        base_model, requires_grad=TRAINABLE, frozen_params=FROZEN,
        loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.SGD,
        artifact_directory=directory, nominal_checkpoint=True, additional_output_names=["output"])
    return directory


def _batch(seed=0, n=5):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, N_IN)).astype(np.float32),
            rng.integers(0, N_CLASSES, n).astype(np.int64))


def _module(art, checkpoint="checkpoint", eval_model=True):
    state = api.CheckpointState.load_checkpoint(art / checkpoint)
    module = api.Module(art / "training_model.onnx", state,
                        art / "eval_model.onnx" if eval_model else None)
    return state, module


def _torch_loss_and_grads(net, X, y):
    params = dict(net.named_parameters())
    for p in params.values():
        p.grad = None
    logits = net(torch.from_numpy(X))
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
    loss.backward()
    return loss.item(), {k: p.grad.numpy().copy() for k, p in params.items()}


# ------------------------------------------------------------ nominal checkpoints

def test_nominal_checkpoint_has_names_and_shapes_and_refuses_every_use_of_values(art, net):
    state, module = _module(art, "nominal_checkpoint")
    assert [n for n, _ in state.parameters] == PARAMS
    assert state.parameters["fc1.weight"].shape == (N_HIDDEN, N_IN)
    X, y = _batch()
    uses = {
        "parameter data": lambda: state.parameters["fc1.weight"].data,
        "parameter grad": lambda: state.parameters["fc1.weight"].grad,
        "train_step": lambda: module(X, y),
        "get_contiguous_parameters": lambda: module.get_contiguous_parameters(),
        "export_model_for_inferencing": lambda: module.export_model_for_inferencing(
            art / "never.onnx", ["output"]),
    }
    # onnxruntime-training's sentences (its tests match them), then ortlearn's remedy
    sentences = {"parameter data": "Please load the parameter states first",
                 "parameter grad": "Please load the parameter states first"}
    for what, use in uses.items():
        with pytest.raises(RuntimeError, match="nominal") as info:
            use()
        assert isinstance(info.value, NominalCheckpointError), what
        assert sentences.get(what, "Please load the model parameters first.") in str(
            info.value), what
    module.eval()
    with pytest.raises(NominalCheckpointError, match="eval_step needs the parameters' values"):
        module(X, y)
    module.train()
    optimizer = api.Optimizer(art / "optimizer_model.onnx", module)  # allowed, as in ORT
    with pytest.raises(RuntimeError, match="optimizer_step .* copy_buffer_to_parameters"):
        optimizer.step()
    assert not os.path.exists(art / "never.onnx")
    # sizes need no values: 15 + 3 + 6 trainable, 2 frozen
    assert module.get_parameters_size() == 21
    assert module.get_parameters_size(trainable_only=False) == 23


def test_nominal_checkpoint_trains_like_the_full_one_once_all_values_are_loaded(art):
    full_state, full = _module(art)
    nominal_state, nominal = _module(art, "nominal_checkpoint")
    full_opt = api.Optimizer(art / "optimizer_model.onnx", full)
    nominal_opt = api.Optimizer(art / "optimizer_model.onnx", nominal)
    buffer = full.get_contiguous_parameters(trainable_only=False)
    # the trainable parameters alone would leave fc2.bias without a value
    with pytest.raises(NominalCheckpointError, match=r"\['fc2.bias'\] would stay without values"):
        nominal.copy_buffer_to_parameters(full.get_contiguous_parameters(trainable_only=True))
    nominal.copy_buffer_to_parameters(buffer, trainable_only=False)
    assert not nominal_state.is_nominal
    for step in range(3):
        X, y = _batch(step)
        assert nominal(X, y)[0] == full(X, y)[0]
        full_opt.step()
        nominal_opt.step()
        full.lazy_reset_grad()
        nominal.lazy_reset_grad()
    for name in PARAMS:
        np.testing.assert_array_equal(nominal_state.parameters[name].data,
                                      full_state.parameters[name].data)
    trained = full_state.parameters["fc1.weight"].data
    assert not np.array_equal(trained, api.CheckpointState.load_checkpoint(
        art / "checkpoint").parameters["fc1.weight"].data)


def test_a_nominal_state_is_never_saved_over_trained_values(art, tmp_path):
    target = tmp_path / "trained"
    full_state, _ = _module(art)
    api.CheckpointState.save_checkpoint(full_state, target)
    before = target.read_bytes()
    nominal_state = api.CheckpointState.load_checkpoint(art / "nominal_checkpoint")
    with pytest.raises(NominalCheckpointError, match="holds parameter values"):
        api.CheckpointState.save_checkpoint(nominal_state, target)
    assert target.read_bytes() == before
    # a nominal file may replace a nominal file, or go to a new path
    api.CheckpointState.save_checkpoint(nominal_state, tmp_path / "nominal")
    api.CheckpointState.save_checkpoint(nominal_state, tmp_path / "nominal")
    assert api.CheckpointState.load_checkpoint(tmp_path / "nominal").is_nominal
    # once a module loaded the values, the state saves them
    module = api.Module(art / "training_model.onnx", nominal_state)
    values = np.arange(23, dtype=np.float32)
    module.copy_buffer_to_parameters(values, trainable_only=False)
    api.CheckpointState.save_checkpoint(nominal_state, target)
    reloaded = api.CheckpointState.load_checkpoint(target)
    np.testing.assert_array_equal(reloaded.parameters["fc2.bias"].data, [21, 22])
    np.testing.assert_array_equal(reloaded.parameters["fc1.weight"].data.ravel(), np.arange(12))


# ------------------------------------------------------------------- Parameter.grad

def test_grad_is_none_then_zeros_then_the_accumulated_gradient(art, net):
    state = api.CheckpointState.load_checkpoint(art / "checkpoint")
    assert state.parameters["fc1.weight"].grad is None  # no module yet
    module = api.Module(art / "training_model.onnx", state)
    np.testing.assert_array_equal(state.parameters["fc1.weight"].grad,
                                  np.zeros((N_HIDDEN, N_IN), np.float32))
    assert state.parameters["fc2.bias"].grad is None  # frozen
    X, y = _batch(3)
    loss = module(X, y)[0]
    torch_loss, torch_grads = _torch_loss_and_grads(net, X, y)
    assert loss == pytest.approx(torch_loss, rel=1e-6)
    for name in TRAINABLE:
        np.testing.assert_allclose(state.parameters[name].grad, torch_grads[name], atol=1e-6)
    # lazy: the gradients stay until the next training step, which replaces them
    module.lazy_reset_grad()
    np.testing.assert_allclose(state.parameters["fc1.bias"].grad, torch_grads["fc1.bias"],
                               atol=1e-6)
    X2, y2 = _batch(4)
    module(X2, y2)
    _, torch_grads2 = _torch_loss_and_grads(net, X2, y2)
    np.testing.assert_allclose(state.parameters["fc1.bias"].grad, torch_grads2["fc1.bias"],
                               atol=1e-6)


# ------------------------------------------- onnxblock.save_checkpoint / load_...

class _Block(onnxblock.TrainingBlock):
    def __init__(self):
        super().__init__()
        self.loss = onnxblock.loss.CrossEntropyLoss()

    def build(self, output_name):
        return self.loss(output_name)


def test_onnxblock_save_checkpoint_writes_training_block_parameters(base_model, tmp_path):
    block = _Block()
    for name in TRAINABLE:
        block.requires_grad(name)
    for name in FROZEN:
        block.requires_grad(name, False)
    with onnxblock.base(onnx.ModelProto.FromString(base_model.SerializeToString())):
        block("output")
    parameters = block.parameters()
    onnxblock.save_checkpoint(parameters, tmp_path / "checkpoint")
    onnxblock.save_checkpoint(parameters, tmp_path / "nominal", nominal_checkpoint=True)
    state = api.CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    assert [(n, p.requires_grad) for n, p in state.parameters] == [
        (n, n in TRAINABLE) for n in PARAMS]
    for tensor in base_model.graph.initializer:
        np.testing.assert_array_equal(state.parameters[tensor.name].data,
                                      numpy_helper.to_array(tensor))
    nominal = api.CheckpointState.load_checkpoint(tmp_path / "nominal")
    assert nominal.is_nominal and nominal.parameters["fc2.weight"].shape == (N_CLASSES, N_HIDDEN)
    assert os.path.getsize(tmp_path / "nominal") < os.path.getsize(tmp_path / "checkpoint")
    with pytest.raises(RuntimeError, match="No checkpoint parameters provided"):
        onnxblock.save_checkpoint(None, tmp_path / "none")
    with pytest.raises(TypeError, match="onnx.TensorProto"):
        onnxblock.save_checkpoint(({"w": np.zeros(2)}, []), tmp_path / "bad")


def test_load_checkpoint_to_model_puts_trained_values_into_the_inference_model(
        art, base_model, tmp_path):
    state, module = _module(art)
    optimizer = api.Optimizer(art / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.5)
    for step in range(3):
        module(*_batch(step))
        optimizer.step()
        module.lazy_reset_grad()
    api.CheckpointState.save_checkpoint(state, tmp_path / "trained")
    model = onnx.ModelProto.FromString(base_model.SerializeToString())
    model.graph.initializer.append(numpy_helper.from_array(np.full(2, 7, np.float32), "extra"))
    onnxblock.load_checkpoint_to_model(tmp_path / "trained", model)
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for name in PARAMS:
        np.testing.assert_array_equal(values[name], state.parameters[name].data)
    np.testing.assert_array_equal(values["extra"], [7, 7])  # not in the checkpoint: kept
    del model.graph.initializer[-1]
    X, y = _batch(9)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    module.eval()
    np.testing.assert_allclose(session.run(None, {"input": X})[0], module(X, y)[1], rtol=1e-6)
    with pytest.raises(NominalCheckpointError, match="nominal checkpoint"):
        onnxblock.load_checkpoint_to_model(art / "nominal_checkpoint", model)
    with pytest.raises(TypeError, match="onnx.ModelProto"):
        onnxblock.load_checkpoint_to_model(tmp_path / "trained", str(art / "eval_model.onnx"))


# --------------------------------------------------- non-float graph inputs

def _mixed_inputs_model(with_string: bool):
    """out = Where(mask, x @ W + E[idx] (+ F[code(cat)]), 0): float, int64, bool, string."""
    rng = np.random.default_rng(0)
    params = {"W": rng.normal(size=(3, 2)), "E": rng.normal(size=(4, 2)),
              "F": rng.normal(size=(3, 2))}
    params = {k: v.astype(np.float32) for k, v in params.items()}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Gather", ["E", "idx"], ["e"], axis=0),
             helper.make_node("Add", ["h", "e"], ["s0"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
              helper.make_tensor_value_info("idx", TensorProto.INT64, ["N"]),
              helper.make_tensor_value_info("mask", TensorProto.BOOL, ["N"])]
    if with_string:
        nodes += [helper.make_node("LabelEncoder", ["cat"], ["code"], domain="ai.onnx.ml",
                                   keys_strings=["a", "b", "c"], values_int64s=[0, 1, 2],
                                   default_int64=0),
                  helper.make_node("Gather", ["F", "code"], ["f"], axis=0),
                  helper.make_node("Add", ["s0", "f"], ["s"])]
        inputs.append(helper.make_tensor_value_info("cat", TensorProto.STRING, ["N"]))
    else:
        nodes.append(helper.make_node("Identity", ["s0"], ["s"]))
        del params["F"]
    nodes += [helper.make_node("Unsqueeze", ["mask", "axes"], ["mask2"]),
              helper.make_node("Where", ["mask2", "s", "zero"], ["out"])]
    graph = helper.make_graph(
        nodes, "mixed", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(v, k) for k, v in params.items()]
        + [numpy_helper.from_array(np.array([1], np.int64), "axes"),
           numpy_helper.from_array(np.array(0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 9
    return model, params


@pytest.mark.parametrize("with_string", [True, False])
def test_module_with_int64_bool_and_string_inputs(with_string, tmp_path):
    model, params = _mixed_inputs_model(with_string)
    artifacts.generate_artifacts(model, requires_grad=list(params), loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    state, module = _module(tmp_path)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 3)).astype(np.float32)
    idx = np.array([0, 3, 1, 3], np.int64)
    mask = np.array([True, False, True, True])
    cat = np.array(["a", "c", "zz", "b"])  # "zz" is unknown: code 0
    target = rng.normal(size=(4, 2)).astype(np.float32)
    # numpy reference of the loss and of its gradients
    s = x @ params["W"] + params["E"][idx]
    if with_string:
        code = np.array([0, 2, 0, 1])
        s = s + params["F"][code]
    diff = np.where(mask[:, None], s, 0) - target
    expected_loss = np.mean(diff ** 2)
    ds = np.where(mask[:, None], 2 * diff / diff.size, 0)
    expected = {"W": x.T @ ds, "E": np.zeros((4, 2)), "F": np.zeros((3, 2))}
    np.add.at(expected["E"], idx, ds)
    if with_string:
        np.add.at(expected["F"], code, ds)
    feeds = [x, idx, mask] + ([cat] if with_string else []) + [target]

    loss = module(*feeds)
    assert isinstance(loss, np.ndarray) and loss == pytest.approx(expected_loss, rel=1e-6)
    for name in params:
        np.testing.assert_allclose(state.parameters[name].grad, expected[name], atol=1e-6)
    if with_string:  # onnxruntime makes no OrtValue of strings: those stay numpy (object too)
        ov = [ort.OrtValue.ortvalue_from_numpy(v) for v in (x, idx, mask)]
        loss = module(*ov, cat.astype(object), ort.OrtValue.ortvalue_from_numpy(target))
        assert isinstance(loss, np.ndarray)
    else:
        loss = module(*[ort.OrtValue.ortvalue_from_numpy(v) for v in feeds])
        assert isinstance(loss, ort.OrtValue)
        loss = loss.numpy()
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    module.eval()
    np.testing.assert_allclose(module(*feeds), expected_loss, rtol=1e-6)
    with pytest.raises(TypeError, match="'idx' of train_step must be int64, got int32"):
        module.train()(x, idx.astype(np.int32), *feeds[2:])


# ------------------------------------------------------------ OrtValue in, out

def test_ortvalue_inputs_give_ortvalue_outputs(art):
    _, module = _module(art)
    X, y = _batch(5)
    as_numpy = module(X, y)
    assert isinstance(as_numpy, tuple) and len(as_numpy) == 2  # loss, output
    assert all(isinstance(v, np.ndarray) for v in as_numpy)
    first = module(ort.OrtValue.ortvalue_from_numpy(X), ort.OrtValue.ortvalue_from_numpy(y))
    assert isinstance(first, tuple) and all(isinstance(v, ort.OrtValue) for v in first)
    loss_before = first[0].numpy().copy()
    np.testing.assert_array_equal(loss_before, as_numpy[0])
    np.testing.assert_array_equal(first[1].numpy(), as_numpy[1])
    # one numpy input is enough for numpy outputs, as in onnxruntime-training
    mixed = module(ort.OrtValue.ortvalue_from_numpy(X), y)
    assert all(isinstance(v, np.ndarray) for v in mixed)
    # a later call does not write over the OrtValues an earlier one returned
    module(ort.OrtValue.ortvalue_from_numpy(X * 2), ort.OrtValue.ortvalue_from_numpy(y))
    np.testing.assert_array_equal(first[0].numpy(), loss_before)
    module.eval()
    out = module(ort.OrtValue.ortvalue_from_numpy(X), ort.OrtValue.ortvalue_from_numpy(y))
    assert all(isinstance(v, ort.OrtValue) for v in out)


# ------------------------------------------------------ error classes, messages

def test_errors_are_runtime_errors_where_onnxruntime_training_raises_them(art, tmp_path):
    state, module = _module(art)
    X, y = _batch()
    O = ort.OrtValue.ortvalue_from_numpy  # noqa: E741, N806
    cases = [
        # (call, the class that names the problem, message)
        (lambda: module(X), ValueError,
         r"train_step expects 2 input\(s\) \['input', '\w+'\], got 1"),
        (lambda: module(O(X), O(y), O(y)), ValueError, "expects 2 input"),
        (lambda: module(X.astype(np.float64), y), TypeError, "must be float32, got float64"),
        (lambda: module(X[None], y), ValueError, r"'input' of train_step has shape \(1, 5, 4\)"),
        (lambda: module.copy_buffer_to_parameters(np.zeros(20, np.float32)), ValueError,
         "20 elements, the trainable parameters have 21"),
        (lambda: module.copy_buffer_to_parameters(np.zeros(21)), TypeError, "float32"),
        (lambda: setattr(state.parameters["fc2.bias"], "data", np.zeros(3, np.float32)),
         ValueError, r"shape \(2,\); got float32 of shape \(3,\)"),
        (lambda: module.export_model_for_inferencing(tmp_path / "x.onnx", ["nope"]), ValueError,
         "nope"),
        (lambda: api.CheckpointState.load_checkpoint(tmp_path / "missing"), FileNotFoundError,
         "missing"),
        (lambda: api.CheckpointState.load_checkpoint(art / "training_model.onnx"), ValueError,
         "not a valid ortlearn checkpoint"),
        (lambda: api.CheckpointState.save_checkpoint(state, tmp_path), IsADirectoryError,
         "directory"),
        (lambda: api.CheckpointState.save_checkpoint(state, tmp_path / "no" / "dir"),
         FileNotFoundError, "does not exist"),
        (lambda: api.Module(tmp_path / "missing.onnx", state), OSError, "missing.onnx"),
        (lambda: api.Optimizer(art / "training_model.onnx", module), ValueError, "optimizer"),
        (lambda: api.Module(art / "training_model.onnx", api.CheckpointState.load_checkpoint(
            _other_checkpoint(tmp_path))), ValueError, "does not match the model"),
    ]
    for call, kind, message in cases:
        with pytest.raises(RuntimeError, match=message) as info:
            call()
        assert isinstance(info.value, kind), (message, type(info.value).__mro__)
        assert isinstance(info.value, TrainingApiError)
    # lookups raise KeyError, as in onnxruntime-training
    with pytest.raises(KeyError, match="Parameter 'nope' not found"):
        state.parameters["nope"]
    with pytest.raises(KeyError, match="Property 'nope' not found"):
        state.properties["nope"]
    # onnxruntime-training reads any buffer of the right size flat
    module.copy_buffer_to_parameters(np.arange(21, dtype=np.float32).reshape(3, 7))
    np.testing.assert_array_equal(state.parameters["fc1.bias"].data, [12, 13, 14])
    # eval mode without eval model: no names (onnxruntime-training), a clear error to run
    _, no_eval = _module(art, eval_model=False)
    no_eval.eval()
    assert no_eval.input_names() == [] and no_eval.output_names() == []
    with pytest.raises(RuntimeError, match="eval_step needs an eval model"):
        no_eval(X, y)


def _other_checkpoint(tmp_path):
    path = tmp_path / "other"
    onnxblock.save_checkpoint(([numpy_helper.from_array(np.zeros(2, np.float32), "w")], []), path)
    return path
