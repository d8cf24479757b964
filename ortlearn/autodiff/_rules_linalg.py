"""Gradients of MatMul (batched, broadcast, 1-D operands) and Gemm."""

from __future__ import annotations

import numpy as np

from ..graph import attr, optional_input
from ._registry import register_gradient


def _batch_shape(ctx, node, n_batch, n_matrix_dims):
    """Static broadcast batch shape of a MatMul output (None per unknown dim)."""
    shape = ctx.shape(node.output[0])
    if shape is None or len(shape) != n_batch + n_matrix_dims:
        return [None] * n_batch
    return shape[:n_batch]


@register_gradient("MatMul")
def _matmul(ctx, node, grads):
    a, b = node.input
    g = grads[0]
    ra, rb = ctx.rank(a, node), ctx.rank(b, node)
    sa, sb = ctx.shape(a), ctx.shape(b)
    bld = ctx.b
    # Promote 1-D operands to matrices as MatMul does, and the gradient alike.
    a2 = bld.unsqueeze(a, [0]) if ra == 1 else a
    b2 = bld.unsqueeze(b, [1]) if rb == 1 else b
    if ra == 1 and rb == 1:
        g2 = bld.op("Reshape", [g, bld.ints([1, 1], hint="shape")])
    elif ra == 1:
        g2 = bld.unsqueeze(g, [-2])
    elif rb == 1:
        g2 = bld.unsqueeze(g, [-1])
    else:
        g2 = g
    rank = max(ra, rb, 2)
    batch = _batch_shape(ctx, node, rank - 2, (ra > 1) + (rb > 1))
    da = db = None
    if ctx.needs(a):
        da2 = bld.op("MatMul", [g2, ctx.transpose_last2(b2, max(rb, 2))])
        if ra == 1:  # drop the promoted row axis
            da2 = bld.squeeze(da2, [-2])
        da = ctx.sum_to(da2, a, batch + sa[-2:])
    if ctx.needs(b):
        db2 = bld.op("MatMul", [ctx.transpose_last2(a2, max(ra, 2)), g2])
        if rb == 1:  # drop the promoted column axis
            db2 = bld.squeeze(db2, [-1])
        db = ctx.sum_to(db2, b, batch + sb[-2:])
    return [da, db]


@register_gradient("Gemm")
def _gemm(ctx, node, grads):
    a, b = node.input[:2]
    c = optional_input(node, 2)
    g = grads[0]
    alpha, beta = attr(node, "alpha", 1.0), attr(node, "beta", 1.0)
    ta, tb = attr(node, "transA", 0), attr(node, "transB", 0)
    bld = ctx.b
    result = [None, None, None]
    if ctx.needs(a):
        # A' = op(A): dA' = alpha * g @ op(B)^T, transposed back when transA.
        if ta:
            result[0] = bld.op("Gemm", [b, g], alpha=alpha, transA=tb, transB=1)
        else:
            result[0] = bld.op("Gemm", [g, b], alpha=alpha, transB=1 - tb)
    if ctx.needs(b):
        if tb:
            result[1] = bld.op("Gemm", [g, a], alpha=alpha, transA=1, transB=ta)
        else:
            result[1] = bld.op("Gemm", [a, g], alpha=alpha, transA=1 - ta)
    if ctx.needs(c):
        scaled = g if beta == 1 else bld.op("Mul", [g, ctx.const(beta, like=c)])
        y_shape = ctx.shape(node.output[0]) or [None, None]
        result[2] = ctx.sum_to(scaled, c, y_shape)
    return result


# ---------------------------------------------------------------- Einsum
_ELLIPSIS = "."  # one token standing for "..." in a parsed term


def _einsum_terms(node):
    """``(input terms, output term)`` of an Einsum node, each a list of tokens.

    A token is a letter or ``'.'`` for the ellipsis. Without ``->`` (implicit
    mode) the output is the ellipsis, then the letters seen exactly once in
    alphabetical (ASCII) order, as numpy and onnxruntime define it.
    """
    eq = attr(node, "equation")
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")

    def tokens(term):
        return list(term.replace("...", _ELLIPSIS))

    terms = [tokens(t) for t in lhs.split(",")]
    if arrow:
        return terms, tokens(rhs)
    letters = [c for t in terms for c in t if c != _ELLIPSIS]
    out = [_ELLIPSIS] if any(_ELLIPSIS in t for t in terms) else []
    return terms, out + sorted(c for c in set(letters) if letters.count(c) == 1)


def _fresh_letters(used):
    import string
    return iter(c for c in string.ascii_letters if c not in used)


def _eye(ctx, x, axis):
    """Identity matrix of the length of ``x`` along ``axis``, in ``x``'s type."""
    b = ctx.b
    shape = ctx.shape(x)
    n = shape[axis] if shape is not None else None
    if isinstance(n, int):
        return ctx.const(np.eye(n), like=x)
    length = b.op("Gather", [ctx.shape_of(x), b.const(np.int64(axis))])
    every = b.op("Range", [b.const(np.int64(0)), length, b.const(np.int64(1))])
    return b.cast(b.op("Equal", [b.unsqueeze(every, [1]), every]), ctx.dtype(x))


class _Einsum:
    """One Einsum node, its terms resolved against the ranks of its operands."""

    def __init__(self, ctx, node):
        self.ctx, self.node = ctx, node
        self.terms, self.out = _einsum_terms(node)
        ranks = [ctx.rank(x, node) for x in node.input]
        #: rank of the ellipsis of each operand (0 without one)
        self.ell = [r - sum(t != _ELLIPSIS for t in term) if _ELLIPSIS in term else 0
                    for r, term in zip(ranks, self.terms)]
        self.sizes = {}  # letter -> static length (int or symbol), the first one known
        for j, x in enumerate(node.input):
            for label, dim in zip(self.axes(self.terms[j], self.ell[j]), ctx.shape(x)):
                if isinstance(label, str) and dim is not None:
                    self.sizes.setdefault(label, dim)

    @staticmethod
    def axes(term, n_ell):
        """One label per axis: a letter, or ``-k`` for the k-th ellipsis axis from the right."""
        labels = []
        for tok in term:
            labels.extend(range(-n_ell, 0) if tok == _ELLIPSIS else [tok])
        return labels

    def ellipsis_dim(self, pos, operands):
        """Static broadcast length of ellipsis axis ``pos`` (< 0) over ``operands``."""
        dims = [self.ctx.shape(self.node.input[j])[self.axes(self.terms[j], self.ell[j]).index(pos)]
                for j in operands if self.ell[j] >= -pos]
        if all(isinstance(d, int) for d in dims):
            return max(dims, default=1)
        known = {d for d in dims if d != 1}
        return known.pop() if len(known) == 1 and None not in known else None

    def grad(self, i, g):
        """Gradient of operand ``i``: an Einsum of ``g`` with the other operands."""
        ctx = self.ctx
        x, term = self.node.input[i], self.terms[i]
        others = [j for j in range(len(self.terms)) if j != i]
        fresh = _fresh_letters({t for t_ in self.terms for t in t_})
        # A letter repeated in the term (a diagonal, a trace) is written once
        # and its other occurrences get new letters tied to it by an identity
        # matrix: dX[a, b] = G[a] * eye[a, b].
        target, eyes, eye_terms = [], [], []
        for pos, tok in enumerate(term):
            if tok != _ELLIPSIS and tok in target:
                new = next(fresh)
                eyes.append(_eye(ctx, x, len(self.axes(term[:pos], self.ell[i]))))
                eye_terms.append([tok, new])
                self.sizes.setdefault(new, self.sizes.get(tok))
                tok = new
            target.append(tok)
        supply_terms = [self.out] + [self.terms[j] for j in others] + eye_terms
        supplied = {t for t_ in supply_terms for t in t_}
        # Letters no other operand carries (summed in the forward pass) are
        # broadcast afterwards: each letter of an Einsum output is in an input.
        out_term = [t for t in target if t in supplied]
        if _ELLIPSIS in supplied and _ELLIPSIS not in out_term:
            # onnxruntime wants the ellipsis in the output when an input has
            # one: keep it, and sum it away afterwards.
            out_term.insert(0, _ELLIPSIS)
        # The ellipsis of the result: the output's (all operands'), or the others'.
        ell_from = list(range(len(self.terms))) if _ELLIPSIS in self.out else [
            j for j in others if _ELLIPSIS in self.terms[j]]
        r_ell = max((self.ell[j] for j in ell_from), default=0)
        inputs = [g] + [self.node.input[j] for j in others] + eyes
        r = g
        if len(inputs) > 1 or out_term != self.out:
            def text(t):
                return "".join(t).replace(_ELLIPSIS, "...")
            r = ctx.b.op("Einsum", inputs, equation=",".join(map(text, supply_terms))
                         + "->" + text(out_term))
        r_axes = self.axes(out_term, r_ell)
        rshape = [self.sizes.get(a) if isinstance(a, str) else self.ellipsis_dim(a, ell_from)
                  for a in r_axes]
        return self._fit(r, x, self.axes(target, self.ell[i]), r_axes, rshape)

    def _fit(self, r, x, x_axes, r_axes, rshape):
        """``r`` (axes labelled ``r_axes``, static shape ``rshape``) summed and
        broadcast to the shape of ``x`` (axes labelled ``x_axes``)."""
        ctx, b = self.ctx, self.ctx.b
        # Ellipsis axes x lacks (x broadcast against a longer ellipsis): summed.
        extra = [k for k, a in enumerate(r_axes) if a not in x_axes]
        if extra:
            r = b.reduce("ReduceSum", r, extra, keepdims=0)
            rshape = [d for k, d in enumerate(rshape) if k not in extra]
            r_axes = [a for a in r_axes if a in x_axes]
        missing = [k for k, a in enumerate(x_axes) if a not in r_axes]
        if missing:
            r = b.unsqueeze(r, missing)
            for k in missing:
                rshape.insert(k, 1)
        # Axes where r has length 1 and x not: x was summed there in the forward pass.
        xshape = ctx.shape(x)
        wide = [k for k, (dr, dx) in enumerate(zip(rshape, xshape)) if dx != 1 and dr != dx]
        if wide:
            r = ctx.expand_like(r, x, wide)
            rshape = [dx if k in wide else dr for k, (dr, dx) in enumerate(zip(rshape, xshape))]
        return ctx.sum_to(r, x, rshape)


@register_gradient("Einsum")
def _einsum(ctx, node, grads):
    es = _Einsum(ctx, node)
    return [es.grad(i, grads[0]) if ctx.needs(x) else None for i, x in enumerate(node.input)]
