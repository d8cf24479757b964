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

Every padding mode is first turned into explicit pads (onnxruntime's rules,
which are the ONNX specification's but for a ConvTranspose whose output
would exceed the full output: with ``output_shape``, onnxruntime extends the
output with zeros at the end; with ``auto_pad`` SAME, it keeps the full
output). A pad that would be negative becomes a Slice.
"""

from __future__ import annotations

import numpy as np

from ..graph import attr, optional_input
from ._registry import register_gradient

_INT64_MAX = np.iinfo(np.int64).max


def _geometry(ctx, node, w):
    """``(kernel, strides, dilations)`` of a Conv or ConvTranspose node (static ints)."""
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
    strides = list(attr(node, "strides", None) or [1] * k)
    dilations = list(attr(node, "dilations", None) or [1] * k)
    return list(kernel), strides, dilations


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


def _split_total(total, auto_pad):
    """(begin, end) pads for a total padding: the odd one at the end for SAME_UPPER only.

    (A ConvTranspose with ``output_shape`` and no SAME auto_pad splits as SAME_LOWER.)
    """
    small = total // 2
    return (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)


def _conv_pads(ctx, node, x, kernel, strides, dilations):
    """Explicit ``(begins, ends)`` pads of a Conv, whatever its ``auto_pad``."""
    k = len(kernel)
    auto_pad = attr(node, "auto_pad", "NOTSET")
    if auto_pad == "VALID":
        return [0] * k, [0] * k
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        sizes = _need_spatial(ctx, node, x, f"auto_pad={auto_pad!r}")
        begins, ends = [], []
        for n, kk, s, d in zip(sizes, kernel, strides, dilations):
            out = -(-n // s)
            b, e = _split_total(max(0, (out - 1) * s + (kk - 1) * d + 1 - n), auto_pad)
            begins.append(b)
            ends.append(e)
        return begins, ends
    if auto_pad != "NOTSET":
        raise ValueError(f"{node.op_type} node {node.name!r} has an unknown auto_pad "
                         f"{auto_pad!r}.")
    pads = list(attr(node, "pads", None) or [0] * (2 * k))
    return pads[:k], pads[k:]


def _conv_transpose_pads(ctx, node, x, kernel, strides, dilations, out_pad):
    """Explicit ``(begins, ends)`` pads of a ConvTranspose (ends may be negative).

    The output is ``full[begin : len(full) - end]`` where ``full`` is the
    output without padding, ``output_padding`` zeros included; a negative end
    extends it with zeros, as onnxruntime does when ``output_shape`` exceeds
    ``full`` by less than a stride.
    """
    k = len(kernel)
    auto_pad = attr(node, "auto_pad", "NOTSET")
    output_shape = attr(node, "output_shape")
    if output_shape is None and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        if auto_pad == "VALID":
            return [0] * k, [0] * k
        if auto_pad != "NOTSET":
            raise ValueError(f"{node.op_type} node {node.name!r} has an unknown auto_pad "
                             f"{auto_pad!r}.")
        pads = list(attr(node, "pads", None) or [0] * (2 * k))
        return pads[:k], pads[k:]
    why = "output_shape" if output_shape is not None else f"auto_pad={auto_pad!r}"
    sizes = _need_spatial(ctx, node, x, why)
    same = output_shape is None
    if same:
        output_shape = [n * s for n, s in zip(sizes, strides)]
    output_shape = list(output_shape)[-k:]  # it may hold N and C too
    begins, ends = [], []
    for n, kk, s, d, op, out in zip(sizes, kernel, strides, dilations, out_pad, output_shape):
        total = (n - 1) * s + (kk - 1) * d + 1 + op - out
        if same:  # onnxruntime never pads SAME with zeros
            total = max(total, 0)
        b, e = _split_total(total, auto_pad) if total >= 0 else (0, total)
        begins.append(b)
        ends.append(e)
    return begins, ends


def _crop(ctx, x, begins, ends):
    """``x`` without ``-begin``/``-end`` elements on its spatial axes where those are negative.

    Returns the (maybe sliced) value and the pads left, all non-negative.
    """
    k = len(begins)
    if all(b >= 0 for b in begins) and all(e >= 0 for e in ends):
        return x, list(begins), list(ends)
    starts = [max(-b, 0) for b in begins]
    stops = [e if e < 0 else _INT64_MAX for e in ends]
    bld = ctx.b
    cropped = bld.op("Slice", [x, bld.ints(starts, hint="starts"), bld.ints(stops, hint="ends"),
                               bld.ints(range(2, k + 2))])
    return cropped, [max(b, 0) for b in begins], [max(e, 0) for e in ends]


def _shape_input(ctx, lead, x, sizes):
    """An int64 shape: the ints ``lead`` then the spatial dimensions ``sizes`` of ``x``.

    ``sizes`` None: read them from ``x`` at run time.
    """
    if sizes is not None:
        return ctx.b.ints(list(lead) + list(sizes), hint="shape")
    bld = ctx.b
    spatial = bld.op("Slice", [bld.op("Shape", [x]), bld.ints([2]), bld.ints([_INT64_MAX])])
    return bld.op("Concat", [bld.ints(lead, hint="shape"), spatial], axis=0)


def _swap01(ctx, x, rank):
    return ctx.b.op("Transpose", [x], perm=[1, 0] + list(range(2, rank)))


def _weight_grad(ctx, data, sizes, source, group, group_channels, begins, ends, strides,
                 dilations, kernel):
    """Correlation of ``data`` (N, g*Cg, S) with ``source`` (N, Co, O): (Co, Cg, K).

    ``data`` is the input of a Conv with ``begins``/``ends`` pads,
    ``strides`` and ``dilations`` whose output gradient is ``source``;
    ``sizes`` its static spatial dimensions, None when not all are known (the
    result is then sliced to the kernel's taps; otherwise the pads are such
    that no input row lies past the last window). Batch and channel axes swap
    so that the sum over the batch becomes the sum over a Conv's input
    channels; strides and dilations swap because the output positions are now
    the kernel's taps. For ``group`` > 1 the data channels are regrouped as
    (Cg, g*N) so that output channel ``m`` of group ``j`` correlates only
    with the channels of group ``j``.
    """
    bld = ctx.b
    rank = len(kernel) + 2
    if group == 1:
        data_t = _swap01(ctx, data, rank)
    else:
        split = bld.op("Reshape", [data, _shape_input(ctx, [-1, group, group_channels], data,
                                                      sizes)])
        moved = bld.op("Transpose", [split], perm=[2, 1, 0] + list(range(3, rank + 1)))
        data_t = bld.op("Reshape", [moved, _shape_input(ctx, [group_channels, -1], data,
                                                        sizes)])
    grad = bld.op("Conv", [data_t, _swap01(ctx, source, rank)], group=group,
                  strides=dilations, dilations=strides, pads=list(begins) + list(ends))
    if sizes is None:
        # Rows past the last window (a stride that does not divide a length
        # known only at run time) lengthen the result: keep the kernel's taps.
        grad = bld.op("Slice", [grad, bld.ints([0] * len(kernel), hint="starts"),
                                bld.ints(kernel, hint="ends"), bld.ints(range(2, rank))])
    return _swap01(ctx, grad, rank)


def _channels_per_group(ctx, node, w):
    """Channels per group of the weight's axis 1 (Conv input, ConvTranspose output)."""
    shape = ctx.shape(w)
    if shape is None or not isinstance(shape[1], int):
        raise ValueError(
            f"The gradient of {node.op_type} node {node.name!r} needs the number of channels "
            f"per group, axis 1 of the weight {w!r}, which is not static. Give the weight a "
            "static shape.")
    return shape[1]


def _bias_grad(ctx, grad, rank):
    return ctx.b.reduce("ReduceSum", grad, [0] + list(range(2, rank)), keepdims=0)


def _conv_input_grad(ctx, grad, w, x, begins, ends, strides, dilations, kernel, group):
    """Gradient of a Conv input: a ConvTranspose of the output gradient with the same weight.

    ``output_padding`` restores the trailing input rows that the last
    window does not reach (a stride that does not divide the padded length).
    """
    bld = ctx.b
    sizes = _static_spatial(ctx, x)
    if sizes is not None:
        out_pad = []
        for n, b, e, kk, s, d in zip(sizes, begins, ends, kernel, strides, dilations):
            reach = (kk - 1) * d + 1
            out_pad.append((n + b + e - reach) % s)
        return bld.op("ConvTranspose", [grad, w], group=group, strides=strides,
                      dilations=dilations, pads=list(begins) + list(ends),
                      output_padding=out_pad)
    # Dynamic spatial dimensions: the input rows left over are not known
    # before running. Transpose without end pads, then cut or zero-pad the
    # end to the input's length.
    k = len(kernel)
    full = bld.op("ConvTranspose", [grad, w], group=group, strides=strides,
                  dilations=dilations, pads=list(begins) + [0] * k)
    spatial = bld.op("Slice", [ctx.shape_of(x), bld.ints([2]), bld.ints([k + 2])])
    cut = bld.op("Slice", [full, bld.ints([0] * k, hint="starts"), spatial,
                           bld.ints(range(2, k + 2))])
    short = bld.op("Sub", [spatial, bld.op("Slice", [bld.op("Shape", [cut]), bld.ints([2]),
                                                     bld.ints([k + 2])])])
    pads = bld.op("Concat", [bld.ints([0] * (k + 4), hint="pads"), short], axis=0)
    return bld.op("Pad", [cut, pads])


@register_gradient("Conv")
def _conv(ctx, node, grads):
    x, w = node.input[:2]
    bias = optional_input(node, 2)
    g = grads[0]
    kernel, strides, dilations = _geometry(ctx, node, w)
    group = attr(node, "group", 1)
    begins, ends = _conv_pads(ctx, node, x, kernel, strides, dilations)
    result = [None, None, None]
    if ctx.needs(x):
        result[0] = _conv_input_grad(ctx, g, w, x, begins, ends, strides, dilations, kernel,
                                     group)
    if ctx.needs(w):
        sizes = _static_spatial(ctx, x)
        data = x
        if sizes is not None:
            # Drop the pad (or the input rows) past the last window: the
            # correlation then has exactly the kernel's taps.
            ends = [e - (n + b + e - (kk - 1) * d - 1) % s for n, b, e, kk, s, d in
                    zip(sizes, begins, ends, kernel, strides, dilations)]
            data, begins, ends_left = _crop(ctx, x, begins, ends)
            sizes = [n + min(e, 0) for n, e in zip(sizes, ends)]
            ends = ends_left
        result[1] = _weight_grad(ctx, data, sizes, g, group, _channels_per_group(ctx, node, w),
                                 begins, ends, strides, dilations, kernel)
    if ctx.needs(bias):
        result[2] = _bias_grad(ctx, g, len(kernel) + 2)
    return result


@register_gradient("ConvTranspose")
def _conv_transpose(ctx, node, grads):
    x, w = node.input[:2]
    bias = optional_input(node, 2)
    g = grads[0]
    kernel, strides, dilations = _geometry(ctx, node, w)
    k = len(kernel)
    group = attr(node, "group", 1)
    out_pad = list(attr(node, "output_padding", None) or [0] * k)[-k:]
    begins, ends = _conv_transpose_pads(ctx, node, x, kernel, strides, dilations, out_pad)
    # The output is full[begin : len(full) - end], and the last
    # output_padding rows of full receive nothing from the input: the output
    # gradient with those pads (negative ones cut) is what a Conv reads.
    core, begins, ends = _crop(ctx, g, begins, [e - op for e, op in zip(ends, out_pad)])
    result = [None, None, None]
    if ctx.needs(x):
        result[0] = ctx.b.op("Conv", [core, w], group=group, strides=strides,
                             dilations=dilations, pads=begins + ends)
    if ctx.needs(w):
        sizes = _static_spatial(ctx, x)
        if sizes is not None:  # core + pads spans exactly what the input reaches
            sizes = [(n - 1) * s + (kk - 1) * d + 1 - b - e for n, s, kk, d, b, e in
                     zip(sizes, strides, kernel, dilations, begins, ends)]
        result[1] = _weight_grad(ctx, core, sizes, x, group, _channels_per_group(ctx, node, w),
                                 begins, ends, strides, dilations, kernel)
    if ctx.needs(bias):
        result[2] = _bias_grad(ctx, g, k + 2)
    return result
