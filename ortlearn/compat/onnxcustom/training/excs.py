"""onnxcustom's exception classes (``onnxcustom.training.excs``).

Each is also the native ortlearn class of the same meaning where one
exists, so that a migrated script's ``except`` clauses and ortlearn's own
catch the same errors:

- :class:`ConvergenceError` is a ``RuntimeError`` (as in onnxcustom) and
  :class:`ortlearn.exceptions.ConvergenceError`;
- :class:`ConvergenceWarning` is a ``UserWarning`` (as in onnxcustom) and
  :class:`ortlearn.exceptions.ConvergenceWarning` (scikit-learn's);
- :class:`EvaluationError` and :class:`ProviderError` are ``RuntimeError``
  as in onnxcustom (ortlearn has no native counterpart).

Examples
--------
>>> from ortlearn.exceptions import ConvergenceError as NativeError
>>> from ortlearn.compat.onnxcustom.training.excs import ConvergenceError
>>> issubclass(ConvergenceError, NativeError), issubclass(ConvergenceError, RuntimeError)
(True, True)
"""

from ....exceptions import ConvergenceError as _NativeConvergenceError
from ....exceptions import ConvergenceWarning as _NativeConvergenceWarning

__all__ = ["ConvergenceError", "ConvergenceWarning", "EvaluationError", "ProviderError"]


class ConvergenceError(_NativeConvergenceError):
    """A learning algorithm failed to converge (a loss became NaN or infinite)."""


class ConvergenceWarning(_NativeConvergenceWarning):
    """A learning algorithm failed to converge (warned, not raised)."""


class EvaluationError(RuntimeError):
    """An evaluation failed (the validation loss is NaN or infinite)."""


class ProviderError(RuntimeError):
    """An input is not on the expected device (CPU, GPU)."""
