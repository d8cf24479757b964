"""Operators and types some GPU providers lack, written with the ones they have.

Passes of :mod:`ortlearn.graph.passes`' protocol (``pass(nodes, graph) -> nodes``, ``graph``
a :class:`~ortlearn.graph.passes.GraphView`),
run on a GPU provider's training step (:data:`ortlearn.graph.passes.GPU_NODES`): a node a
provider has no kernel for runs on the CPU, with a copy to the host and back that waits
for the GPU, and the WebGPU provider cannot record (graph capture) a step that holds one.
:func:`ortlearn.training.cpu_fallbacks` says which nodes of a graph would cross; each pass
here removes one kind, with the same values (up to rounding or NaN where it says so).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from .model import FLOAT_TYPES
from .nodes import attr
from .values import elem_type_of, shape_of

__all__ = ["PROVIDER_OPS", "constants_of_shape_as_expands", "gelus_decomposed",
           "index_wraps_as_wheres", "log_softmax_decomposed", "nan_tests_as_comparisons",
           "ors_as_ands", "signs_as_comparisons", "sizes_as_shape_products", "sums_as_adds",
           "trailing_unsqueezes_as_reshapes"]


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name,
                            value=onnx.numpy_helper.from_array(value))


def _float_type(graph, value: str):
    """The element type of ``value`` when it is a float type, else None."""
    info = graph.infos.get(value)
    elem = elem_type_of(info) if info is not None else 0
    return elem if elem in FLOAT_TYPES else None


def sums_as_adds(nodes: list, graph) -> list:
    """A variadic ``Sum`` as a chain of ``Add``, in the order of its inputs.

    The backward pass sums the gradients reaching a value read several times
    with one ``Sum``, which some GPU providers (WebGPU) lack: the step would
    copy its inputs to the host and back. The same additions, in the same order.
    """
    out = []
    for node in nodes:
        if node.op_type != "Sum" or node.domain not in ("", "ai.onnx"):
            out.append(node)
            continue
        name, total = node.output[0], node.input[0]
        if len(node.input) == 1:
            out.append(helper.make_node("Identity", [total], [name], name=name))
            continue
        for i, term in enumerate(node.input[1:], start=2):
            partial = name if i == len(node.input) else f"{name}.partial{i}"
            out.append(helper.make_node("Add", [total, term], [partial], name=partial))
            total = partial
    return out


def log_softmax_decomposed(nodes: list, graph) -> list:
    """``LogSoftmax(x)`` as ``(x - max) - log(sum(exp(x - max)))`` along its axis.

    For providers without a ``LogSoftmax`` kernel (WebGPU): the same
    function, computed the way the kernels compute it, up to rounding.
    Opset 13 and later (the axis is one dimension).
    """
    if graph.opset < 13:
        return nodes
    out = []
    for node in nodes:
        if node.op_type != "LogSoftmax" or node.domain not in ("", "ai.onnx"):
            out.append(node)
            continue
        x, name, axis = node.input[0], node.output[0], attr(node, "axis", -1)
        axes = name + ".axes"
        out.append(helper.make_node("Constant", [], [axes], name=axes,
                                    value=onnx.numpy_helper.from_array(
                                        np.array([axis], dtype=np.int64))))
        steps = [("ReduceMax", [x, axes], ".max", {"keepdims": 1}),
                 ("Sub", [x, name + ".max"], ".shifted", {}),
                 ("Exp", [name + ".shifted"], ".exp", {}),
                 ("ReduceSum", [name + ".exp", axes], ".sum", {"keepdims": 1}),
                 ("Log", [name + ".sum"], ".log_sum", {})]
        if graph.opset < 18:  # ReduceMax takes its axes as an attribute before opset 18
            steps[0] = ("ReduceMax", [x], ".max", {"keepdims": 1, "axes": [axis]})
        for op, inputs, suffix, attributes in steps:
            out.append(helper.make_node(op, inputs, [name + suffix], name=name + suffix,
                                        **attributes))
        out.append(helper.make_node("Sub", [name + ".shifted", name + ".log_sum"], [name],
                                    name=name))
    return out


def index_wraps_as_wheres(nodes: list, graph) -> list:
    """``Mod(i, n)`` of the indices ``i`` of a ``Gather`` or ``GatherElements`` along an
    axis of length ``n`` as ``Where(i < 0, i + n, i)``.

    Such indices lie in ``[-n, n)`` (onnxruntime refuses others), where the
    two are the same integers. The gradient of a ``GatherElements`` counts
    negative indices from the end with that ``Mod``, an operator some GPU
    providers (WebGPU) lack: the step would copy the indices to the host and
    back.
    """
    constants, shapes = graph.constants, graph.shapes
    lengths = {}  # indices -> the lengths of the axes they index
    for node in nodes:
        if node.op_type in ("Gather", "GatherElements") and node.domain in ("", "ai.onnx"):
            dims = shapes.get(node.input[0])
            if dims:
                n = dims[attr(node, "axis", 0) % len(dims)]
                lengths.setdefault(node.input[1], set()).add(n)
    out = []
    for node in nodes:
        n = constants.get(node.input[1]) if node.op_type == "Mod" else None
        if (n is None or node.domain not in ("", "ai.onnx") or n.shape != ()
                or n.dtype.kind != "i" or lengths.get(node.input[0]) != {int(n)} or n <= 0):
            out.append(node)
            continue
        i, name = node.input[0], node.output[0]
        zero = name + ".zero"
        out.append(helper.make_node("Constant", [], [zero], name=zero,
                                    value=onnx.numpy_helper.from_array(np.zeros((), n.dtype))))
        out.append(helper.make_node("Less", [i, zero], [name + ".negative"],
                                    name=name + ".negative"))
        out.append(helper.make_node("Add", [i, node.input[1]], [name + ".wrapped"],
                                    name=name + ".wrapped"))
        out.append(helper.make_node("Where", [name + ".negative", name + ".wrapped", i], [name],
                                    name=name))
    return out


def signs_as_comparisons(nodes: list, graph) -> list:
    """``Sign(x)`` of a float ``x`` as ``(x > 0) - (x < 0)``, each comparison cast to x's type.

    The same values but for NaN, whose sign becomes 0 (a step that reaches NaN has
    diverged whatever follows). WebGPU has no ``Sign``; the gradients of ``Abs`` and of
    scikit-learn's hinge-like losses take one.
    """
    out = []
    for node in nodes:
        elem = (_float_type(graph, node.input[0])
                if node.op_type == "Sign" and node.domain in ("", "ai.onnx") else None)
        if elem is None:
            out.append(node)
            continue
        x, name = node.input[0], node.output[0]
        zero = name + ".zero"
        out.append(_constant(zero, np.zeros((), helper.tensor_dtype_to_np_dtype(elem))))
        for op, suffix in (("Greater", ".positive"), ("Less", ".negative")):
            out.append(helper.make_node(op, [x, zero], [name + suffix + ".mask"],
                                        name=name + suffix + ".mask"))
            out.append(helper.make_node("Cast", [name + suffix + ".mask"], [name + suffix],
                                        name=name + suffix, to=elem))
        out.append(helper.make_node("Sub", [name + ".positive", name + ".negative"], [name],
                                    name=name))
    return out


def nan_tests_as_comparisons(nodes: list, graph) -> list:
    """``IsNaN(x)`` of a float ``x`` as ``Not(x == x)``: NaN alone differs from itself.

    The same values. WebGPU has no ``IsNaN``; the join that orders a training step's
    update after every reader of the weights holds one (``training.fused``).
    """
    out = []
    for node in nodes:
        if (node.op_type != "IsNaN" or node.domain not in ("", "ai.onnx")
                or _float_type(graph, node.input[0]) is None):
            out.append(node)
            continue
        x, name = node.input[0], node.output[0]
        out.append(helper.make_node("Equal", [x, x], [name + ".same"], name=name + ".same"))
        out.append(helper.make_node("Not", [name + ".same"], [name], name=name))
    return out


def trailing_unsqueezes_as_reshapes(nodes: list, graph) -> list:
    """``Unsqueeze(x, axes)`` of a non-float ``x`` that appends axes after its ``r`` known
    ones as ``Reshape(x, [0] * r + [1] * k)`` (0 copies the input's dimension).

    The same values. WebGPU's ``Unsqueeze`` takes no int64 (class labels), its
    ``Reshape`` does. Opset 13 and later (the axes are an input).
    """
    if graph.opset < 13:
        return nodes
    constants, out = graph.constants, []
    for node in nodes:
        axes = (constants.get(node.input[1]) if node.op_type == "Unsqueeze"
                and node.domain in ("", "ai.onnx") and len(node.input) > 1 else None)
        info = graph.infos.get(node.input[0]) if axes is not None else None
        shape = shape_of(info) if info is not None else None
        if (shape is None or _float_type(graph, node.input[0]) is not None
                or elem_type_of(info) == 0):
            out.append(node)
            continue
        rank = len(shape) + axes.size
        if sorted(int(a) % rank for a in axes.ravel()) != list(range(len(shape), rank)):
            out.append(node)
            continue
        name = node.output[0]
        out.append(_constant(name + ".shape",
                             np.array([0] * len(shape) + [1] * axes.size, np.int64)))
        out.append(helper.make_node("Reshape", [node.input[0], name + ".shape"], [name],
                                    name=name))
    return out


def sizes_as_shape_products(nodes: list, graph) -> list:
    """``Size(x)`` as the product of ``Shape(x)``, computed in int32 and cast back to int64.

    The same value up to 2**31 elements. WebGPU has no ``Size`` and no int64 ``ReduceProd``;
    a loss's mean over a batch divides by one.
    """
    out = []
    for node in nodes:
        if node.op_type != "Size" or node.domain not in ("", "ai.onnx"):
            out.append(node)
            continue
        name = node.output[0]
        steps = [("Shape", [node.input[0]], ".shape", {}),
                 ("Cast", [name + ".shape"], ".shape32", {"to": TensorProto.INT32}),
                 ("ReduceProd", [name + ".shape32"], ".size32", {"keepdims": 0})]
        for op, inputs, suffix, attributes in steps:
            out.append(helper.make_node(op, inputs, [name + suffix], name=name + suffix,
                                        **attributes))
        out.append(helper.make_node("Cast", [name + ".size32"], [name], name=name,
                                    to=TensorProto.INT64))
    return out


def constants_of_shape_as_expands(nodes: list, graph) -> list:
    """``ConstantOfShape(shape)`` as ``Expand(v, shape)``, ``v`` its value as a scalar.

    The same tensor. A gradient starts from zeros of a value's shape (a scatter's base,
    a pad) with ``ConstantOfShape``, which WebGPU lacks; it expands a scalar.
    """
    out = []
    for node in nodes:
        if node.op_type != "ConstantOfShape" or node.domain not in ("", "ai.onnx"):
            out.append(node)
            continue
        value = next((onnx.numpy_helper.to_array(a.t) for a in node.attribute
                      if a.name == "value"), np.zeros(1, np.float32))
        scalar = node.output[0] + ".value"
        out.append(_constant(scalar, value.reshape(())))
        out.append(helper.make_node("Expand", [scalar, node.input[0]], [node.output[0]],
                                    name=node.name or node.output[0]))
    return out


def gelus_decomposed(nodes: list, graph) -> list:
    """``Gelu(x)`` (opset 20) as ``x / 2 * (1 + erf(x / sqrt 2))``, or with
    ``approximate='tanh'`` as ``x / 2 * (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``.

    The definitions of the operator, up to rounding; WebGPU has ``Erf`` and ``Tanh``
    but no ``Gelu``. A ``Gelu`` of a value whose float type is unknown is kept.
    """
    out = []
    for node in nodes:
        elem = _float_type(graph, node.input[0]) if node.op_type == "Gelu" else None
        if elem is None or node.domain not in ("", "ai.onnx"):
            out.append(node)
            continue
        dtype = helper.tensor_dtype_to_np_dtype(elem)
        x, name = node.input[0], node.output[0]

        def const(suffix, value):
            out.append(_constant(name + suffix, np.array(value, dtype)))
            return name + suffix

        def op(op_type, inputs, suffix):
            out.append(helper.make_node(op_type, inputs, [name + suffix], name=name + suffix))
            return name + suffix

        if attr(node, "approximate", "none") == "tanh":
            cube = op("Mul", [x, op("Mul", [x, x], ".square")], ".cube")
            inner = op("Add", [x, op("Mul", [cube, const(".c", 0.044715)], ".scaled")],
                       ".inner")
            curve = op("Tanh", [op("Mul", [inner, const(".k", np.sqrt(2 / np.pi))],
                                   ".arg")], ".tanh")
        else:
            curve = op("Erf", [op("Mul", [x, const(".k", 1 / np.sqrt(2))], ".arg")], ".erf")
        half = op("Mul", [x, const(".half", 0.5)], ".half_x")
        out.append(helper.make_node("Mul", [half, op("Add", [curve, const(".one", 1.0)],
                                                     ".one_plus")], [name], name=name))
    return out


def ors_as_ands(nodes: list, graph) -> list:
    """``Or(a, b)`` as ``Not(And(Not(a), Not(b)))`` (De Morgan).

    The same values. WebGPU has ``And`` and ``Not``, not ``Or``; the graph's check of
    class labels (:func:`ortlearn.graph.guard_class_labels`) takes one.
    """
    out = []
    for node in nodes:
        if node.op_type != "Or" or node.domain not in ("", "ai.onnx"):
            out.append(node)
            continue
        name = node.output[0]
        for i, x in enumerate(node.input):
            out.append(helper.make_node("Not", [x], [f"{name}.not{i}"], name=f"{name}.not{i}"))
        out.append(helper.make_node("And", [f"{name}.not0", f"{name}.not1"], [name + ".none"],
                                    name=name + ".none"))
        out.append(helper.make_node("Not", [name + ".none"], [name], name=name))
    return out


#: The rewrites of this module, in the order a GPU provider's step runs them.
PROVIDER_OPS = (sums_as_adds, log_softmax_decomposed, index_wraps_as_wheres,
                signs_as_comparisons, nan_tests_as_comparisons,
                trailing_unsqueezes_as_reshapes, sizes_as_shape_products,
                constants_of_shape_as_expands, gelus_decomposed, ors_as_ands)
