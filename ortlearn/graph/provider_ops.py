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


def _node(op_type: str, inputs: list, output: str, **attributes) -> onnx.NodeProto:
    """A node of one output, named after it."""
    return helper.make_node(op_type, inputs, [output], name=output, **attributes)


def _float_type(graph, value: str):
    """The element type of ``value`` when it is a float type, else None."""
    info = graph.infos.get(value)
    elem = elem_type_of(info) if info is not None else 0
    return elem if elem in FLOAT_TYPES else None


def _each(nodes: list, op_type: str, rule) -> list:
    """``nodes`` with each node of ONNX's ``op_type`` replaced by ``rule(node)``: the nodes
    that compute its outputs, or None to keep it (the loop of every pass here)."""
    out = []
    for node in nodes:
        new = rule(node) if node.op_type == op_type and node.domain in ("", "ai.onnx") else None
        out.extend([node] if new is None else new)
    return out


def sums_as_adds(nodes: list, graph) -> list:
    """A variadic ``Sum`` as a chain of ``Add``, in the order of its inputs.

    The backward pass sums the gradients reaching a value read several times
    with one ``Sum``, which some GPU providers (WebGPU) lack: the step would
    copy its inputs to the host and back. The same additions, in the same order.
    """
    def adds(node):
        name, total = node.output[0], node.input[0]
        if len(node.input) == 1:
            return [_node("Identity", [total], name)]
        new = []
        for i, term in enumerate(node.input[1:], start=2):
            partial = name if i == len(node.input) else f"{name}.partial{i}"
            new.append(_node("Add", [total, term], partial))
            total = partial
        return new

    return _each(nodes, "Sum", adds)


def log_softmax_decomposed(nodes: list, graph) -> list:
    """``LogSoftmax(x)`` as ``(x - max) - log(sum(exp(x - max)))`` along its axis.

    For providers without a ``LogSoftmax`` kernel (WebGPU): the same
    function, computed the way the kernels compute it, up to rounding.
    Opset 13 and later (the axis is one dimension).
    """
    if graph.opset < 13:
        return nodes

    def decomposed(node):
        x, name, axis = node.input[0], node.output[0], attr(node, "axis", -1)
        axes = name + ".axes"
        new = [_constant(axes, np.array([axis], dtype=np.int64))]
        steps = [("ReduceMax", [x, axes], ".max", {"keepdims": 1}),
                 ("Sub", [x, name + ".max"], ".shifted", {}),
                 ("Exp", [name + ".shifted"], ".exp", {}),
                 ("ReduceSum", [name + ".exp", axes], ".sum", {"keepdims": 1}),
                 ("Log", [name + ".sum"], ".log_sum", {})]
        if graph.opset < 18:  # ReduceMax takes its axes as an attribute before opset 18
            steps[0] = ("ReduceMax", [x], ".max", {"keepdims": 1, "axes": [axis]})
        new += [_node(op, inputs, name + suffix, **attributes)
                for op, inputs, suffix, attributes in steps]
        return new + [_node("Sub", [name + ".shifted", name + ".log_sum"], name)]

    return _each(nodes, "LogSoftmax", decomposed)


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

    def where(node):
        n = constants.get(node.input[1])
        if (n is None or n.shape != () or n.dtype.kind != "i"
                or lengths.get(node.input[0]) != {int(n)} or n <= 0):
            return None
        i, name = node.input[0], node.output[0]
        return [_constant(name + ".zero", np.zeros((), n.dtype)),
                _node("Less", [i, name + ".zero"], name + ".negative"),
                _node("Add", [i, node.input[1]], name + ".wrapped"),
                _node("Where", [name + ".negative", name + ".wrapped", i], name)]

    return _each(nodes, "Mod", where)


def signs_as_comparisons(nodes: list, graph) -> list:
    """``Sign(x)`` of a float ``x`` as ``(x > 0) - (x < 0)``, each comparison cast to x's type.

    The same values but for NaN, whose sign becomes 0 (a step that reaches NaN has
    diverged whatever follows). WebGPU has no ``Sign``; the gradients of ``Abs`` and of
    scikit-learn's hinge-like losses take one.
    """
    def comparisons(node):
        elem = _float_type(graph, node.input[0])
        if elem is None:
            return None
        x, name = node.input[0], node.output[0]
        new = [_constant(name + ".zero", np.zeros((), helper.tensor_dtype_to_np_dtype(elem)))]
        for op, suffix in (("Greater", ".positive"), ("Less", ".negative")):
            new.append(_node(op, [x, name + ".zero"], name + suffix + ".mask"))
            new.append(_node("Cast", [name + suffix + ".mask"], name + suffix, to=elem))
        return new + [_node("Sub", [name + ".positive", name + ".negative"], name)]

    return _each(nodes, "Sign", comparisons)


def nan_tests_as_comparisons(nodes: list, graph) -> list:
    """``IsNaN(x)`` of a float ``x`` as ``Not(x == x)``: NaN alone differs from itself.

    The same values. WebGPU has no ``IsNaN``; the join that orders a training step's
    update after every reader of the weights holds one (``training.fused``).
    """
    def inequality(node):
        if _float_type(graph, node.input[0]) is None:
            return None
        x, name = node.input[0], node.output[0]
        return [_node("Equal", [x, x], name + ".same"), _node("Not", [name + ".same"], name)]

    return _each(nodes, "IsNaN", inequality)


def trailing_unsqueezes_as_reshapes(nodes: list, graph) -> list:
    """``Unsqueeze(x, axes)`` of a non-float ``x`` that appends axes after its ``r`` known
    ones as ``Reshape(x, [0] * r + [1] * k)`` (0 copies the input's dimension).

    The same values. WebGPU's ``Unsqueeze`` takes no int64 (class labels), its
    ``Reshape`` does. Opset 13 and later (the axes are an input).
    """
    if graph.opset < 13:
        return nodes
    constants = graph.constants

    def reshape(node):
        axes = constants.get(node.input[1]) if len(node.input) > 1 else None
        info = graph.infos.get(node.input[0]) if axes is not None else None
        shape = shape_of(info) if info is not None else None
        if (shape is None or _float_type(graph, node.input[0]) is not None
                or elem_type_of(info) == 0):
            return None
        rank = len(shape) + axes.size
        if sorted(int(a) % rank for a in axes.ravel()) != list(range(len(shape), rank)):
            return None
        name = node.output[0]
        return [_constant(name + ".shape",
                          np.array([0] * len(shape) + [1] * axes.size, np.int64)),
                _node("Reshape", [node.input[0], name + ".shape"], name)]

    return _each(nodes, "Unsqueeze", reshape)


def sizes_as_shape_products(nodes: list, graph) -> list:
    """``Size(x)`` as the product of ``Shape(x)``, computed in int32 and cast back to int64.

    The same value up to 2**31 elements. WebGPU has no ``Size`` and no int64 ``ReduceProd``;
    a loss's mean over a batch divides by one.
    """
    def product(node):
        name = node.output[0]
        return [_node("Shape", [node.input[0]], name + ".shape"),
                _node("Cast", [name + ".shape"], name + ".shape32", to=TensorProto.INT32),
                _node("ReduceProd", [name + ".shape32"], name + ".size32", keepdims=0),
                _node("Cast", [name + ".size32"], name, to=TensorProto.INT64)]

    return _each(nodes, "Size", product)


def constants_of_shape_as_expands(nodes: list, graph) -> list:
    """``ConstantOfShape(shape)`` as ``Expand(v, shape)``, ``v`` its value as a scalar.

    The same tensor. A gradient starts from zeros of a value's shape (a scatter's base,
    a pad) with ``ConstantOfShape``, which WebGPU lacks; it expands a scalar.
    """
    def expand(node):
        value = next((onnx.numpy_helper.to_array(a.t) for a in node.attribute
                      if a.name == "value"), np.zeros(1, np.float32))
        scalar = node.output[0] + ".value"
        return [_constant(scalar, value.reshape(())),
                helper.make_node("Expand", [scalar, node.input[0]], [node.output[0]],
                                 name=node.name or node.output[0])]

    return _each(nodes, "ConstantOfShape", expand)


def gelus_decomposed(nodes: list, graph) -> list:
    """``Gelu(x)`` (opset 20) as ``x / 2 * (1 + erf(x / sqrt 2))``, or with
    ``approximate='tanh'`` as ``x / 2 * (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``.

    The definitions of the operator, up to rounding; WebGPU has ``Erf`` and ``Tanh``
    but no ``Gelu``. A ``Gelu`` of a value whose float type is unknown is kept.
    """
    def definition(node):
        elem = _float_type(graph, node.input[0])
        if elem is None:
            return None
        dtype = helper.tensor_dtype_to_np_dtype(elem)
        x, name, new = node.input[0], node.output[0], []

        def const(suffix, value):
            new.append(_constant(name + suffix, np.array(value, dtype)))
            return name + suffix

        def op(op_type, inputs, suffix):
            new.append(_node(op_type, inputs, name + suffix))
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
        new.append(_node("Mul", [half, op("Add", [curve, const(".one", 1.0)], ".one_plus")],
                         name))
        return new

    return _each(nodes, "Gelu", definition)


def ors_as_ands(nodes: list, graph) -> list:
    """``Or(a, b)`` as ``Not(And(Not(a), Not(b)))`` (De Morgan).

    The same values. WebGPU has ``And`` and ``Not``, not ``Or``; the graph's check of
    class labels (:func:`ortlearn.graph.guard_class_labels`) takes one.
    """
    def de_morgan(node):
        name = node.output[0]
        nots = [_node("Not", [x], f"{name}.not{i}") for i, x in enumerate(node.input)]
        return nots + [_node("And", [f"{name}.not0", f"{name}.not1"], name + ".none"),
                       _node("Not", [name + ".none"], name)]

    return _each(nodes, "Or", de_morgan)


#: The rewrites of this module, in the order a GPU provider's step runs them.
PROVIDER_OPS = (sums_as_adds, log_softmax_decomposed, index_wraps_as_wheres,
                signs_as_comparisons, nan_tests_as_comparisons,
                trailing_unsqueezes_as_reshapes, sizes_as_shape_products,
                constants_of_shape_as_expands, gelus_decomposed, ors_as_ands)
