"""Gradients of LSTM, GRU and RNN: finite differences in float64, and torch autograd.

onnxruntime has no float64 kernel for the recurrent operators and onnx's
reference evaluator ignores ``sequence_lens`` and ``activations``: the float64
checks run the forward node in a numpy implementation (checked against
onnxruntime's float32 outputs first) registered in the reference evaluator.
"""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

import gradcheck
from gradcheck import analytic_gradient, assert_close, check_op, node, session
from ortlearn.autodiff import build_gradient

T, N, I, H = 3, 2, 2, 2
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
ACTS = {"Sigmoid": lambda x: 1 / (1 + np.exp(-x)), "Tanh": np.tanh,
        "Relu": lambda x: np.maximum(x, 0)}


def _cell(op, x, h, c, w, r, bias, p, acts, lbr):
    """One step of one sequence; returns (h, c)."""
    n = GATES[op]
    wb, rb = bias[:n * H], bias[n * H:]
    if op == "RNN":
        return ACTS[acts[0]](w @ x + r @ h + wb + rb), c
    if op == "GRU":
        f, g = ACTS[acts[0]], ACTS[acts[1]]
        xw = w @ x + wb
        z = f(xw[:H] + r[:H] @ h + rb[:H])
        rr = f(xw[H:2 * H] + r[H:2 * H] @ h + rb[H:2 * H])
        if lbr:
            cand = g(xw[2 * H:] + rr * (r[2 * H:] @ h + rb[2 * H:]))
        else:
            cand = g(xw[2 * H:] + r[2 * H:] @ (rr * h) + rb[2 * H:])
        return (1 - z) * cand + z * h, c
    f, g, hh = (ACTS[a] for a in acts)
    pre = w @ x + r @ h + wb + rb
    i = f(pre[:H] + p[:H] * c)
    fg = f(pre[2 * H:3 * H] + p[2 * H:] * c)
    c = fg * c + i * g(pre[3 * H:])
    o = f(pre[H:2 * H] + p[H:2 * H] * c)
    return o * hh(c), c


def run_recurrent(op, inputs, direction="forward", layout=0, activations=None, lbr=0):
    """numpy LSTM/GRU/RNN with onnxruntime's semantics (sequence_lens included)."""
    x, w, r, bias, lens, h0, c0, p = (list(inputs) + [None] * 8)[:8]
    if layout:
        x = x.swapaxes(0, 1)
        h0 = None if h0 is None else h0.swapaxes(0, 1)
        c0 = None if c0 is None else c0.swapaxes(0, 1)
    n_t, n_b = x.shape[:2]
    n_d, hid = w.shape[0], r.shape[-1]
    acts = activations or DEFAULTS[op] * n_d
    k = len(DEFAULTS[op])
    y = np.zeros((n_t, n_d, n_b, hid), x.dtype)
    yh, yc = np.zeros((2, n_d, n_b, hid), x.dtype)
    for d in range(n_d):
        rev = direction == "reverse" or d == 1
        bd = np.zeros(2 * GATES[op] * hid) if bias is None else bias[d]
        pd = np.zeros(3 * hid) if p is None else p[d]
        for b in range(n_b):
            length = n_t if lens is None else int(lens[b])
            h = np.zeros(hid) if h0 is None else h0[d, b]
            c = np.zeros(hid) if c0 is None else c0[d, b]
            for t in (range(length - 1, -1, -1) if rev else range(length)):
                h, c = _cell(op, x[t, b], h, c, w[d], r[d], bd, pd, acts[d * k:(d + 1) * k], lbr)
                y[t, d, b] = h
            if length:
                yh[d, b], yc[d, b] = h, c
    if layout:
        y, yh, yc = y.transpose(2, 0, 1, 3), yh.swapaxes(0, 1), yc.swapaxes(0, 1)
    return y, yh, yc


def _ref_op(op):
    class Ref(OpRun):
        op_domain = ""

        def _run(self, *inputs, **kwargs):
            acts = getattr(self, "activations", None)
            out = run_recurrent(op, inputs, getattr(self, "direction", None) or "forward",
                                getattr(self, "layout", None) or 0,
                                [a.decode() if isinstance(a, bytes) else a for a in acts]
                                if acts else None, getattr(self, "linear_before_reset", 0))
            return out[:len(self.onnx_node.output)]
    Ref.__name__ = op
    return Ref


REF_OPS = [_ref_op(op) for op in GATES]


@pytest.fixture(autouse=True)
def _full_reference(monkeypatch):
    """The reference evaluator with the numpy recurrent ops above."""
    monkeypatch.setattr(gradcheck, "ReferenceEvaluator",
                        lambda model: ReferenceEvaluator(model, new_ops=REF_OPS))


def _case(op, direction="forward", layout=0, bias=True, h0=False, lens=None, peep=False,
          seed=0, outputs=None, **attrs):
    """(nodes, weights, inputs) for check_op: W, R, B, P, initial states are weights."""
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    x = rng.standard_normal((N, T, I) if layout else (T, N, I))
    weights = {"W": rng.standard_normal((d, g * H, I)) * 0.7,
               "RR": rng.standard_normal((d, g * H, H)) * 0.7}
    names = ["X", "W", "RR", "", "", "", "", ""]
    if bias:
        weights["B"] = rng.standard_normal((d, 2 * g * H)) * 0.5
        names[3] = "B"
    inputs = {"X": x}
    if lens is not None:
        inputs["L"] = np.asarray(lens, np.int32)
        names[4] = "L"
    state = (N, d, H) if layout else (d, N, H)
    if h0:
        weights["H0"] = rng.standard_normal(state)
        names[5] = "H0"
        if op == "LSTM":
            weights["C0"] = rng.standard_normal(state)
            names[6] = "C0"
    if peep:
        weights["P"] = rng.standard_normal((d, 3 * H))
        names[7] = "P"
    while not names[-1]:
        names.pop()
    outs = outputs or ["Yn", "Yh", "Yc"][:2 + (op == "LSTM")]
    n = helper.make_node(op, names, outs, hidden_size=H, direction=direction, layout=layout,
                         **attrs)
    return [n, *_flat_concat(outs)], weights, inputs


def _flat_concat(outs):
    """Nodes making ``Y``: every output used, flattened and concatenated."""
    used = [o for o in outs if o]
    nodes = [helper.make_node("Constant", [], ["flat"], value=numpy_helper.from_array(
        np.array([-1], np.int64)))]
    nodes += [helper.make_node("Reshape", [o, "flat"], [f"{o}_flat"]) for o in used]
    nodes.append(helper.make_node("Concat", [f"{o}_flat" for o in used], ["Y"], axis=0))
    return nodes


def check(op, **kwargs):
    """check_op in float64, and in float32 in onnxruntime where it runs the node.

    onnxruntime's CPU kernels refuse ``layout=1``: float64 only there.
    """
    nodes, weights, inputs = _case(op, **kwargs)
    return check_op(nodes, weights, inputs=inputs, wrt=[*weights, "X"], reference=True,
                    float32=not kwargs.get("layout"))



def _forward_model(nodes, weights, inputs, dtype):
    inits = [numpy_helper.from_array(v.astype(dtype), k) for k, v in weights.items()]
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    graph_inputs = [helper.make_tensor_value_info("X", elem, inputs["X"].shape)]
    if "L" in inputs:
        graph_inputs.append(helper.make_tensor_value_info("L", TensorProto.INT32, [N]))
    graph = helper.make_graph(nodes, "g", graph_inputs,
                              [helper.make_tensor_value_info("Y", elem, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    feeds = {k: (v.astype(dtype) if v.dtype.kind == "f" else v) for k, v in inputs.items()}
    return model, feeds


FORWARD_CASES = [
    (op, direction, layout, extra)
    for op in GATES for direction in ("forward", "reverse", "bidirectional")
    for layout in (0,)
    for extra in ({"lens": [3, 1], "h0": True}, {"bias": False, "lens": [2, 0], "h0": True})
]


@pytest.mark.parametrize(("op", "direction", "layout", "extra"), FORWARD_CASES)
def test_numpy_reference_is_onnxruntime(op, direction, layout, extra):
    """The float64 stand-in agrees with onnxruntime's float32 kernels (zero length too)."""
    attrs = {"activations": ["Sigmoid", "Relu", "Tanh"][:len(DEFAULTS[op])] * (
        2 if direction == "bidirectional" else 1)} if op != "RNN" else {}
    peep = op == "LSTM"
    nodes, weights, inputs = _case(op, direction=direction, layout=layout, peep=peep,
                                   **extra, **attrs)
    model, feeds = _forward_model(nodes, weights, inputs, np.float32)
    got = session(model).run(None, feeds)[0]
    model64, feeds64 = _forward_model(nodes, weights, inputs, np.float64)
    ref = ReferenceEvaluator(model64, new_ops=REF_OPS).run(None, feeds64)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", list(GATES))
def test_numpy_reference_layout_is_onnx_reference(op):
    """layout=1 (which onnxruntime refuses) as onnx's own reference evaluator runs it."""
    nodes, weights, inputs = _case(op, direction="bidirectional", layout=1, h0=True)
    model, feeds = _forward_model(nodes, weights, inputs, np.float64)
    got = ReferenceEvaluator(model, new_ops=REF_OPS).run(None, feeds)[0]
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-12)


GRAD_CASES = (
    [(op, direction, {"lens": [3, 1], "h0": True})
     for op in GATES for direction in ("forward", "reverse", "bidirectional")]
    + [(op, "bidirectional", {"layout": 1, "lens": [2, 3], "h0": True}) for op in GATES]
    + [(op, direction, {"bias": False}) for op in GATES for direction in ("forward", "reverse")]
    + [("GRU", "bidirectional", {"linear_before_reset": 1, "lens": [1, 3], "h0": True}),
       ("GRU", "reverse", {"linear_before_reset": 1, "layout": 1}),
       ("LSTM", "bidirectional", {"peep": True, "lens": [3, 2], "h0": True}),
       ("LSTM", "reverse", {"peep": True, "layout": 1}),
       ("LSTM", "bidirectional", {"activations": ["Relu", "Tanh", "Sigmoid",
                                                  "Sigmoid", "Relu", "Tanh"]}),
       ("GRU", "forward", {"activations": ["Sigmoid", "Relu"], "lens": [2, 3]}),
       ("RNN", "bidirectional", {"activations": ["Relu", "Tanh"], "lens": [3, 2]}),
       ("LSTM", "forward", {"lens": [2, 0], "h0": True}),
       ("GRU", "reverse", {"lens": [0, 2], "h0": True})]
)


@pytest.mark.parametrize(("op", "direction", "extra"), GRAD_CASES)
def test_gradient(op, direction, extra):
    grads = check(op, direction=direction, **extra)
    assert all(np.abs(g).max() > 0 for g in grads.values())


@pytest.mark.parametrize(("op", "outputs"), [
    ("LSTM", ["", "Yh"]), ("LSTM", ["", "", "Yc"]), ("LSTM", ["Yn"]), ("GRU", ["", "Yh"]),
    ("RNN", ["Yn", ""]),
])
def test_gradient_of_some_outputs(op, outputs):
    """Any subset of Y, Y_h, Y_c may be used; Y is added to the node when absent."""
    check(op, direction="bidirectional", lens=[3, 2], h0=True, outputs=outputs)


@pytest.mark.parametrize(("attrs", "match"), [
    ({"clip": 1.0}, "clip"),
    ({"input_forget": 1}, "input_forget"),
    ({"activations": ["Sigmoid", "Softsign", "Tanh"]}, "Softsign"),
])
def test_refused_attributes(attrs, match):
    nodes, weights, inputs = _case("LSTM", **attrs)
    model, _ = _forward_model(nodes, weights, inputs, np.float32)
    model.graph.node.append(helper.make_node("ReduceSum", ["Y"], ["loss"], keepdims=0))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    with pytest.raises(NotImplementedError, match=match):
        build_gradient(model, wrt=["W"])
