"""Gradients of the activation functions (written with float64-capable kernels)."""

from __future__ import annotations

from ..graph import attr
from ._registry import register_gradient


def _activation(*op_types):
    """Register ``fn(ctx, node, x, y, g) -> dx`` for one-input activations."""
    def decorator(fn):
        @register_gradient(*op_types)
        def rule(ctx, node, grads):
            return [fn(ctx, node, node.input[0], node.output[0], grads[0])]
        return fn
    return decorator


def _positive(ctx, x):
    return ctx.b.op("Greater", [x, ctx.const(0, like=x)])


@_activation("Relu")
def _relu(ctx, node, x, y, g):
    # y > 0 exactly where x > 0: the mask from the output leaves the
    # pre-activation to the forward alone, so onnxruntime fuses Gemm + Relu.
    return ctx.mask_where(_positive(ctx, y), g, x)


@_activation("LeakyRelu")
def _leaky_relu(ctx, node, x, y, g):
    alpha = attr(node, "alpha", 0.01)
    return ctx.b.op("Where", [_positive(ctx, x), g, ctx.b.op("Mul", [g, ctx.const(alpha, like=x)])])


@_activation("Elu")
def _elu(ctx, node, x, y, g):
    # for x <= 0, y = alpha * (exp(x) - 1) so dy/dx = y + alpha
    alpha = attr(node, "alpha", 1.0)
    neg = ctx.b.op("Mul", [g, ctx.b.op("Add", [y, ctx.const(alpha, like=x)])])
    return ctx.b.op("Where", [_positive(ctx, x), g, neg])


@_activation("Selu")
def _selu(ctx, node, x, y, g):
    alpha = attr(node, "alpha", 1.67326319217681884765625)
    gamma = attr(node, "gamma", 1.05070102214813232421875)
    pos = ctx.b.op("Mul", [g, ctx.const(gamma, like=x)])
    neg = ctx.b.op("Mul", [g, ctx.b.op("Add", [y, ctx.const(alpha * gamma, like=x)])])
    return ctx.b.op("Where", [_positive(ctx, x), pos, neg])


@_activation("Tanh")
def _tanh(ctx, node, x, y, g):
    one_minus = ctx.b.op("Sub", [ctx.const(1, like=y), ctx.b.op("Mul", [y, y])])
    return ctx.b.op("Mul", [g, one_minus])


@_activation("Sigmoid")
def _sigmoid(ctx, node, x, y, g):
    slope = ctx.b.op("Mul", [y, ctx.b.op("Sub", [ctx.const(1, like=y), y])])
    return ctx.b.op("Mul", [g, slope])


@_activation("Softplus")
def _softplus(ctx, node, x, y, g):
    return ctx.b.op("Mul", [g, ctx.b.op("Sigmoid", [x])])


@_activation("Softsign")
def _softsign(ctx, node, x, y, g):
    denom = ctx.b.op("Add", [ctx.const(1, like=x), ctx.b.op("Abs", [x])])
    return ctx.b.op("Div", [g, ctx.b.op("Mul", [denom, denom])])


@_activation("HardSigmoid")
def _hard_sigmoid(ctx, node, x, y, g):
    alpha = attr(node, "alpha", 0.2)
    b = ctx.b
    inside = b.op("And", [b.op("Greater", [y, ctx.const(0, like=y)]),
                          b.op("Less", [y, ctx.const(1, like=y)])])
    return ctx.mask_where(inside, b.op("Mul", [g, ctx.const(alpha, like=x)]), x)


@_activation("Softmax")
def _softmax(ctx, node, x, y, g):
    axis = attr(node, "axis", -1)
    b = ctx.b
    dot = b.reduce("ReduceSum", b.op("Mul", [g, y]), [axis], keepdims=1)
    return b.op("Mul", [y, b.op("Sub", [g, dot])])


@_activation("LogSoftmax")
def _log_softmax(ctx, node, x, y, g):
    axis = attr(node, "axis", -1)
    if axis < 0 and ctx.rank(x):
        axis += ctx.rank(x)
    b = ctx.b
    total = ctx.axis_sum(g, axis)  # after a one-hot GatherElements: known, no node
    return b.op("Sub", [g, b.op("Mul", [b.op("Exp", [y]), total])])
