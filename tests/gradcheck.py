"""Gradient checking shared by the rule tests: finite differences in float64.

``check_op`` builds ``loss = ReduceSum(Y * R)`` around the nodes under test
(R fixed and random, so every output element counts), differentiates it with
:func:`ortlearn.autodiff.build_gradient` and compares with central finite
differences. Float64 runs in onnxruntime, or, for operators onnxruntime's CPU
provider has no float64 kernel for (Conv, LSTM, Gelu, Erf, ...), in onnx's
reference evaluator (``reference=True``, with the float64 stand-ins of
``reference_ops`` where onnx's are wrong or partial); float32 always runs in onnxruntime,
against the float64 gradient.
"""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from reference_ops import Float64Reference

from ortlearn.autodiff import build_gradient
from ortlearn.graph import check_model, finalize_model, np_dtype_to_onnx, value_info_map


class _Reference:
    """onnx's ReferenceEvaluator behind InferenceSession's ``run``.

    Always with the float64 stand-ins of :mod:`reference_ops` (Erf,
    ConvTranspose, LSTM/GRU/RNN), where onnx's own are wrong or partial.
    """

    def __init__(self, model):
        self._ev = Float64Reference(model)

    def run(self, names, feeds):
        return self._ev.run(names, feeds)


def session(model, reference=False):
    """An onnxruntime CPU session, or onnx's reference evaluator."""
    if reference:
        return _Reference(model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def make_model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return finalize_model(model, check=False)


def const_node(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def cast_floats(values, dtype):
    return {k: (v.astype(dtype) if v.dtype.kind == "f" else v) for k, v in values.items()}


def loss_model(nodes, weights, consts=None, inputs=None, dtype=np.float64, opset=18,
               out="Y", input_dims=None, seed=1, reference=False):
    """``loss = ReduceSum(out * R)`` for a fixed random R: every output element counts.

    ``weights`` become initializers, ``consts`` Constant nodes, ``inputs`` graph
    inputs (declared with ``input_dims`` when given). Returns (model, feeds).
    """
    weights = cast_floats(weights, dtype)
    consts = cast_floats(consts or {}, dtype)
    feeds = cast_floats(inputs or {}, dtype)
    input_dims = input_dims or {}
    const_nodes = [const_node(k, v) for k, v in consts.items()]
    graph_inputs = [helper.make_tensor_value_info(k, np_dtype_to_onnx(v.dtype),
                                                  input_dims.get(k, v.shape))
                    for k, v in feeds.items()]
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    fwd = make_model(const_nodes + list(nodes), graph_inputs,
                     [helper.make_empty_tensor_value_info(out)], inits, opset)
    info = value_info_map(fwd)[out]
    y_type = info.type.tensor_type.elem_type
    del fwd.graph.output[:]
    fwd.graph.output.append(helper.make_tensor_value_info(out, y_type, None))
    y = session(fwd, reference).run(None, feeds)[0]
    r = np.random.default_rng(seed).standard_normal(y.shape).astype(y.dtype)
    tail = [const_node("R", r), helper.make_node("Mul", [out, "R"], ["YR"]),
            helper.make_node("ReduceSum", ["YR"], ["loss"], keepdims=0)]
    model = make_model(const_nodes + list(nodes) + tail, graph_inputs,
                       [helper.make_tensor_value_info("loss", y_type, [])], inits, opset)
    check_model(model)
    return model, feeds


def random_weights_of(model):
    """The R of ``loss = ReduceSum(Y * R)``, i.e. the gradient of the loss w.r.t. Y."""
    return numpy_helper.to_array(
        next(n for n in model.graph.node if n.output[0] == "R").attribute[0].t)


def numeric_gradient(model, feeds, wrt, eps=1e-6, reference=False):
    """Central finite differences of ``loss``; one session, weights fed as inputs."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    values = dict(feeds)
    for init in model.graph.initializer:
        values[init.name] = numpy_helper.to_array(init).copy()
        model.graph.input.append(helper.make_tensor_value_info(
            init.name, init.data_type, list(init.dims)))
    del model.graph.initializer[:]
    sess = session(model, reference)
    grads = {}
    for name in wrt:
        w = values[name]
        g = np.zeros(w.shape)
        for idx in np.ndindex(w.shape):
            old = w[idx]
            w[idx] = old + eps
            up = sess.run(["loss"], values)[0]
            w[idx] = old - eps
            down = sess.run(["loss"], values)[0]
            w[idx] = old
            g[idx] = (up - down) / (2 * eps)
        grads[name] = g
    return grads


def analytic_gradient(model, feeds, wrt, reference=False):
    grad_model = build_gradient(model, wrt=wrt)
    check_model(grad_model, full_check=True)
    assert [o.name for o in grad_model.graph.output] == ["loss"] + [f"{w}_grad" for w in wrt]
    res = session(grad_model, reference).run(None, feeds)
    for name, grad in zip(wrt, res[1:]):
        ref = feeds[name] if name in feeds else numpy_helper.to_array(
            next(i for i in model.graph.initializer if i.name == name))
        assert grad.shape == ref.shape and grad.dtype == ref.dtype, name
    return dict(zip(wrt, res[1:])), grad_model


def assert_close(grad, ref, rtol=1e-6):
    scale = max(1.0, float(np.max(np.abs(ref), initial=0)))
    np.testing.assert_allclose(grad, ref, rtol=rtol, atol=rtol * 0.1 * scale)


def check_op(nodes, weights, consts=None, inputs=None, opset=18, wrt=None, float32=True,
             dtype=np.float64, reference=False):
    """Gradients of ``nodes`` vs finite differences in float64, and in float32 vs float64.

    ``reference=True`` runs the float64 graphs in onnx's reference evaluator,
    for operators onnxruntime has no float64 kernel for; the float32 check
    still runs in onnxruntime. ``dtype=np.float32`` checks in float32 only
    (finite differences then use a large step: keep those graphs linear).
    """
    wrt = list(weights) if wrt is None else wrt
    model, feeds = loss_model(nodes, weights, consts, inputs, dtype, opset, reference=reference)
    grads, _ = analytic_gradient(model, feeds, wrt, reference)
    single = dtype == np.float32
    ref = numeric_gradient(model, feeds, wrt, eps=1e-2 if single else 1e-6, reference=reference)
    for name in wrt:
        assert_close(grads[name], ref[name], rtol=1e-3 if single else 1e-6)
    float32 = float32 and not single
    if float32:
        model32, feeds32 = loss_model(nodes, weights, consts, inputs, np.float32, opset)
        grads32, _ = analytic_gradient(model32, feeds32, wrt)
        for name in wrt:
            assert_close(grads32[name], grads[name], rtol=2e-3)
    return grads


def node(op, inputs, out="Y", **attrs):
    return helper.make_node(op, inputs, [out] if isinstance(out, str) else out, **attrs)


RNG = np.random.default_rng(0)


def randn(*shape):
    return RNG.standard_normal(shape)


def away(*shape):
    """Random values at least 0.2 away from 0 (kinks of Relu, Abs, Sign...)."""
    return RNG.choice([-1.0, 1.0], size=shape) * RNG.uniform(0.2, 2.0, size=shape)


def positive(*shape):
    return RNG.uniform(0.5, 2.0, size=shape)
