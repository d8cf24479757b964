"""ortlearn.onnxblock: block values against numpy formulas (float32 and float64)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn import onnxblock
from ortlearn.graph import np_dtype_to_onnx
from tests.conftest import WeightedAverageLoss, run_onnx

DTYPES = [np.float32, np.float64]


def identity_model(dtype, shapes):
    """Graph outputs ``y<i> = Identity(x<i>)`` for each shape."""
    elem = np_dtype_to_onnx(dtype)
    nodes = [helper.make_node("Identity", [f"x{i}"], [f"y{i}"]) for i in range(len(shapes))]
    inputs = [helper.make_tensor_value_info(f"x{i}", elem, s) for i, s in enumerate(shapes)]
    outputs = [helper.make_tensor_value_info(f"y{i}", elem, s) for i, s in enumerate(shapes)]
    graph = helper.make_graph(nodes, "identity", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


class _Forward(onnxblock.ForwardBlock):
    """Apply ``block`` to the given names (no super().__init__, as the seed examples)."""

    def __init__(self, block):
        self.block = block

    def build(self, *names, **kwargs):
        return self.block(*names, **kwargs)


def run_block(block, dtype, shapes, feeds, **kwargs):
    model = identity_model(dtype, shapes)
    fwd = _Forward(block)
    with onnxblock.base(model):
        fwd(*[f"y{i}" for i in range(len(shapes))], **kwargs)
    out = fwd.to_model_proto()
    onnx.checker.check_model(out)
    return run_onnx(out, feeds)[0]


def tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-10}


def reduce_np(values, reduction):
    return {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction](values)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", ["MSELoss", "L1Loss"])
def test_regression_losses(rng, dtype, reduction, name):
    x, t = rng.normal(size=(2, 6, 3)).astype(dtype)
    got = run_block(getattr(onnxblock.loss, name)(reduction=reduction), dtype, [[6, 3]],
                    {"x0": x, "target": t})
    per = (x - t) ** 2 if name == "MSELoss" else np.abs(x - t)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, reduce_np(per, reduction), rtol=1e-5)


def cross_entropy_np(x, t, weight=None, reduction="mean", ignore_index=None):
    x = np.moveaxis(x, 1, -1).reshape(-1, x.shape[1])
    t = t.ravel()
    logp = x - x.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    keep = np.ones_like(t, dtype=bool) if ignore_index is None else t != ignore_index
    safe = np.where(keep, t, 0)
    w = np.ones(x.shape[1]) if weight is None else np.asarray(weight)
    wt = w[safe] * keep
    nll = -logp[np.arange(len(t)), safe] * wt
    if reduction == "mean":
        return nll.sum() / wt.sum()
    return nll.sum() if reduction == "sum" else nll


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weight,ignore_index", [(None, None), ([0.2, 1.0, 3.0, 0.5], None),
                                                 (None, 2), ([0.2, 1.0, 3.0, 0.5], -100)])
def test_cross_entropy(rng, dtype, reduction, weight, ignore_index):
    x = rng.normal(size=(7, 4)).astype(dtype) * 3
    t = rng.integers(0, 4, size=7)
    if ignore_index is not None:
        t[:2] = ignore_index
    block = onnxblock.loss.CrossEntropyLoss(weight=weight, reduction=reduction,
                                            ignore_index=ignore_index)
    got = run_block(block, dtype, [["N", 4]], {"x0": x, "labels": t})
    expected = cross_entropy_np(x, t, weight, reduction, ignore_index)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_cross_entropy_spatial(rng):
    x = rng.normal(size=(3, 4, 5))
    t = rng.integers(0, 4, size=(3, 5))
    got = run_block(onnxblock.loss.CrossEntropyLoss(), np.float64, [[3, 4, 5]],
                    {"x0": x, "labels": t})
    np.testing.assert_allclose(got, cross_entropy_np(x, t), rtol=1e-12)


def bce_np(x, y, weight=None, pos_weight=None):
    sig = 1 / (1 + np.exp(-x))
    p = 1.0 if pos_weight is None else np.asarray(pos_weight)
    w = 1.0 if weight is None else np.asarray(weight)
    return -w * (p * y * np.log(sig) + (1 - y) * np.log(1 - sig))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weight,pos_weight", [(None, None), ([1.0, 2.0, 0.5], None),
                                               (None, [3.0, 0.5, 1.0]),
                                               ([1.0, 2.0, 0.5], [2.0, 1.0, 4.0])])
def test_bce_with_logits(rng, dtype, reduction, weight, pos_weight):
    x = rng.normal(size=(5, 3)).astype(dtype) * 2
    y = rng.integers(0, 2, size=(5, 3)).astype(dtype)
    block = onnxblock.loss.BCEWithLogitsLoss(weight=weight, reduction=reduction,
                                             pos_weight=pos_weight)
    got = run_block(block, dtype, [[5, 3]], {"x0": x, "target": y})
    expected = reduce_np(bce_np(x.astype(np.float64), y, weight, pos_weight), reduction)
    np.testing.assert_allclose(got, expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pos_weight", [None, [2.0]])
def test_bce_with_logits_is_stable(dtype, pos_weight):
    x = np.array([[-1000.0], [1000.0], [-1000.0], [1000.0]], dtype=dtype)
    y = np.array([[0.0], [1.0], [1.0], [0.0]], dtype=dtype)
    block = onnxblock.loss.BCEWithLogitsLoss(reduction="none", pos_weight=pos_weight)
    got = run_block(block, dtype, [[4, 1]], {"x0": x, "target": y})
    p = 1.0 if pos_weight is None else pos_weight[0]
    np.testing.assert_allclose(got.ravel(), [0.0, 0.0, 1000.0 * p, 1000.0])


def test_bad_reduction():
    with pytest.raises(ValueError, match="reduction"):
        onnxblock.loss.MSELoss(reduction="average")


@pytest.mark.parametrize("dtype", DTYPES)
def test_custom_block_without_super_init(rng, dtype):
    a, ta = rng.normal(size=(2, 4, 2)).astype(dtype)
    b, tb = rng.normal(size=(2, 4, 3)).astype(dtype)
    got = run_block(WeightedAverageLoss(), dtype, [[4, 2], [4, 3]],
                    {"x0": a, "x1": b, "target1": ta, "target2": tb})
    expected = 0.4 * np.mean((a - ta) ** 2) + 0.6 * np.mean((b - tb) ** 2)
    assert got.dtype == dtype and got.shape == ()
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_target_input_is_reused_and_typed():
    model = identity_model(np.float64, [["N", 3]])
    with onnxblock.base(model) as accessor:
        onnxblock.loss.MSELoss()("y0", target_name="t")
        onnxblock.loss.L1Loss()("y0", target_name="t")
        onnxblock.loss.CrossEntropyLoss()("y0", labels_name="labels")
    inputs = {i.name: i for i in accessor.model.graph.input}
    assert list(inputs) == ["x0", "t", "labels"]
    assert inputs["t"].type.tensor_type.elem_type == TensorProto.DOUBLE
    assert inputs["labels"].type.tensor_type.elem_type == TensorProto.INT64
    assert [d.dim_param for d in inputs["labels"].type.tensor_type.shape.dim] == ["N"]
    assert len(model.graph.input) == 1  # the base model is copied, not changed


class _Expression(onnxblock.ForwardBlock):
    def __init__(self, make):
        self.make = make

    def build(self, a, b):
        return self.make(a, b)


B = onnxblock.blocks
BUILDING = {
    "Add": (lambda a, b: B.Add()(a, b), lambda a, b: a + b),
    "Sub": (lambda a, b: B.Sub()(a, b), lambda a, b: a - b),
    "Mul": (lambda a, b: B.Mul()(a, b), lambda a, b: a * b),
    "Div": (lambda a, b: B.Div()(a, b), lambda a, b: a / b),
    "Pow": (lambda a, b: B.Pow(2.5)(B.Abs()(a)), lambda a, b: np.abs(a) ** 2.5),
    "Constant": (lambda a, b: B.Mul()(B.Constant(0.3)(), a), lambda a, b: 0.3 * a),
    "ReduceMean": (lambda a, b: B.ReduceMean()(a), lambda a, b: a.mean(keepdims=True)),
    "ReduceSum": (lambda a, b: B.ReduceSum(axes=[1], keepdims=False)(a),
                  lambda a, b: a.sum(axis=1)),
    "Sigmoid": (lambda a, b: B.Sigmoid()(a), lambda a, b: 1 / (1 + np.exp(-a))),
    "Log": (lambda a, b: B.Log()(B.Abs()(a)), lambda a, b: np.log(np.abs(a))),
    "Neg": (lambda a, b: B.Neg()(a), lambda a, b: -a),
    "Clip": (lambda a, b: B.Clip(-0.5, 0.25)(a), lambda a, b: np.clip(a, -0.5, 0.25)),
    "ClipMax": (lambda a, b: B.Clip(clip_max=0.25)(a), lambda a, b: np.minimum(a, 0.25)),
    "PassThrough": (lambda a, b: B.PassThrough()(a)[0], lambda a, b: a),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(BUILDING))
def test_building_blocks(rng, dtype, name):
    make, reference = BUILDING[name]
    a, b = rng.normal(size=(2, 3, 4)).astype(dtype) + 0.1
    got = run_block(_Expression(make), dtype, [[3, 4], [3, 4]], {"x0": a, "x1": b})
    assert got.dtype == dtype
    np.testing.assert_allclose(got, reference(a, b), rtol=1e-5)


def test_cast_and_explicit_constant_dtype(rng):
    a = rng.normal(size=(3, 4))
    make = lambda x, y: onnxblock.blocks.Add()(
        onnxblock.blocks.Cast(np.float32)(x), onnxblock.blocks.Constant(2.0, dtype=np.float64)())
    got = run_block(_Expression(make), np.float64, [[3, 4], [3, 4]], {"x0": a, "x1": a})
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, a.astype(np.float32) + 2, rtol=1e-6)


def test_binary_type_mismatch_names_operands():
    make = lambda x, y: onnxblock.blocks.Add()(x, onnxblock.blocks.Cast(np.float32)(y))
    with pytest.raises(TypeError, match="Add: operands 'y0'"):
        run_block(_Expression(make), np.float64, [[3], [3]], {})


def test_linear_block(rng):
    x = rng.normal(size=(5, 3))
    model = identity_model(np.float64, [["N", 3]])
    fwd = _Forward(onnxblock.blocks.Linear(3, 2, name="fc", random_state=0))
    with onnxblock.base(model):
        fwd("y0")
    out = fwd.to_model_proto()
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    assert (inits["fc.weight"].shape == (2, 3)
            and np.all(np.abs(inits["fc.weight"]) <= 1 / np.sqrt(3)))
    np.testing.assert_allclose(run_onnx(out, {"x0": x})[0],
                               x @ inits["fc.weight"].T + inits["fc.bias"])


def test_block_outside_context_and_unbuilt_blocks():
    with pytest.raises(RuntimeError, match="outside of a model context"):
        onnxblock.blocks.Constant(1.0)()
    with pytest.raises(RuntimeError, match="first"):
        _Forward(onnxblock.blocks.PassThrough()).to_model_proto()
    with pytest.raises(RuntimeError, match="do not nest"):
        with onnxblock.empty_base(), onnxblock.empty_base():
            pass


class _MSETraining(onnxblock.TrainingBlock):
    def __init__(self):
        super().__init__()
        self.loss = onnxblock.loss.MSELoss()

    def build(self, name):
        return self.loss(name)


class _NoInitTraining(onnxblock.TrainingBlock):
    def __init__(self):
        self.loss = onnxblock.loss.MSELoss()

    def build(self, name):
        return self.loss(name)


def linear_model(dtype=np.float64):
    elem = np_dtype_to_onnx(dtype)
    inits = [numpy_helper.from_array(np.array([[1.0], [-2.0]], dtype), "W"),
             numpy_helper.from_array(np.array([0.5], dtype), "B"),
             numpy_helper.from_array(np.array([0, 1], np.int64), "unused_ints")]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["X", "W", "B"], ["Y"])], "lin",
        [helper.make_tensor_value_info("X", elem, ["N", 2])],
        [helper.make_tensor_value_info("Y", elem, ["N", 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("cls", [_MSETraining, _NoInitTraining])
def test_training_block(rng, cls):
    block = cls()
    block.requires_grad("W")
    block.requires_grad("B")
    block.requires_grad("B", False)
    # onnxruntime-training's sentence (its tests assert it), then ortlearn's remedy
    with pytest.raises(RuntimeError, match=r"^Please build the training model first before "
                                           r"trying to retrieve the parameters\. Call"):
        block.parameters()
    with onnxblock.base(linear_model()) as accessor:
        assert block("Y") == "onnxblock_ReduceMean_out"
    training, evaluation = block.to_model_proto()
    trainable, frozen = block.parameters()
    assert [p.name for p in trainable] == ["W"] and [p.name for p in frozen] == ["B"]
    assert accessor.model == training
    assert [i.name for i in training.graph.input] == [
        "X", "target", "W", "B", "W_grad.accumulation.buffer", "lazy_reset_grad"]
    assert [i.name for i in evaluation.graph.input] == ["X", "target", "W", "B"]
    x, t = rng.normal(size=(4, 2)), rng.normal(size=(4, 1))
    w, b = np.array([[1.0], [-2.0]]), np.array([0.5])
    loss, grad = run_onnx(training, {"X": x, "target": t, "W": w, "B": b,
                                     "W_grad.accumulation.buffer": np.zeros((2, 1)),
                                     "lazy_reset_grad": np.array(True)})
    r = x @ w + b - t
    np.testing.assert_allclose(loss, np.mean(r ** 2))
    np.testing.assert_allclose(grad, 2 * x.T @ r / len(r))


def test_optimizer_blocks():
    """Called, an optimizer block returns its flag output, as onnxruntime-training's do."""
    w = helper.make_tensor("W", TensorProto.DOUBLE, [2], [1.0, 2.0])
    with onnxblock.empty_base() as accessor:
        flag = onnxblock.optim.SGD(momentum=0.9)(([w], []))
    assert flag == "updated_flag"
    assert [o.name for o in accessor.model.graph.output] == [
        "updated_flag", "params.updated", "first_order_moments.updated"]
    with onnxblock.empty_base() as accessor:  # clip_grad first, as there
        onnxblock.optim.SGD(onnxblock.optim.ClipGradNorm(2.0))(([w], []))
    assert '"clip_grad": 2.0' in accessor.model.metadata_props[0].value
    with onnxblock.empty_base() as accessor:
        onnxblock.optim.AdamW(clip_grad=onnxblock.optim.ClipGradNorm(1.0))(([w], []))
    assert '"clip_grad": 1.0' in accessor.model.metadata_props[0].value
    with pytest.raises(TypeError, match="clip_grad"):
        onnxblock.optim.SGD(clip_grad="1")


def test_clip_grad_norm_block():
    model = identity_model(np.float64, [[3], [2]])
    fwd = _Forward(onnxblock.optim.ClipGradNorm(1.0))
    with onnxblock.base(model):
        fwd("y0", "y1")
    g0, g1 = np.array([3.0, 0.0, 0.0]), np.array([0.0, 4.0])
    out = run_onnx(fwd.to_model_proto(), {"x0": g0, "x1": g1})
    np.testing.assert_allclose(out[0], g0 / (5 + 1e-6))
    np.testing.assert_allclose(out[1], g1 / (5 + 1e-6))


def test_elementwise_loss_blocks_read_the_score_table():
    """MSELoss and L1Loss name entries of ortlearn.loss.SCORES; a bad name fails at once."""
    from ortlearn.loss import SCORES
    from ortlearn.onnxblock.loss import _ElementwiseLoss

    assert onnxblock.loss.MSELoss._score in SCORES
    assert onnxblock.loss.L1Loss._score in SCORES
    with pytest.raises(ValueError, match="'svm' is not a key of ortlearn.loss.SCORES"):
        type("SvmLoss", (_ElementwiseLoss,), {"_score": "svm"})


def test_threads_build_their_own_models_at_once():
    """The base model is the thread's: two threads inside ``base`` at the same time (two
    estimators exporting artifacts) used to collide ('contexts do not nest')."""
    import threading

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    inside, results, errors = threading.Barrier(2), {}, []

    def build(name):
        try:
            with onnxblock.base(model) as accessor:
                inside.wait(timeout=30)  # both threads are in a context now
                onnxblock.loss.MSELoss()("y")
                results[name] = [i.name for i in accessor.model.graph.input]
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert results == {"a": ["x", "target"], "b": ["x", "target"]}
