"""Gradients of the Reduce* operators (axes as attribute or input, keepdims, noop)."""

from __future__ import annotations

import numpy as np

from ..graph import attr, optional_input
from ._registry import register_gradient


class _Reduction:
    """How a Reduce* node maps its input to its output, for the backward pass."""

    def __init__(self, ctx, node):
        self.ctx, self.node = ctx, node
        self.x, self.y = node.input[0], node.output[0]
        self.keepdims = attr(node, "keepdims", 1)
        self.axes_input = optional_input(node, 1)
        if self.axes_input is None:
            axes = attr(node, "axes")
        else:
            axes = ctx.constant_value(self.axes_input)
        self.axes = None if axes is None else [int(a) for a in np.ravel(axes)]
        dynamic = self.axes_input is not None and self.axes is None
        #: no axes given: every axis is reduced, or none with noop_with_empty_axes=1
        #: (onnxruntime then still applies the elementwise part: |x| for ReduceL2,
        #: x**2 for ReduceSumSquare; the formulas below cover that case too)
        self.no_axes = not dynamic and not self.axes
        self.identity = self.no_axes and bool(attr(node, "noop_with_empty_axes", 0))

    def kept(self, value: str) -> str:
        """``value`` (of the output's shape) reshaped to broadcast against the input."""
        ctx = self.ctx
        if self.keepdims or self.no_axes:
            return value  # reduced dims already kept, or a scalar (all axes)
        if self.axes is not None:
            return ctx.b.unsqueeze(value, self.axes)
        kept_shape = ctx.b.op("Shape", [self.reduce_like("ReduceSum", self.x)])
        return ctx.b.op("Reshape", [value, kept_shape])

    def reduce_like(self, op_type: str, value: str) -> str:
        """``value`` reduced over the node's axes, keeping dims."""
        if self.identity:
            return value
        axes = self.axes_input if self.axes is None else (self.axes or None)
        if axes is None:
            return self.ctx.b.reduce(op_type, value, None, keepdims=1)
        # noop_with_empty_axes exists where axes is an input (ReduceSum from
        # opset 13, the others from 18); axes are not empty here anyway.
        noop = {}
        if op_type == "ReduceSum" or self.ctx.opset >= 18:
            noop["noop_with_empty_axes"] = attr(self.node, "noop_with_empty_axes", 0)
        return self.ctx.b.reduce(op_type, value, axes, keepdims=1, **noop)

    def expand(self, value: str) -> str:
        """``value`` (the output's shape, dims kept) broadcast to the input's shape."""
        if self.identity:
            return value
        if self.axes is None and not self.no_axes:  # axes known at run time only
            return self.ctx.b.op("Expand", [value, self.ctx.shape_of(self.x)])
        return self.ctx.expand_like(value, self.x, None if self.no_axes else self.axes,
                                    same_rank=bool(self.keepdims) or not self.no_axes)

    def count(self) -> str:
        """Number of input elements per output element, in the input's type."""
        ctx = self.ctx
        sx, sy = ctx.shape(self.x), ctx.shape(self.y)
        if sx is not None and sy is not None and all(isinstance(d, int) for d in sx + sy):
            return ctx.const(np.prod(sx) / np.prod(sy), like=self.x)
        n_x = ctx.size_as(self.x, self.x)
        if sy is not None and all(isinstance(d, int) for d in sy):
            # a known output size (1 for a full reduction): no Size of the output at run time
            n_y = int(np.prod(sy, dtype=np.int64))
            return n_x if n_y == 1 else ctx.b.op("Div", [n_x, ctx.const(n_y, like=self.x)])
        return ctx.b.op("Div", [n_x, ctx.size_as(self.y, self.x)])


def _reduction(op_type):
    def decorator(fn):
        @register_gradient(op_type)
        def rule(ctx, node, grads):
            red = _Reduction(ctx, node)
            return [fn(ctx, red, red.kept(grads[0])), None]
        return fn
    return decorator


@_reduction("ReduceSum")
def _reduce_sum(ctx, red, g):
    return red.expand(g)


@_reduction("ReduceMean")
def _reduce_mean(ctx, red, g):
    return red.expand(ctx.b.op("Div", [g, red.count()]))


@_reduction("ReduceSumSquare")
def _reduce_sum_square(ctx, red, g):
    # x * (2 g): g has the output's shape, so one product the size of x, not two;
    # doubling is exact, the same values as (2 x) * g.
    return ctx.b.op("Mul", [red.x, ctx.b.op("Mul", [g, ctx.const(2, like=red.x)])])


@_reduction("ReduceL1")
def _reduce_l1(ctx, red, g):
    return ctx.b.op("Mul", [ctx.b.op("Sign", [red.x]), g])


@_reduction("ReduceL2")
def _reduce_l2(ctx, red, g):
    return ctx.b.op("Mul", [ctx.b.op("Div", [red.x, red.kept(red.y)]), g])


@_reduction("ReduceLogSumExp")
def _reduce_log_sum_exp(ctx, red, g):
    soft = ctx.b.op("Exp", [ctx.b.op("Sub", [red.x, red.kept(red.y)])])
    return ctx.b.op("Mul", [soft, g])


def _extremum(ctx, red, g):
    # Ties share the gradient equally.
    b = ctx.b
    hit = b.cast(b.op("Equal", [red.x, red.kept(red.y)]), ctx.dtype(red.x))
    share = b.op("Div", [hit, red.reduce_like("ReduceSum", hit)])
    return b.op("Mul", [share, g])


_reduction("ReduceMax")(_extremum)
_reduction("ReduceMin")(_extremum)


@_reduction("ReduceProd")
def _reduce_prod(ctx, red, g):
    """d prod / d x_i = product of the other elements, exactly, zeros included.

    Without a zero in the group it is ``prod / x_i``; with one zero, the
    zero gets the product of the others and the rest 0; with more, all 0.
    """
    b, x = ctx.b, red.x
    zero = b.op("Equal", [x, ctx.const(0, like=x)])
    safe = b.op("Where", [zero, ctx.const(1, like=x), x])
    rest = red.reduce_like("ReduceProd", safe)  # product of the nonzero elements
    zeros = red.reduce_like("ReduceSum", b.cast(zero, ctx.dtype(x)))
    none = b.op("Equal", [zeros, ctx.const(0, like=x)])
    one = b.op("Equal", [zeros, ctx.const(1, like=x)])
    at_zero = ctx.mask_where(one, rest, x)
    elsewhere = ctx.mask_where(none, b.op("Div", [rest, safe]), x)
    return b.op("Mul", [b.op("Where", [zero, at_zero, elsewhere]), g])
