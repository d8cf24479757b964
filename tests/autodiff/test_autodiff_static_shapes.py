"""Static shapes in the backward pass: no run-time shape logic where shapes are known."""

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn.autodiff import build_gradient
from ortlearn.graph import constant_values, finalize_model, refine_shapes, value_info_map
from tests.conftest import run_onnx

_RUNTIME_SHAPE_OPS = {"Shape", "NonZero", "ConstantOfShape", "ScatterElements", "Size"}


def _model(nodes, inputs, inits, consts=()):
    const_nodes = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(v))
                   for name, v in consts]
    graph = helper.make_graph(const_nodes + nodes, "g", inputs,
                              [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return finalize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def _ops(model):
    return collections.Counter(n.op_type for n in model.graph.node)


def _check_fd(model, feeds, inits, eps=1e-6):
    """Gradients of ``model`` against central finite differences (float64)."""
    grad_model = build_gradient(model, wrt=list(inits))
    outs = run_onnx(grad_model, feeds)
    for name, grad in zip(inits, outs[1:]):
        w = inits[name]
        fd = np.zeros_like(w)
        for i in np.ndindex(w.shape):
            vals = []
            for step in (eps, -eps):
                shifted = dict(inits)
                shifted[name] = w.copy()
                shifted[name][i] += step
                vals.append(run_onnx(_model_with(model, shifted), feeds)[0])
            fd[i] = (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)
    return grad_model


def _model_with(model, inits):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.initializer[:]
    m.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    return m


def test_bias_add_with_dynamic_batch_needs_no_shape_node():
    rng = np.random.default_rng(0)
    inits = {"b": rng.normal(size=3)}
    model = _model([helper.make_node("Add", ["X", "b"], ["Y"]),
                    helper.make_node("Mul", ["Y", "Y"], ["Z"]),
                    helper.make_node("ReduceSum", ["Z"], ["loss"], keepdims=0)],
                   [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 3])], inits)
    grad_model = _check_fd(model, {"X": rng.normal(size=(5, 3))}, inits)
    ops = _ops(grad_model)
    # one Shape expands the gradient of the sum over the symbolic batch; none for the bias
    assert ops["Shape"] == 1 and not set(ops) & (_RUNTIME_SHAPE_OPS - {"Shape"})


def _cross_entropy_model(inits, n_classes=4, axis=1):
    # The loss of ortlearn.loss: Reshape(y, [-1, 1]) loses the batch symbol
    # in ONNX shape inference, then a per-row weight multiplies the picked terms.
    nodes = [helper.make_node("MatMul", ["X", "W"], ["S"]),
             helper.make_node("LogSoftmax", ["S"], ["L"], axis=axis),
             helper.make_node("Reshape", ["y", "col"], ["yc"]),
             helper.make_node("GatherElements", ["L", "yc"], ["P"], axis=1),
             helper.make_node("Neg", ["P"], ["NP"]),
             helper.make_node("ReduceSum", ["NP", "one"], ["R"], keepdims=0),
             helper.make_node("Mul", ["R", "sw"], ["RW"]),
             helper.make_node("ReduceSum", ["RW"], ["loss"], keepdims=0)]
    inputs = [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 3]),
              helper.make_tensor_value_info("y", TensorProto.INT64, ["N"]),
              helper.make_tensor_value_info("sw", TensorProto.DOUBLE, ["N"])]
    return _model(nodes, inputs, inits, consts=[("col", np.array([-1, 1], np.int64)),
                                                ("one", np.array([1], np.int64))])


def test_refined_shapes_keep_the_batch_symbol_through_reshape():
    model = _cross_entropy_model({"W": np.zeros((3, 4))})
    shapes = refine_shapes(model.graph, value_info_map(model),
                           constant_values(model.graph, ["W"]))
    assert shapes["yc"] == ["N", 1]
    assert shapes["P"] == ["N", 1]
    assert shapes["RW"] == ["N"]


@pytest.mark.parametrize("axis", [1, -1])
@pytest.mark.parametrize("labels", [[0, 3, 1, 2, 3], [0, -1, 1, -2, 3]])
def test_cross_entropy_gradient_is_a_one_hot_product(labels, axis):
    rng = np.random.default_rng(1)
    inits = {"W": rng.normal(size=(3, 4))}
    model = _cross_entropy_model(inits, axis=axis)
    feeds = {"X": rng.normal(size=(5, 3)), "y": np.array(labels, np.int64),
             "sw": rng.uniform(0.5, 2, size=5)}
    grad_model = _check_fd(model, feeds, inits)
    ops = _ops(grad_model)
    assert ops["ScatterElements"] == 0 and ops["NonZero"] == 0 and ops["Equal"] == 1
    # the only run-time shape left: expanding the gradient of the sum over rows
    assert ops["Shape"] <= 1
    # the LogSoftmax gradient reuses the row sum of the one-hot product (its factor):
    # the only ReduceSum nodes are the forward pass's two
    assert ops["ReduceSum"] == 2


def test_log_softmax_read_twice_sums_its_accumulated_gradient():
    # L feeds the one-hot pick and a second term: its gradient is a Sum of both, whose
    # row sum is not the pick's factor any more
    rng = np.random.default_rng(2)
    inits = {"W": rng.normal(size=(3, 4))}
    nodes = [helper.make_node("MatMul", ["X", "W"], ["S"]),
             helper.make_node("LogSoftmax", ["S"], ["L"], axis=1),
             helper.make_node("Reshape", ["y", "col"], ["yc"]),
             helper.make_node("GatherElements", ["L", "yc"], ["P"], axis=1),
             helper.make_node("Mul", ["L", "L"], ["L2"]),
             helper.make_node("ReduceSum", ["P"], ["picked"], keepdims=0),
             helper.make_node("ReduceSum", ["L2"], ["squares"], keepdims=0),
             helper.make_node("Sub", ["squares", "picked"], ["loss"])]
    inputs = [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 3]),
              helper.make_tensor_value_info("y", TensorProto.INT64, ["N"])]
    model = _model(nodes, inputs, inits, consts=[("col", np.array([-1, 1], np.int64))])
    feeds = {"X": rng.normal(size=(5, 3)), "y": np.array([0, 3, 1, 2, 3], np.int64)}
    _check_fd(model, feeds, inits)


def test_slices_with_the_same_bounds_share_their_length():
    # Two batches sliced with the same run-time bounds: their product needs no
    # run-time broadcast analysis, although their length is unknown.
    rng = np.random.default_rng(2)
    inits = {"w": rng.normal(size=6)}
    nodes = [helper.make_node("Slice", ["w", "start", "end", "axes"], ["a"]),
             helper.make_node("Slice", ["v", "start", "end", "axes"], ["c"]),
             helper.make_node("Mul", ["a", "c"], ["m"]),
             helper.make_node("ReduceSumSquare", ["m"], ["loss"], keepdims=0)]
    inputs = [helper.make_tensor_value_info("v", TensorProto.DOUBLE, [6]),
              helper.make_tensor_value_info("start", TensorProto.INT64, [1]),
              helper.make_tensor_value_info("end", TensorProto.INT64, [1])]
    model = _model(nodes, inputs, inits, consts=[("axes", np.array([0], np.int64))])
    feeds = {"v": rng.normal(size=6), "start": np.array([1], np.int64),
             "end": np.array([5], np.int64)}
    grad_model = _check_fd(model, feeds, inits)
    assert _ops(grad_model)["NonZero"] == 0


def test_reduce_mean_over_static_axes_expands_without_shape():
    rng = np.random.default_rng(3)
    inits = {"W": rng.normal(size=(3, 4))}
    nodes = [helper.make_node("MatMul", ["X", "W"], ["S"]),
             helper.make_node("Tanh", ["S"], ["T"]),
             helper.make_node("ReduceMean", ["T", "ax"], ["R"], keepdims=0),
             helper.make_node("ReduceSumSquare", ["R"], ["loss"], keepdims=0)]
    model = _model(nodes, [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 3])],
                   inits, consts=[("ax", np.array([1], np.int64))])
    grad_model = _check_fd(model, {"X": rng.normal(size=(5, 3))}, inits)
    assert _ops(grad_model)["Shape"] <= 1  # only the one of ReduceSumSquare's input


@pytest.mark.parametrize("axes, n_sizes", [(None, 1), ([0], 1)])
def test_reduce_mean_over_the_batch_counts_the_input_only(axes, n_sizes):
    """Mean over the symbolic batch axis: the output's size is known (1 or 4), so the
    gradient divides by the input's Size alone."""
    rng = np.random.default_rng(4)
    inits = {"W": rng.normal(size=(3, 4))}
    mean = (helper.make_node("ReduceMean", ["T"], ["R"], keepdims=0) if axes is None else
            helper.make_node("ReduceMean", ["T", "ax"], ["R"], keepdims=0))
    nodes = [helper.make_node("MatMul", ["X", "W"], ["S"]),
             helper.make_node("Tanh", ["S"], ["T"]), mean,
             helper.make_node("ReduceSumSquare", ["R"], ["loss"], keepdims=0)]
    consts = [] if axes is None else [("ax", np.array(axes, np.int64))]
    model = _model(nodes, [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 3])],
                   inits, consts=consts)
    grad_model = _check_fd(model, {"X": rng.normal(size=(5, 3))}, inits)
    assert _ops(grad_model)["Size"] == n_sizes


def test_mlp_classifier_fused_step_is_small(monkeypatch):
    from sklearn.datasets import load_digits

    import ortlearn.training.engine as engine
    from ortlearn import OrtMLPClassifier
    from ortlearn.training.fused import build_fused_step

    captured = {}
    original = engine.build_fused_epoch

    def spy(*args, **kwargs):
        captured["args"] = (args, kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "build_fused_epoch", spy)
    X, y = load_digits(return_X_y=True)
    est = OrtMLPClassifier(hidden_layer_sizes=(100,), max_iter=1, batch_size=64, solver="adam")
    with pytest.warns(Warning):
        est.fit((X[:200] / 16).astype(np.float32), y[:200])
    args, kwargs = captured["args"]
    step, _ = build_fused_step(*args, **kwargs)
    ops = _ops(step)
    # 144 nodes (and 9 Shape) before the static shape work
    assert sum(c for op, c in ops.items() if op != "Constant") <= 125
    assert ops["Shape"] <= 3 and ops["NonZero"] == 0 and ops["ScatterElements"] == 0
