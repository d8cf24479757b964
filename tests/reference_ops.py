"""Float64 stand-ins for onnx's reference evaluator, where onnx 1.23's is wrong or partial.

``gradcheck``'s reference sessions always run in :class:`Float64Reference`
(onnx's ReferenceEvaluator with :data:`REFERENCE_OPS`, also inside function
bodies such as Gelu's), so that every test differentiates against the same
float64 reference. Each op names the onnx
bug or gap it covers and the test that checks it against onnxruntime (in
float32, where onnxruntime has a kernel).
"""

import numpy as np
import torch
import torch.nn.functional as F
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops._op import OpRunUnaryNum
from scipy.special import erf


# ---------------------------------------------------------------- Erf
class Erf(OpRunUnaryNum):
    """Erf in the input's precision (scipy's erf).

    onnx 1.23's reference Erf computes in float32 whatever its input, so Erf
    and Gelu (whose function body uses Erf) in float64 would be precise to
    1e-7 only and finite differences meaningless. Checked against
    onnxruntime by ``test_autodiff_activations.py::test_float64_erf_is_onnxruntime``.
    """

    op_domain = ""

    def _run(self, x):
        return (erf(x).astype(x.dtype),)


# ---------------------------------------------------------------- ConvTranspose
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def convtranspose_pads(x_shape, w_shape, strides, dilations, out_pad, pads, auto_pad,
                       output_shape):
    """(begins, ends) of a ConvTranspose as onnxruntime computes them (ends may be < 0)."""
    k = len(w_shape) - 2
    full = [(n - 1) * s + (kk - 1) * d + 1 + op for n, s, kk, d, op in
            zip(x_shape[2:], strides, w_shape[2:], dilations, out_pad)]
    same = output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER")
    if same:  # never longer than full
        output_shape = [min(n * s, f) for n, s, f in zip(x_shape[2:], strides, full)]
    if output_shape is None:
        pads = pads or [0] * (2 * k)
        return list(pads[:k]), list(pads[k:])
    begins, ends = [], []
    for f, out in zip(full, list(output_shape)[-k:]):
        total = f - out
        if total < 0:
            begins.append(0)
            ends.append(total)
        elif auto_pad == "SAME_UPPER":
            begins.append(total // 2)
            ends.append(total - total // 2)
        else:
            begins.append(total - total // 2)
            ends.append(total // 2)
    return begins, ends


def torch_conv_transpose(x, w, b=None, strides=None, dilations=None, group=1, out_pad=None,
                         pads=None, auto_pad="NOTSET", output_shape=None):
    """ConvTranspose with torch tensors and onnxruntime's padding rules."""
    k = w.dim() - 2
    strides = strides or [1] * k
    dilations = dilations or [1] * k
    out_pad = out_pad or [0] * k
    begins, ends = convtranspose_pads(list(x.shape), list(w.shape), strides, dilations,
                                      out_pad, pads, auto_pad, output_shape)
    y = _CONV_T[k](x, w, b, stride=strides, dilation=dilations, groups=group)
    # output_padding zeros (the bias too) at the end, then the pads cut
    # (or, negative, extend with zeros) each side.
    widths = []
    for i in reversed(range(k)):
        widths += [-begins[i], out_pad[i] - ends[i]]
    y_nobias = F.pad(y if b is None else y - b.reshape(1, -1, *[1] * k), widths)
    return y_nobias if b is None else y_nobias + b.reshape(1, -1, *[1] * k)


class ConvTranspose(OpRun):
    """ConvTranspose computed by torch in float64 with onnxruntime's padding rules.

    onnx 1.23's reference ConvTranspose is wrong for ``group`` > 1 with more
    than one output channel per group, and refuses ``output_shape`` with
    NOTSET (explicit) or VALID pads. Checked against onnxruntime by
    ``test_autodiff_conv.py::test_torch_conv_transpose_follows_onnxruntime``.
    """

    op_domain = ""

    def _run(self, x, w, b=None, auto_pad=None, dilations=None, group=None,
             kernel_shape=None, output_padding=None, output_shape=None, pads=None,
             strides=None):
        # torch.tensor copies: the evaluator's arrays may be read-only
        tb = None if b is None else torch.tensor(np.asarray(b))
        y = torch_conv_transpose(torch.tensor(x), torch.tensor(w), tb, strides,
                                 dilations, group or 1, output_padding, pads,
                                 auto_pad or "NOTSET", output_shape)
        return (y.numpy().astype(x.dtype),)


# ---------------------------------------------------------------- LSTM, GRU, RNN
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"],
                       "RNN": ["Tanh"]}
_ACTS = {"Sigmoid": lambda x: 1 / (1 + np.exp(-x)), "Tanh": np.tanh,
         "Relu": lambda x: np.maximum(x, 0)}


def _cell(op, x, h, c, w, r, bias, p, acts, lbr):
    """One step of one sequence; returns (h, c)."""
    n, H = GATES[op], r.shape[-1]  # noqa: N806
    wb, rb = bias[:n * H], bias[n * H:]
    if op == "RNN":
        return _ACTS[acts[0]](w @ x + r @ h + wb + rb), c
    if op == "GRU":
        f, g = _ACTS[acts[0]], _ACTS[acts[1]]
        xw = w @ x + wb
        z = f(xw[:H] + r[:H] @ h + rb[:H])
        rr = f(xw[H:2 * H] + r[H:2 * H] @ h + rb[H:2 * H])
        if lbr:
            cand = g(xw[2 * H:] + rr * (r[2 * H:] @ h + rb[2 * H:]))
        else:
            cand = g(xw[2 * H:] + r[2 * H:] @ (rr * h) + rb[2 * H:])
        return (1 - z) * cand + z * h, c
    f, g, hh = (_ACTS[a] for a in acts)
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
    acts = activations or DEFAULT_ACTIVATIONS[op] * n_d
    k = len(DEFAULT_ACTIVATIONS[op])
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


def _recurrent_op(op):
    class Recurrent(OpRun):
        op_domain = ""

        def _run(self, *inputs, **kwargs):
            acts = getattr(self, "activations", None)
            out = run_recurrent(op, inputs, getattr(self, "direction", None) or "forward",
                                getattr(self, "layout", None) or 0,
                                [a.decode() if isinstance(a, bytes) else a for a in acts]
                                if acts else None, getattr(self, "linear_before_reset", 0))
            return out[:len(self.onnx_node.output)]

    Recurrent.__name__ = Recurrent.__qualname__ = op
    Recurrent.__doc__ = (
        f"{op} in numpy (:func:`run_recurrent`) with onnxruntime's semantics.\n\n"
        "onnx 1.23's reference evaluator ignores ``sequence_lens`` and ``activations``. "
        "Checked against onnxruntime by "
        "``test_autodiff_recurrent.py::test_numpy_reference_is_onnxruntime`` (and "
        "``layout=1``, which onnxruntime refuses, against onnx's reference by "
        "``test_numpy_reference_layout_is_onnx_reference``).")
    return Recurrent


LSTM, GRU, RNN = (_recurrent_op(op) for op in GATES)

#: What ``gradcheck``'s reference sessions add to onnx's ReferenceEvaluator.
REFERENCE_OPS = [Erf, ConvTranspose, LSTM, GRU, RNN]


class Float64Reference(ReferenceEvaluator):
    """onnx's ReferenceEvaluator with :data:`REFERENCE_OPS` (after the ``new_ops`` given).

    A subclass rather than ``ReferenceEvaluator(model, new_ops=...)``: onnx
    evaluates the function body of an op (Gelu's, which calls Erf) in a new
    evaluator of the same class, which then gets the stand-ins too.
    """

    def __init__(self, proto, *args, new_ops=None, **kwargs):
        super().__init__(proto, *args, new_ops=[*(new_ops or ()), *REFERENCE_OPS], **kwargs)
