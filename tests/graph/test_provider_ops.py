"""The rewrites of ``ortlearn.graph.provider_ops``, each alone: the operators and types
some GPU providers lack, written with ones they have, to the same values."""

import numpy as np
import pytest
from conftest import run_onnx
from onnx import TensorProto, helper, numpy_helper
from test_passes import _float_graph, _run, _with_nodes

from ortlearn.graph.provider_ops import (
    constants_of_shape_as_expands,
    gelus_decomposed,
    index_wraps_as_wheres,
    log_softmax_decomposed,
    nan_tests_as_comparisons,
    ors_as_ands,
    signs_as_comparisons,
    sizes_as_shape_products,
    sums_as_adds,
    trailing_unsqueezes_as_reshapes,
)


@pytest.mark.parametrize("terms", [1, 2, 4])
def test_a_sum_becomes_adds_in_the_order_of_its_inputs(terms):
    names = [f"x{i}" for i in range(terms)]
    model = _float_graph([helper.make_node("Sum", names, ["total"])],
                         dict.fromkeys(names, [5]), {"total": [5]})
    rewritten = _run(sums_as_adds, model)
    assert [n.op_type for n in rewritten] == ["Identity"] if terms == 1 else ["Add"] * (terms - 1)
    rs = np.random.RandomState(terms)
    feeds = {n: rs.randn(5) * 10.0 ** rs.randint(-8, 8) for n in names}
    expected = feeds["x0"].copy()
    for n in names[1:]:
        expected = expected + feeds[n]
    np.testing.assert_array_equal(run_onnx(_with_nodes(model, rewritten), feeds)[0], expected)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("axis", [-1, 0])
def test_log_softmax_is_written_with_the_operators_gpus_have(opset, axis):
    model = _float_graph([helper.make_node("LogSoftmax", ["x"], ["out"], axis=axis)],
                         {"x": [4, 6]}, {"out": [4, 6]}, opset)
    rewritten = _run(log_softmax_decomposed, model)
    assert "LogSoftmax" not in {n.op_type for n in rewritten}
    x = np.random.RandomState(0).randn(4, 6) * 30  # large logits: the shift matters
    got = run_onnx(_with_nodes(model, rewritten), {"x": x})[0]
    np.testing.assert_allclose(got, run_onnx(model, {"x": x})[0], rtol=1e-14, atol=1e-12)
    shifted = x - x.max(axis=axis, keepdims=True)
    np.testing.assert_allclose(got, shifted - np.log(np.exp(shifted).sum(axis=axis,
                                                                          keepdims=True)),
                               rtol=1e-14, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_the_wrap_of_gather_indices_is_written_without_mod(dtype):
    """Indices of a GatherElements along an axis of 5 lie in [-5, 5): their Mod 5 becomes a
    Where; a Mod by another number is no such wrap and stays."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    five, three = (numpy_helper.from_array(np.array(v, dtype), n) for v, n in ((5, "five"),
                                                                            (3, "three")))
    nodes = [helper.make_node("GatherElements", ["x", "i"], ["picked"], axis=1),
             helper.make_node("Mod", ["i", "five"], ["wrapped"]),
             helper.make_node("Mod", ["i", "three"], ["other"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [6, 5]),
                     helper.make_tensor_value_info("i", elem, [6, 1])],
        [helper.make_tensor_value_info("picked", TensorProto.DOUBLE, [6, 1]),
         helper.make_tensor_value_info("wrapped", elem, [6, 1]),
         helper.make_tensor_value_info("other", elem, [6, 1])], [five, three])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    rewritten = _run(index_wraps_as_wheres, model)
    assert [n.op_type for n in rewritten].count("Mod") == 1
    assert {"Where", "Less", "Add"} <= {n.op_type for n in rewritten}
    feeds = {"x": np.random.RandomState(0).randn(6, 5),
             "i": np.array([[-5], [-3], [-1], [0], [2], [4]], dtype)}
    got = run_onnx(_with_nodes(model, rewritten), feeds)
    for ours, theirs in zip(got, run_onnx(model, feeds)):
        np.testing.assert_array_equal(ours, theirs)
    assert got[1].ravel().tolist() == [0, 2, 4, 0, 2, 4]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sign_becomes_two_comparisons(dtype):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph([helper.make_node("Sign", ["x"], ["s"])], "g",
                              [helper.make_tensor_value_info("x", elem, [7])],
                              [helper.make_tensor_value_info("s", elem, [7])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rewritten = _run(signs_as_comparisons, model)
    assert "Sign" not in {n.op_type for n in rewritten}
    x = np.array([-3.5, -0.0, 0.0, 1e-30, -1e-30, np.inf, -np.inf], dtype)
    got = run_onnx(_with_nodes(model, rewritten), {"x": x})[0]
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.sign(x))
    # NaN's sign becomes 0, the one difference the docstring names
    assert run_onnx(_with_nodes(model, rewritten), {"x": np.full(7, np.nan, dtype)})[0].tolist() \
        == [0.0] * 7


def test_an_integer_sign_is_kept():
    graph = helper.make_graph([helper.make_node("Sign", ["x"], ["s"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("s", TensorProto.INT64, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert [n.op_type for n in _run(signs_as_comparisons, model)] == ["Sign"]


def test_a_nan_test_becomes_an_inequality_to_itself():
    model = _float_graph([helper.make_node("IsNaN", ["x"], ["nan"])], {"x": [5]}, {})
    model.graph.output.append(helper.make_tensor_value_info("nan", TensorProto.BOOL, [5]))
    rewritten = _run(nan_tests_as_comparisons, model)
    assert [n.op_type for n in rewritten] == ["Equal", "Not"]
    x = np.array([np.nan, 0.0, -np.inf, np.inf, 1.5])
    got = run_onnx(_with_nodes(model, rewritten), {"x": x})[0]
    np.testing.assert_array_equal(got, np.isnan(x))


def test_an_or_becomes_ands_and_nots():
    bool_ = TensorProto.BOOL
    graph = helper.make_graph([helper.make_node("Or", ["a", "b"], ["either"])], "g",
                              [helper.make_tensor_value_info(n, bool_, [4]) for n in "ab"],
                              [helper.make_tensor_value_info("either", bool_, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rewritten = _run(ors_as_ands, model)
    assert sorted(n.op_type for n in rewritten) == ["And", "Not", "Not", "Not"]
    a, b = np.array([False, False, True, True]), np.array([False, True, False, True])
    got = run_onnx(_with_nodes(model, rewritten), {"a": a, "b": b})[0]
    np.testing.assert_array_equal(got, a | b)


@pytest.mark.parametrize("axes, rank, kept", [([1], 1, False), ([-1], 1, False),
                                              ([2, 3], 2, False), ([0], 1, True),
                                              ([1], 2, True)])
def test_trailing_unsqueezes_of_integers_become_reshapes(axes, rank, kept):
    """Axes appended after the known ones: a Reshape of the same values; an axis before
    one of them is kept (a Reshape's 0 copies the dimension at the same place)."""
    shape = [4, 3][:rank]
    out_rank = rank + len(axes)
    out_shape = list(shape)
    for a in sorted(a % out_rank for a in axes):
        out_shape.insert(a, 1)
    axes_init = numpy_helper.from_array(np.array(axes, np.int64), "axes")
    graph = helper.make_graph([helper.make_node("Unsqueeze", ["y", "axes"], ["u"])], "g",
                              [helper.make_tensor_value_info("y", TensorProto.INT64, shape)],
                              [helper.make_tensor_value_info("u", TensorProto.INT64,
                                                             out_shape)], [axes_init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rewritten = _run(trailing_unsqueezes_as_reshapes, model)
    assert ("Unsqueeze" in {n.op_type for n in rewritten}) == kept
    y = np.arange(np.prod(shape), dtype=np.int64).reshape(shape)
    got = run_onnx(_with_nodes(model, rewritten), {"y": y})[0]
    np.testing.assert_array_equal(got, y.reshape(out_shape))


def test_a_float_unsqueeze_is_kept():
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    model = _float_graph([helper.make_node("Unsqueeze", ["x", "axes"], ["u"])], {"x": [4]},
                         {"u": [4, 1]}, initializers=[axes])
    assert [n.op_type for n in _run(trailing_unsqueezes_as_reshapes, model)] == ["Unsqueeze"]


def test_a_size_becomes_the_product_of_the_shape():
    model = _float_graph([helper.make_node("Size", ["x"], ["n"])], {"x": [None, 7]}, {})
    model.graph.output.append(helper.make_tensor_value_info("n", TensorProto.INT64, []))
    rewritten = _run(sizes_as_shape_products, model)
    assert "Size" not in {n.op_type for n in rewritten}
    for rows in (0, 1, 33):
        got = run_onnx(_with_nodes(model, rewritten), {"x": np.zeros((rows, 7))})[0]
        assert got.dtype == np.int64 and got.shape == () and int(got) == rows * 7


@pytest.mark.parametrize("value", [None, np.array([2.5], np.float32), np.array([7], np.int64)])
def test_a_constant_of_shape_becomes_an_expanded_scalar(value):
    from ortlearn.training import cpu_fallbacks

    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    elem = TensorProto.FLOAT if value is None or value.dtype == np.float32 else TensorProto.INT64
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["filled"], **attrs)], "g",
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("filled", elem, ["a", "b", "c"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    rewritten = _with_nodes(model, _run(constants_of_shape_as_expands, model))
    assert "ConstantOfShape" not in {n.op_type for n in rewritten.graph.node}
    assert cpu_fallbacks(model) and not cpu_fallbacks(rewritten)
    for shape in ([2, 3, 4], [1, 0, 5]):
        feeds = {"shape": np.array(shape, np.int64)}
        got, expected = run_onnx(rewritten, feeds)[0], run_onnx(model, feeds)[0]
        assert got.dtype == expected.dtype and got.shape == tuple(shape)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_is_written_with_the_operators_gpus_have(approximate):
    from scipy.special import erf

    from ortlearn.training import cpu_fallbacks

    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)], "g",
        [helper.make_tensor_value_info("x", f, [3, 50])],
        [helper.make_tensor_value_info("y", f, [3, 50])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    rewritten = _with_nodes(model, _run(gelus_decomposed, model))
    assert "Gelu" not in {n.op_type for n in rewritten.graph.node}
    assert cpu_fallbacks(model) and not cpu_fallbacks(rewritten)
    x = (np.random.RandomState(0).randn(3, 50) * 4).astype(np.float32)
    got = run_onnx(rewritten, {"x": x})[0]
    # onnxruntime's own Gelu, and the definition in float64, to float32 rounding
    np.testing.assert_allclose(got, run_onnx(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    x64 = x.astype(np.float64)
    if approximate == "none":
        expected = 0.5 * x64 * (1 + erf(x64 / np.sqrt(2)))
    else:
        expected = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
