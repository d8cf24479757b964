"""onnxcustom's ``onnx_derivative``: gradient graphs against float64 finite differences."""

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import InferenceSession

from ortlearn.compat.onnxcustom.training.grad_helper import DerivativeOptions, onnx_derivative
from ortlearn.graph import initializers_to_inputs, load_model

D = TensorProto.DOUBLE


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, D, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, D, s) for n, s in outputs],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def graph_add():
    rng = np.random.RandomState(0)
    return _model([helper.make_node("Add", ["X", "A"], ["Y"])], [("X", [None, 4])],
                  [("Y", [None, 4])], {"A": rng.randn(4)})


def graph_square():
    return _model([helper.make_node("Identity", ["X"], ["xi"]),
                   helper.make_node("Mul", ["xi", "xi"], ["Y"])],
                  [("X", [None, 4])], [("Y", [None, 4])], {})


def graph_mlp():
    rng = np.random.RandomState(1)
    nodes = [helper.make_node("MatMul", ["X", "W1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["z"]),
             helper.make_node("Tanh", ["z"], ["a"]),
             helper.make_node("MatMul", ["a", "W2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["Y"]),
             helper.make_node("Sigmoid", ["Y"], ["P"])]
    return _model(nodes, [("X", [None, 4])], [("Y", [None, 2]), ("P", [None, 2])],
                  {"W1": rng.randn(4, 3), "b1": rng.randn(3), "W2": rng.randn(3, 2),
                   "b2": rng.randn(2)})


def _session(model):
    return InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def finite_differences(model, weights, X, cotangents, eps=1e-6):
    """Gradient of sum_o <C_o, Y_o> w.r.t. X and the weights, by central differences."""
    forward = load_model(model)
    values = initializers_to_inputs(forward, weights)
    sess = _session(forward)
    outputs = [o.name for o in model.graph.output]

    def f(feeds):
        return sum((c * y).sum() for c, y in zip(cotangents, sess.run(outputs, feeds)))

    feeds = {"X": X, **values}
    grads = {}
    for name, value in feeds.items():
        g = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            plus, minus = dict(feeds), dict(feeds)
            plus[name], minus[name] = value.copy(), value.copy()
            plus[name][idx] += eps
            minus[name][idx] -= eps
            g[idx] = (f(plus) - f(minus)) / (2 * eps)
        grads[name] = g
    return grads, values, sess.run(outputs, feeds)


CASES = list(itertools.product(
    [graph_add, graph_square, graph_mlp],
    [DerivativeOptions.Zero, DerivativeOptions.KeepOutputs,
     DerivativeOptions.KeepOutputs | DerivativeOptions.FillGrad],
    [None, []],   # weights
    [None, []]))  # inputs


@pytest.mark.parametrize(("make", "options", "weights", "inputs"), CASES)
def test_gradients_against_finite_differences(make, options, weights, inputs):
    model = make()
    all_weights = [i.name for i in model.graph.initializer]
    wrt_weights = all_weights if weights is None else weights
    wrt_inputs = ["X"] if inputs is None else inputs
    if not wrt_weights and not wrt_inputs:
        with pytest.raises(ValueError, match="Nothing to differentiate"):
            onnx_derivative(model, weights=weights, inputs=inputs, options=options)
        return
    grad = onnx_derivative(model, weights=weights, inputs=inputs, options=options)
    outputs = [o.name for o in model.graph.output]
    fill = bool(options & DerivativeOptions.FillGrad)
    rng = np.random.RandomState(2)
    X = rng.randn(5, 4)
    shapes = {"Y": (5, 4) if make is not graph_mlp else (5, 2), "P": (5, 2)}
    cotangents = [np.ones(shapes[o]) if fill else rng.randn(*shapes[o]) for o in outputs]
    expected, values, forward = finite_differences(model, all_weights, X, cotangents)

    input_names = [i.name for i in grad.graph.input]
    output_names = [o.name for o in grad.graph.output]
    assert input_names == ["X", *wrt_weights] + ([] if fill else [f"{o}_grad" for o in outputs])
    grad_names = [f"{n}_grad" for n in wrt_inputs + wrt_weights]
    kept = outputs if options & DerivativeOptions.KeepOutputs else []
    assert output_names == grad_names + kept

    feeds = {"X": X, **{w: values[w] for w in wrt_weights}}
    if not fill:
        feeds.update({f"{o}_grad": c for o, c in zip(outputs, cotangents)})
    if weights == []:
        # Weights that are not differentiated stay initializers of the gradient graph.
        assert {i.name for i in grad.graph.initializer} >= set(all_weights)
    got = dict(zip(output_names, _session(grad).run(None, feeds)))
    for name in wrt_inputs + wrt_weights:
        np.testing.assert_allclose(got[f"{name}_grad"], expected[name], rtol=1e-6, atol=1e-7)
    for name, value in zip(outputs, forward):
        if name in got:
            np.testing.assert_allclose(got[name], value, rtol=1e-12)


def test_options_errors():
    model = graph_add()
    with pytest.raises(TypeError, match="DerivativeOptions"):
        onnx_derivative(model, weights=[], options=1)
    with pytest.raises(ValueError, match="FillGrad"):
        onnx_derivative(model, weights=[], options=DerivativeOptions.FillGrad)
    with pytest.raises(ValueError, match="cannot be combined"):
        onnx_derivative(model, options=DerivativeOptions.KeepYieldOp
                        | DerivativeOptions.KeepOutputs)
    with pytest.raises(ValueError, match="path_name"):
        onnx_derivative(model, options=DerivativeOptions.Loss, loss="loss", label="label")
    with pytest.raises(ValueError, match="label"):
        onnx_derivative(model, options=DerivativeOptions.Loss, loss="loss", path_name="x.onnx")


def test_keep_yield_op_builds_onnxruntime_trainings_form():
    """The outputs go into a YieldOp (com.microsoft) whose outputs are their gradients, as in
    onnxruntime-training's graph (onnxcustom's test looks for that node); the rest is the
    gradient graph of DerivativeOptions.Zero."""
    model = graph_add()
    grad = onnx_derivative(model, options=DerivativeOptions.KeepYieldOp)
    (yield_op,) = [n for n in grad.graph.node if n.op_type == "YieldOp"]
    outputs = [o.name for o in model.graph.output]
    assert yield_op.domain == "com.microsoft" and list(yield_op.input) == outputs
    assert list(yield_op.output) == [f"{o}_grad" for o in outputs]
    assert ("com.microsoft", 1) in {(o.domain, o.version) for o in grad.opset_import}
    zero = onnx_derivative(model, options=DerivativeOptions.Zero)
    assert [i.name for i in grad.graph.input] == [
        i.name for i in zero.graph.input if i.name not in yield_op.output]
    assert [o.name for o in grad.graph.output] == [o.name for o in zero.graph.output]


def test_loss_graph_gradient_against_finite_differences(tmp_path):
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    from ortlearn.compat.onnxcustom.utils.orttraining_helper import add_loss_output

    rng = np.random.RandomState(3)
    X = rng.randn(20, 3)
    y = X @ [1.0, -2.0, 0.5] + 0.3
    onx = to_onnx(LinearRegression().fit(X, y), X, black_op={"LinearRegressor"})
    onx_loss = add_loss_output(onx)
    path = tmp_path / "grad.onnx"
    grad = onnx_derivative(onx_loss, options=DerivativeOptions.Loss, label="label",
                           loss="loss", path_name=str(path))
    assert path.exists() and onnx.load(str(path)).graph.output[-1].name == "X_grad"
    names = [o.name for o in grad.graph.output]
    assert names[-2:] == ["loss", "X_grad"]
    label = (y + rng.randn(20) * 0.1).reshape(-1, 1)
    sess, base = _session(grad), _session(onx_loss)
    got = dict(zip(names, sess.run(None, {"X": X, "label": label})))

    def loss(Xv):
        return base.run(["loss"], {"X": Xv, "label": label})[0].ravel()[0]

    expected = np.zeros_like(X)
    for idx in np.ndindex(X.shape):
        plus, minus = X.copy(), X.copy()
        plus[idx] += 1e-6
        minus[idx] -= 1e-6
        expected[idx] = (loss(plus) - loss(minus)) / 2e-6
    np.testing.assert_allclose(got["X_grad"], expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got["loss"].ravel()[0], loss(X), rtol=1e-12)
