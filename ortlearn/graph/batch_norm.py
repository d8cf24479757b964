"""BatchNormalization's two modes: which nodes normalise with the batch's statistics (a
training graph), the switch to the running ones (an eval or inference graph), and the
running statistics' update, torch's, that a training step carries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from .builder import GraphBuilder
from .format import UPDATED_SUFFIX
from .model import onnx_to_np_dtype, opset_of
from .nodes import attr
from .values import elem_type_of, shape_of, value_info_map

__all__ = ["add_running_statistics_updates", "batch_norm_in_training_mode",
           "running_statistics", "set_inference_mode", "training_batch_norms"]


def batch_norm_in_training_mode(node: onnx.NodeProto, opset: int) -> bool:
    """Whether a BatchNormalization node normalises with the batch statistics.

    From opset 14 ``training_mode=1`` says so; before, a node with statistics
    outputs runs in training mode (onnxruntime's reading of opsets 9 to 13).
    """
    if opset >= 14:
        return bool(attr(node, "training_mode", 0))
    return any(node.output[1:])


def running_statistics(model: onnx.ModelProto) -> list[str]:
    """Initializers holding the running mean and variance of training-mode BatchNormalization.

    They are training state, not weights: each training step updates them
    from the batch statistics, and the eval and inference models
    (:func:`set_inference_mode`) normalise with them.
    """
    inits = {i.name for i in model.graph.initializer}
    names = []
    for node in training_batch_norms(model):
        names += [n for n in node.input[3:5] if n in inits and n not in names]
    return names


def training_batch_norms(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The BatchNormalization nodes of ``model.graph`` in training mode, in graph order."""
    opset = opset_of(model)
    return [node for node in model.graph.node
            if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx")
            and batch_norm_in_training_mode(node, opset)]


def set_inference_mode(model: onnx.ModelProto) -> None:
    """Dropout off and BatchNormalization on its running statistics, in place.

    Dropout's ``training_mode`` input becomes the empty name (the optional input left out,
    whose default is false), as onnxruntime-training's eval model has it.
    """
    for node in model.graph.node:
        if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
            node.input[2] = ""
        elif node.op_type == "BatchNormalization":
            for a in node.attribute:
                if a.name == "training_mode":
                    a.i = 0
            del node.output[1:]


def add_running_statistics_updates(model: onnx.ModelProto, names: Sequence[str]) -> list[str]:
    """Outputs ``<name>.updated`` with the new running mean and variance, torch's update.

    ``names`` are graph inputs holding running statistics of training-mode
    BatchNormalization nodes (others are ignored); each gets an output.

    ``new = momentum * running + (1 - momentum) * batch_stat`` with ONNX's
    ``momentum`` (1 - torch's momentum) and, for the variance, the unbiased
    batch variance (n / (n - 1) times the biased one), as torch does; ONNX's
    own running-variance output uses the biased variance. Return the frozen
    statistics updated, in graph order.
    """
    g = model.graph
    params = {i.name: i for i in g.input if i.name in set(names)}
    nodes = [n for n in training_batch_norms(model)
             if any(name in params for name in n.input[3:5])]
    if not nodes:
        return []
    infos = value_info_map(model)
    b = GraphBuilder.for_model(model, prefix="running_stats_")
    updated = []
    for node in nodes:
        x = node.input[0]
        shape = shape_of(infos[x]) if x in infos else None
        if shape is None:
            raise ValueError(f"The rank of the input {x!r} of BatchNormalization node "
                             f"{node.name!r} is unknown: its running statistics cannot be "
                             "updated.")
        like = elem_type_of(params[next(n for n in node.input[3:5] if n in params)])
        dtype = onnx_to_np_dtype(like)
        momentum = attr(node, "momentum", 0.9)
        # onnxruntime 1.32's CPU kernel writes the new statistics into its running-statistic
        # INPUTS, so a node reading them after it sees them already updated (measured: a
        # double update per step). Read the node's outputs only: ONNX's new mean is torch's;
        # its new variance uses the biased batch variance, torch's the unbiased one:
        # torch's = ONNX's + (1 - momentum) * biased / (n - 1).
        while len(node.output) < 3:
            node.output.append("")
        for i in (1, 2):
            if not node.output[i]:
                node.output[i] = b.unique_name(f"{node.input[i + 2]}_onnx_update")
        biased, n = _batch_statistics(b, x, len(shape), like)
        unbias = b.op("Div", [b.const(np.asarray(1 - momentum, dtype=dtype)),
                              b.op("Sub", [n, b.const(np.asarray(1, dtype=dtype))])])
        stats = [node.output[1], b.op("Add", [node.output[2], b.op("Mul", [biased, unbias])])]
        for name, stat in zip(node.input[3:5], stats):
            if name not in params:
                continue
            if name in updated:
                raise ValueError(f"The running statistic {name!r} is shared by several "
                                 "BatchNormalization nodes: which update wins is undefined.")
            out = b.reserve(name + UPDATED_SUFFIX)
            b.op("Identity", [stat], outputs=[out])
            info = onnx.ValueInfoProto()
            info.CopyFrom(params[name])
            info.name = out
            g.output.append(info)
            updated.append(name)
    b.add_to_graph(g)
    return updated


def _batch_statistics(b: GraphBuilder, x: str, rank: int, like: int):
    """Per-channel biased variance of ``x`` (channels on axis 1), shape ``(C,)``, and the
    number ``n`` of values per channel (a scalar of element type ``like``).

    Written as the gradient rule writes its statistics (same nodes, dims
    kept), so that onnxruntime's common-subexpression elimination can share them.
    """
    axes = [0, *range(2, rank)]
    mean = b.reduce("ReduceMean", x, axes, keepdims=1)
    centered = b.op("Sub", [x, mean])
    var = b.reduce("ReduceMean", b.op("Mul", [centered, centered]), axes, keepdims=1)
    var = b.op("Reshape", [var, b.ints([-1], hint="flat")])
    # n values per channel: Size(x) / C
    n = b.op("Div", [b.cast(b.op("Size", [x]), like),
                     b.cast(b.op("Size", [var]), like)])
    return var, n
