"""Gradients of the activation functions.

Written with operators onnxruntime has float64 kernels for wherever the forward
operator has one (Relu, Sigmoid, Tanh...); Gelu and Mish, which onnxruntime
cannot run in float64 anyway, use Erf and Softplus.
"""

from __future__ import annotations

import math

import numpy as np

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
    beta = attr(node, "beta", 0.5)
    if alpha == 0:
        return ctx.zeros_like(x)
    # The slope is alpha strictly between the kinks, 0 at and beyond them, as
    # torch's hardsigmoid backward has it (0 at x = -3 and x = 3). The kinks are
    # computed in float32, the precision of the attributes: torch exports
    # alpha = float32(1/6), beta = 0.5, whose kinks are then exactly -3 and 3
    # (in float64 they would be 3 * (1 - 3e-8)). A mask read from the output
    # would also be wrong near the kinks in float32, where alpha * x + beta
    # rounds to 0 or 1 for x inside.
    one, a, b0 = np.float32(1), np.float32(alpha), np.float32(beta)
    lo, hi = sorted([-b0 / a, (one - b0) / a])
    b = ctx.b
    inside = b.op("And", [b.op("Greater", [x, ctx.const(lo, like=x)]),
                          b.op("Less", [x, ctx.const(hi, like=x)])])
    return ctx.mask_where(inside, b.op("Mul", [g, ctx.const(alpha, like=x)]), x)


@_activation("HardSwish")
def _hard_swish(ctx, node, x, y, g):
    # y = x * HardSigmoid(x; 1/6, 1/2): slope x/3 + 1/2 for -3 < x < 3, 0 for
    # x <= -3, 1 for x >= 3. The slope jumps at both kinks (-1/2 | 0 and
    # 3/2 | 1): at x = -3 it is 0 and at x = 3 it is 1, as torch's hardswish
    # backward has it.
    b = ctx.b
    inner = b.op("Add", [b.op("Div", [x, ctx.const(3, like=x)]), ctx.const(0.5, like=x)])
    upper = b.op("Where", [b.op("Less", [x, ctx.const(3, like=x)]),
                           b.op("Mul", [g, inner]), g])
    return ctx.mask_where(b.op("Greater", [x, ctx.const(-3, like=x)]), upper, x)


@register_gradient("PRelu")
def _prelu(ctx, node, grads):
    x, slope = node.input
    g = grads[0]
    b = ctx.b
    # At x = 0 the slope side, as torch's prelu backward: dx = slope * g and
    # dslope = x * g = 0.
    pos = _positive(ctx, x)
    dx = dslope = None
    if ctx.needs(x):
        dx = b.op("Where", [pos, g, b.op("Mul", [g, slope])])
    if ctx.needs(slope):
        # The slope broadcasts to x (per channel [C, 1, 1] from torch's
        # TorchScript exporter, [1, C, 1, 1] from dynamo, a scalar, or full):
        # its gradient is summed over the broadcast axes.
        neg = b.op("Where", [pos, ctx.const(0, like=x), b.op("Mul", [g, x])])
        dslope = ctx.sum_to(neg, slope, ctx.shape(node.output[0]))
    return [dx, dslope]


@_activation("Celu")
def _celu(ctx, node, x, y, g):
    # slope 1 for x > 0, exp(x / alpha) for x <= 0 (1 at 0 on both sides);
    # exp of x itself, not y / alpha + 1, which cancels for x << 0.
    alpha = attr(node, "alpha", 1.0)
    b = ctx.b
    neg = b.op("Mul", [g, b.op("Exp", [b.op("Div", [x, ctx.const(alpha, like=x)])])])
    return b.op("Where", [_positive(ctx, x), g, neg])


@_activation("Mish")
def _mish(ctx, node, x, y, g):
    # y = x * tanh(softplus(x)): slope t + x * sigmoid(x) * (1 - t^2), t = tanh(softplus(x))
    b = ctx.b
    t = b.op("Tanh", [b.op("Softplus", [x])])
    one_minus = b.op("Sub", [ctx.const(1, like=x), b.op("Mul", [t, t])])
    second = b.op("Mul", [b.op("Mul", [x, b.op("Sigmoid", [x])]), one_minus])
    return b.op("Mul", [g, b.op("Add", [t, second])])


@_activation("ThresholdedRelu")
def _thresholded_relu(ctx, node, x, y, g):
    # y = x where x > alpha, else 0; no gradient at x = alpha, as torch's threshold.
    alpha = attr(node, "alpha", 1.0)
    return ctx.mask_where(ctx.b.op("Greater", [x, ctx.const(alpha, like=x)]), g, x)


@_activation("Gelu")
def _gelu(ctx, node, x, y, g):
    approximate = attr(node, "approximate", "none")
    if approximate == "none":
        slope = _gelu_erf_slope(ctx, x)
    elif approximate == "tanh":
        slope = _gelu_tanh_slope(ctx, x)
    else:
        raise ValueError(
            f"Gelu node {node.name!r}: approximate={approximate!r} is neither 'none' nor "
            "'tanh', the two values ONNX defines; fix the attribute.")
    return ctx.b.op("Mul", [g, slope])


def _gelu_erf_slope(ctx, x):
    """Phi(x) + x * phi(x), as torch's gelu backward computes it."""
    b = ctx.b
    cdf = b.op("Mul", [ctx.const(0.5, like=x), b.op("Add", [
        ctx.const(1, like=x), b.op("Erf", [b.op("Mul", [x, ctx.const(math.sqrt(0.5), like=x)])])])])
    gauss = b.op("Exp", [b.op("Mul", [b.op("Mul", [x, x]), ctx.const(-0.5, like=x)])])
    pdf = b.op("Mul", [gauss, ctx.const(1 / math.sqrt(2 * math.pi), like=x)])
    return b.op("Add", [cdf, b.op("Mul", [x, pdf])])


def _gelu_tanh_slope(ctx, x):
    """Slope of 0.5 * x * (1 + tanh(k * (x + 0.044715 * x^3))), k = sqrt(2 / pi)."""
    b = ctx.b
    k, kappa = math.sqrt(2 / math.pi), 0.044715
    x2 = b.op("Mul", [x, x])
    cube = b.op("Mul", [x2, x])
    inner = b.op("Mul", [ctx.const(k, like=x),
                         b.op("Add", [x, b.op("Mul", [cube, ctx.const(kappa, like=x)])])])
    t = b.op("Tanh", [inner])
    left = b.op("Mul", [ctx.const(0.5, like=x), b.op("Add", [ctx.const(1, like=x), t])])
    sech2 = b.op("Sub", [ctx.const(1, like=x), b.op("Mul", [t, t])])
    dinner = b.op("Add", [ctx.const(1, like=x), b.op("Mul", [x2, ctx.const(3 * kappa, like=x)])])
    right = b.op("Mul", [b.op("Mul", [b.op("Mul", [x, ctx.const(0.5 * k, like=x)]), sech2]),
                         dinner])
    return b.op("Add", [left, right])


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
