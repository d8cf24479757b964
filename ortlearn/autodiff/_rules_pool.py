"""Gradients of pooling and resampling.

MaxPool, AveragePool, the global pools, Pad, Resize, DepthToSpace and SpaceToDepth.

MaxPool and the non-constant modes of Pad move input elements to output
positions; their gradient scatters (adds) the output gradient back to the flat
index each output element came from (MaxPool's Indices output, a Pad of the
input's flat positions). AveragePool and Resize are linear maps that act on
each spatial axis separately (a box average is a product of 1-D averages,
linear interpolation a product of 1-D interpolations); their gradient is the
adjoint, applied axis by axis as a product with the transposed 1-D matrix,
computed here from the static lengths. MatMul and Einsum have float64
kernels in onnxruntime, so these gradients run in float64 too, and a dynamic
batch (or any dynamic axis the op does not resample) needs no special care.
"""

from __future__ import annotations

import numpy as np

from ..graph import attr, onnx_to_np_dtype, optional_input
from ._registry import register_gradient

_EINSUM_LETTERS = "abcdefghijklmnopqrstuvw"


# ---------------------------------------------------------------- helpers
def _apply_adjoint(ctx, g, x, mats):
    """Adjoint of a separable linear map, applied to the output gradient ``g``.

    Parameters
    ----------
    ctx : GradientContext
    g : str
        Gradient of the forward output.
    x : str
        Forward input (gives the dtype).
    mats : dict of int to ndarray
        ``{axis: A}`` where the forward map along ``axis`` is ``y = A @ x``
        (``A`` of shape ``[out_len, in_len]``); axes left out are unchanged.

    Returns
    -------
    str
        ``g`` multiplied along each axis by ``A.T``: the gradient of ``x``.
    """
    rank = ctx.rank(x)
    b = ctx.b
    # Last axes first: MatMul handles the last two axes without any reshape.
    for axis in sorted(mats, reverse=True):
        a = mats[axis]
        if axis == rank - 1:
            g = b.op("MatMul", [g, ctx.const(a, like=x)])
        elif axis == rank - 2:
            g = b.op("MatMul", [ctx.const(np.ascontiguousarray(a.T), like=x), g])
        else:
            letters = _EINSUM_LETTERS[:rank]
            src = letters[:axis] + "z" + letters[axis + 1:]
            equation = f"{src},z{letters[axis]}->{letters}"
            g = b.op("Einsum", [g, ctx.const(a, like=x)], equation=equation)
    return g


def _static_lengths(ctx, node, x, axes, what):
    """Static lengths of ``x`` along ``axes``; ValueError naming the op when unknown."""
    shape = ctx.shape(x)
    lengths = [None if shape is None else shape[a] for a in axes]
    if any(not isinstance(d, int) for d in lengths):
        raise ValueError(
            f"The gradient of {node.op_type} node {node.name!r} needs static lengths of "
            f"{x!r} along the {what} axes {list(axes)} (got shape {shape}): fix those "
            "dimensions when exporting the model (only the batch may be dynamic)."
        )
    return lengths


def _spatial_rank(ctx, node):
    rank = ctx.rank(node.input[0], node)
    if rank < 3:
        raise ValueError(f"{node.op_type} node {node.name!r}: input of rank {rank}, expected "
                         "[N, C, spatial...].")
    return rank - 2


# ---------------------------------------------------------------- MaxPool
def _row_major_indices(ctx, node, indices):
    """MaxPool Indices written with ``storage_order=1`` turned into row-major flat indices.

    With storage_order=1, onnxruntime counts the spatial position of an
    (n, c) image column-major (first spatial axis fastest) and adds the
    image's row-major offset; the scatter of the gradient needs row-major.
    """
    x = node.input[0]
    dims = _static_lengths(ctx, node, x, range(2, ctx.rank(x)), "spatial")
    b = ctx.b
    size = int(np.prod(dims))
    within = b.op("Mod", [indices, b.const(np.int64(size))])
    flat = b.op("Sub", [indices, within])
    col_stride, row_strides = 1, np.cumprod([1] + dims[::-1])[::-1][1:]
    for dim, row_stride in zip(dims, row_strides):
        coord = b.op("Mod", [b.op("Div", [within, b.const(np.int64(col_stride))]),
                             b.const(np.int64(dim))])
        flat = b.op("Add", [flat, b.op("Mul", [coord, b.const(np.int64(row_stride))])])
        col_stride *= dim
    return flat


def _windows_overlap(node, spatial):
    """Whether two pooling windows can share an input element (then Indices repeat)."""
    kernel = attr(node, "kernel_shape")
    strides = attr(node, "strides") or [1] * spatial
    dilations = attr(node, "dilations") or [1] * spatial
    return any(s < (k - 1) * d + 1 for k, s, d in zip(kernel, strides, dilations))


@register_gradient("MaxPool")
def _max_pool(ctx, node, grads):
    x = node.input[0]
    spatial = _spatial_rank(ctx, node)
    # The position of each maximum: the forward pass knows it.
    indices = ctx.expose_output(node, 1, "maxpool_indices")
    if attr(node, "storage_order", 0):
        indices = _row_major_indices(ctx, node, indices)
    # onnxruntime picks the first maximum of a window in scan order, as torch
    # does: the whole gradient of an output goes to that one element.
    return [ctx.scatter_flat(x, indices, grads[0], accumulate=_windows_overlap(node, spatial))]


# ---------------------------------------------------------------- AveragePool
def _pool_pads(node, in_lens, kernel, strides, dilations):
    """Begin and end pads of each spatial axis, ``auto_pad`` resolved as onnxruntime does."""
    spatial = len(in_lens)
    auto_pad = attr(node, "auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", "VALID"):
        pads = attr(node, "pads") or [0] * 2 * spatial
        if auto_pad == "VALID":
            pads = [0] * 2 * spatial
        return list(pads[:spatial]), list(pads[spatial:])
    begin, end = [], []
    for n, k, s, d in zip(in_lens, kernel, strides, dilations):
        out = -(-n // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        begin.append(head)
        end.append(total - head)
    return begin, end


def _average_matrix(n_in, n_out, k, s, d, pad_begin, pad_end, include_pad):
    """``[n_out, n_in]`` matrix of a 1-D average pool (divisor as onnxruntime counts it)."""
    a = np.zeros((n_out, n_in))
    for o in range(n_out):
        taps = o * s - pad_begin + d * np.arange(k)
        inside = taps[(taps >= 0) & (taps < n_in)]
        if include_pad:
            # padded positions count, but not a window's overflow past the end pad (ceil_mode)
            divisor = int(np.sum(taps < n_in + pad_end))
        else:
            divisor = len(inside)
        if divisor:
            a[o, inside] += 1.0 / divisor
    return a


@register_gradient("AveragePool")
def _average_pool(ctx, node, grads):
    x, y = node.input[0], node.output[0]
    spatial = _spatial_rank(ctx, node)
    axes = list(range(2, 2 + spatial))
    in_lens = _static_lengths(ctx, node, x, axes, "spatial")
    out_lens = _static_lengths(ctx, node, y, axes, "spatial")
    kernel = list(attr(node, "kernel_shape"))
    strides = list(attr(node, "strides") or [1] * spatial)
    dilations = list(attr(node, "dilations") or [1] * spatial)
    begin, end = _pool_pads(node, in_lens, kernel, strides, dilations)
    include_pad = bool(attr(node, "count_include_pad", 0))
    # A box average is the product of 1-D averages: its divisor is the product
    # of the per-axis counts, both with and without count_include_pad.
    mats = {axis: _average_matrix(*dims, include_pad)
            for axis, dims in zip(axes, zip(in_lens, out_lens, kernel, strides, dilations,
                                            begin, end))}
    return [_apply_adjoint(ctx, grads[0], x, mats)]


# ---------------------------------------------------------------- global pools
@register_gradient("GlobalAveragePool")
def _global_average_pool(ctx, node, grads):
    x, y = node.input[0], node.output[0]
    spatial = list(range(2, 2 + _spatial_rank(ctx, node)))
    dims = ctx.shape(x)[2:]
    if all(isinstance(d, int) for d in dims):
        count = ctx.const(float(np.prod(dims)), like=x)
    else:
        count = ctx.b.op("Div", [ctx.size_as(x, x), ctx.size_as(y, x)])
    return [ctx.expand_like(ctx.b.op("Div", [grads[0], count]), x, spatial)]


@register_gradient("GlobalMaxPool")
def _global_max_pool(ctx, node, grads):
    # The first maximum (in row-major order) gets the whole gradient, as for
    # MaxPool with a window covering the image, which is what torch's
    # adaptive_max_pool(x, 1) computes and exports (torch.amax splits ties
    # evenly instead; it exports to ReduceMax, whose rule does the same).
    x = node.input[0]
    _spatial_rank(ctx, node)
    b = ctx.b
    flat = b.op("Reshape", [x, b.ints([0, 0, -1], hint="shape")])
    first = b.op("ArgMax", [flat], axis=2, keepdims=1, select_last_index=0)
    size = b.op("Gather", [b.op("Shape", [flat]), b.const(np.int64(2))])
    every = b.op("Range", [b.const(np.int64(0)), size, b.const(np.int64(1))])
    g = b.op("Reshape", [grads[0], b.ints([0, 0, 1], hint="shape")])
    return [ctx.reshape_like(ctx.mask_where(b.op("Equal", [first, every]), g, x), x)]


# ---------------------------------------------------------------- Pad
@register_gradient("Pad")
def _pad(ctx, node, grads):
    x, g = node.input[0], grads[0]
    b = ctx.b
    mode = attr(node, "mode", "constant")
    pads, value, axes = (optional_input(node, i) for i in (1, 2, 3))
    tail = ["", axes] if axes else []
    result = [None] * len(node.input)
    if mode != "constant":
        # Each output element copies one input element: pad the flat positions
        # the same way and add each gradient to its source (reflect, edge, wrap;
        # negative pads crop).
        source = b.op("Pad", [ctx.positions(x), pads] + tail, mode=mode)
        result[0] = ctx.scatter_flat(x, source, g, accumulate=True)
        return result
    static = ctx.constant_value(pads)
    negated = (b.ints(-np.asarray(static, dtype=np.int64), hint="pads") if static is not None
               else b.op("Neg", [pads]))
    # The adjoint of padding with zeros is cropping (and a negative pad, which
    # crops, pads the gradient with zeros).
    dx = b.op("Pad", [g, negated] + tail, mode="constant")
    result[0] = dx
    if value is not None and ctx.needs(value):
        # The constant fills every output element that does not come from x.
        total = b.op("Sub", [b.reduce("ReduceSum", g, None, keepdims=0),
                             b.reduce("ReduceSum", dx, None, keepdims=0)])
        result[2] = ctx.reshape_like(total, value)
    return result


# ---------------------------------------------------------------- Resize
def _source_coordinates(mode, n_in, n_out, scale, dtype):
    """Input coordinate of each output position along one axis (ONNX's formulas)."""
    dtype = np.dtype(dtype)
    x = np.arange(n_out).astype(dtype)
    scale = dtype.type(scale)
    half = dtype.type(0.5)
    if mode == "asymmetric":
        return x / scale
    if mode == "half_pixel":
        return (x + half) / scale - half
    if mode == "pytorch_half_pixel":
        return (x + half) / scale - half if n_out > 1 else np.zeros(n_out, dtype)
    if mode == "align_corners":
        if n_out == 1:
            return np.zeros(n_out, dtype)
        return x * dtype.type(n_in - 1) / dtype.type(n_out - 1)
    if mode == "half_pixel_symmetric":
        adjustment = dtype.type(n_out) / (scale * dtype.type(n_in))
        offset = dtype.type(n_in) / dtype.type(2) * (dtype.type(1) - adjustment)
        return offset + (x + half) / scale - half
    raise NotImplementedError(mode)


def _nearest_index(coords, nearest_mode):
    floor = np.floor(coords)
    if nearest_mode == "floor":
        return floor
    if nearest_mode == "ceil":
        return np.ceil(coords)
    tie = coords - floor == 0.5
    rounded = np.floor(coords + 0.5)  # not np.round: it rounds ties to even
    if nearest_mode == "round_prefer_floor":
        return np.where(tie, floor, rounded)
    if nearest_mode == "round_prefer_ceil":
        return np.where(tie, floor + 1, rounded)
    raise NotImplementedError(nearest_mode)


def _cubic_matrix(coords, n_in, a, exclude_outside):
    """``[n_out, n_in]`` matrix of ONNX's cubic convolution (Keys' kernel of coefficient ``a``).

    Each output reads the four inputs around its source coordinate; an input
    past an edge reads the edge, or with ``exclude_outside`` weighs nothing and
    the other weights are renormalised to sum to one.
    """
    coords = coords.astype(np.float64)
    floor = np.floor(coords)
    t = (coords - floor)[:, None]
    distance = np.concatenate([1 + t, t, 1 - t, 2 - t], axis=1)  # to floor - 1 .. floor + 2
    near = ((a + 2) * distance - (a + 3)) * distance * distance + 1
    far = ((a * distance - 5 * a) * distance + 8 * a) * distance - 4 * a
    weights = np.where(distance <= 1, near, far)
    index = floor.astype(np.int64)[:, None] + np.arange(-1, 3)
    if exclude_outside:
        weights = np.where((index < 0) | (index >= n_in), 0.0, weights)
        weights /= weights.sum(axis=1, keepdims=True)
    matrix = np.zeros((len(coords), n_in))
    np.add.at(matrix, (np.repeat(np.arange(len(coords)), 4), np.clip(index, 0, n_in - 1).ravel()),
              weights.ravel())
    return matrix


def _resize_matrix(node, n_in, n_out, scale, dtype):
    """``[n_out, n_in]`` matrix of a 1-D nearest, linear or cubic resize, as onnxruntime
    computes it."""
    coords = _source_coordinates(attr(node, "coordinate_transformation_mode", "half_pixel"),
                                 n_in, n_out, scale, dtype)
    if attr(node, "mode", "nearest") == "cubic":
        return _cubic_matrix(coords, n_in, attr(node, "cubic_coeff_a", -0.75),
                             attr(node, "exclude_outside", 0))
    a = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    if attr(node, "mode", "nearest") == "nearest":
        index = _nearest_index(coords, attr(node, "nearest_mode", "round_prefer_floor"))
        a[rows, np.clip(index, 0, n_in - 1).astype(np.int64)] = 1.0
        return a
    coords = np.clip(coords, 0, n_in - 1)
    low = np.minimum(np.floor(coords).astype(np.int64), n_in - 1)
    high = np.minimum(low + 1, n_in - 1)
    frac = (coords - low).astype(np.float64)
    np.add.at(a, (rows, low), 1.0 - frac)
    np.add.at(a, (rows, high), frac)
    return a


def _resize_scales(ctx, node, rank):
    """Per-axis scales and output lengths of a Resize node, and the axes assumed kept.

    The batch and channel axes (0 and 1), and an axis whose input and output
    lengths are the same symbolic dimension, are unchanged when their sizes are
    known at run time only (torch's ``interpolate`` writes the sizes of the batch
    and channel axes as ``Shape(x)[:2]`` and resizes the others); the caller checks
    that at run time. A spatial axis needs static lengths.
    """
    x, y = node.input[0], node.output[0]
    scales_in, sizes_in = optional_input(node, 2), optional_input(node, 3)
    axes = attr(node, "axes")
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    in_shape = ctx.shape(x)
    out_shape = list(ctx.shape(y) or [None] * rank)
    scales = ctx.constant_value(scales_in)
    full = [1.0] * rank
    if scales is not None and scales.size:
        for a, s in zip(axes, np.ravel(scales)):
            full[a] = float(s)
            if not isinstance(out_shape[a], int) and isinstance(in_shape[a], int):
                out_shape[a] = int(np.floor(in_shape[a] * np.float32(s)))
        return full, out_shape, []
    if scales_in is not None and sizes_in is None:
        raise ValueError(f"The gradient of Resize node {node.name!r} needs its scales as a "
                         "constant: export with a fixed scale factor.")
    sizes = ctx.constant_value(sizes_in)
    # sizes computed at run time (torch writes Concat(Shape(x)[:2], sizes)): the
    # output shape that shape inference found tells them
    sizes = out_shape if sizes is None else dict(zip(axes, np.ravel(sizes).tolist()))
    ratios, kept = {}, []
    for a in axes:
        n, s = in_shape[a], sizes[a]
        if s is not None and s == n:
            ratios[a] = 1.0
        elif isinstance(n, int) and isinstance(s, int):
            ratios[a] = s / n
        elif a < 2 or (isinstance(n, str) and n == out_shape[a]):
            # kept, checked at run time (_resize)
            ratios[a] = 1.0
            kept.append(a)
        else:
            raise ValueError(
                f"The gradient of Resize node {node.name!r} needs the static length of its "
                f"input and output along axis {a} (input {n}, output {s}): export with "
                "fixed sizes for the resized axes.")
    policy = attr(node, "keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        ratio = (min if policy == "not_larger" else max)(ratios.values())
        ratios = dict.fromkeys(axes, ratio)
    for a in axes:
        full[a] = ratios[a]
        if ratios[a] == 1.0:
            out_shape[a] = in_shape[a]
        elif not isinstance(out_shape[a], int):
            out_shape[a] = (sizes[a] if policy == "stretch"
                            else int(np.round(ratios[a] * in_shape[a])))
    return full, out_shape, kept


@register_gradient("Resize")
def _resize(ctx, node, grads):
    x, y = node.input[0], node.output[0]
    mode = attr(node, "mode", "nearest")
    transform = attr(node, "coordinate_transformation_mode", "half_pixel")
    if mode not in ("nearest", "linear", "cubic"):
        raise NotImplementedError(
            f"Resize node {node.name!r}: no gradient for mode={mode!r}; use mode 'linear', "
            "'cubic' or 'nearest'.")
    if transform == "tf_crop_and_resize":
        raise NotImplementedError(
            f"Resize node {node.name!r}: no gradient for coordinate_transformation_mode="
            "'tf_crop_and_resize'; crop with Slice, then resize with another mode.")
    rank = ctx.rank(x, node)
    scales, out_shape, kept = _resize_scales(ctx, node, rank)
    if attr(node, "antialias", 0) and mode != "nearest" and any(s < 1 for s in scales):
        raise NotImplementedError(
            f"Resize node {node.name!r}: no gradient for antialias=1 when downsampling; "
            "set antialias=0.")
    dtype = onnx_to_np_dtype(ctx.dtype(x))
    mats = {}
    for axis in range(rank):
        if scales[axis] == 1.0:
            continue  # every coordinate transformation maps an axis onto itself at scale 1
        n_in, n_out = _static_lengths(ctx, node, x, [axis], "resized")[0], out_shape[axis]
        if not isinstance(n_out, int):
            raise ValueError(f"The gradient of Resize node {node.name!r} needs the static "
                             f"length of its output {y!r} along axis {axis}.")
        mats[axis] = _resize_matrix(node, n_in, n_out, scales[axis], dtype)
    grad = _apply_adjoint(ctx, grads[0], x, mats)
    if kept:
        # Fails at run time (element count) if an axis assumed kept was resized.
        grad = ctx.b.op("Reshape", [grad, ctx.shape_of(x)])
    return [grad, None, None, None]


# ---------------------------------------------------------------- DepthToSpace / SpaceToDepth
@register_gradient("SpaceToDepth")
def _space_to_depth(ctx, node, grads):
    # SpaceToDepth is a permutation whose inverse is DepthToSpace in DCR mode.
    return [ctx.b.op("DepthToSpace", [grads[0]], blocksize=attr(node, "blocksize"),
                     mode="DCR")]


@register_gradient("DepthToSpace")
def _depth_to_space(ctx, node, grads):
    block = attr(node, "blocksize")
    g = grads[0]
    if attr(node, "mode", "DCR") == "DCR":
        return [ctx.b.op("SpaceToDepth", [g], blocksize=block)]
    # CRD: y[n, c, h*b + i, w*b + j] = x[n, c*b*b + i*b + j, h, w]; undo the
    # permutation with a reshape to [N, C, H, b, W, b] and a transpose.
    x = node.input[0]
    b = ctx.b
    shape = ctx.shape(x)
    if shape is not None and all(isinstance(d, int) for d in shape[2:]):
        hw = [b.ints([shape[2]], hint="dim"), b.ints([shape[3]], hint="dim")]
    else:
        hw = [b.op("Slice", [ctx.shape_of(x), b.ints([i]), b.ints([i + 1])]) for i in (2, 3)]
    blk = b.ints([block], hint="dim")
    target = b.op("Concat", [b.ints([0, -1], hint="shape"), hw[0], blk, hw[1], blk], axis=0)
    split = b.op("Reshape", [g, target])
    return [ctx.reshape_like(b.op("Transpose", [split], perm=[0, 1, 3, 5, 2, 4]), x)]
