"""``training.coordinate_descent``: scikit-learn's sweeps on a Gram matrix, and one sweep a
callback."""

import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from sklearn.datasets import load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import ElasticNet, Lasso

from ortlearn.training.coordinate_descent import minimize_coordinate_descent
from ortlearn.training.result import CALLBACK, CONVERGED, MAX_ITER


def _problem(n_targets=1):
    X, y = load_diabetes(return_X_y=True, scaled=True)
    Y = np.stack([y * (k + 1) - 100 * k for k in range(n_targets)], axis=1)
    X, Y = X - X.mean(axis=0), Y - Y.mean(axis=0)
    return X, Y, X.T @ X, X.T @ Y


def _after(sweeps, alpha, l1_ratio, X, y):
    """scikit-learn's coefficients after ``sweeps`` sweeps on ``X`` itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = (Lasso(alpha=alpha) if l1_ratio == 1 else
                 ElasticNet(alpha=alpha, l1_ratio=l1_ratio))
        return model.set_params(max_iter=sweeps, tol=0.0, fit_intercept=False).fit(X, y).coef_


@pytest.mark.parametrize("alpha, l1_ratio", [(0.05, 1.0), (0.001, 0.4)])
def test_each_callback_sees_the_weights_of_that_many_sweeps(alpha, l1_ratio):
    X, Y, gram, Xty = _problem()
    seen = []
    result = minimize_coordinate_descent(X, Y, gram, Xty, alpha, l1_ratio,
                                         callback=lambda w: seen.append(w) or len(seen) == 4)
    assert result.status == CALLBACK and result.n_iter.tolist() == [4]
    assert len(seen) == 4 and not result.converged.any()
    for sweeps, weights in enumerate(seen, start=1):
        assert_allclose(weights[:, 0], _after(sweeps, alpha, l1_ratio, X, Y[:, 0]), rtol=1e-10,
                        atol=1e-10)
    assert_allclose(result.weights, seen[-1])


def test_with_a_callback_the_run_still_converges():
    X, Y, gram, Xty = _problem(n_targets=2)
    calls = []
    result = minimize_coordinate_descent(X, Y, gram, Xty, 0.05, 1.0,
                                         callback=lambda w: calls.append(w) and False)
    plain = minimize_coordinate_descent(X, Y, gram, Xty, 0.05, 1.0)
    assert result.status == plain.status == CONVERGED and result.converged.all()
    assert len(calls) == result.n_iter.max()
    # (the gap is checked after every sweep with a callback: it may stop sooner)
    assert (result.n_iter <= plain.n_iter).all()
    bound = 1e-4 * (Y ** 2).sum(axis=0)
    assert (result.info["gap"] <= bound).all() and (plain.info["gap"] <= bound).all()


def test_a_column_short_of_its_tolerance_is_max_iter():
    X, Y, gram, Xty = _problem(n_targets=2)
    result = minimize_coordinate_descent(X, Y, gram, Xty, 0.001, 1.0, max_iter=3, tol=1e-12)
    assert result.status == MAX_ITER
    assert result.n_iter.tolist() == [3, 3] and not result.converged.any()
    assert (result.info["gap"] > 1e-12 * (Y ** 2).sum(axis=0)).all()
