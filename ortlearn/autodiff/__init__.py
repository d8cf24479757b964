"""Reverse-mode differentiation of ONNX graphs, in standard ONNX operators.

:func:`build_gradient` turns a model holding a scalar loss into a model
returning the loss and its gradients w.r.t. chosen weights.
:func:`append_backward` is its core, for code that adds more nodes (an
optimizer update) to the same graph. Each operator has one rule in
:data:`GRADIENT_RULES`; :func:`register_gradient` adds rules.

Operators in :data:`NON_DIFFERENTIABLE_OPS`, and every node whose outputs are
integer or boolean, carry no gradient (it is zero, not an error); a value that
depends on the weights and reaches any other operator without a rule raises
:class:`~ortlearn.exceptions.NoGradientRuleError`.

:func:`build_forward_backward` splits the same computation into a forward
graph that also returns what the backward needs and a backward graph from the
outputs' gradients (what ``ortlearn.torch.ORTModule`` runs).

:func:`mark_padding_idx` marks an embedding's padding row (torch's
``padding_idx``) where the exporter did not record it.
"""

from . import (  # noqa: F401  (registers the rules)
    _rules_activations,
    _rules_conv,
    _rules_elementwise,
    _rules_linalg,
    _rules_losses,
    _rules_norm,
    _rules_pool,
    _rules_recurrent,
    _rules_reduce,
    _rules_shape,
)
from ._backward import LOSS_ELEMENT_CHECK, append_backward, build_gradient, check_scalar_loss
from ._context import GradientContext
from ._marks import mark_padding_idx
from ._registry import GRADIENT_RULES, NON_DIFFERENTIABLE_OPS, register_gradient
from ._vjp import ForwardBackward, build_forward_backward

__all__ = [
    "ForwardBackward",
    "GRADIENT_RULES",
    "LOSS_ELEMENT_CHECK",
    "NON_DIFFERENTIABLE_OPS",
    "GradientContext",
    "append_backward",
    "build_forward_backward",
    "build_gradient",
    "check_scalar_loss",
    "mark_padding_idx",
    "register_gradient",
]
