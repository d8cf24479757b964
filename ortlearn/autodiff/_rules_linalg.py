"""Gradients of MatMul (batched, broadcast, 1-D operands) and Gemm."""

from __future__ import annotations

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
