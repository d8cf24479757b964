"""``training.lars``: the Lasso's path on a Gram matrix, and the paths kept for a search."""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_diabetes, make_regression
from sklearn.linear_model import Lasso, lars_path_gram

from ortlearn.training import lars
from ortlearn.training.lars import minimize_lars


def _problem(name):
    if name == "diabetes":
        X, y = load_diabetes(return_X_y=True)
    elif name == "wide":  # more features than the path has steps before it degenerates
        X, y = make_regression(60, 40, n_informative=12, noise=5.0, random_state=0)
    else:  # two equal columns: the path degenerates (scikit-learn warns)
        X, y = make_regression(50, 6, noise=1.0, random_state=1)
        X = np.hstack([X, X[:, :1]])
    X = X - X.mean(axis=0)
    y = y - y.mean()
    return X.T @ X, (X.T @ y)[:, None], len(X)


def _direct(gram, xty, n, alpha, max_iter):
    """scikit-learn's path down to alpha: what minimize_lars returns, bit for bit."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            alphas, _, coefs = lars_path_gram(xty[:, 0], gram, n_samples=n, alpha_min=alpha,
                                              method="lasso", max_iter=max_iter)
        except Warning:
            return None
    return alphas, coefs


@pytest.mark.parametrize("name", ["diabetes", "wide", "collinear"])
def test_paths_read_from_kept_ones_are_scikit_learns_bit_for_bit(name):
    """Sequences of penalties (a search's grid points, in every order), max_iter short and
    long: each fit's weights, steps and status equal a path computed down to its penalty
    alone, whether the kept path of an earlier fit was read or not."""
    gram, xty, n = _problem(name)
    full = _direct(gram, xty, n, 0.0, 1000)
    breaks = full[0] if full is not None else np.array([1.0])
    candidates = np.concatenate([breaks, breaks * (1 + 1e-4), breaks * (1 - 1e-4),
                                 np.geomspace(1e-6, 2 * breaks[0], 15), [0.0]])
    rng = np.random.default_rng(0)
    reads = 0
    for _ in range(25):
        lars._PATHS.clear()
        max_iter = int(rng.choice([3, 8, 1000]))
        for alpha in rng.choice(candidates, size=6):
            alpha = float(alpha)
            before = len(lars._PATHS)
            got = minimize_lars(gram, xty, n, alpha, max_iter=max_iter)
            reads += before == len(lars._PATHS) == 1
            expected = _direct(gram, xty, n, alpha, max_iter)
            if expected is None:
                assert not got.converged[0]
                continue
            alphas, coefs = expected
            np.testing.assert_array_equal(got.weights[:, 0], coefs[:, -1])
            assert got.n_iter[0] == coefs.shape[1] - 1
            assert bool(got.converged[0]) == bool(alphas[-1] <= alpha * (1 + 1e-12))
    assert reads > 20  # the kept paths were read, not only computed again


def test_a_path_is_kept_per_problem_and_read_by_a_later_penalty(monkeypatch):
    gram, xty, n = _problem("diabetes")
    lars._PATHS.clear()
    calls = []
    real = lars.lars_path_gram
    monkeypatch.setattr(lars, "lars_path_gram", lambda *a, **k: calls.append(k) or real(*a, **k))
    for alpha in (0.01, 0.1, 1.0, 0.5):
        minimize_lars(gram, xty, n, alpha, max_iter=1000)
    assert [k["alpha_min"] for k in calls] == [0.01]  # the deepest first: one path
    minimize_lars(gram, 2 * xty, n, 0.1, max_iter=1000)  # another problem: its own path
    minimize_lars(gram, xty, n, 0.1, max_iter=20)  # another max_iter: its own path
    minimize_lars(gram, xty, n, 0.01, max_iter=1000)  # a fit again: computed again
    assert [k["alpha_min"] for k in calls] == [0.01, 0.1, 0.1, 0.01]


def test_the_lasso_is_scikit_learns_at_each_grid_point():
    """OrtLasso through the kept paths: scikit-learn's coefficients at each penalty."""
    from ortlearn.estimators import OrtLasso

    X, y = load_diabetes(return_X_y=True)
    for alpha in (0.01, 0.1, 1.0, 0.03):
        ours = OrtLasso(alpha=alpha).fit(X, y)
        theirs = Lasso(alpha=alpha, tol=1e-10, max_iter=100_000).fit(X, y)
        np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=1e-6, atol=1e-8)
