"""Gradients of the data-movement operators (reshapes, slicing, gathering, tiling)."""

from __future__ import annotations

import re

import numpy as np
from onnx import TensorProto, numpy_helper

from ..graph import attr, onnx_to_np_dtype, optional_input
from ..graph.format import PADDING_IDX_KEY
from ._registry import register_gradient


@register_gradient("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(ctx, node, grads):
    x = node.input[0]
    return [ctx.reshape_like(grads[0], x)]


@register_gradient("Transpose")
def _transpose(ctx, node, grads):
    perm = attr(node, "perm")
    if perm is None:  # default: reversed axes, its own inverse
        return [ctx.b.op("Transpose", [grads[0]])]
    return [ctx.b.op("Transpose", [grads[0]], perm=[int(i) for i in np.argsort(perm)])]


def _dim(ctx, x, axis):
    """Length of ``x`` along ``axis`` as a one-element int64 tensor."""
    shape = ctx.shape(x)
    if shape is not None and isinstance(shape[axis], int):
        return ctx.b.ints([shape[axis]], hint="dim")
    return ctx.b.op("Gather", [ctx.shape_of(x), ctx.b.ints([axis], hint="axis")])


@register_gradient("Concat")
def _concat(ctx, node, grads):
    axis = attr(node, "axis")
    if axis < 0:
        axis += ctx.rank(node.output[0], node)
    sizes = ctx.b.op("Concat", [_dim(ctx, x, axis) for x in node.input], axis=0)
    pieces = ctx.b.op("Split", [grads[0], sizes], n_outputs=len(node.input), axis=axis)
    pieces = pieces if isinstance(pieces, list) else [pieces]
    return [p if ctx.needs(x) else None for p, x in zip(pieces, node.input)]


@register_gradient("Split")
def _split(ctx, node, grads):
    parts = [g if g is not None else ctx.zeros_like(o) for g, o in zip(grads, node.output)]
    return [ctx.b.op("Concat", parts, axis=attr(node, "axis", 0))]


@register_gradient("Slice")
def _slice(ctx, node, grads):
    x = node.input[0]
    picked = ctx.b.op("Slice", [ctx.positions(x)] + list(node.input[1:]))
    return [ctx.scatter_flat(x, picked, grads[0], accumulate=False)]


def _one_hot_gather(ctx, node, grads):
    """Gradient of a GatherElements picking one element per row, as a masked product.

    With indices of length 1 along ``axis`` and the data's other dims, each
    input element receives the gradient of its row where it is the picked
    one: ``(indices mod n == arange(n)) * grad``, broadcast. Four small nodes
    instead of a ScatterElements into zeros and its flat positions (a dozen).
    None when the static shapes do not allow it.
    """
    x, indices = node.input
    sx, si = ctx.shape(x), ctx.shape(indices)
    if sx is None or si is None or len(sx) != len(si):
        return None
    axis = attr(node, "axis", 0) % len(sx)
    n = sx[axis]
    if not isinstance(n, int) or si[axis] != 1 or any(
            a != axis and (di is None or di != dx) for a, (di, dx) in enumerate(zip(si, sx))):
        return None
    b = ctx.b
    # Mod: GatherElements accepts negative indices, counted from the end.
    positive = b.op("Mod", [indices, b.const(np.asarray(n, dtype=np.int64))])
    lengths = [1] * len(sx)
    lengths[axis] = n
    every = b.const(np.arange(n, dtype=np.int64).reshape(lengths), hint="positions")
    grad = ctx.mask_where(b.op("Equal", [positive, every]), grads[0], x)
    # one nonzero term per row: the sum along the axis is the incoming gradient, exactly
    ctx.note_axis_sum(grad, axis, grads[0])
    return grad


#: What torch's dynamo exporter records of ``nn.Embedding`` on the Gather node
#: (metadata ``pkg.torch.onnx.fx_node``): ``aten.embedding.default(args =
#: (%weight, %indices[, padding_idx[, scale_grad_by_freq[, sparse]]]))``.
_ATEN_EMBEDDING = re.compile(
    r"aten\.embedding\.default\]\(args = \(%[^,()]+, %[^,()]+(?:, (-?\d+))?(?:, (True|False))?")



def _padding_idx(node) -> int | None:
    """The embedding row torch leaves without gradient, from the node's metadata."""
    props = {p.key: p.value for p in node.metadata_props}
    if PADDING_IDX_KEY in props:
        return int(props[PADDING_IDX_KEY])
    match = _ATEN_EMBEDDING.search(props.get("pkg.torch.onnx.fx_node", ""))
    if match is None:
        return None
    if match.group(2) == "True":
        raise NotImplementedError(
            f"Gather node {node.name!r} is a torch nn.Embedding with scale_grad_by_freq=True, "
            "whose gradient ortlearn does not scale. Export the model with "
            "scale_grad_by_freq=False, or leave its table out of wrt.")
    pad = int(match.group(1)) if match.group(1) is not None else -1
    return pad if pad >= 0 else None  # aten writes -1 (or nothing) for no padding row


def _constant_index_gather(ctx, node, g):
    """Gradient of a Gather of one constant position (``qkv[1]``), as a Pad of zeros.

    torch exports the split of a fused query/key/value projection so; the
    gradient is the slice put back among zeros: one Pad instead of a
    ScatterElements into zeros and its flat positions. None unless the index
    is a constant scalar, and the axis is counted from the start or the rank
    of the data is known.
    """
    x, indices = node.input
    index, rank, axis = ctx.constant_value(indices), ctx.rank(x), attr(node, "axis", 0)
    if index is None or np.ndim(index) != 0 or _padding_idx(node) is not None:
        return None
    if rank is not None:
        axis %= rank
    elif axis < 0:
        return None
    b = ctx.b
    i = int(index)
    # Gather counts a negative index from the end: the zeros before it are n + i
    last = b.op("Sub", [_dim(ctx, x, axis), b.ints([1], hint="one")])
    before = b.ints([i], hint="index") if i >= 0 else b.op("Add", [last, b.ints([i + 1])])
    after = b.op("Sub", [last, b.ints([i])]) if i >= 0 else b.ints([-i - 1], hint="index")
    if rank is not None:
        tail = b.ints([0] * (rank - 1 - axis), hint="zeros") if rank - 1 - axis else None
    else:  # the axes after the gathered one, counted at run time (torch's reshape chains)
        count = b.op("Sub", [b.op("Size", [ctx.shape_of(x)]), b.const(np.int64(axis + 1))])
        tail = b.op("ConstantOfShape", [b.op("Reshape", [count, b.ints([1], hint="one")])],
                    value=numpy_helper.from_array(np.zeros(1, np.int64)))
    # pads: the begins of every axis, then the ends; 0 but on the gathered axis
    pieces = []
    for value in (before, after):
        pieces += ([b.ints([0] * axis, hint="zeros")] if axis else []) + [value]
        pieces += [tail] if tail is not None else []
    pads = b.op("Concat", pieces, axis=0)
    return b.op("Pad", [b.unsqueeze(g, [axis]), pads])


@register_gradient("Gather", "GatherElements")
def _gather(ctx, node, grads):
    x, indices = node.input
    g = grads[0]
    if node.op_type == "GatherElements":
        one_hot = _one_hot_gather(ctx, node, grads)
        if one_hot is not None:
            return [one_hot, None]
    elif (one_slice := _constant_index_gather(ctx, node, g)) is not None:
        return [one_slice, None]
    elif attr(node, "axis", 0) == 0 and (pad := _padding_idx(node)) is not None:
        # torch's nn.Embedding(padding_idx=p): row p gets no gradient; the
        # lookups of p pass none.
        b = ctx.b
        hit = b.op("Equal", [indices, b.const(np.asarray(pad, dtype=onnx_to_np_dtype(
            ctx.dtype(indices))))])
        extra = ctx.rank(x, node) - 1  # the row's own axes
        g = ctx.mask_where(b.op("Not", [b.unsqueeze(hit, list(range(-extra, 0)))
                                        if extra else hit]), g, x)
    picked = _row_positions(ctx, node) if node.op_type == "Gather" else None
    if picked is None:
        picked = ctx.b.op(node.op_type, [ctx.positions(x), indices], axis=attr(node, "axis", 0))
    return [ctx.scatter_flat(x, picked, g, accumulate=True), None]


def _row_positions(ctx, node) -> str | None:
    """The flat positions of the elements an axis-0 ``Gather`` picks, from its indices alone:
    ``i * k + arange(k)`` for each index ``i`` (negative ones counted from the end), ``k``
    the static size of a row.

    The same positions as gathering a tensor of every element's position, without that
    tensor: on a wide table (an embedding, a first layer reading sparse rows) it is the
    size of the table, written and read at each step. None when the table's shape or the
    indices' rank is not known.
    """
    x, indices = node.input
    shape = ctx.shape(x)
    if (not shape or not all(isinstance(d, int) for d in shape)
            or attr(node, "axis", 0) % len(shape) != 0 or ctx.shape(indices) is None):
        return None
    b = ctx.b
    index = indices if ctx.dtype(indices) == TensorProto.INT64 else b.cast(
        indices, TensorProto.INT64)
    # Where rather than Mod: some GPU providers lack Mod (graph.passes.index_wraps_as_wheres)
    index = b.op("Where", [b.op("Less", [index, b.const(np.int64(0))]),
                           b.op("Add", [index, b.const(np.int64(shape[0]))]), index])
    row = int(np.prod(shape[1:], dtype=np.int64))
    if row != 1:
        index = b.op("Mul", [index, b.const(np.int64(row))])
    if len(shape) == 1:
        return index
    offsets = b.const(np.arange(row, dtype=np.int64).reshape(shape[1:]), hint="offsets")
    rank = ctx.rank(indices)
    return b.op("Add", [b.unsqueeze(index, list(range(rank, rank + len(shape) - 1))),
                        offsets])


@register_gradient("Expand")
def _expand(ctx, node, grads):
    x = node.input[0]
    return [ctx.sum_to(grads[0], x, ctx.shape(node.output[0])), None]


def _unique_targets(ctx, node) -> bool:
    """Whether the constant indices of a Scatter* node never hit one element twice."""
    data, indices = node.input[:2]
    idx, shape = ctx.constant_value(indices), ctx.shape(data)
    if idx is None or shape is None or not all(isinstance(d, int) for d in shape):
        return False
    idx = np.asarray(idx, dtype=np.int64)
    if node.op_type == "ScatterElements":
        axis = attr(node, "axis", 0) % len(shape)
        coords = list(np.indices(idx.shape))
        coords[axis] = idx % shape[axis]
        targets = np.stack([c.ravel() for c in coords], axis=1)
    else:  # ScatterND: rows of the last axis address slices
        k = idx.shape[-1]
        targets = idx.reshape(-1, k) % np.asarray(shape[:k], dtype=np.int64)
    return len(np.unique(targets, axis=0)) == len(targets)


@register_gradient("ScatterElements", "ScatterND")
def _scatter(ctx, node, grads):
    """Gradients of data and updates of ScatterElements and ScatterND.

    ``reduction='none'`` overwrites: data gets no gradient where it was
    replaced (onnx forbids duplicate indices there). ``'add'`` passes the
    gradient to both. ``'mul'`` multiplies data by the updates hitting each
    element: exact for data; for updates, exact when the indices are a
    constant without duplicates, refused otherwise. ``'max'``/``'min'`` are
    refused.
    """
    data, indices, updates = node.input
    g, b = grads[0], ctx.b
    reduction = attr(node, "reduction", "none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    kwargs = {"axis": attr(node, "axis", 0)} if node.op_type == "ScatterElements" else {}
    gather = "GatherElements" if node.op_type == "ScatterElements" else "GatherND"
    if reduction not in ("none", "add", "mul"):
        raise NotImplementedError(
            f"No gradient for {node.op_type} node {node.name!r} with reduction={reduction!r}: "
            "ties between data and updates make it ambiguous. Rewrite the model with "
            "reduction='none' or 'add', or leave its inputs out of wrt.")
    d_data = d_updates = None
    if ctx.needs(data):
        if reduction == "none":
            d_data = b.op(node.op_type, [g, indices, ctx.zeros_like(updates)], **kwargs)
        elif reduction == "add":
            d_data = g
        else:
            factor = b.op(node.op_type, [ctx.fill_like(data, 1), indices, updates],
                          reduction="mul", **kwargs)
            d_data = b.op("Mul", [g, factor])
    if ctx.needs(updates):
        if reduction == "mul":
            if not _unique_targets(ctx, node):
                raise NotImplementedError(
                    f"The gradient of {node.op_type} node {node.name!r} (reduction='mul') "
                    f"w.r.t. its updates {updates!r} needs constant indices that hit each "
                    "element at most once (the product of the other updates is not known "
                    "otherwise). Make the indices a constant without duplicates, or leave "
                    "the updates out of wrt.")
            g = b.op("Mul", [g, data])  # out = data * update at each hit element
        d_updates = b.op(gather, [g, indices], **kwargs)
    return [d_data, None, d_updates]


@register_gradient("GatherND")
def _gather_nd(ctx, node, grads):
    # The flat position of every gathered element, gathered alike, receives
    # its gradient; repeated indices add up.
    x, indices = node.input
    picked = ctx.b.op("GatherND", [ctx.positions(x), indices],
                      batch_dims=attr(node, "batch_dims", 0))
    return [ctx.scatter_flat(x, picked, grads[0], accumulate=True), None]


@register_gradient("CumSum")
def _cumsum(ctx, node, grads):
    # Each input element counts in the outputs after it (before it when
    # reversed): the gradient is the cumulative sum the other way round.
    return [ctx.b.op("CumSum", [grads[0], node.input[1]],
                     exclusive=attr(node, "exclusive", 0),
                     reverse=1 - attr(node, "reverse", 0)), None]


@register_gradient("Trilu")
def _trilu(ctx, node, grads):
    # A mask, its own adjoint: the gradient is masked the same way.
    return [ctx.b.op("Trilu", [grads[0]] + list(node.input[1:]),
                     upper=attr(node, "upper", 1)), None]


@register_gradient("TopK")
def _topk(ctx, node, grads):
    # Values are picked at Indices (distinct along the axis): scatter the
    # gradient back there. Indices carry no gradient; K is an integer.
    x = node.input[0]
    if grads[0] is None:
        return [None, None]
    return [ctx.b.op("ScatterElements", [ctx.zeros_like(x), node.output[1], grads[0]],
                     axis=attr(node, "axis", -1)), None]


@register_gradient("Tile")
def _tile(ctx, node, grads):
    x, repeats = node.input
    rank = ctx.rank(x, node)
    b = ctx.b
    # View the output as [r0, d0, r1, d1, ...] and sum over the repeat axes.
    pairs = b.op("Concat", [b.unsqueeze(repeats, [1]), b.unsqueeze(ctx.shape_of(x), [1])], axis=1)
    split = b.op("Reshape", [grads[0], b.op("Reshape", [pairs, b.ints([-1], hint="flat")])])
    return [b.reduce("ReduceSum", split, list(range(0, 2 * rank, 2)), keepdims=0), None]


@register_gradient("Dropout")
def _dropout(ctx, node, grads):
    x, g = node.input[0], grads[0]
    ratio, training = optional_input(node, 1), optional_input(node, 2)
    flag = ctx.constant_value(training)
    if training is None or (flag is not None and not bool(flag)):
        return [g]  # inference mode: the identity
    # The gradient needs the mask drawn by the forward pass.
    mask = ctx.expose_output(node, 1, "dropout_mask")
    b = ctx.b
    if ratio is None:
        keep = ctx.const(0.5, like=x)
    else:
        r = ratio if ctx.dtype(ratio) == ctx.dtype(x) else b.cast(ratio, ctx.dtype(x))
        keep = b.op("Sub", [ctx.const(1, like=x), r])
    scale = b.op("Reciprocal", [keep])
    if flag is None:  # training mode decided at run time
        scale = b.op("Where", [training, scale, ctx.const(1, like=x)])
    return [b.op("Mul", [ctx.mask_where(mask, g, x), scale])]
