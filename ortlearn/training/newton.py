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

__all__ = ["minimize_l1_margin", "minimize_squared_margin"]

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


def _start(X, S) -> tuple:
    """``(weights, converged, n_iter)`` of a column-wise solver before its first iteration."""
    n_columns = S.shape[1]
    return (np.zeros((X.shape[1], n_columns)), np.zeros(n_columns, dtype=bool),
            np.zeros(n_columns, dtype=np.int64))


def _line_search(X, w, direction, gradient, value, objective):
    """Backtracking from ``w`` towards ``w + direction`` on ``objective(w, X @ w)`` (whose
    value at ``w`` is ``value``): ``(w, X @ w, value, step)`` of the first step that
    decreases it enough (Armijo's test), None where none does at its rounding."""
    step, slope = 1.0, float(gradient @ direction)
    for _ in range(MAX_BACKTRACKS):
        candidate = w + step * direction
        z = X @ candidate
        candidate_value = objective(candidate, z)
        if candidate_value <= value + 1e-4 * step * slope:
            return candidate, z, candidate_value, step
        step /= 2
    return None


def _record(weights, n_iter, k, w, callback, message) -> bool:
    """Column ``k``'s new iterate ``w`` kept and counted, ``message()`` logged (when given),
    the callback told; whether it stops the run."""
    weights[:, k] = w
    n_iter[k] += 1
    if message:
        verbose_log(message())
    return callback is not None and bool(callback(weights.copy()))


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
    weights, converged, n_iter = _start(X, S)
    total, stopped = 0.0, False
    identity = np.eye(X.shape[1])
    for k in range(S.shape[1]):
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
            accepted = _line_search(X, w, target - w, gradient, value,
                                    lambda w, z: _value(w, z, s, c, epsilon))
            if accepted is None:
                break  # no descent left at the rounding of f: w is the minimum found
            w, z, value, step = accepted
            if _record(weights, n_iter, k, w, callback, verbose and (
                    lambda: f"Newton iteration {n_iter[k]}: loss={value:.10g}, step={step:.3g}")):
                stopped = True
                break
        total += value
        if stopped:
            break
    status = CALLBACK if stopped else CONVERGED if converged.all() else MAX_ITER
    return SolverResult(weights, n_iter, total, converged, status)


#: The smoothing width of :func:`minimize_l1_margin` shrinks by this factor a stage.
SMOOTHING_SHRINK = 10.0
#: Smoothing stages at most: the problems certified at all were within six stages (a sweep
#: of SVR and one-vs-rest hinge problems); a degenerate one (more rows at the kink than
#: ``w`` has values) is left to the caller after eight.
MAX_STAGES = 8
#: Newton iterations at most a stage (a piecewise quadratic: the step is exact once the
#: rows stop changing pieces, in a handful).
STAGE_ITERATIONS = 30


def _smoothed(margin, mu):
    """The smoothed ``max(0, m)`` of each margin: 0, ``m^2 / (2 mu)`` up to ``mu``, then
    ``m - mu / 2``; and its derivative, in [0, 1]."""
    slope = np.clip(margin / mu, 0.0, 1.0)
    value = np.where(margin >= mu, margin - 0.5 * mu, 0.5 * slope * np.maximum(margin, 0.0))
    return value, slope


def minimize_l1_margin(X, S, cost, *, epsilon=None, max_iter: int, device="cpu",
                       certify: Callable, verbose: int = 0,
                       callback: Callable | None = None) -> SolverResult:
    """Minimise liblinear's hinge or epsilon-insensitive objective of each column, exactly.

    ``f(w) = 1/2 ||w||^2 + sum_i c_i max(0, m_i(x_i . w))`` (margins as in
    :func:`minimize_squared_margin`) is piecewise linear in the losses: its
    ``max(0, m)`` is smoothed over a width ``mu`` (quadratic up to ``mu``,
    linear beyond: piecewise quadratic again) and Newton's method minimises
    the smooth objective, onnxruntime forming ``X^T W X`` on the rows in the
    quadratic piece; ``mu`` shrinks tenfold a stage, from the largest margin at
    ``w = 0``. After each stage the smooth minimum's dual variables
    (``c_i`` times the loss's slope at each row) give the partition of the rows
    (at a bound, at the kink, at zero) and ``certify(dual, w, k)`` (liblinear's
    exact solve on that partition and a duality gap:
    :func:`~ortlearn.training.svm_dual.polish_dual` and
    :func:`~ortlearn.training.svm_dual.is_primal_minimum`) returns the exact
    minimum once the partition is the minimum's, or the smooth minimum ``w``
    itself once the gap certifies it (a degenerate problem, more rows at the
    kink than ``w`` has values, which no partition solves), or None.

    Parameters
    ----------
    X : numpy.ndarray of shape (n, p)
        Dense float64 rows (with their intercept column).
    S : numpy.ndarray of shape (n, k)
        Labels +-1 (``epsilon`` None) or regression targets, one column per problem.
    cost : numpy.ndarray of shape (n, k)
    epsilon : float, optional
        The epsilon-insensitive loss's width; None: the hinge.
    max_iter : int
        Newton iterations at most, per column, all stages together.
    device : str, default='cpu'
        Where onnxruntime forms the products.
    certify : callable
        ``certify(dual, w, k) -> w or None``: ``dual`` the approximate dual
        variables of column ``k`` (signed by the residual for the
        epsilon-insensitive loss), ``w`` the smooth minimum they come from.
    verbose : int, default=0
    callback : callable, optional
        ``callback(W) -> bool`` after each Newton iteration, ``W`` (p, k) holding the
        columns solved so far and the current one; True stops.

    Returns
    -------
    SolverResult
        ``weights`` (p, k): the certified minima (the last smooth minimum of a
        column that none certified); ``n_iter`` the Newton iterations of each
        column; ``loss`` the sum of the objectives; ``converged``: certified.
    """
    weights, converged, n_iter = _start(X, S)
    total, stopped = 0.0, False
    n_features = X.shape[1]
    identity = np.eye(n_features)
    for k in range(S.shape[1]):
        w, s, c = weights[:, k], S[:, k], cost[:, k]
        z = X @ w
        margin = _targets(z, s, epsilon)[0]
        mu = max(float(np.max(margin, initial=0.0)), np.finfo(float).tiny)

        def smooth_value(w, z, mu):
            return 0.5 * float(w @ w) + float(np.sum(c * _smoothed(
                _targets(z, s, epsilon)[0], mu)[0]))

        for stage in range(MAX_STAGES):
            value = smooth_value(w, z, mu)
            for _ in range(STAGE_ITERATIONS):
                if n_iter[k] >= max_iter:
                    break
                margin, t = _targets(z, s, epsilon)
                # the sign of each row's loss in the score: -s (hinge), -sign(r)
                sign = s if epsilon is None else np.sign(s - z)
                quadratic = (margin > 0) & (margin < mu)
                linear = margin >= mu
                gram, rhs, _ = weighted_products(X, t[:, None], np.where(quadratic, c / mu, 0.0),
                                                 device=device)
                pull = X.T @ np.where(linear, c * sign, 0.0)
                # the minimiser of this partition's quadratic (rows staying in their pieces)
                target = np.linalg.solve(identity + gram, rhs[:, 0] + pull)
                gradient = w + gram @ w - rhs[:, 0] - pull
                if np.abs(gradient).max() <= 1e-12 * (1.0 + np.abs(w).max()):
                    break
                accepted = _line_search(X, w, target - w, gradient, value,
                                        lambda w, z: smooth_value(w, z, mu))
                if accepted is None:
                    break  # no descent left at the rounding of f
                w, z, value, step = accepted
                if _record(weights, n_iter, k, w, callback, verbose and (
                        lambda: f"Newton iteration {n_iter[k]} (smoothing {mu:.3g}): "
                                f"loss={value:.10g}, step={step:.3g}")):
                    stopped = True
                    break
                margin = _targets(z, s, epsilon)[0]
                if (step == 1.0 and np.array_equal(quadratic, (margin > 0) & (margin < mu))
                        and np.array_equal(linear, margin >= mu)):
                    break  # the full step kept every row in its piece: this stage's minimum
            if stopped:
                break
            margin = _targets(z, s, epsilon)[0]
            slope = _smoothed(margin, mu)[1]
            # the rows inside the smoothing are the kink's candidates; each fixes one
            # equation of w: more than w has values, the smoothing is likely still too
            # wide (from the third stage on the polish tries anyway: degenerate problems
            # keep more rows at the kink than w has values)
            inside = np.count_nonzero((slope > 0) & (slope < 1))
            if inside <= 2 * n_features or stage >= 2:
                dual = c * slope if epsilon is None else c * slope * np.sign(s - z)
                exact = certify(dual, w.copy(), k)
                if exact is not None:
                    weights[:, k], converged[k] = exact, True
                    break
            if n_iter[k] >= max_iter:
                break
            mu /= SMOOTHING_SHRINK
        w = weights[:, k]
        total += 0.5 * float(w @ w) + float(np.sum(c * np.maximum(
            _targets(X @ w, s, epsilon)[0], 0.0)))
        if stopped:
            break
    status = CALLBACK if stopped else CONVERGED if converged.all() else MAX_ITER
    return SolverResult(weights, n_iter, total, converged, status)
