"""One ONNX graph per training step: batch selection, forward, backward, update.

:func:`build_fused_step` turns a loss graph into the graph a
:class:`~ortlearn.estimators._engine.TrainingEngine` runs once per
mini-batch; :func:`build_fused_epoch` wraps the same nodes in an ONNX
``Loop`` that runs every mini-batch of an epoch in one call.

The whole training set is a graph input (put on the device once): a step
reads its rows from the epoch's row order with ``Gather``, so nothing is
copied from the host per step. The inputs and outputs of the step graph
(see :class:`FusedLayout`) are:

- data (one per data input of the loss graph, all rows), ``order`` (int64
  row numbers of the epoch, batch after batch), ``offsets`` (int64, where
  each batch starts in ``order``, then the total), ``lrs`` (float32, the
  learning rate of each batch of the epoch) and ``base_step`` (int64, the
  updates made before the epoch): set once per epoch;
- carried values, each an input and an output: ``k`` (the batch number in
  the epoch, step mode only), ``loss_sum`` (float64, the sum of
  ``batch_loss * batch_rows`` so far), the weights, the optimizer states.

The step runs ``k -> k + 1``: the engine feeds the outputs of one step as
the inputs of the next (ping-pong buffers), so a step needs no host value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from .._onnx_helper import GraphBuilder, elem_type_of, finalize_model, opset_of, shape_of

__all__ = ["FusedLayout", "build_fused_step", "build_fused_epoch"]

ORDER, OFFSETS, LRS, BASE_STEP = "fused.order", "fused.offsets", "fused.lrs", "fused.base_step"
STEP_IN_EPOCH, LOSS_SUM = "fused.k", "fused.loss_sum"
_NEXT, _DATA = ".next", ".all"


@dataclass(frozen=True)
class FusedLayout:
    """Names of the fused graph's inputs and outputs.

    Attributes
    ----------
    data : dict of str to str
        Data input of the loss graph -> graph input holding all its rows.
    epoch_inputs : tuple of str
        ``order``, ``offsets``, ``lrs``, ``base_step`` (set once per epoch).
    carried : dict of str to str
        Carried input -> the output holding its next value (weights,
        optimizer states, ``loss_sum`` and, in step mode, ``k``).
    weights : dict of str to str
        ``{weight: carried input name}``.
    states : dict of str to dict of str to str
        ``{weight: {state name: carried input name}}``.
    loss_sum : str
        The carried input of the running loss sum.
    """

    data: dict
    epoch_inputs: tuple
    carried: dict
    weights: dict
    states: dict
    loss_sum: str


def _state_name(param: str, state: str) -> str:
    return f"{param}.{state}"


def _step_nodes(model: onnx.ModelProto, trainable, input_names, optimizer, loss_output: str,
                k: str):
    """Nodes of one step appended to ``model`` (a copy), with the carried output names.

    ``model``'s trainable initializers become inputs, its data inputs are
    replaced by ``Gather`` of the full data; ``k`` names the batch number.
    Returns the graph inputs to add and ``{carried input: output}``.
    """
    from ..autodiff import append_backward

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    declared = {i.name: i for i in graph.input}
    params = [inits[n] for n in trainable]
    kept = [i for i in graph.initializer if i.name not in set(trainable)]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.input[:]

    b = GraphBuilder.for_model(model, prefix="fused_")
    for name in (ORDER, OFFSETS, LRS, BASE_STEP, LOSS_SUM, k):
        b.reserve(name)
    # Batch k is order[offsets[k]:offsets[k + 1]].
    k1 = b.unsqueeze(k, [0])
    k_next = b.op("Add", [k, b.const(1, dtype=np.int64)])
    start = b.op("Gather", [OFFSETS, k1])
    end = b.op("Gather", [OFFSETS, b.op("Add", [k1, b.const([1], dtype=np.int64)])])
    rows = b.op("Slice", [ORDER, start, end, b.ints([0])])
    inputs = []
    for name in input_names:
        info = declared[name]
        full = b.reserve(name + _DATA)
        dims = shape_of(info)
        dims = ["n_rows"] + list(dims[1:]) if dims else None
        inputs.append(helper.make_tensor_value_info(full, elem_type_of(info), dims))
        b.op("Gather", [full, rows], outputs=[name], axis=0)
    lr = b.op("Gather", [LRS, k])
    step = b.op("Add", [BASE_STEP, b.op("Add", [k, b.const(1, dtype=np.int64)])])
    n_rows = b.cast(b.op("Squeeze", [b.op("Shape", [rows])]), TensorProto.DOUBLE)
    prologue = b.nodes
    b.nodes = []
    forward = list(graph.node)
    del graph.node[:]
    graph.node.extend(prologue + forward)
    scalar = helper.make_tensor_value_info
    inputs += [scalar(ORDER, TensorProto.INT64, ["n_epoch_rows"]),
               scalar(OFFSETS, TensorProto.INT64, ["n_batches_1"]),
               scalar(LRS, TensorProto.FLOAT, ["n_batches"]),
               scalar(BASE_STEP, TensorProto.INT64, [])]
    states = {p.name: {s: _state_name(p.name, s) for s in optimizer.state_names} for p in params}
    carried_inputs = [scalar(LOSS_SUM, TensorProto.DOUBLE, [])]
    if k == STEP_IN_EPOCH:
        carried_inputs.append(scalar(k, TensorProto.INT64, []))
    for p in params:
        for name in (p.name, *states[p.name].values()):
            carried_inputs.append(scalar(name, p.data_type, list(p.dims)))
    graph.input.extend(inputs + carried_inputs)
    if k != STEP_IN_EPOCH:
        graph.input.append(scalar(k, TensorProto.INT64, []))

    grads = append_backward(model, loss_output, list(trainable), builder=b)
    batch_loss = b.reduce("ReduceSum", b.cast(loss_output, TensorProto.DOUBLE), keepdims=0)
    carried = {LOSS_SUM: b.op("Add", [LOSS_SUM, b.op("Mul", [batch_loss, n_rows])],
                              outputs=[b.reserve(LOSS_SUM + _NEXT)])}
    if k == STEP_IN_EPOCH:
        b.op("Identity", [k_next], outputs=[b.reserve(k + _NEXT)])
        carried[k] = k + _NEXT
    # optimizer.build reserves these names.
    updated = {p.name: p.name + _NEXT for p in params}
    for p in params:
        for value in states[p.name].values():
            b.reserve(value)
            updated[value] = value + _NEXT
    optimizer.build(b, trainable, [grads[n] for n in trainable], states, lr, step,
                    elem_types=[p.data_type for p in params], updated_names=updated)
    b.add_to_graph(graph)
    carried.update(updated)
    layout = FusedLayout({n: n + _DATA for n in input_names}, (ORDER, OFFSETS, LRS, BASE_STEP),
                         carried, {p.name: p.name for p in params}, states, LOSS_SUM)
    return inputs, carried_inputs, layout


def _prune(graph: onnx.GraphProto, outputs) -> list:
    """The nodes of ``graph`` that ``outputs`` need, in order."""
    needed, kept = set(outputs), []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(n for n in node.input if n)
    kept.reverse()
    return kept


def _value_infos(infos, names, suffix: str = "") -> list:
    out = []
    for name in names:
        info = onnx.ValueInfoProto()
        info.CopyFrom(infos[name])
        info.name = name + suffix
        out.append(info)
    return out


def build_fused_step(loss_model: onnx.ModelProto, trainable, input_names, optimizer,
                     loss_output: str = "loss") -> tuple[onnx.ModelProto, FusedLayout]:
    """The graph of one training step (one ORT call per mini-batch).

    Parameters
    ----------
    loss_model : onnx.ModelProto
        A graph with a scalar output ``loss_output``; not modified.
    trainable : list of str
        Float initializers to train.
    input_names : list of str
        The data inputs of the graph (fed all rows at once).
    optimizer : ortlearn.optim.SGD, Adam or AdamW
        The update rule, appended with its ``build``.
    loss_output : str, default='loss'

    Returns
    -------
    model : onnx.ModelProto
        The checked step graph.
    layout : FusedLayout
        Its input and output names.
    """
    model = onnx.ModelProto()
    model.CopyFrom(loss_model)
    inputs, carried_inputs, layout = _step_nodes(model, trainable, input_names, optimizer,
                                                 loss_output, STEP_IN_EPOCH)
    graph = model.graph
    infos = {i.name: i for i in carried_inputs}
    outputs = _value_infos(infos, layout.carried)
    for info, name in zip(outputs, layout.carried.values()):
        info.name = name
    nodes = _prune(graph, list(layout.carried.values()))
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.output[:]
    graph.output.extend(outputs)
    del graph.value_info[:]
    return finalize_model(model), layout


def build_fused_epoch(loss_model: onnx.ModelProto, trainable, input_names, optimizer,
                      loss_output: str = "loss") -> tuple[onnx.ModelProto, FusedLayout]:
    """The graph of one epoch: an ONNX ``Loop`` of the step over the mini-batches.

    Same parameters and layout as :func:`build_fused_step`, without ``k``
    (the loop's iteration number counts the batches); the number of
    iterations is the length of ``lrs``.
    """
    model = onnx.ModelProto()
    model.CopyFrom(loss_model)
    k = "fused.iteration"
    inputs, carried_inputs, layout = _step_nodes(model, trainable, input_names, optimizer,
                                                 loss_output, k)
    graph = model.graph
    infos = {i.name: i for i in carried_inputs}
    carried = list(layout.carried)
    body_nodes = _prune(graph, list(layout.carried.values()))
    cond = "fused.cond"
    body_nodes.append(helper.make_node("Identity", [cond], [cond + _NEXT]))
    body = helper.make_graph(
        body_nodes, "fused_epoch_body",
        [helper.make_tensor_value_info(k, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond, TensorProto.BOOL, [])]
        + [infos[c] for c in carried],  # in the order of the outputs
        [helper.make_tensor_value_info(cond + _NEXT, TensorProto.BOOL, [])]
        + [_value_infos(infos, [c])[0] for c in carried])
    for info, name in zip(body.output[1:], layout.carried.values()):
        info.name = name
    # Outer names differ from the body's (no shadowing across scopes).
    b = GraphBuilder(opset=opset_of(model), prefix="fused_epoch_")
    trips = b.op("Squeeze", [b.op("Shape", [LRS])])
    true = b.const(True)
    outer_in = {c: c + ".in" for c in carried}
    outer_out = {c: c + ".out" for c in carried}
    b.op("Loop", [trips, true, *outer_in.values()], outputs=list(outer_out.values()), body=body)
    del graph.node[:]
    graph.node.extend(b.nodes)
    del graph.input[:]
    graph.input.extend(inputs + _value_infos(infos, carried, ".in"))
    del graph.output[:]
    graph.output.extend(_value_infos(infos, carried, ".out"))
    del graph.value_info[:]
    epoch_layout = FusedLayout(layout.data, layout.epoch_inputs,
                               {outer_in[c]: outer_out[c] for c in carried},
                               {p: outer_in[p] for p in layout.weights},
                               {p: {s: outer_in[v] for s, v in d.items()}
                                for p, d in layout.states.items()},
                               outer_in[LOSS_SUM])
    return finalize_model(model), epoch_layout
