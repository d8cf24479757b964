"""The solver of liblinear's dual problems (hinge and epsilon-insensitive losses).

The dual of each one-vs-rest problem is a bounded quadratic program, smooth: scipy's L-BFGS-B
minimises it with onnxruntime's gradient (:func:`~ortlearn.training.minimize_lbfgs`, box
bounds ``0 <= a_i <= C_i``), one run per problem as liblinear (the curvature pairs of
independent problems mixed in one run slow it down several times). A first-order method
reaches the minimum of a degenerate dual slowly; the primal is then polished exactly
(:func:`polish`): the approximate solution tells which rows are on the margin, and there the
optimality conditions are linear. The polish is tried along the way too: once its primal
meets the optimality conditions (:func:`is_primal_minimum`), L-BFGS-B stops there, long
before its own tolerance on a dual that flattens out.
"""

from __future__ import annotations

import numpy as np

from .lbfgs import minimize_lbfgs
from .result import CALLBACK, CONVERGED, MAX_ITER, SolverResult

__all__ = ["POLISH_BANDS", "POLISH_ROUNDS", "is_primal_minimum", "polish", "polish_dual",
           "polish_squared_hinge", "primal_value", "solve_svm_dual"]


#: Widths of the band of margins taken as "on the margin" by the polish.
POLISH_BANDS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7)


#: At most this many polish rounds (each from the partition of the previous one's w~).
POLISH_ROUNDS = 20

#: L-BFGS-B's iterations before the first try of the polish, and at least between two
#: (then a quarter of the iterations made: the tries cost a bounded share of the run).
POLISH_EVERY = 10

#: Rounds of the active-set polish tried along L-BFGS-B's run (a row joins or leaves the
#: kink a round): from the partition of its tenth iteration it usually finds the minimum.
TRY_ROUNDS = 40

#: Relative tolerance of :func:`is_primal_minimum` and :func:`polish_dual` (rounding of
#: float64 least squares).
CERTIFY_RTOL = 1e-9


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


def is_primal_minimum(X, y, cost, w, epsilon, rtol: float = CERTIFY_RTOL) -> bool:
    """Whether ``w`` minimises the primal of one problem to ``rtol``: a duality gap.

    At the minimum ``w = A^T beta``, each ``beta_i`` in the subgradient of its row's loss:
    ``C_i`` (times the residual's sign for the epsilon-insensitive loss) on the rows whose
    loss is positive, 0 on those whose loss is 0 around them, between on the rows at the
    kink. ``beta`` is built so from ``w`` (the rows at the kink, within ``rtol``, by least
    squares, then clipped to their bounds: a feasible dual point), and ``w`` is accepted
    when the primal at ``w`` exceeds the dual at ``beta`` by at most ``rtol`` of it: no
    ``w`` can do better by more.

    Parameters
    ----------
    X : numpy.ndarray of shape (n_samples, n_features)
    y : numpy.ndarray of shape (n_samples,)
        Signs in {-1, 1} (hinge) or targets (``epsilon`` given).
    cost : numpy.ndarray of shape (n_samples,)
    w : numpy.ndarray of shape (n_features,)
    epsilon : float or None
    rtol : float, default=CERTIFY_RTOL

    Returns
    -------
    bool
    """
    raw = X @ w
    if epsilon is None:
        A, gap = X * y[:, None], 1.0 - y * raw  # gap > 0: inside the margin, loss > 0
        signed, low, high, band = cost, np.zeros_like(cost), cost, rtol
    else:
        residual = y - raw
        A, gap = X, np.abs(residual) - epsilon
        signed = cost * np.sign(residual)
        # at the kink beta_i is between 0 and C_i sign(r_i); of either sign where epsilon is 0
        low = np.minimum(0.0, signed) if epsilon > 0 else -cost
        high = np.maximum(0.0, signed) if epsilon > 0 else cost
        band = rtol * (1.0 + float(np.abs(y).max(initial=0.0)))
    kink, active = np.abs(gap) <= band, gap > band
    beta = np.where(active, signed, 0.0)
    if kink.any():
        rest = w - A[active].T @ signed[active]
        beta[kink] = np.clip(np.linalg.lstsq(A[kink].T, rest, rcond=None)[0],
                             low[kink], high[kink])
    gain = np.ones_like(cost) if epsilon is None else y
    penalty = 0.0 if epsilon is None else epsilon * np.abs(beta).sum()
    dual = float(gain @ beta - penalty - 0.5 * np.sum((A.T @ beta) ** 2))
    primal = float(primal_value(X, y[:, None], cost[:, None], w[:, None], epsilon)[0])
    return primal - dual <= rtol * (1.0 + abs(primal))


def polish_dual(X, y, cost, dual, epsilon, rounds: int = POLISH_ROUNDS):
    """``w~`` of one problem solved exactly on the partition of rows its approximate dual gives.

    The dual variable ``b_i`` of a row is at a bound where the row's loss is positive
    (``C_i``; ``-C_i`` below the band of the epsilon-insensitive loss), 0 where its loss
    is 0 around it, and strictly between on the rows at the kink (the margin, or an edge of
    the band), where the primal's residual is fixed: ``A_F w~ = t_F`` with ``w~ = A^T b``,
    a linear system in the kink rows' ``b_F``. Solved from the partition of ``dual`` (what
    L-BFGS-B reached), then, while the solution breaks a condition (a ``b_F`` beyond its
    bounds, a bound row whose residual says otherwise), from the corrected partition, for up
    to ``rounds`` rounds (an active-set method). Returns ``w~`` when the conditions hold,
    else None.

    Parameters
    ----------
    X : numpy.ndarray of shape (n_samples, n_features)
    y : numpy.ndarray of shape (n_samples,)
        Signs in {-1, 1} (hinge) or targets (``epsilon`` given).
    cost : numpy.ndarray of shape (n_samples,)
    dual : numpy.ndarray of shape (n_samples,)
        The approximate dual: ``a`` (hinge), or ``p - m`` (epsilon-insensitive).
    epsilon : float or None
    rounds : int, default=POLISH_ROUNDS

    Returns
    -------
    numpy.ndarray of shape (n_features,) or None
    """
    hinge = epsilon is None
    A = X * y[:, None] if hinge else X
    low = np.zeros_like(cost) if hinge else -cost
    tol = CERTIFY_RTOL * (1.0 + float(cost.max(initial=0.0)))
    b = np.clip(dual, low, cost)
    free = (b > low + tol) & (b < cost - tol) & (np.abs(b) > tol)
    b[~free] = np.where(b[~free] >= cost[~free] - tol, cost[~free],
                        np.where(b[~free] <= low[~free] + tol, low[~free], 0.0))
    side = np.where(b < 0, -1.0, 1.0)  # of the band's edge a kink row is on (epsilon > 0)
    scale = 1.0 + (1.0 if hinge else float(np.abs(y).max(initial=0.0)))
    if free.sum() > X.shape[1]:
        # More kink rows than features (their equations would fix more than w~ has
        # values): the dual is still on its way; the rows farthest from a bound stay, the
        # others go to their nearest (the rounds below move back those that must not).
        values = np.stack([low, np.zeros_like(cost), cost])
        nearest = values[np.argmin(np.abs(values - b), axis=0), np.arange(len(b))]
        distance = np.where(free, np.abs(b - nearest) / np.maximum(cost, tol), -1.0)
        snapped = free & (distance < np.sort(distance)[-X.shape[1]])
        b[snapped], free[snapped] = nearest[snapped], False
    for _ in range(rounds):
        w = A[~free].T @ b[~free]
        if free.any():
            target = np.ones(free.sum()) if hinge else y[free] - side[free] * epsilon
            A_free = A[free]
            b[free] = np.linalg.lstsq(A_free @ A_free.T, target - A_free @ w, rcond=None)[0]
            w = w + A_free.T @ b[free]
        # each kink row's range: [0, C] (hinge), its side's half (epsilon > 0), [-C, C] else
        if hinge or epsilon == 0:
            lo, hi = low, cost
        else:
            lo, hi = np.where(side < 0, -cost, 0.0), np.where(side < 0, 0.0, cost)
        leaving = free & ((b < lo - tol) | (b > hi + tol))
        score = A @ w if hinge else y - X @ w  # margins, or residuals
        band = CERTIFY_RTOL * scale
        # by how much each bound row's margin or residual says it should not be at its bound
        if hinge:
            excess = np.where(b == cost, score - 1, np.where(b == 0, 1 - score, 0.0))
        else:
            excess = np.where(b == cost, epsilon - score, np.where(
                b == -cost, score + epsilon, np.where(b == 0, np.abs(score) - epsilon, 0.0)))
        excess = np.where(free, 0.0, excess)
        # the kink rows' own equations (least squares where they cannot all hold)
        if hinge:
            off = np.where(free, score - 1, 0.0)
        else:
            off = np.where(free, score - side * epsilon, 0.0)
        if not leaving.any() and excess.max(initial=0.0) <= band and np.abs(off).max() <= band:
            return w
        if not leaving.any() and excess.max(initial=0.0) <= band:
            # more kink rows than their equations allow: the worst goes to the bound its
            # margin or residual points to
            worst = int(np.argmax(np.abs(off)))
            if hinge:
                b[worst] = cost[worst] if off[worst] < 0 else 0.0
            else:
                b[worst] = (cost[worst] if score[worst] > epsilon
                            else -cost[worst] if score[worst] < -epsilon else 0.0)
            free[worst] = False
            continue
        b[leaving] = np.clip(b[leaving], lo[leaving], hi[leaving])
        free &= ~leaving
        if excess.max(initial=0.0) > band:  # the worst bound row joins the kink, one a round
            worst = int(np.argmax(excess))
            side[worst] = 1.0 if hinge or score[worst] >= 0 else -1.0
            free[worst] = True
    return None


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
        minimum = None  # the polished w~ of problem k once it is certified
        # the squared hinge's a_i is unbounded, and 0 where the row weighs nothing
        high = np.where(cost[:, [k]] > 0, np.inf, 0.0) if diagonal else cost[:, [k]]
        bounds = {name: (0.0, high) for name in trainable}
        arrays, names = [X, np.ascontiguousarray(Y[:, [k]])], ["X", label]
        if diagonal:
            arrays.append(np.ascontiguousarray(diagonal[1][:, [k]]))
            names.append(diagonal[0])

        tries = {"iteration": 0, "next": POLISH_EVERY}

        def stop(weights, k=k):
            nonlocal stopped, minimum
            if callback is not None and callback(weights, k, coef):
                stopped = True
                return True
            tries["iteration"] += 1
            if diagonal or tries["iteration"] < tries["next"]:
                return False
            tries["next"] = tries["iteration"] + max(POLISH_EVERY, tries["iteration"] // 4)
            values = [np.asarray(weights[name])[:, 0] for name in trainable]
            w = polish_dual(X, Y[:, k], cost[:, k],
                            values[0] - values[1] if len(values) == 2 else values[0], epsilon,
                            rounds=TRY_ROUNDS)
            if w is not None and is_primal_minimum(X, Y[:, k], cost[:, k], w, epsilon):
                minimum = w
                return True
            return False

        result = minimize_lbfgs(
            model, trainable, None, arrays, names,
            loss_output=loss_output, bounds=bounds, tol=tol, callback=stop, **lbfgs_options)
        n_iter, loss = max(n_iter, result.n_iter), loss + result.loss
        if stopped:
            coef[:, k] = primal(result.weights, k)
            return SolverResult(coef, n_iter, loss, False, CALLBACK)
        coef[:, k] = primal(result.weights, k) if minimum is None else minimum
        converged &= minimum is not None or bool(result.converged)
    for _ in range(0 if diagonal else POLISH_ROUNDS):  # each round's partition from the last's w~
        polished = polish(X, Y, cost, coef, epsilon)
        if np.array_equal(polished, coef):
            break
        coef = polished
    return SolverResult(coef, n_iter, loss, converged, CONVERGED if converged else MAX_ITER)
