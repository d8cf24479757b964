"""Exceptions and warnings raised by ortlearn."""

from sklearn.exceptions import ConvergenceWarning

__all__ = ["ConvergenceError", "ConvergenceWarning", "NoGradientRuleError"]


class ConvergenceError(RuntimeError):
    """Training diverged (the loss or the weights stopped being finite).

    The estimator keeps the last finite weights and stays usable.
    """


class NoGradientRuleError(ValueError):
    """A differentiable value reaches an operator ortlearn cannot differentiate."""
