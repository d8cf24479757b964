"""The JavaScript TrainingSession (js/, under onnxruntime-node) trains ortlearn's artifacts as
the Python TrainingSession does: same checkpoint, same batches, same weights.

Both runtimes run onnxruntime's CPU kernels on the same graphs, but not the same build
(onnxruntime-node 1.30, the Python wheel 1.32 or another): a kernel may sum in another order
between builds, so values agree to float32 rounding, not bit for bit. One step's relative
difference is a few float32 ulps (2**-23 ~ 1.2e-7) of the largest terms of its sums; Adam's
update divides the moments, so a weight moves by at most the learning rate per step and a
difference of a few ulps in a gradient moves it by a few ulps of the learning rate. Over the
tens of steps below, ``RTOL``/``ATOL`` leave two orders of magnitude over that bound.
"""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from runs import node_steps, python_steps
from sklearn.datasets import load_diabetes, load_digits

from ortlearn import CheckpointState, OrtMLPClassifier, OrtMLPRegressor, artifacts, onnxblock
from ortlearn.optim import unpack_optimizer_model

RTOL, ATOL = 1e-5, 1e-6
STEPS = 20


def _tensor_layout(directory):
    """The optimizer model in its tensor layout: onnxruntime's JS API feeds no sequences."""
    path = directory / "optimizer_model.onnx"
    onnx.save(unpack_optimizer_model(onnx.load(path)), path)
    return directory


def _batches(arrays: dict, size: int, count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    n = len(next(iter(arrays.values())))
    batches = []
    for _ in range(count):
        rows = rng.choice(n, size, replace=False)
        batches.append({k: np.ascontiguousarray(v[rows]) for k, v in arrays.items()})
    return batches


def _assert_same_state(node_checkpoint, python_checkpoint, rtol=RTOL, atol=ATOL):
    ours = CheckpointState.load_checkpoint(str(node_checkpoint))
    theirs = CheckpointState.load_checkpoint(str(python_checkpoint))
    assert ours.parameters.keys() == theirs.parameters.keys()
    for name in theirs.parameters.keys():
        a, b = ours.parameters[name].data, theirs.parameters[name].data
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)
    assert ours.optimizer_step == theirs.optimizer_step
    assert ours.optimizer_learning_rate == theirs.optimizer_learning_rate
    for param, states in theirs.optimizer_state.items():
        for state, value in states.items():
            np.testing.assert_allclose(ours.optimizer_state[param][state], value, rtol=rtol,
                                       atol=atol, err_msg=f"{param}.{state}")


def _mlp_regressor(directory):
    X, y = load_diabetes(return_X_y=True, scaled=True)
    X, y = X.astype(np.float32), ((y - y.mean()) / y.std()).astype(np.float32)
    est = OrtMLPRegressor(hidden_layer_sizes=(16,), max_iter=2, random_state=0)
    with pytest.warns(Warning):  # two epochs on purpose: the artifacts go on
        est.fit(X, y)
    est.export_artifacts(directory)
    return {"X": X, "y": y.reshape(-1, 1)}


def _mlp_classifier(directory):
    X, y = load_digits(return_X_y=True)
    X = (X / 16).astype(np.float32)
    est = OrtMLPClassifier(hidden_layer_sizes=(16,), max_iter=2, random_state=0)
    with pytest.warns(Warning):
        est.fit(X, y)
    est.export_artifacts(directory)
    return {"X": X, "y": y.astype(np.int64)}


def _torch_cnn(directory):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 10))
    f = io.BytesIO()
    torch.onnx.export(model, (torch.zeros(2, 1, 8, 8),), f, dynamo=False,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      opset_version=18, input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})
    artifacts.generate_artifacts(
        onnx.load_from_string(f.getvalue()),
        requires_grad=[name for name, _ in model.named_parameters()],
        loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
        artifact_directory=directory)
    X, y = load_digits(return_X_y=True)
    return {"input": (X / 16).astype(np.float32).reshape(-1, 1, 8, 8),
            "labels": y.astype(np.int64)}


class _MsePlusL1(onnxblock.Block):
    """A loss artifacts.LossType does not have: 0.7 mse + 0.3 l1, on one output (the shape of
    onnxruntime-training's custom-loss example, tests/conftest.py's WeightedAverageLoss)."""

    def __init__(self):
        self._mse = onnxblock.loss.MSELoss()
        self._l1 = onnxblock.loss.L1Loss()
        self._a = onnxblock.blocks.Constant(0.7)
        self._b = onnxblock.blocks.Constant(0.3)
        self._mul_a = onnxblock.blocks.Mul()
        self._mul_b = onnxblock.blocks.Mul()
        self._add = onnxblock.blocks.Add()

    def build(self, output_name):
        return self._add(self._mul_a(self._a(), self._mse(output_name, "target")),
                         self._mul_b(self._b(), self._l1(output_name, "target")))


def _custom_loss(directory):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"]),
         helper.make_node("Add", ["XW", "b"], ["h"]),
         helper.make_node("Tanh", ["h"], ["t"]),
         helper.make_node("MatMul", ["t", "V"], ["output"])],
        "tanh_net", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 5])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(rng.normal(scale=0.5, size=s).astype(np.float32), n)
         for n, s in {"W": (5, 8), "b": (8,), "V": (8, 1)}.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              ir_version=10)
    artifacts.generate_artifacts(model, requires_grad=["W", "b", "V"], loss=_MsePlusL1(),
                                 optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=directory)
    X = rng.normal(size=(300, 5)).astype(np.float32)
    return {"X": X, "target": np.tanh(X[:, :1] - X[:, 1:2]).astype(np.float32)}


MODELS = {"mlp_regressor": _mlp_regressor, "mlp_classifier": _mlp_classifier,
          "torch_cnn": _torch_cnn, "custom_loss": _custom_loss}


@pytest.fixture(params=sorted(MODELS))
def exported(request, tmp_path):
    directory = tmp_path / "artifacts"
    arrays = MODELS[request.param](directory)
    return _tensor_layout(directory), _batches(arrays, 32, 5)


def test_node_trains_as_python(exported, node, js_dir, tmp_path):
    directory, batches = exported
    node_losses = node_steps(node, directory, batches, STEPS, tmp_path / "node.ckpt")
    python_losses = python_steps(directory, batches, STEPS, tmp_path / "python.ckpt")
    np.testing.assert_allclose(node_losses, python_losses, rtol=RTOL, atol=ATOL)
    _assert_same_state(tmp_path / "node.ckpt", tmp_path / "python.ckpt")
    # the steps moved every trainable parameter
    start = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    trained = CheckpointState.load_checkpoint(str(tmp_path / "node.ckpt"))
    for name in start.trainable_names:
        assert not np.array_equal(trained.parameters[name].data, start.parameters[name].data)


def test_checkpoint_goes_back_and_forth(exported, node, js_dir, tmp_path):
    """5 steps in Node, 5 in Python from Node's checkpoint, 5 in Node again: 15 in Python."""
    directory, batches = exported
    node_steps(node, directory, batches[:5], 5, tmp_path / "a.ckpt")
    python_steps(directory, batches[:5], 5, tmp_path / "b.ckpt", checkpoint=tmp_path / "a.ckpt")
    node_steps(node, directory, batches[:5], 5, tmp_path / "c.ckpt",
               checkpoint=tmp_path / "b.ckpt")
    python_steps(directory, batches[:5] * 3, 15, tmp_path / "all.ckpt")
    _assert_same_state(tmp_path / "c.ckpt", tmp_path / "all.ckpt")


def test_a_checkpoint_loaded_and_saved_in_node_is_the_same_file(exported, node, js_dir,
                                                               tmp_path):
    directory, batches = exported
    node_steps(node, directory, batches, 0, tmp_path / "same.ckpt")
    assert (tmp_path / "same.ckpt").read_bytes() == (directory / "checkpoint").read_bytes()


def test_exported_inference_model_predicts_as_python(node, js_dir, tmp_path):
    import onnxruntime as ort

    from ortlearn import TrainingSession

    arrays = _mlp_classifier(tmp_path / "artifacts")
    directory = _tensor_layout(tmp_path / "artifacts")
    batches = _batches(arrays, 32, 3)
    node_steps(node, directory, batches, 6, tmp_path / "node.ckpt", export=["raw_scores"])
    state = CheckpointState.load_checkpoint(str(tmp_path / "node.ckpt"))
    session = TrainingSession(state, str(directory / "training_model.onnx"),
                              str(directory / "eval_model.onnx"))
    session.export_model_for_inferencing(str(tmp_path / "python.onnx"), ["raw_scores"])
    session.close()
    ours = onnx.load(str(tmp_path / "node.ckpt.inference.onnx"))
    assert [i.name for i in ours.graph.input] == ["X"]  # the labels and parameters are gone
    assert [o.name for o in ours.graph.output] == ["raw_scores"]
    X = arrays["X"][:100]
    run = {p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(
        None, {"X": X})[0] for p in (tmp_path / "node.ckpt.inference.onnx",
                                     tmp_path / "python.onnx")}
    a, b = run.values()
    np.testing.assert_array_equal(a, b)  # the same weights in the same graph, one runtime
