"""The element type and shape of every value of a model: onnx's shape inference,
completed where it gives up (long vectors hidden from its data propagation, the outputs of
operators shaped like their first input), and reading and matching the shapes it gives.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import onnx
from onnx import helper

#: ai.onnx operators whose first output has the element type and shape of their
#: first input. :func:`value_info_map` gives them to it where onnx's shape
#: inference does not (onnx 1.23: none for GroupNormalization, no shape for
#: MeanVarianceNormalization), and :func:`~ortlearn.graph.refine_shapes`
#: propagates the shape.
OUTPUT_LIKE_INPUT0 = frozenset((
    "Abs", "Acos", "Asin", "Atan", "BatchNormalization", "Ceil", "Celu", "Clip", "Cos",
    "Cosh", "Dropout", "Elu", "Erf", "Exp", "Floor", "Gelu", "GroupNormalization",
    "HardSigmoid", "HardSwish", "Identity", "InstanceNormalization", "LayerNormalization",
    "LeakyRelu", "Log", "LogSoftmax", "LpNormalization", "MeanVarianceNormalization",
    "Mish", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin",
    "Sinh", "Softmax", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu",
))
#: ai.onnx operators whose every output has the element type and rank of their first
#: input, its lengths unknown: onnx's inference gives a Split with sizes known at run
#: time only no type at all.
OUTPUTS_OF_INPUT0_RANK = frozenset(("Split",))


def _typed(info: onnx.ValueInfoProto | None) -> bool:
    """Whether ``info`` gives an element type and a rank."""
    return info is not None and bool(elem_type_of(info)) and shape_of(info) is not None


#: A 1-D value longer than this is hidden from onnx's data propagation
#: (:func:`_infer_shapes`). onnx 1.23 propagates a 1-D tensor of static length
#: as one TensorShapeProto dimension per element through every elementwise
#: node, Concat, Slice...: about 1 KB and 2.5 us per element, 2.2 GB and 5 s
#: for the flat weights (2 million) of a fused step. Shape tensors, the
#: values data propagation is for, have one element per axis.
LONG_VECTOR = 4096


def _long_vectors(model: onnx.ModelProto) -> tuple[dict, dict]:
    """``{value: info}`` of the 1-D values longer than :data:`LONG_VECTOR`, and of
    all values, from shape inference without data propagation (empty where
    that fails)."""
    try:
        plain = _info_table(onnx.shape_inference.infer_shapes(model).graph)
    except Exception:  # shape inference is best effort
        return {}, {}
    long = {}
    for name, info in plain.items():
        dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else ()
        if len(dims) == 1 and dims[0].dim_value > LONG_VECTOR:
            long[name] = info
    return long, plain


def _long_vectors_cut(model: onnx.ModelProto, long: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose nodes read each value of ``long`` from a graph
    input of symbolic length (``<value>.ortlearn_long``) instead."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    g = probe.graph
    cut = set()
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in long:
                node.input[i] = name + ".ortlearn_long"
                cut.add(name)
    for name in sorted(cut):
        g.input.append(helper.make_tensor_value_info(
            name + ".ortlearn_long", elem_type_of(long[name]), [f"ortlearn_long.{name}"]))
    return probe


def _fill_static_dims(model: onnx.ModelProto, long: dict, plain: dict, n_inputs: int) -> None:
    """Undo :func:`_long_vectors_cut` in the inferred ``model``: drop the added
    inputs and give the long values their static length, and any dimension
    that inference left unknown (a slice of a long value) the one ``plain``
    (inference without data propagation) found."""
    g = model.graph
    del g.input[n_inputs:]
    seen = set()
    for info in itertools.chain(g.input, g.value_info, g.output):
        seen.add(info.name)
        if info.name in long:
            info.type.CopyFrom(long[info.name].type)
            continue
        known = plain.get(info.name)
        if not (info.type.HasField("tensor_type") and known is not None
                and known.type.HasField("tensor_type")):
            continue
        dims, static = info.type.tensor_type.shape.dim, known.type.tensor_type.shape.dim
        if len(dims) == len(static):
            for dim, other in zip(dims, static):
                if not dim.HasField("dim_value") and other.HasField("dim_value"):
                    dim.dim_value = other.dim_value  # clears dim_param (a oneof)
    g.value_info.extend(info for name, info in long.items() if name not in seen)


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx's shape inference, completed with :data:`OUTPUT_LIKE_INPUT0`.

    An output of those operators inference leaves without a type (or
    rank) gets its input's; inference then runs again from there, so that
    the nodes downstream get theirs. Long 1-D values (flat weights, their
    gradients) are hidden from data propagation (:data:`LONG_VECTOR`); their
    shapes come from inference without it.
    """
    long, plain = _long_vectors(model)
    if not long:
        return _infer_shapes_completed(model)
    inferred = _infer_shapes_completed(_long_vectors_cut(model, long))
    _fill_static_dims(inferred, long, plain, len(model.graph.input))
    return inferred


def _infer_shapes_completed(model: onnx.ModelProto) -> onnx.ModelProto:
    for _ in range(len(model.graph.node) + 1):
        try:
            model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception:  # shape inference is best effort; types come from declarations
            return model
        g = model.graph
        infos = _info_table(g)
        added = []
        for node in g.node:
            if (node.domain not in ("", "ai.onnx") or not node.input
                    or not _typed(infos.get(node.input[0]))):
                continue
            source = infos[node.input[0]]
            if node.op_type in OUTPUT_LIKE_INPUT0:
                names = node.output[:1]
            elif node.op_type in OUTPUTS_OF_INPUT0_RANK:
                names = node.output
            else:
                continue
            for name in names:
                if not name or _typed(infos.get(name)):
                    continue
                if node.op_type in OUTPUT_LIKE_INPUT0:
                    info = onnx.ValueInfoProto()
                    info.CopyFrom(source)
                    info.name = name
                else:
                    info = helper.make_tensor_value_info(
                        name, elem_type_of(source), [None] * len(shape_of(source)))
                infos[name] = info
                added.append(info)
        if not added:
            return model
        names = {i.name for i in added}
        kept = [v for v in g.value_info if v.name not in names]
        del g.value_info[:]
        g.value_info.extend(kept + added)
    return model


def value_info_map(model: onnx.ModelProto, infer: bool = True) -> dict[str, onnx.ValueInfoProto]:
    """Type and shape of every named value (inputs, outputs, intermediates, initializers).

    With ``infer``, onnx's shape inference completes the model's
    declarations, and outputs of :data:`OUTPUT_LIKE_INPUT0` operators it
    leaves untyped get their first input's type and shape.
    """
    if infer:
        model = _infer_shapes(model)
    return _info_table(model.graph)


def _info_table(g: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto]:
    """``{name: value info}``: the declared inputs and outputs over ``value_info``, but
    a declaration with less (an output declared without type, or without shape) never
    hides one with more."""
    infos = {}
    for v in itertools.chain(g.value_info, g.input, g.output):
        old = infos.get(v.name)
        if old is None or _typed(v) or (elem_type_of(v) and not _typed(old)):
            infos[v.name] = v
    for init in g.initializer:
        if init.name not in infos:
            infos[init.name] = helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims))
    return infos


def elem_type_of(info: onnx.ValueInfoProto) -> int:
    """The ``TensorProto`` element type of a tensor value's declared type."""
    return info.type.tensor_type.elem_type


def shape_of(info: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """Static shape of a value: ints, symbolic names, None for unknown dims, None if no rank."""
    tt = info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def shape_matches(declared, actual: Sequence[int], symbols: dict | None = None) -> bool:
    """Whether an array shape fits a declared ONNX shape (from :func:`shape_of`).

    None (unknown rank) and None dimensions match anything; a symbolic
    dimension matches any size, the same size wherever the symbol appears
    when a ``symbols`` dict (symbol -> size, filled as it goes) is shared
    across the inputs of one call.
    """
    if declared is None:
        return True
    if len(declared) != len(actual):
        return False
    for dim, size in zip(declared, actual):
        if isinstance(dim, str):
            if symbols is not None and symbols.setdefault(dim, size) != size:
                return False
        elif dim is not None and dim != size:
            return False
    return True
