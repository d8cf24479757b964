"""generate_artifacts as onnxruntime-training 1.19 has it.

- ``requires_grad=None`` trains nothing; a model with no trainable parameter
  gives a valid training/eval pair (torch-exported, as onnxruntime-training's docs);
- ``ort_format=True`` writes ``.ort`` files converted by onnxruntime itself,
  which TrainingSession loads and trains with the numbers of the ``.onnx`` files;
- ``custom_op_library``: custom operators in a frozen branch and after the
  loss, a gradient through one with and without a registered rule (with
  onnxruntime-extensions' library when it is installed), the session options reaching
  every session; a model importing one domain at several versions.
"""

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn import CheckpointState, TrainingSession, api, artifacts
from ortlearn.autodiff import GRADIENT_RULES, register_gradient
from ortlearn.exceptions import NoGradientRuleError
from ortlearn.graph import opset_of
from ortlearn.training import session as session_module
from tests.conftest import run_onnx

CONTRIB = "ai.onnx.contrib"


def torch_mlp():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter's notice
        torch.onnx.export(module, (torch.randn(2, 4),), buffer, dynamo=False,
                          input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "N"}, "output": {0: "N"}},
                          do_constant_folding=False)
    params = {k: v.detach().numpy() for k, v in module.named_parameters()}
    return onnx.load_from_string(buffer.getvalue()), params


def _mlp_np(x, p):
    h = np.maximum(x @ p["0.weight"].T + p["0.bias"], 0)
    return h @ p["2.weight"].T + p["2.bias"]


# ------------------------------------------------------- what is trained by default
def test_requires_grad_none_trains_nothing(tmp_path, rng):
    model, params = torch_mlp()
    artifacts.generate_artifacts(model, frozen_params=["2.bias"],
                                 loss=artifacts.LossType.MSELoss, artifact_directory=tmp_path)
    training = onnx.load(tmp_path / "training_model.onnx")
    assert not [o.name for o in training.graph.output if o.name.endswith("_grad.accumulation.out")]
    # the initializers not listed stay constants of the models; frozen_params go to the checkpoint
    assert {i.name for i in training.graph.initializer} == {"0.weight", "0.bias", "2.weight"}
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    assert [(n, p.requires_grad) for n, p in state.parameters] == [("2.bias", False)]
    module = api.Module(str(tmp_path / "training_model.onnx"), state,
                        str(tmp_path / "eval_model.onnx"))
    assert module.get_parameters_size(trainable_only=True) == 0
    x, t = rng.normal(size=(6, 4)).astype(np.float32), rng.normal(size=(6, 3)).astype(np.float32)
    expected = np.mean((_mlp_np(x, params) - t) ** 2)
    np.testing.assert_allclose(module(x, t), expected, rtol=1e-5)
    np.testing.assert_allclose(module.eval()(x, t), expected, rtol=1e-5)


def test_a_model_without_parameters_is_a_valid_pair(tmp_path, rng):
    graph = helper.make_graph([helper.make_node("Tanh", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    artifacts.generate_artifacts(model, loss=artifacts.LossType.L1Loss, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    session = TrainingSession(state, tmp_path / "training_model.onnx", tmp_path / "eval_model.onnx")
    x, t = rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=(3, 2)).astype(np.float32)
    np.testing.assert_allclose(session.train_step(x, t)[0], np.mean(np.abs(np.tanh(x) - t)),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="requires_grad=None trains nothing.*optimizer=None"):
        artifacts.generate_artifacts(model, loss=artifacts.LossType.L1Loss,
                                     optimizer=artifacts.OptimType.AdamW,
                                     artifact_directory=tmp_path / "other")
    assert not (tmp_path / "other").exists()


# -------------------------------------------------------------------- ORT format
def _train(session, batches):
    out = []
    for x, t in batches:
        out.append(session.train_step(x, t)[0])
        session.optimizer_step()
        session.lazy_reset_grad()
    return out + [session.eval_step(*batches[0])[0]]


def test_ort_format_artifacts_train_as_the_onnx_ones(tmp_path, rng):
    model, _ = torch_mlp()
    artifacts.generate_artifacts(model, requires_grad=["0.weight", "0.bias", "2.weight"],
                                 frozen_params=["2.bias"], loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path,
                                 prefix="m_", ort_format=True)
    names = ["training_model", "eval_model", "optimizer_model"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["m_checkpoint"] + [f"m_{n}.{ext}" for n in names for ext in ("onnx", "ort")])
    for name in names:  # flatbuffers with onnxruntime's file identifier, loadable by onnxruntime
        data = (tmp_path / f"m_{name}.ort").read_bytes()
        assert data[4:8] == b"ORTM"
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    batches = [(rng.normal(size=(5, 4)).astype(np.float32), rng.integers(0, 3, size=5))
               for _ in range(3)]
    results = {}
    for ext in ("onnx", "ort"):
        state = CheckpointState.load_checkpoint(tmp_path / "m_checkpoint")
        if ext == "ort":
            with pytest.raises(ValueError, match="ORT-format optimizer model cannot be attached"):
                TrainingSession(state, *[tmp_path / f"m_{n}.ort" for n in names])
        # the optimizer runs unpacked to tensors: its .onnx file, with the .ort models
        session = TrainingSession(state, tmp_path / f"m_training_model.{ext}",
                                  tmp_path / f"m_eval_model.{ext}",
                                  tmp_path / "m_optimizer_model.onnx")
        assert session.input_names(True) == ["input", "labels"]
        results[ext] = (_train(session, batches), state.parameters["0.weight"].data)
        if ext == "ort":
            with pytest.raises(ValueError, match="ORT-format model has no ONNX graph"):
                session.export_model_for_inferencing(tmp_path / "inference.onnx", ["output"])
    np.testing.assert_allclose(results["ort"][0], results["onnx"][0], rtol=1e-6)
    np.testing.assert_allclose(results["ort"][1], results["onnx"][1], rtol=1e-6)
    assert not np.allclose(results["onnx"][0][0], results["onnx"][0][-1])  # it trained


def test_ort_format_bytes_and_a_damaged_file(tmp_path):
    model, _ = torch_mlp()
    artifacts.generate_artifacts(model, requires_grad=["2.bias"], loss=artifacts.LossType.MSELoss,
                                 artifact_directory=tmp_path, ort_format=True)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    session = TrainingSession(state, (tmp_path / "training_model.ort").read_bytes())
    assert session.output_names(True) == ["loss"]
    session.close()
    damaged = tmp_path / "damaged.ort"
    damaged.write_bytes((tmp_path / "training_model.ort").read_bytes()[:200])
    with pytest.raises(ValueError, match="cannot load the ORT-format training model"):
        TrainingSession(state, damaged)


# ---------------------------------------------------------------- custom operators
def _custom_model():
    """y = x @ W + relu(F), F frozen, ReLU written as the custom NegPos (second output);
    an extra output NegPos(y) after the loss."""
    rng = np.random.default_rng(3)
    W = rng.normal(size=(3, 3)).astype(np.float32)
    F = rng.normal(size=(3,)).astype(np.float32)
    nodes = [helper.make_node("NegPos", ["F"], ["F_neg", "F_pos"], domain=CONTRIB),
             helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Add", ["h", "F_pos"], ["y"]),
             helper.make_node("NegPos", ["y"], ["y_neg", "y_pos"], domain=CONTRIB)]
    graph = helper.make_graph(
        nodes, "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("y_pos", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(F, "F")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid(CONTRIB, 1)])
    return model, W, F


def test_custom_ops_in_a_frozen_branch_build_without_their_library():
    model, _, _ = _custom_model()
    training, evaluation, optimizer, state = artifacts.build_artifacts(
        model, requires_grad=["W"], frozen_params=["F"], loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.SGD, additional_output_names=["y_pos"])
    assert [n.op_type for n in training.graph.node if n.domain == CONTRIB] == ["NegPos", "NegPos"]
    assert [o.name for o in training.graph.output] == ["loss", "y_pos", "W_grad.accumulation.out"]
    with pytest.raises(NoGradientRuleError, match="'ai.onnx.contrib.NegPos'.*register_gradient"):
        artifacts.build_artifacts(model, requires_grad=["W", "F"],
                                  loss=artifacts.LossType.MSELoss)


def test_custom_op_library_is_checked_first(tmp_path):
    model, _, _ = _custom_model()
    with pytest.raises(FileNotFoundError, match="'missing.so' does not exist"):
        artifacts.generate_artifacts(model, requires_grad=["W"], artifact_directory=tmp_path,
                                     custom_op_library="missing.so")
    with pytest.raises(ValueError, match="onnxruntime cannot load the custom_op_library"):
        artifacts.generate_artifacts(model, requires_grad=["W"], artifact_directory=tmp_path,
                                     custom_op_library=__file__)
    assert list(tmp_path.iterdir()) == []


def test_session_options_reach_every_session(tmp_path, monkeypatch, linear_onnx):
    """A custom op library registered in the options is registered in the three sessions."""
    artifacts.generate_artifacts(linear_onnx, requires_grad=["coef", "intercept"],
                                 loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    seen = []
    real = session_module.make_session
    monkeypatch.setattr(session_module, "make_session",
                        lambda model, device, options, *rest: seen.append(options) or real(
                            model, device, options, *rest))
    options = ort.SessionOptions()
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = api.Module(str(tmp_path / "training_model.onnx"), state,
                        str(tmp_path / "eval_model.onnx"), session_options=options)
    api.Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
    assert len(seen) == 3 and all(o is options for o in seen)


@pytest.fixture
def extensions_library():
    extensions = pytest.importorskip("onnxruntime_extensions")
    return extensions.get_library_path()


def test_custom_ops_train_with_a_real_library(tmp_path, rng, extensions_library):
    model, W, F = _custom_model()
    artifacts.generate_artifacts(model, requires_grad=["W"], frozen_params=["F"],
                                 loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path,
                                 additional_output_names=["y_pos"], ort_format=True,
                                 custom_op_library=extensions_library)
    options = ort.SessionOptions()
    options.register_custom_ops_library(extensions_library)
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = api.Module(str(tmp_path / "training_model.ort"), state,
                        str(tmp_path / "eval_model.onnx"), session_options=options)
    optimizer = api.Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(0.1)
    x, t = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 3)).astype(np.float32)
    y = x @ W + np.maximum(F, 0)
    loss, y_pos = module(x, t)
    np.testing.assert_allclose(loss, np.mean((y - t) ** 2), rtol=1e-5)
    np.testing.assert_allclose(y_pos, np.maximum(y, 0), rtol=1e-6)
    optimizer.step()
    W1 = W - 0.1 * x.T @ (2 * (y - t) / y.size)
    np.testing.assert_allclose(state.parameters["W"].data, W1, rtol=1e-5)
    y1 = x @ W1 + np.maximum(F, 0)
    np.testing.assert_allclose(module.eval()(x, t)[0], np.mean((y1 - t) ** 2), rtol=1e-5)


def test_gradient_through_a_custom_op_with_a_registered_rule(tmp_path, rng, extensions_library):
    @register_gradient("NegPos", domain=CONTRIB)
    def negpos_grad(ctx, node, grads):
        # neg = min(x, 0), pos = max(x, 0): d/dx = (x < 0) * g_neg + (x > 0) * g_pos
        x, b = node.input[0], ctx.b
        zero = b.op("Sub", [x, x])
        total = None
        for grad, mask in zip(grads, (b.op("Less", [x, zero]), b.op("Greater", [x, zero]))):
            if grad is not None:
                part = b.op("Where", [mask, grad, zero])
                total = part if total is None else b.op("Add", [total, part])
        return [total]

    try:
        model, W, F = _custom_model()
        artifacts.generate_artifacts(model, requires_grad=["W", "F"],
                                     loss=artifacts.LossType.MSELoss, artifact_directory=tmp_path,
                                     custom_op_library=extensions_library)
    finally:
        GRADIENT_RULES.pop((CONTRIB, "NegPos"))
    options = ort.SessionOptions()
    options.register_custom_ops_library(extensions_library)
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    session = TrainingSession(state, tmp_path / "training_model.onnx", session_options=options)
    x, t = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 3)).astype(np.float32)
    session.train_step(x, t)
    dy = 2 * (x @ W + np.maximum(F, 0) - t) / t.size
    np.testing.assert_allclose(session.get_gradient("F"), dy.sum(0) * (F > 0), rtol=1e-5)


# ---------------------------------------------------- several versions of a domain
def test_a_domain_imported_at_several_versions_is_read_at_the_highest(tmp_path, rng):
    """ReduceMean with its axes as an input is opset 18's: listed after 13, onnxruntime
    would read 13 (it keeps a domain's last import) and refuse the node."""
    W = rng.normal(size=(3, 2)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]),
         helper.make_node("ReduceMean", ["h", "axes"], ["y"], keepdims=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(np.array([1]), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx", 18),
                                                    helper.make_opsetid("", 13)])
    assert opset_of(model) == 18
    training, evaluation, _, _ = artifacts.build_artifacts(model, requires_grad=["W"],
                                                           loss=artifacts.LossType.MSELoss)
    for built in (training, evaluation):
        assert [(o.domain, o.version) for o in built.opset_import
                if o.domain in ("", "ai.onnx")] == [("ai.onnx", 18)]
    x, t = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=5).astype(np.float32)
    loss, grad = run_onnx(training, {"x": x, "target": t, "W": W,
                                     "W_grad.accumulation.buffer": np.zeros_like(W),
                                     "lazy_reset_grad": np.array(True)})
    y = (x @ W).mean(1)
    np.testing.assert_allclose(loss, np.mean((y - t) ** 2), rtol=1e-5)
    dy = 2 * (y - t) / 5
    np.testing.assert_allclose(grad, x.T @ np.repeat(dy[:, None] / 2, 2, axis=1), rtol=1e-5)
