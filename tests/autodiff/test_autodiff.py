"""Gradients built by ortlearn.autodiff against central finite differences (float64)."""

import numpy as np
import pytest
from gradcheck import (
    RNG,
    analytic_gradient,
    assert_close,
    away,
    check_op,
    loss_model,
    make_model,
    node,
    numeric_gradient,
    positive,
    randn,
    random_weights_of,
    session,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ortlearn.autodiff import (
    GRADIENT_RULES,
    append_backward,
    build_gradient,
    register_gradient,
)
from ortlearn.exceptions import NoGradientRuleError

D = TensorProto.DOUBLE


# ---------------------------------------------------------------- linalg
@pytest.mark.parametrize("sa, sb", [
    ((3, 4), (4, 2)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((4,), (4, 2)),
    ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4,)), ((4,), (2, 4, 3)),
])
def test_matmul(sa, sb):
    check_op([node("MatMul", ["A", "B"])], {"A": randn(*sa), "B": randn(*sb)})


@pytest.mark.parametrize("ta, tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [(3,), (4, 1), (1,), (), (4, 3), None])
def test_gemm(ta, tb, c_shape):
    a = randn(2, 4) if ta else randn(4, 2)
    b = randn(3, 2) if tb else randn(2, 3)
    weights = {"A": a, "B": b}
    inputs = ["A", "B"]
    if c_shape is not None:
        weights["C"] = randn(*c_shape)
        inputs.append("C")
    check_op([node("Gemm", inputs, alpha=0.7, beta=1.3, transA=ta, transB=tb)], weights,
             float32=c_shape == (3,))


# ---------------------------------------------------------------- elementwise
BROADCAST_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 3, 4), (3, 1)), ((1,), (2, 3)),
                   ((), (3,)), ((3, 1), (1, 4))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("sa, sb", BROADCAST_PAIRS)
def test_binary_broadcast(op, sa, sb):
    check_op([node(op, ["A", "B"])], {"A": randn(*sa), "B": away(*sb)}, float32=sa == (3, 4))


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["Add", "Sub", "Mul", "Div"]),
       st.lists(st.integers(1, 3), min_size=0, max_size=3), st.data())
def test_binary_broadcast_drawn(op, out_shape, data):
    def operand():
        rank = data.draw(st.integers(0, len(out_shape)))
        dims = out_shape[len(out_shape) - rank:]
        return tuple(d if data.draw(st.booleans()) else 1 for d in dims)
    check_op([node(op, ["A", "B"])], {"A": randn(*operand()), "B": away(*operand())},
             float32=False)


def test_same_input_twice():
    check_op([node("Mul", ["A", "A"], "T"), node("Div", ["T", "A"])], {"A": away(3, 2)})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_square_gradient_is_the_doubled_product_bit_for_bit(dtype):
    """d(x * x) = g * (x + x): equal to g * x + g * x (doubling is exact), in 2 nodes."""
    model, feeds = loss_model([node("Mul", ["A", "A"])], {"A": randn(4, 3)}, dtype=dtype)
    grads, grad_model = analytic_gradient(model, feeds, ["A"])
    a = numpy_helper.to_array(model.graph.initializer[0])
    r = random_weights_of(model)
    np.testing.assert_array_equal(grads["A"], r * a + r * a)
    ops = [n.op_type for n in grad_model.graph.node]
    # forward: x * x and Y * R; backward: g = 1 * R, then g * (x + x) (was g * x twice + Sum)
    assert "Sum" not in ops and ops.count("Mul") == 4 and ops.count("Add") == 1


@pytest.mark.parametrize("shapes", [[(3, 4), (4,), (1, 4)], [(2, 3), (2, 3)], [(2, 1), ()]])
@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_variadic(op, shapes):
    weights = {f"X{i}": randn(*s) for i, s in enumerate(shapes)}
    # onnxruntime has no float64 Mean kernel (the gradient uses none).
    dtype = np.float32 if op == "Mean" else np.float64
    check_op([node(op, list(weights))], weights, float32=False, dtype=dtype)


@pytest.mark.parametrize("op, torch_fn", [("Max", "maximum"), ("Min", "minimum")])
def test_max_min_ties_share_the_gradient_as_torch(op, torch_fn):
    torch = pytest.importorskip("torch")
    x = randn(2, 3)
    y = np.where(randn(2, 3) > 0, x, randn(2, 3))  # ties where positive
    model, feeds = loss_model([node(op, ["A", "B"])], {"A": x, "B": y})
    grads, _ = analytic_gradient(model, feeds, ["A", "B"])
    a, b = (torch.tensor(v, requires_grad=True) for v in (x, y))
    (getattr(torch, torch_fn)(a, b) * torch.tensor(random_weights_of(model))).sum().backward()
    np.testing.assert_allclose(grads["A"], a.grad.numpy(), rtol=1e-12, atol=0)
    np.testing.assert_allclose(grads["B"], b.grad.numpy(), rtol=1e-12, atol=0)


def test_max_of_three_inputs_shares_among_the_tied_ones():
    x = randn(2, 3)
    model, feeds = loss_model([node("Max", ["A", "B", "C"])], {"A": x, "B": x.copy(),
                                                                "C": x - 1})
    grads, _ = analytic_gradient(model, feeds, ["A", "B", "C"])
    np.testing.assert_allclose(grads["A"], random_weights_of(model) / 2, rtol=1e-12)
    np.testing.assert_allclose(grads["B"], grads["A"], rtol=0)
    np.testing.assert_array_equal(grads["C"], 0)


@pytest.mark.parametrize("op, data, attrs", [
    ("Neg", randn, {}), ("Sqrt", positive, {}), ("Reciprocal", away, {}), ("Exp", randn, {}),
    ("Log", positive, {}), ("Abs", away, {}), ("Relu", away, {}),
    ("LeakyRelu", away, {"alpha": 0.1}), ("Elu", away, {"alpha": 0.7}), ("Selu", away, {}),
    ("Tanh", randn, {}), ("Sigmoid", randn, {}), ("Softplus", randn, {}),
    ("Softsign", randn, {}), ("HardSigmoid", away, {"alpha": 0.3}),
    ("Sin", randn, {}), ("Cos", randn, {}), ("Identity", randn, {}),
    ("Softmax", randn, {}), ("Softmax", randn, {"axis": 0}), ("LogSoftmax", randn, {}),
    ("LogSoftmax", randn, {"axis": 1}),
])
def test_unary(op, data, attrs):
    check_op([node(op, ["X"], **attrs)], {"X": data(2, 3, 4)}, float32=op != "Sin")


def test_erf():
    # onnxruntime has no float64 Erf kernel: compare with the closed form in float32.
    x = randn(3, 4)
    model, feeds = loss_model([node("Erf", ["X"])], {"X": x}, dtype=np.float32)
    grads, _ = analytic_gradient(model, feeds, ["X"])
    expected = 2 / np.sqrt(np.pi) * np.exp(-x ** 2) * random_weights_of(model)
    np.testing.assert_allclose(grads["X"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [13, 18])
def test_pow(opset):
    check_op([node("Pow", ["X", "E"])], {"X": positive(3, 4), "E": randn(4)}, opset=opset)
    check_op([node("Pow", ["X", "E"])], {"X": randn(3, 4)},
             consts={"E": np.array(3, dtype=np.int64)}, opset=opset)


def test_cast_float_and_int_paths():
    nodes = [node("Cast", ["X"], "XD", to=D), node("Cast", ["X"], "XI", to=TensorProto.INT64),
             node("Cast", ["XI"], "XF", to=D), node("Add", ["XD", "XF"])]
    check_op(nodes, {"X": RNG.uniform(0.1, 0.9, (3, 2)) + np.arange(6).reshape(3, 2)})


def test_non_differentiable_ops_get_zero_gradient():
    ops = ["Floor", "Ceil", "Round", "Sign"]
    nodes = [node(op, ["X"], f"Z{i}") for i, op in enumerate(ops)]
    nodes += [node("Sum", ["X"] + [f"Z{i}" for i in range(len(ops))], "S"),
              node("ArgMax", ["X"], "AM", axis=1), node("Cast", ["AM"], "AMF", to=D),
              node("Shape", ["X"], "SH"), node("Cast", ["SH"], "SHF", to=D),
              node("ReduceSum", ["SHF"], "SHS", keepdims=0), node("Greater", ["X", "S"], "GT"),
              node("Cast", ["GT"], "GTF", to=D),
              node("Sum", ["S", "AMF", "SHS", "GTF"])]
    x = RNG.uniform(0.2, 0.4, (3, 2)) + np.arange(6).reshape(3, 2)
    grads = check_op(nodes, {"X": x}, float32=False)
    assert grads  # FD agrees: every piecewise-constant path contributes nothing


@pytest.mark.parametrize("bounds", ["both", "min", "max", "none", "trainable"])
def test_clip(bounds):
    inputs = {"both": ["X", "lo", "hi"], "min": ["X", "lo"], "max": ["X", "", "hi"],
              "none": ["X"], "trainable": ["X", "lo", "hi"]}[bounds]
    consts = {"lo": np.array(-0.5), "hi": np.array(0.7)}
    weights = {"X": away(4, 5) * 0.6 + 0.1}
    if bounds == "trainable":
        weights.update(consts)
        consts = {}
    x = weights["X"]
    weights["X"] = np.where(np.abs(x - 0.7) < 0.05, 0.9, np.where(np.abs(x + 0.5) < 0.05, -0.9, x))
    check_op([node("Clip", inputs)], weights, consts=consts)


def test_where():
    cond = RNG.random((3, 1)) > 0.5
    check_op([node("Where", ["C", "A", "B"])], {"A": randn(3, 4), "B": randn(4)},
             consts={"C": cond})


# ---------------------------------------------------------------- shapes
def test_reshape_flatten_squeeze_unsqueeze_transpose():
    i64 = lambda *v: np.array(v, dtype=np.int64)
    nodes = [node("Reshape", ["X", "s"], "R1"), node("Flatten", ["R1"], "F", axis=2),
             node("Unsqueeze", ["F", "ua"], "U"), node("Squeeze", ["U", "ua"], "Q"),
             node("Transpose", ["Q"], "T1", perm=[1, 0]), node("Transpose", ["T1"])]
    check_op(nodes, {"X": randn(2, 3, 4)}, consts={"s": i64(3, 2, 2, 2), "ua": i64(0, 3)})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = {0: [(1, 3), (2, 3)], 1: [(2, 1), (2, 4)], -1: [(2, 2), (2, 3)]}[axis]
    nodes = [node("Concat", ["A", "K", "B"], axis=axis)]
    check_op(nodes, {"A": randn(*shapes[0]), "B": randn(*shapes[1])},
             consts={"K": randn(*shapes[0])})


@pytest.mark.parametrize("opset", [13, 18])
def test_split_with_unused_output(opset):
    nodes = [node("Split", ["X", "s"], ["P0", "P1", "P2"], axis=1),
             node("Mul", ["P0", "P2"])]
    check_op(nodes, {"X": randn(3, 5)}, consts={"s": np.array([2, 1, 2], dtype=np.int64)},
             opset=opset)


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1], [3], [1], [1]), ([0, 4], [2, 0], [0, 1], [1, -2]), ([-2], [100], [-1], [1]),
])
def test_slice(starts, ends, axes, steps):
    consts = {k: np.array(v, dtype=np.int64) for k, v in
              dict(st_=starts, en=ends, ax=axes, sp=steps).items()}
    check_op([node("Slice", ["X", "st_", "en", "ax", "sp"])], {"X": randn(3, 5)}, consts=consts)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("axis, indices", [(0, [[0, 2], [2, 2]]), (1, [1, -1, 1])])
def test_gather(opset, axis, indices):
    check_op([node("Gather", ["X", "I"], axis=axis)], {"X": randn(3, 4)},
             consts={"I": np.array(indices, dtype=np.int64)}, opset=opset)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("shape, indices", [
    ((5,), [[4, -1], [0, 2]]), ((5, 3), [-5, 4, 4, 0]), ((4, 2, 3), [[1, -1, 1], [0, 3, 2]])])
def test_gather_rows_scatter_from_the_indices_alone(shape, indices, dtype):
    """An axis-0 Gather (an embedding, a layer reading sparse rows): the gradient scatters
    to ``i * row + arange(row)``, computed from the indices (negative and repeated ones
    included), not gathered from a position for every element of the table."""
    nodes = [node("Gather", ["X", "I"], axis=0)]
    consts = {"I": np.array(indices, dtype=dtype)}
    check_op(nodes, {"X": randn(*shape)}, consts=consts)
    model, feeds = loss_model(nodes, {"X": randn(*shape)}, consts=consts)
    ops = [n.op_type for n in analytic_gradient(model, feeds, ["X"])[1].graph.node]
    assert "ScatterElements" in ops and "Range" not in ops


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("axis, index, shape", [
    (0, 1, (3, 4)), (1, -1, (2, 3, 4)), (2, 0, (2, 3, 2)), (0, 0, (1, 3))])
def test_gather_of_one_constant_position_is_a_pad(opset, axis, index, shape):
    """``qkv[1]`` (torch's split of a fused projection): the gradient is one Pad."""
    nodes = [node("Gather", ["X", "I"], axis=axis)]
    consts = {"I": np.array(index, dtype=np.int64)}
    check_op(nodes, {"X": randn(*shape)}, consts=consts, opset=opset)
    model, feeds = loss_model(nodes, {"X": randn(*shape)}, consts=consts, opset=opset)
    ops = [n.op_type for n in analytic_gradient(model, feeds, ["X"])[1].graph.node]
    assert "Pad" in ops and "ScatterElements" not in ops


@pytest.mark.parametrize("unknown_rank", [False, True])
@pytest.mark.parametrize("axis, index", [(1, 2), (0, 0), (0, -1), (0, 1)])
def test_gather_of_one_position_with_symbolic_lengths(axis, index, unknown_rank):
    """The gathered axis may be symbolic, the rank unknown (torch's Reshape chains)."""
    # Squeeze with axes given at run time: shape inference cannot tell the rank
    nodes = [node("Squeeze", ["X", "A"], "S"), node("Gather", ["S", "I"], axis=axis)]
    consts = {"I": np.array(index, dtype=np.int64)}
    for rows in (2, 4):
        inputs = {"X": randn(rows, 1, 3, 2), "A": np.array([1], dtype=np.int64)}
        dims = {"X": ["N", 1, 3, 2]}
        if not unknown_rank:
            nodes[0] = node("Squeeze", ["X", "A1"], "S")
            consts["A1"] = np.array([1], dtype=np.int64)
        model, feeds = loss_model(nodes, {}, consts=consts, inputs=inputs, input_dims=dims)
        grads, grad_model = analytic_gradient(model, feeds, ["X"])
        expected = np.zeros((rows, 3, 2))
        np.moveaxis(expected, axis, 0)[index] = random_weights_of(model)
        np.testing.assert_array_equal(grads["X"], expected[:, None])
        assert "ScatterElements" not in {n.op_type for n in grad_model.graph.node}


def test_gather_elements():
    idx = np.array([[0, 2, 2], [1, 1, 0]], dtype=np.int64)
    check_op([node("GatherElements", ["X", "I"], axis=1)], {"X": randn(2, 4)}, consts={"I": idx})


def test_expand_and_tile():
    i64 = lambda *v: np.array(v, dtype=np.int64)
    check_op([node("Expand", ["X", "s"])], {"X": randn(3, 1)}, consts={"s": i64(2, 3, 4)})
    check_op([node("Tile", ["X", "r"])], {"X": randn(2, 3)}, consts={"r": i64(3, 2)})


def test_dropout_inference_is_identity():
    check_op([node("Dropout", ["X", "r"])], {"X": randn(3, 4)}, consts={"r": np.array(0.3)})
    check_op([node("Dropout", ["X", "r", "t"], ["Y", "M"])], {"X": randn(3, 4)},
             consts={"r": np.array(0.3), "t": np.array(False)})


@pytest.mark.parametrize("with_mask", [True, False])
def test_dropout_training_uses_the_mask(with_mask):
    outs = ["Y", "M"] if with_mask else ["Y"]
    nodes = [node("Dropout", ["X", "r", "t"], outs, seed=3)]
    model, feeds = loss_model(nodes, {"X": positive(40, 5)},
                              consts={"r": np.array(0.25), "t": np.array(True)})
    r = random_weights_of(model)
    grads, _ = analytic_gradient(model, feeds, ["X"])
    gx = grads["X"]
    # loss = sum(X * mask / (1 - p) * R), gradient = mask / (1 - p) * R
    ratio = gx / r
    assert set(np.round(np.unique(ratio), 10)) <= {0.0, round(1 / 0.75, 10)}
    assert 0 < np.count_nonzero(ratio) < ratio.size


# ---------------------------------------------------------------- reductions
REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2",
              "ReduceLogSumExp", "ReduceMax", "ReduceMin"]


def reduce_node(op, axes, keepdims, opset, noop=None):
    extra = {} if noop is None else {"noop_with_empty_axes": noop}
    if axes is None:
        return node(op, ["X"], keepdims=keepdims, **extra), {}
    if op == "ReduceSum" or opset >= 18:
        return (node(op, ["X", "ax"], keepdims=keepdims, **extra),
                {"ax": np.array(axes, dtype=np.int64)})
    return node(op, ["X"], axes=axes, keepdims=keepdims), {}


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reductions(op, opset):
    x = away(2, 3, 4) if op == "ReduceL1" else randn(2, 3, 4)
    for axes, keepdims in [([1], 0), ([1], 1), ([-1, 0], 0), (None, 0), (None, 1)]:
        n, consts = reduce_node(op, axes, keepdims, opset)
        check_op([n], {"X": x}, consts=consts, opset=opset, float32=axes == [1])


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduction_noop_with_empty_axes(op):
    n, _ = reduce_node(op, None, 0, 18, noop=1)
    check_op([n], {"X": away(2, 3)})


def test_reduction_with_axes_computed_at_run_time():
    nodes = [node("Shape", ["K"], "ks"), node("Slice", ["ks", "z", "o"], "ax"),
             node("ReduceMean", ["X", "ax"], keepdims=0)]
    consts = {"K": np.zeros((2, 1)), "z": np.array([0], np.int64), "o": np.array([1], np.int64)}
    check_op(nodes, {"X": randn(3, 4, 2)}, consts=consts)


# ---------------------------------------------------------------- losses
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 1])
@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 2)])
def test_classification_losses(reduction, weighted, ignore, shape):
    labels = RNG.integers(0, shape[1], (shape[0],) + shape[2:]).astype(np.int64)
    consts = {"L": labels}
    inputs = ["S", "L"]
    if weighted:
        consts["W"] = positive(shape[1])
        inputs.append("W")
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    check_op([node("SoftmaxCrossEntropyLoss", inputs, **attrs)], {"S": randn(*shape)},
             consts=consts, float32=False)
    check_op([node("NegativeLogLikelihoodLoss", inputs, **attrs)], {"S": randn(*shape)},
             consts=consts, float32=False)


def test_softmax_cross_entropy_log_prob_output():
    nodes = [node("SoftmaxCrossEntropyLoss", ["S", "L"], ["CE", "LP"]), node("Add", ["LP", "CE"])]
    check_op(nodes, {"S": randn(5, 4)}, consts={"L": np.array([0, 3, 1, 1, 2], np.int64)})


# ---------------------------------------------------------------- the pass itself
def test_dynamic_batch_dimension():
    nodes = [node("Mul", ["X", "W"], "H"), node("Add", ["H", "B"], "Y"),
             node("ReduceSumSquare", ["Y"], "loss", keepdims=0)]
    w, b = randn(1, 3), randn(3)
    model = make_model(nodes, [helper.make_tensor_value_info("X", D, ["N", 3])],
                   [helper.make_tensor_value_info("loss", D, [])],
                   [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    grad_model = build_gradient(model, wrt=["W", "B"])
    sess = session(grad_model)
    for n in (1, 7):
        x = randn(n, 3)
        loss, gw, gb = sess.run(None, {"X": x})
        y = x * w + b
        np.testing.assert_allclose(loss, (y ** 2).sum())
        np.testing.assert_allclose(gw, (2 * y * x).sum(axis=0, keepdims=True))
        np.testing.assert_allclose(gb, (2 * y).sum(axis=0))


def test_broadcast_decided_at_run_time():
    # Both operands have symbolic dims: which one broadcasts is known only at run time.
    nodes = [node("Mul", ["A", "B"])]
    dims = {"A": ["N", 3], "B": ["M", 3]}
    for na, nb in [(1, 4), (4, 1), (4, 4)]:
        model, feeds = loss_model(nodes, {}, inputs={"A": randn(na, 3), "B": randn(nb, 3)},
                                  input_dims=dims)
        grads, grad_model = analytic_gradient(model, feeds, ["A", "B"])
        assert "NonZero" in {n.op_type for n in grad_model.graph.node}
        ref = numeric_gradient(model, feeds, ["A", "B"])
        for name in "AB":
            assert_close(grads[name], ref[name])


class Square(OpRun):
    """my.ops.Square, ``y = x * x``, for onnx's reference evaluator (no rule differentiates it)."""

    op_domain = "my.ops"

    def _run(self, x):
        return (x * x,)


def _square_model(nodes, weights, consts=()):
    """``loss = ReduceSum(Y * R)`` in float64 around nodes that may use my.ops.Square."""
    inits = [numpy_helper.from_array(v, k) for k, v in {**weights, **dict(consts)}.items()]
    r = RNG.standard_normal(3)
    nodes = list(nodes) + [node("Mul", ["Y", "R"], "YR"),
                           node("ReduceSum", ["YR"], "loss", keepdims=0)]
    inits.append(numpy_helper.from_array(r, "R"))
    graph = helper.make_graph(
        nodes, "g", [], [helper.make_tensor_value_info("loss", D, [])], inits,
        value_info=[helper.make_tensor_value_info("T", D, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("my.ops", 1)],
                              ir_version=10)
    return model, r


def _gradient_with_square(model, wrt):
    """The gradient of ``loss`` w.r.t. ``wrt`` by build_gradient, run by onnx's reference
    evaluator (a custom domain: finalize_model sets the IR version ai.onnx needs)."""
    grad_model = build_gradient(model, wrt=[wrt])
    assert grad_model.ir_version == 8  # ai.onnx 18's, whatever the model said
    return ReferenceEvaluator(grad_model, new_ops=[Square]).run([f"{wrt}_grad"], {})[0]


def test_missing_rule_names_operator_and_node():
    x, k = randn(3), randn(3)
    nodes = [helper.make_node("Square", ["X"], ["T"], name="my_square", domain="my.ops"),
             helper.make_node("Mul", ["T", "X"], ["Y"], name="m")]
    model, _ = _square_model(nodes, {"X": x})
    with pytest.raises(NoGradientRuleError, match="'my.ops.Square'.*'my_square'"):
        build_gradient(model, wrt=["X"])
    # An operator on a path that does not depend on the weights needs no rule.
    nodes[0].input[0] = "K"
    model, r = _square_model(nodes, {"X": x}, {"K": k})
    np.testing.assert_allclose(_gradient_with_square(model, "X"), r * k * k, rtol=1e-12)


def test_register_gradient():
    @register_gradient("Square", domain="my.ops")
    def square_grad(ctx, node, grads):
        x = node.input[0]
        return [ctx.b.op("Mul", [grads[0], ctx.b.op("Add", [x, x])])]
    try:
        x = randn(3)
        nodes = [helper.make_node("Square", ["X"], ["T"], domain="my.ops"), node("Mul", ["T", "X"])]
        model, r = _square_model(nodes, {"X": x})
        np.testing.assert_allclose(_gradient_with_square(model, "X"), 3 * r * x * x,
                                   rtol=1e-12)
    finally:
        del GRADIENT_RULES["my.ops", "Square"]
    with pytest.raises(NoGradientRuleError, match="my.ops.Square"):
        build_gradient(model, wrt=["X"])


def test_unused_weight_gets_zero_gradient():
    nodes = [node("Mul", ["A", "A"])]
    model, feeds = loss_model(nodes, {"A": randn(2, 3), "U": randn(4, 1)})
    grads, _ = analytic_gradient(model, feeds, ["U", "A"])
    np.testing.assert_array_equal(grads["U"], np.zeros((4, 1)))


def _chain(n_layers, dim=4):
    nodes, inits, h = [], [], "X"
    for i in range(n_layers):
        nodes += [node("MatMul", [h, f"W{i}"], f"M{i}"), node("Tanh", [f"M{i}"], f"H{i}")]
        inits.append(numpy_helper.from_array(randn(dim, dim), f"W{i}"))
        h = f"H{i}"
    nodes.append(node("ReduceSumSquare", [h], "loss", keepdims=0))
    return make_model(nodes, [helper.make_tensor_value_info("X", D, ["N", dim])],
                  [helper.make_tensor_value_info("loss", D, [])], inits)


def test_gradient_graph_is_proportional():
    n = 12
    model = _chain(n)
    forward = len(model.graph.node)
    last = len(build_gradient(model, wrt=[f"W{n - 1}"]).graph.node) - forward
    every = len(build_gradient(model, wrt=[f"W{i}" for i in range(n)]).graph.node) - forward
    assert last <= 10
    assert every <= 9 * n + 5
    assert last * 5 < every


def test_default_wrt_and_output_order():
    model = _chain(2)
    grad_model = build_gradient(model.SerializeToString())
    assert [o.name for o in grad_model.graph.output] == ["loss", "W0_grad", "W1_grad"]
    assert [i.name for i in grad_model.graph.initializer] == ["W0", "W1"]
    assert [i.name for i in grad_model.graph.input] == ["X"]


def test_append_backward_in_place():
    model = _chain(2)
    reference = build_gradient(model, wrt=["W1", "W0"])
    n_before = len(model.graph.node)
    grads = append_backward(model, "loss", ["W1", "W0"])
    assert list(grads) == ["W1", "W0"]
    assert len(model.graph.node) > n_before
    assert [o.name for o in model.graph.output] == ["loss"]  # outputs left to the caller
    model.graph.output.extend([helper.make_tensor_value_info(g, D, None) for g in grads.values()])
    x = randn(5, 4)
    got = session(model).run(None, {"X": x})
    expected = session(reference).run(None, {"X": x})
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("opset", [13, 15, 18, 20, 22])
def test_opsets(opset):
    model = _chain(3)
    model.opset_import[0].version = opset
    feeds = {"X": randn(3, 4)}
    grads, _ = analytic_gradient(model, feeds, ["W0", "W2"])
    ref = numeric_gradient(model, feeds, ["W0", "W2"])
    for name in grads:
        assert_close(grads[name], ref[name])


@pytest.mark.parametrize("wrt, loss, error", [
    (["nope"], "loss", ValueError), (["W0"], "nope", ValueError),
])
def test_bad_names(wrt, loss, error):
    with pytest.raises(error, match="nope"):
        build_gradient(_chain(1), wrt=wrt, loss_output=loss)


def test_non_scalar_loss_is_refused():
    model = make_model([node("Mul", ["X", "W"], "loss")],
                   [helper.make_tensor_value_info("X", D, [3])],
                   [helper.make_tensor_value_info("loss", D, [3])],
                   [numpy_helper.from_array(randn(3), "W")])
    with pytest.raises(ValueError, match="scalar"):
        build_gradient(model, wrt=["W"])
