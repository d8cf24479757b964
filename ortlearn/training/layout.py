"""How a training session reads the artifacts it is given (``doc/artifacts_format.md``): the
names of a training or eval model (its metadata, or the contract's input order), of an optimizer
model, the types of the user inputs and the dimensions the graph ties between them, and what a
model in onnxruntime's ORT format still tells through its session.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort

from ..graph import elem_type_of, load_model, onnx_to_np_dtype, shape_of
from ..graph.format import (
    GRAD_BUFFER_SUFFIX,
    GRAD_OUTPUT_SUFFIX,
    INPUT_GRADIENTS_KEY,
    LAZY_RESET_GRAD,
    OPTIMIZER_METADATA_KEY,
    TRAINING_METADATA_KEY,
    UPDATED_FROZEN_KEY,
    UPDATED_SUFFIX,
)


@dataclass(frozen=True)
class Layout:
    """Names of a training or eval model, as the artifacts contract orders them."""

    user_inputs: list
    user_outputs: list
    trainable: list
    frozen: list
    #: frozen parameters a training step updates (BatchNormalization's running
    #: statistics), each written to the output ``<name>.updated``
    updated: list = field(default_factory=list)
    #: user inputs whose gradients the training model outputs
    #: (``<name>_grad.accumulation.out``)
    input_grads: list = field(default_factory=list)


@dataclass(frozen=True)
class OptimizerLayout:
    """Names of an optimizer model: its parameters, their states, its hyper-parameters."""

    params: list
    states: list
    hyper: dict


def metadata_of(model: onnx.ModelProto, key: str) -> dict | None:
    for prop in model.metadata_props:
        if prop.key == key:
            try:
                return json.loads(prop.value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"metadata_props[{key!r}] is not valid JSON: {exc}") from exc
    return None


def read_layout(model: onnx.ModelProto, what: str) -> Layout:
    """Read the user/parameter names of a training or eval model.

    The names come from ``metadata_props['ortlearn.training']``; a model without
    it is read by position, following the contract's input order. Either way,
    every name must be an input or output of the graph (ValueError otherwise).
    """
    meta = metadata_of(model, TRAINING_METADATA_KEY)
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    if meta is not None:
        try:
            layout = Layout(list(meta["user_inputs"]), list(meta["user_outputs"]),
                             list(meta["trainable"]), list(meta["frozen"]),
                             list(meta.get(UPDATED_FROZEN_KEY, [])),
                             list(meta.get(INPUT_GRADIENTS_KEY, [])))
        except (KeyError, TypeError) as exc:
            raise ValueError(
                f"The {what} model's metadata_props[{TRAINING_METADATA_KEY!r}] lacks {exc} "
                "or is not a JSON object of lists.") from None
    else:  # trainable parameters are the ones with a gradient buffer
        buffers = [n for n in inputs if n.endswith(GRAD_BUFFER_SUFFIX)]
        trainable = [n[: -len(GRAD_BUFFER_SUFFIX)] for n in buffers]
        first = inputs.index(trainable[0]) if trainable and trainable[0] in inputs else len(
            inputs)
        end = inputs.index(buffers[0]) if buffers else len(inputs)
        layout = Layout(inputs[:first],
                        [n for n in outputs if not n.endswith(GRAD_OUTPUT_SUFFIX)],
                        trainable, [n for n in inputs[first:end] if n not in trainable])
    if what == "training" and LAZY_RESET_GRAD not in inputs:
        raise ValueError(
            f"The training model has no input {LAZY_RESET_GRAD!r}: it is not a training model "
            "of the artifacts (an inference model?). generate_artifacts writes one "
            "(doc/artifacts_format.md).")
    missing = [n for n in layout.user_inputs + layout.trainable + layout.frozen
               if n not in inputs]
    missing += [n for n in layout.user_outputs if n not in outputs]
    if what == "training":  # the accumulation buffers and their outputs, the reset flag
        grads = layout.trainable + layout.input_grads
        missing += [f"{p}{GRAD_BUFFER_SUFFIX}" for p in grads
                    if f"{p}{GRAD_BUFFER_SUFFIX}" not in inputs]
        missing += [f"{p}{GRAD_OUTPUT_SUFFIX}" for p in grads
                    if f"{p}{GRAD_OUTPUT_SUFFIX}" not in outputs]
    missing += [f"{n}{UPDATED_SUFFIX}" for n in layout.updated
                if f"{n}{UPDATED_SUFFIX}" not in outputs]
    missing += [n for n in layout.updated if n not in layout.frozen]
    if missing:
        raise ValueError(f"The {what} model's layout (its metadata, or the order of its "
                         f"inputs) names values the graph does not have: {missing}.")
    return layout


def read_optimizer_layout(model: onnx.ModelProto) -> OptimizerLayout:
    meta = metadata_of(model, OPTIMIZER_METADATA_KEY)
    if meta is None:
        raise ValueError(
            f"The optimizer model has no metadata_props[{OPTIMIZER_METADATA_KEY!r}]: "
            "it was not written by ortlearn.artifacts.generate_artifacts."
        )
    if not isinstance(meta, dict):
        raise ValueError(f"The optimizer model's metadata_props[{OPTIMIZER_METADATA_KEY!r}] "
                         f"is a JSON {type(meta).__name__}, not an object.")
    return OptimizerLayout(list(meta.get("params", [])), list(meta.get("states", [])),
                            dict(meta.get("hyper", {})))


def _input_dtype(value_info) -> np.dtype:
    """numpy dtype of a graph input, any ONNX element type (STRING is ``object``)."""
    elem = elem_type_of(value_info)
    try:
        return onnx_to_np_dtype(elem)
    except TypeError:  # the dtypes ortlearn trains are fewer than those a user feeds
        try:
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
        except KeyError:
            raise ValueError(f"Input {value_info.name!r} of the model has the element type "
                             f"{elem}, which is no ONNX tensor type (not a model an ONNX "
                             "exporter wrote?).") from None


def input_types(model: onnx.ModelProto) -> dict:
    """``{input name: (numpy dtype, declared shape)}``."""
    return {i.name: (_input_dtype(i), shape_of(i)) for i in model.graph.input}


# Operators whose inputs broadcast against each other: a symbolic dimension they
# align with another must have the same size at run time (or be 1).
_BROADCAST_OPS = frozenset((
    "Add", "And", "BitShift", "Div", "Equal", "Greater", "GreaterOrEqual", "Less",
    "LessOrEqual", "Max", "Mean", "Min", "Mod", "Mul", "Or", "Pow", "PRelu", "Sub", "Sum",
    "Where", "Xor",
))


# Losses whose labels have the scores' dimensions, less the class axis.
_LABEL_LOSSES = frozenset(("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"))


# Initializers up to this size keep their values for shape inference (Reshape targets).
_SMALL_INITIALIZER = 64


def linked_dims(model: onnx.ModelProto, user_inputs: list) -> list:
    """Dimensions of the user inputs the graph combines: ``[[(input, axis), ...], ...]``.

    Declared shapes tie inputs only when they share a symbol; a loss's target
    declared ``[M, 1]`` (or ``[None, 1]``) against an input ``[N, 4]`` is tied to
    it by the graph alone, where a ``Sub`` broadcasts the prediction against it.
    Shape inference on a copy of the graph (without the weights' values) gives
    the shapes of the values, and the dimensions that the inputs of a
    broadcasting operator (or of a loss, scores against labels) align are
    joined. A model without nodes (an ORT-format skeleton) or one shape
    inference fails on ties nothing.
    """
    if not model.graph.node or not user_inputs:
        return []
    graph = onnx.GraphProto(name=model.graph.name)
    graph.node.extend(model.graph.node)
    graph.output.extend(model.graph.output)
    declared = {i.name for i in model.graph.input}
    fresh = 0
    for value in model.graph.input:
        value = graph.input.add(name=value.name, type=value.type)
        if value.name in user_inputs and value.type.HasField("tensor_type"):
            for dim in value.type.tensor_type.shape.dim:
                if not dim.HasField("dim_value") and not dim.dim_param:
                    # an unnamed dimension gets a name, so that the graph can tie it
                    dim.dim_param = f"ortlearn.input_dim.{fresh}"
                    fresh += 1
    for init in model.graph.initializer:
        if int(np.prod(init.dims)) <= _SMALL_INITIALIZER:
            graph.initializer.append(init)
        elif init.name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)))
    copy = onnx.ModelProto(ir_version=model.ir_version, graph=graph)
    copy.opset_import.extend(model.opset_import)
    copy.functions.extend(model.functions)
    try:
        inferred = onnx.shape_inference.infer_shapes(copy)
    except Exception:  # noqa: BLE001 - an unusual graph only loses this check
        return []
    infos = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    shapes = {info.name: shape_of(info) for info in infos}

    parent: dict = {}

    def root(symbol):
        while parent.setdefault(symbol, symbol) != symbol:
            symbol = parent[symbol]
        return symbol

    def join(dims):
        symbols = [d for d in dims if isinstance(d, str)]
        for other in symbols[1:]:
            parent[root(other)] = root(symbols[0])

    for node in inferred.graph.node:
        ins = [shapes.get(name) if name else None for name in node.input]
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in _BROADCAST_OPS:
            known = [s for s in ins if s is not None]
            for k in range(1, max((len(s) for s in known), default=0) + 1):
                join([s[-k] for s in known if len(s) >= k])
        elif node.op_type in _LABEL_LOSSES and len(ins) >= 2 and ins[0] and ins[1]:
            scores, labels = ins[0], ins[1]
            if len(scores) == len(labels) + 1:
                for axis, dim in enumerate(labels):
                    join([scores[axis if axis == 0 else axis + 1], dim])
    groups: dict = {}
    for value in inferred.graph.input:
        if value.name not in user_inputs:
            continue
        for axis, dim in enumerate(shapes.get(value.name) or []):
            if isinstance(dim, str):
                groups.setdefault(root(dim), []).append((value.name, axis))
    return [g for g in groups.values() if len(g) > 1]


def is_string_array(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "OUS"


def as_model(model, what: str) -> onnx.ModelProto:
    if model is None:
        raise ValueError(f"No {what} model was given.")
    return load_model(os.fspath(model) if isinstance(model, os.PathLike) else model)


#: Bytes 4 to 8 of a model in onnxruntime's ORT format (its flatbuffers file identifier).
_ORT_FORMAT_ID = b"ORTM"


def is_ort_format(model) -> bool:
    """Whether ``model`` (bytes or a path) is in onnxruntime's ORT format."""
    if isinstance(model, (bytes, bytearray)):
        return bytes(model[4:8]) == _ORT_FORMAT_ID
    if isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        with open(model, "rb") as f:
            return f.read(8)[4:] == _ORT_FORMAT_ID
    return False


def ort_elem_type(type_name: str) -> int:
    """``TensorProto`` element type of an onnxruntime type string (``'tensor(float)'``)."""
    if not (type_name.startswith("tensor(") and type_name.endswith(")")):
        return 0
    try:
        return onnx.TensorProto.DataType.Value(type_name[len("tensor("):-1].upper())
    except ValueError:
        return 0


def _value_info(arg) -> onnx.ValueInfoProto:
    elem = ort_elem_type(arg.type)
    if not elem:
        return onnx.ValueInfoProto(name=arg.name)
    dims = [d if isinstance(d, (int, str)) else None for d in arg.shape]
    return onnx.helper.make_tensor_value_info(arg.name, elem, dims)


def skeleton(session: ort.InferenceSession) -> onnx.ModelProto:
    """The inputs, outputs and metadata of a session's model, as a ModelProto without nodes.

    An ORT-format model cannot be read back as ONNX; what the session reads
    of a model (its names, types, shapes and ``metadata_props``) the
    session of that model tells.
    """
    model = onnx.ModelProto()
    model.graph.input.extend(_value_info(i) for i in session.get_inputs())
    model.graph.output.extend(_value_info(o) for o in session.get_outputs())
    for key, value in session.get_modelmeta().custom_metadata_map.items():
        model.metadata_props.add(key=key, value=value)
    return model
