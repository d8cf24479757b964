"""FISTA with adaptive restart: the proximal-gradient solver of the L1-penalised models.

O'Donoghue & Candes (2015): accelerated proximal gradient steps of ``1 / L`` on a
smooth part whose gradient is *affine* (a least-squares objective plus an L2
term), the momentum restarted wherever it points uphill. The gradient at the
extrapolated point is then the same combination of the gradients at the last
two iterates, so each iteration needs ONE evaluation, at the iterate (the one
the stopping test reads). The columns of ``x`` are independent problems (one per
target): each stops on its own, and a stopped column stays where it stopped.

``L`` is the largest eigenvalue of the smooth part's Hessian:
:func:`largest_eigenvalue` gives it exactly for a few features, and from below
(power iterations) otherwise, where a backtracking test raises it on a step the
descent lemma rejects.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.linalg

from .result import CALLBACK, CONVERGED, MAX_ITER, SolverResult
from .sparse import is_sparse

__all__ = ["gram_largest_eigenvalue", "largest_eigenvalue", "minimize_fista"]

#: Up to this many features the Gram matrix (``n p^2`` flops) is formed and its top
#: eigenvalue computed exactly; above, a few power iterations (``2 n p`` flops each)
#: estimate it from below and the iterations' backtracking raises it where needed.
DENSE_EIGEN_MAX_FEATURES = 64
POWER_ITERATIONS = 8


def largest_eigenvalue(X, sample_weight: np.ndarray,
                       x_offset: np.ndarray | None = None) -> tuple[float, bool]:
    """``(estimate, exact)`` of the largest eigenvalue of ``Xc^T diag(sample_weight) Xc``.

    ``Xc = X - x_offset`` (a sparse ``X`` is centred implicitly, with
    ``x_offset`` its weighted column means), else ``X``. Exact up to
    :data:`DENSE_EIGEN_MAX_FEATURES` features; above, a lower bound.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[1.0, 0.0], [0.0, 2.0]])
    >>> largest_eigenvalue(X, np.ones(2))
    (4.0, True)
    """
    n_features = X.shape[1]
    offset = np.zeros(n_features) if x_offset is None else x_offset
    if n_features <= DENSE_EIGEN_MAX_FEATURES:
        weighted = X.multiply(sample_weight[:, None]) if is_sparse(X) else (
            sample_weight[:, None] * X)
        gram = np.asarray((X.T @ weighted).todense() if is_sparse(X) else X.T @ weighted)
        # the weighted means: Xc^T W Xc = X^T W X - sum(w) m m^T
        return gram_largest_eigenvalue(gram - sample_weight.sum() * np.outer(offset, offset))
    vector = np.random.RandomState(0).standard_normal(n_features)
    estimate = 0.0
    for _ in range(POWER_ITERATIONS):
        vector /= np.linalg.norm(vector) or 1.0
        weighted = sample_weight * (X @ vector - offset @ vector)
        product = X.T @ weighted - offset * weighted.sum()
        estimate = float(vector @ product)  # Rayleigh quotient: a lower bound
        vector = product
    return estimate, False


def gram_largest_eigenvalue(gram: np.ndarray) -> tuple[float, bool]:
    """``(estimate, exact)`` of the largest eigenvalue of a formed Gram matrix.

    Exact up to :data:`DENSE_EIGEN_MAX_FEATURES` features; above, a lower
    bound from a few power iterations (``p^2`` flops each, where the exact
    eigenvalue would cost ``p^3``).

    Examples
    --------
    >>> gram_largest_eigenvalue(np.array([[1.0, 0.0], [0.0, 4.0]]))
    (4.0, True)
    """
    n_features = len(gram)
    if n_features <= DENSE_EIGEN_MAX_FEATURES:
        top = scipy.linalg.eigh(gram, eigvals_only=True,
                                subset_by_index=[n_features - 1, n_features - 1])[0]
        return float(top), True
    vector = np.random.RandomState(0).standard_normal(n_features)
    estimate = 0.0
    for _ in range(POWER_ITERATIONS):
        vector /= np.linalg.norm(vector) or 1.0
        product = gram @ vector
        estimate = float(vector @ product)  # Rayleigh quotient: a lower bound
        vector = product
    return estimate, False


def minimize_fista(fun: Callable, x0: np.ndarray, prox: Callable, lipschitz: float, *,
                   gap: Callable, tol: np.ndarray, max_iter: int, exact_lipschitz: bool = True,
                   callback: Callable | None = None) -> SolverResult:
    """Minimise ``f(x) + g(x)`` column by column, ``f`` smooth with an affine gradient.

    Parameters
    ----------
    fun : callable
        ``fun(x) -> (f(x), grad f(x))`` on arrays of the shape of ``x0``.
    x0 : numpy.ndarray of shape (n, k)
        The starting point; its columns are independent problems.
    prox : callable
        ``prox(v, step)``: the proximal operator of ``step * g`` at ``v``.
    lipschitz : float
        The Lipschitz constant of ``grad f`` (the step is ``1 / lipschitz``),
        > 0; with ``exact_lipschitz=False`` a lower estimate that backtracking
        raises where a step fails the descent lemma.
    gap : callable
        ``gap(x, grad) -> (k,)``: the stopping measure of each column (a
        duality gap), from the evaluation at ``x``.
    tol : numpy.ndarray of shape (k,)
        A column stops once its gap is at most its ``tol``.
    max_iter : int
        Iterations at most.
    exact_lipschitz : bool, default=True
        Whether ``lipschitz`` is exact (no backtracking).
    callback : callable, optional
        ``callback(x) -> bool`` after each accepted iteration; True stops.

    Returns
    -------
    SolverResult
        ``weights``: the last accepted iterate ``(n, k)``; ``n_iter`` and
        ``converged``: per column (its gap fell to its ``tol``); ``loss``: the
        smooth part's value at the last evaluation; ``status``: ``'converged'``
        (every column), ``'max_iter'`` or ``'callback'``; ``info['gap']``: each
        column's stopping measure at ``weights``.

    Examples
    --------
    Least squares with an L1 penalty on one column, ``min 1/2 ||x - b||^2 + ||x||_1``:

    >>> import numpy as np
    >>> b = np.array([[3.0], [0.5], [-2.0]])
    >>> fun = lambda x: (0.5 * float(((x - b) ** 2).sum()), x - b)
    >>> prox = lambda v, step: np.sign(v) * np.maximum(np.abs(v) - step, 0.0)
    >>> gap = lambda x, grad: np.abs(x - prox(x - grad, 1.0)).max(axis=0)
    >>> result = minimize_fista(fun, np.zeros((3, 1)), prox, 1.0, gap=gap,
    ...                         tol=np.array([1e-12]), max_iter=100)
    >>> result.weights.ravel().tolist(), bool(result.converged[0])
    ([2.0, 0.0, -1.0], True)
    """
    eps = np.finfo(np.float64).eps
    n_columns = x0.shape[1]

    def evaluate(w):
        loss, grad = fun(w)
        return loss, grad, gap(w, grad)

    coef = x0
    loss, grad, current_gap = evaluate(coef)
    n_iter = np.zeros(n_columns, dtype=np.int64)
    active = ~(current_gap <= tol)
    momentum_t = np.ones(n_columns)
    point, point_grad = coef, grad  # the extrapolated point and its gradient
    iteration, stopped = 0, False
    while active.any() and iteration < max_iter:
        iteration += 1
        new = prox(point - point_grad / lipschitz, 1.0 / lipschitz)
        new[:, ~active] = coef[:, ~active]  # converged columns stay where they stopped
        loss, new_grad, new_gap = evaluate(new)
        if not exact_lipschitz:
            # Backtracking, exact for a quadratic: the curvature along the step is
            # (g(new) - g(point)) . d / d . d; above the step's 1/L the descent lemma
            # fails: the step is rejected and L raised (a rounding margin keeps tiny
            # steps from being rejected for noise).
            step = new - point
            length2 = float(np.einsum("jk,jk->", step, step))
            change = new_grad - point_grad
            curvature = float(np.einsum("jk,jk->", change, step))
            noise = 1e3 * eps * np.sqrt(length2) * (np.linalg.norm(new_grad)
                                                    + np.linalg.norm(point_grad))
            if curvature - lipschitz * length2 > 1e-6 * lipschitz * length2 + noise:
                lipschitz = max(2 * lipschitz, curvature / length2)
                point, point_grad, momentum_t = coef, grad, np.ones(n_columns)
                n_iter[active] = iteration
                continue
        # Restart where the momentum points uphill (gradient scheme).
        restart = np.einsum("jk,jk->k", point - new, new - coef) > 0
        momentum_t = np.where(restart, 1.0, momentum_t)
        next_t = (1 + np.sqrt(1 + 4 * momentum_t ** 2)) / 2
        beta = (momentum_t - 1) / next_t
        # The gradient is affine in x: its value at the extrapolated point is the
        # same combination of the gradients at the two iterates (no second call).
        point = new + beta * (new - coef)
        point_grad = new_grad + beta * (new_grad - grad)
        coef, grad, momentum_t = new, new_grad, next_t
        current_gap = np.where(active, new_gap, current_gap)
        n_iter[active] = iteration
        active &= ~(new_gap <= tol)
        if callback is not None and callback(coef):
            stopped = True
            break
    status = CALLBACK if stopped else MAX_ITER if active.any() else CONVERGED
    return SolverResult(coef, n_iter, float(loss), ~active, status, {"gap": current_gap})
