"""One ONNX graph per training step: batch selection, forward, backward, update.

:func:`build_fused_step` turns a loss graph into the graph a
:class:`~ortlearn.training.TrainingEngine` runs once per mini-batch;
:func:`build_fused_epoch` wraps the same nodes in ONNX ``Loop`` nodes that run
every mini-batch of an epoch in one call (the batches of the first batch's
size with a step whose bookkeeping is done once per call).

The whole training set is a graph input (put on the device once): a step
reads its rows from the epoch's row order with ``Gather``, so nothing is
copied from the host per step. The inputs and outputs of the step graph
(see :class:`FusedLayout`) are:

- data (one per data input of the loss graph, all rows; or, for the inputs
  listed in ``epoch_ordered``, their rows in the epoch's order, set per
  epoch), ``order`` (int64 row numbers of the epoch, batch after batch),
  ``starts`` and ``ends`` (int64, shape (n_batches, 1): where each batch
  starts and ends in ``order``), ``rows`` (float64, the rows of each batch)
  and the optimizer's per-step scalars (one value per batch of the epoch,
  from its ``host_scalars``: the learning rate and, for Adam, the bias
  corrections, computed on the host rather than by a dozen nodes per step,
  in the dtype of the weights): set once per epoch. Every per-batch value is
  one ``Gather`` of row ``k``: computing it in the graph would cost a node
  or more each, about a microsecond apiece per step;
- carried values, each an input and an output: ``k`` (the batch number in
  the epoch, step mode only), ``loss_sum`` (float64, the sum of
  ``batch_loss * batch_rows`` so far), the weights, the optimizer states
  (with a stateful optimizer, one flat buffer per state for all weights).

The step runs ``k -> k + 1``: the engine feeds the outputs of one step as
the inputs of the next (ping-pong buffers), so a step needs no host value.

On a GPU whose provider computes neither float64 nor ``Slice`` bounds on the
device (WebGPU), ``build_fused_step(batch_table=True)`` reads its batch from a
table instead: ``batch`` (the int32 row numbers of the batches, one row per
batch, shape (n_batches, batch_rows)) replaces ``order``, ``starts`` and
``ends``; ``k`` is int32; ``rows`` and the loss sum are in the loss's own
dtype. Nothing in it needs the CPU, so the provider can record it once and
replay it (graph capture), and a step needs no copy to the device: the host
writes the tables once per epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..autodiff import append_backward
from ..fileio import EXTERNAL_DATA_THRESHOLD
from ..graph import (
    GraphBuilder,
    elem_type_of,
    finalize_model,
    initializers_to_inputs,
    load_model,
    needed_nodes,
    node_reads,
    onnx_to_np_dtype,
    opset_of,
    prune_model,
    shape_of,
    weight_stub,
    weights_to_inputs,
)
from ..graph.batch_norm import set_inference_mode
from ..graph.format import HYPER_PREFIX
from ..graph.passes import CHEAPER_NODES, run_passes
from .batch_shapes import batch_multiples, probe_shapes, sizes_from_rows
from .loop_body import hoisted, renamed, row_wise_once_per_epoch
from .scattered import split_scattered_updates

__all__ = ["FusedLayout", "build_fused_epoch", "build_fused_step", "eval_graph", "hyper_inputs",
           "in_place_safe", "strip_weights"]

ORDER, STARTS, ENDS, ROWS = "fused.order", "fused.starts", "fused.ends", "fused.rows"
#: The row numbers of each batch, a table of one row per batch, in a table-fed step.
BATCH = "fused.batch"
#: The number of rows of the step's batch (a float, in the dtype of ``ROWS``).
BATCH_ROWS = "fused.batch_rows"
SCALAR = "fused.scalar."
STEP_IN_EPOCH, LOSS_SUM = "fused.k", "fused.loss_sum"
#: The batch number inside the epoch's Loop (the iteration count).
LOOP_ITERATION = "fused.iteration"
FLAT = "fused.weights"
_NEXT, _DATA, _EPOCH = ".next", ".all", ".epoch"


@dataclass(frozen=True)
class FusedLayout:
    """Names of the fused graph's inputs and outputs.

    Attributes
    ----------
    data : dict of str to str
        Data input of the loss graph -> graph input holding all its rows.
    epoch_inputs : tuple of str
        ``order``, ``starts``, ``ends``, ``rows`` then the values of
        :attr:`scalars` (set once per epoch); in a table-fed step, ``batch``,
        ``rows`` then the values of :attr:`scalars`.
    carried : dict of str to str
        Carried input -> the output holding its next value (weights,
        optimizer states, ``loss_sum`` and, in step mode, ``k``).
    weights : dict of str to str
        ``{weight: carried input name}``.
    states : dict of str to dict of str to str
        ``{weight: {state name: carried input name}}``.
    loss_sum : str
        The carried input of the running loss sum.
    offsets : dict of str to tuple
        ``{weight: (offset, shape)}`` when the weights, and each optimizer
        state, are flat buffers shared by all weights (a weight, or one of
        its states, is then ``buffer[offset:offset + size].reshape(shape)``);
        empty when each weight has its own tensors.
    epoch_ordered : tuple of str
        Data inputs fed once per epoch with their rows in the epoch's order
        (``array[order]``): a batch is then a slice, not a ``Gather``.
    scalars : dict of str to str
        ``{scalar name: input}``: the array, one value per batch, of each of
        the optimizer's per-step scalars (``optimizer.host_scalars``), in
        :attr:`scalar_dtype`.
    scalar_dtype : numpy.dtype
        dtype of the scalar inputs: the weights' when they all share one,
        else float64.
    in_place : tuple of str
        Carried weights and optimizer states whose next value may be written
        over them (:func:`in_place_safe`; step mode only): one buffer each
        instead of a ping-pong pair.
    batch_table : bool
        Whether the step reads its batch from a table of row numbers
        (``build_fused_step(batch_table=True)``).
    scatters : dict of str to tuple of str
        ``{weight input: (positions output, updates output)}``: weights whose step
        ends in a scatter left to a second run (:mod:`~ortlearn.training.scattered`;
        step mode, ``flat=False``).
    """

    data: dict
    epoch_inputs: tuple
    carried: dict
    weights: dict
    states: dict
    loss_sum: str
    offsets: dict = field(default_factory=dict)
    epoch_ordered: tuple = ()
    scalars: dict = field(default_factory=dict)
    scalar_dtype: np.dtype = np.dtype(np.float64)
    in_place: tuple = ()
    batch_table: bool = False
    scatters: dict = field(default_factory=dict)


def _state_name(param: str, state: str) -> str:
    return f"{param}.{state}"


def _step_nodes(model: onnx.ModelProto, trainable, input_names, optimizer, loss_output: str,
                in_loop: bool, epoch_ordered=(), flat: bool = True, batch_table: bool = False):
    """Nodes of one step appended to ``model`` (a copy), with the carried output names.

    ``model``'s trainable initializers become inputs, its data inputs are
    replaced by ``Gather`` of the full data. The batch number ``k`` is the
    Loop's iteration count ``in_loop``, else a carried value ``k -> k + 1``
    (int32 in a ``batch_table`` step, which reads row ``k`` of a table of batches).
    Returns the graph inputs to add and ``{carried input: output}``.
    """
    if batch_table and (in_loop or epoch_ordered):
        raise ValueError("A table-fed step runs one batch a call, with no epoch-ordered input.")
    k = LOOP_ITERATION if in_loop else STEP_IN_EPOCH
    # int32 where int64 is not native (WebGPU): the batch number and the row numbers
    index_type = TensorProto.INT32 if batch_table else TensorProto.INT64
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    declared = {i.name: i for i in graph.input}
    params = [inits[n] for n in trainable]
    kept = [i for i in graph.initializer if i.name not in set(trainable)]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.input[:]

    # inputs other than the data (hyper-parameters) stay inputs of the step
    inputs = [i for i in declared.values() if i.name not in input_names]
    b = GraphBuilder.for_model(model, prefix="fused_")
    scalar_inputs = {s: SCALAR + s for s in optimizer.scalar_names}
    for name in (ORDER, STARTS, ENDS, ROWS, *scalar_inputs.values(), LOSS_SUM, k):
        b.reserve(name)
    if batch_table:
        # batch k's row numbers are row k of a table: a Gather, not a Slice whose
        # computed bounds a GPU provider reads on the CPU
        rows = b.op("Gather", [b.reserve(BATCH), k])
    else:
        # Batch k is order[starts[k]:ends[k]].
        start = b.op("Gather", [STARTS, k])
        end = b.op("Gather", [ENDS, k])
        rows = b.op("Slice", [ORDER, start, end, b.ints([0])])
    data = {}
    for name in input_names:
        info = declared[name]
        dims = shape_of(info)
        if name in epoch_ordered:
            # rows already in the epoch's order: the batch is a contiguous slice
            data[name] = b.reserve(name + _EPOCH)
            dims = ["n_epoch_rows"] + list(dims[1:]) if dims else None
            b.op("Slice", [data[name], start, end, b.ints([0])], outputs=[name])
        else:
            data[name] = b.reserve(name + _DATA)
            dims = ["n_rows"] + list(dims[1:]) if dims else None
            b.op("Gather", [data[name], rows], outputs=[name], axis=0)
        inputs.append(helper.make_tensor_value_info(data[name], elem_type_of(info), dims))
    step_scalars = {s: b.op("Gather", [name, k]) for s, name in scalar_inputs.items()}
    n_rows = b.op("Gather", [ROWS, k], outputs=[b.reserve(BATCH_ROWS)])
    flat = _flat_offsets(params, optimizer) if flat else {}
    prologue, views = b.nodes, _flat_weight_views(b, flat)
    b.nodes = []
    forward = list(graph.node)
    del graph.node[:]
    graph.node.extend(prologue + forward)
    scalar = helper.make_tensor_value_info
    elem_types = {p.data_type for p in params}
    scalar_elem = elem_types.pop() if len(elem_types) == 1 else TensorProto.DOUBLE
    loss_info = next(o for o in graph.output if o.name == loss_output)
    # the running sum: float64 unless the step must stay on a device without it
    sum_elem = elem_type_of(loss_info) if batch_table else TensorProto.DOUBLE
    if batch_table:
        inputs += [scalar(BATCH, index_type, ["n_batches", "batch_rows"])]
    else:
        inputs += [scalar(ORDER, TensorProto.INT64, ["n_epoch_rows"]),
                   scalar(STARTS, TensorProto.INT64, ["n_batches", 1]),
                   scalar(ENDS, TensorProto.INT64, ["n_batches", 1])]
    inputs += [scalar(ROWS, sum_elem, ["n_batches"])]
    inputs += [scalar(name, scalar_elem, ["n_batches"]) for name in scalar_inputs.values()]
    weights = {p.name: FLAT if flat else p.name for p in params}
    states = {p.name: {s: _state_name(weights[p.name], s) for s in optimizer.state_names}
              for p in params}
    carried_inputs = [scalar(LOSS_SUM, sum_elem, [])]
    if not in_loop:
        carried_inputs.append(scalar(k, index_type, []))
    if flat:
        size = sum(int(np.prod(p.dims, dtype=np.int64)) for p in params)
        for name in (FLAT, *states[params[0].name].values()):
            carried_inputs.append(scalar(name, params[0].data_type, [size]))
    else:
        for p in params:
            for name in (p.name, *states[p.name].values()):
                carried_inputs.append(scalar(name, p.data_type, list(p.dims)))
    # The backward pass differentiates with respect to graph inputs: with flat
    # weights, each weight is an input until its view replaces it.
    weight_inputs = [scalar(p.name, p.data_type, list(p.dims)) for p in params] if flat else []
    graph.input.extend(inputs + carried_inputs + weight_inputs)
    if in_loop:
        graph.input.append(scalar(k, TensorProto.INT64, []))

    grads = append_backward(model, loss_output, list(trainable), builder=b)
    if flat:
        nodes = prologue + views + list(graph.node)[len(prologue):]
        del graph.node[:]
        graph.node.extend(nodes)
        kept = [i for i in graph.input if i.name not in flat]
        del graph.input[:]
        graph.input.extend(kept)
    batch_loss = loss_output
    if elem_type_of(loss_info) != sum_elem:
        batch_loss = b.cast(batch_loss, sum_elem)
    if shape_of(loss_info) != []:
        batch_loss = b.reduce("ReduceSum", batch_loss, keepdims=0)
    carried = {LOSS_SUM: b.op("Add", [LOSS_SUM, b.op("Mul", [batch_loss, n_rows])],
                              outputs=[b.reserve(LOSS_SUM + _NEXT)])}
    if not in_loop and not flat:
        # The update waits for the loss and every gradient: then every node reading
        # a weight has run before the update writes it, which lets the weights be
        # written in place (in_place_safe). onnxruntime orders the nodes by their
        # data only: it would compute the loss (a penalty reading a weight) last.
        # The flat layout's Concat of the gradients is such a join already.
        step_scalars = _after(b, [batch_loss, *(grads[n] for n in trainable)], step_scalars)
    if not in_loop:
        one = b.const(1, dtype=onnx.helper.tensor_dtype_to_np_dtype(index_type))
        b.op("Add", [k, one], outputs=[b.reserve(k + _NEXT)])
        carried[k] = k + _NEXT
    # Carried inputs that are new names are claimed; optimizer.build reserves
    # the names of their next values.
    updated = {}
    for value in dict.fromkeys([*weights.values(),
                                *(v for d in states.values() for v in d.values())]):
        if value not in weights:
            b.reserve(value)
        updated[value] = value + _NEXT
    if flat:
        _flat_update(b, optimizer, params, grads, step_scalars, scalar_elem, updated)
    else:
        optimizer.build(b, trainable, [grads[n] for n in trainable], states, None, None,
                        elem_types=[p.data_type for p in params], updated_names=updated,
                        scalars=step_scalars, scalar_elem_type=scalar_elem)
    b.add_to_graph(graph)
    carried.update(updated)
    step_inputs = (BATCH, ROWS) if batch_table else (ORDER, STARTS, ENDS, ROWS)
    layout = FusedLayout(data, (*step_inputs, *scalar_inputs.values()), carried,
                         weights, states, LOSS_SUM, flat,
                         tuple(n for n in input_names if n in epoch_ordered), scalar_inputs,
                         np.dtype(onnx.helper.tensor_dtype_to_np_dtype(scalar_elem)),
                         batch_table=batch_table)
    return inputs, carried_inputs, layout


def _after(b: GraphBuilder, values, scalars: dict) -> dict:
    """``scalars`` unchanged, each computed after all of ``values``.

    ``Where(c, s, s)`` is ``s`` whatever ``c``; ``c`` reads one element of
    each value (a ``Reshape`` is a view), so the join costs a few scalar nodes.
    """
    flat_shape = b.ints([-1], hint="flat_shape")
    first = b.const(0, dtype=np.int64)  # a scalar index: a scalar element, cond keeps v's shape
    # float32: the sum is never read (Where gives s either way), and GPUs compute float32
    firsts = [b.cast(b.op("Gather", [b.op("Reshape", [v, flat_shape]), first]),
                     TensorProto.FLOAT) for v in values]
    ready = b.op("IsNaN", [b.op("Sum", firsts) if len(firsts) > 1 else firsts[0]])
    return {s: b.op("Where", [ready, v, v]) for s, v in scalars.items()}


def _flat_offsets(params, optimizer) -> dict:
    """``{weight: (offset, shape)}`` in one flat buffer, or {} to keep one tensor per weight.

    An optimizer with state (momentum, Adam's moments) updates every weight
    with the same dozen elementwise nodes: with all the weights, and each of
    their states, in one flat buffer, a step runs those nodes once instead
    of once per weight, for the price of a ``Split``, a ``Reshape`` per
    weight and one ``Concat`` of the gradients. Each node costs onnxruntime
    about a microsecond whatever its size, which is most of a small model's
    step. Weights of mixed dtypes keep one tensor each.
    """
    if (not optimizer.state_names or len(params) < 2 or len({p.data_type for p in params}) > 1
            or getattr(optimizer, "per_parameter", False)):
        return {}
    offsets, offset = {}, 0
    for p in params:
        offsets[p.name] = (offset, tuple(int(d) for d in p.dims))
        offset += int(np.prod(p.dims, dtype=np.int64))
    return offsets


def _flat_weight_views(b: GraphBuilder, offsets: dict) -> list:
    """Nodes giving each weight as its part of the flat weights (taken back from ``b``):
    one ``Split`` of the whole vector (one kernel on a GPU provider, where a ``Slice`` a
    weight is a kernel each), then a ``Reshape`` a weight."""
    first = len(b.nodes)
    sizes = [int(np.prod(shape, dtype=np.int64)) for _, shape in offsets.values()]
    pieces = b.op("Split", [FLAT, b.ints(sizes, hint="sizes")], n_outputs=len(sizes), axis=0)
    for (name, (_, shape)), piece in zip(offsets.items(), pieces):
        b.op("Reshape", [piece, b.ints(list(shape), hint="shape")], outputs=[name])
    return b.take(first)


def _flat_update(b: GraphBuilder, optimizer, params, grads, step_scalars: dict,
                 scalar_elem: int, updated: dict) -> None:
    """The optimizer's update of the flat weights with the concatenated gradients.

    Every node of the update is elementwise, so each weight gets exactly the
    values the per-weight update computes (the gradient-norm clipping sums
    the squares in another order).
    """
    flat_shape = b.ints([-1], hint="flat_shape")
    flat_grad = b.op("Concat", [b.op("Reshape", [grads[p.name], flat_shape]) for p in params],
                     axis=0)
    states = {FLAT: {s: _state_name(FLAT, s) for s in optimizer.state_names}}
    optimizer.build(b, [FLAT], [flat_grad], states, None, None,
                    elem_types=[params[0].data_type], updated_names=updated,
                    scalars=step_scalars, scalar_elem_type=scalar_elem)


def _step_model(loss_model, trainable, input_names, optimizer, loss_output: str,
                in_loop: bool, epoch_ordered, flat: bool = True, batch_table: bool = False):
    """A copy of ``loss_model`` holding the nodes of one step (:func:`_step_nodes`).

    Returns ``(model, data and epoch inputs, {carried input: its ValueInfo}, layout)``.
    """
    model = onnx.ModelProto()
    model.CopyFrom(loss_model)
    inputs, carried_inputs, layout = _step_nodes(model, trainable, input_names, optimizer,
                                                 loss_output, in_loop, epoch_ordered, flat,
                                                 batch_table)
    return model, inputs, {i.name: i for i in carried_inputs}, layout


def _value_infos(infos, names, suffix: str = "") -> list:
    out = []
    for name in names:
        info = onnx.ValueInfoProto()
        info.CopyFrom(infos[name])
        info.name = name + suffix
        out.append(info)
    return out


def build_fused_step(loss_model: onnx.ModelProto, trainable, input_names, optimizer,
                     loss_output: str = "loss", epoch_ordered=(), flat: bool = True,
                     batch_table: bool = False, passes=CHEAPER_NODES
                     ) -> tuple[onnx.ModelProto, FusedLayout]:
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
    epoch_ordered : list of str, default=()
        Data inputs the caller feeds once per epoch with their rows in the
        epoch's order (``array[order]``) instead of all rows in their
        original order: a step slices its batch out of them. Worth it for
        inputs of a few bytes per row (labels, sample weights), where the
        ``Gather`` of a batch waits on one cache miss per row.
    flat : bool, default=True
        With a stateful optimizer, hold the weights and each optimizer state
        in one flat buffer for all weights (fewer nodes a step: a small
        model's step is mostly the cost per node). False keeps a tensor per
        weight and makes the update wait for the loss and every gradient: no
        copy of the weights (the slices of a flat buffer) nor of the gradients
        (their ``Concat``), and every weight written in place
        (:attr:`FusedLayout.in_place`), for large models; a scattered update
        is left to a second run (:attr:`FusedLayout.scatters`).
    batch_table : bool, default=False
        Read the batch's row numbers from a table of one row per batch (see
        the module's docstring): a step with no float64 value, no ``Slice``
        and int32 indices, for a GPU whose provider would run those on the
        CPU. Not with ``epoch_ordered``.
    passes : sequence of ortlearn.graph.passes.Pass, default=CHEAPER_NODES
        The rewrites of the step's nodes (``GPU_NODES`` for a GPU provider).

    Returns
    -------
    model : onnx.ModelProto
        The checked step graph.
    layout : FusedLayout
        Its input and output names.
    """
    model, _, infos, layout = _step_model(loss_model, trainable, input_names, optimizer,
                                          loss_output, False, epoch_ordered, flat, batch_table)
    graph = model.graph
    outputs = _value_infos(infos, layout.carried)
    for info, name in zip(outputs, layout.carried.values()):
        info.name = name
    kept = list(layout.carried.values())
    nodes = needed_nodes(graph.node, kept)
    if batch_table:
        rows_type = next(elem_type_of(i) for i in graph.input if i.name == ROWS)
        nodes = sizes_from_rows(model, nodes, layout, BATCH_ROWS, onnx_to_np_dtype(rows_type))
    nodes = run_passes(model, nodes, kept, passes)
    if not (flat or batch_table):
        # a large step: the scatter of an update is a second run, into the weights in place
        weights = set(layout.weights.values())
        nodes, scatters, extra = split_scattered_updates(
            nodes, {c: o for c, o in layout.carried.items() if c in weights},
            {i.name: elem_type_of(i) for i in graph.input})
        if scatters:
            outputs += extra
            nodes = needed_nodes(nodes, [o.name for o in outputs])
            layout = replace(layout, scatters=scatters)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.output[:]
    graph.output.extend(outputs)
    del graph.value_info[:]
    state = set(layout.weights.values()) | {c for d in layout.states.values() for c in d.values()}
    layout = replace(layout, in_place=in_place_safe(
        nodes, {c: o for c, o in layout.carried.items() if c in state}))
    return finalize_model(model), layout


#: Operators whose output onnxruntime may make a view of their first input:
#: a reader of the view reads the input's buffer.
_VIEW_OPS = frozenset({"Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Dropout",
                       "ExpandDims", "Cast"})
#: Elementwise operators that may write the buffer they read: element ``i`` is
#: read before it is written, by the same thread.
_ELEMENTWISE_OPS = frozenset({"Add", "Sub", "Mul", "Div"})


def in_place_safe(nodes, carried: dict) -> tuple:
    """Carried inputs that the node writing their next value may overwrite.

    A step reads each carried value and writes its next value. Binding one
    buffer as both is correct when nothing reads the old value after the
    writer has started, which the graph's data dependencies decide: every
    node reading the input, or a view of it (``Reshape``...: onnxruntime may
    alias them), is an ancestor of the writer, so it has run when the writer
    starts; the writer itself may read the input only as an elementwise
    ``Add``, ``Sub``, ``Mul`` or ``Div`` operand of the output's shape
    (element ``i`` is read then written). onnxruntime never reuses the buffer
    of a graph input or output for its own intermediates.

    Parameters
    ----------
    nodes : list of onnx.NodeProto
        The step graph's nodes.
    carried : dict of str to str
        ``{carried input: graph output holding its next value}``; the input
        and the output have the same shape.

    Returns
    -------
    tuple of str
        The carried inputs that may be written in place.

    Examples
    --------
    >>> from onnx import helper
    >>> nodes = [helper.make_node("Mul", ["w", "w"], ["sq"]),   # read by the loss
    ...          helper.make_node("Mul", ["lr", "g"], ["step"]),
    ...          helper.make_node("Sub", ["w", "step"], ["w.next"])]
    >>> in_place_safe(nodes, {"w": "w.next"})
    ()
    >>> in_place_safe(nodes[1:], {"w": "w.next"})
    ('w',)
    """
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    reads = [node_reads(node) for node in nodes]
    consumers = {}
    for i, names in enumerate(reads):
        for value in names:
            consumers.setdefault(value, []).append(i)
    safe = []
    for name, output in carried.items():
        writer = producer.get(output)
        if writer is None:
            continue
        ancestors, todo = set(), [writer]
        while todo:
            for value in reads[todo.pop()]:
                i = producer.get(value)
                if i is not None and i not in ancestors:
                    ancestors.add(i)
                    todo.append(i)
        views, readers, todo = {name}, set(), [name]
        while todo:
            value = todo.pop()
            for i in consumers.get(value, ()):
                readers.add(i)
                if nodes[i].op_type in _VIEW_OPS:
                    for view in nodes[i].output:
                        if view not in views:
                            views.add(view)
                            todo.append(view)
        write = nodes[writer]
        writer_reads = reads[writer] & views
        if writer_reads and (write.op_type not in _ELEMENTWISE_OPS or writer_reads != {name}
                             or len(write.input) != 2):
            continue
        if readers - {writer} <= ancestors:
            safe.append(name)
    return tuple(safe)


def build_fused_epoch(loss_model: onnx.ModelProto, trainable, input_names, optimizer,
                      loss_output: str = "loss", epoch_ordered=()
                      ) -> tuple[onnx.ModelProto, FusedLayout]:
    """The graph of one epoch: ONNX ``Loop`` nodes running the step over the mini-batches.

    Same parameters and layout as :func:`build_fused_step`, without ``k``
    (the loops' iteration numbers count the batches); the number of
    iterations is the length of ``rows``.

    The leading batches of the size of the first (every batch but the last,
    in an epoch of :class:`~ortlearn.training.Batches`) run in a first
    ``Loop`` whose body reads what depends only on that size from values
    the epoch computes once (:func:`_uniform_body`): the batch's rows are
    one ``Gather`` of the row order seen as a (batches, rows) matrix, and
    the batch's size, its reciprocal, the row of ones of the bias gradients'
    column sums are no nodes of a step. The other batches run in a second
    ``Loop`` of the general step. Both compute the same operations on the
    same values: the weights are those of one ``Loop`` bit for bit.
    """
    model, inputs, infos, layout = _step_model(loss_model, trainable, input_names, optimizer,
                                               loss_output, True, epoch_ordered)
    graph = model.graph
    carried = list(layout.carried)
    outputs = list(layout.carried.values())
    body_nodes = run_passes(model, needed_nodes(graph.node, outputs), outputs)
    # Outer names differ from the bodies' (no shadowing across scopes).
    b = GraphBuilder(opset=opset_of(model), prefix="fused_epoch_")
    uniform, n_same = _uniform_body(model, body_nodes, layout, carried, b)
    rest_iteration = LOOP_ITERATION + ".rest"
    rest = [helper.make_node("Add", [rest_iteration, n_same], [LOOP_ITERATION])] + body_nodes
    trips = b.op("Squeeze", [b.op("Shape", [ROWS])])
    true = b.const(True)
    outer_in = {c: c + ".in" for c in carried}
    between = {c: c + ".uniform" for c in carried}
    outer_out = {c: c + ".out" for c in carried}
    b.op("Loop", [n_same, true, *outer_in.values()], outputs=list(between.values()),
         body=_loop_body(uniform, "fused_epoch_uniform", LOOP_ITERATION, carried, infos, layout))
    b.op("Loop", [b.op("Sub", [trips, n_same]), true, *between.values()],
         outputs=list(outer_out.values()),
         body=_loop_body(rest, "fused_epoch_rest", rest_iteration, carried, infos, layout))
    del graph.node[:]
    graph.node.extend(b.nodes)
    del graph.input[:]
    graph.input.extend(inputs + _value_infos(infos, carried, ".in"))
    del graph.output[:]
    graph.output.extend(_value_infos(infos, carried, ".out"))
    del graph.value_info[:]
    epoch_layout = FusedLayout(layout.data, layout.epoch_inputs,
                               {outer_in[c]: outer_out[c] for c in carried},
                               {p: outer_in[c] for p, c in layout.weights.items()},
                               {p: {s: outer_in[v] for s, v in d.items()}
                                for p, d in layout.states.items()},
                               outer_in[LOSS_SUM], layout.offsets,
                               layout.epoch_ordered, layout.scalars, layout.scalar_dtype)
    return finalize_model(model), epoch_layout


def _loop_body(nodes, name: str, iteration: str, carried, infos, layout) -> onnx.GraphProto:
    """The ``Loop`` body graph of the step ``nodes``: iteration, cond, then the carried values."""
    cond = "fused.cond"
    body = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(iteration, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond, TensorProto.BOOL, [])]
        + [infos[c] for c in carried],  # in the order of the outputs
        # the condition passes through: the body's output is its input (no Identity node)
        [helper.make_tensor_value_info(cond, TensorProto.BOOL, [])]
        + [_value_infos(infos, [c])[0] for c in carried])
    for info, out in zip(body.output[1:], layout.carried.values()):
        info.name = out
    return body


def _uniform_body(model, nodes, layout, carried, b: GraphBuilder):
    """The step ``nodes`` for batches of one size, and the number of such leading batches.

    Appends to ``b`` (the epoch's nodes, run once per call) the batch size
    ``B`` of the first batch, the number ``n_same`` of leading batches of
    that size (batch ``k < n_same`` is ``order[k * B:(k + 1) * B]``: the
    batches tile the order), then rewrites a copy of ``nodes`` for those
    batches:

    * the rows of batch ``k`` are row ``k`` of the order seen as a
      ``(n_same, B)`` matrix (one ``Gather`` instead of two ``Gather`` of
      the bounds and a ``Slice``), and the epoch-ordered inputs likewise;
    * ``Size`` and ``Shape`` nodes whose value is a multiple of the batch
      rows (:func:`~ortlearn.training.batch_shapes.batch_multiples`) become
      values of the epoch, ``rows`` of the batch is ``rows[0]``;
    * every node reading only values of the epoch and constants then runs
      once per epoch (:func:`~ortlearn.training.loop_body.hoisted`), row-wise work
      on the batch's rows first rewritten as that work on every row
      (:func:`~ortlearn.training.loop_body.row_wise_once_per_epoch`): the same operation on the same
      values, so the same bits.

    Returns ``(nodes, n_same)`` with ``n_same`` an int64 scalar of ``b``.
    """
    k = LOOP_ITERATION
    zero = b.const(0, dtype=np.int64, hint="zero")
    size = b.op("Sub", [b.op("Gather", [ENDS, zero]), b.op("Gather", [STARTS, zero])])  # [B]
    sizes = b.op("Reshape", [b.op("Sub", [ENDS, STARTS]), b.ints([-1], hint="flat")])
    # The first batch not of size B: the first zero of the flags, one zero appended.
    same = b.op("Concat", [b.op("Equal", [sizes, size]), b.const(np.array([False]))], axis=0)
    n_same_vec = b.op("ArgMin", [b.cast(same, TensorProto.FLOAT)], axis=0, keepdims=1)
    n_same = b.op("Squeeze", [n_same_vec])
    count = b.op("Mul", [n_same_vec, size])
    first = b.ints([0], hint="first")
    by_batch = {}  # epoch input -> the same rows as (n_same, B, ...)

    def batched(name: str) -> str:
        if name not in by_batch:
            tail = b.op("Slice", [b.op("Shape", [name]), b.ints([1], hint="one"),
                                  b.ints([np.iinfo(np.int64).max], hint="end")])
            by_batch[name] = b.op("Reshape", [
                b.op("Slice", [name, first, count, first]),
                b.op("Concat", [n_same_vec, size, tail], axis=0)])
        return by_batch[name]

    probes = probe_shapes(model, nodes, layout)
    multiples = batch_multiples(model, nodes, layout, probes)
    rows_scalar = b.op("Squeeze", [size])
    replaced, out = {}, []
    producers = {o: n for n in nodes for o in n.output}
    for node in nodes:
        if node.op_type == "Slice" and node.input[0] in (ORDER, *(
                layout.data[n] for n in layout.epoch_ordered)):
            bounds = [producers.get(v) for v in node.input[1:3]]
            if all(p is not None and p.op_type == "Gather" and list(p.input) == [src, k]
                   for p, src in zip(bounds, (STARTS, ENDS))):
                out.append(helper.make_node("Gather", [batched(node.input[0]), k],
                                            list(node.output), name=node.name))
                continue
        if node.op_type == "Gather" and list(node.input) == [ROWS, k]:
            out.append(helper.make_node("Gather", [ROWS, zero], list(node.output),
                                        name=node.name))
            continue
        if node.output and node.output[0] in multiples:
            coef, const = multiples[node.output[0]]
            if node.op_type == "Size":  # coef * B, or the same for every batch
                value = (b.op("Mul", [rows_scalar, b.const(coef, dtype=np.int64)]) if coef
                         else b.const(const, dtype=np.int64))
            else:
                value = b.op("Add", [b.op("Mul", [size, b.ints(coef, hint="coef")]),
                                     b.ints(const, hint="dims")])
            replaced[node.output[0]] = value
            continue
        out.append(node)
    out = [renamed(node, replaced) for node in out]
    body_outputs = list(layout.carried.values())
    out = needed_nodes(out, body_outputs)
    varying = {k, "fused.cond", *carried}
    if probes:
        produced = {o for node in out for o in node.output}
        outer = {v for node in out for v in node.input if v and v not in produced} - varying
        out = row_wise_once_per_epoch(out, outer, probes[0])
    return hoisted(out, varying, b), n_same


# ------------------------------------------------------- the engine's other graphs
def strip_weights(model: onnx.ModelProto, trainable) -> onnx.ModelProto:
    """``model`` without the values of the initializers ``trainable`` (names, shapes and
    types kept), parsed anew.

    ``model`` is stripped in place, which frees nothing: protobuf (upb) keeps the
    bytes of a replaced field in the message's arena until the message goes. The
    copy parsed from the stripped bytes has an arena of its own, without them
    (a model of more than ``EXTERNAL_DATA_THRESHOLD`` bytes, which protobuf may
    not serialize, is returned as it is).
    """
    wanted = set(trainable)
    for init in model.graph.initializer:
        if init.name in wanted:
            init.CopyFrom(weight_stub(init.name, init.data_type, init.dims))
    if model.ByteSize() > EXTERNAL_DATA_THRESHOLD:
        return model
    return onnx.ModelProto.FromString(model.SerializeToString())


def eval_graph(model: onnx.ModelProto, trainable: list[str], loss_output: str) -> onnx.ModelProto:
    """The loss graph with the weights as inputs, in inference mode, pruned to the loss."""
    model = load_model(model)
    weights_to_inputs(model, trainable)
    set_inference_mode(model)
    return prune_model(model, [loss_output])


def hyper_inputs(model: onnx.ModelProto) -> dict:
    """The hyper-parameters of ``model`` (initializers named ``hyper.*``) made inputs, in place.

    Returns ``{name: value}``: what the engine binds, so that graphs differing
    only in them are one compiled step.
    """
    names = [i.name for i in model.graph.initializer if i.name.startswith(HYPER_PREFIX)]
    return initializers_to_inputs(model, names) if names else {}
