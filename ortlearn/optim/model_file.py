"""``optimizer_model.onnx``: an update rule written as onnxruntime-training's optimizer model
(the sequence layout, ``doc/artifacts_format.md``), and unpacked to the tensor layout the
training session runs; or, for an update applied element by element, in the flat layout
(every parameter in one vector) that runtimes paying a price per tensor crossing run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..graph import (
    DEFAULT_OPSET,
    GraphBuilder,
    finalize_model,
    opset_of,
)
from ..graph.format import (
    GRADIENT_SUFFIX,
    GRADIENTS_SEQUENCE,
    LEARNING_RATE,
    OPTIMIZER_METADATA_KEY,
    PARAMS_SEQUENCE,
    STEP,
    UPDATED_FLAG,
    UPDATED_SUFFIX,
)
from .base import Optimizer

#: Layouts of the optimizer model (see :func:`build_optimizer_model`).
LAYOUTS = ("sequence", "tensors", "flat")
#: The one parameter of the flat layout: every parameter, flattened, end to end.
FLAT_PARAMS = PARAMS_SEQUENCE


def _check_params(optimizer, params) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"Expected an SGD, Adam, AdamW or TorchAdamW instance (an "
                        f"ortlearn.optim.Optimizer), got {type(optimizer).__name__}.")
    if not params:
        raise ValueError("build_optimizer_model needs at least one parameter.")


def _check_clashes(names: Sequence[str]) -> None:
    clashes = sorted({n for n in names if list(names).count(n) > 1})
    if clashes:
        raise ValueError(f"Parameter names clash with other optimizer inputs: {clashes}.")


def _metadata(model: onnx.ModelProto, optimizer: Optimizer, names, layout: str,
              shapes=None) -> None:
    meta = {"type": optimizer.type, "params": list(names), "states": list(optimizer.state_names),
            "hyper": optimizer.hyper, "layout": layout}
    if layout == "sequence":
        meta["sequences"] = optimizer.state_sequences()
    if shapes is not None:
        meta["shapes"] = [list(shape) for shape in shapes]
    helper.set_model_props(model, {OPTIMIZER_METADATA_KEY: json.dumps(meta)})


def _names(optimizer: Optimizer, names) -> tuple[dict, dict]:
    """``{p: {state: 'p.state'}}`` and the updated name of every parameter and state."""
    states = {p: {s: f"{p}.{s}" for s in optimizer.state_names} for p in names}
    updated = {}
    for p in names:
        for name in (p, *states[p].values()):
            updated[name] = f"{name}{UPDATED_SUFFIX}"
    return states, updated


def build_optimizer_model(optimizer: Optimizer, params: Mapping[str, tuple[int, Sequence]],
                          layout: str = "sequence", opset: int = DEFAULT_OPSET
                          ) -> onnx.ModelProto:
    """Write ``optimizer_model.onnx``: one update of every parameter.

    The default ``layout='sequence'`` follows onnxruntime-training's
    optimizer model (``doc/artifacts_format.md``). Inputs: ``learning_rate``
    (float32, shape [1]), ``step`` (int64, shape [1], 1 for the first
    update), then tensor sequences holding one tensor per parameter, in the
    order of ``params``: ``params``, ``gradients``, then the states,
    ``first_order_moments`` and ``second_order_moments`` (see
    :meth:`Optimizer.state_sequences`; SGD declares ``first_order_moments``
    even without momentum, as onnxruntime-training's SGD model does).
    Outputs: ``updated_flag`` (bool, shape [1], true), ``params.updated``,
    then ``<state sequence>.updated``.

    ``layout='tensors'`` is ortlearn's internal form (what
    :class:`~ortlearn.training.TrainingSession` runs, see
    :func:`unpack_optimizer_model`): inputs ``learning_rate`` and ``step``
    (scalars), then per parameter ``p``: ``p``, ``p.gradient`` and
    ``p.<state>``; outputs ``p.updated`` then ``p.<state>.updated``. Its
    parameters may mix float and double; a sequence holds one element type.

    ``layout='flat'``, for an optimizer whose update is
    :attr:`~Optimizer.elementwise`, is the tensor layout of one parameter,
    ``params``: every parameter flattened (row-major) and put end to end in
    the order of ``params``, its gradient and states likewise. Inputs
    ``learning_rate``, ``step``, ``params``, ``params.gradient``,
    ``params.<state>``; outputs ``params.updated``, ``params.<state>.updated``.
    The update is the same, element for element: three tensors cross into
    the runtime whatever the number of parameters, which is what a runtime
    that pays for each crossing (onnxruntime-node, onnxruntime-web) needs.
    The parameters share one element type and have static shapes, written
    in the metadata (``"shapes"``).

    ``metadata_props['ortlearn.optimizer']`` holds ``{"type", "params",
    "states", "hyper", "layout"}`` (and ``"sequences"``, the sequence of each
    state) as JSON.

    Parameters
    ----------
    optimizer : Optimizer
        The update rule (:class:`SGD`, :class:`Adam`, :class:`AdamW`,
        :class:`TorchAdamW` or a subclass of :class:`Optimizer`).
    params : dict
        ``{name: (elem_type, shape)}`` in the order of the trainable
        parameters; ``elem_type`` is ``TensorProto.FLOAT`` or ``DOUBLE``,
        ``shape`` a list of ints, symbolic names or None (dynamic dims).
    layout : {'sequence', 'tensors', 'flat'}, default='sequence'
        The form of the inputs and outputs.
    opset : int, default=DEFAULT_OPSET
        The model's ai.onnx opset (13 or more): generate_artifacts gives the
        base model's, as onnxruntime-training does.

    Returns
    -------
    onnx.ModelProto
        A checked model.

    Raises
    ------
    ValueError
        If ``params`` is empty, two inputs would share a name, the layout is
        unknown, or (sequence and flat layouts) the parameters do not share
        one element type, or (flat layout) a shape is not static or the
        update is not element by element.
    TypeError
        If a parameter is not float or double, or ``optimizer`` is not an
        :class:`Optimizer`.

    Examples
    --------
    >>> from onnx import TensorProto
    >>> from ortlearn.optim import AdamW
    >>> model = build_optimizer_model(AdamW(), {"W": (TensorProto.FLOAT, [4, 3])})
    >>> [i.name for i in model.graph.input]
    ['learning_rate', 'step', 'params', 'gradients', 'first_order_moments', \
'second_order_moments']
    >>> [o.name for o in model.graph.output]
    ['updated_flag', 'params.updated', 'first_order_moments.updated', \
'second_order_moments.updated']
    """
    _check_params(optimizer, params)
    if layout == "tensors":
        return _tensor_model(optimizer, params, opset)
    if layout == "flat":
        return _flat_model(optimizer, params, opset)
    if layout != "sequence":
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
    return _sequence_model(optimizer, params, opset)


def _one_element_type(params, layout: str) -> int:
    elem_types = {params[p][0] for p in params}
    if len(elem_types) > 1:
        found = {p: TensorProto.DataType.Name(params[p][0]) for p in params}
        raise ValueError(
            f"The {layout} layout of the optimizer model holds the parameters in one tensor "
            f"{'sequence' if layout == 'sequence' else 'vector'}, of one element type; the "
            f"parameters have {found}. Give them one type (cast the model's initializers), or "
            "build the model with layout='tensors'.")
    return elem_types.pop()


def _flat_model(optimizer: Optimizer, params, opset: int) -> onnx.ModelProto:
    if not optimizer.elementwise:
        raise ValueError(
            f"{optimizer.type} does not declare its update element by element "
            "(Optimizer.elementwise): updating one vector of every parameter could differ "
            "from updating each; build the model with layout='tensors'.")
    if optimizer.clip_grad is not None:
        raise ValueError(
            "The flat layout would sum the squares of clip_grad's global norm in another "
            "order than the tensor layout (another rounding); build the model with "
            "layout='tensors'.")
    elem = _one_element_type(params, "flat")
    shapes = [list(shape) for _, shape in params.values()]
    dynamic = {p: shape for p, shape in zip(params, shapes)
               if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape)}
    if dynamic:
        raise ValueError(f"The flat layout needs static parameter shapes (it writes where each "
                         f"parameter lies in the vector); got {dynamic}.")
    if opset < 14 and any(0 in shape for shape in shapes):
        raise ValueError("A parameter without elements is cut out of the flat vector by a "
                         "Reshape with allowzero, which needs opset 14 or more.")
    size = sum(int(np.prod(shape, dtype=np.int64)) for shape in shapes)
    model = _tensor_model(optimizer, {FLAT_PARAMS: (elem, [size])}, opset)
    del model.metadata_props[:]
    _metadata(model, optimizer, list(params), "flat", shapes)
    return model


def _tensor_model(optimizer: Optimizer, params, opset: int) -> onnx.ModelProto:
    names = list(params)
    elem_types = [params[p][0] for p in names]
    states, updated_names = _names(optimizer, names)
    inputs = [helper.make_tensor_value_info(LEARNING_RATE, TensorProto.FLOAT, []),
              helper.make_tensor_value_info(STEP, TensorProto.INT64, [])]
    outputs = []
    for p, (elem, shape) in params.items():
        shape = list(shape)
        for name in (p, f"{p}{GRADIENT_SUFFIX}", *states[p].values()):
            inputs.append(helper.make_tensor_value_info(name, elem, shape))
        for name in (p, *states[p].values()):
            outputs.append(helper.make_tensor_value_info(updated_names[name], elem, shape))
    input_names = [i.name for i in inputs]
    _check_clashes(input_names)

    builder = GraphBuilder(opset=opset, used_names=input_names, prefix="optim_")
    optimizer.build(builder, names, [f"{p}{GRADIENT_SUFFIX}" for p in names], states,
                    LEARNING_RATE, STEP, elem_types=elem_types, updated_names=updated_names)
    return _finish(builder, inputs, outputs, optimizer, names, "tensors")


def _finish(builder, inputs, outputs, optimizer, names, layout,
            value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph(builder.nodes, "optimizer", inputs, outputs,
                              value_info=list(value_info))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", builder.opset)],
                              producer_name="ortlearn")
    _metadata(model, optimizer, names, layout)
    return finalize_model(model)


def _sequence_model(optimizer: Optimizer, params, opset: int) -> onnx.ModelProto:
    names = list(params)
    elem = _one_element_type(params, "sequence")
    states, updated_names = _names(optimizer, names)
    sequences = optimizer.state_sequences()
    declared = list(dict.fromkeys([*sequences.values(), *optimizer.declared_sequences]))
    seq_inputs = [PARAMS_SEQUENCE, GRADIENTS_SEQUENCE, *declared]
    inputs = [helper.make_tensor_value_info(LEARNING_RATE, TensorProto.FLOAT, [1]),
              helper.make_tensor_value_info(STEP, TensorProto.INT64, [1])]
    inputs += [helper.make_tensor_sequence_value_info(s, elem, None) for s in seq_inputs]
    seq_outputs = [PARAMS_SEQUENCE, *sequences.values()]
    outputs = [helper.make_tensor_value_info(UPDATED_FLAG, TensorProto.BOOL, [1])]
    outputs += [helper.make_tensor_sequence_value_info(f"{s}{UPDATED_SUFFIX}", elem, None)
                for s in seq_outputs]
    # the tensors unpacked from the sequences keep the names of the tensor layout
    tensor_names = [n for p in names for n in (p, f"{p}{GRADIENT_SUFFIX}", *states[p].values())]
    reserved = [i.name for i in inputs] + [o.name for o in outputs]
    _check_clashes(reserved + tensor_names + list(updated_names.values()))

    builder = GraphBuilder(opset=opset, used_names=reserved + tensor_names,
                           prefix="optim_")
    # [1] -> scalar: the per-step scalars keep the shape of each parameter
    lr = builder.squeeze(LEARNING_RATE, [0])
    step = builder.squeeze(STEP, [0])
    for i, p in enumerate(names):
        position = builder.const(np.int64(i), hint="position")
        builder.op("SequenceAt", [PARAMS_SEQUENCE, position], outputs=[p])
        builder.op("SequenceAt", [GRADIENTS_SEQUENCE, position], outputs=[f"{p}{GRADIENT_SUFFIX}"])
        for s, name in states[p].items():
            builder.op("SequenceAt", [sequences[s], position], outputs=[name])
    optimizer.build(builder, names, [f"{p}{GRADIENT_SUFFIX}" for p in names], states,
                    lr, step, elem_types=[elem] * len(names), updated_names=updated_names)
    # the update is unconditional: the flag is always true, as the kernels' without
    # their optional update_signal input
    builder.op("Constant", [], outputs=[UPDATED_FLAG],
               value=numpy_helper.from_array(np.array([True]), UPDATED_FLAG))
    builder.op("SequenceConstruct", [updated_names[p] for p in names],
               outputs=[f"{PARAMS_SEQUENCE}{UPDATED_SUFFIX}"])
    for s, seq in sequences.items():
        builder.op("SequenceConstruct", [updated_names[states[p][s]] for p in names],
                   outputs=[f"{seq}{UPDATED_SUFFIX}"])
    # the types and shapes of the tensors in the sequences, which unpacking reads back
    value_info = []
    for p in names:
        own = (p, *states[p].values())
        value_info += [helper.make_tensor_value_info(name, elem, list(params[p][1]))
                       for name in (*own, f"{p}{GRADIENT_SUFFIX}",
                                    *(updated_names[n] for n in own))]
    return _finish(builder, inputs, outputs, optimizer, names, "sequence", value_info)


def _constant_ints(graph: onnx.GraphProto) -> dict[str, int]:
    """``{value name: int}`` for the integer scalars of Constant nodes and initializers."""
    found = {}
    tensors = [(t.name, t) for t in graph.initializer]
    tensors += [(n.output[0], a.t) for n in graph.node if n.op_type == "Constant"
                for a in n.attribute if a.name == "value"]
    for name, tensor in tensors:
        if tensor.data_type not in (TensorProto.INT64, TensorProto.INT32):
            continue  # positions are integers; other types (or unknown ones) are not read
        array = numpy_helper.to_array(tensor)
        if array.size == 1 and np.issubdtype(array.dtype, np.integer):
            found[name] = int(array.reshape(()))
    return found


def unpack_optimizer_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """The tensor layout of a sequence- or flat-layout optimizer model: the same update.

    Each ``SequenceAt(<sequence input>, <constant i>)`` becomes a graph input
    (the tensor it extracted), each ``SequenceConstruct`` feeding a graph
    output is replaced by its tensors as outputs, ``updated_flag`` is dropped.
    What remains is the update itself, which a
    :class:`~ortlearn.training.TrainingSession` runs on tensors bound in
    place on the device (``IOBinding`` has no sequence of device tensors:
    a sequence would be copied through the host at every step). A model
    already in the tensor layout is returned unchanged. A flat-layout model
    (:func:`build_optimizer_model`) gets a tensor-layout front and back: each
    parameter, gradient and state is flattened into the vector the update
    reads (``Reshape``, ``Concat``) and each result cut out of the one it
    writes (``Split``, ``Reshape``), copies that leave every value as the
    flat update computes it.

    Parameters
    ----------
    model : onnx.ModelProto
        An optimizer model of :func:`build_optimizer_model`.

    Returns
    -------
    onnx.ModelProto
        A new model; ``learning_rate`` and ``step`` keep their shape [1].

    Raises
    ------
    ValueError
        If a sequence input is read other than by ``SequenceAt`` at a
        constant position, or a sequence output is not built by
        ``SequenceConstruct``.
    """
    graph = model.graph
    meta = json.loads(_metadata_of(model) or "{}")
    if meta.get("layout") == "flat":
        return _unflattened(model, meta)
    seq_inputs = {i.name: i.type.sequence_type.elem_type.tensor_type.elem_type
                  for i in graph.input if i.type.HasField("sequence_type")}
    if not seq_inputs:
        return model
    positions = _constant_ints(graph)
    infos = {v.name: v for v in graph.value_info}

    def tensor(name, elem):
        return infos.get(name) or helper.make_tensor_value_info(name, elem, None)

    producers = {o: n for n in graph.node for o in n.output}
    new_inputs = [i for i in graph.input if i.name not in seq_inputs]
    new_outputs, dropped = [], set()
    for node in graph.node:
        used = [x for x in node.input if x in seq_inputs]
        if not used:
            continue
        if node.op_type != "SequenceAt" or node.input[1] not in positions:
            raise ValueError(
                f"Cannot unpack the optimizer model: node {node.name!r} ({node.op_type}) "
                f"reads the sequence {used[0]!r} other than by SequenceAt at a constant "
                "position.")
        new_inputs.append(tensor(node.output[0], seq_inputs[node.input[0]]))
        dropped.add(id(node))
    for out in graph.output:
        if not out.type.HasField("sequence_type"):
            if out.name != UPDATED_FLAG:
                new_outputs.append(out)
            continue
        node = producers.get(out.name)
        if node is None or node.op_type != "SequenceConstruct":
            raise ValueError(f"Cannot unpack the optimizer model: its output {out.name!r} is "
                             "not built by SequenceConstruct.")
        elem = out.type.sequence_type.elem_type.tensor_type.elem_type
        new_outputs += [tensor(x, elem) for x in node.input]
        dropped.add(id(node))
    kept = [n for n in graph.node if id(n) not in dropped]
    kept = _prune(kept, [o.name for o in new_outputs])
    boundary = {v.name for v in new_inputs + new_outputs}
    new_graph = helper.make_graph(kept, graph.name, new_inputs, new_outputs,
                                  initializer=list(graph.initializer),
                                  value_info=[v for v in graph.value_info
                                              if v.name not in boundary])
    unpacked = helper.make_model(new_graph, opset_imports=list(model.opset_import),
                                 producer_name=model.producer_name)
    unpacked.ir_version = model.ir_version
    for prop in model.metadata_props:
        if prop.key != OPTIMIZER_METADATA_KEY:
            unpacked.metadata_props.add(key=prop.key, value=prop.value)
    if meta:  # the file now says what it holds: a reader picks the layout from it
        meta["layout"] = "tensors"
        meta.pop("sequences", None)
        unpacked.metadata_props.add(key=OPTIMIZER_METADATA_KEY, value=json.dumps(meta))
    return unpacked


def _unflattened(model: onnx.ModelProto, meta: dict) -> onnx.ModelProto:
    """The tensor layout around the update of a flat-layout model (see
    :func:`unpack_optimizer_model`)."""
    graph = model.graph
    names, shapes, states = meta["params"], meta["shapes"], meta["states"]
    declared = {i.name: i for i in graph.input}
    elem = declared[FLAT_PARAMS].type.tensor_type.elem_type
    into = ["", GRADIENT_SUFFIX, *(f".{s}" for s in states)]  # suffixes of the inputs
    out_of = [UPDATED_SUFFIX, *(f".{s}{UPDATED_SUFFIX}" for s in states)]
    inputs = [declared[LEARNING_RATE], declared[STEP]]
    inputs += [helper.make_tensor_value_info(f"{p}{suffix}", elem, shape)
               for p, shape in zip(names, shapes) for suffix in into]
    outputs = [helper.make_tensor_value_info(f"{p}{suffix}", elem, shape)
               for p, shape in zip(names, shapes) for suffix in out_of]
    inner = {v for node in graph.node for v in (*node.input, *node.output)}
    b = GraphBuilder(opset=opset_of(model), prefix="flat_",
                     used_names=[v.name for v in inputs + outputs] + sorted(inner))
    # the vectors keep no name of the flat file: a parameter may be called 'params'
    vector = {f"{FLAT_PARAMS}{suffix}": b.unique_name(f"vector{suffix}")
              for suffix in into + out_of}
    row = b.ints([-1], hint="row")
    for suffix in into:
        parts = [b.op("Reshape", [f"{p}{suffix}", row]) for p in names]
        b.op("Concat", parts, outputs=[vector[f"{FLAT_PARAMS}{suffix}"]], axis=0)
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [vector.get(x, x) for x in node.input]
        copy.output[:] = [vector.get(x, x) for x in node.output]
        b.nodes.append(copy)
    sizes = b.ints([int(np.prod(shape, dtype=np.int64)) for shape in shapes], hint="sizes")
    for suffix in out_of:
        flat = vector[f"{FLAT_PARAMS}{suffix}"]
        parts = b.op("Split", [flat, sizes], n_outputs=len(names), axis=0) \
            if len(names) > 1 else [flat]
        for p, shape, part in zip(names, shapes, parts):
            b.op("Reshape", [part, b.ints(shape, hint="shape")], outputs=[f"{p}{suffix}"],
                 **({"allowzero": 1} if 0 in shape else {}))
    unpacked = helper.make_model(
        helper.make_graph(b.nodes, graph.name, inputs, outputs,
                          initializer=list(graph.initializer)),
        opset_imports=[helper.make_opsetid("", b.opset)], producer_name=model.producer_name)
    for prop in model.metadata_props:
        if prop.key != OPTIMIZER_METADATA_KEY:
            unpacked.metadata_props.add(key=prop.key, value=prop.value)
    tensors = {k: v for k, v in meta.items() if k != "shapes"}
    unpacked.metadata_props.add(key=OPTIMIZER_METADATA_KEY,
                                value=json.dumps({**tensors, "layout": "tensors"}))
    return finalize_model(unpacked)


def _metadata_of(model: onnx.ModelProto) -> str | None:
    return next((p.value for p in model.metadata_props if p.key == OPTIMIZER_METADATA_KEY), None)


def _prune(nodes, outputs: Sequence[str]) -> list:
    """The nodes ``outputs`` depend on, in their order."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(node.input)
    return kept[::-1]


def split_step_scalars(model: onnx.ModelProto
                       ) -> tuple[onnx.ModelProto | None, onnx.ModelProto]:
    """A tensor-layout optimizer model cut in two: the scalars of a step, then the update.

    The first model holds the nodes that read only ``learning_rate``,
    ``step`` and constants (Adam's bias corrections, the step size cast to
    the parameters' dtype, ...): its inputs are ``learning_rate`` and
    ``step``, its outputs the values of those nodes that the rest of the
    update reads. The second model is the rest, with those values as inputs
    in place of ``learning_rate`` and ``step`` (kept where it reads them
    itself). Run one after the other they compute what ``model`` computes,
    node for node.

    A session on a GPU runs the first on the host, in float64 where the model
    computes in float64 (WebGPU has no float64 kernel), and copies a few
    numbers to the device before each step; the update it runs on the
    device holds no float64 node for float32 parameters.

    Parameters
    ----------
    model : onnx.ModelProto
        An optimizer model in the tensor layout (:func:`unpack_optimizer_model`).

    Returns
    -------
    (onnx.ModelProto or None, onnx.ModelProto)
        The scalars' model (None where no node reads only the step's scalars)
        and the update's.
    """
    graph = model.graph
    derived = {LEARNING_RATE, STEP}
    constants = {t.name for t in graph.initializer}
    constants.update(o for n in graph.node if not n.input and not _subgraphs(n)
                     for o in n.output)
    host, rest = [], []
    for node in graph.node:
        reads = [x for x in node.input if x]
        if (reads and not _subgraphs(node) and all(x in derived or x in constants for x in reads)
                and any(x in derived for x in reads)):
            host.append(node)
            derived.update(node.output)
        else:
            rest.append(node)
    if not host:
        return None, model
    # what the update reads of the derived values: its nodes' inputs, the names its
    # subgraphs read from the outer scope, its outputs
    read = [x for n in rest for x in (*n.input, *_names_read_in_subgraphs(n))]
    read += [o.name for o in graph.output]
    cut = [x for x in dict.fromkeys(read) if x in derived]
    declared = {i.name: i for i in graph.input}
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = {v.name: v for v in [*inferred.graph.value_info, *graph.input]}
    missing = [x for x in cut if x not in infos]
    if missing:
        raise ValueError(f"Cannot split the optimizer model: the types of {missing} are "
                         "unknown to ONNX's shape inference.")
    outputs = [infos[x] for x in cut if x not in declared]
    # the host's nodes and the constants they read, in the graph's order
    used, mine = {x for n in host for x in n.input}, {id(n) for n in host}
    scalars = _submodel(model, [n for n in graph.node if id(n) in mine or (
        not n.input and any(o in used for o in n.output))],
        [declared[LEARNING_RATE], declared[STEP]], outputs)
    update_inputs = [i for i in graph.input if i.name not in (LEARNING_RATE, STEP)
                     or i.name in cut]
    update_inputs += outputs
    update = _submodel(model, _prune(rest, [o.name for o in graph.output]), update_inputs,
                       list(graph.output))
    return scalars, update


def _subgraphs(node: onnx.NodeProto) -> list:
    return [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH] + [
        g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs]


def _names_read_in_subgraphs(node: onnx.NodeProto) -> set:
    """Every name the subgraphs of ``node`` read (their own values included: a superset
    of what they read from the outer scope)."""
    names = set()
    for sub in _subgraphs(node):
        for inner in sub.node:
            names.update(inner.input)
            names.update(_names_read_in_subgraphs(inner))
        names.update(o.name for o in sub.output)
    return names


def _submodel(model: onnx.ModelProto, nodes, inputs, outputs) -> onnx.ModelProto:
    read = {x for n in nodes for x in (*n.input, *_names_read_in_subgraphs(n))}
    graph = helper.make_graph(nodes, model.graph.name, inputs, outputs,
                              initializer=[t for t in model.graph.initializer if t.name in read])
    part = helper.make_model(graph, opset_imports=list(model.opset_import),
                             producer_name=model.producer_name)
    part.ir_version = model.ir_version
    part.metadata_props.extend(model.metadata_props)
    return part
