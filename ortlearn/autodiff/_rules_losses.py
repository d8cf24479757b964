"""Gradients of SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..exceptions import NoGradientRuleError
from ..graph import attr, optional_input
from ._registry import register_gradient


def _per_element_grad(ctx, node, scores, labels, weights, g):
    """Gradient of the loss w.r.t. each element's ``-log p[label]`` term.

    Shape of ``labels``: ``g`` spread over the elements, times the class
    weight of each label, zero for ``ignore_index``, divided by the total
    weight when ``reduction='mean'``.
    """
    b = ctx.b
    reduction = attr(node, "reduction", "mean")
    ignore = attr(node, "ignore_index")
    if ctx.dtype(labels) != TensorProto.INT64:
        labels = b.cast(labels, TensorProto.INT64)
    safe_labels, coef = labels, None
    if ignore is not None:
        ignored = b.op("Equal", [labels, b.const(np.array(ignore, dtype=np.int64))])
        safe_labels = b.op("Where", [ignored, b.const(np.int64(0)), labels])
        coef = b.cast(b.op("Not", [ignored]), ctx.dtype(scores))
    if weights is not None:
        w = b.op("Gather", [weights, safe_labels])
        coef = w if coef is None else b.op("Mul", [coef, w])
    if coef is None:
        coef = ctx.fill_like(labels, 1, dtype_of=scores)
    if reduction == "mean":
        g = b.op("Div", [g, b.reduce("ReduceSum", coef, None, keepdims=0)])
    return b.op("Mul", [coef, g]), safe_labels


def _one_hot(ctx, node, scores, labels):
    """``labels`` one-hot along axis 1 of ``scores``, in the scores' type."""
    b = ctx.b
    rank = ctx.rank(scores, node)
    n_classes = b.op("Gather", [ctx.shape_of(scores), b.const(np.int64(1))])
    classes = b.op("Range", [b.const(np.int64(0)), n_classes, b.const(np.int64(1))])
    classes = b.unsqueeze(classes, list(range(1, rank - 1))) if rank > 2 else classes
    hits = b.op("Equal", [b.unsqueeze(labels, [1]), classes])
    return b.cast(hits, ctx.dtype(scores))


def _check_weights(ctx, node, weights):
    if ctx.needs(weights):
        raise NoGradientRuleError(
            f"No gradient rule for the class weights of {node.op_type} node {node.name!r}; "
            "leave them out of wrt.")


@register_gradient("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(ctx, node, grads):
    scores, labels = node.input[:2]
    weights = optional_input(node, 2)
    _check_weights(ctx, node, weights)
    b = ctx.b
    log_prob = node.output[1] if len(node.output) > 1 and node.output[1] else None
    prob = (b.op("Exp", [log_prob]) if log_prob is not None
            else b.op("Softmax", [scores], axis=1))
    total = None
    if grads[0] is not None:
        per, safe = _per_element_grad(ctx, node, scores, labels, weights, grads[0])
        total = b.op("Mul", [b.op("Sub", [prob, _one_hot(ctx, node, scores, safe)]),
                             b.unsqueeze(per, [1])])
    if len(grads) > 1 and grads[1] is not None:
        g = grads[1]
        from_log_prob = b.op("Sub", [g, b.op("Mul", [prob, b.reduce("ReduceSum", g, [1])])])
        total = from_log_prob if total is None else b.op("Add", [total, from_log_prob])
    return [total]


@register_gradient("NegativeLogLikelihoodLoss")
def _negative_log_likelihood(ctx, node, grads):
    log_prob, labels = node.input[:2]
    weights = optional_input(node, 2)
    _check_weights(ctx, node, weights)
    per, safe = _per_element_grad(ctx, node, log_prob, labels, weights, grads[0])
    picked = ctx.b.op("Mul", [_one_hot(ctx, node, log_prob, safe), ctx.b.unsqueeze(per, [1])])
    return [ctx.b.op("Neg", [picked])]
