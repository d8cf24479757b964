"""What an epoch's ``Loop`` body computes once per epoch instead of once per step.

A node of the body costs onnxruntime about a quarter of a microsecond at every
iteration whatever its size: :func:`hoisted` moves the nodes whose value is the
same at every iteration out of the body, and :func:`row_wise_once_per_epoch`
first rewrites the row-wise work on a batch's rows (the labels' ``2 y - 1``, a
one-hot encoding) as that work on every row, gathered, which :func:`hoisted`
then moves.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import helper

from ..graph import GraphBuilder, node_reads

__all__ = ["HOISTED", "hoisted", "renamed", "row_wise_once_per_epoch"]

#: Operators drawing random numbers: a new draw each step, never computed once per epoch.
_DRAWS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                    "Multinomial", "Bernoulli", "Dropout"})
#: Suffix of a value computed once per epoch instead of once per step.
HOISTED = ".per_epoch"

#: Elementwise operators: on gathered rows, the rows gathered from the operator's value.
_ROW_WISE = frozenset({"Add", "Sub", "Mul", "Div", "Equal", "Less", "LessOrEqual", "Greater",
                       "GreaterOrEqual", "And", "Or", "Not", "Neg", "Abs", "Cast", "Where"})
#: Most elements a row of a value computed on every row once per epoch: the epoch then
#: computes ``rows`` times as many, a step ``rows / batch`` nodes fewer.
ROW_WISE_MAX_ELEMENTS = 64


def renamed(node: onnx.NodeProto, names: dict) -> onnx.NodeProto:
    """``node`` reading ``names[v]`` for each of its inputs ``v`` in ``names``."""
    if not any(i in names for i in node.input):
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.input[:] = [names.get(i, i) for i in node.input]
    return copy


def hoisted(nodes, varying, b: GraphBuilder) -> list:
    """``nodes`` of a ``Loop`` body less those computing the same value at every iteration.

    A node that reads only constants and values from outside the body (not
    the iteration number, the condition nor a carried value: ``varying``,
    nor what a node reading them computes) is moved to ``b``, which runs once
    per call, its outputs renamed; the constants it reads are copied there.
    Random draws (:data:`_DRAWS`), operators of other domains and nodes with
    subgraphs stay.
    """
    constants = {n.output[0]: n for n in nodes if n.op_type == "Constant"}
    varying, moved, copies, kept = set(varying), {}, {}, []
    for node in nodes:
        reads = node_reads(node)
        if node.op_type == "Constant":
            kept.append(node)
            continue
        if (reads & varying or node.op_type in _DRAWS or node.domain not in ("", "ai.onnx")
                or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                       for a in node.attribute)):
            varying.update(node.output)
            kept.append(node)
            continue
        for v in reads & constants.keys() - copies.keys():
            copies[v] = v + HOISTED
            const = onnx.NodeProto()
            const.CopyFrom(constants[v])
            const.output[:] = [copies[v]]
            const.name = copies[v]
            b.nodes.append(const)
        moved_node = onnx.NodeProto()
        moved_node.CopyFrom(node)
        moved_node.input[:] = [moved.get(i, copies.get(i, i)) for i in node.input]
        moved.update((o, o + HOISTED) for o in node.output if o)
        moved_node.output[:] = [moved.get(o, o) for o in node.output]
        moved_node.name = (node.name or node.output[0]) + HOISTED
        b.nodes.append(moved_node)
    return [renamed(node, moved) for node in kept]


def _constants(nodes) -> dict:
    """``{output: numpy array}`` of the ``Constant`` nodes holding a tensor."""
    return {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
            for n in nodes if n.op_type == "Constant" and n.attribute
            and n.attribute[0].name == "value"}


def _row_wise(node, constants: dict) -> bool:
    """Whether ``node`` computes each row of its value from the same row of its inputs:
    an elementwise operator, or an ``Unsqueeze`` of axes counted from the end."""
    if node.op_type == "Unsqueeze" and len(node.input) == 2:
        axes = constants.get(node.input[1])
        return axes is not None and bool(np.all(np.asarray(axes) < 0))
    return node.op_type in _ROW_WISE


def row_wise_once_per_epoch(nodes, outer: set, shapes: dict) -> list:
    """``f(Gather(D, i), c)`` rewritten as ``Gather(f(D, c), i)`` where ``f`` is row-wise.

    ``D`` is a value from outside the body (``outer``: every row of a data
    input, or the epoch's rows as a (batches, rows, ...) table), ``i`` a
    batch's row numbers or its number in that table, ``f`` an elementwise
    operator (:data:`_ROW_WISE`) or an ``Unsqueeze`` of the last axes, its
    other operands constants that broadcast along the rows' own axes only,
    or the same rows of other outer values. Both give the same values, bit
    for bit; ``f(D, c)`` then reads no value of the body and :func:`hoisted`
    computes it once per epoch. The gathers only ``f`` read go: a step runs
    one node less per rewritten node. Done where a row of ``f``'s value
    holds at most :data:`ROW_WISE_MAX_ELEMENTS` elements (``shapes``: the
    step's for a number of rows,
    :func:`~ortlearn.training.batch_shapes.probe_shapes`), so that the
    epoch's extra work stays small.
    """
    constants = _constants(nodes)
    producer = {o: n for n in nodes for o in n.output}
    reads = collections.Counter(v for n in nodes for v in n.input)
    out, dropped = [], set()
    for node in nodes:
        rows = [producer.get(v) for v in node.input]
        gathers = [g for g in rows if g is not None and g.op_type == "Gather"
                   and not any(a.name == "axis" and a.i != 0 for a in g.attribute)
                   and g.input[0] in outer]
        shape = shapes.get(node.output[0]) if node.output else None
        if (not _row_wise(node, constants) or len(node.output) != 1 or not gathers
                or len({g.input[1] for g in gathers}) != 1 or shape is None
                or not all(isinstance(d, int) for d in shape)
                or int(np.prod(shape[1:], dtype=np.int64)) > ROW_WISE_MAX_ELEMENTS):
            out.append(node)
            continue
        index = gathers[0].input[1]
        index_rank, rank = len(shapes.get(index, [None])), len(shape)
        by_value = {g.output[0]: g for g in gathers}
        others = [constants.get(v) for v in node.input if v not in by_value]
        if any(c is None or np.ndim(c) > rank or (index_rank == 1 and np.ndim(c) == rank
                                                  and np.shape(c)[0] != 1) for c in others):
            out.append(node)
            continue
        every_row = onnx.NodeProto()
        every_row.CopyFrom(node)
        every_row.input[:] = [by_value[v].input[0] if v in by_value else v for v in node.input]
        every_row.output[:] = [node.output[0] + ".every_row"]
        every_row.name = every_row.output[0]
        gather = helper.make_node("Gather", [every_row.output[0], index], list(node.output),
                                  name=node.output[0])
        out += [every_row, gather]
        outer.add(every_row.output[0])
        producer[node.output[0]] = gather
        for v in node.input:
            if v in by_value:
                reads[v] -= 1
                if not reads[v]:
                    dropped.add(id(by_value[v]))
    return [n for n in out if id(n) not in dropped]
