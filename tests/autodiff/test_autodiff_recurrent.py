"""Gradients of LSTM, GRU and RNN: finite differences in float64, and torch autograd.

onnxruntime has no float64 kernel for the recurrent operators and onnx's
reference evaluator ignores ``sequence_lens`` and ``activations``: the float64
checks run the forward node in the numpy implementation that ``gradcheck``
registers in the reference evaluator (``reference_ops.LSTM``/``GRU``/``RNN``,
checked against onnxruntime's float32 outputs here).
"""

import io

import numpy as np
import onnx
import pytest
import torch
from gradcheck import assert_close, check_op, session
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from reference_ops import DEFAULT_ACTIVATIONS, GATES

from ortlearn.autodiff import build_gradient

T, N, N_IN, H = 3, 2, 2, 2


def _case(op, direction="forward", layout=0, bias=True, h0=False, lens=None, peep=False,
          seed=0, outputs=None, **attrs):
    """(nodes, weights, inputs) for check_op: W, R, B, P, initial states are weights."""
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    x = rng.standard_normal((N, T, N_IN) if layout else (T, N, N_IN))
    weights = {"W": rng.standard_normal((d, g * H, N_IN)) * 0.7,
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
    if layout:  # an attribute from opset 14 on
        attrs["layout"] = layout
    n = helper.make_node(op, names, outs, hidden_size=H, direction=direction, **attrs)
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
    attrs = {"activations": ["Sigmoid", "Relu", "Tanh"][:len(DEFAULT_ACTIVATIONS[op])] * (
        2 if direction == "bidirectional" else 1)} if op != "RNN" else {}
    peep = op == "LSTM"
    nodes, weights, inputs = _case(op, direction=direction, layout=layout, peep=peep,
                                   **extra, **attrs)
    model, feeds = _forward_model(nodes, weights, inputs, np.float32)
    got = session(model).run(None, feeds)[0]
    model64, feeds64 = _forward_model(nodes, weights, inputs, np.float64)
    ref = session(model64, reference=True).run(None, feeds64)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", list(GATES))
def test_numpy_reference_layout_is_onnx_reference(op):
    """layout=1 (which onnxruntime refuses) as onnx's own reference evaluator runs it."""
    nodes, weights, inputs = _case(op, direction="bidirectional", layout=1, h0=True)
    model, feeds = _forward_model(nodes, weights, inputs, np.float64)
    got = session(model, reference=True).run(None, feeds)[0]
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


# torch autograd ------------------------------------------------------------
PERM = {"LSTM": [0, 3, 1, 2], "GRU": [1, 0, 2], "RNN": [0]}  # ONNX gate k is torch's PERM[k]


def _to_torch_order(g, op):
    """Rows of an ONNX weight (or bias) gradient, gate blocks put in torch's order."""
    blocks = np.split(g, len(PERM[op]), axis=0)
    out = [None] * len(blocks)
    for k, p in enumerate(PERM[op]):
        out[p] = blocks[k]
    return np.concatenate(out, axis=0)


def _to_onnx_order(w, op):
    blocks = np.split(w, len(PERM[op]), axis=0)
    return np.concatenate([blocks[p] for p in PERM[op]], axis=0)


class _Outputs(torch.nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        out, h = self.rnn(x)
        return (out, *h) if isinstance(h, tuple) else (out, h)


def _add_loss(model, weights):
    """``loss = sum_k sum(output_k * weights_k)`` appended to an exported model."""
    g = model.graph
    terms = []
    for k, (out, r) in enumerate(zip([o.name for o in g.output], weights)):
        g.node.extend([
            helper.make_node("Constant", [], [f"Rloss{k}"],
                             value=numpy_helper.from_array(r, f"Rloss{k}")),
            helper.make_node("Mul", [out, f"Rloss{k}"], [f"prod{k}"]),
            helper.make_node("ReduceSum", [f"prod{k}"], [f"term{k}"], keepdims=0)])
        terms.append(f"term{k}")
    g.node.append(helper.make_node("Sum", terms, ["loss"]))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("loss", TensorProto.DOUBLE, []))


def _onnx_gradients(model, wrt, feeds):
    grad_model = build_gradient(model, wrt=wrt)
    onnx.checker.check_model(grad_model)
    res = session(grad_model, reference=True).run(None, feeds)
    return dict(zip(wrt, res[1:]))


def _compare_parameters(rnn, op, layer_grads):
    """torch's parameter gradients vs ONNX's (W, R, B) of each layer."""
    n_gh = GATES[op] * rnn.hidden_size
    for layer, (dw, dr, db) in enumerate(layer_grads):
        for d in range(dw.shape[0]):
            sfx = f"l{layer}" + ("_reverse" if d else "")
            expected = {f"weight_ih_{sfx}": dw[d], f"weight_hh_{sfx}": dr[d],
                        f"bias_ih_{sfx}": db[d][:n_gh], f"bias_hh_{sfx}": db[d][n_gh:]}
            for name, grad in expected.items():
                assert_close(_to_torch_order(grad, op),
                             getattr(rnn, name).grad.numpy(), rtol=1e-6)


@pytest.mark.parametrize(("op", "make"), [
    ("LSTM", lambda: torch.nn.LSTM(2, 3, num_layers=2, bidirectional=True)),
    ("GRU", lambda: torch.nn.GRU(2, 3, bidirectional=True)),
    ("RNN", lambda: torch.nn.RNN(2, 3, nonlinearity="tanh")),
    ("RNN", lambda: torch.nn.RNN(2, 3, nonlinearity="relu", batch_first=True)),
])
def test_torch_export_matches_autograd(op, make):
    """TorchScript export (gates reordered, biases split) vs torch autograd, float64."""
    torch.manual_seed(0)
    rnn = make().double()
    module = _Outputs(rnn)
    x = torch.randn(4, 2, 2, dtype=torch.float64)
    f = io.BytesIO()
    torch.onnx.export(module, (x,), f, dynamo=False, input_names=["x"], opset_version=17,
                      dynamic_axes={"x": {0: "T", 1: "N"}})
    model = onnx.load_from_string(f.getvalue())
    xt = x.clone().requires_grad_(True)
    outs = module(xt)
    rng = np.random.default_rng(1)
    rs = [rng.standard_normal(tuple(o.shape)) for o in outs]
    sum((o * torch.from_numpy(r)).sum() for o, r in zip(outs, rs)).backward()
    _add_loss(model, rs)
    rec_nodes = [n for n in model.graph.node if n.op_type == op]
    wrt = [name for n in rec_nodes for name in n.input[1:4]] + ["x"]
    grads = _onnx_gradients(model, wrt, {"x": x.numpy()})
    assert_close(grads["x"], xt.grad.numpy(), rtol=1e-6)
    _compare_parameters(rnn, op, [[grads[name] for name in n.input[1:4]] for n in rec_nodes])


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_sequence_lens_matches_packed_sequences(op):
    """ONNX sequence_lens vs torch's pack_padded_sequence (float64): Y, Y_h, Y_c."""
    torch.manual_seed(0)
    rnn = getattr(torch.nn, op)(2, 3, bidirectional=True).double()
    n_t, lens = 4, [4, 1, 3]
    x = torch.randn(n_t, len(lens), 2, dtype=torch.float64, requires_grad=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lens),
                                                     enforce_sorted=False)
    out, state = rnn(packed)
    y, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=n_t)
    y = y.reshape(n_t, len(lens), 2, 3).permute(0, 2, 1, 3)  # as ONNX's [T, D, N, H]
    outs = [y, *state] if op == "LSTM" else [y, state]
    rng = np.random.default_rng(2)
    rs = [rng.standard_normal(tuple(o.shape)) for o in outs]
    sum((o * torch.from_numpy(r)).sum() for o, r in zip(outs, rs)).backward()

    weights = {}
    for name, sfx in (("W", "weight_ih"), ("RR", "weight_hh")):
        weights[name] = np.stack([_to_onnx_order(getattr(rnn, f"{sfx}_l0{s}").detach().numpy(),
                                                 op) for s in ("", "_reverse")])
    weights["B"] = np.stack([np.concatenate([
        _to_onnx_order(getattr(rnn, f"{b}_l0{s}").detach().numpy(), op)
        for b in ("bias_ih", "bias_hh")]) for s in ("", "_reverse")])
    out_names = ["Y0", "Y1", "Y2"][:len(outs)]
    attrs = {"linear_before_reset": 1} if op == "GRU" else {}
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "W", "RR", "B", "L"], out_names, hidden_size=3,
                          direction="bidirectional", **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["T", "N", 2]),
         helper.make_tensor_value_info("L", TensorProto.INT32, ["N"])],
        [helper.make_tensor_value_info(o, TensorProto.DOUBLE, None) for o in out_names],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    _add_loss(model, rs)
    grads = _onnx_gradients(model, ["W", "RR", "B", "x"],
                            {"x": x.detach().numpy(), "L": np.array(lens, np.int32)})
    assert_close(grads["x"], x.grad.numpy(), rtol=1e-6)
    _compare_parameters(rnn, op, [[grads["W"], grads["RR"], grads["B"]]])


def test_float32_dynamic_shapes_in_onnxruntime():
    """The float32 gradient graph of an export runs in onnxruntime for any T and batch."""
    torch.manual_seed(0)
    rnn = torch.nn.LSTM(2, 3, num_layers=2, bidirectional=True)
    module = _Outputs(rnn)
    f = io.BytesIO()
    torch.onnx.export(module, (torch.randn(4, 2, 2),), f, dynamo=False, input_names=["x"],
                      opset_version=17, dynamic_axes={"x": {0: "T", 1: "N"}})
    model = onnx.load_from_string(f.getvalue())
    g = model.graph
    g.node.extend([helper.make_node("ReduceSum", [o.name], [f"s{k}"], keepdims=0)
                   for k, o in enumerate(g.output)])
    g.node.append(helper.make_node("Sum", [f"s{k}" for k in range(len(g.output))], ["loss"]))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    wrt = [i.name for i in g.initializer]
    sess = session(build_gradient(model, wrt=wrt + ["x"]))
    for shape in ((5, 3, 2), (1, 1, 2)):
        rnn.zero_grad()
        x = torch.randn(*shape, requires_grad=True)
        sum(o.sum() for o in module(x)).backward()
        res = dict(zip(["loss", *wrt, "x"], sess.run(None, {"x": x.detach().numpy()})))
        np.testing.assert_allclose(res["x"], x.grad.numpy(), rtol=1e-4, atol=1e-5)
        node0 = next(n for n in g.node if n.op_type == "LSTM")
        dw = res[node0.input[1]]
        np.testing.assert_allclose(_to_torch_order(dw[1], "LSTM"),
                                   rnn.weight_ih_l0_reverse.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [13, 22])
def test_opsets(opset):
    nodes, weights, inputs = _case("LSTM", direction="bidirectional", lens=[2, 3], h0=True,
                                   peep=True)
    check_op(nodes, weights, inputs=inputs, wrt=[*weights, "X"], reference=True, opset=opset)
