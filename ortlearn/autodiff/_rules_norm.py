"""Gradients of Batch-, Layer-, Group- and InstanceNormalization.

Each of them normalises ``X`` over some axes, ``xhat = (X - mean) * invstd``
with ``invstd = 1 / sqrt(var + epsilon)`` (biased variance), then applies an
affine map. With ``gh`` the gradient of ``xhat`` and means taken over the
normalised axes, the gradient of ``X`` is

    invstd * (gh - mean(gh) - xhat * mean(gh * xhat))

(:func:`_normalized_input_grad`). The statistics are recomputed in the
backward pass in the input's type (ReduceMean, Sqrt: float64 kernels in
onnxruntime), except where the forward node can hand them over in that type
(LayerNormalization in float32).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from onnx import TensorProto

from ..graph import attr, optional_input
from ..graph.batch_norm import batch_norm_in_training_mode
from ._registry import register_gradient


class _Stats:
    """Batch statistics of ``x`` over ``axes`` (dims kept): mean, invstd and xhat."""

    def __init__(self, ctx, x: str, axes: Sequence[int] | str, epsilon: float,
                 mean: str | None = None, invstd: str | None = None, like: str | None = None):
        b = ctx.b
        like = like or x  # a value of x's type known to shape inference
        self.ctx, self.x, self.axes = ctx, x, axes
        if mean is None:
            mean = b.reduce("ReduceMean", x, axes, keepdims=1)
        self.mean = mean
        self.centered = b.op("Sub", [x, mean])
        if invstd is None:
            var = b.reduce("ReduceMean", b.op("Mul", [self.centered, self.centered]), axes,
                           keepdims=1)
            std = b.op("Sqrt", [b.op("Add", [var, ctx.const(epsilon, like=like)])])
            invstd = b.op("Reciprocal", [std])
        self.invstd = invstd
        self.xhat = b.op("Mul", [self.centered, invstd])

    def mean_of(self, value: str) -> str:
        return self.ctx.b.reduce("ReduceMean", value, self.axes, keepdims=1)


def _normalized_input_grad(ctx, stats: _Stats, gh: str) -> str:
    """Gradient of ``x`` from the gradient ``gh`` of ``xhat`` (the formula of the module)."""
    b = ctx.b
    proj = b.op("Mul", [stats.xhat, stats.mean_of(b.op("Mul", [gh, stats.xhat]))])
    centered = b.op("Sub", [b.op("Sub", [gh, stats.mean_of(gh)]), proj])
    return b.op("Mul", [centered, stats.invstd])


def _per_channel(ctx, value: str, rank: int) -> str:
    """A ``(C,)`` tensor as ``(C, 1, ..., 1)``: broadcast on axis 1 of a rank-``rank`` x."""
    return ctx.b.unsqueeze(value, list(range(1, rank - 1))) if rank > 2 else value


def _channel_sum(ctx, value: str, rank: int) -> str:
    """``value`` (of x's shape, channels on axis 1) summed to a ``(C,)`` tensor."""
    return ctx.b.reduce("ReduceSum", value, [0, *range(2, rank)], keepdims=0)


def _channel_count(ctx, x: str) -> str:
    """The number of elements of a channel of ``x`` (all axes but 1), of x's type."""
    shape = ctx.shape(x)
    if shape is not None and all(isinstance(d, int) for d in shape):
        return ctx.const(float(np.prod(shape) // shape[1]), like=x)
    b = ctx.b
    channels = b.op("Gather", [b.op("Shape", [x]), b.const(np.int64(1))])
    return b.op("Div", [ctx.size_as(x, x), b.cast(channels, ctx.dtype(x))])


def _check_unused_outputs(node, grads, first: int) -> None:
    """Refuse a gradient reaching outputs ``first``, ... (running or saved statistics)."""
    used = [node.output[i] for i in range(first, len(node.output)) if grads[i] is not None]
    if used:
        raise NotImplementedError(
            f"No gradient rule through the statistics outputs {used} of {node.op_type} node "
            f"{node.name!r}: only its output Y may lead to the loss. Compute the statistics "
            "you need with ReduceMean nodes instead.")


# ------------------------------------------------------------------ LayerNormalization
def _stash_outputs(ctx, node, x: str) -> tuple[str | None, str | None]:
    """The forward's Mean and InvStdDev, exposed if need be, when they have ``x``'s type.

    Their type is ``stash_type`` (float32 by default, also onnxruntime's
    for a float64 input): for another input type they are recomputed.
    """
    if attr(node, "stash_type", 1) != ctx.dtype(x) or ctx.dtype(x) != TensorProto.FLOAT:
        return None, None
    return (ctx.expose_output(node, 1, "layernorm_mean"),
            ctx.expose_output(node, 2, "layernorm_invstd"))


def _stat_output_grads(ctx, node, stats: _Stats, grads) -> list[str]:
    """Contributions to dX of gradients reaching LayerNormalization's Mean and InvStdDev."""
    b, x = ctx.b, stats.x
    extra = []
    for i in (1, 2):
        g = grads[i] if i < len(grads) else None
        if g is None:
            continue
        if ctx.dtype(node.output[i]) != ctx.dtype(x):
            g = b.cast(g, ctx.dtype(x))
        if i == 2:
            # d invstd / dx = -invstd**3 * (x - mean) / n = -invstd**2 * xhat / n
            sq = b.op("Mul", [stats.invstd, stats.invstd])
            g = b.op("Neg", [b.op("Mul", [g, sq])])
            term = b.op("Mul", [b.op("Expand", [g, ctx.shape_of(x)]), stats.xhat])
        else:
            term = b.op("Expand", [g, ctx.shape_of(x)])
        extra.append(b.op("Div", [term, _count(ctx, x, node.output[i])]))
    return extra


def _count(ctx, x: str, reduced: str) -> str:
    """Elements of ``x`` per element of ``reduced``, as a scalar of ``x``'s type."""
    return ctx.b.op("Div", [ctx.size_as(x, x), ctx.size_as(reduced, x)])


@register_gradient("LayerNormalization")
def _layer_normalization(ctx, node, grads):
    x, scale = node.input[:2]
    bias = optional_input(node, 2)
    rank = ctx.rank(x, node)
    axis = attr(node, "axis", -1) % rank
    axes = list(range(axis, rank))
    b, g = ctx.b, grads[0]
    mean, invstd = _stash_outputs(ctx, node, x) if g is not None else (None, None)
    stats = _Stats(ctx, x, axes, attr(node, "epsilon", 1e-5), mean, invstd)
    y_shape = ctx.shape(node.output[0])
    dx, dscale, dbias = None, None, None
    if g is not None:
        if ctx.needs(x):
            dx = _normalized_input_grad(ctx, stats, b.op("Mul", [g, scale]))
        if ctx.needs(scale):
            dscale = ctx.sum_to(b.op("Mul", [g, stats.xhat]), scale, y_shape)
        if ctx.needs(bias):
            dbias = ctx.sum_to(g, bias, y_shape)
    if ctx.needs(x):
        parts = ([dx] if dx else []) + _stat_output_grads(ctx, node, stats, grads)
        dx = ctx.accumulate(parts) if parts else None
    return [dx, dscale, dbias]


# ------------------------------------------------------------------ GroupNormalization
@register_gradient("GroupNormalization")
def _group_normalization(ctx, node, grads):
    """Opset 18: scale and bias per group; opset 21: per channel."""
    x, scale, bias = node.input[:3]
    rank = ctx.rank(x, node)
    groups = attr(node, "num_groups")
    b, g = ctx.b, grads[0]
    # Normalised over (C / G) * spatial elements: x seen as (N, G, -1).
    grouped_shape = b.ints([0, groups, -1], hint="shape")
    xg = b.op("Reshape", [x, grouped_shape])
    gg = b.op("Reshape", [g, grouped_shape])
    stats = _Stats(ctx, xg, [2], attr(node, "epsilon", 1e-5), like=x)
    per_channel = ctx.opset >= 21
    dx = dscale = dbias = None
    if per_channel:
        scale_c = _per_channel(ctx, scale, rank)
        if ctx.needs(x):
            gh = b.op("Reshape", [b.op("Mul", [g, scale_c]), grouped_shape])
            dx = ctx.reshape_like(_normalized_input_grad(ctx, stats, gh), x)
        if ctx.needs(scale):
            xhat = ctx.reshape_like(stats.xhat, x)
            dscale = _channel_sum(ctx, b.op("Mul", [g, xhat]), rank)
        if ctx.needs(bias):
            dbias = _channel_sum(ctx, g, rank)
        return [dx, dscale, dbias]
    scale_g = b.unsqueeze(scale, [1])  # (G, 1) against (N, G, K)
    if ctx.needs(x):
        gh = b.op("Mul", [gg, scale_g])
        dx = ctx.reshape_like(_normalized_input_grad(ctx, stats, gh), x)
    if ctx.needs(scale):
        dscale = b.reduce("ReduceSum", b.op("Mul", [gg, stats.xhat]), [0, 2], keepdims=0)
    if ctx.needs(bias):
        dbias = b.reduce("ReduceSum", gg, [0, 2], keepdims=0)
    return [dx, dscale, dbias]


# --------------------------------------------------------------- InstanceNormalization
@register_gradient("InstanceNormalization")
def _instance_normalization(ctx, node, grads):
    x, scale, bias = node.input[:3]
    rank = ctx.rank(x, node)
    b, g = ctx.b, grads[0]
    stats = _Stats(ctx, x, list(range(2, rank)), attr(node, "epsilon", 1e-5))
    dx = dscale = dbias = None
    if ctx.needs(x):
        dx = _normalized_input_grad(ctx, stats, b.op("Mul", [g, _per_channel(ctx, scale, rank)]))
    if ctx.needs(scale):
        dscale = _channel_sum(ctx, b.op("Mul", [g, stats.xhat]), rank)
    if ctx.needs(bias):
        dbias = _channel_sum(ctx, g, rank)
    return [dx, dscale, dbias]


# ------------------------------------------------------------------ BatchNormalization
@register_gradient("BatchNormalization")
def _batch_normalization(ctx, node, grads):
    x, scale, bias, mean, var = node.input[:5]
    rank = ctx.rank(x, node)
    _check_unused_outputs(node, grads, 1)
    if batch_norm_in_training_mode(node, ctx.opset):
        return _batch_norm_train(ctx, node, x, scale, rank, grads[0]) + [None, None]
    return _batch_norm_inference(ctx, node, rank, grads[0])


def _batch_norm_train(ctx, node, x, scale, rank, g):
    """Batch statistics over every axis but 1; the running statistics do not reach Y.

    The means of the module's formula are the bias's and the scale's gradients over the
    count ``M`` of a channel's elements: with ``s = sum(g)`` and ``t = sum(g * xhat)``
    per channel, ``dx = scale * invstd * (g - (s + xhat * t) / M)``. The two sums serve
    the three gradients: two passes over x's size fewer than the formula's means.
    """
    b = ctx.b
    stats = _Stats(ctx, x, [0, *range(2, rank)], attr(node, "epsilon", 1e-5))
    needs_x, needs_scale, needs_bias = ctx.needs(x), ctx.needs(scale), ctx.needs(node.input[2])
    dx = t = s = None
    if needs_x or needs_scale:
        t = _channel_sum(ctx, b.op("Mul", [g, stats.xhat]), rank)
    if needs_x or needs_bias:
        s = _channel_sum(ctx, g, rank)
    if needs_x:
        count = _channel_count(ctx, x)
        mean_g, mean_gx = (_per_channel(ctx, b.op("Div", [total, count]), rank)
                           for total in (s, t))
        centered = b.op("Sub", [g, b.op("Add", [b.op("Mul", [stats.xhat, mean_gx]), mean_g])])
        factor = b.op("Mul", [_per_channel(ctx, scale, rank), stats.invstd])
        dx = b.op("Mul", [centered, factor])
    return [dx, t if needs_scale else None, s if needs_bias else None]


def _batch_norm_inference(ctx, node, rank, g):
    """``Y = (X - mean) * scale * invstd + B``: an affine map per channel."""
    x, scale, bias, mean, var = node.input[:5]
    b = ctx.b
    std = b.op("Sqrt", [b.op("Add", [var, ctx.const(attr(node, "epsilon", 1e-5), like=var)])])
    invstd = b.op("Reciprocal", [std])
    factor = b.op("Mul", [scale, invstd])  # (C,)
    dx = dscale = dbias = dmean = dvar = None
    if ctx.needs(x):
        dx = b.op("Mul", [g, _per_channel(ctx, factor, rank)])
    if ctx.needs(bias):
        dbias = _channel_sum(ctx, g, rank)
    if ctx.needs(mean):
        dmean = b.op("Neg", [b.op("Mul", [_channel_sum(ctx, g, rank), factor])])
    if ctx.needs(scale) or ctx.needs(var):
        centered = b.op("Sub", [x, _per_channel(ctx, mean, rank)])
        g_centered = _channel_sum(ctx, b.op("Mul", [g, centered]), rank)  # (C,)
        if ctx.needs(scale):
            dscale = b.op("Mul", [g_centered, invstd])
        if ctx.needs(var):
            # d invstd / d var = -invstd**3 / 2
            cube = b.op("Mul", [invstd, b.op("Mul", [invstd, invstd])])
            half = b.op("Mul", [cube, ctx.const(-0.5, like=var)])
            dvar = b.op("Mul", [b.op("Mul", [g_centered, scale]), half])
    return [dx, dscale, dbias, dmean, dvar]
