"""The table of gradient rules, and the operators that carry no gradient."""

from __future__ import annotations

from collections.abc import Callable

import onnx

from ..exceptions import NoGradientRuleError
from ..graph import NON_DIFFERENTIABLE_INPUTS

#: ``(domain, op_type) -> rule``. A rule is called as ``rule(ctx, node, grads)``
#: where ``ctx`` is a :class:`~ortlearn.autodiff.GradientContext`, ``node`` the
#: forward ``NodeProto`` and ``grads`` the gradient of each node output (a value
#: name, or None when that output gets no gradient). It returns one gradient
#: name (or None) per node input, in input order; a shorter list means None for
#: the remaining inputs. Gradients need only be computed for the inputs for which
#: ``ctx.needs(name)`` is true.
GRADIENT_RULES: dict[tuple[str, str], Callable] = {}

#: Operators whose outputs are piecewise constant or not numbers: their
#: outputs never carry a gradient (a zero gradient, not an error). Made of the
#: operators of :data:`ortlearn.graph.NON_DIFFERENTIABLE_INPUTS` none of whose
#: inputs carries a gradient (one table for both: which initializers are
#: weights, which values are differentiated). Add to this set to declare more.
NON_DIFFERENTIABLE_OPS: set[tuple[str, str]] = {
    ("", op) for op, inputs in NON_DIFFERENTIABLE_INPUTS.items() if inputs is None
}


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def register_gradient(*op_types: str, domain: str = ""):
    """Decorator registering a gradient rule for one or more operators.

    Parameters
    ----------
    *op_types : str
        Operator types the rule differentiates.
    domain : str, default=''
        Operator domain (``''`` is ai.onnx).

    Returns
    -------
    decorator : callable
        Registers the decorated rule in :data:`GRADIENT_RULES` and returns it
        unchanged. A later registration replaces an earlier one.

    Examples
    --------
    >>> from ortlearn.autodiff import register_gradient

    A rule for a custom operator ``Square`` (``y = x * x``) of a domain
    ``my.ops``:

    >>> @register_gradient("Square", domain="my.ops")
    ... def square_grad(ctx, node, grads):
    ...     x = node.input[0]
    ...     return [ctx.b.op("Mul", [grads[0], ctx.b.op("Add", [x, x])])]
    >>> ("my.ops", "Square") in GRADIENT_RULES
    True
    >>> _ = GRADIENT_RULES.pop(("my.ops", "Square"))  # keep this example without effect
    """
    if not op_types:
        raise ValueError("register_gradient needs at least one operator type.")

    def decorator(rule: Callable) -> Callable:
        for op_type in op_types:
            GRADIENT_RULES[_domain(domain), op_type] = rule
        return rule

    return decorator


def is_non_differentiable(node: onnx.NodeProto) -> bool:
    """Whether ``node`` belongs to :data:`NON_DIFFERENTIABLE_OPS`."""
    return (_domain(node.domain), node.op_type) in NON_DIFFERENTIABLE_OPS


def get_rule(node: onnx.NodeProto) -> Callable:
    """The rule for ``node``; :class:`NoGradientRuleError` when there is none."""
    rule = GRADIENT_RULES.get((_domain(node.domain), node.op_type))
    if rule is None:
        op = f"{node.domain}.{node.op_type}" if _domain(node.domain) else node.op_type
        raise NoGradientRuleError(
            f"No gradient rule for operator {op!r} (node {node.name!r}), which a "
            "differentiable value reaches. Register one with "
            "ortlearn.autodiff.register_gradient, or leave the weights it depends on "
            "out of wrt."
        )
    return rule
