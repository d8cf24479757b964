"""The reverse pass: walk the forward graph backwards, one rule per node."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..exceptions import NoGradientRuleError
from ..graph import (
    GraphBuilder,
    attr,
    constant_values,
    elem_type_of,
    finalize_model,
    get_train_initializer,
    graph_names,
    invalid_model_errors,
    load_model,
    node_reads,
    onnx_to_np_dtype,
    prepare_for_gradient,
    refine_shapes,
    shape_of,
    value_info_map,
)
from ._context import GradientContext
from ._registry import get_rule, is_non_differentiable

_DIFF_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _is_float_output(node: onnx.NodeProto, name: str, infos: dict) -> bool:
    info = infos.get(name)
    elem = elem_type_of(info) if info is not None else 0
    if not elem and node.op_type == "Cast":
        elem = attr(node, "to")
    return not elem or elem in _DIFF_TYPES


def differentiable_values(graph: onnx.GraphProto, wrt: Sequence[str], infos: dict) -> set[str]:
    """Values that depend on ``wrt`` through differentiable float paths."""
    diff = set(wrt)
    for node in graph.node:
        if is_non_differentiable(node) or not (node_reads(node) & diff):
            continue
        diff.update(o for o in node.output if o and _is_float_output(node, o, infos))
    return diff


def _rule(node: onnx.NodeProto):
    """The rule of ``node``; for control flow, an error that says what ortlearn cannot do."""
    try:
        return get_rule(node)
    except NoGradientRuleError:
        if node.op_type not in ("If", "Loop", "Scan") or node.domain not in ("", "ai.onnx"):
            raise
        what = ("whose condition is only known when the graph runs"
                if node.op_type == "If" else "(a loop)")
        raise NoGradientRuleError(
            f"Cannot differentiate through the {node.op_type} node {node.name!r} "
            f"{what}: a differentiable value reaches it. Differentiating through "
            "data-dependent control flow is out of ortlearn's scope; only If nodes whose "
            "condition is a constant (or computed from constants and static shapes) are "
            "folded before differentiation. Export the model with that branch fixed "
            "(static shapes, no data-dependent Python `if`), or leave the weights it "
            "depends on out of wrt.") from None


def _check_names(graph: onnx.GraphProto, loss_output: str, wrt: Sequence[str], infos: dict):
    produced = {o for node in graph.node for o in node.output}
    sources = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    if loss_output not in produced | sources:
        raise ValueError(f"The graph has no value named {loss_output!r} (loss_output).")
    check_wrt(graph, wrt, infos)
    check_scalar_loss(graph, loss_output, infos)


def check_scalar_loss(graph: onnx.GraphProto, loss_output: str, infos: dict) -> None:
    """Raise a ValueError if the loss ``loss_output`` holds, or may hold, several elements.

    Seeding the reverse pass with ones would train the sum of the elements (a
    per-row loss summed over the batch) without a word. A known dimension above 1
    is refused, and so is a symbolic dimension shared with an input of ``graph``
    (the batch dimension ``N`` of ``X``): its size follows the data. Other symbolic
    dimensions, left by shape inference when it cannot tell, pass.

    Parameters
    ----------
    graph : onnx.GraphProto
        The graph holding the loss.
    loss_output : str
        Name of the loss.
    infos : dict of str to onnx.ValueInfoProto
        Types and shapes of the graph's values (:func:`ortlearn.graph.value_info_map`).
    """
    shape = shape_of(infos[loss_output]) if loss_output in infos else None
    if not shape:
        return
    input_dims = {d for i in graph.input for d in (shape_of(i) or []) if isinstance(d, str)}
    if any((isinstance(d, int) and d != 1) or (isinstance(d, str) and d in input_dims)
           for d in shape):
        raise ValueError(
            f"The loss {loss_output!r} must be a scalar or hold one element; its shape is "
            f"{shape}. Reduce it to a scalar first (e.g. a ReduceMean node, or "
            "ortlearn.add_loss_output), or name a scalar output as the loss.")


#: Name of the node that stops a run whose loss holds more than one element.
LOSS_ELEMENT_CHECK = "loss_must_hold_one_element"


def _loss_seed(ctx, loss: str) -> str:
    """The gradient 1 of a loss, of its shape.

    A shape shape inference left unknown ([?, 1] for a per-row output) may
    hold one element or one per row: the seed is then a single 1 reshaped to
    the loss's shape at run time (the node :data:`LOSS_ELEMENT_CHECK`), which
    stops the run when there are more elements, instead of training their sum
    silently.
    """
    shape = ctx.shape(loss)
    if shape is not None and all(isinstance(d, int) for d in shape):
        return ctx.fill_like(loss, 1)  # check_scalar_loss refused more than one element
    b = ctx.b
    one = b.const(np.ones(1, onnx_to_np_dtype(ctx.dtype(loss))), hint="one")
    seed = b.op("Reshape", [one, ctx.shape_of(loss)])
    b.nodes[-1].name = b.unique_name(LOSS_ELEMENT_CHECK)
    return seed


def check_wrt(graph: onnx.GraphProto, wrt: Sequence[str], infos: dict) -> None:
    """Raise unless ``wrt`` names distinct float inputs or initializers of ``graph``."""
    sources = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for name in wrt:
        if name not in sources:
            raise ValueError(
                f"{name!r} in wrt is neither an initializer nor an input of the graph.")
        elem = elem_type_of(infos[name]) if name in infos else 0
        if elem not in _DIFF_TYPES:
            kind = TensorProto.DataType.Name(elem) if elem else "unknown"
            raise TypeError(f"Cannot differentiate w.r.t. {name!r}: its type is {kind}, "
                            "not a float type.")
    if len(set(wrt)) != len(wrt):
        raise ValueError(f"wrt holds duplicate names: {list(wrt)}.")


def append_backward(model: onnx.ModelProto, loss_output: str, wrt: Sequence[str],
                    builder: GraphBuilder | None = None) -> dict[str, str]:
    """Append the backward pass of ``loss_output`` to ``model.graph``, in place.

    This is the core of :func:`build_gradient`, for code that fuses the
    forward pass, the gradients and more (an optimizer update) in one graph.

    Parameters
    ----------
    model : onnx.ModelProto
        Forward model, modified in place: its local functions are inlined
        and its Ifs with a constant condition folded
        (:func:`~ortlearn.graph.prepare.prepare_for_gradient`), then the backward
        nodes are appended to its graph (its inputs, outputs and
        initializers are left unchanged; a training-mode Dropout without
        mask output gets one).
    loss_output : str
        Name of the scalar (or one-element) float value to differentiate.
    wrt : sequence of str
        Float initializers or graph inputs to differentiate with respect to.
    builder : GraphBuilder, optional
        Builder used for the new names and nodes (default: a builder for
        ``model`` with prefix ``'grad_'``). Its pending nodes are added to the
        graph along with the backward nodes.

    Returns
    -------
    grads : dict of str to str
        ``{weight name: name of its gradient value}``, in ``wrt`` order. A
        weight the loss does not depend on gets a tensor of zeros of its shape.

    Raises
    ------
    NoGradientRuleError
        When a value depending on ``wrt`` reaches an operator without a rule,
        or an If whose condition is not known before running.
    ValueError, TypeError
        For an unknown loss or weight name, a non-float weight, a loss with
        more than one element.

    Examples
    --------
    >>> from onnx import helper, TensorProto, numpy_helper
    >>> import numpy as np
    >>> graph = helper.make_graph(
    ...     [helper.make_node("Mul", ["X", "W"], ["Y"]),
    ...      helper.make_node("ReduceSum", ["Y"], ["loss"], keepdims=0)],
    ...     "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])],
    ...     [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    ...     [numpy_helper.from_array(np.ones(3, np.float32), "W")])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    >>> grads = append_backward(model, "loss", ["W"])
    >>> list(grads)
    ['W']
    """
    wrt = list(wrt)
    before = graph_names(model.graph) if builder is not None else None
    if prepare_for_gradient(model, wrt) and builder is not None:
        # The builder was made for the graph before inlining: claim the new names.
        for name in graph_names(model.graph) - before:
            builder.reserve(name)
    if builder is None:
        builder = GraphBuilder.for_model(model, prefix="grad_")
    return _append_backward(model, loss_output, wrt, builder, value_info_map(model))


def _append_backward(model, loss_output, wrt, builder, infos):
    _check_names(model.graph, loss_output, wrt, infos)
    return reverse_pass(model, {loss_output: None}, wrt, builder, infos)


def reverse_pass(model: onnx.ModelProto, seeds: dict, wrt: Sequence[str],
                 builder: GraphBuilder, infos: dict) -> dict[str, str]:
    """Append the nodes propagating ``seeds`` back to ``wrt``; ``{weight: gradient}``.

    ``seeds`` maps values of the graph to their incoming gradient (the name
    of a value of the same shape, or None for a one-element value seeded
    with 1: a loss). A seed on a value that does not depend on ``wrt`` is
    ignored. The graph must be prepared (:func:`prepare_for_gradient`).
    """
    graph = model.graph
    differentiable = differentiable_values(graph, wrt, infos)
    constants = constant_values(graph, wrt)
    ctx = GradientContext(builder, infos, constants, differentiable,
                          refine_shapes(graph, infos, constants))

    pending: dict[str, list[str]] = {}
    for value, seed in seeds.items():
        if value in differentiable:
            pending.setdefault(value, []).append(
                _loss_seed(ctx, value) if seed is None else seed)
    for node in reversed(graph.node):
        if not any(o in pending for o in node.output):
            continue
        out_grads = [ctx.accumulate(pending.pop(o)) if o in pending else None
                     for o in node.output]
        in_grads = _rule(node)(ctx, node, out_grads)
        for name, grad in zip(node.input, in_grads):
            if grad is not None and ctx.needs(name):
                pending.setdefault(name, []).append(grad)

    grads = {}
    for name in wrt:
        # A weight the loss does not depend on has a zero gradient.
        grads[name] = ctx.accumulate(pending[name]) if name in pending else ctx.zeros_like(name)
    builder.add_to_graph(graph)
    return grads


def build_gradient(model, wrt: Sequence[str] | None = None,
                   loss_output: str = "loss") -> onnx.ModelProto:
    """Model computing a loss and its gradients w.r.t. weights, in standard ONNX.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or path
        Forward model holding a scalar (or one-element) float value
        ``loss_output``; the opset of its ai.onnx domain must be 13 or more.
    wrt : list of str, optional
        Float initializers or graph inputs to differentiate with respect to.
        Default: ``ortlearn.get_train_initializer(model)``.
    loss_output : str, default='loss'
        Name of the loss value.

    Returns
    -------
    onnx.ModelProto
        The forward graph plus the backward nodes, with the same inputs and
        initializers; its outputs are ``loss_output`` then ``<name>_grad``
        for each name in ``wrt``, in that order, each with the type and shape
        of its weight. Only values that depend on ``wrt`` get backward nodes.
        A weight the loss does not depend on gets a gradient of zeros.

    Raises
    ------
    NoGradientRuleError
        When a value depending on ``wrt`` reaches an operator without a
        gradient rule; the message names the operator type and the node.
    ValueError, TypeError
        For an unknown loss or weight name, a non-float weight, a loss with
        more than one element, a ``<name>_grad`` name already in the graph,
        an empty ``wrt`` (or no float initializer to default to), a string
        given as ``wrt``.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import helper, TensorProto, numpy_helper
    >>> from ortlearn.autodiff import build_gradient
    >>> graph = helper.make_graph(
    ...     [helper.make_node("MatMul", ["X", "W"], ["Y"]),
    ...      helper.make_node("ReduceSumSquare", ["Y"], ["loss"], keepdims=0)],
    ...     "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])],
    ...     [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    ...     [numpy_helper.from_array(np.ones((2, 1), np.float32), "W")])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    >>> grad_model = build_gradient(model, wrt=["W"])
    >>> [o.name for o in grad_model.graph.output]
    ['loss', 'W_grad']
    """
    with invalid_model_errors(model):
        return _build_gradient(model, wrt, loss_output)


def _build_gradient(model, wrt, loss_output: str) -> onnx.ModelProto:
    model = load_model(model)
    if isinstance(wrt, str):
        raise TypeError(f"wrt must be a list of names, got the string {wrt!r}.")
    wrt = get_train_initializer(model) if wrt is None else list(wrt)
    if not wrt:
        raise ValueError("Nothing to differentiate: wrt is empty and the model has no "
                         "trainable (float) initializer.")
    prepare_for_gradient(model, wrt)
    builder = GraphBuilder.for_model(model, prefix="grad_")
    infos = value_info_map(model)
    grad_names = [builder.reserve(f"{name}_grad") for name in wrt]
    grads = _append_backward(model, loss_output, wrt, builder, infos)

    outputs = [infos.get(loss_output) or helper.make_empty_tensor_value_info(loss_output)]
    for name, out in zip(wrt, grad_names):
        builder.op("Identity", [grads[name]], outputs=[out])
        info = infos[name]
        outputs.append(helper.make_tensor_value_info(out, elem_type_of(info), shape_of(info)))
    builder.add_to_graph(model.graph)
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    return finalize_model(model)
