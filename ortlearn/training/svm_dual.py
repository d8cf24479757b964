"""The solver of liblinear's dual problems (hinge and epsilon-insensitive losses).

The dual of each one-vs-rest problem is a bounded quadratic program, smooth: scipy's L-BFGS-B
minimises it with onnxruntime's gradient (:func:`~ortlearn.training.minimize_lbfgs`, box
bounds ``0 <= a_i <= C_i``), one run per problem as liblinear (the curvature pairs of
independent problems mixed in one run slow it down several times). A first-order method
reaches the minimum of a degenerate dual slowly; the primal is then polished exactly
(:func:`polish`): the approximate solution tells which rows are on the margin, and there the
optimality conditions are linear.
"""

from __future__ import annotations

import numpy as np

from .lbfgs import minimize_lbfgs
from .result import CALLBACK, CONVERGED, MAX_ITER, SolverResult

__all__ = ["POLISH_BANDS", "POLISH_ROUNDS", "polish", "polish_squared_hinge", "primal_value",
           "solve_svm_dual"]


#: Widths of the band of margins taken as "on the margin" by the polish.
POLISH_BANDS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7)


#: At most this many polish rounds (each from the partition of the previous one's w~).
POLISH_ROUNDS = 20


def primal_value(X, Y, cost, coef, epsilon):
    """liblinear's primal objective of each column (hinge or epsilon-insensitive)."""
    raw = X @ coef
    excess = (np.maximum(0.0, 1.0 - Y * raw) if epsilon is None
              else np.maximum(0.0, np.abs(Y - raw) - epsilon))
    return 0.5 * (coef ** 2).sum(axis=0) + (cost * excess).sum(axis=0)


def polish(X, Y, cost, coef, epsilon):
    """The exact minimiser of the non-smooth primal where L-BFGS-B's dual identified it.

    A first-order method reaches the dual's minimum slowly where it is
    degenerate (more support vectors on the margin than features). Its
    approximate ``w~`` tells which rows are on the margin (within a band),
    beyond it (dual at its bound ``C_i``) or inside it (dual 0); with that
    partition the optimality conditions are linear (OSQP's polish)::

        w~ = w0 + A_F^T lam,   A_F w~ = t_F

    with ``w0`` the rows at their bound, ``A_F`` the rows on the margin
    (signed by their label for the hinge) and ``t_F`` their margin (1, or
    ``y - sign(r) epsilon``). Solved for several band widths; a column keeps
    the solution with the lowest primal objective, the L-BFGS-B one included.
    """
    best = coef.copy()
    best_value = primal_value(X, Y, cost, coef, epsilon)
    for k in range(coef.shape[1]):
        w, y, c = coef[:, k], Y[:, k], cost[:, k]
        raw = X @ w
        if epsilon is None:
            A, gap, bound_sign = X * y[:, None], y * raw - 1.0, np.ones_like(y)
            target, beyond = np.ones_like(y), None
        else:
            residual = y - raw
            bound_sign = np.sign(residual)
            A, gap = X, np.abs(residual) - epsilon
            target = y - bound_sign * epsilon
        for band in POLISH_BANDS:
            on = np.abs(gap) <= band
            beyond = gap < -band if epsilon is None else gap > band
            w0 = A[beyond].T @ (bound_sign[beyond] * c[beyond])
            if on.any():
                # The least-norm correction lies in the row space of A_F (= A_F^T lam):
                # least squares on the (rows x features) system, not the rows x rows one.
                A_on = A[on]
                candidate = w0 + np.linalg.lstsq(A_on, target[on] - A_on @ w0, rcond=None)[0]
            else:
                candidate = w0
            value = primal_value(X, Y[:, [k]], cost[:, [k]], candidate[:, None], epsilon)[0]
            if np.isfinite(value) and value < best_value[k]:
                best[:, k], best_value[k] = candidate, value
    return best


def polish_squared_hinge(gram, signs, cost, dual_of_margins):
    """The exact dual of the squared hinge where an approximate one identified its support.

    The dual ``min a^T (Q + D) a / 2 - sum(a)``, ``a >= 0``, with ``Q = S G S``
    (``G`` the rows' Gram matrix, ``S`` the signs) and ``D = 1 / (2 C)``, is a
    linear system on the rows whose ``a_i > 0`` (the support: the rows inside
    the margin): ``(Q + D)_FF a_F = 1``. ``dual_of_margins`` gives each
    column's approximate ``a`` (``2 C max(0, 1 - margin)``, the optimality
    condition); the support is taken from it, solved, and kept while it is
    consistent: every ``a_F > 0`` and every other row outside the margin
    (gradient ``(Q a)_i - 1 >= 0``), for up to :data:`POLISH_ROUNDS` supports.
    A column whose support never settles keeps its approximate ``a``.

    Parameters
    ----------
    gram : numpy.ndarray of shape (n_samples, n_samples)
    signs, cost : numpy.ndarray of shape (n_samples, n_problems)
    dual_of_margins : numpy.ndarray of shape (n_samples, n_problems)

    Returns
    -------
    numpy.ndarray of shape (n_samples, n_problems)
        The dual variables.
    """
    result = dual_of_margins.copy()
    for k in range(signs.shape[1]):
        s, c = signs[:, k], cost[:, k]
        hessian = np.outer(s, s) * gram
        hessian[np.diag_indices_from(hessian)] += np.divide(0.5, c, out=np.zeros_like(c),
                                                            where=c > 0)
        support = (dual_of_margins[:, k] > 0) & (c > 0)
        for _ in range(POLISH_ROUNDS):
            a = np.zeros_like(c)
            if support.any():
                block = hessian[np.ix_(support, support)]
                a[support] = np.linalg.lstsq(block, np.ones(support.sum()), rcond=None)[0]
            gradient = hessian @ a - 1.0
            outside = ~support & (c > 0)
            if (a[support] > 0).all() and (gradient[outside] >= -1e-12).all():
                result[:, k] = a
                break
            support = ((a > 0) & support) | (outside & (gradient < 0))
    return result


def solve_svm_dual(model, trainable, X, Y, cost, epsilon=None, *, primal, tol, callback=None,
                   label="y", loss_output="loss", diagonal=None, n_features=None,
                   **lbfgs_options):
    """Each column of ``Y`` a problem: L-BFGS-B on its dual, then the exact polish.

    Parameters
    ----------
    model : onnx.ModelProto
        The dual objective of one problem: inputs ``X`` and ``label`` (one
        column), the dual variables ``trainable`` (each ``(n_samples, 1)``),
        the output ``loss_output``.
    trainable : list of str
        The dual variables (``a``, or ``p`` and ``m`` for the regression).
    X : numpy.ndarray of shape (n_samples, n_features)
    Y : numpy.ndarray of shape (n_samples, n_problems)
        Signs in {-1, 1} (hinge) or targets (``epsilon`` given).
    cost : numpy.ndarray of shape (n_samples, n_problems)
        The upper bound ``C_i`` of each dual variable.
    epsilon : float, optional
        The epsilon-insensitive loss's width; None for the hinge.
    primal : callable
        ``primal(weights, k) -> w~`` of problem ``k`` from its dual variables.
    tol : float
        L-BFGS-B's projected-gradient tolerance.
    callback : callable, optional
        ``callback(weights, k, coef) -> bool`` after each iteration of problem
        ``k``, ``coef`` holding ``w~`` of the problems solved before it; True
        ends every problem there, unpolished.
    label, loss_output : str, default='y', 'loss'
        The label input and the loss output of ``model``.
    diagonal : tuple of (str, numpy.ndarray), default=None
        The squared hinge's dual: ``(input name, 1 / (4 C))`` of shape
        ``(n_samples, n_problems)``, fed to ``model``; its dual variables have no
        upper bound, and its primal is smooth: no polish.
    n_features : int, default=None
        The length of ``w~`` when ``X`` is not the data itself (a factor of
        the rows' Gram matrix); None: ``X.shape[1]``.
    **lbfgs_options
        More options of :func:`~ortlearn.training.minimize_lbfgs` (``max_iter``,
        ``ftol``, ``maxls``, ``device``, ``verbose``, ``remedy``).

    Returns
    -------
    SolverResult
        ``weights``: ``w~`` of each problem, ``(n_features, n_problems)``;
        ``n_iter``: the most iterations a problem ran; ``loss``: the sum of
        the dual minima; ``converged``: every problem's L-BFGS-B converged;
        ``status``: ``'callback'`` when ``callback`` asked to stop, else
        ``'converged'`` or ``'max_iter'``.
    """
    n_features, n_problems = n_features or X.shape[1], Y.shape[1]
    coef, n_iter, loss, stopped = np.zeros((n_features, n_problems)), 0, 0.0, False
    converged = True
    for k in range(n_problems):
        # the squared hinge's a_i is unbounded, and 0 where the row weighs nothing
        high = np.where(cost[:, [k]] > 0, np.inf, 0.0) if diagonal else cost[:, [k]]
        bounds = {name: (0.0, high) for name in trainable}
        arrays, names = [X, np.ascontiguousarray(Y[:, [k]])], ["X", label]
        if diagonal:
            arrays.append(np.ascontiguousarray(diagonal[1][:, [k]]))
            names.append(diagonal[0])

        def stop(weights, k=k):
            nonlocal stopped
            stopped = bool(callback(weights, k, coef))
            return stopped

        result = minimize_lbfgs(
            model, trainable, None, arrays, names,
            loss_output=loss_output, bounds=bounds, tol=tol,
            callback=None if callback is None else stop, **lbfgs_options)
        coef[:, k] = primal(result.weights, k)
        n_iter, loss = max(n_iter, result.n_iter), loss + result.loss
        converged &= bool(result.converged)
        if stopped:
            return SolverResult(coef, n_iter, loss, False, CALLBACK)
    for _ in range(0 if diagonal else POLISH_ROUNDS):  # each round's partition from the last's w~
        polished = polish(X, Y, cost, coef, epsilon)
        if np.array_equal(polished, coef):
            break
        coef = polished
    return SolverResult(coef, n_iter, loss, converged, CONVERGED if converged else MAX_ITER)
