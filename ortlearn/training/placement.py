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

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..graph.model import DEFAULT_OPSET

__all__ = ["WEBGPU_KERNELS", "Fallback", "cpu_fallbacks", "primary_input"]

#: The element types of the WebGPU provider's kernels, by operator (the type of the node's
#: :func:`primary_input`), with ``enableInt64``, at opset 18: onnxruntime-ep-webgpu 0.4.0 on
#: onnxruntime 1.32.0, read on an NVIDIA H200 (Vulkan) on 2026-11-28.
WEBGPU_KERNELS = {
    "Abs": "float16 float32", "Acos": "float16 float32", "Acosh": "float16 float32",
    "Add": "float16 float32 int32 int64 uint32", "And": "bool",
    "ArgMax": "float16 float32 int32 uint32", "ArgMin": "float16 float32 int32 uint32",
    "Asin": "float16 float32", "Asinh": "float16 float32", "Atan": "float16 float32",
    "Atanh": "float16 float32", "AveragePool": "float32", "BatchNormalization": "float32",
    "Cast": "bool float16 float32 int32 int64 uint32 uint8",
    "CastLike": "bool float16 float32 int32 int64 uint32 uint8", "Ceil": "float16 float32",
    "CenterCropPad": "float32", "Clip": "float16 float32 int32 int64 uint32",
    "Concat": "float16 float32 int32 int64 uint32", "Conv": "float32", "ConvTranspose": "float32",
    "Cos": "float16 float32", "Cosh": "float16 float32", "CumSum": "float16 float32 int32 uint32",
    "DFT": "float32", "DepthToSpace": "float32", "DequantizeLinear": "int32 int8 uint8",
    "Div": "float16 float32 int32 int64 uint32", "Elu": "float16 float32",
    "Equal": "float16 float32 int32 int64 uint32", "Erf": "float16 float32",
    "Exp": "float16 float32", "Expand": "bool float16 float32 int32 int64 uint32 uint8",
    "Flatten": "bool float16 float32 int32 uint32", "Floor": "float16 float32", "GRU": "float32",
    "Gather": "bool float16 float32 int32 int64 uint32 uint8",
    "GatherElements": "float16 float32", "GatherND": "float32 int32", "Gemm": "float32",
    "GlobalAveragePool": "float16 float32", "GlobalMaxPool": "float16 float32",
    "Greater": "float16 float32 int32 int64 uint32",
    "GreaterOrEqual": "float16 float32 int32 int64 uint32", "GridSample": "float32",
    "HardSigmoid": "float16 float32", "HardSwish": "float16 float32",
    "Identity": "float16 float32 int32 uint32", "If": "bool",
    "InstanceNormalization": "float16 float32", "LSTM": "float32",
    "LayerNormalization": "float16 float32", "LeakyRelu": "float16 float32",
    "Less": "float16 float32 int32 int64 uint32",
    "LessOrEqual": "float16 float32 int32 int64 uint32", "Log": "float16 float32",
    "LogSoftmax": "float16", "LpNormalization": "float16 float32", "MatMul": "float32",
    "Max": "float16 float32 int32 int64 uint32", "MaxPool": "float32",
    "Min": "float16 float32 int32 int64 uint32", "Mish": "float16 float32",
    "Mul": "float16 float32 int32 int64 uint32", "Neg": "float16 float32",
    "NegativeLogLikelihoodLoss": "float32", "Not": "bool",
    "PRelu": "float16 float32 int32 int64 uint32", "Pad": "float16 float32 int32 uint32",
    "Pow": "float16 float32 int32", "Range": "float32 int32 int64",
    "Reciprocal": "float16 float32", "ReduceL1": "float16 float32 int32 uint32",
    "ReduceL2": "float16 float32 int32 uint32", "ReduceLogSum": "float16 float32 int32 uint32",
    "ReduceLogSumExp": "float16 float32 int32 uint32",
    "ReduceMax": "float16 float32 int32 uint32", "ReduceMean": "float16 float32 int32 uint32",
    "ReduceMin": "float16 float32 int32 uint32", "ReduceProd": "float16 float32 int32 uint32",
    "ReduceSum": "float16 float32 int32 int64 uint32",
    "ReduceSumSquare": "float16 float32 int32 uint32", "Relu": "float16 float32 int64",
    "Reshape": "bool float16 float32 int32 int64 uint32 uint8", "Resize": "float32",
    "ScatterElements": "float16 float32 int32 uint32",
    "ScatterND": "float16 float32 int32 uint32", "Selu": "float16",
    "Shape": "float16 float32 int32 uint32", "Sigmoid": "float16 float32",
    "Sin": "float16 float32", "Sinh": "float16 float32", "Slice": "float16 float32",
    "Softmax": "float16 float32", "Softplus": "float16 float32", "Softsign": "float16",
    "Split": "float16 float32 int32 uint32", "Sqrt": "float16 float32",
    "Squeeze": "float16 float32 int32 uint32", "Sub": "float16 float32 int32 int64 uint32",
    "Tan": "float16 float32", "Tanh": "float16 float32", "ThresholdedRelu": "float16 float32",
    "Tile": "float16 float32 int32 int64 uint32", "TopK": "float16 float32",
    "Transpose": "float16 float32 int32 uint32", "Trilu": "float16 float32 int32 uint32",
    "Unsqueeze": "float32", "Where": "bool float16 float32 int32 int64 uint32",
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
    inferred = onnx.shape_inference.infer_shapes(model)
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    return _graph_fallbacks(inferred.graph, {}, opsets, kind)


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
    if dtype not in table[node.op_type].split():
        if dtype == "float64":
            return f"{name} computes no float64", dtype
        return (f"{name}'s {node.op_type} kernels take {table[node.op_type].replace(' ', ', ')}"
                f", not {dtype}"), dtype
    return None, dtype
