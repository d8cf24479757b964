"""Checks of the data the estimators are given, shared by every estimator.

One place decides what bad data is and how it is reported, so that
:class:`~ortlearn.estimators.OrtGradientOptimizer` and the estimators built
on :class:`~ortlearn.estimators._base.BaseOrtEstimator` reject the same
sample weights with the same messages:

- :func:`as_real`: an array of a given real dtype; ``TypeError`` for complex
  or non-numeric data.
- :func:`check_finite`: ``ValueError`` for NaN or infinity.
- :func:`check_in_range`: ``ValueError`` for finite values a narrower float
  dtype cannot hold (float64 data beyond float32's range would become
  infinity and predict or train NaN).
- :func:`check_sample_weight`: the sample weights of ``n_samples`` rows
  (1-D, finite, non-negative, not all zero); a scalar weights every row.
- :func:`with_defaults`: the state of an estimator pickled before some of its
  parameters existed, completed with their defaults.

X and y of the scikit-learn-native estimators go through scikit-learn's
``validate_data`` (feature names, ``n_features_in_``); those of
``OrtGradientOptimizer`` are checked against the graph's declared inputs
with :func:`as_real` and :func:`check_finite`.
"""

from __future__ import annotations

import inspect
import numbers

import numpy as np

__all__ = ["as_real", "check_finite", "check_in_range", "check_sample_weight", "with_defaults"]


def check_finite(name: str, array: np.ndarray) -> None:
    """Raise ``ValueError('<name> contains NaN or infinity.')`` for a non-finite float array."""
    if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or infinity.")


def check_in_range(name: str, array: np.ndarray, dtype) -> None:
    """Raise ``ValueError`` when finite values of ``array`` overflow the float ``dtype``.

    Casting float64 data above ``numpy.finfo(dtype).max`` to float32 gives
    infinity without a word; the message names the columns (or positions of
    a 1-D array) and the range instead. NaN and infinity already in the data
    are left to :func:`check_finite`.
    """
    dtype = np.dtype(dtype)
    if not (np.issubdtype(array.dtype, np.floating) and np.issubdtype(dtype, np.floating)):
        return
    limit = np.finfo(dtype).max
    if np.finfo(array.dtype).max <= limit:
        return
    magnitude = np.abs(array)
    too_large = np.isfinite(magnitude) & (magnitude > limit)
    if not too_large.any():
        return
    if array.ndim == 2:
        where = f"column(s) {np.flatnonzero(too_large.any(axis=0)).tolist()[:10]}"
    else:
        where = f"position(s) {np.flatnonzero(too_large.ravel()).tolist()[:10]}"
    largest = float(magnitude[too_large].max())
    raise ValueError(
        f"{name} has values beyond the range of {dtype} (|x| <= {limit:.4g}) in {where}, "
        f"largest |x| = {largest:.4g}: the model computes in {dtype} and they would become "
        f"infinity. Scale the data, or use a model of a wider dtype (e.g. fit on float64).")


def as_real(name: str, value, dtype) -> np.ndarray:
    """``value`` as an array of ``dtype`` (no copy when it already is one).

    Raises
    ------
    TypeError
        Complex or non-numeric data (the message names ``name``).
    ValueError
        Finite values beyond the range of ``dtype`` (:func:`check_in_range`), or
        fractional values for an integer ``dtype`` (class indices: a cast would
        truncate 0.9 to 0 and train on other labels than the user's).
    """
    array = np.asarray(value)
    if np.iscomplexobj(array):
        raise TypeError(f"{name} has the complex dtype {array.dtype}: only real numbers can "
                        "be fed to the graph.")
    check_in_range(name, array, dtype)
    if np.issubdtype(np.dtype(dtype), np.integer) and array.dtype.kind == "f":
        finite = array[np.isfinite(array)]
        fractional = finite[finite != np.round(finite)]
        if fractional.size:
            raise ValueError(
                f"{name} holds values that are not integers ({float(fractional.ravel()[0])!r})"
                f" but the graph reads it as {np.dtype(dtype)} (class indices, for a "
                "cross-entropy loss): pass the class indices 0, 1, ..., not probabilities "
                "or scores.")
    try:
        return array.astype(dtype, copy=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} of dtype {array.dtype} cannot be converted to "
                        f"{np.dtype(dtype)}: {exc}") from exc


def check_sample_weight(sample_weight, n_samples: int, dtype) -> np.ndarray | None:
    """Sample weights as a 1-D array of ``dtype`` and ``n_samples`` rows; None stays None.

    A scalar (as scikit-learn takes it) weights every row the same.

    Raises
    ------
    TypeError
        Complex or non-numeric weights.
    ValueError
        Wrong shape, NaN or infinity, negative values, or all weights zero.
    """
    if sample_weight is None:
        return None
    if isinstance(sample_weight, numbers.Number):
        sample_weight = np.full(n_samples, sample_weight)
    sample_weight = as_real("sample_weight", sample_weight, dtype)
    if sample_weight.shape != (n_samples,):
        raise ValueError(f"sample_weight must have shape ({n_samples},), got "
                         f"{sample_weight.shape}.")
    check_finite("sample_weight", sample_weight)
    if (sample_weight < 0).any():
        raise ValueError("sample_weight contains negative values.")
    if not sample_weight.any():
        raise ValueError("sample_weight is all zeros: at least one sample must have a "
                         "positive weight.")
    return np.ascontiguousarray(sample_weight)


def with_defaults(cls, state: dict, names) -> dict:
    """``state`` (an estimator's pickled ``__dict__``) with the ``__init__`` defaults of
    the parameters ``names`` it lacks: a model pickled before they existed loads as the
    model it was (each default reproduces the behaviour from before)."""
    signature = inspect.signature(cls.__init__).parameters
    return {**{name: signature[name].default for name in names}, **state}
