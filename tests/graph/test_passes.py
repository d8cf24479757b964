"""The graph rewrite passes of ``ortlearn.graph.passes``, each alone: same values, fewer
or cheaper nodes."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import run_onnx
from onnx import TensorProto, helper, numpy_helper

from ortlearn.graph import GraphBuilder, finalize_model, needed_nodes
from ortlearn.graph.passes import (
    CHEAPER_NODES,
    GraphView,
    column_sums_as_products,
    common_factors,
    expands_as_broadcasts,
    masks_as_products,
    negations_folded,
    run_passes,
    single_values_at_full_rank,
    unused_nodes_removed,
)


def _run(rewrite, model):
    """One pass over the nodes of ``model``, its outputs kept."""
    nodes = list(model.graph.node)
    return rewrite(nodes, GraphView(model, nodes, [o.name for o in model.graph.output]))


def _where_graph(dtype):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    zero = numpy_helper.from_array(np.array(0, dtype=dtype), "zero")
    nodes = [helper.make_node("Constant", [], ["z"], value=zero),
             helper.make_node("Greater", ["x", "z"], ["c"]),
             helper.make_node("Where", ["c", "g", "z"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, [None, 3]),
                                           helper.make_tensor_value_info("g", elem, [None, 3])],
                              [helper.make_tensor_value_info("out", elem, [None, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_where_masks_become_products_of_the_same_value(dtype):
    model = _where_graph(dtype)
    rs = np.random.RandomState(0)
    feeds = {"x": rs.randn(7, 3).astype(dtype), "g": rs.randn(7, 3).astype(dtype)}
    expected = run_onnx(model, feeds)[0]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    nodes = _run(masks_as_products, model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    onnx.checker.check_model(rewritten)
    assert [n.op_type for n in nodes] == ["Constant", "Greater", "Cast", "Mul"]
    got = run_onnx(rewritten, feeds)[0]
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.where(feeds["x"] > 0, feeds["g"], 0))
    np.testing.assert_array_equal(got, expected)


def test_a_where_with_a_nonzero_branch_is_kept():
    model = _where_graph(np.float32)
    model.graph.node[0].attribute[0].t.CopyFrom(
        numpy_helper.from_array(np.array(1, dtype=np.float32), "one"))
    assert [n.op_type for n in _run(masks_as_products, model)][-1] == "Where"


def _float_graph(nodes, inputs: dict, outputs: dict, opset=18, initializers=()):
    """A float64 model of ``nodes``; ``inputs`` and ``outputs`` map names to shapes."""
    f = TensorProto.DOUBLE
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info(n, f, s) for n, s in inputs.items()],
                              [helper.make_tensor_value_info(n, f, s) for n, s in outputs.items()],
                              list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _with_nodes(model, nodes):
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    onnx.checker.check_model(rewritten)
    return rewritten


def test_a_negated_product_or_quotient_of_a_constant_negates_the_constant():
    c = numpy_helper.from_array(np.array([0.5, -2.0, 3.0]), "c")
    nodes = [helper.make_node("Constant", [], ["c"], value=c),
             helper.make_node("Div", ["c", "x"], ["q"]),
             helper.make_node("Neg", ["q"], ["nq"]),
             helper.make_node("Mul", ["x", "c"], ["p"]),
             helper.make_node("Neg", ["p"], ["np"]),
             helper.make_node("Mul", ["x", "x"], ["xx"]),   # no constant: kept
             helper.make_node("Neg", ["xx"], ["nxx"]),
             helper.make_node("Div", ["c", "x"], ["q2"]),   # read twice: kept
             helper.make_node("Neg", ["q2"], ["nq2"]),
             helper.make_node("Add", ["q2", "nq2"], ["zero"])]
    outputs = {"nq": [2, 3], "np": [2, 3], "nxx": [2, 3], "zero": [2, 3]}
    model = _float_graph(nodes, {"x": [2, 3]}, outputs)
    folded = _run(negations_folded, model)
    assert [n.op_type for n in folded].count("Neg") == 2  # of x * x and of the shared c / x
    feeds = {"x": np.random.RandomState(0).randn(2, 3)}
    expected = run_onnx(model, feeds)
    for got, want in zip(run_onnx(_with_nodes(model, folded), feeds), expected):
        np.testing.assert_array_equal(got, want)  # negation is exact


@pytest.mark.parametrize("op", ["Sub", "Add"])
def test_a_factor_shared_by_two_products_is_taken_out(op):
    nodes = [helper.make_node("Mul", ["a", "s"], ["as"]),
             helper.make_node("Mul", ["s", "b"], ["bs"]),
             helper.make_node(op, ["as", "bs"], ["out"]),
             helper.make_node("Mul", ["a", "b"], ["ab"]),     # read twice: kept
             helper.make_node("Mul", ["a", "s"], ["as2"]),
             helper.make_node(op, ["ab", "as2"], ["out2"]),
             helper.make_node(op, ["ab", "ab"], ["out3"])]
    inputs = {"a": [3, 4], "b": [1, 4], "s": [3, 1]}
    outputs = {"out": [3, 4], "out2": [3, 4], "out3": [3, 4]}
    model = _float_graph(nodes, inputs, outputs)
    factored = _run(common_factors, model)
    assert [n.op_type for n in factored] == [op, "Mul"] + [n.op_type for n in nodes[3:]]
    rs = np.random.RandomState(0)
    feeds = {k: rs.randn(*shape) for k, shape in inputs.items()}
    a, b, s = feeds["a"], feeds["b"], feeds["s"]
    got = run_onnx(_with_nodes(model, factored), feeds)
    combine = np.subtract if op == "Sub" else np.add
    np.testing.assert_array_equal(got[0], combine(a, b) * s)
    np.testing.assert_allclose(got[0], combine(a * s, b * s), rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(got[1], combine(a * b, a * s))


@pytest.mark.parametrize("opset, gathers", [(13, 1), (18, 0)])
def test_column_sums_become_products_at_every_opset(opset, gathers):
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [helper.make_node("Constant", [], ["axes"], value=axes),
             helper.make_node("ReduceSum", ["x", "axes"], ["sums"], keepdims=1),
             helper.make_node("ReduceSum", ["x", "axes"], ["flat"], keepdims=0)]
    model = _float_graph(nodes, {"x": ["n", 40]}, {"sums": [1, 40], "flat": [40]}, opset)
    rewritten = _run(column_sums_as_products, model)
    ops = [n.op_type for n in rewritten]
    assert "ReduceSum" not in ops and ops.count("MatMul") == 2
    assert ops.count("Gather") == 2 * gathers
    x = np.random.RandomState(0).randn(7, 40)
    sums, flat = run_onnx(_with_nodes(model, rewritten), {"x": x})
    np.testing.assert_allclose(sums, x.sum(axis=0, keepdims=True), rtol=1e-13)
    np.testing.assert_allclose(flat, x.sum(axis=0), rtol=1e-13)


def _expand_then(other_shape):
    """``Mul(Expand(s, (3, 4)), y)`` with ``y`` of ``other_shape``, and its nodes."""
    b = GraphBuilder(prefix="t_")
    expanded = b.op("Expand", ["s", b.ints([3, 4])])
    b.op("Mul", [expanded, "y"], outputs=["out"])
    f = TensorProto.DOUBLE
    graph = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("s", f, []),
                                             helper.make_tensor_value_info("y", f, other_shape)],
                              [helper.make_tensor_value_info("out", f, [3, 4])])
    return finalize_model(helper.make_model(graph))


@pytest.mark.parametrize("other_shape, expected_expands", [([3, 4], 0), ([1, 4], 1)])
def test_expand_feeding_a_broadcast_is_dropped_only_when_redundant(other_shape,
                                                                   expected_expands):

    model = _expand_then(other_shape)
    nodes = needed_nodes(_run(expands_as_broadcasts, model), ["out"])
    assert sum(n.op_type == "Expand" for n in nodes) == expected_expands
    rng = np.random.default_rng(0)
    feeds = {"s": np.array(1.5), "y": rng.normal(size=other_shape)}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    got = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_array_equal(got, expected)
    assert got.shape == (3, 4)


def _expand_chain(target, other_shape, neg_is_output=False):
    """``Mul(Neg(Expand(s, target)), y)``: an expanded value through a ``Neg``."""
    b = GraphBuilder(prefix="t_")
    negated = b.op("Neg", [b.op("Expand", ["s", b.ints(target)])])
    b.op("Mul", [negated, "y"], outputs=["out"])
    f = TensorProto.DOUBLE
    outputs = [helper.make_tensor_value_info("out", f,
                                             list(np.broadcast_shapes(target, other_shape)))]
    if neg_is_output:
        outputs.append(helper.make_tensor_value_info(negated, f, target))
    graph = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("s", f, []),
                                             helper.make_tensor_value_info("y", f, other_shape)],
                              outputs)
    return finalize_model(helper.make_model(graph))


@pytest.mark.parametrize("target, other_shape, neg_is_output, expected_expands", [
    ([3, 1], [3, 4], False, 0),   # (3, 1) broadcast against (3, 4): (3, 4), as a scalar does
    ([3, 4], [2, 3, 4], False, 0),
    ([3, 1], [1, 4], False, 1),   # the Expand makes the product (3, 4)
    ([3, 1], [3, 4], True, 1),    # the Neg's value is read outside with its shape
])
def test_expand_through_a_neg_to_a_broadcast(target, other_shape, neg_is_output,
                                             expected_expands):

    model = _expand_chain(target, other_shape, neg_is_output)
    outputs = [o.name for o in model.graph.output]
    nodes = needed_nodes(_run(expands_as_broadcasts, model), outputs)
    assert sum(n.op_type == "Expand" for n in nodes) == expected_expands
    feeds = {"s": np.array(1.5), "y": np.random.default_rng(0).normal(size=other_shape)}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    got = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
        assert g.shape == e.shape


@pytest.mark.parametrize("other_shape, expected_expands", [
    (["B", "M", 1], 0),  # each row's value spread over its entries: the product broadcasts
    ([1, "M", 1], 0),    # broadcast against (B, 1, 1) or (B, M, 1), the product is (B, M, 1)
    ([1, 1, 1], 1),      # the Expand makes the product (B, M, 1)
])
def test_expand_of_rows_to_a_measured_shape(other_shape, expected_expands):
    """``Mul(Expand(Unsqueeze(d, -1), Shape(v)), y)``: a sparse row's product gradient,
    ``d`` (B, 1) one value a row, ``v`` (B, M, 1) the row's entries; symbolic sizes (the
    shape of the Expand is read off ``Shape(v)``, refine_shapes)."""
    b = GraphBuilder(prefix="t_")
    column = b.op("Unsqueeze", ["d", b.ints([-1])])
    b.op("Mul", [b.op("Expand", [column, b.op("Shape", ["v"])]), "y"], outputs=["out"])
    f = TensorProto.DOUBLE
    graph = helper.make_graph(
        b.nodes, "g", [helper.make_tensor_value_info("d", f, ["B", 1]),
                       helper.make_tensor_value_info("v", f, ["B", "M", 1]),
                       helper.make_tensor_value_info("y", f, other_shape)],
        [helper.make_tensor_value_info("out", f, ["B", "M", 1])])
    model = finalize_model(helper.make_model(graph))
    nodes = needed_nodes(_run(expands_as_broadcasts, model), ["out"])
    assert sum(n.op_type == "Expand" for n in nodes) == expected_expands
    assert sum(n.op_type == "Shape" for n in nodes) == expected_expands
    rng = np.random.default_rng(0)
    sizes = {"B": 3, "M": 4}
    feeds = {"d": rng.normal(size=(3, 1)), "v": rng.normal(size=(3, 4, 1)),
             "y": rng.normal(size=[sizes.get(d, d) for d in other_shape])}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    got = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_array_equal(got, expected)
    assert got.shape == (3, 4, 1)


@pytest.mark.parametrize("factor_shape, expected_expands", [
    ([], 0), ([1, 1], 0),   # Expand(s) * c is Expand(s * c)
    ([1, 1, 1], 1),         # s * c would add a leading dimension the Expand does not
    ([1, 4], 1),            # c is no single value
])
def test_expand_through_a_product_with_one_value(factor_shape, expected_expands):
    """``Mul(Mul(Expand(s, (3, 1)), c), y)``: the half of a squared error's gradient."""

    b = GraphBuilder(prefix="t_")
    scaled = b.op("Mul", [b.op("Expand", ["s", b.ints([3, 1])]), "c"])
    b.op("Mul", [scaled, "y"], outputs=["out"])
    f = TensorProto.DOUBLE
    out_shape = list(np.broadcast_shapes((3, 1), tuple(factor_shape), (3, 4)))
    graph = helper.make_graph(
        b.nodes, "g", [helper.make_tensor_value_info("s", f, []),
                       helper.make_tensor_value_info("c", f, factor_shape),
                       helper.make_tensor_value_info("y", f, [3, 4])],
        [helper.make_tensor_value_info("out", f, out_shape)])
    model = finalize_model(helper.make_model(graph))
    nodes = needed_nodes(_run(expands_as_broadcasts, model), ["out"])
    assert sum(n.op_type == "Expand" for n in nodes) == expected_expands
    rng = np.random.default_rng(0)
    feeds = {"s": np.array(1.5), "c": rng.normal(size=factor_shape),
             "y": rng.normal(size=(3, 4))}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    got = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_array_equal(got, expected)
    assert got.shape == tuple(out_shape)


def test_the_passes_run_in_their_order_each_on_the_nodes_of_the_previous():
    names = [p.name for p in CHEAPER_NODES]
    assert names == ["masks_as_products", "expands_as_broadcasts", "negations_folded",
                     "common_factors", "scattered_updates", "single_values_at_full_rank",
                     "unused_nodes_removed", "column_sums_as_products"]
    seen = []

    def recorder(name):
        def rewrite(nodes, graph):
            seen.append((name, [n.output[0] for n in nodes]))
            return nodes[1:]
        return rewrite

    from ortlearn.graph.passes import Pass

    model = _where_graph(np.float32)
    out = run_passes(model, model.graph.node, ["out"], [Pass("a", recorder("a")),
                                                         Pass("b", recorder("b"))])
    assert seen == [("a", ["z", "c", "out"]), ("b", ["c", "out"])]
    assert [n.output[0] for n in out] == ["out"]


def test_unused_nodes_are_removed():
    model = _where_graph(np.float32)
    extra = helper.make_node("Neg", ["x"], ["unused"])
    nodes = list(model.graph.node) + [extra]
    kept = unused_nodes_removed(nodes, GraphView(model, nodes, ["out"]))
    assert [n.output[0] for n in kept] == ["z", "c", "out"]


@pytest.mark.parametrize("n", [10, 300])
def test_single_values_get_the_rank_of_the_column_they_broadcast_against(n):
    """onnxruntime broadcasts a single value of a lower rank against an (n, 1) column one
    row at a time; at the column's rank it does not. A constant is reshaped whatever the
    size; a computed value (``s * s``) only against a large static column."""
    c = numpy_helper.from_array(np.array(0.25), "c")
    nodes = [helper.make_node("Constant", [], ["c"], value=c),
             helper.make_node("Mul", ["s", "s"], ["s2"]),
             helper.make_node("Mul", ["w", "c"], ["wc"]),           # a constant
             helper.make_node("Mul", ["s2", "wc"], ["step"]),       # a computed value
             helper.make_node("Sub", ["w", "step"], ["w.next"]),
             helper.make_node("Add", ["row", "s2"], ["row1"])]      # (1, n): kept
    model = _float_graph(nodes, {"w": [n, 1], "s": [], "row": [1, n]},
                         {"w.next": [n, 1], "row1": [1, n]})
    rewritten = _run(single_values_at_full_rank, model)
    by_output = {node.output[0]: node for node in rewritten}
    assert by_output["wc"].input[1] == "c.rank2"
    assert list(by_output["c.rank2"].attribute[0].t.dims) == [1, 1]
    assert by_output["row1"].input[1] == "s2"
    large = n >= 256
    assert by_output["step"].input[0] == ("s2.rank2" if large else "s2")
    assert ("Reshape" in [node.op_type for node in rewritten]) == large
    rs = np.random.RandomState(0)
    feeds = {"w": rs.randn(n, 1), "s": np.array(0.3), "row": rs.randn(1, n)}
    expected = run_onnx(model, feeds)
    got = run_onnx(_with_nodes(model, rewritten), feeds)
    for a, b in zip(got, expected):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)  # the same products


def test_a_single_value_of_the_full_rank_or_a_wider_tensor_is_left_alone():
    nodes = [helper.make_node("Mul", ["w", "s"], ["a"]),   # s already (1, 1)
             helper.make_node("Mul", ["v", "t"], ["b"])]   # v's last dimension is 3
    model = _float_graph(nodes, {"w": [5000, 1], "s": [1, 1], "v": [5000, 3], "t": []},
                         {"a": [5000, 1], "b": [5000, 3]})
    assert [list(node.input) for node in _run(single_values_at_full_rank, model)] == [
        ["w", "s"], ["v", "t"]]


def _sgd_step_of_a_gathered_column(n=300, columns=1):
    """A training step's update of weights w (n, columns) read by a Gather: its rows' gradient
    u scattered into zeros at the flat positions i, plus an L2 penalty's gradient c * w; the
    step's join reads an element of the gradient to order the update
    (training.fused._after)."""
    c = numpy_helper.from_array(np.array(2e-4), "c")
    zero = numpy_helper.from_array(np.zeros(1))
    i64 = TensorProto.INT64
    nodes = [helper.make_node("Constant", [], ["c"], value=c),
             helper.make_node("Constant", [], ["size"], value=numpy_helper.from_array(
                 np.array([n * columns], dtype=np.int64))),
             helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(
                 np.array([n, columns], dtype=np.int64))),
             helper.make_node("Constant", [], ["flat"], value=numpy_helper.from_array(
                 np.array([-1], dtype=np.int64))),
             helper.make_node("Constant", [], ["first"], value=numpy_helper.from_array(
                 np.array(0, dtype=np.int64))),
             helper.make_node("ConstantOfShape", ["size"], ["zeros"], value=zero),
             helper.make_node("ScatterElements", ["zeros", "i", "u"], ["scattered"], axis=0,
                              reduction="add"),
             helper.make_node("Reshape", ["scattered", "shape"], ["rows_gradient"]),
             helper.make_node("Mul", ["w", "c"], ["penalty_gradient"]),
             helper.make_node("Sum", ["penalty_gradient", "rows_gradient"], ["g"]),
             helper.make_node("Reshape", ["g", "flat"], ["g_flat"]),
             helper.make_node("Gather", ["g_flat", "first"], ["g0"]),
             helper.make_node("IsNaN", ["g0"], ["nan"]),
             helper.make_node("Where", ["nan", "lr", "lr"], ["s"]),
             helper.make_node("Mul", ["s", "g"], ["step"]),
             helper.make_node("Sub", ["w", "step"], ["w.next"])]
    f = TensorProto.DOUBLE
    graph = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("w", f, [n, columns]),
        helper.make_tensor_value_info("lr", f, []),
        helper.make_tensor_value_info("i", i64, ["k"]),
        helper.make_tensor_value_info("u", f, ["k"])],
        [helper.make_tensor_value_info("w.next", f, [n, columns])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("columns", [1, 3])
def test_the_step_of_a_gathered_column_scatters_its_rows_into_the_decayed_weights(columns):
    """w - s (c w + scatter(0, i, u)) as scatter(w (1 - s c), i, -s u): no tensor of w's size
    but the decayed weights; the join reads the sum of u (its value orders, nothing else)."""
    from ortlearn.graph.passes import scattered_updates

    model = _sgd_step_of_a_gathered_column(columns=columns)
    nodes = _run(scattered_updates, model)
    ops = [node.op_type for node in nodes]
    assert "ConstantOfShape" not in [n.op_type for n in needed_nodes(nodes, ["w.next"])]
    assert "Sum" not in ops
    assert ops.count("ScatterElements") == 1
    rs = np.random.RandomState(0)
    feeds = {"w": rs.randn(300, columns), "lr": np.array(0.7),
             "i": rs.randint(0, 300 * columns, 40), "u": rs.randn(40)}
    feeds["i"][:5] = 7  # repeated rows add up
    (expected,), (got,) = run_onnx(model, feeds), run_onnx(_with_nodes(model, nodes), feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-15)
    empty = {**feeds, "i": np.zeros(0, np.int64), "u": np.zeros(0)}
    np.testing.assert_allclose(run_onnx(_with_nodes(model, nodes), empty)[0],
                               run_onnx(model, empty)[0], rtol=1e-14)


def test_a_gradient_read_for_its_value_is_not_rewritten():
    from ortlearn.graph.passes import scattered_updates

    model = _sgd_step_of_a_gathered_column()
    model.graph.output.append(helper.make_tensor_value_info("g0", TensorProto.DOUBLE, []))
    assert [n.op_type for n in _run(scattered_updates, model)] == [
        n.op_type for n in model.graph.node]
