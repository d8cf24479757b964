"""The solver of L1-penalised quantile regression, a linear program, by smoothing.

The objective (scikit-learn's ``QuantileRegressor``)::

    sum_i w_i * pinball_q(y_i - x_i . coef - intercept) / sum_i w_i + alpha * ||coef||_1

With ``coef = pos - neg``, ``pos, neg >= 0`` (L-BFGS-B bounds), the L1 term is
linear; the pinball loss ``q r + relu(-r)`` has its kink smoothed over a width
``mu``, and :func:`minimize_smoothed_pinball` minimises the smooth objective
for decreasing ``mu``, each stage from the last one's minimiser. The linear
program's minimum lies at a vertex: the rows of zero residual determine the
non-zero coefficients and the intercept. :func:`polish_vertex` reads that vertex
off a stage and keeps it when it lowers the exact objective;
:func:`is_optimal` certifies a minimum by a subgradient that vanishes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..exceptions import ConvergenceWarning
from .lbfgs import minimize_lbfgs
from .result import CALLBACK, CONVERGED, MAX_ITER, SolverResult
from .sparse import is_sparse

__all__ = ["QuantileProblem", "is_optimal", "minimize_smoothed_pinball",
           "objective", "polish_vertex"]

#: Smoothing widths, relative to the mean absolute deviation of y.
WIDTHS = tuple(10.0 ** -k for k in range(1, 10))
#: L-BFGS iterations per smoothing stage.
STAGE_MAX_ITER = 2000
#: Bands of residuals taken as zero (relative to the scale of y) by the polish.
POLISH_BANDS = tuple(10.0 ** -k for k in range(2, 12))


@dataclass
class QuantileProblem:
    """The data and the parameters of one quantile regression.

    ``X`` (n, p), dense or sparse; ``y`` and ``sample_weight`` (n,); the
    ``quantile`` in (0, 1), ``alpha >= 0``, and whether there is an intercept.
    ``scale`` is the scale of ``y`` the widths and bands are relative to.
    """

    X: object
    y: np.ndarray
    sample_weight: np.ndarray
    quantile: float
    alpha: float
    fit_intercept: bool

    @property
    def scale(self) -> float:
        y = self.y
        return float(np.mean(np.abs(y - np.median(y)))) or 1.0


def _dense(X):
    """``X`` as an ndarray (a few rows of a sparse X, for a least-squares solve)."""
    return X.toarray() if is_sparse(X) else X


def objective(problem: QuantileProblem, coef, intercept) -> float:
    """The exact (non-smooth) objective at ``coef``, ``intercept``."""
    q, w = problem.quantile, problem.sample_weight
    residual = problem.y - problem.X @ coef - intercept
    pinball = np.maximum(q * residual, (q - 1) * residual)
    return float(w @ pinball / w.sum() + problem.alpha * np.abs(coef).sum())


def is_optimal(problem: QuantileProblem, coef, intercept) -> bool:
    """Whether zero is in the subdifferential of the objective (to rounding).

    The rows of zero residual ``Z`` have a pinball subgradient free in
    ``[q - 1, q]``, the zero coefficients an L1 one free in ``[-1, 1]``:
    the least-squares subgradients of ``Z`` that zero the gradient of the
    intercept and of the non-zero coefficients must lie in their
    intervals, and leave the zero coefficients' gradients within ``alpha``.
    """
    X, y, sample_weight = problem.X, problem.y, problem.sample_weight
    q, alpha, total = problem.quantile, problem.alpha, sample_weight.sum()
    residual = y - X @ coef - intercept
    zero = np.abs(residual) <= 1e-9 * problem.scale
    psi = np.where(residual > 0, q, q - 1.0)
    fixed = X[~zero].T @ (sample_weight[~zero] * psi[~zero])  # (n_features,)
    active = coef != 0
    # (n_features, |Z|): few rows have a zero residual (a vertex: about n_features)
    A = (_dense(X[zero]) * sample_weight[zero, None]).T
    target = total * alpha * np.sign(coef) - fixed
    rows, goal = [A[active]], [target[active]]
    if problem.fit_intercept:
        rows.append(sample_weight[zero][None, :])
        goal.append([-(sample_weight[~zero] @ psi[~zero])])
    system, goal = np.vstack(rows), np.concatenate(goal)
    if zero.any():
        free = np.linalg.lstsq(system, goal, rcond=None)[0]
    else:
        free = np.zeros(0)
    slack = 1e-8 * max(total * max(alpha, 1.0), 1.0) * (1 + abs(X).max())
    if np.abs(system @ free - goal).max(initial=0.0) > slack:
        return False
    if (free < q - 1 - 1e-8).any() or (free > q + 1e-8).any():
        return False
    inactive_gradient = fixed[~active] + A[~active] @ free
    return bool((np.abs(inactive_gradient) <= total * alpha + slack).all())


def polish_vertex(problem: QuantileProblem, coef, intercept) -> tuple[np.ndarray, float]:
    """The vertex of the linear program near ``coef``, ``intercept``, if it is better.

    For each band: the rows with ``|residual| <= band * scale`` and the
    coefficients with ``|coef| > band * max|coef|``; least squares of
    those rows on those coefficients (and the intercept) gives a
    candidate; the lowest exact objective wins, the given point included.
    """
    X, y = problem.X, problem.y
    best = (coef, intercept)
    best_value = objective(problem, coef, intercept)
    residual = y - X @ coef - intercept
    largest = np.abs(coef).max() if coef.size else 0.0
    for band in POLISH_BANDS:
        rows = np.abs(residual) <= band * problem.scale
        columns = np.abs(coef) > band * largest
        if not rows.any():
            continue
        A = _dense(X[rows][:, columns])
        if problem.fit_intercept:
            A = np.hstack([A, np.ones((A.shape[0], 1))])
        solution = np.linalg.lstsq(A, y[rows], rcond=None)[0]
        candidate = np.zeros_like(coef)
        candidate[columns] = solution[:columns.sum()]
        candidate_intercept = float(solution[-1]) if problem.fit_intercept else 0.0
        value = objective(problem, candidate, candidate_intercept)
        if np.isfinite(value) and value < best_value:
            best, best_value = (candidate, candidate_intercept), value
    return best


def minimize_smoothed_pinball(problem: QuantileProblem, smoothed_objective: Callable, *,
                              names: tuple, callback: Callable | None = None,
                              **lbfgs_options) -> SolverResult:
    """Smoothing stages of decreasing width, each polished, until a certified minimum.

    Parameters
    ----------
    problem : QuantileProblem
    smoothed_objective : callable
        ``smoothed_objective(width) -> onnx.ModelProto``: the smoothed objective
        of that width, with inputs ``X``, the label ``(N, 1)`` and the sample
        weights, trained ``pos``, ``neg`` ``(p, 1)`` (and the intercept).
    names : tuple of str
        ``(pos, neg, intercept, label, sample_weight, loss)``: the names of the
        objective's weights, inputs and output.
    callback : callable, optional
        ``callback(weights) -> bool`` after each L-BFGS iteration; True ends the
        fit there, unpolished.
    **lbfgs_options
        More options of :func:`~ortlearn.training.minimize_lbfgs` (``device``).

    Returns
    -------
    SolverResult
        ``weights``: ``{'coef': (n_features,), 'intercept': float}``;
        ``n_iter``: the L-BFGS iterations of all stages; ``loss``: the last
        stage's smoothed loss; ``converged``: the minimum is certified
        (:func:`is_optimal`); ``status``: ``'converged'``, ``'callback'``, or
        ``'max_iter'`` when the last stage ended uncertified;
        ``info['stage_losses']``: each stage's smoothed loss.
    """
    pos, neg, intercept_name, label, weight, loss_output = names
    X, y = problem.X, problem.y
    n_features = X.shape[1]
    trainable = [pos, neg] + ([intercept_name] if problem.fit_intercept else [])
    coef = np.zeros(n_features)
    intercept = float(np.median(y)) if problem.fit_intercept else 0.0
    weights, n_iter, losses, stopped, optimal = {}, 0, [], False, False

    def stop(w):
        nonlocal stopped
        stopped = bool(callback(w))
        return stopped

    for width in WIDTHS:
        if weights:  # warm start from the last stage's (polished) minimiser
            weights = {pos: np.maximum(coef, 0)[:, None], neg: np.maximum(-coef, 0)[:, None],
                       **({intercept_name: np.array([intercept])}
                          if problem.fit_intercept else {})}
        with warnings.catch_warnings():
            # A stage stopping short (the smoothed kink gets sharp) is no failure: the
            # next stage and the polish go on from it; the optimality check decides.
            warnings.simplefilter("ignore", ConvergenceWarning)
            result = minimize_lbfgs(
                smoothed_objective(width * problem.scale), trainable, weights or None,
                [X, y.reshape(-1, 1), problem.sample_weight], ["X", label, weight],
                loss_output=loss_output, max_iter=STAGE_MAX_ITER, tol=0.0,
                bounds={pos: (0, None), neg: (0, None)},
                callback=None if callback is None else stop, **lbfgs_options)
        weights = result.weights
        n_iter += result.n_iter
        losses.append(float(result.loss))
        coef = (weights[pos] - weights[neg])[:, 0]
        intercept = float(weights[intercept_name][0]) if problem.fit_intercept else 0.0
        if stopped:
            break
        coef, intercept = polish_vertex(problem, coef, intercept)
        optimal = is_optimal(problem, coef, intercept)
        if optimal:
            break
    status = CALLBACK if stopped else CONVERGED if optimal else MAX_ITER
    return SolverResult({"coef": coef, "intercept": intercept}, n_iter, losses[-1], optimal,
                        status, {"stage_losses": losses})
