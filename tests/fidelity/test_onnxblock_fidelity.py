"""onnxblock as onnxruntime-training 1.19 has it.

- the loss blocks' signatures and default input names (``labels`` for
  CrossEntropyLoss), their numbers against numpy;
- every block ``onnxruntime.training.onnxblock.blocks`` exports, each
  computing its numbers (SequenceConstruct, ReduceAllL2, InputLike, LabelEncoder,
  Linear's alpha/beta);
- ``TrainingBlock.requires_grad`` on a graph input: the training model outputs
  ``<input>_grad.accumulation.out``, the gradient w.r.t. that input.
"""

import inspect

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn import CheckpointState, TrainingSession, artifacts, onnxblock
from ortlearn.graph import np_dtype_to_onnx
from tests.conftest import run_onnx

DTYPES = [np.float32, np.float64]

#: The names onnxruntime-training 1.19's ``onnxblock.blocks`` defines (its source).
ORT_BLOCKS = ["Abs", "Add", "Block", "Cast", "Clip", "Constant", "Div", "InputLike",
              "LabelEncoder", "Linear", "Log", "Mul", "Neg", "PassThrough", "Pow",
              "ReduceAllL2", "ReduceMean", "ReduceSum", "SequenceConstruct", "Sigmoid", "Sub"]


def model_of(dtype, shapes, names=None):
    """``y<i> = Identity(x<i>)`` for each shape."""
    elem = np_dtype_to_onnx(dtype)
    n = len(shapes)
    nodes = [helper.make_node("Identity", [f"x{i}"], [f"y{i}"]) for i in range(n)]
    inputs = [helper.make_tensor_value_info(f"x{i}", elem, s) for i, s in enumerate(shapes)]
    outputs = [helper.make_tensor_value_info(f"y{i}", elem, s) for i, s in enumerate(shapes)]
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 18)])


class Forward(onnxblock.ForwardBlock):
    def __init__(self, make):
        super().__init__()
        self.make = make

    def build(self, *names):
        return self.make(*names)


def forward(make, model, *names):
    block = Forward(make)
    with onnxblock.base(model):
        block(*names)
    return block.to_model_proto()


# ------------------------------------------------------------------ losses
def test_loss_signatures_are_onnxruntime_trainings():
    def params(fn):
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
                if p.name != "self"]

    loss = onnxblock.loss
    assert params(loss.CrossEntropyLoss.build) == [
        ("scores_input_name", inspect.Parameter.empty), ("labels_name", "labels")]
    assert params(loss.CrossEntropyLoss.__init__) == [
        ("weight", None), ("reduction", "mean"), ("ignore_index", None)]
    assert params(loss.BCEWithLogitsLoss.__init__) == [
        ("weight", None), ("reduction", "mean"), ("pos_weight", None)]
    for cls in (loss.MSELoss, loss.L1Loss, loss.BCEWithLogitsLoss):
        assert params(cls.build) == [("loss_input_name", inspect.Parameter.empty),
                                     ("target_name", "target")], cls
    for cls in (loss.MSELoss, loss.L1Loss):
        assert params(cls.__init__) == [("reduction", "mean")], cls


def test_unknown_reduction_is_the_runtime_error_of_onnxruntime_training():
    for cls in (onnxblock.loss.MSELoss, onnxblock.loss.L1Loss, onnxblock.loss.CrossEntropyLoss,
                onnxblock.loss.BCEWithLogitsLoss):
        with pytest.raises(RuntimeError, match="reduction must be one of"):
            cls(reduction="average")
        with pytest.raises(ValueError):  # ortlearn's earlier type still catches it
            cls(reduction="average")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_reads_labels_by_default(rng, dtype):
    x = (rng.normal(size=(6, 4)) * 2).astype(dtype)
    labels = rng.integers(0, 4, size=6)
    out = forward(lambda s: onnxblock.loss.CrossEntropyLoss(
        weight=np.array([0.5, 1.0, 2.0, 1.5]), reduction="sum")(s),
        model_of(dtype, [["N", 4]]), "y0")
    inputs = {i.name: i for i in out.graph.input}
    assert list(inputs) == ["x0", "labels"]
    assert inputs["labels"].type.tensor_type.elem_type == TensorProto.INT64
    logp = x.astype(np.float64) - np.log(np.exp(x.astype(np.float64)).sum(1, keepdims=True))
    expected = -(np.array([0.5, 1.0, 2.0, 1.5])[labels] * logp[np.arange(6), labels]).sum()
    got = run_onnx(out, {"x0": x, "labels": labels})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_losses_in_generate_artifacts_take_onnxruntime_trainings_input_names(tmp_path):
    model = model_of(np.float32, [["N", 3]])
    model.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "w"))
    model.graph.node[0].CopyFrom(helper.make_node("Mul", ["x0", "w"], ["y0"]))
    names = {}
    for loss in artifacts.LossType:
        training, *_ = artifacts.build_artifacts(model, requires_grad=["w"], loss=loss)
        names[loss.name] = [i.name for i in training.graph.input][:2]
    assert names == {"MSELoss": ["x0", "target"], "CrossEntropyLoss": ["x0", "labels"],
                     "BCEWithLogitsLoss": ["x0", "target"], "L1Loss": ["x0", "target"]}


# --------------------------------------------------------------- the blocks
def test_every_block_of_onnxruntime_training_exists():
    missing = [n for n in ORT_BLOCKS if not hasattr(onnxblock.blocks, n)]
    assert missing == []
    assert set(ORT_BLOCKS) <= set(onnxblock.blocks.__all__)


def test_sequence_construct(rng):
    a, b = rng.normal(size=(2, 3, 2)).astype(np.float32)
    out = forward(lambda x, y: onnxblock.blocks.SequenceConstruct()(x, y),
                  model_of(np.float32, [[3, 2], [3, 2]]), "y0", "y1")
    assert out.graph.output[0].type.WhichOneof("value") == "sequence_type"
    got = run_onnx(out, {"x0": a, "x1": b})[0]
    assert len(got) == 2
    np.testing.assert_array_equal(got[0], a)
    np.testing.assert_array_equal(got[1], b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_all_l2(rng, dtype):
    a = rng.normal(size=(3, 2)).astype(dtype)
    b = rng.normal(size=(5,)).astype(dtype)
    out = forward(lambda x, y: onnxblock.blocks.ReduceAllL2()(x, y),
                  model_of(dtype, [[3, 2], [5]]), "y0", "y1")
    assert {n.domain for n in out.graph.node} <= {""}  # no com.microsoft operator
    got = run_onnx(out, {"x0": a, "x1": b})[0]
    expected = np.sqrt((a.astype(np.float64) ** 2).sum() + (b.astype(np.float64) ** 2).sum())
    assert got.shape == () and got.dtype == dtype
    np.testing.assert_allclose(got, expected, rtol=1e-6 if dtype == np.float32 else 1e-14)


def test_input_like(rng):
    model = model_of(np.float64, [["N", 3]])
    block = Forward(lambda y: onnxblock.blocks.Sub()(y, onnxblock.blocks.InputLike(y)("other")))
    with onnxblock.base(model):
        block("y0")
    out = block.to_model_proto()
    other = {i.name: i for i in out.graph.input}["other"]
    assert other.type == out.graph.input[0].type  # float64, ("N", 3)
    x, o = rng.normal(size=(2, 4, 3))
    np.testing.assert_array_equal(run_onnx(out, {"x0": x, "other": o})[0], x - o)
    with onnxblock.base(model):
        with pytest.raises(LookupError, match="'nowhere' is neither a graph input nor"):
            onnxblock.blocks.InputLike("nowhere")("z")
        with pytest.raises(ValueError, match="already has a value named 'x0'"):
            onnxblock.blocks.InputLike("y0")("x0")
        assert onnxblock.blocks.InputLike("x0")() not in {"x0", "y0"}  # a fresh name


def test_label_encoder_feeds_the_cross_entropy(rng):
    """onnxruntime-training's composition: the labels pass a LabelEncoder before the loss."""
    classes = ["cat", "dog", "eel"]

    class LossOnNames(onnxblock.ForwardBlock):
        def build(self, scores):
            names = onnxblock.blocks.InputLike(scores)("names")
            graph_input = {i.name: i for i in self.base.graph.input}[names]
            graph_input.type.tensor_type.elem_type = TensorProto.STRING
            del graph_input.type.tensor_type.shape.dim[1]
            encoder = onnxblock.blocks.LabelEncoder(keys_strings=classes, values_int64s=[0, 1, 2])
            return onnxblock.loss.CrossEntropyLoss()(scores, labels_name=encoder(names))

    block = LossOnNames()
    with onnxblock.base(model_of(np.float64, [["N", 3]])):
        block("y0")
    out = block.to_model_proto()
    assert [o.domain for o in out.opset_import if o.domain == "ai.onnx.ml"] == ["ai.onnx.ml"]
    x = rng.normal(size=(5, 3))
    names = np.array(["dog", "eel", "cat", "eel", "dog"], dtype=object)
    idx = np.array([classes.index(n) for n in names])
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    got = run_onnx(out, {"x0": x, "names": names})[0]
    np.testing.assert_allclose(got, -logp[np.arange(5), idx].mean(), rtol=1e-12)


def test_label_encoder_default_and_checks():
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["N"])]),
        opset_imports=[helper.make_opsetid("", 18)])
    encoder = onnxblock.blocks.LabelEncoder(default_int64=521, keys_int64s=[0, 1, 2],
                                            values_int64s=[7, 8, 9])
    out = forward(lambda y: encoder(y), model, "y")
    got = run_onnx(out, {"x": np.array([2, 0, 5, 1], np.int64)})[0]
    np.testing.assert_array_equal(got, [9, 7, 521, 8])
    with pytest.raises(ValueError, match="one keys_\\* list and one values_\\* list"):
        onnxblock.blocks.LabelEncoder(keys_int64s=[1])
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        onnxblock.blocks.LabelEncoder(keys_int64s=[1, 2], values_floats=[0.5])


def test_linear_alpha_beta_and_constant_keyword(rng):
    x = rng.normal(size=(4, 3))
    out = forward(lambda y: onnxblock.blocks.Add()(
        onnxblock.blocks.Linear(3, 2, True, 0.5, 2.0, name="fc", random_state=0)(y),
        onnxblock.blocks.Constant(value_float=0.25)()), model_of(np.float64, [["N", 3]]), "y0")
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    expected = 0.5 * x @ inits["fc.weight"].T + 2.0 * inits["fc.bias"] + 0.25
    np.testing.assert_allclose(run_onnx(out, {"x0": x})[0], expected, rtol=1e-12)


# ------------------------------------------------ requires_grad on a graph input
def _affine(dtype=np.float64):
    rng = np.random.default_rng(1)
    elem = np_dtype_to_onnx(dtype)
    W = rng.normal(size=(3, 2)).astype(dtype)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
        "affine", [helper.make_tensor_value_info("x", elem, ["N", 3])],
        [helper.make_tensor_value_info("y", elem, ["N", 2])], [numpy_helper.from_array(W, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), W


class MSETraining(onnxblock.TrainingBlock):
    def __init__(self):
        super().__init__()
        self.loss = onnxblock.loss.MSELoss()

    def build(self, output_name):
        return self.loss(output_name)


def _mse_grads(x, t, W):
    y = np.tanh(x @ W)
    dy = 2 * (y - t) / y.size * (1 - y ** 2)
    return np.mean((y - t) ** 2), dy @ W.T, x.T @ dy


def test_training_block_outputs_the_gradient_of_a_graph_input(rng):
    model, W = _affine()
    block = MSETraining()
    block.requires_grad("x")
    with onnxblock.base(model):
        block("y")
    training, evaluation = block.to_model_proto()
    # onnxruntime-training's names (its test_set_requires_grad_on_inputs)
    assert "x_grad.accumulation.buffer" in {i.name for i in training.graph.input}
    assert [o.name for o in training.graph.output][1:] == ["x_grad.accumulation.out"]
    trainable, frozen = block.parameters()
    assert trainable == [] and frozen == []  # an input is no parameter
    assert [i.name for i in evaluation.graph.input] == ["x", "target"]
    x, t = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    loss, dx, _ = _mse_grads(x, t, W)
    buffer = rng.normal(size=(5, 3))
    for reset, expected in ((True, dx), (False, buffer + dx)):
        got = run_onnx(training, {"x": x, "target": t, "x_grad.accumulation.buffer": buffer,
                                  "lazy_reset_grad": np.array(reset)})
        np.testing.assert_allclose(got[0], loss, rtol=1e-12)
        np.testing.assert_allclose(got[1], expected, rtol=1e-10, atol=1e-14)


def test_generate_artifacts_and_session_give_input_and_weight_gradients(tmp_path, rng):
    model, W = _affine()
    artifacts.generate_artifacts(model, requires_grad=["W", "x"], loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    training = onnx.load(tmp_path / "training_model.onnx")
    assert [o.name for o in training.graph.output] == [
        "loss", "W_grad.accumulation.out", "x_grad.accumulation.out"]
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    assert [name for name, _ in state.parameters] == ["W"]
    session = TrainingSession(state, tmp_path / "training_model.onnx")
    with pytest.raises(RuntimeError, match="run train_step first"):
        session.get_input_gradient("x")
    with pytest.raises(KeyError, match="no gradient for 'target'"):
        session.get_input_gradient("target")
    dW_sum = 0
    for rows in (5, 2):  # the buffer follows the batch size; an input's gradient is per step
        x, t = rng.normal(size=(rows, 3)), rng.normal(size=(rows, 2))
        loss, dx, dW = _mse_grads(x, t, W)
        dW_sum = dW_sum + dW
        np.testing.assert_allclose(session.train_step(x, t)[0], loss, rtol=1e-12)
        np.testing.assert_allclose(session.get_input_gradient("x"), dx, rtol=1e-10, atol=1e-14)
    # the weight's gradient accumulates as always (no reset between the two steps)
    np.testing.assert_allclose(session.get_gradient("W"), dW_sum, rtol=1e-10)
