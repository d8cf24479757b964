"""Static shapes of forward values where ONNX shape inference gives up.

ONNX shape inference names each dimension it cannot compute with a fresh
symbol (``unk__0``), so two values known to share the batch dimension (a
``Reshape(y, [-1, 1])`` of a label vector ``y[N]``, two ``Slice`` of the same
rows) look unrelated, and the backward pass falls back to run-time shape
logic (``Shape``, ``Equal``, ``NonZero``...). :func:`refine_shapes` walks the
forward graph once with rules for the operators that matter and keeps the
more specific of its dimensions and those of shape inference. A dimension
it cannot compute exactly but knows to be the same for two values (two
slices of the same length with the same bounds) gets a symbol derived from
the computation, so equal symbols always mean equal sizes.
"""

from __future__ import annotations

import numpy as np
import onnx

from .nodes import attr, optional_input
from .values import OUTPUT_LIKE_INPUT0, shape_of

_SAME_SHAPE = OUTPUT_LIKE_INPUT0 | {"Cast", "IsInf", "IsNaN"}
_BROADCAST = frozenset((
    "Add", "And", "Div", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Max",
    "Mean", "Min", "Mod", "Mul", "Or", "Pow", "PRelu", "Sub", "Sum", "Where", "Xor",
))
_REDUCE = frozenset((
    "ReduceL1", "ReduceL2", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
    "ReduceProd", "ReduceSum", "ReduceSumSquare",
))


def refine_shapes(graph: onnx.GraphProto, infos: dict, constants: dict) -> dict[str, list]:
    """Shapes of the values of ``graph``: shape inference's, made more specific.

    Parameters
    ----------
    graph : onnx.GraphProto
        Forward graph, its nodes in topological order.
    infos : dict of str to onnx.ValueInfoProto
        What shape inference found.
    constants : dict of str to ndarray
        Values known before running (shape and axes operands).

    Returns
    -------
    shapes : dict of str to list
        ``{value: [int, symbol or None per dim]}`` for every value whose rank
        is known.
    """
    shapes = {name: shape_of(info) for name, info in infos.items()}
    shapes = {name: s for name, s in shapes.items() if s is not None}
    measured = {}  # the output of a Shape node -> the shape it measures
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        ins = [shapes.get(i) if i else None for i in node.input]
        if node.op_type == "Shape" and not node.attribute and ins[0] is not None:
            measured[node.output[0]] = ins[0]
        try:
            if node.op_type == "Expand" and node.input[1] in measured:
                # a gradient's upstream value expanded to the shape of what it reached
                found = broadcast_shape([ins[0], measured[node.input[1]]])
            else:
                found = _infer(node, ins, constants)
        except (IndexError, ValueError, TypeError, KeyError):
            found = None  # a malformed node: leave it to shape inference and the checker
        if found is not None and node.output:
            name = node.output[0]
            shapes[name] = _merge(shapes.get(name), found)
    return shapes


def _merge(known: list | None, found: list) -> list:
    """Per dimension, the more specific of shape inference's ``known`` and ``found``."""
    if known is None:
        return found
    if len(known) != len(found):
        return known
    out = []
    for k, f in zip(known, found):
        if isinstance(k, int) or f is None:
            out.append(k)
        else:
            out.append(f)
    return out


def broadcast_shape(shapes: list) -> list | None:
    """The shape of ``shapes`` broadcast together (None dims where it depends on sizes
    unknown here), or None if one of them is unknown."""
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    padded = [[1] * (rank - len(s)) + list(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        rest = {d for d in dims if d != 1}
        if not rest:
            out.append(1)
        elif len(rest) == 1:
            out.append(rest.pop())
        else:
            ints = [d for d in rest if isinstance(d, int)]
            # a symbolic dim broadcasts against an int > 1 only by being 1 or equal
            out.append(ints[0] if len(set(ints)) == 1 else None)
    return out


def _const_ints(constants: dict, name: str | None) -> list[int] | None:
    value = constants.get(name) if name else None
    return None if value is None else [int(v) for v in np.ravel(value)]


def _axes(node, constants: dict, rank: int) -> list[int] | None:
    axes = _const_ints(constants, optional_input(node, 1)) if len(node.input) > 1 \
        else attr(node, "axes")
    return None if axes is None else [int(a) % rank for a in axes]


def _infer(node, ins: list, constants: dict) -> list | None:
    op, x = node.op_type, ins[0] if ins else None
    if op in _SAME_SHAPE:
        return x
    if op in _BROADCAST:
        return broadcast_shape(ins)
    if op == "MatMul":
        return _matmul(*ins)
    if op == "Gemm":
        a, b = ins[:2]
        if a is None or b is None:
            return None
        return [a[1] if attr(node, "transA", 0) else a[0],
                b[0] if attr(node, "transB", 0) else b[1]]
    if x is None:
        return None
    if op == "GatherElements":
        return ins[1]
    if op == "Gather":
        axis = attr(node, "axis", 0) % len(x)
        return None if ins[1] is None else x[:axis] + ins[1] + x[axis + 1:]
    if op == "Reshape":
        return _reshape(x, _const_ints(constants, node.input[1]), attr(node, "allowzero", 0))
    if op in _REDUCE:
        return _reduce(node, x, constants)
    if op == "Unsqueeze":
        raw = (_const_ints(constants, optional_input(node, 1)) if len(node.input) > 1
               else attr(node, "axes"))
        if raw is None:
            return None
        rank = len(x) + len(raw)
        axes, it = {a % rank for a in raw}, iter(x)
        return [1 if i in axes else next(it) for i in range(rank)]
    if op == "Squeeze":
        axes = _axes(node, constants, len(x))
        if axes is None:
            return None
        return [d for i, d in enumerate(x) if i not in axes]
    if op == "Transpose":
        perm = attr(node, "perm") or list(range(len(x)))[::-1]
        return [x[p] for p in perm]
    if op == "Slice":
        return _slice(node, x, constants)
    return None


def _matmul(a, b):
    if a is None or b is None:
        return None
    a2 = [1] + a if len(a) == 1 else a
    b2 = b + [1] if len(b) == 1 else b
    batch = broadcast_shape([a2[:-2], b2[:-2]])
    if batch is None:
        return None
    out = batch + [a2[-2], b2[-1]]
    if len(b) == 1:
        out.pop(-1)
    if len(a) == 1:
        out.pop(-2 if len(b) > 1 else -1)
    return out


def _reshape(x, target, allowzero):
    if target is None:
        return None
    out = [x[i] if d == 0 and not allowzero and i < len(x) else d for i, d in enumerate(target)]
    if -1 not in out:
        return out
    known = [d for d in out if d != -1]
    if not all(isinstance(d, int) for d in known):
        return [d if d != -1 else None for d in out]
    symbols = [d for d in x if not isinstance(d, int)]
    ints = int(np.prod([d for d in x if isinstance(d, int)], dtype=np.int64))
    rest = int(np.prod(known, dtype=np.int64))
    if not symbols and rest:
        missing = ints // rest
    elif len(symbols) == 1 and symbols[0] is not None and ints == rest and symbols[0] not in out:
        missing = symbols[0]  # the -1 dim is the one symbolic input dim
    else:
        missing = None
    return [missing if d == -1 else d for d in out]


def _reduce(node, x, constants):
    if len(node.input) > 1 and node.input[1]:
        axes = _const_ints(constants, node.input[1])
        if axes is None:
            return None
    else:
        axes = attr(node, "axes") or []
    if not axes:
        if attr(node, "noop_with_empty_axes", 0) and len(node.input) > 1:
            return x
        axes = list(range(len(x)))
    axes = [a % len(x) for a in axes]
    if attr(node, "keepdims", 1):
        return [1 if i in axes else d for i, d in enumerate(x)]
    return [d for i, d in enumerate(x) if i not in axes]


def _slice(node, x, constants):
    starts, ends = node.input[1], node.input[2]
    axes_name, steps_name = optional_input(node, 3), optional_input(node, 4)
    start_v, end_v = _const_ints(constants, starts), _const_ints(constants, ends)
    axes = _const_ints(constants, axes_name) if axes_name else (
        list(range(len(start_v))) if start_v is not None else None)
    steps = _const_ints(constants, steps_name) if steps_name else [1] * len(axes or [])
    if axes is None or (steps_name and steps is None):
        return None
    out = list(x)
    for j, axis in enumerate(a % len(x) for a in axes):
        dim = x[axis]
        if isinstance(dim, int) and start_v is not None and end_v is not None and steps:
            out[axis] = len(range(*slice(start_v[j], end_v[j], steps[j]).indices(dim)))
        elif dim is not None:
            # Same input dim, same bounds: same length, whatever the values.
            out[axis] = f"slice({dim}|{starts}[{j}]|{ends}[{j}]|{steps_name}[{j}])"
        else:
            out[axis] = None
    return out
