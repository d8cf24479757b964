"""Newton's method on the squared-margin objectives of liblinear's primal solver.

``LinearSVC(loss='squared_hinge')`` and ``LinearSVR(loss='squared_epsilon_insensitive')``
minimise, for each independent problem (a column)::

    f(w) = 1/2 ||w||^2 + sum_i c_i max(0, m_i(x_i . w))^2

with the margin ``m_i(z) = 1 - s_i z`` (labels ``s_i = +-1``) or ``|y_i - z| - epsilon``.
``f`` is piecewise quadratic: on the rows whose margin is positive (the active set
``A``) it is ``1/2 ||w||^2 + sum_A c_i (x_i . w - t_i)^2`` with ``t_i = s_i``, or
``y_i - epsilon sign(y_i - z_i)``. Its gradient and generalized Hessian are then

    g = w + X^T W (X w - t),   H = I + X^T W X,   W = diag(2 c_i [i in A])

onnxruntime forms ``X^T W X`` and ``X^T W t`` in one pass
(:func:`~ortlearn.training.normal_equations.weighted_products`), numpy solves ``H w' = X^T W t``
(the minimiser of the quadratic of this active set), and a backtracking search on
``f`` from ``w`` towards ``w'`` keeps the descent: once the active set stops changing
the step is exact. liblinear's primal solver is a Newton method too (TRON); this one
needs a handful of iterations where L-BFGS needs dozens.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..log import verbose_log
from .normal_equations import weighted_products
from .result import CALLBACK, CONVERGED, MAX_ITER, SolverResult

__all__ = ["minimize_squared_margin"]

#: Halvings of the step before a Newton iteration gives up descending.
MAX_BACKTRACKS = 30


def _targets(z, S, epsilon):
    """``(margins, targets)`` of the rows at scores ``z``."""
    if epsilon is None:
        return 1.0 - S * z, S
    residual = S - z
    return np.abs(residual) - epsilon, S - epsilon * np.sign(residual)


def _value(w, z, S, cost, epsilon) -> float:
    margin = np.maximum(_targets(z, S, epsilon)[0], 0.0)
    return 0.5 * float(w @ w) + float(np.sum(cost * margin * margin))


def minimize_squared_margin(X, S, cost, *, epsilon=None, tol: float, max_iter: int,
                            device="cpu", verbose: int = 0,
                            callback: Callable | None = None) -> SolverResult:
    """Minimise the squared-margin objective of each column of ``S``, by Newton's method.

    Parameters
    ----------
    X : numpy.ndarray of shape (n, p)
        Dense float64 rows (with their intercept column, for liblinear's penalised
        intercept).
    S : numpy.ndarray of shape (n, k)
        Labels +-1 (``epsilon`` None) or regression targets, one column per problem.
    cost : numpy.ndarray of shape (n, k)
        ``c_i`` of each row and problem (``C`` times the sample and class weights).
    epsilon : float, optional
        The insensitive margin of ``squared_epsilon_insensitive``; None: squared hinge.
    tol : float
        A column stops once its gradient's largest component is at most ``tol``
        (``gtol`` of the L-BFGS-B this replaces).
    max_iter : int
        Newton iterations at most, per column.
    device : str, default='cpu'
        Where onnxruntime forms the products.
    verbose : int, default=0
        > 0 logs each iteration's objective (the ``ortlearn`` logger).
    callback : callable, optional
        ``callback(W) -> bool`` after each iteration, ``W`` (p, k) holding the
        columns solved so far and the current one; True stops.

    Returns
    -------
    SolverResult
        ``weights`` (p, k); ``n_iter`` the iterations of each column;
        ``loss`` the sum of the columns' objectives; ``converged`` per column.

    Examples
    --------
    Two separable points and the squared hinge: ``w = s x / (1 + |x|^2)``-like.

    >>> X = np.array([[1.0, 1.0], [-1.0, 1.0]])
    >>> result = minimize_squared_margin(X, np.array([[1.0], [-1.0]]), np.ones((2, 1)),
    ...                                  tol=1e-10, max_iter=20)
    >>> np.round(result.weights.ravel(), 6).tolist(), result.status
    ([0.8, 0.0], 'converged')
    """
    n_features, n_columns = X.shape[1], S.shape[1]
    weights = np.zeros((n_features, n_columns))
    converged = np.zeros(n_columns, dtype=bool)
    n_iter = np.zeros(n_columns, dtype=np.int64)
    total, stopped = 0.0, False
    identity = np.eye(n_features)
    for k in range(n_columns):
        w, s, c = weights[:, k], S[:, k], cost[:, k]
        z = X @ w
        value = _value(w, z, s, c, epsilon)
        for _ in range(max_iter):
            margin, t = _targets(z, s, epsilon)
            active = np.where(margin > 0, 2.0 * c, 0.0)
            gram, rhs, _ = weighted_products(X, t[:, None], active, device=device)
            gradient = w + gram @ w - rhs[:, 0]
            if np.abs(gradient).max() <= tol:
                converged[k] = True
                break
            # I + X^T W X: symmetric, eigenvalues >= 1 (a small system: numpy's LAPACK
            # call without scipy's checks)
            target = np.linalg.solve(identity + gram, rhs[:, 0])
            step, direction = 1.0, target - w
            slope = float(gradient @ direction)
            for _ in range(MAX_BACKTRACKS):
                candidate = w + step * direction
                candidate_z = X @ candidate
                candidate_value = _value(candidate, candidate_z, s, c, epsilon)
                if candidate_value <= value + 1e-4 * step * slope:
                    break
                step /= 2
            else:
                break  # no descent left at the rounding of f: w is the minimum found
            w, z, value = candidate, candidate_z, candidate_value
            weights[:, k] = w
            n_iter[k] += 1
            if verbose:
                verbose_log(f"Newton iteration {n_iter[k]}: loss={value:.10g}, "
                            f"step={step:.3g}")
            if callback is not None and callback(weights.copy()):
                stopped = True
                break
        total += value
        if stopped:
            break
    status = CALLBACK if stopped else CONVERGED if converged.all() else MAX_ITER
    return SolverResult(weights, n_iter, total, converged, status)
