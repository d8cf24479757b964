"""onnxcustom's ``onnxcustom.training`` package: its trainers, learning rates, losses, penalties."""

# onnxcustom.training's own shortcuts: its exception classes.
from .excs import ConvergenceError, ConvergenceWarning, EvaluationError, ProviderError

__all__ = ["ConvergenceError", "ConvergenceWarning", "EvaluationError", "ProviderError"]
