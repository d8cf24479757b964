"""Gradients of convolutions: Conv and ConvTranspose (1-D/2-D/3-D, groups, every attribute).

Both operators are differentiated with the two operators themselves, which
onnxruntime runs fast (in float32 only, as the forward):

- the gradient of a Conv input is a ConvTranspose of the output gradient
  with the same weight, and the gradient of a ConvTranspose input a Conv;
- the gradient of a weight is the correlation of the input with the output
  gradient, itself a Conv in which the batch axis plays the channel axis and
  strides and dilations trade places; groups go through a reshape of the
  data so that one grouped Conv correlates each group with its own slice;
- the gradient of a bias sums the output gradient over all but the channel axis.

Every padding mode is first turned into explicit pads, by onnxruntime's
rules. They are the ONNX specification's but for a ConvTranspose whose output
would be longer than its full output: with ``output_shape``, onnxruntime
extends the output with zeros at the end (a negative end pad here); with
``auto_pad`` SAME, it keeps the full output. A negative pad becomes a Slice.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..graph import attr, optional_input
from ._registry import register_gradient

_INT64_MAX = np.iinfo(np.int64).max


class _Geometry(NamedTuple):
    """Static attributes of one Conv or ConvTranspose node, one entry per spatial axis."""

    kernel: list
    strides: list
    dilations: list
    group: int

    @property
    def reach(self) -> list:
        """Span of one window: ``(kernel - 1) * dilation + 1``."""
        return [(k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations)]

    def conv_attrs(self, begins, ends) -> dict:
        return {"group": self.group, "strides": self.strides, "dilations": self.dilations,
                "pads": list(begins) + list(ends)}


def _geometry(ctx, node, w) -> _Geometry:
    shape = ctx.shape(w)
    kernel = attr(node, "kernel_shape")
    if shape is not None and all(isinstance(d, int) for d in shape[2:]):
        kernel = shape[2:]
    if kernel is None:
        raise ValueError(
            f"The gradient of {node.op_type} node {node.name!r} needs the kernel shape: "
            f"the spatial dimensions of the weight {w!r} are unknown and the node has no "
            "kernel_shape attribute. Give the weight a static shape.")
    k = len(kernel)
    return _Geometry(list(kernel), list(attr(node, "strides", None) or [1] * k),
                     list(attr(node, "dilations", None) or [1] * k), attr(node, "group", 1))


def _operands(ctx, node):
    """``(x, w, bias or None, geometry)`` of a Conv or ConvTranspose node."""
    x, w = node.input[:2]
    return x, w, optional_input(node, 2), _geometry(ctx, node, w)


def _static_spatial(ctx, x):
    """Static spatial dimensions of ``x`` (axes 2 and up), None when one is unknown."""
    shape = ctx.shape(x)
    if shape is None or not all(isinstance(d, int) for d in shape[2:]):
        return None
    return list(shape[2:])


def _need_spatial(ctx, node, x, why):
    sizes = _static_spatial(ctx, x)
    if sizes is None:
        raise ValueError(
            f"The gradient of {node.op_type} node {node.name!r} needs the spatial dimensions "
            f"of {x!r}, which are not static, because of {why}. Give the input static "
            "spatial dimensions (a dynamic batch is fine), or explicit pads with "
            "auto_pad='NOTSET'.")
    return sizes


def _channels_per_group(ctx, node, w):
    """Axis 1 of the weight: channels per group of a Conv input or ConvTranspose output."""
    shape = ctx.shape(w)
    if shape is None or not isinstance(shape[1], int):
        raise ValueError(
            f"The gradient of {node.op_type} node {node.name!r} with group > 1 needs the "
            f"number of channels per group, axis 1 of the weight {w!r}, which is not static. "
            "Give the weight a static shape.")
    return shape[1]


def _split_total(total, auto_pad):
    """(begin, end) pads for a total padding: the odd one at the end for SAME_UPPER only.

    (A ConvTranspose with ``output_shape`` and no SAME auto_pad splits as SAME_LOWER.)
    """
    small = total // 2
    return (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)


def _explicit_pads(node, k):
    auto_pad = attr(node, "auto_pad", "NOTSET")
    if auto_pad == "VALID":
        return [0] * k, [0] * k
    if auto_pad != "NOTSET":
        raise ValueError(f"{node.op_type} node {node.name!r} has an unknown auto_pad "
                         f"{auto_pad!r}.")
    pads = list(attr(node, "pads", None) or [0] * (2 * k))
    return pads[:k], pads[k:]


def _conv_pads(ctx, node, x, geo):
    """Explicit ``(begins, ends)`` pads of a Conv, whatever its ``auto_pad``."""
    auto_pad = attr(node, "auto_pad", "NOTSET")
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return _explicit_pads(node, len(geo.kernel))
    sizes = _need_spatial(ctx, node, x, f"auto_pad={auto_pad!r}")
    begins, ends = [], []
    for n, s, reach in zip(sizes, geo.strides, geo.reach):
        out = -(-n // s)
        b, e = _split_total(max(0, (out - 1) * s + reach - n), auto_pad)
        begins.append(b)
        ends.append(e)
    return begins, ends


def _conv_transpose_pads(ctx, node, x, geo, out_pad):
    """Explicit ``(begins, ends)`` pads of a ConvTranspose (an end may be negative).

    The output is ``full[begin : len(full) - end]`` where ``full`` is the
    output without pads, ``output_padding`` zeros included; a negative end
    appends zeros.
    """
    k = len(geo.kernel)
    auto_pad = attr(node, "auto_pad", "NOTSET")
    output_shape = attr(node, "output_shape")
    same = auto_pad in ("SAME_UPPER", "SAME_LOWER")
    if output_shape is None and not same:
        return _explicit_pads(node, k)
    sizes = _need_spatial(ctx, node, x,
                          "output_shape" if output_shape is not None else f"auto_pad={auto_pad!r}")
    if output_shape is None:
        output_shape = [n * s for n, s in zip(sizes, geo.strides)]
    begins, ends = [], []
    for n, s, reach, op, out in zip(sizes, geo.strides, geo.reach, out_pad,
                                    list(output_shape)[-k:]):  # it may hold N and C too
        total = (n - 1) * s + reach + op - out
        if attr(node, "output_shape") is None:  # SAME alone never appends zeros
            total = max(total, 0)
        b, e = _split_total(total, auto_pad) if total >= 0 else (0, total)
        begins.append(b)
        ends.append(e)
    return begins, ends


def _crop(ctx, x, begins, ends):
    """``x`` less ``-pad`` elements on the spatial axes where a pad is negative.

    Returns the value (sliced if needed) and the pads left, all non-negative.
    """
    k = len(begins)
    if min(begins) >= 0 and min(ends) >= 0:
        return x, list(begins), list(ends)
    bld = ctx.b
    starts = bld.ints([max(-b, 0) for b in begins], hint="starts")
    stops = bld.ints([e if e < 0 else _INT64_MAX for e in ends], hint="ends")
    cropped = bld.op("Slice", [x, starts, stops, bld.ints(range(2, k + 2))])
    return cropped, [max(b, 0) for b in begins], [max(e, 0) for e in ends]


def _shape_input(ctx, lead, x, sizes):
    """An int64 shape: the ints ``lead``, then the spatial dimensions ``sizes`` of ``x``.

    ``sizes`` None: read them from ``x`` at run time.
    """
    bld = ctx.b
    if sizes is not None:
        return bld.ints(list(lead) + list(sizes), hint="shape")
    spatial = bld.op("Slice", [bld.op("Shape", [x]), bld.ints([2]), bld.ints([_INT64_MAX])])
    return bld.op("Concat", [bld.ints(lead, hint="shape"), spatial], axis=0)


def _swap01(ctx, x, rank):
    return ctx.b.op("Transpose", [x], perm=[1, 0] + list(range(2, rank)))


def _correlate(ctx, data, sizes, source, geo, group_channels, begins, ends):
    """Weight gradient: correlation of ``data`` (N, g*Cg, S) with ``source`` (N, Co, O).

    ``data`` is the input of a convolution with ``begins``/``ends`` pads
    and ``geo``'s strides and dilations, ``source`` the gradient of its
    output; the result has the weight's shape (Co, Cg, K). ``sizes``: the
    static spatial dimensions of ``data``, with pads such that no data row
    lies past the last window; None when unknown, the result is then sliced to
    the kernel's taps.

    Batch and channel axes swap, so that the sum over the batch becomes a
    Conv's sum over input channels; strides and dilations trade places,
    because the output positions are now the kernel's taps. With groups, the
    data channels are regrouped as (Cg, g*N): in one grouped Conv, output
    channel ``m`` of group ``j`` then reads the channels of group ``j`` only.
    """
    bld = ctx.b
    rank = len(geo.kernel) + 2
    if geo.group == 1:
        data_t = _swap01(ctx, data, rank)
    else:
        split = bld.op("Reshape", [data, _shape_input(ctx, [-1, geo.group, group_channels],
                                                      data, sizes)])
        moved = bld.op("Transpose", [split], perm=[2, 1, 0] + list(range(3, rank + 1)))
        data_t = bld.op("Reshape", [moved, _shape_input(ctx, [group_channels, -1], data,
                                                        sizes)])
    grad = bld.op("Conv", [data_t, _swap01(ctx, source, rank)], group=geo.group,
                  strides=geo.dilations, dilations=geo.strides, pads=list(begins) + list(ends))
    if sizes is None:
        # Rows past the last window (a stride that does not divide a length
        # known only at run time) lengthen the result: keep the kernel's taps.
        grad = bld.op("Slice", [grad, bld.ints([0] * len(geo.kernel), hint="starts"),
                                bld.ints(geo.kernel, hint="ends"), bld.ints(range(2, rank))])
    return _swap01(ctx, grad, rank)


def _bias_grad(ctx, grad, rank):
    return ctx.b.reduce("ReduceSum", grad, [0] + list(range(2, rank)), keepdims=0)


def _conv_input_grad(ctx, grad, x, w, geo, begins, ends):
    """Gradient of a Conv input: a ConvTranspose of the output gradient with the same weight.

    ``output_padding`` restores the trailing input rows that the last window
    does not reach (a stride that does not divide the padded length).
    """
    bld = ctx.b
    sizes = _static_spatial(ctx, x)
    if sizes is not None:
        out_pad = [(n + b + e - reach) % s for n, b, e, reach, s in
                   zip(sizes, begins, ends, geo.reach, geo.strides)]
        extra = {"output_padding": out_pad} if any(out_pad) else {}
        return bld.op("ConvTranspose", [grad, w], **geo.conv_attrs(begins, ends), **extra)
    # Spatial dimensions known at run time only: transpose without end pads,
    # then cut or zero-pad the end to the input's length.
    k = len(geo.kernel)
    full = bld.op("ConvTranspose", [grad, w], **geo.conv_attrs(begins, [0] * k))
    spatial = bld.op("Slice", [ctx.shape_of(x), bld.ints([2]), bld.ints([k + 2])])
    cut = bld.op("Slice", [full, bld.ints([0] * k, hint="starts"), spatial,
                           bld.ints(range(2, k + 2))])
    cut_spatial = bld.op("Slice", [bld.op("Shape", [cut]), bld.ints([2]), bld.ints([k + 2])])
    missing = bld.op("Sub", [spatial, cut_spatial])
    pads = bld.op("Concat", [bld.ints([0] * (k + 4), hint="pads"), missing], axis=0)
    return bld.op("Pad", [cut, pads])


def _conv_weight_grad(ctx, node, grad, x, w, geo, begins, ends):
    sizes = _static_spatial(ctx, x)
    data = x
    if sizes is not None:
        # End pads less the rows past the last window (negative: input rows
        # cut): the correlation then has exactly the kernel's taps.
        ends = [e - (n + b + e - reach) % s for n, b, e, reach, s in
                zip(sizes, begins, ends, geo.reach, geo.strides)]
        sizes = [n + min(e, 0) for n, e in zip(sizes, ends)]
        data, begins, ends = _crop(ctx, x, begins, ends)
    group_channels = _channels_per_group(ctx, node, w) if geo.group > 1 else None
    return _correlate(ctx, data, sizes, grad, geo, group_channels, begins, ends)


@register_gradient("Conv")
def _conv(ctx, node, grads):
    x, w, bias, geo = _operands(ctx, node)
    g = grads[0]
    begins, ends = _conv_pads(ctx, node, x, geo)
    result = [None, None, None]
    if ctx.needs(x):
        result[0] = _conv_input_grad(ctx, g, x, w, geo, begins, ends)
    if ctx.needs(w):
        result[1] = _conv_weight_grad(ctx, node, g, x, w, geo, begins, ends)
    if ctx.needs(bias):
        result[2] = _bias_grad(ctx, g, len(geo.kernel) + 2)
    return result


@register_gradient("ConvTranspose")
def _conv_transpose(ctx, node, grads):
    x, w, bias, geo = _operands(ctx, node)
    g = grads[0]
    k = len(geo.kernel)
    out_pad = list(attr(node, "output_padding", None) or [0] * k)[-k:]
    begins, ends = _conv_transpose_pads(ctx, node, x, geo, out_pad)
    # The last output_padding rows of the full output receive nothing from
    # the input: the output gradient with the pads less those rows (a
    # negative pad cut) is the input of the Conv that a ConvTranspose transposes.
    core, begins, ends = _crop(ctx, g, begins, [e - op for e, op in zip(ends, out_pad)])
    result = [None, None, None]
    if ctx.needs(x):
        result[0] = ctx.b.op("Conv", [core, w], **geo.conv_attrs(begins, ends))
    if ctx.needs(w):
        sizes = _static_spatial(ctx, x)
        if sizes is not None:  # core and pads span exactly the input's reach
            sizes = [(n - 1) * s + reach - b - e for n, s, reach, b, e in
                     zip(sizes, geo.strides, geo.reach, begins, ends)]
        group_channels = _channels_per_group(ctx, node, w) if geo.group > 1 else None
        result[1] = _correlate(ctx, core, sizes, x, geo, group_channels, begins, ends)
    if ctx.needs(bias):
        result[2] = _bias_grad(ctx, g, k + 2)
    return result
