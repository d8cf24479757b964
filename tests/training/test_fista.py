"""``ortlearn.training.minimize_fista`` alone: the lasso of an orthogonal design (whose
solution is the soft-thresholded least-squares one), columns that stop on their own,
backtracking from a low Lipschitz estimate, a callback that stops."""

import numpy as np
import pytest

from ortlearn.training import gram_largest_eigenvalue, largest_eigenvalue, minimize_fista


def _lasso(X, B, l1):
    """``1/2 ||X w - b||^2 + l1 ||w||_1`` per column: (fun, prox, gap)."""

    def fun(W):
        R = X @ W - B
        return 0.5 * float((R ** 2).sum()), X.T @ R

    def prox(V, step):
        return np.sign(V) * np.maximum(np.abs(V) - step * l1, 0.0)

    def gap(W, grad):  # the distance to the prox-gradient fixed point, per column
        return np.abs(W - prox(W - grad, 1.0)).max(axis=0)

    return fun, prox, gap


def _orthogonal(rng, n=30, p=6):
    Q, _ = np.linalg.qr(rng.standard_normal((n, p)))
    return Q * np.arange(1.0, p + 1)  # orthogonal columns of norms 1..p


def test_orthogonal_design_is_soft_thresholded_least_squares(rng):
    X = _orthogonal(rng)
    B = rng.standard_normal((30, 3)) * 3
    l1 = 0.7
    fun, prox, gap = _lasso(X, B, l1)
    top, exact = largest_eigenvalue(X, np.ones(30))
    assert exact and top == pytest.approx(36.0)
    result = minimize_fista(fun, np.zeros((6, 3)), prox, top, gap=gap, tol=np.full(3, 1e-13),
                            max_iter=10_000)
    norms2 = (X ** 2).sum(axis=0)[:, None]
    least_squares = X.T @ B / norms2
    expected = np.sign(least_squares) * np.maximum(np.abs(least_squares) - l1 / norms2, 0)
    np.testing.assert_allclose(result.weights, expected, atol=1e-12)
    assert result.converged.all() and result.status != "callback"
    assert (result.weights == 0).any()  # the prox gives exact zeros


def test_columns_stop_on_their_own(rng):
    X = _orthogonal(rng)
    B = np.column_stack([np.zeros(30), rng.standard_normal(30) * 3])
    fun, prox, gap = _lasso(X, B, 0.1)
    result = minimize_fista(fun, np.zeros((6, 2)), prox, 36.0, gap=gap,
                            tol=np.full(2, 1e-12), max_iter=10_000)
    assert result.n_iter[0] == 0 < result.n_iter[1]  # zero is optimal for the first
    assert np.all(result.weights[:, 0] == 0)


def test_backtracking_raises_a_low_estimate_to_the_same_minimum(rng):
    X = rng.standard_normal((40, 8))
    B = rng.standard_normal((40, 1))
    fun, prox, gap = _lasso(X, B, 0.5)
    top, _ = largest_eigenvalue(X, np.ones(40))
    kwargs = dict(gap=gap, tol=np.array([1e-12]), max_iter=100_000)
    exact = minimize_fista(fun, np.zeros((8, 1)), prox, top, **kwargs)
    low = minimize_fista(fun, np.zeros((8, 1)), prox, top / 50, exact_lipschitz=False, **kwargs)
    assert low.converged.all()
    np.testing.assert_allclose(low.weights, exact.weights, atol=1e-10)


def test_callback_stops_and_max_iter_counts(rng):
    X = rng.standard_normal((40, 8))
    fun, prox, gap = _lasso(X, rng.standard_normal((40, 1)), 0.01)
    seen = []
    result = minimize_fista(fun, np.zeros((8, 1)), prox, 1e3, gap=gap, tol=np.array([0.0]),
                            max_iter=50, callback=lambda x: seen.append(x.copy()) or
                            len(seen) == 3)
    assert result.status == "callback" and len(seen) == 3 and result.n_iter[0] == 3
    np.testing.assert_array_equal(result.weights, seen[-1])
    result = minimize_fista(fun, np.zeros((8, 1)), prox, 1e3, gap=gap, tol=np.array([0.0]),
                            max_iter=5)
    assert result.n_iter[0] == 5 and not result.converged[0] and result.status != "callback"


def test_power_iterations_bound_the_eigenvalue_from_below(rng):
    X = rng.standard_normal((200, 100))  # above the exact-eigenvalue width
    w = rng.uniform(0.5, 2, 200)
    estimate, exact = largest_eigenvalue(X, w)
    top = np.linalg.eigvalsh(X.T @ (w[:, None] * X))[-1]
    assert not exact and 0.5 * top < estimate <= top * (1 + 1e-12)


def test_gram_largest_eigenvalue_is_exact_then_a_lower_bound():
    rng = np.random.default_rng(0)
    for n_features, exact in ((10, True), (80, False)):
        A = rng.standard_normal((200, n_features))
        gram = A.T @ A
        top = np.linalg.eigvalsh(gram)[-1]
        estimate, is_exact = gram_largest_eigenvalue(gram)
        assert is_exact is exact
        if exact:
            assert estimate == pytest.approx(top, rel=1e-12)
        else:  # a Rayleigh quotient: below the top, and close after a few iterations
            assert 0.8 * top < estimate <= top * (1 + 1e-12)
