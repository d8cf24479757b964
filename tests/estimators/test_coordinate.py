"""``OrtLasso`` / ``OrtElasticNet`` on the Gram matrix: scikit-learn's coordinate descent
sweeps the products onnxruntime formed, so a fit makes scikit-learn's sweeps on ``X``."""

import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from sklearn.datasets import load_diabetes, make_regression
from sklearn.linear_model import ElasticNet, Lasso

from ortlearn.estimators import OrtElasticNet, OrtLasso

CASES = [
    (OrtLasso, {"alpha": 0.05}),
    (OrtElasticNet, {"alpha": 0.02, "l1_ratio": 0.3}),
    (OrtLasso, {"alpha": 0.01, "fit_intercept": False}),
    (OrtLasso, {"alpha": 0.05, "positive": True}),
    (OrtLasso, {"alpha": 0.05, "selection": "random", "random_state": 3}),
]


def _diabetes():
    X, y = load_diabetes(return_X_y=True, scaled=True)
    return X, y


def _counterpart(make, **params):
    return (ElasticNet if make is OrtElasticNet else Lasso)(**params)


@pytest.mark.parametrize("make, params", CASES)
def test_a_fit_makes_scikit_learns_sweeps(make, params):
    """Default tolerance, sample weights: the same sweeps, coefficients and gap."""
    X, y = _diabetes()
    sw = np.random.RandomState(0).uniform(0.5, 2.0, len(y))
    reference = _counterpart(make, **params).fit(X, y, sample_weight=sw)
    ours = make(**params).fit(X, y, sample_weight=sw)
    assert ours.n_iter_ == reference.n_iter_ > 1
    # the same sweeps; X^T W X and the residuals round differently
    assert_allclose(ours.coef_, reference.coef_, rtol=1e-8, atol=1e-9 * np.abs(y).max())
    assert_allclose(ours.intercept_, reference.intercept_, rtol=1e-9)
    assert_allclose(ours.dual_gap_, reference.dual_gap_, rtol=1e-5)
    assert ours.dual_gap_ <= 1e-4 * np.sum(sw / sw.mean() * (y - np.average(y, weights=sw)) ** 2)


@pytest.mark.parametrize("make, params", CASES[:3])
def test_a_tight_tolerance_reaches_the_minimum(make, params):
    X, y = _diabetes()
    reference = _counterpart(make, tol=1e-14, max_iter=100_000, **params).fit(X, y)
    ours = make(tol=1e-14, max_iter=100_000, **params).fit(X, y)
    assert_allclose(ours.coef_, reference.coef_, atol=1e-7 * np.abs(reference.coef_).max())


def test_several_targets_are_swept_one_by_one():
    X, Y = make_regression(200, 8, n_targets=3, n_informative=4, noise=5.0, random_state=0)
    reference = Lasso(alpha=1.0).fit(X, Y)
    ours = OrtLasso(alpha=1.0).fit(X, Y)
    assert_allclose(ours.coef_, reference.coef_, rtol=1e-8, atol=1e-8)
    assert ours.n_iter_ == list(reference.n_iter_)
    assert_allclose(ours.dual_gap_, reference.dual_gap_, rtol=1e-5)


def test_warm_start_starts_from_the_last_coefficients():
    X, y = _diabetes()
    ours = OrtElasticNet(alpha=0.01, warm_start=True, max_iter=5)
    reference = ElasticNet(alpha=0.01, warm_start=True, max_iter=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # five sweeps do not converge
        for _ in range(3):
            ours.fit(X, y)
            reference.fit(X, y)
            assert_allclose(ours.coef_, reference.coef_, rtol=1e-8)


def test_collinear_features_reach_the_minimum():
    """A duplicated column: the sweeps still reach the minimum, without a warning."""
    X, y = _diabetes()
    X = np.hstack([X, X[:, :1]])
    reference = Lasso(alpha=0.01, tol=1e-12, max_iter=100000).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning reaches the user
        ours = OrtLasso(alpha=0.01).fit(X, y)

    def objective(model):
        residual = y - X @ model.coef_ - model.intercept_
        return 0.5 * np.mean(residual ** 2) + 0.01 * np.abs(model.coef_).sum()

    assert objective(ours) <= objective(reference) + 1e-6 * objective(reference)


def test_no_penalty_warns_as_scikit_learn():
    X, y = _diabetes()
    with pytest.warns(UserWarning, match="With alpha=0, this algorithm does not converge well"):
        ours = OrtLasso(alpha=0.0).fit(X, y)
    with pytest.warns(UserWarning, match="With alpha=0"):
        reference = Lasso(alpha=0.0).fit(X, y)
    assert ours.n_iter_ == reference.n_iter_
    assert_allclose(ours.coef_, reference.coef_, rtol=1e-8, atol=1e-9 * np.abs(y).max())
