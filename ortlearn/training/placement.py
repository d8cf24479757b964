"""The nodes of a graph that a GPU provider would leave to the CPU, and why.

onnxruntime puts a node on the first provider that has a kernel for its
operator, opset and element types, and the rest on the CPU, with a copy
between the two at each crossing (a ``MemcpyToHost``/``MemcpyFromHost``
node): a training step that crosses waits for the GPU at each copy, and the
WebGPU provider cannot record (graph capture) such a step. :func:`cpu_fallbacks`
tells, without a GPU, which nodes of a model would cross, so that a model can
be rewritten before it is trained (ortlearn's own steps are:
:data:`ortlearn.graph.passes.GPU_NODES`).

The WebGPU provider's kernels (:data:`WEBGPU_KERNELS`) were read off the
provider itself: ``python benchmarks/gpu.py OUT --only kernels`` on a GPU
machine opens one-operator models on it with onnxruntime's CPU fallback
disabled (``benchmarks/kernels.py``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..graph.model import DEFAULT_OPSET
from ..graph.passes import PROVIDER_NODES, rewrite_model

__all__ = ["WEBGPU_KERNELS", "Fallback", "cpu_fallbacks", "for_webgpu", "primary_input",
           "warn_cpu_fallbacks"]

#: The element types of the WebGPU provider's kernels, by operator (the type of the node's
#: :func:`primary_input`), with ``enableInt64``, at opset 18: onnxruntime-ep-webgpu 0.4.0 on
#: onnxruntime 1.32.0, read on an NVIDIA H200 (Vulkan) on 2026-11-28.
WEBGPU_KERNELS = {
    **dict.fromkeys((
        "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cos", "Cosh",
        "Elu", "Erf", "Exp", "Floor", "GatherElements", "GlobalAveragePool",
        "GlobalMaxPool", "HardSigmoid", "HardSwish", "InstanceNormalization",
        "LayerNormalization", "LeakyRelu", "Log", "LpNormalization", "Mish", "Neg",
        "Reciprocal", "Sigmoid", "Sin", "Sinh", "Slice", "Softmax", "Softplus",
        "Sqrt", "Tan", "Tanh", "ThresholdedRelu", "TopK"),
        "float16 float32"),
    **dict.fromkeys((
        "ArgMax", "ArgMin", "CumSum", "Identity", "Pad", "ReduceL1", "ReduceL2",
        "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
        "ReduceProd", "ReduceSumSquare", "ScatterElements", "ScatterND", "Shape",
        "Split", "Squeeze", "Transpose", "Trilu"),
        "float16 float32 int32 uint32"),
    **dict.fromkeys((
        "Add", "Clip", "Concat", "Div", "Equal", "Greater", "GreaterOrEqual", "Less",
        "LessOrEqual", "Max", "Min", "Mul", "PRelu", "ReduceSum", "Sub", "Tile"),
        "float16 float32 int32 int64 uint32"),
    **dict.fromkeys((
        "AveragePool", "BatchNormalization", "CenterCropPad", "Conv", "ConvTranspose", "DFT",
        "DepthToSpace", "GRU", "Gemm", "GridSample", "LSTM", "MatMul", "MaxPool",
        "NegativeLogLikelihoodLoss", "Resize", "Unsqueeze"),
        "float32"),
    **dict.fromkeys((
        "Cast", "CastLike", "Expand", "Gather", "Reshape"),
        "bool float16 float32 int32 int64 uint32 uint8"),
    **dict.fromkeys((
        "And", "If", "Not"),
        "bool"),
    **dict.fromkeys((
        "LogSoftmax", "Selu", "Softsign"),
        "float16"),
    "DequantizeLinear": "int32 int8 uint8",
    "Flatten": "bool float16 float32 int32 uint32",
    "GatherND": "float32 int32",
    "Pow": "float16 float32 int32",
    "Range": "float32 int32 int64",
    "Relu": "float16 float32 int64",
    "Where": "bool float16 float32 int32 int64 uint32",
}

#: The kernel tables :func:`cpu_fallbacks` knows, by device kind.
_TABLES = {"webgpu": WEBGPU_KERNELS}
_NAMES = {"webgpu": "WebGPU"}


@dataclass(frozen=True)
class Fallback:
    """A node a provider would leave to the CPU.

    Attributes
    ----------
    node : str
        The node's name (``'#i'``, its position, when it has none).
    op_type : str
    dtype : str or None
        The element type of its :func:`primary_input` (None: unknown).
    reason : str
    """

    node: str
    op_type: str
    dtype: str | None
    reason: str

    def __str__(self) -> str:
        return f"{self.op_type} node {self.node!r}: {self.reason}"


def primary_input(schema: onnx.defs.OpSchema) -> int:
    """The input whose element type picks an operator's kernel: the first whose type
    constraint admits several types (``Where``'s ``X``, not its boolean condition).

    Examples
    --------
    >>> primary_input(onnx.defs.get_schema("Where", 18))
    1
    >>> primary_input(onnx.defs.get_schema("Cast", 18))
    0
    """
    constraints = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    for i, formal in enumerate(schema.inputs):
        if len(constraints.get(formal.type_str, [])) > 1:
            return i
    return 0


def cpu_fallbacks(model: onnx.ModelProto, device: str = "webgpu") -> list:
    """The nodes of ``model`` that onnxruntime would run on the CPU rather than on ``device``.

    A node falls back when the provider has no kernel for its operator, or none
    for its element type (the WebGPU provider computes no float64, and int64
    only in the operators its ``enableInt64`` option covers, which ortlearn
    sets). ``Constant`` nodes are folded into initializers and never run.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph, its element types inferable (``onnx.shape_inference``).
    device : {'webgpu', 'cpu'}, default='webgpu'
        The provider; the CPU runs everything.

    Returns
    -------
    list of Fallback
        Empty when every node runs on the device.

    Raises
    ------
    ValueError
        For a device whose kernels ortlearn does not know (CUDA: onnxruntime's
        verbose log lists the placements of a session, ``log_severity_level=0``).

    Examples
    --------
    >>> from onnx import TensorProto, helper
    >>> graph = helper.make_graph(
    ...     [helper.make_node("Mod", ["a", "b"], ["c"], name="wrap")], "g",
    ...     [helper.make_tensor_value_info(n, TensorProto.INT64, [2]) for n in "ab"],
    ...     [helper.make_tensor_value_info("c", TensorProto.INT64, [2])])
    >>> [str(f) for f in cpu_fallbacks(helper.make_model(graph))]
    ["Mod node 'wrap': WebGPU has no Mod kernel"]
    """
    kind = str(device).partition(":")[0].lower()
    if kind == "cpu":
        return []
    if kind not in _TABLES:
        raise ValueError(f"cpu_fallbacks knows the kernels of {sorted(_TABLES)} and the CPU, "
                         f"not of {device!r}; onnxruntime's verbose log "
                         "(SessionOptions.log_severity_level = 0) lists a session's placements.")
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # over protobuf's 2 GB, or not inferable: the types it declares
        inferred = model
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    return _graph_fallbacks(inferred.graph, {}, opsets, kind)


def warn_cpu_fallbacks(model: onnx.ModelProto, what: str, device: str = "webgpu") -> list:
    """A ``RuntimeWarning`` naming the nodes of ``model`` (``what``: "the training step")
    that would run on the CPU rather than on ``device``; the :func:`cpu_fallbacks`."""
    fallbacks = cpu_fallbacks(model, device)
    if fallbacks:
        listed = "; ".join(map(str, fallbacks[:5]))
        warnings.warn(
            f"{len(fallbacks)} node(s) of {what} would run on the CPU, each crossing a "
            f"wait for the GPU ({listed}{'; ...' if len(fallbacks) > 5 else ''}): rewrite "
            "them with operators the provider has (ortlearn.training.cpu_fallbacks lists "
            "them).", RuntimeWarning, stacklevel=3)
    return fallbacks


def for_webgpu(model: onnx.ModelProto, what: str) -> onnx.ModelProto:
    """``model``, or where WebGPU lacks some of its operators a copy with them written in
    operators it has (:data:`~ortlearn.graph.passes.PROVIDER_NODES`: the same values up to
    rounding), warning for what would still run on the CPU (``what``: "the eval model").

    Examples
    --------
    >>> from onnx import TensorProto
    >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    >>> model = helper.make_model(helper.make_graph(
    ...     [helper.make_node("LogSoftmax", ["x"], ["y"], axis=1)], "g", [x], [y]),
    ...     opset_imports=[helper.make_opsetid("", 18)])
    >>> [n.op_type for n in for_webgpu(model, "a model").graph.node]
    ['Constant', 'ReduceMax', 'Sub', 'Exp', 'ReduceSum', 'Log', 'Sub']
    """
    if cpu_fallbacks(model):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = rewrite_model(copy, PROVIDER_NODES)
        warn_cpu_fallbacks(model, what)
    return model


def _element_types(graph: onnx.GraphProto, outer: dict) -> dict:
    types = dict(outer)
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types[info.name] = info.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    return types


def _graph_fallbacks(graph: onnx.GraphProto, outer: dict, opsets: dict, kind: str) -> list:
    types = _element_types(graph, outer)
    table, name = _TABLES[kind], _NAMES[kind]
    found = []
    for i, node in enumerate(graph.node):
        for attribute in node.attribute:  # the branches and bodies of If, Loop, Scan
            for sub in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
                found += _graph_fallbacks(sub, types, opsets, kind)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        reason, dtype = _reason(node, types, opsets, table, name)
        if reason:
            found.append(Fallback(node.name or f"#{i}", node.op_type, dtype, reason))
    return found


def _reason(node, types: dict, opsets: dict, table: dict, name: str) -> tuple:
    if node.domain not in ("", "ai.onnx"):
        return f"no {name} kernel of the domain {node.domain!r} is known", None
    if node.op_type not in table:
        return f"{name} has no {node.op_type} kernel", None
    schema = onnx.defs.get_schema(node.op_type, opsets.get("ai.onnx", DEFAULT_OPSET))
    position = primary_input(schema)
    if position >= len(node.input) or node.input[position] not in types:
        return f"the element type of its input {position} is unknown", None
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(types[node.input[position]])).name
    if dtype != "float64" and any(types.get(o) == onnx.TensorProto.DOUBLE for o in node.output):
        return f"{name} computes no float64", "float64"  # a Cast to float64
    if dtype not in table[node.op_type].split():
        if dtype == "float64":
            return f"{name} computes no float64", dtype
        return (f"{name}'s {node.op_type} kernels take {table[node.op_type].replace(' ', ', ')}"
                f", not {dtype}"), dtype
    return None, dtype
