"""LARS on a Gram matrix: the exact solver of the L1-penalised least squares.

The Lasso's solution is piecewise linear in its penalty: scikit-learn's
``lars_path_gram`` (``method='lasso'``) follows it from the penalty that keeps
every coefficient at zero down to the one asked for, one step where a feature
enters or leaves the active set (about ``n_features`` steps, each a small
solve). It reads only the data's products ``X^T W X`` and ``X^T W y``
(onnxruntime forms them, :func:`~ortlearn.training.normal_equations.weighted_products`),
so a fit costs those products and ``p^3``-sized work. The path is exact where
the active features are not collinear; where it degenerates (scikit-learn
warns), the column is left unsolved for an iterative solver to finish.

A search fits the same rows at several penalties (a grid over ``alpha``, each
fold once per grid point), and the path down to one penalty holds the solution
at every penalty above. The last paths are kept (:data:`_PATHS`, keyed by the
products' bytes); the solution at a penalty above a kept path's end is read
from it with ``lars_path_gram``'s own interpolation between two breakpoints, so
it is the same, bit for bit, as a path computed down to that penalty.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import lars_path_gram

from ..graph.cache import LRUCache
from .result import CALLBACK, CONVERGED, MAX_ITER, SolverResult

__all__ = ["minimize_lars"]

#: The paths of the last problems, by the bytes of their products (a fold of a search over
#: alpha meets its problem again at each grid point); up to this many features.
_PATHS = LRUCache(16)
_PATH_MAX_FEATURES = 256
#: ``lars_path_gram``'s tolerance on the penalty at which a path stops
_EQUALITY_TOLERANCE = np.finfo(np.float32).eps


def _lars_path(gram, xty, n_samples: int, max_iter: int, alpha: float):
    """``(alphas, coefs)`` of ``lars_path_gram`` down to ``alpha``, or None where the path
    degenerates (collinear active features)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        try:
            alphas, _, coefs = lars_path_gram(xty, gram, n_samples=n_samples, alpha_min=alpha,
                                              method="lasso", max_iter=max_iter)
        except (ConvergenceWarning, FloatingPointError, np.linalg.LinAlgError):
            return None
    return alphas, coefs


def _read(alphas, coefs, alpha: float):
    """The path down to ``alpha`` read from a longer path of the same problem, or None.

    ``lars_path_gram`` stops at the first point whose penalty is within its tolerance of
    ``alpha`` or below (its test, in float32 as its tolerance), and interpolates there
    between that breakpoint and the one before: the same operations on the same points of
    the longer path give the same bits. The longer path's own last point was its end
    (interpolated, or where max_iter stopped it): a stop there is not read (None).
    """
    below = np.flatnonzero(alphas <= alpha + _EQUALITY_TOLERANCE)
    if not below.size or below[0] == len(alphas) - 1:
        return None
    end = int(below[0])
    alphas, path = alphas[:end + 1].copy(), coefs[:, :end + 1].copy()
    if abs(alphas[end] - alpha) > _EQUALITY_TOLERANCE:  # (a breakpoint within it is kept)
        if end > 0:
            ss = (alphas[end - 1] - alpha) / (alphas[end - 1] - alphas[end])
            path[:, end] = coefs[:, end - 1] + ss * (coefs[:, end] - coefs[:, end - 1])
        alphas[end] = alpha
    return alphas, path


def _path(gram, xty, n_samples: int, max_iter: int, alpha: float):
    """The path of one problem down to ``alpha`` (:func:`_lars_path`), read from a kept path
    of the same problem that goes further where one does; a path further down is kept."""
    key = None
    if len(xty) <= _PATH_MAX_FEATURES:
        digest = hashlib.blake2b(np.ascontiguousarray(gram).tobytes(), digest_size=20)
        digest.update(np.ascontiguousarray(xty).tobytes())
        key = (digest.hexdigest(), n_samples, max_iter)
        kept = _PATHS.get(key)
        if kept is not None:
            path, lowest = kept
            # (the same penalty again is computed again: the kept paths serve a search's
            # other grid points, not a memo of a fit)
            if alpha > lowest:
                read = None if path is None else _read(*path, alpha)
                return _lars_path(gram, xty, n_samples, max_iter, alpha) if read is None else read
    path = _lars_path(gram, xty, n_samples, max_iter, alpha)
    if key is not None:
        _PATHS.put(key, (path, alpha))
    return path


def minimize_lars(gram: np.ndarray, Xty: np.ndarray, n_samples: int, alpha: float, *,
                  max_iter: int, callback: Callable | None = None) -> SolverResult:
    """``min_w 1/(2 n) (w^T gram w - 2 w^T Xty) + alpha ||w||_1``, column by column.

    Parameters
    ----------
    gram : numpy.ndarray of shape (p, p)
        ``X^T W X`` (plus ``n l2 I`` for an elastic net's L2 term).
    Xty : numpy.ndarray of shape (p, k)
        ``X^T W y`` of each independent problem.
    n_samples : int
        The ``n`` of the objective (the weights summing to it).
    alpha : float
        The L1 penalty.
    max_iter : int
        Steps at most (a column whose path is longer stops short of ``alpha``).
    callback : callable, optional
        ``callback(w) -> bool`` after each step, with every column at its step
        (a column whose path ended stays at its end); True stops.

    Returns
    -------
    SolverResult
        ``weights`` (p, k); ``n_iter`` the steps of each column; ``converged``:
        the path reached ``alpha`` without degenerating; ``loss`` NaN (the
        caller evaluates its objective); ``status`` ``'converged'``,
        ``'max_iter'`` or ``'callback'``.

    Examples
    --------
    Orthogonal features: the solution is the least squares one soft-thresholded.

    >>> import numpy as np
    >>> result = minimize_lars(np.eye(2) * 4.0, np.array([[8.0], [1.0]]), 4, 0.5,
    ...                        max_iter=10)
    >>> result.weights.ravel().tolist(), result.n_iter.tolist(), result.status
    ([1.5, 0.0], [1], 'converged')
    """
    n_features, n_columns = Xty.shape
    paths, converged = [], np.ones(n_columns, dtype=bool)
    for k in range(n_columns):
        found = _path(gram, Xty[:, k], n_samples, max_iter, alpha)
        if found is None:
            path, converged[k] = np.zeros((n_features, 1)), False
        else:
            alphas, path = found
            # the path stops short of alpha at max_iter steps
            converged[k] = alphas[-1] <= alpha * (1 + 1e-12)
        paths.append(path)
    lengths = np.array([path.shape[1] - 1 for path in paths])
    weights = np.zeros((n_features, n_columns))
    for step in range(1, int(lengths.max(initial=0)) + 1):
        weights = np.stack([path[:, min(step, path.shape[1] - 1)] for path in paths], axis=1)
        if callback is not None and callback(weights):
            return SolverResult(weights, np.minimum(lengths, step), float("nan"),
                                converged & (lengths <= step), CALLBACK)
    status = CONVERGED if converged.all() else MAX_ITER
    return SolverResult(weights, lengths, float("nan"), converged, status)
