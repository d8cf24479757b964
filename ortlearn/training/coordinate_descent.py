"""Coordinate descent on a Gram matrix: the elastic net's solver where ``X`` is tall.

scikit-learn's :class:`~sklearn.linear_model.ElasticNet` runs cyclic coordinate
descent over the columns of ``X``: a sweep costs ``2 n p`` flops. Its
``enet_path`` runs the same sweeps on the products ``X^T W X`` and ``X^T W y``
when it is given them (``precompute``, what ``LassoCV`` does when ``n > p``):
a sweep then costs ``p^2`` flops, the iterates and the duality gap are the
same in exact arithmetic, and so are the sweeps to scikit-learn's tolerance.
onnxruntime forms the products in one pass over the data
(:func:`~ortlearn.training.normal_equations.weighted_products`); this module
hands them to ``enet_path``, one target at a time as ``ElasticNet`` does.

With a callback (scikit-learn's callbacks: one subtask a sweep) each sweep is
one call of ``enet_path`` from the last one's coefficients: cyclic sweeps carry
nothing else, so the weights after ``k`` sweeps are those of ``max_iter=k``;
the duality gap is then checked after every sweep (one call checks it when the
coefficients stop moving), so such a run may stop a sweep earlier.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
from sklearn import config_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import enet_path
from sklearn.utils import check_random_state

from .result import CALLBACK, CONVERGED, MAX_ITER, SolverResult

__all__ = ["minimize_coordinate_descent"]


def _sweeps(X, y, gram, xty, l1_ratio, alpha, coef, max_iter, tol, positive, selection,
            rng):
    """``(coef, gap, n_iter)`` of ``enet_path`` on the Gram matrix at one penalty, its
    gap in the objective's units (divided by ``n_samples``); no warning. The arguments are
    valid by construction: scikit-learn's check of them would cost more than the sweeps."""
    with config_context(skip_parameter_validation=True), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        _, coefs, gaps, n_iters = enet_path(
            X, y, l1_ratio=l1_ratio, alphas=[alpha], precompute=gram, Xy=xty,
            coef_init=coef, positive=positive, check_input=False, return_n_iter=True,
            max_iter=max_iter, tol=tol, selection=selection, random_state=rng)
    return coefs[:, 0], gaps[0], n_iters[0]


def minimize_coordinate_descent(X, Y, gram, Xty, alpha: float, l1_ratio: float, *,
                                coef=None, max_iter: int = 1000, tol: float = 1e-4,
                                positive: bool = False, selection: str = "cyclic",
                                random_state=None,
                                callback: Callable | None = None) -> SolverResult:
    """Minimise ``1/(2 n) ||y - X w||^2 + alpha l1_ratio ||w||_1 + alpha (1 - l1_ratio)/2
    ||w||^2`` for each column of ``Y``, reading ``X`` only through the products.

    Parameters
    ----------
    X : numpy.ndarray of shape (n_samples, n_features)
        float64; ``enet_path`` reads only its shape when given the Gram matrix and
        ``check_input=False`` (``n`` scales the penalty).
    Y : numpy.ndarray of shape (n_samples, n_targets)
        The targets as the products saw them (scaled by the square roots of the
        sample weights); their norms scale the tolerance and enter the duality gap.
    gram : numpy.ndarray of shape (n_features, n_features)
        ``X^T W X``, float64.
    Xty : numpy.ndarray of shape (n_features, n_targets)
        ``X^T W Y``, float64.
    alpha, l1_ratio : float
        The penalty, as scikit-learn's ``ElasticNet``'s.
    coef : numpy.ndarray of shape (n_features, n_targets), optional
        Where to start (zeros by default).
    max_iter, tol, positive, selection, random_state
        As scikit-learn's: sweeps at most; stop when the duality gap is below
        ``tol * ||y||^2``; non-negative coefficients; the order of the
        coordinates.
    callback : callable, optional
        ``callback(w) -> bool`` after each sweep with every column at its sweep
        (a converged column stays where it ended); True stops.

    Returns
    -------
    SolverResult
        ``weights`` (n_features, n_targets); ``n_iter`` the sweeps of each
        column; ``converged`` whether its gap met the tolerance; ``loss`` NaN
        (the caller evaluates its objective); ``info['gap']`` each column's
        duality gap multiplied by ``n_samples`` (scikit-learn's units).

    Examples
    --------
    Orthogonal features: the least squares solution soft-thresholded, found by the
    first sweep (the second finds nothing to move and checks the gap).

    >>> import numpy as np
    >>> X = np.array([[2.0, 0.0], [0.0, 2.0], [-2.0, 0.0], [0.0, -2.0]])
    >>> Y = np.array([[5.0], [0.5], [-3.0], [-0.5]])
    >>> result = minimize_coordinate_descent(X, Y, X.T @ X, X.T @ Y, 0.5, 1.0)
    >>> result.weights.ravel().tolist(), result.n_iter.tolist(), result.status
    ([1.75, 0.0], [2], 'converged')
    """
    n_samples, n_features = X.shape
    n_targets = Y.shape[1]
    gram = np.ascontiguousarray(gram, dtype=np.float64)
    weights = (np.zeros((n_features, n_targets)) if coef is None
               else np.array(coef, dtype=np.float64).reshape(n_features, n_targets))
    columns = [np.ascontiguousarray(Y[:, k], dtype=np.float64) for k in range(n_targets)]
    products = [np.ascontiguousarray(Xty[:, k], dtype=np.float64) for k in range(n_targets)]
    bounds = np.array([tol * (y @ y) / n_samples for y in columns])
    rng = check_random_state(random_state)
    gaps, n_iter = np.zeros(n_targets), np.zeros(n_targets, dtype=int)

    def run(k, sweeps):
        w, gaps[k], done = _sweeps(X, columns[k], gram, products[k], l1_ratio, alpha,
                                   weights[:, k], sweeps, tol, positive, selection, rng)
        weights[:, k] = w
        n_iter[k] += done

    if callback is None:
        for k in range(n_targets):
            run(k, max_iter)
        converged = gaps <= bounds
        return SolverResult(weights, n_iter, float("nan"), converged,
                            CONVERGED if converged.all() else MAX_ITER,
                            {"gap": gaps * n_samples})
    converged = np.zeros(n_targets, dtype=bool)
    for _ in range(max_iter):
        for k in np.flatnonzero(~converged):
            run(k, 1)
        converged = gaps <= bounds
        if callback(weights.copy()):
            return SolverResult(weights, n_iter, float("nan"), converged, CALLBACK,
                                {"gap": gaps * n_samples})
        if converged.all():
            break
    return SolverResult(weights, n_iter, float("nan"), converged,
                        CONVERGED if converged.all() else MAX_ITER, {"gap": gaps * n_samples})
