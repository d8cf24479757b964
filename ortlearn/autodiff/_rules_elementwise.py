"""Gradients of the broadcasting arithmetic operators and of Where/Clip/Max/Min."""

from __future__ import annotations

import math

from ..graph import optional_input
from ._registry import register_gradient


def _out_shape(ctx, node):
    return ctx.shape(node.output[0])


@register_gradient("Add", "Sum")
def _add(ctx, node, grads):
    shape = _out_shape(ctx, node)
    return [ctx.sum_to(grads[0], x, shape) if ctx.needs(x) else None for x in node.input]


@register_gradient("Mean")
def _mean(ctx, node, grads):
    y = node.output[0]
    g = ctx.b.op("Div", [grads[0], ctx.const(len(node.input), like=y)])
    return [ctx.sum_to(g, x, ctx.shape(y)) if ctx.needs(x) else None for x in node.input]


@register_gradient("Sub")
def _sub(ctx, node, grads):
    a, b = node.input
    shape = _out_shape(ctx, node)
    return [ctx.sum_to(grads[0], a, shape) if ctx.needs(a) else None,
            ctx.sum_to(ctx.b.op("Neg", [grads[0]]), b, shape) if ctx.needs(b) else None]


@register_gradient("Mul")
def _mul(ctx, node, grads):
    a, b = node.input
    shape, g = _out_shape(ctx, node), grads[0]
    if a == b:
        # x * x: g * (x + x) is bit for bit g * x + g * x (doubling is exact), in
        # two nodes instead of three, the scalar g of a mean multiplied once
        return [ctx.sum_to(ctx.b.op("Mul", [g, ctx.b.op("Add", [a, a])]), a, shape)
                if ctx.needs(a) else None, None]
    return [ctx.sum_to(ctx.b.op("Mul", [g, b]), a, shape) if ctx.needs(a) else None,
            ctx.sum_to(ctx.b.op("Mul", [g, a]), b, shape) if ctx.needs(b) else None]


@register_gradient("Div")
def _div(ctx, node, grads):
    a, b = node.input
    y, g = node.output[0], grads[0]
    shape = ctx.shape(y)
    da = db = None
    if ctx.needs(a):
        da = ctx.sum_to(ctx.b.op("Div", [g, b]), a, shape)
    if ctx.needs(b):
        # d(a/b)/db = -y/b
        db = ctx.sum_to(ctx.b.op("Neg", [ctx.b.op("Mul", [g, ctx.b.op("Div", [y, b])])]), b, shape)
    return [da, db]


@register_gradient("Pow")
def _pow(ctx, node, grads):
    x, e = node.input
    y, g = node.output[0], grads[0]
    shape = ctx.shape(y)
    dx = de = None
    if ctx.needs(x):
        ef = e if ctx.dtype(e) == ctx.dtype(x) else ctx.b.cast(e, ctx.dtype(x))
        lowered = ctx.b.op("Sub", [ef, ctx.const(1, like=x)])
        slope = ctx.b.op("Mul", [ef, ctx.b.op("Pow", [x, lowered])])
        dx = ctx.sum_to(ctx.b.op("Mul", [g, slope]), x, shape)
    if ctx.needs(e):
        # d(x**e)/de = y * log(x), defined for x > 0
        xe = x if ctx.dtype(e) == ctx.dtype(x) else ctx.b.cast(x, ctx.dtype(e))
        ye = y if ctx.dtype(e) == ctx.dtype(y) else ctx.b.cast(y, ctx.dtype(e))
        ge = g if ctx.dtype(e) == ctx.dtype(y) else ctx.b.cast(g, ctx.dtype(e))
        slope = ctx.b.op("Mul", [ye, ctx.b.op("Log", [xe])])
        de = ctx.sum_to(ctx.b.op("Mul", [ge, slope]), e, shape)
    return [dx, de]


@register_gradient("Neg")
def _neg(ctx, node, grads):
    return [ctx.b.op("Neg", [grads[0]])]


@register_gradient("Identity")
def _identity(ctx, node, grads):
    return [grads[0]]


@register_gradient("Where")
def _where(ctx, node, grads):
    cond, a, b = node.input
    y, g = node.output[0], grads[0]
    shape = ctx.shape(y)
    zero = ctx.const(0, like=y)
    da = db = None
    if ctx.needs(a):
        da = ctx.sum_to(ctx.b.op("Where", [cond, g, zero]), a, shape)
    if ctx.needs(b):
        db = ctx.sum_to(ctx.b.op("Where", [cond, zero, g]), b, shape)
    return [None, da, db]


@register_gradient("Clip")
def _clip(ctx, node, grads):
    x, g = node.input[0], grads[0]
    lo, hi = optional_input(node, 1), optional_input(node, 2)
    b = ctx.b
    # torch exports clamp and hardtanh (nn.ReLU6, nn.Hardtanh) alike, as Clip,
    # but differentiates them differently at the bounds: clamp passes the
    # gradient to x where lo <= x <= hi, hardtanh only where lo < x < hi. A Clip
    # with two bounds, neither trained, follows hardtanh (ReLU6 is what
    # networks hold; clamp(x, lo, hi) differs from torch at x == lo or hi only);
    # any other follows clamp (clamp_min and clamp_max have one bound, and
    # hardtanh has no tensor bounds).
    strict = lo is not None and hi is not None and not ctx.needs(lo) and not ctx.needs(hi)
    inside = None
    for bound, cmp in ((lo, "Greater" if strict else "GreaterOrEqual"),
                       (hi, "Less" if strict else "LessOrEqual")):
        if bound is not None:
            ok = b.op(cmp, [x, bound])
            inside = ok if inside is None else b.op("And", [inside, ok])
    result = [grads[0] if inside is None else ctx.mask_where(inside, g, x)]
    # A trained bound gets the gradient where it clips, strictly (torch's clamp).
    for bound, cmp in ((lo, "Less"), (hi, "Greater")):
        if ctx.needs(bound):
            clipped = ctx.mask_where(b.op(cmp, [x, bound]), g, x)
            result.append(b.reduce("ReduceSum", clipped, None, keepdims=0))
        else:
            result.append(None)
    return result


@register_gradient("Max", "Min")
def _max_min(ctx, node, grads):
    """The inputs equal to the result share its gradient equally (torch's ``maximum`` and
    ``minimum`` give each of two tied inputs half)."""
    y, g = node.output[0], grads[0]
    shape = ctx.shape(y)
    b = ctx.b
    hits = [b.op("Equal", [x, y]) for x in node.input]
    if len(hits) > 1:
        count = b.op("Sum", [b.cast(hit, ctx.dtype(y)) for hit in hits])
        g = b.op("Div", [g, count])
    return [ctx.sum_to(ctx.mask_where(hit, g, y), x, shape) if ctx.needs(x) else None
            for x, hit in zip(node.input, hits)]


def _unary(op_type):
    """Register ``fn(ctx, x, y, g) -> dx`` as the rule of a one-input operator."""
    def decorator(fn):
        @register_gradient(op_type)
        def rule(ctx, node, grads):
            return [fn(ctx, node, node.input[0], node.output[0], grads[0])]
        return fn
    return decorator


@_unary("Sqrt")
def _sqrt(ctx, node, x, y, g):
    return ctx.b.op("Div", [ctx.b.op("Mul", [g, ctx.const(0.5, like=y)]), y])


@_unary("Reciprocal")
def _reciprocal(ctx, node, x, y, g):
    return ctx.b.op("Neg", [ctx.b.op("Mul", [g, ctx.b.op("Mul", [y, y])])])


@_unary("Exp")
def _exp(ctx, node, x, y, g):
    return ctx.b.op("Mul", [g, y])


@_unary("Log")
def _log(ctx, node, x, y, g):
    return ctx.b.op("Div", [g, x])


#: One-input operators whose slope is another operator of the input:
#: dx = g * slope(x). Abs: sign(0) = 0, no gradient at 0, as torch's abs
#: backward (grad * sgn(x)); Sign has float32 and float64 kernels.
_SLOPES = {"Abs": "Sign", "Sin": "Cos", "Sinh": "Cosh", "Cosh": "Sinh"}


def _times_slope(slope_op):
    def rule(ctx, node, x, y, g):
        return ctx.b.op("Mul", [g, ctx.b.op(slope_op, [x])])
    return rule


for _op, _slope_op in _SLOPES.items():
    _unary(_op)(_times_slope(_slope_op))


@_unary("Cos")
def _cos(ctx, node, x, y, g):
    return ctx.b.op("Neg", [ctx.b.op("Mul", [g, ctx.b.op("Sin", [x])])])


@_unary("Tan")
def _tan(ctx, node, x, y, g):
    # 1 + tan(x)^2 from the output, as torch
    return ctx.b.op("Mul", [g, ctx.b.op("Add", [ctx.const(1, like=y), ctx.b.op("Mul", [y, y])])])


def _one_and_square(ctx, x, op):
    """``1 + x^2`` (``op='Add'``) or ``1 - x^2`` (``op='Sub'``)."""
    return ctx.b.op(op, [ctx.const(1, like=x), ctx.b.op("Mul", [x, x])])


def _over_root(ctx, g, radicand):
    return ctx.b.op("Div", [g, ctx.b.op("Sqrt", [radicand])])


@_unary("Asin")
def _asin(ctx, node, x, y, g):
    return _over_root(ctx, g, _one_and_square(ctx, x, "Sub"))


@_unary("Acos")
def _acos(ctx, node, x, y, g):
    return ctx.b.op("Neg", [_over_root(ctx, g, _one_and_square(ctx, x, "Sub"))])


@_unary("Asinh")
def _asinh(ctx, node, x, y, g):
    return _over_root(ctx, g, _one_and_square(ctx, x, "Add"))


@_unary("Acosh")
def _acosh(ctx, node, x, y, g):
    square = ctx.b.op("Mul", [x, x])
    return _over_root(ctx, g, ctx.b.op("Sub", [square, ctx.const(1, like=x)]))


@_unary("Atan")
def _atan(ctx, node, x, y, g):
    return ctx.b.op("Div", [g, _one_and_square(ctx, x, "Add")])


@_unary("Atanh")
def _atanh(ctx, node, x, y, g):
    return ctx.b.op("Div", [g, _one_and_square(ctx, x, "Sub")])


@_unary("Erf")
def _erf(ctx, node, x, y, g):
    b = ctx.b
    gauss = b.op("Exp", [b.op("Neg", [b.op("Mul", [x, x])])])
    return b.op("Mul", [b.op("Mul", [g, ctx.const(2 / math.sqrt(math.pi), like=x)]), gauss])


@register_gradient("Cast")
def _cast(ctx, node, grads):
    x = node.input[0]
    if not ctx.needs(x):
        return [None]
    return [ctx.b.cast(grads[0], ctx.dtype(x))]


@register_gradient("CastLike")
def _cast_like(ctx, node, grads):
    # The dynamo exporter writes CastLike for masked_fill (Where(mask, CastLike(fill,
    # scores), scores)) and the constants of hardswish, mean...: ``like`` gives only a
    # type and gets no gradient.
    return [*_cast(ctx, node, grads), None]
