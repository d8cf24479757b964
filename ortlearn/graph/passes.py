"""Graph rewrites that keep a graph's values and cost onnxruntime less: one function a pass.

Every pass has one signature, ``pass(nodes, graph) -> nodes``: it takes the
nodes of a graph in order and a :class:`GraphView` that answers questions
about them (types and shapes, constant values, the values that must keep
their names and shapes), and returns the rewritten nodes. A pass leaves the
values of the graph's outputs unchanged: bit for bit, or up to rounding
where its docstring says so. :data:`CHEAPER_NODES` is the ordered list the
training step runs (:func:`run_passes`); each pass is tested alone in
``tests/graph/test_passes.py``.

Each node costs onnxruntime about a microsecond whatever its size, and some
operators are much slower than an equivalent pair: the figures behind each
rewrite are in ``doc/performance_notes.rst``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper

from .model import FLOAT_TYPES, finalize_model, onnx_to_np_dtype, opset_of
from .nodes import attr, constant_values, needed_nodes, readers, rewritten
from .provider_ops import PROVIDER_OPS
from .shapes import broadcast_shape, refine_shapes
from .values import elem_type_of, shape_of, value_info_map

__all__ = [
    "CHEAPER_NODES",
    "GPU_NODES",
    "PROVIDER_NODES",
    "GraphView",
    "Pass",
    "column_sums_as_products",
    "common_factors",
    "expands_as_broadcasts",
    "masks_as_products",
    "negations_folded",
    "rewrite_model",
    "run_passes",
    "scattered_updates",
    "single_values_at_full_rank",
    "unused_nodes_removed",
]


class GraphView:
    """What a pass may ask about the nodes it rewrites; each answer computed once, on demand.

    Parameters
    ----------
    model : onnx.ModelProto
        The model the nodes belong to: its inputs, initializers and opset
        (its own nodes are ignored).
    nodes : list of onnx.NodeProto
        The nodes being rewritten.
    outputs : iterable of str
        Values that keep their names and shapes (the graph's outputs).
    """

    def __init__(self, model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], outputs):
        self.model, self.nodes, self.outputs = model, list(nodes), frozenset(outputs)

    @property
    def opset(self) -> int:
        """Version of the ai.onnx domain."""
        return opset_of(self.model)

    @functools.cached_property
    def graph(self) -> onnx.GraphProto:
        """The model's graph holding :attr:`nodes`."""
        graph = onnx.GraphProto()
        graph.CopyFrom(self.model.graph)
        del graph.node[:]
        graph.node.extend(self.nodes)
        return graph

    @functools.cached_property
    def infos(self) -> dict:
        """``{value: ValueInfoProto}`` from ONNX shape inference."""
        probe = onnx.ModelProto()
        probe.CopyFrom(self.model)
        probe.graph.CopyFrom(self.graph)
        return value_info_map(probe)

    @functools.cached_property
    def constants(self) -> dict:
        """``{value: numpy array}`` of the values known before running."""
        return constant_values(self.graph)

    @functools.cached_property
    def shapes(self) -> dict:
        """``{value: shape}`` of :func:`~ortlearn.graph.refine_shapes`."""
        return refine_shapes(self.graph, self.infos, self.constants)


class Pass(NamedTuple):
    """A named rewrite: ``rewrite(nodes, graph) -> nodes``."""

    name: str
    rewrite: Callable[[list, GraphView], list]


def unused_nodes_removed(nodes: list, graph: GraphView) -> list:
    """The nodes that computing the graph's outputs needs, in their order."""
    return needed_nodes(nodes, graph.outputs)


def _float_constants(nodes) -> dict:
    """``{output: (TensorProto element type, numpy value)}`` of the float Constant nodes
    (not initializers: a trained weight may be one)."""
    found = {}
    for node in nodes:
        if (node.op_type == "Constant" and len(node.attribute) == 1
                and node.attribute[0].name == "value"
                and node.attribute[0].t.data_type in FLOAT_TYPES):
            tensor = node.attribute[0].t
            found[node.output[0]] = (tensor.data_type, onnx.numpy_helper.to_array(tensor))
    return found


def _not_finite(graph: GraphView, constants: dict, name: str) -> bool:
    """Whether the constant or initializer ``name`` holds an infinity or a NaN."""
    if name in constants:
        return not np.isfinite(constants[name][1]).all()
    init = next((i for i in graph.graph.initializer if i.name == name), None)
    return (init is not None and init.data_type in FLOAT_TYPES
            and not np.isfinite(onnx.numpy_helper.to_array(init)).all())


def masks_as_products(nodes: list, graph: GraphView) -> list:
    """``Where(cond, g, 0)`` rewritten as ``g * Cast(cond)``, the same value for finite ``g``.

    The backward pass masks gradients with ``Where`` (ReLU, clipping);
    onnxruntime's CPU ``Where`` is several times slower than a ``Cast`` and
    a ``Mul`` together. A constant ``g`` that is not finite (an attention mask's
    ``-inf``: ``-inf * 0`` is NaN) keeps its ``Where``.
    """
    constants = _float_constants(nodes)
    zeros = {name: elem for name, (elem, value) in constants.items()
             if value.size == 1 and float(value.ravel()[0]) == 0}
    out = []
    for node in nodes:
        if (node.op_type != "Where" or node.input[2] not in zeros
                or _not_finite(graph, constants, node.input[1])):
            out.append(node)
            continue
        mask = node.output[0] + ".mask"
        out.append(helper.make_node("Cast", [node.input[0]], [mask], to=zeros[node.input[2]],
                                    name=mask))
        out.append(helper.make_node("Mul", [node.input[1], mask], list(node.output),
                                    name=node.output[0] + ".masked"))
    return out


#: A ``ReduceSum`` over the rows of a matrix of at least this many columns
#: becomes a product with a row of ones (see :func:`column_sums_as_products`).
_MIN_SUM_COLUMNS = 32


def _int_constants(nodes) -> dict:
    """``{output: list of int}`` of the Constant nodes holding int64 tensors."""
    out = {}
    for node in nodes:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value" \
                and node.attribute[0].t.data_type == TensorProto.INT64:
            out[node.output[0]] = onnx.numpy_helper.to_array(node.attribute[0].t).ravel().tolist()
    return out


def column_sums_as_products(nodes: list, graph: GraphView) -> list:
    """``ReduceSum(x, axes=[0])`` of a (n, k) float matrix as ``ones(1, n) @ x``.

    The backward pass sums the gradient of a bias over the rows of the
    batch; onnxruntime's CPU ``ReduceSum`` over the first axis of a matrix
    is several times slower than the matrix product, even with the three
    nodes (four before opset 15) that build the row of ones. Done for at
    least ``_MIN_SUM_COLUMNS`` columns. The sum is the same up to rounding
    (another order of additions).
    """
    axes_of, infos, opset = _int_constants(nodes), graph.infos, graph.opset
    out = []
    for node in nodes:
        info = infos.get(node.input[0]) if node.op_type == "ReduceSum" else None
        shape = shape_of(info) if info is not None else None
        keepdims = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
        if (info is None or len(node.input) < 2 or axes_of.get(node.input[1]) not in ([0], [-2])
                or elem_type_of(info) not in FLOAT_TYPES or shape is None or len(shape) != 2
                or not isinstance(shape[1], int) or shape[1] < _MIN_SUM_COLUMNS
                or len(node.attribute) > 1):
            out.append(node)
            continue
        x, name = node.input[0], node.output[0]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type_of(info))

        def const(suffix, value):
            out.append(helper.make_node("Constant", [], [name + suffix], name=name + suffix,
                                        value=onnx.numpy_helper.from_array(value)))
            return name + suffix

        rows = name + ".rows"
        if opset >= 15:  # Shape takes start and end from opset 15 on: no Gather
            out.append(helper.make_node("Shape", [x], [rows], name=rows, start=0, end=1))
        else:
            first = const(".first", np.array([0], dtype=np.int64))
            out.append(helper.make_node("Shape", [x], [name + ".shape"], name=name + ".shape"))
            out.append(helper.make_node("Gather", [name + ".shape", first], [rows], name=rows))
        one = const(".one", np.array([1], dtype=np.int64))
        out.append(helper.make_node("Concat", [one, rows], [name + ".dims"], axis=0,
                                    name=name + ".dims"))
        out.append(helper.make_node("ConstantOfShape", [name + ".dims"], [name + ".ones"],
                                    name=name + ".ones",
                                    value=onnx.numpy_helper.from_array(np.ones(1, dtype))))
        if keepdims:
            out.append(helper.make_node("MatMul", [name + ".ones", x], [name], name=name))
            continue
        out.append(helper.make_node("MatMul", [name + ".ones", x], [name + ".row"],
                                    name=name + ".row"))
        flat = const(".flat", np.array([-1], dtype=np.int64))
        out.append(helper.make_node("Reshape", [name + ".row", flat], [name], name=name))
    return out


#: Elementwise operators whose broadcasting makes an ``Expand`` of one operand
#: to the other's shape redundant.
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div"})
#: Elementwise operators of one operand an expanded single value may go
#: through as that value (``Neg(Expand(s))`` is ``Expand(Neg(s))``).
_UNARY = frozenset({"Neg"})


def _keeps_one_value(node, value: str, shapes: dict, target) -> bool:
    """Whether ``node`` applied to ``Expand(s, target)`` (named ``value``) is ``Expand`` of
    the node applied to ``s``, a single value: a ``Neg``, or an arithmetic operator whose
    other operand is a single value of no more dimensions than ``target``."""
    if node.op_type in _UNARY:
        return True
    if node.op_type not in _BROADCASTING or len(node.input) != 2 or len({*node.input}) != 2:
        return False
    other = _static_shape(shapes, next(v for v in node.input if v != value))
    return other is not None and len(other) <= len(target) and all(d == 1 for d in other)


def _static_shape(shapes: dict, name: str):
    """The shape of ``name`` when every dimension is known (int or symbol), else None."""
    shape = shapes.get(name)
    return None if shape is None or None in shape else shape


def expands_as_broadcasts(nodes: list, graph: GraphView) -> list:
    """``Mul(Expand(s, shape), y)`` rewritten as ``Mul(s, y)`` where broadcasting gives
    the same shape.

    The gradient of a mean or a sum is its upstream scalar expanded to the
    input's shape, which the loss's gradient then multiplies (the one-hot
    rows of a cross-entropy, the weight of an L2 penalty); a sparse row's
    product spreads each row's value over its non-zeros the same way:
    broadcasting gives the same values without the ``Expand`` (and the
    ``Shape`` that may feed it), each node costing onnxruntime about a
    microsecond. Done when every consumer is an elementwise binary operator
    whose result has the same shape with ``s`` as with the expanded value;
    when ``s`` holds one value, after a chain of ``Neg`` or of products with
    a single value (then applied to the single value: the half of a squared
    error). ``shapes`` are those of :func:`~ortlearn.graph.refine_shapes`,
    which give the rows of a batch one symbol (ONNX shape inference gives
    each sliced or broadcast value a new one). The graph's outputs keep
    their shapes.
    """
    shapes, outputs = graph.shapes, graph.outputs
    consumers = readers(nodes)
    # output of a Shape node -> the value it measures
    measured = {node.output[0]: node.input[0] for node in nodes
                if node.op_type == "Shape" and not node.attribute}
    replaced = {}
    for node in nodes:
        if node.op_type != "Expand":
            continue
        source = _static_shape(shapes, node.input[0])
        # Expand(s, Shape(v)) has v's shape, whatever symbol its output got
        target = _static_shape(shapes, measured.get(node.input[1], node.output[0]))
        if source is None or target is None or len(source) > len(target):
            continue
        value, users = node.output[0], consumers.get(node.output[0], [])
        single = all(d == 1 for d in source)
        while single and len(users) == 1 and value not in outputs \
                and _keeps_one_value(users[0], value, shapes, target):
            value = users[0].output[0]
            users = consumers.get(value, [])
        if value in outputs or not users:
            continue
        others = [_static_shape(shapes, next(v for v in user.input if v != value))
                  if user.op_type in _BROADCASTING and len(user.input) == 2
                  and len({*user.input}) == 2 else None for user in users]
        if all(other is not None and None not in (result := broadcast_shape([target, other]))
               and broadcast_shape([source, other]) == result for other in others):
            replaced[node.output[0]] = node.input[0]
    out = []
    for node in nodes:
        if node.op_type == "Expand" and node.output[0] in replaced:
            continue
        if any(v in replaced for v in node.input):
            node = onnx.NodeProto.FromString(node.SerializeToString())
            node.input[:] = [replaced.get(v, v) for v in node.input]
        out.append(node)
    return out


def _sole_use(consumers: dict, value: str, node, outputs) -> bool:
    """Whether ``node`` is the only reader of ``value``, which is no graph output."""
    users = consumers.get(value, [])
    return value not in outputs and len(users) == 1 and users[0] is node


def negations_folded(nodes: list, graph: GraphView) -> list:
    """``Neg(Mul(c, x))`` and ``Neg(Div(c, x))`` as one node of the constant ``-c``.

    The gradient of a mean, ``1 / n``, reaches a negated loss (the
    cross-entropy's ``-log p``) as ``Neg(Div(1, n))``. Negating the
    constant is exact: the values are the same, bit for bit, one node fewer
    per step. The product or quotient must have no other reader.
    """
    constants, outputs = graph.constants, graph.outputs
    producer = {o: node for node in nodes for o in node.output}
    consumers = readers(nodes)
    folded = {}  # id of the Mul or Div -> (negated constant node, new node)
    dropped = set()
    for node in nodes:
        source = producer.get(node.input[0]) if node.op_type == "Neg" else None
        if source is None or source.op_type not in ("Mul", "Div") \
                or not _sole_use(consumers, source.output[0], node, outputs):
            continue
        # c * x, x * c or c / x: the constant may stand where negating it negates the result
        slots = (0, 1) if source.op_type == "Mul" else (0,)
        slot = next((i for i in slots if source.input[i] in constants
                     and constants[source.input[i]].dtype.kind == "f"), None)
        if slot is None:
            continue
        negated = source.output[0] + ".negated"
        constant = helper.make_node("Constant", [], [negated], name=negated,
                                    value=onnx.numpy_helper.from_array(
                                        np.asarray(-constants[source.input[slot]])))
        inputs = list(source.input)
        inputs[slot] = negated
        folded[id(source)] = (constant, helper.make_node(source.op_type, inputs,
                                                         list(node.output), name=node.name))
        dropped.add(id(node))
    return rewritten(nodes, folded, dropped)


def common_factors(nodes: list, graph: GraphView) -> list:
    """``Sub(Mul(a, s), Mul(b, s))`` rewritten as ``Mul(Sub(a, b), s)``; so for ``Add``.

    The cross-entropy's gradient with respect to the logits comes out of
    the backward pass as ``onehot * s - softmax * s``, ``s`` the mean's
    ``-1 / n``: one product fewer per step. The value is the same up to
    rounding; broadcasting gives the same shape, whatever the operands'.
    Each product must have no other reader.
    """
    outputs = graph.outputs
    producer = {o: node for node in nodes for o in node.output}
    consumers = readers(nodes)
    factored, dropped = {}, set()
    for node in nodes:
        if node.op_type not in ("Add", "Sub") or len(node.input) != 2:
            continue
        left, right = (producer.get(v) for v in node.input)
        if left is None or right is None or left is right \
                or left.op_type != "Mul" or right.op_type != "Mul" \
                or id(left) in dropped or id(right) in dropped \
                or not all(_sole_use(consumers, m.output[0], node, outputs)
                           for m in (left, right)):
            continue
        shared = set(left.input) & set(right.input)
        if len(shared) != 1 or len(set(left.input)) != 2 or len(set(right.input)) != 2:
            continue
        factor = shared.pop()
        a, b = (next(v for v in m.input if v != factor) for m in (left, right))
        inner = node.output[0] + ".factored"
        factored[id(node)] = [
            helper.make_node(node.op_type, [a, b], [inner], name=inner),
            helper.make_node("Mul", [inner, factor], list(node.output), name=node.name)]
        dropped.update((id(left), id(right)))
    return rewritten(nodes, factored, dropped)


def _single(shapes: dict, name: str) -> bool:
    shape = _static_shape(shapes, name)
    return shape is not None and all(d == 1 for d in shape)


def _zeros(node, producer: dict) -> bool:
    """Whether ``node``'s first input is a ``ConstantOfShape`` of zeros."""
    source = producer.get(node.input[0])
    if source is None or source.op_type != "ConstantOfShape":
        return False
    value = next((a.t for a in source.attribute if a.name == "value"), None)
    return value is None or not np.any(onnx.numpy_helper.to_array(value))


def _scattered_gradient(name: str, producer: dict):
    """``(ScatterElements, Reshape)`` where ``name`` is ``Reshape(ScatterElements(zeros, i, u,
    axis=0, reduction='add'))``: the gradient of a ``Gather``'s table (None otherwise)."""
    reshape = producer.get(name)
    scatter = producer.get(reshape.input[0]) if reshape is not None \
        and reshape.op_type == "Reshape" else None
    if (scatter is None or scatter.op_type != "ScatterElements"
            or attr(scatter, "axis", 0) != 0 or attr(scatter, "reduction", "none") != "add"
            or not _zeros(scatter, producer)):
        return None
    return scatter, reshape


def _orders_only(node, consumers: dict, outputs) -> bool:
    """Whether ``node``'s output only orders nodes: it reaches nothing but the condition of
    ``Where(c, x, x)`` (x whatever c), through the ``Reshape``, ``Gather``, ``Cast``,
    ``Sum`` and ``IsNaN`` of the training step's join (``training.fused``)."""
    todo, seen = [node], set()
    while todo:
        current = todo.pop()
        for value in current.output:
            if value in outputs:
                return False
            for user in consumers.get(value, []):
                if user.op_type == "Where":
                    if user.input[0] != value or user.input[1] != user.input[2] \
                            or value in user.input[1:]:
                        return False
                elif user.op_type in ("Reshape", "Gather", "Cast", "Sum", "IsNaN"):
                    if id(user) not in seen:
                        seen.add(id(user))
                        todo.append(user)
                else:
                    return False
    return True


def scattered_updates(nodes: list, graph: GraphView) -> list:
    """SGD's step of a weight ``w`` of a static shape read by a ``Gather`` (a linear model's
    weights on hashed features), with an L2 penalty, ``w - s * (c * w + G)`` where ``G``
    scatters the rows' gradients ``u`` at the flat positions ``i`` into zeros, rewritten as
    ``ScatterElements(w * (1 - s * c), i, -s * u)`` (on a flat view of the weights and
    reshaped, but for a column ``(n, 1)``, whose positions are its rows).

    On hashed features (2 000 000 weights, 10 a row) the step was six passes over the
    weights and three tensors of their size alive at once (the zeros scattered into, the
    penalty's gradient, their sum); it becomes one product, the scattered rows and one copy
    into the output's buffer (``doc/performance_notes.rst``, "Hashed features"). The same
    value up to rounding. The training step's join (``Gather`` of an element of each
    gradient, which orders the update after every node reading a weight) reads the sum of
    ``u`` instead of ``G``, which is no longer computed: ``w``'s own readers are the new
    product's ancestors or the loss's.
    """
    shapes, outputs, infos = graph.shapes, graph.outputs, graph.infos
    producer = {o: node for node in nodes for o in node.output}
    consumers = readers(nodes)
    replaced, dropped = {}, set()

    def only(value, *allowed):
        return value not in outputs and all(
            any(user is a for a in allowed) for user in consumers.get(value, []))

    for node in nodes:
        if node.op_type != "Sub" or len(node.input) != 2:
            continue
        w, step = node.input
        product = producer.get(step)
        dims = _static_shape(shapes, w)
        if product is None or product.op_type != "Mul" or dims is None or not dims \
                or not all(isinstance(d, int) for d in dims) or not only(step, node):
            continue
        s, total = ((product.input[0], product.input[1]) if _single(shapes, product.input[0])
                    else (product.input[1], product.input[0]))
        adder = producer.get(total)
        if not _single(shapes, s) or adder is None or adder.op_type not in ("Add", "Sum") \
                or len(adder.input) != 2:
            continue
        decay = scattered = None
        for term, other in (adder.input, reversed(adder.input)):
            penalty, found = producer.get(term), _scattered_gradient(other, producer)
            if penalty is not None and penalty.op_type == "Mul" and w in penalty.input \
                    and found is not None:
                c = next(v for v in penalty.input if v != w) if penalty.input[0] != \
                    penalty.input[1] else None
                if c is not None and _single(shapes, c):
                    decay, scattered = (penalty, c), found
                    break
        if decay is None:
            continue
        scatter, reshape = scattered
        joins = [user for user in consumers.get(total, []) if user is not product]
        if not (only(decay[0].output[0], adder) and only(reshape.output[0], adder)
                and only(scatter.output[0], reshape)
                and all(_orders_only(j, consumers, outputs) for j in joins)):
            continue
        elem = elem_type_of(infos[s]) if s in infos else None
        if elem is None:
            continue
        name = node.output[0]
        one = onnx.numpy_helper.from_array(np.ones((), onnx_to_np_dtype(elem)))
        positions, rows_gradient = scatter.input[1], scatter.input[2]
        new = [
            helper.make_node("Constant", [], [name + ".one"], value=one),
            helper.make_node("Mul", [s, decay[1]], [name + ".sc"]),
            helper.make_node("Sub", [name + ".one", name + ".sc"], [name + ".decay"]),
            helper.make_node("Mul", [w, name + ".decay"], [name + ".decayed"]),
            helper.make_node("Neg", [s], [name + ".minus_s"]),
            helper.make_node("Mul", [rows_gradient, name + ".minus_s"], [name + ".steps"]),
            helper.make_node("Constant", [], [name + ".axes"], value=onnx.numpy_helper.from_array(
                np.array([-1], dtype=np.int64)))]
        if list(dims[1:]) == [1]:
            # a column: the flat positions are its rows, scattered into it as it is
            new += [
                helper.make_node("Unsqueeze", [positions, name + ".axes"], [name + ".rows"]),
                helper.make_node("Unsqueeze", [name + ".steps", name + ".axes"],
                                 [name + ".row_steps"]),
                helper.make_node("ScatterElements", [name + ".decayed", name + ".rows",
                                                     name + ".row_steps"], [name], name=name,
                                 axis=0, reduction="add")]
        else:
            # the positions are those of the flat weights: scattered into a flat view
            new += [
                helper.make_node("Reshape", [name + ".decayed", name + ".axes"],
                                 [name + ".flat"]),
                helper.make_node("ScatterElements", [name + ".flat", positions, name + ".steps"],
                                 [name + ".scattered"], axis=0, reduction="add"),
                helper.make_node("Constant", [], [name + ".shape"],
                                 value=onnx.numpy_helper.from_array(np.array(dims, np.int64))),
                helper.make_node("Reshape", [name + ".scattered", name + ".shape"], [name],
                                 name=name)]
        replaced[id(node)] = new
        for join in joins:
            total_name = join.output[0] + ".rows_sum"
            moved = onnx.NodeProto.FromString(join.SerializeToString())
            moved.input[0] = total_name
            replaced[id(join)] = [helper.make_node("ReduceSum", [rows_gradient], [total_name],
                                                   name=total_name), moved]
        dropped.update(id(n) for n in (product, adder, decay[0], reshape, scatter))
    return rewritten(nodes, replaced, dropped)


#: A computed single value is reshaped (one node more, about a microsecond) only against
#: a tensor of a static shape of at least this many elements: the row-at-a-time broadcast
#: costs about 9 ns a row (see :func:`single_values_at_full_rank`).
_FULL_RANK_MIN_ELEMENTS = 256


def single_values_at_full_rank(nodes: list, graph: GraphView) -> list:
    """A single value that an arithmetic operator broadcasts against a tensor of a higher
    rank whose last dimension is 1, given that rank: ``Mul(lr, w)`` with ``lr`` of shape
    ``()`` and ``w`` of shape ``(n, 1)`` becomes ``Mul(lr', w)``, ``lr'`` of shape ``(1, 1)``.

    onnxruntime's CPU kernels of ``Add``, ``Sub``, ``Mul`` and ``Div`` broadcast a value of
    a lower rank against such a tensor one row at a time: a linear model's update,
    ``w - lr * g`` over 2 000 000 weights of shape ``(2 000 000, 1)``, took 18 ms a product
    against 0.9 with the rate of shape ``(1, 1)`` (``doc/performance_notes.rst``). The same
    values, bit for bit, and the same output shape. A constant is reshaped in a Constant
    node of its own; a computed value through a ``Reshape`` node, where the tensor's shape
    is static and holds at least ``_FULL_RANK_MIN_ELEMENTS`` elements.
    """
    shapes = graph.shapes
    declared = {i.name for i in graph.graph.input}
    tensors = {i.name: i for i in graph.graph.initializer if i.name not in declared}
    tensors.update((n.output[0], n.attribute[0].t) for n in nodes
                   if n.op_type == "Constant" and len(n.attribute) == 1
                   and n.attribute[0].name == "value")
    made = {}  # (value, rank) -> its name at that rank
    out = []
    for node in nodes:
        if node.op_type not in _BROADCASTING or node.domain not in ("", "ai.onnx") \
                or len(node.input) != 2 or len({*node.input}) != 2:
            out.append(node)
            continue
        inputs = list(node.input)
        for slot in (0, 1):
            single, big = _static_shape(shapes, inputs[slot]), shapes.get(inputs[1 - slot])
            if single is None or any(d != 1 for d in single) or big is None \
                    or len(big) < 2 or len(single) >= len(big) or big[-1] != 1:
                continue
            value, rank = inputs[slot], len(big)
            if (value, rank) not in made:
                name = f"{value}.rank{rank}"
                if value in tensors:
                    tensor = onnx.TensorProto()
                    tensor.CopyFrom(tensors[value])
                    tensor.name = name
                    tensor.dims[:] = [1] * rank
                    out.append(helper.make_node("Constant", [], [name], name=name, value=tensor))
                elif all(isinstance(d, int) for d in big) \
                        and int(np.prod(big)) >= _FULL_RANK_MIN_ELEMENTS:
                    ones = name + ".shape"
                    out.append(helper.make_node("Constant", [], [ones], name=ones,
                                                value=onnx.numpy_helper.from_array(
                                                    np.ones(rank, dtype=np.int64))))
                    out.append(helper.make_node("Reshape", [value, ones], [name], name=name))
                else:
                    continue
                made[value, rank] = name
            inputs[slot] = made[value, rank]
        if inputs != list(node.input):
            node = onnx.NodeProto.FromString(node.SerializeToString())
            node.input[:] = inputs
        out.append(node)
    return out


#: The rewrites of a training step, in the order they run.
CHEAPER_NODES = (
    Pass("masks_as_products", masks_as_products),
    Pass("expands_as_broadcasts", expands_as_broadcasts),
    Pass("negations_folded", negations_folded),
    Pass("common_factors", common_factors),
    Pass("scattered_updates", scattered_updates),
    Pass("single_values_at_full_rank", single_values_at_full_rank),
    Pass("unused_nodes_removed", unused_nodes_removed),
    Pass("column_sums_as_products", column_sums_as_products),
)


#: The rewrites of a training step on a GPU provider: no CPU-tuned rewrite (a column
#: sum stays a ``ReduceSum``, whose row of ones would be shape arithmetic on the
#: host; a masking ``Where`` stays one kernel, not a ``Cast`` and a ``Mul``: a GPU
#: provider's kernel costs microseconds whatever its size), and the operators and types
#: some providers lack (WebGPU's ``Sum``, ``LogSoftmax``, ``Mod``, ``Sign``, ``IsNaN``, an
#: int64 ``Unsqueeze``) written with the ones they have (:mod:`ortlearn.graph.provider_ops`).
GPU_NODES = (
    Pass("expands_as_broadcasts", expands_as_broadcasts),
    Pass("negations_folded", negations_folded),
    Pass("common_factors", common_factors),
    Pass("unused_nodes_removed", unused_nodes_removed),
    *(Pass(rewrite.__name__, rewrite) for rewrite in PROVIDER_OPS),
)

#: Only the rewrites of the operators GPU providers lack: for a graph that any provider may
#: run (the artifacts of a web page, on WebGPU or WebAssembly).
PROVIDER_NODES = GPU_NODES[-len(PROVIDER_OPS):]


def run_passes(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], outputs,
               passes: Sequence[Pass] = CHEAPER_NODES) -> list:
    """``nodes`` rewritten by each of ``passes`` in turn.

    Parameters
    ----------
    model : onnx.ModelProto
        The model the nodes belong to (inputs, initializers, opset).
    nodes : sequence of onnx.NodeProto
    outputs : iterable of str
        Values that keep their names and shapes; the nodes that do not help
        compute them go (:func:`unused_nodes_removed`).
    passes : sequence of Pass, default=CHEAPER_NODES

    Returns
    -------
    list of onnx.NodeProto
    """
    nodes = list(nodes)
    for rewrite in passes:
        nodes = rewrite.rewrite(nodes, GraphView(model, nodes, outputs))
    return nodes


def rewrite_model(model: onnx.ModelProto, passes: Sequence[Pass] = CHEAPER_NODES
                  ) -> onnx.ModelProto:
    """``model``'s nodes rewritten by :func:`run_passes` (its outputs kept), in place.

    The outputs keep their values up to rounding (a column sum becomes a
    product with ones, ...). Returns ``model``, finalized.
    """
    graph = model.graph
    nodes = run_passes(model, list(graph.node), [o.name for o in graph.output], passes)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    return finalize_model(model)
