"""Gradients of the recurrent operators: LSTM, GRU and RNN.

The forward node already holds the hidden state of every step in its output
``Y`` (added to the node when the model does not use it), so the gate
pre-activations of all steps are recomputed at once: one MatMul of ``X`` and
one of ``Y`` shifted by one step (``initial_h`` first). Only what is truly
sequential runs in a ``Scan``: the LSTM cell state forwards, and the
gradients of the hidden (and cell) state backwards. The weight gradients are
then Einsums over all steps.

Both directions of a bidirectional node share each Scan (the direction is a
batch axis). The reverse direction is first brought in forward order
(``ReverseSequence`` over each sequence's own length, as onnxruntime runs
it), so that every direction reads as a forward recurrence whose padded
steps come last: there the output is 0 and the state carries through, so the
last step holds ``Y_h`` (and ``Y_c``) for every direction.

Layout inside the rule: time first, ``[T, D, B, width]`` as ``Y`` has it
with ``layout=0``.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..graph import GraphBuilder, attr, onnx_to_np_dtype, optional_input
from ._registry import register_gradient

_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"),
                        "RNN": ("Tanh",)}
_N_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_SUPPORTED_ACTIVATIONS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu"}
_INT64_MIN = np.iinfo(np.int64).min


def _refuse(node, what: str, remedy: str):
    raise NotImplementedError(
        f"No gradient for {node.op_type} node {node.name!r} with {what}; {remedy}")


def _activations(node) -> list[tuple[str, ...]]:
    """One tuple of activation names per direction (refusing those without a rule)."""
    default = _DEFAULT_ACTIVATIONS[node.op_type]
    n_dirs = 2 if attr(node, "direction", "forward") == "bidirectional" else 1
    names = attr(node, "activations", None)
    if not names:
        return [default] * n_dirs
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    if len(names) != len(default) * n_dirs:
        raise ValueError(
            f"{node.op_type} node {node.name!r}: 'activations' holds {len(names)} names, "
            f"expected {len(default)} per direction.")
    unknown = sorted({n for n in names if n.lower() not in _SUPPORTED_ACTIVATIONS})
    if unknown:
        _refuse(node, f"activations {unknown}",
                "only Sigmoid, Tanh and Relu have a gradient rule in recurrent operators; "
                "use those, or unroll the recurrence into elementwise ops.")
    names = [_SUPPORTED_ACTIVATIONS[n.lower()] for n in names]
    k = len(default)
    return [tuple(names[d * k:(d + 1) * k]) for d in range(n_dirs)]


def _apply_act(b, kind: str, x: str) -> str:
    return b.op(kind, [x])


def _act_slope(b, kind: str, y: str, one: str, zero: str) -> str:
    """Derivative of the activation ``kind`` from its output ``y``."""
    if kind == "Sigmoid":
        return b.op("Mul", [y, b.op("Sub", [one, y])])
    if kind == "Tanh":
        return b.op("Sub", [one, b.op("Mul", [y, y])])
    # Relu: y > 0 exactly where its input is > 0.
    return b.op("Where", [b.op("Greater", [y, zero]), one, zero])


class _Recurrence:
    """What the three rules share: the node read in time-major, aligned form."""

    def __init__(self, ctx, node):
        self.ctx, self.node, self.b = ctx, node, ctx.b
        op = node.op_type
        self.n_gates = _N_GATES[op]
        direction = attr(node, "direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ValueError(f"{op} node {node.name!r}: unknown direction {direction!r}.")
        self.reverse = {"forward": [False], "reverse": [True],
                        "bidirectional": [False, True]}[direction]
        self.n_dirs = len(self.reverse)
        self.layout = attr(node, "layout", 0)
        if attr(node, "clip", None) is not None:
            _refuse(node, "attribute 'clip'", "remove the clip attribute (the gradient of "
                    "a clipped gate is not implemented).")
        if op == "LSTM" and attr(node, "input_forget", 0):
            _refuse(node, "input_forget=1", "use input_forget=0 (coupled input and forget "
                    "gates are not implemented).")
        self.acts = _activations(node)
        self.hidden = self._hidden_size()
        x, w, r = node.input[:3]
        self.x_in, self.w, self.r = x, w, r
        self.bias = optional_input(node, 3)
        self.lens = optional_input(node, 4)
        self.h0_in = optional_input(node, 5)
        self.np_dtype = onnx_to_np_dtype(ctx.dtype(x))
        b = self.b
        self.one = ctx.const(1, like=x)
        self.zero = ctx.const(0, like=x)
        # Y holds every hidden state: expose it when the model does not.
        y = ctx.expose_output(node, 0, f"{op.lower()}_Y")
        self.x = b.op("Transpose", [x], perm=[1, 0, 2]) if self.layout else x
        self.y = self._time_major_y(y)
        time, batch = self.dim(0), self.dim(1)
        self.state_shape = b.op("Concat", [b.ints([self.n_dirs], hint="dirs"), batch,
                                           b.ints([self.hidden], hint="hidden")], axis=0)
        self.h0 = self.state(self.h0_in)
        self.mask = self.lens64 = self.nonempty = None
        if self.lens is not None:
            self.lens64 = b.cast(self.lens, TensorProto.INT64)
            steps = b.op("Range", [b.const(np.int64(0)), b.squeeze(time, [0]),
                                   b.const(np.int64(1))])
            # [T, 1, B, 1]: step t of sequence b is real (not padding).
            valid = b.op("Less", [b.unsqueeze(steps, [1]), b.unsqueeze(self.lens64, [0])])
            self.mask = b.unsqueeze(valid, [1, 3])
            # A sequence of length 0 outputs zeros (Y_h too), whatever the initial state.
            self.nonempty = b.unsqueeze(
                b.op("Greater", [self.lens64, b.const(np.int64(0))]), [0, 2])
        # Hidden state before each (aligned) step: initial_h, then Y shifted by one.
        y_al = self.align(self.y)
        shifted = b.op("Slice", [y_al, b.ints([0], hint="start"), b.ints([-1], hint="end"),
                                 b.ints([0])])
        self.h_prev = b.op("Concat", [b.unsqueeze(self.h0, [0]), shifted], axis=0)

    def dim(self, axis: int) -> str:
        """Length of axis ``axis`` of the time-major X, as a 1-D tensor."""
        b = self.b
        return b.op("Slice", [self.ctx.shape_of(self.x), b.ints([axis], hint="start"),
                              b.ints([axis + 1], hint="end")])

    def _hidden_size(self) -> int:
        hidden = attr(self.node, "hidden_size", None)
        if hidden is None:
            shape = self.ctx.shape(self.node.input[2])
            hidden = shape[-1] if shape else None
        if not isinstance(hidden, int):
            raise ValueError(
                f"The gradient of {self.node.op_type} node {self.node.name!r} needs its "
                "hidden size: set the hidden_size attribute or give R a static shape.")
        return hidden

    def _time_major_y(self, y: str) -> str:
        return self.b.op("Transpose", [y], perm=[1, 2, 0, 3]) if self.layout else y

    # layout and direction ----------------------------------------------
    def state(self, name: str | None) -> str:
        """An initial state ``[D, B, H]`` (zeros when omitted)."""
        if name is None:
            return self.b.op("ConstantOfShape", [self.state_shape], value=helper.make_tensor(
                "zero", self.ctx.dtype(self.x_in), [1], [0]))
        return self.b.op("Transpose", [name], perm=[1, 0, 2]) if self.layout else name

    def state_back(self, grad: str) -> str:
        """A state gradient ``[D, B, H]`` in the node's layout."""
        return self.b.op("Transpose", [grad], perm=[1, 0, 2]) if self.layout else grad

    def output_grad(self, grad: str | None) -> str | None:
        """The gradient of Y, time-major and aligned, 0 on padding."""
        if grad is None:
            return None
        g = self.align(self._time_major_y(grad))
        return self.masked(g, self.zero)

    def final_state_grad(self, grad: str | None) -> str:
        """Gradient of Y_h / Y_c, the state after the last aligned step (0 when absent)."""
        if grad is None:
            return self.state(None)
        g = self.state(grad)
        return g if self.nonempty is None else self.b.op("Where", [self.nonempty, g, self.zero])

    def masked(self, value: str, fill: str) -> str:
        """``value`` on real steps, ``fill`` on padding."""
        return value if self.mask is None else self.b.op("Where", [self.mask, value, fill])

    def _flip(self, v: str) -> str:
        """Reverse the time axis of ``v`` ``[T, 1, B, K]``, each sequence over its length."""
        b = self.b
        if self.lens64 is None:
            return self.flip_time(v)
        rev = b.op("ReverseSequence", [b.squeeze(v, [1]), self.lens64], batch_axis=1,
                   time_axis=0)
        return b.unsqueeze(rev, [1])

    def align(self, v: str) -> str:
        """``v`` ``[T, D, B, K]`` with each reverse direction in processing order.

        Its own inverse: it also brings aligned gradients back.
        """
        if not any(self.reverse):
            return v
        if self.n_dirs == 1:
            return self._flip(v)
        b = self.b
        fwd, bwd = b.op("Split", [v, b.ints([1, 1], hint="split")], n_outputs=2, axis=1)
        return b.op("Concat", [fwd, self._flip(bwd)], axis=1)

    # activations, per direction ------------------------------------------
    def per_dir(self, b, x: str, index: int, axis: int, fn) -> str:
        """``fn(kind, x)`` with the activation ``index`` of each direction (axis: D's)."""
        kinds = [acts[index] for acts in self.acts]
        if len(set(kinds)) == 1:
            return fn(kinds[0], x)
        parts = b.op("Split", [x, b.ints([1, 1], hint="split")], n_outputs=2, axis=axis)
        return b.op("Concat", [fn(k, p) for k, p in zip(kinds, parts)], axis=axis)

    def act(self, x: str, index: int, b=None, axis: int = 1) -> str:
        b = b or self.b
        return self.per_dir(b, x, index, axis, lambda k, v: _apply_act(b, k, v))

    def slope(self, y: str, index: int) -> str:
        return self.per_dir(self.b, y, index, 1,
                            lambda k, v: _act_slope(self.b, k, v, self.one, self.zero))

    # pieces of the weights ---------------------------------------------
    def gate_split(self, v: str, sizes: list[int], axis: int = -1) -> list[str]:
        b = self.b
        return b.op("Split", [v, b.ints([s * self.hidden for s in sizes], hint="split")],
                    n_outputs=len(sizes), axis=axis)

    def biases(self) -> tuple[str | None, str | None]:
        """``Wb`` and ``Rb`` as ``[D, 1, G*H]`` (None without B)."""
        if self.bias is None:
            return None, None
        wb, rb = self.gate_split(self.b.unsqueeze(self.bias, [1]), [self.n_gates] * 2)
        return wb, rb

    def input_part(self) -> str:
        """``X @ W^T (+ Wb)`` of every step, aligned: ``[T, D, B, G*H]``."""
        b = self.b
        xw = b.op("Einsum", [self.x, self.w], equation="tbi,dgi->tdbg")
        wb, _ = self.biases()
        return self.align(xw if wb is None else b.op("Add", [xw, wb]))

    def recurrent_part(self, h: str, r: str, rb: str | None) -> str:
        """``h @ r^T (+ rb)``, ``h`` ``[T, D, B, H]``, ``r`` ``[D, K, H]``."""
        hr = self.b.op("Einsum", [h, r], equation="tdbh,dkh->tdbk")
        return hr if rb is None else self.b.op("Add", [hr, rb])

    # the backward recurrence ---------------------------------------------
    def scan(self, body_fn, states: list[str], scans: list[str], n_outs: int,
             reverse: bool) -> list[str]:
        """A Scan over axis 0 whose body ``body_fn(b, states, scans)`` returns
        ``(new states, scan outputs)``; returns final states then scan outputs."""
        ctx = self.ctx
        body = GraphBuilder(opset=ctx.opset, prefix=self.b.unique_name("scan_body") + "/")
        elem = ctx.dtype(self.x_in)
        s_in = [body.unique_name("state") for _ in states]
        x_in = [body.unique_name("step") for _ in scans]
        new_states, outs = body_fn(body, s_in, x_in)
        # Graph outputs need their own names (a state may also be a scan output).
        s_out = [body.op("Identity", [s]) for s in new_states]
        o_out = [body.op("Identity", [o]) for o in outs]
        types = {n: TensorProto.BOOL if n == self.mask else elem for n in scans}

        def info(name, elem_type):
            return helper.make_tensor_value_info(name, elem_type, None)

        graph = helper.make_graph(
            body.nodes, body.unique_name("graph"),
            [info(n, elem) for n in s_in] + [info(n, types[s]) for n, s in zip(x_in, scans)],
            [info(n, elem) for n in s_out + o_out])
        # Reversed by Slice rather than scan_*_directions, which onnx's reference
        # evaluator (the float64 check) does not run.
        if reverse:
            scans = [self.flip_time(v) for v in scans]
        res = self.b.op("Scan", states + scans, n_outputs=len(states) + n_outs, body=graph,
                        num_scan_inputs=len(scans))
        if reverse:
            res[len(states):] = [self.flip_time(v) for v in res[len(states):]]
        return res

    def flip_time(self, v: str) -> str:
        """``v`` with its axis 0 (time) reversed."""
        b = self.b
        return b.op("Slice", [v, b.ints([-1], hint="start"), b.ints([_INT64_MIN], hint="end"),
                              b.ints([0]), b.ints([-1], hint="step")])

    def mask_step(self) -> list[str]:
        """The padding mask as a Scan input (none without sequence_lens)."""
        return [] if self.mask is None else [self.mask]

    def zeros_y(self) -> str:
        b = self.b
        shape = b.op("Concat", [self.dim(0), self.state_shape],
                     axis=0)
        return b.op("ConstantOfShape", [shape], value=helper.make_tensor(
            "zero", self.ctx.dtype(self.x_in), [1], [0]))

    # gradients of the inputs ---------------------------------------------
    def input_grads(self, d_pre_x: str, d_pre_r: str, r_factors: list[tuple[str, str]],
                    d_h0: str) -> list[str | None]:
        """Gradients of X, W, R, B, sequence_lens, initial_h.

        ``d_pre_x``: gradient of ``X W^T + Wb`` (aligned); ``d_pre_r``: of the
        recurrent term ``. R^T + Rb``; ``r_factors``: ``(gradient, hidden)``
        pairs whose products give R's gradient, gate block after gate block.
        """
        ctx, b = self.ctx, self.b
        grads = [None] * 6
        need_xw = ctx.needs(self.x_in) or ctx.needs(self.w)
        d_xw = self.align(d_pre_x) if need_xw else None
        if ctx.needs(self.x_in):
            dx = b.op("Einsum", [d_xw, self.w], equation="tdbg,dgi->tbi")
            grads[0] = b.op("Transpose", [dx], perm=[1, 0, 2]) if self.layout else dx
        if ctx.needs(self.w):
            grads[1] = b.op("Einsum", [d_xw, self.x], equation="tdbg,tbi->dgi")
        if ctx.needs(self.r):
            blocks = [b.op("Einsum", [g, h], equation="tdbg,tdbh->dgh") for g, h in r_factors]
            grads[2] = blocks[0] if len(blocks) == 1 else b.op("Concat", blocks, axis=1)
        if ctx.needs(self.bias):
            sums = [b.reduce("ReduceSum", g, [0, 2], keepdims=0) for g in (d_pre_x, d_pre_r)]
            grads[3] = b.op("Concat", sums, axis=1)
        if ctx.needs(self.h0_in):
            grads[5] = self.state_back(d_h0)
        return grads


@register_gradient("RNN")
def _rnn(ctx, node, grads):
    rec = _Recurrence(ctx, node)
    # H_t = f(pre_t) is the aligned Y itself on real steps.
    y_al = rec.align(rec.y)
    slope = rec.masked(rec.slope(y_al, 0), rec.zero)
    d_y = rec.output_grad(grads[0]) or rec.zeros_y()
    d_last = rec.final_state_grad(grads[1] if len(grads) > 1 else None)
    r = rec.r

    def body(b, states, steps):
        dy, k, *mask = steps
        dh = b.op("Add", [dy, states[0]])
        d_pre = b.op("Mul", [dh, k])
        d_prev = b.op("MatMul", [d_pre, r])
        if mask:  # padding: the state carries through
            d_prev = b.op("Where", [mask[0], d_prev, dh])
        return [d_prev], [d_pre]

    d_h0, d_pre = rec.scan(body, [d_last], [d_y, slope] + rec.mask_step(), 1, reverse=True)
    return rec.input_grads(d_pre, d_pre, [(d_pre, rec.h_prev)], d_h0)


@register_gradient("GRU")
def _gru(ctx, node, grads):
    rec = _Recurrence(ctx, node)
    b = rec.b
    lbr = attr(node, "linear_before_reset", 0)
    xz, xr, xh = rec.gate_split(rec.input_part(), [1, 1, 1])
    _, rb = rec.biases()
    r_zr, r_h = rec.gate_split(rec.r, [2, 1], axis=1)
    rb_zr = rb_h = None
    if rb is not None:
        rb_zr, rb_h = rec.gate_split(rb, [2, 1])
    h_prev = rec.h_prev
    hz, hr = rec.gate_split(rec.recurrent_part(h_prev, r_zr, rb_zr), [1, 1])
    z = rec.act(b.op("Add", [xz, hz]), 0)
    r = rec.act(b.op("Add", [xr, hr]), 0)
    if lbr:
        hh = rec.recurrent_part(h_prev, r_h, rb_h)  # what the reset gate scales
        cand = rec.act(b.op("Add", [xh, b.op("Mul", [r, hh])]), 1)
    else:
        r_h_prev = b.op("Mul", [r, h_prev])
        cand = rec.act(b.op("Add", [xh, rec.recurrent_part(r_h_prev, r_h, rb_h)]), 1)
    # dH_t / d(pre-activations), step by step, all computed at once.
    k_z = rec.masked(b.op("Mul", [b.op("Sub", [h_prev, cand]), rec.slope(z, 0)]), rec.zero)
    k_h = rec.masked(b.op("Mul", [b.op("Sub", [rec.one, z]), rec.slope(cand, 1)]), rec.zero)
    carry = rec.masked(z, rec.one)  # padding: the state carries through
    d_y = rec.output_grad(grads[0]) or rec.zeros_y()
    d_last = rec.final_state_grad(grads[1] if len(grads) > 1 else None)
    big_r = rec.r

    if lbr:
        k_r = rec.masked(b.op("Mul", [b.op("Mul", [k_h, hh]), rec.slope(r, 0)]), rec.zero)
        k_zrh = b.op("Concat", [k_z, k_r, b.op("Mul", [k_h, r])], axis=-1)

        def body(bb, states, steps):
            dy, k, zc = steps
            dh = bb.op("Add", [dy, states[0]])
            d_rec = bb.op("Mul", [bb.op("Concat", [dh, dh, dh], axis=-1), k])
            d_prev = bb.op("Add", [bb.op("Mul", [dh, zc]), bb.op("MatMul", [d_rec, big_r])])
            return [d_prev], [d_rec, dh]

        d_h0, d_rec, d_h = rec.scan(body, [d_last], [d_y, k_zrh, carry], 2, reverse=True)
        d_zr = b.op("Slice", [d_rec, b.ints([0], hint="start"),
                              b.ints([2 * rec.hidden], hint="end"), b.ints([-1])])
        d_x = b.op("Concat", [d_zr, b.op("Mul", [d_h, k_h])], axis=-1)
        return rec.input_grads(d_x, d_rec, [(d_rec, h_prev)], d_h0)

    k_r = rec.masked(b.op("Mul", [h_prev, rec.slope(r, 0)]), rec.zero)

    def body(bb, states, steps):
        dy, kz, kh, kr, rs, zc = steps
        dh = bb.op("Add", [dy, states[0]])
        d_cand = bb.op("Mul", [dh, kh])
        d_rh = bb.op("MatMul", [d_cand, r_h])  # gradient of r * H_prev
        d_zr = bb.op("Concat", [bb.op("Mul", [dh, kz]), bb.op("Mul", [d_rh, kr])], axis=-1)
        d_prev = bb.op("Sum", [bb.op("Mul", [dh, zc]), bb.op("MatMul", [d_zr, r_zr]),
                               bb.op("Mul", [d_rh, rs])])
        return [d_prev], [bb.op("Concat", [d_zr, d_cand], axis=-1)]

    d_h0, d_pre = rec.scan(body, [d_last], [d_y, k_z, k_h, k_r, r, carry], 1, reverse=True)
    d_zr, d_cand = rec.gate_split(d_pre, [2, 1])
    return rec.input_grads(d_pre, d_pre, [(d_zr, h_prev), (d_cand, r_h_prev)], d_h0)


@register_gradient("LSTM")
def _lstm(ctx, node, grads):
    rec = _Recurrence(ctx, node)
    b = rec.b
    c0_in, peep = optional_input(node, 6), optional_input(node, 7)
    c0 = rec.state(c0_in)
    _, rb = rec.biases()
    pre = b.op("Add", [rec.input_part(), rec.recurrent_part(rec.h_prev, rec.r, rb)])
    p_i, p_o, p_f, p_c = rec.gate_split(pre, [1, 1, 1, 1])
    g = rec.act(p_c, 1)
    peeps = rec.gate_split(b.unsqueeze(peep, [1]), [1, 1, 1]) if peep else None
    cells, i, f = _lstm_cells(rec, c0, p_i, p_f, g, peeps)
    c_prev = b.op("Concat", [b.unsqueeze(c0, [0]), b.op(
        "Slice", [cells, b.ints([0], hint="start"), b.ints([-1], hint="end"), b.ints([0])])],
        axis=0)
    if peeps:
        p_o = b.op("Add", [p_o, b.op("Mul", [peeps[1], cells])])
    o = rec.act(p_o, 0)
    hc = rec.act(cells, 2)
    # dH_t and dC_t to the pre-activations of step t, for all steps at once.
    k_o = b.op("Mul", [hc, rec.slope(o, 0)])
    k_c = b.op("Mul", [o, rec.slope(hc, 2)])
    k_i = b.op("Mul", [g, rec.slope(i, 0)])
    k_f = b.op("Mul", [c_prev, rec.slope(f, 0)])
    k_g = b.op("Mul", [i, rec.slope(g, 1)])
    k_cp = f
    if peeps:
        k_c = b.op("Add", [k_c, b.op("Mul", [k_o, peeps[1]])])
        k_cp = b.op("Sum", [f, b.op("Mul", [k_i, peeps[0]]), b.op("Mul", [k_f, peeps[2]])])
    k4 = rec.masked(b.op("Concat", [k_i, k_o, k_f, k_g], axis=-1), rec.zero)
    k_c = rec.masked(k_c, rec.zero)
    k_cp = rec.masked(k_cp, rec.one)  # padding: the cell state carries through
    d_y = rec.output_grad(grads[0]) or rec.zeros_y()
    d_h_last = rec.final_state_grad(grads[1] if len(grads) > 1 else None)
    d_c_last = rec.final_state_grad(grads[2] if len(grads) > 2 else None)
    r = rec.r

    def body(bb, states, steps):
        dy, k, kc, kcp, *mask = steps
        dh = bb.op("Add", [dy, states[0]])
        dc = bb.op("Add", [states[1], bb.op("Mul", [dh, kc])])
        d_pre = bb.op("Mul", [bb.op("Concat", [dc, dh, dc, dc], axis=-1), k])
        d_prev = bb.op("MatMul", [d_pre, r])
        if mask:  # padding: the state carries through
            d_prev = bb.op("Where", [mask[0], d_prev, dh])
        return [d_prev, bb.op("Mul", [dc, kcp])], [d_pre]

    d_h0, d_c0, d_pre = rec.scan(body, [d_h_last, d_c_last], [d_y, k4, k_c, k_cp]
                                 + rec.mask_step(), 1, reverse=True)
    result = rec.input_grads(d_pre, d_pre, [(d_pre, rec.h_prev)], d_h0)
    result.append(rec.state_back(d_c0) if ctx.needs(c0_in) else None)
    if ctx.needs(peep):
        d_i, d_o, d_f, _ = rec.gate_split(d_pre, [1, 1, 1, 1])
        parts = [b.reduce("ReduceSum", b.op("Mul", [dg, c]), [0, 2], keepdims=0)
                 for dg, c in ((d_i, c_prev), (d_o, cells), (d_f, c_prev))]
        result.append(b.op("Concat", parts, axis=1))
    return result


def _lstm_cells(rec, c0, p_i, p_f, g, peeps):
    """Cell states of every step (a forward Scan), and the input and forget gates."""
    b = rec.b
    steps = rec.mask_step()
    if peeps is None:
        # Without peepholes the gates do not depend on the cell state.
        i, f = rec.act(p_i, 0), rec.act(p_f, 0)

        def body(bb, states, xs):
            ft, ig, *mask = xs
            c = bb.op("Add", [bb.op("Mul", [ft, states[0]]), ig])
            if mask:
                c = bb.op("Where", [mask[0], c, states[0]])
            return [c], [c]

        _, cells = rec.scan(body, [c0], [f, b.op("Mul", [i, g])] + steps, 1, reverse=False)
        return cells, i, f
    pi, _, pf = peeps

    def body_peep(bb, states, xs):
        c_prev = states[0]
        pit, pft, gt, *mask = xs
        it = rec.act(bb.op("Add", [pit, bb.op("Mul", [pi, c_prev])]), 0, bb, axis=0)
        ft = rec.act(bb.op("Add", [pft, bb.op("Mul", [pf, c_prev])]), 0, bb, axis=0)
        c = bb.op("Add", [bb.op("Mul", [ft, c_prev]), bb.op("Mul", [it, gt])])
        if mask:
            c = bb.op("Where", [mask[0], c, c_prev])
        return [c], [c, it, ft]

    _, cells, i, f = rec.scan(body_peep, [c0], [p_i, p_f, g] + steps, 3, reverse=False)
    return cells, i, f
