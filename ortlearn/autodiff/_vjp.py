"""A model split into a forward graph and a backward graph (vector-Jacobian product).

This is what a framework's autograd needs from ONNX: the forward graph runs
when the module is called and also returns the intermediate values the
backward needs (the *saved* values); the backward graph runs later, reading
the gradients of the outputs (the *cotangents*), the saved values and the
inputs it needs, and returns the gradients w.r.t. the chosen inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx
from onnx import helper

from ..graph import (
    GraphBuilder,
    finalize_model,
    invalid_model_errors,
    load_model,
    needed_nodes,
    node_reads,
    prepare_for_gradient,
    value_info_map,
)
from ._backward import check_wrt, differentiable_values, reverse_pass


@dataclass(frozen=True)
class ForwardBackward:
    """The two graphs of :func:`build_forward_backward` and how they connect.

    Attributes
    ----------
    forward : onnx.ModelProto
        The model's inputs and initializers; its outputs are the model's
        outputs, then :attr:`saved`.
    backward : onnx.ModelProto
        Inputs: the cotangents (in :attr:`cotangents` order), the saved
        values (in :attr:`saved` order), then the forward inputs it reads
        (:attr:`reused_inputs`); outputs: one gradient per ``wrt`` name, in
        ``wrt`` order (:attr:`gradients`).
    outputs : list of str
        The model's outputs, first outputs of :attr:`forward`.
    saved : list of str
        Values the forward computes and the backward reads.
    cotangents : dict of str to str
        ``{output: backward input}`` for each output whose gradient flows
        back to ``wrt``; the other outputs need no cotangent.
    reused_inputs : list of str
        Inputs of the forward graph (weights, data) the backward reads too:
        fed again rather than saved.
    gradients : dict of str to str
        ``{wrt name: backward output}``.
    """

    forward: onnx.ModelProto
    backward: onnx.ModelProto
    outputs: list = field(default_factory=list)
    saved: list = field(default_factory=list)
    cotangents: dict = field(default_factory=dict)
    reused_inputs: list = field(default_factory=list)
    gradients: dict = field(default_factory=dict)


def build_forward_backward(model, wrt: Sequence[str],
                           differentiable_outputs: Sequence[str] | None = None
                           ) -> ForwardBackward:
    """Split the gradient computation of ``model`` into a forward and a backward graph.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or path
        The forward model (not modified).
    wrt : sequence of str
        Float inputs or initializers to differentiate with respect to.
    differentiable_outputs : sequence of str, optional
        The outputs that receive a cotangent (default: every output that
        depends on ``wrt`` through float values). Other outputs (integer
        outputs, updated statistics) are returned by the forward only.

    Returns
    -------
    ForwardBackward

    Raises
    ------
    NoGradientRuleError
        When a value between ``wrt`` and the outputs reaches an operator
        without a gradient rule; the message names the operator and the node.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import helper, TensorProto
    >>> graph = helper.make_graph(
    ...     [helper.make_node("MatMul", ["X", "W"], ["Y"]),
    ...      helper.make_node("Tanh", ["Y"], ["Z"])],
    ...     "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2]),
    ...           helper.make_tensor_value_info("W", TensorProto.FLOAT, [2, 3])],
    ...     [helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["N", 3])])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    >>> fb = build_forward_backward(model, ["W"])
    >>> fb.saved, fb.cotangents, fb.reused_inputs
    (['Z'], {'Z': 'grad_Z'}, ['X'])
    """
    with invalid_model_errors(model):
        return _build(load_model(model), list(wrt), differentiable_outputs)


def _build(model: onnx.ModelProto, wrt: list, differentiable_outputs) -> ForwardBackward:
    prepare_for_gradient(model, wrt)
    graph = model.graph
    infos = value_info_map(model)
    check_wrt(graph, wrt, infos)
    outputs = [o.name for o in graph.output]
    wanted = outputs if differentiable_outputs is None else list(differentiable_outputs)
    unknown = sorted(set(wanted) - set(outputs))
    if unknown:
        raise ValueError(f"differentiable_outputs {unknown} are not outputs of the model; "
                         f"its outputs are {outputs}.")
    n_forward = len(graph.node)
    builder = GraphBuilder.for_model(model, prefix="grad_")
    differentiable = differentiable_values(graph, wrt, infos)
    cotangents = {name: builder.unique_name(name)
                  for name in dict.fromkeys(wanted) if name in differentiable}
    grads = reverse_pass(model, dict(cotangents), wrt, builder, infos)

    nodes = list(graph.node)
    forward_nodes, backward_nodes = nodes[:n_forward], nodes[n_forward:]
    produced = {o for node in backward_nodes for o in node.output}
    gradients = {}
    for name, grad in grads.items():
        if grad not in produced or grad in gradients.values():
            # A gradient that is a cotangent, a forward value or another gradient:
            # the backward graph's outputs must be values it computes, once each.
            out = builder.unique_name(name)
            backward_nodes.append(helper.make_node("Identity", [grad], [out]))
            grad = out
        gradients[name] = grad
    backward_nodes = needed_nodes(backward_nodes, list(gradients.values()))
    return _split(model, forward_nodes, backward_nodes, outputs, cotangents, gradients)


def _split(model, forward_nodes, backward_nodes, outputs, cotangents, gradients):
    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    initializers = {i.name: i for i in graph.initializer}
    made_by_forward = {o: node for node in forward_nodes for o in node.output if o}
    made_by_backward = {o for node in backward_nodes for o in node.output}
    read = {name for node in backward_nodes for name in node_reads(node)} - made_by_backward
    # A constant the backward reads is recomputed there rather than saved.
    copied = {id(made_by_forward[n]): made_by_forward[n] for n in sorted(read)
              if n in made_by_forward and not made_by_forward[n].input}
    backward_nodes = [*copied.values(), *backward_nodes]
    saved = [n for n in _in_order(read, forward_nodes) if id(made_by_forward[n]) not in copied]
    forward_outputs = list(dict.fromkeys([*outputs, *saved]))

    forward_nodes = needed_nodes(forward_nodes, forward_outputs)
    forward = _model_like(model, forward_nodes, list(graph.input), forward_outputs,
                          list(graph.initializer), infos=None)
    infos = value_info_map(forward)
    used_cotangents = {out: cot for out, cot in cotangents.items() if cot in read}
    reused = [name for name in inputs if name in read]
    backward_inputs = [
        *(_typed_like(infos[out], cot) for out, cot in used_cotangents.items()),
        *(_typed_like(infos[name], name) for name in saved),
        *(inputs[name] for name in reused),
    ]
    backward = _model_like(
        model, backward_nodes, backward_inputs, list(gradients.values()),
        [initializers[n] for n in initializers if n in read],
        infos={g: _typed_like(infos[w], g) for w, g in gradients.items()})
    return ForwardBackward(forward, backward, outputs, saved, used_cotangents, reused, gradients)


def _in_order(names: set, nodes) -> list:
    """``names`` in the order the nodes produce them."""
    return [o for node in nodes for o in node.output if o in names]


def _typed_like(info: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    out = onnx.ValueInfoProto()
    out.CopyFrom(info)
    out.name = name
    return out


def _model_like(model, nodes, inputs, outputs, initializers, infos) -> onnx.ModelProto:
    """A model with ``model``'s opsets and functions; ``outputs`` typed from ``infos``
    (or by shape inference on the new model when None)."""
    typed = infos or {}
    declared = [typed.get(name) or helper.make_empty_tensor_value_info(name) for name in outputs]
    graph = helper.make_graph(nodes, model.graph.name, inputs, declared, initializers)
    new = helper.make_model(graph, opset_imports=list(model.opset_import),
                            producer_name="ortlearn", ir_version=model.ir_version)
    new.functions.extend(model.functions)
    if infos is None:
        found = value_info_map(new)
        del new.graph.output[:]
        new.graph.output.extend(_typed_like(found[name], name) if name in found
                                else helper.make_empty_tensor_value_info(name)
                                for name in outputs)
    # onnx's checker wants a shape on every graph input and output, and shape inference
    # leaves the rank of some values unknown (onnxruntime runs them all the same).
    ranked = all(v.type.tensor_type.HasField("shape")
                 for v in [*new.graph.input, *new.graph.output])
    return finalize_model(new, check=ranked)
