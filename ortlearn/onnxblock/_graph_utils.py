"""Graph queries and edits shared by the blocks (types of values, inputs, outputs)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper

from ..graph import FLOAT_TYPES, GraphBuilder, elem_type_of, shape_of

_PREFIX = "onnxblock_"


def builder(model: onnx.ModelProto, prefix: str = _PREFIX) -> GraphBuilder:
    """A builder that knows every name of ``model`` (created per block call).

    A fresh builder per call keeps names unique even when nested blocks or
    the user's own code add nodes between two calls.
    """
    return GraphBuilder.for_model(model, prefix=prefix)


def _has_type(info) -> bool:
    """Whether a ValueInfo says what its value holds (a typed tensor, a sequence, ...)."""
    kind = info.type.WhichOneof("value")
    return kind is not None and (kind != "tensor_type" or bool(info.type.tensor_type.elem_type))


def _declared(model: onnx.ModelProto, name: str):
    g = model.graph
    for info in itertools.chain(g.input, g.output, g.value_info):
        if info.name == name and _has_type(info):
            return info
    for init in g.initializer:
        if init.name == name:
            return helper.make_tensor_value_info(name, init.data_type, list(init.dims))
    for node in g.node:
        if node.op_type == "Constant" and node.output[0] == name:
            for attr in node.attribute:
                if attr.name == "value":
                    return helper.make_tensor_value_info(name, attr.t.data_type, list(attr.t.dims))
    return None


def find_value_info(model: onnx.ModelProto, name: str):
    """Type and shape of ``name``: declared ones first, shape inference otherwise (or None)."""
    info = _declared(model, name)
    if info is not None:
        return info
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # best effort: a partial graph may not infer
        return None
    for info in inferred.graph.value_info:
        if info.name == name:
            return info
    return None


def elem_type(model: onnx.ModelProto, name: str) -> int | None:
    info = find_value_info(model, name)
    return None if info is None else (elem_type_of(info) or None)


def shape(model: onnx.ModelProto, name: str):
    info = find_value_info(model, name)
    return None if info is None else shape_of(info)


def default_float_type(model: onnx.ModelProto) -> int:
    """The float type of the model: of its outputs, inputs, then initializers (float32 if none)."""
    g = model.graph
    for info in itertools.chain(g.output, g.input):
        if info.type.tensor_type.elem_type in FLOAT_TYPES:
            return info.type.tensor_type.elem_type
    for init in g.initializer:
        if init.data_type in FLOAT_TYPES:
            return init.data_type
    return TensorProto.FLOAT


def float_type_of(model: onnx.ModelProto, name: str) -> int:
    """Float type of value ``name`` (the model's float type if it cannot be found)."""
    found = elem_type(model, name)
    return found if found in FLOAT_TYPES else default_float_type(model)


def is_constant_output(model: onnx.ModelProto, name: str) -> bool:
    return any(n.op_type == "Constant" and name in n.output for n in model.graph.node)


def add_graph_input(model: onnx.ModelProto, name: str, elem: int, dims) -> str:
    """Declare a graph input, or reuse an existing one with the same name.

    Raises
    ------
    ValueError
        If ``name`` already names a value that is not a graph input.
    """
    g = model.graph
    if any(i.name == name for i in g.input):
        return name
    produced = {o for n in g.node for o in n.output} | {i.name for i in g.initializer}
    if name in produced:
        raise ValueError(f"Cannot add graph input {name!r}: "
                         "the model already has a value with that name.")
    g.input.append(helper.make_tensor_value_info(name, elem, dims))
    return name


def _check_block_names(model: onnx.ModelProto, names: Sequence[str], first_node: int) -> None:
    """Refuse a build() that refers to, or returns, a name the model does not have.

    Checked before shape inference, whose error would name a value the
    block made from the unknown one rather than the name the user wrote.
    """
    g = model.graph
    defined = ({i.name for i in g.input} | {i.name for i in g.initializer}
               | {o for n in g.node for o in n.output})
    # the graph's own outputs, before build()'s replace them: what a user usually names
    known = (f"the model's outputs are {[o.name for o in g.output]} and its inputs "
             f"{[i.name for i in g.input if i.name not in {t.name for t in g.initializer}]}")
    undefined = []
    # only the block's nodes: a broken model is the model's error, reported elsewhere
    for node in g.node[first_node:]:
        undefined += [n for n in node.input if n and n not in defined and n not in undefined]
    if undefined:
        raise ValueError(
            f"The block's build() refers to {undefined}, which "
            f"{'is not a value' if len(undefined) == 1 else 'are not values'} of the model; "
            f"{known}. Pass one of them (or a name a block returned).")
    unknown = [n for n in names if n not in defined]
    if unknown:
        raise ValueError(
            f"The block's build() returned {unknown} as output name(s), which "
            f"{'is not a value' if len(unknown) == 1 else 'are not values'} of the model; "
            f"{known}. Return the name a block call gave (or one of those).")


def register_graph_outputs(model: onnx.ModelProto, names: Sequence[str],
                           first_node: int = 0) -> None:
    """Make ``names`` the graph outputs, in that order, with their types.

    ``first_node`` is the first node the block added (the nodes checked
    for inputs that are no value of the model).

    Raises
    ------
    ValueError
        If a node the block added refers to, or ``names`` holds, a name that
        is no value of the model (the message names it and lists the
        model's outputs).
    """
    _check_block_names(model, names, first_node)
    known = {o.name: o for o in model.graph.output}
    missing = [n for n in names if n not in known]
    if missing:
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
            infos = {v.name: v for v in itertools.chain(inferred.graph.value_info,
                                                        inferred.graph.input)}
        except Exception:  # fall back to declared types only
            infos = {}
        for name in missing:
            info = infos.get(name) or _declared(model, name)
            if info is None or not _has_type(info):
                raise ValueError(f"Cannot make {name!r} a graph output: its type is unknown.")
            known[name] = info
    outputs = [known[n] for n in names]
    del model.graph.output[:]
    model.graph.output.extend(outputs)


def value_exists(model: onnx.ModelProto, name: str) -> bool:
    """Whether ``name`` is a graph input, an initializer or a node output of ``model``."""
    g = model.graph
    return (any(i.name == name for i in itertools.chain(g.input, g.initializer))
            or produced_by_node(model, name))


def graph_input_or_output(model: onnx.ModelProto, name: str):
    """The graph input named ``name``, else the graph output (None when neither)."""
    for info in itertools.chain(model.graph.input, model.graph.output):
        if info.name == name:
            return info
    return None


def produced_by_node(model: onnx.ModelProto, name: str) -> bool:
    return any(name in n.output for n in model.graph.node)
