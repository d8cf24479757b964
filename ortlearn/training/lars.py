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
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import lars_path_gram

from .result import CALLBACK, CONVERGED, MAX_ITER, SolverResult

__all__ = ["minimize_lars"]


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
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConvergenceWarning)
            try:
                alphas, _, path = lars_path_gram(Xty[:, k], gram, n_samples=n_samples,
                                                 alpha_min=alpha, method="lasso",
                                                 max_iter=max_iter)
                # the path stops short of alpha at max_iter steps
                converged[k] = alphas[-1] <= alpha * (1 + 1e-12)
            except (ConvergenceWarning, FloatingPointError, np.linalg.LinAlgError):
                path, converged[k] = np.zeros((n_features, 1)), False
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
