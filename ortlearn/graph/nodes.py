"""Nodes and the values they read: attributes and optional inputs, the values known
before running, the nodes an output needs, pruning and renaming, initializers turned into
inputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import fileio
from .model import finalize_model, is_weight_stub
from .values import value_info_map


def readers(nodes) -> dict:
    """``{value: [the nodes reading it, in order]}``."""
    out: dict = {}
    for node in nodes:
        for value in node.input:
            out.setdefault(value, []).append(node)
    return out


def rewritten(nodes, replaced: dict, dropped: set) -> list:
    """``nodes`` with ``replaced[id(node)]`` (a list) for a node, those of ``dropped`` left out
    (what a rewrite that replaces some nodes by others returns)."""
    out = []
    for node in nodes:
        if id(node) in replaced:
            out.extend(replaced[id(node)])
        elif id(node) not in dropped:
            out.append(node)
    return out


def initializer_map(graph: onnx.GraphProto) -> dict[str, TensorProto]:
    """The initializers of ``graph`` by name."""
    return {init.name: init for init in graph.initializer}


def initializers_to_inputs(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Turn the initializers ``names`` of ``model`` into graph inputs, in place.

    Returns their values, in the order of ``names`` (feeds for a session); a
    :func:`~ortlearn.graph.weight_stub` has none.
    """
    wanted = set(names)
    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer
              if init.name in wanted and not is_weight_stub(init)}
    weights_to_inputs(model, names)
    return {name: values[name] for name in names if name in values}


def weights_to_inputs(model: onnx.ModelProto, names: Sequence[str]) -> None:
    """Turn the initializers ``names`` of ``model`` into graph inputs of their type and
    shape, in place, their values dropped."""
    graph = model.graph
    wanted = set(names)
    moved = [i for i in graph.initializer if i.name in wanted]
    kept = [i for i in graph.initializer if i.name not in wanted]
    graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
                       for i in moved)
    del graph.initializer[:]
    graph.initializer.extend(kept)


def node_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node reads: its inputs and the outer values its subgraphs (If, Loop, Scan) use."""
    names = {i for i in node.input if i}
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for graph in graphs:
            for sub in graph.node:
                names |= node_reads(sub)
    return names


def attr(node: onnx.NodeProto, name: str, default=None):
    """Value of attribute ``name`` of ``node`` (``default`` when absent)."""
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def optional_input(node: onnx.NodeProto, index: int) -> str | None:
    """Name of input ``index`` of ``node``, None when omitted."""
    return node.input[index] if len(node.input) > index and node.input[index] else None


def constant_values(graph: onnx.GraphProto, wrt: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """Values known before running: initializers that are neither inputs nor in ``wrt``,
    and the outputs of ``Constant`` nodes."""
    inputs = {i.name for i in graph.input}
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer
              if init.name not in inputs and init.name not in wrt}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            a = node.attribute[0]
            if a.name == "value":
                values[node.output[0]] = numpy_helper.to_array(a.t)
            elif a.name in ("value_float", "value_int", "value_floats", "value_ints"):
                values[node.output[0]] = np.asarray(helper.get_attribute_value(a))
    return values


def needed_nodes(nodes: Sequence[onnx.NodeProto], outputs: Sequence[str]) -> list:
    """The nodes (in their order) that computing ``outputs`` needs."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed |= node_reads(node)
    kept.reverse()
    return kept


def prune_model(model: onnx.ModelProto, outputs: Sequence[str],
                weights: dict | None = None) -> onnx.ModelProto:
    """The part of ``model`` that computes ``outputs``, ``weights`` baked in.

    ``outputs`` may name any value of the graph, not only its outputs. Each
    entry of ``weights`` (name -> array) becomes an initializer, replacing
    the graph input or initializer of that name; inputs and initializers
    that no kept node reads are dropped.

    Raises
    ------
    ValueError
        If ``outputs`` is empty or names a value the graph does not have.
    """
    weights = weights or {}
    if not outputs:
        raise ValueError("No output to keep: name at least one output.")
    infos = value_info_map(model)
    unknown = [n for n in outputs if n not in infos]
    if unknown:
        raise ValueError(f"{unknown} are not values of the model; its outputs are "
                         f"{[o.name for o in model.graph.output]}.")
    graph = model.graph
    kept = needed_nodes(graph.node, outputs)
    needed = set(outputs)
    for node in kept:
        needed |= node_reads(node)
    inputs = [i for i in graph.input if i.name in needed and i.name not in weights]
    baked = {name: np.asarray(value) for name, value in weights.items() if name in needed}
    too_large = {name: value.nbytes for name, value in baked.items()
                 if value.nbytes > fileio.MAX_TENSOR_BYTES}
    if too_large:
        name, size = next(iter(too_large.items()))
        raise ValueError(
            f"Weight {name!r} holds {size / 2**30:.2f} GiB, more than the 2 GiB one ONNX tensor "
            "can hold (protobuf's limit on a field): it cannot become an initializer of the "
            "model. Split it into several tensors, or keep it a graph input and feed it.")
    initializers = [numpy_helper.from_array(value, name) for name, value in baked.items()]
    initializers += [i for i in graph.initializer if i.name in needed and i.name not in weights]
    new_outputs = []
    for name in outputs:
        info = onnx.ValueInfoProto()
        info.CopyFrom(infos[name])
        new_outputs.append(info)
    new_graph = helper.make_graph(kept, graph.name, inputs, new_outputs, initializers)
    pruned = helper.make_model(new_graph, opset_imports=list(model.opset_import),
                               producer_name="ortlearn")
    pruned.functions.extend(model.functions)
    return finalize_model(pruned)


def rename_value(model: onnx.ModelProto, old: str, new: str) -> None:
    """Rename a value: its producer or graph input, its readers, graph outputs, value infos."""
    for node in model.graph.node:
        for seq in (node.input, node.output):
            for i, name in enumerate(seq):
                if name == old:
                    seq[i] = new
    for info in itertools.chain(model.graph.input, model.graph.output,
                                model.graph.value_info):
        if info.name == old:
            info.name = new
