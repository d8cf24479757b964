"""Exceptions and warnings raised by ortlearn."""

from sklearn.exceptions import ConvergenceWarning

__all__ = ["ConvergenceError", "ConvergenceWarning", "NominalCheckpointError",
           "NoGradientRuleError", "TrainingApiError", "TrainingApiTypeError",
           "TrainingApiValueError", "as_training_api_error"]


class ConvergenceError(RuntimeError):
    """Training diverged (the loss or the weights stopped being finite).

    The estimator keeps the last finite weights and stays usable.
    """


class NoGradientRuleError(ValueError):
    """A differentiable value reaches an operator ortlearn cannot differentiate."""


class TrainingApiError(RuntimeError):
    """A call of the ``onnxruntime.training`` API that onnxruntime-training refuses too.

    onnxruntime-training raises ``RuntimeError`` for every failure its C++
    core reports (a wrong input, a damaged checkpoint, a missing file, ...).
    ortlearn raises the classes below, which are ``RuntimeError`` *and* the
    class that names the problem (``ValueError``, ``TypeError``, an
    ``OSError``): a migrated script's ``except RuntimeError`` still catches
    them, and so does ``except ValueError``.
    """


class TrainingApiValueError(TrainingApiError, ValueError):
    """A wrong value: input count or shape, buffer size, unknown output name, mismatch."""


class TrainingApiTypeError(TrainingApiError, TypeError):
    """A value of the wrong element type (a float64 input for a float32 model input)."""


class NominalCheckpointError(TrainingApiValueError):
    """The checkpoint is nominal: it has names and shapes but no values yet.

    Raised by what needs the values (training, eval and optimizer steps,
    reading a parameter, ``get_contiguous_parameters``, exporting) until they
    are loaded: ``Module.copy_buffer_to_parameters(buffer, trainable_only=False)``
    or a complete checkpoint.
    """


_COMBINED: dict = {ValueError: TrainingApiValueError, TypeError: TrainingApiTypeError}


def _combined_class(cls: type) -> type:
    """``cls`` made a :class:`TrainingApiError` too (one class per ``cls``)."""
    combined = _COMBINED.get(cls)
    if combined is None:
        combined = type(cls.__name__, (cls, TrainingApiError), {
            "__module__": __name__,
            "__doc__": f"{cls.__name__}, also a RuntimeError as onnxruntime-training raises."})
        _COMBINED[cls] = combined
    return combined


def as_training_api_error(exc: Exception) -> Exception:
    """``exc`` as a :class:`TrainingApiError` of the same class, with the same message.

    Parameters
    ----------
    exc : Exception
        A ``ValueError``, ``TypeError`` or ``OSError`` (or a subclass);
        anything else, or an exception that already is a
        ``TrainingApiError``, is returned as is.

    Returns
    -------
    Exception
        An instance of ``type(exc)`` (or of its ``TrainingApi`` twin) that is
        also a ``RuntimeError``, carrying ``exc``'s traceback.

    Examples
    --------
    >>> err = as_training_api_error(FileNotFoundError(2, "No such file", "ckpt"))
    >>> isinstance(err, FileNotFoundError), isinstance(err, RuntimeError), str(err)
    (True, True, "[Errno 2] No such file: 'ckpt'")
    """
    if isinstance(exc, TrainingApiError) or not isinstance(exc, (ValueError, TypeError, OSError)):
        return exc
    cls = _combined_class(type(exc))
    try:
        if isinstance(exc, OSError) and exc.errno is not None:
            args = (exc.errno, exc.strerror) + (() if exc.filename is None else (exc.filename,))
            new = cls(*args)
        else:
            new = cls(*exc.args)
    except Exception:  # a subclass whose constructor wants other arguments
        return exc
    return new.with_traceback(exc.__traceback__)
