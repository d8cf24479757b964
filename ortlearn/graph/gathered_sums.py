"""Sums of single elements gathered from one tensor, rewritten as one reduction.

The dynamo exporter writes ``nn.AdaptiveAvgPool2d`` to an output size that does not divide
the input's (a 112 x 112 map to 5 x 7) as the windows gathered into one tensor, then one
``Gather`` of a scalar index per element of a window, all added up: 384 ``Gather`` and 383
``Add`` nodes for a 24 x 16 window. Each of those ``Gather`` nodes has a gradient the size
of the windows' tensor: a step of a batch of 8 held 22 GB. :func:`gathered_sums_as_reductions`
finds such a tree of ``Add`` nodes whose leaves are chains of ``Gather`` nodes with scalar
constant indices into one tensor and whose index tuples form a full grid, and replaces it
by ``ReduceSum(Gather(X, I, a), axes)`` (a ``Gather`` of the index vector per axis): the same
sum, up to the order of the additions, and one gradient.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .nodes import constant_values, readers, rewritten

__all__ = ["MIN_LEAVES", "gathered_sums_as_reductions"]

#: Fewest gathered elements a sum must add to be rewritten.
MIN_LEAVES = 4


def _element(name: str, producers: dict, constants: dict):
    """``(base, ((axis, index), ...), gathers)`` of a chain of scalar-index Gathers ending
    at ``name``, axes in the base's coordinates; None for anything else."""
    steps, gathers = [], []
    while True:
        node = producers.get(name)
        if node is None or node.op_type != "Gather" or node.domain not in ("", "ai.onnx"):
            break
        index = constants.get(node.input[1])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if index is None or np.ndim(index) != 0 or axis < 0 or int(index) < 0:
            break
        steps.append((axis, int(index)))
        gathers.append(node)
        name = node.input[0]
    if not steps:
        return None
    # steps run from the last Gather to the first: map each axis to the base's coordinates
    removed, mapped = [], []
    for axis, index in reversed(steps):
        for gone in sorted(removed):
            if axis >= gone:
                axis += 1
        removed.append(axis)
        mapped.append((axis, index))
    return name, tuple(sorted(mapped)), gathers


def _tree(root, producers: dict, reading: dict, outputs: set):
    """The ``Add`` nodes of the tree under ``root`` and its leaves (values)."""
    adds, leaves, stack = [], [], [root]
    while stack:
        node = stack.pop()
        adds.append(node)
        for value in node.input:
            child = producers.get(value)
            if (child is not None and child.op_type == "Add" and value not in outputs
                    and len(reading.get(value, ())) == 1):
                stack.append(child)
            else:
                leaves.append(value)
    return adds, leaves


def _grid(elements) -> list | None:
    """The sorted indices of each axis when the index tuples are each one point of a full
    grid, else None."""
    axes = [axis for axis, _ in elements[0]]
    if any([axis for axis, _ in e] != axes for e in elements):
        return None
    points = [tuple(i for _, i in e) for e in elements]
    per_axis = [sorted({p[k] for p in points}) for k in range(len(axes))]
    if len(set(points)) != len(points) or len(points) != int(np.prod([len(v) for v in per_axis])):
        return None
    return per_axis if set(points) == set(itertools.product(*per_axis)) else None


def gathered_sums_as_reductions(model: onnx.ModelProto) -> int:
    """Rewrite each sum of gathered elements that covers a full grid as one reduction, in place.

    Returns
    -------
    int
        The number of sums rewritten.
    """
    graph = model.graph
    nodes = list(graph.node)
    if sum(n.op_type == "Gather" for n in nodes) < MIN_LEAVES:
        return 0
    producers = {o: n for n in nodes for o in n.output if o}
    reading = readers(nodes)
    outputs = {o.name for o in graph.output}
    constants = constant_values(graph)
    replaced, dropped, taken, chains = {}, set(), set(), []
    for node in reversed(nodes):  # the roots first: a subtree is never rewritten alone
        if node.op_type != "Add" or id(node) in taken:
            continue
        adds, leaves = _tree(node, producers, reading, outputs)
        taken.update(id(a) for a in adds)
        if len(leaves) < MIN_LEAVES:
            continue
        elements = [_element(leaf, producers, constants) for leaf in leaves]
        if any(e is None for e in elements) or len({e[0] for e in elements}) != 1:
            continue
        per_axis = _grid([e[1] for e in elements])
        if per_axis is None:
            continue
        base, axes = elements[0][0], [axis for axis, _ in elements[0][1]]
        out, value = [], base
        for axis, indices in zip(axes, per_axis):
            name = f"{node.output[0]}_gathered_{axis}"
            index = numpy_helper.from_array(np.asarray(indices, dtype=np.int64),
                                            f"{name}_indices")
            out.append(helper.make_node("Constant", [], [index.name], value=index))
            out.append(helper.make_node("Gather", [value, index.name], [name], axis=axis))
            value = name
        reduce_axes = numpy_helper.from_array(np.asarray(axes, dtype=np.int64),
                                              f"{node.output[0]}_gathered_axes")
        out.append(helper.make_node("Constant", [], [reduce_axes.name], value=reduce_axes))
        out.append(helper.make_node("ReduceSum", [value, reduce_axes.name], [node.output[0]],
                                    keepdims=0))
        replaced[id(node)] = out
        dropped.update(id(a) for a in adds if a is not node)
        chains.extend(g for e in elements for g in e[2])
    if not replaced:
        return 0
    kept = rewritten(nodes, replaced, dropped)
    # the chains' Gathers that nothing reads any more (latest first: a chain's inner
    # Gather is read by its outer ones)
    reads = Counter(name for node in kept for name in _reads(node))
    reads.update(outputs)
    order = {id(n): i for i, n in enumerate(nodes)}
    unread = set()
    for gather in sorted({id(g): g for g in chains}.values(), key=lambda g: -order[id(g)]):
        if not any(reads[o] for o in gather.output):
            unread.add(id(gather))
            reads.subtract(_reads(gather))
    del graph.node[:]
    graph.node.extend(n for n in kept if id(n) not in unread)
    return len(replaced)


def _reads(node) -> list:
    """The values ``node`` reads, its subgraphs' outer values included."""
    names = list(node.input)
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for inner in g.node:
                names.extend(_reads(inner))
    return names
