"""GradientContext's shared helpers: scatter_flat's sums below opset 16, expose_output,
fill_like. The rules using them are tested in their own files; these check the helpers'
own promises (sizes, node counts, names)."""


import numpy as np
import onnx
import pytest
from gradcheck import check_op, node, randn, session
from onnx import TensorProto, helper, numpy_helper

from ortlearn.autodiff import build_gradient
from ortlearn.autodiff._context import MAX_STORED_FILL
from ortlearn.graph import finalize_model

I64 = np.int64


# ---------------------------------------------------------------- scatter_flat, accumulate
@pytest.mark.parametrize("opset", [13, 15, 16])
@pytest.mark.parametrize("case", ["gather", "gather_nd", "maxpool", "reflect_pad"])
def test_repeated_positions_add_up(case, opset):
    """Gradients reaching one element several times add up, at every opset."""
    if case == "gather":
        nodes = [node("Gather", ["X", "I"], axis=0)]
        consts = {"I": np.array([[2, 0, 2], [1, 2, 2]], I64)}
        x = randn(3, 2)
    elif case == "gather_nd":
        nodes = [node("GatherND", ["X", "I"])]
        consts = {"I": np.array([[0, 1], [0, 1], [2, 0]], I64)}
        x = randn(3, 2)
    elif case == "maxpool":  # overlapping windows: one maximum feeds several outputs
        nodes = [node("MaxPool", ["X"], kernel_shape=[3, 3], strides=[1, 1])]
        consts = {}
        x = randn(1, 2, 4, 5)
    else:
        nodes = [node("Pad", ["X", "P"], mode="reflect")]
        consts = {"P": np.array([0, 0, 2, 1, 0, 0, 1, 2], I64)}
        x = randn(1, 2, 3, 4)
    grads = check_op(nodes, {"X": x}, consts=consts, opset=opset)
    assert np.isfinite(grads["X"]).all()


def _gather_model(n_rows, opset):
    """loss = sum(Gather(W, I) * R), W float32 (n_rows,), I and R inputs."""
    graph = helper.make_graph(
        [node("Gather", ["W", "I"], "G", axis=0), node("Mul", ["G", "R"], "GR"),
         node("ReduceSum", ["GR"], "loss", keepdims=0)], "g",
        [helper.make_tensor_value_info("I", TensorProto.INT64, ["M"]),
         helper.make_tensor_value_info("R", TensorProto.FLOAT, ["M"])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.zeros(n_rows, np.float32), "W")])
    return finalize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


@pytest.mark.parametrize("opset", [13, 16])
def test_accumulation_is_linear_in_size(opset):
    """200k lookups in a 200k-row table: a one-hot product would hold 4e10 elements.

    Below opset 16 the sums come from sorted prefix sums (float64), exact to
    float32's precision however long the tensor.
    """
    n = 200_000
    grad_model = build_gradient(_gather_model(n, opset), wrt=["W"])
    ops = {nd.op_type for nd in grad_model.graph.node}
    assert not ops & {"MatMul", "Einsum", "OneHot"}
    assert ("TopK" in ops) == (opset < 16)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, n // 10, n)  # every used row many times
    idx[:5] = [7, 7, 7, n - 1, 0]
    r = (rng.standard_normal(n) + 100).astype(np.float32)  # large prefix sums
    got = session(grad_model).run(None, {"I": idx, "R": r})[1]
    expected = np.zeros(n)
    np.add.at(expected, idx, r.astype(np.float64))
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-4)


def test_accumulation_of_nothing():
    """No lookup (M = 0): a zero gradient."""
    grad_model = build_gradient(_gather_model(4, 13), wrt=["W"])
    got = session(grad_model).run(None, {"I": np.zeros(0, I64),
                                         "R": np.zeros(0, np.float32)})[1]
    np.testing.assert_array_equal(got, np.zeros(4, np.float32))


# ---------------------------------------------------------------- expose_output
def _loss_of(nodes, x, opset, inits=()):
    graph = helper.make_graph(
        [*nodes, node("ReduceSumSquare", ["Y"], "loss", keepdims=0)], "g", [],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(x.astype(np.float32), "X"), *inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("outputs, index", [
    (["Y"], 1), (["Y", ""], 1)])
def test_expose_output_maxpool_indices(outputs, index):
    """The forward node gets a fresh name for its optional output; the graph stays valid."""
    model = _loss_of([helper.make_node("MaxPool", ["X"], outputs, kernel_shape=[2])],
                     randn(1, 1, 4), 18)
    grad_model = build_gradient(model, wrt=["X"])
    pool = next(n for n in grad_model.graph.node if n.op_type == "MaxPool")
    assert len(pool.output) == 2 and pool.output[1].startswith("grad_maxpool_indices")
    onnx.checker.check_model(grad_model, full_check=True)


def test_expose_output_fills_the_outputs_before():
    """LayerNormalization's InvStdDev (index 2) with no Mean: Mean gets a name too."""
    x, s = randn(2, 3), randn(3)
    model = _loss_of([helper.make_node("LayerNormalization", ["X", "S"], ["Y"])], x, 18,
                     [numpy_helper.from_array(s.astype(np.float32), "S")])
    grad_model = build_gradient(model, wrt=["X", "S"])
    ln = next(n for n in grad_model.graph.node if n.op_type == "LayerNormalization")
    assert [o.startswith("grad_layernorm") for o in ln.output[1:]] == [True, True]


def test_expose_output_keeps_a_given_name():
    model = _loss_of([helper.make_node("Dropout", ["X", "ratio", "train"], ["Y", "mask"])],
                     randn(2, 3), 18)
    model.graph.node.insert(0, helper.make_node(
        "Constant", [], ["train"], value=numpy_helper.from_array(np.array(True))))
    model.graph.node.insert(0, helper.make_node(
        "Constant", [], ["ratio"], value=numpy_helper.from_array(np.array(0.5, np.float32))))
    grad_model = build_gradient(model, wrt=["X"])
    drop = next(n for n in grad_model.graph.node if n.op_type == "Dropout")
    assert list(drop.output) == ["Y", "mask"]


# ---------------------------------------------------------------- fill_like
@pytest.mark.parametrize("shape, stored", [((2, 3), True), ((MAX_STORED_FILL + 1,), False),
                                           ((50, 40), False)])
def test_fill_like_stores_small_tensors_only(shape, stored):
    """A weight the loss does not depend on gets zeros: a stored constant when small, a
    ConstantOfShape of the static shape above MAX_STORED_FILL elements."""
    graph = helper.make_graph(
        [node("ReduceSumSquare", ["A"], "loss", keepdims=0)], "g", [],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.ones(2, np.float32), "A"),
         numpy_helper.from_array(np.ones(shape, np.float32), "U")])
    grad_model = build_gradient(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), wrt=["U"])
    ops = [n.op_type for n in grad_model.graph.node]
    assert ("ConstantOfShape" in ops) != stored
    biggest = max(np.prod(t.dims) for n in grad_model.graph.node for a in n.attribute
                  if a.type == onnx.AttributeProto.TENSOR for t in [a.t])
    assert biggest <= MAX_STORED_FILL
    got = session(grad_model).run(None, {})[1]
    assert got.shape == shape and not got.any()
