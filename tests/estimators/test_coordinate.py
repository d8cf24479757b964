"""``OrtLasso`` / ``OrtElasticNet`` on the Gram matrix: LARS follows the solution path to
``alpha`` exactly; FISTA takes over where the path degenerates (and solves ``positive``
fits, whose LARS variant leaves the path)."""

import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from sklearn.datasets import load_diabetes, make_regression
from sklearn.linear_model import ElasticNet, Lasso

from ortlearn.estimators import OrtElasticNet, OrtLasso


def _diabetes():
    X, y = load_diabetes(return_X_y=True, scaled=True)
    return X, y


@pytest.mark.parametrize("make, params", [
    (OrtLasso, {"alpha": 0.05}),
    (OrtElasticNet, {"alpha": 0.02, "l1_ratio": 0.3}),
    (OrtLasso, {"alpha": 0.01, "fit_intercept": False}),
])
def test_the_path_ends_at_scikit_learns_minimum(make, params):
    X, y = _diabetes()
    sw = np.random.RandomState(0).uniform(0.5, 2.0, len(y))
    counterpart = (ElasticNet if make is OrtElasticNet else Lasso)(tol=1e-14, max_iter=100000,
                                                                   **params)
    reference = counterpart.fit(X, y, sample_weight=sw)
    ours = make(**params).fit(X, y, sample_weight=sw)
    # LARS is exact: scikit-learn's coordinate descent run to tol=1e-14 is the reference
    assert_allclose(ours.coef_, reference.coef_, atol=1e-7 * np.abs(reference.coef_).max())
    assert_allclose(ours.intercept_, reference.intercept_, rtol=1e-9)
    # a step per feature entering or leaving: about n_features, not hundreds of sweeps
    assert 1 <= ours.n_iter_ <= 3 * X.shape[1]
    assert ours.dual_gap_ <= 1e-4 * np.sum(sw / sw.mean() * (y - np.average(y, weights=sw)) ** 2)


def test_several_targets_follow_their_own_paths():
    X, Y = make_regression(200, 8, n_targets=3, n_informative=4, noise=5.0, random_state=0)
    reference = Lasso(alpha=1.0, tol=1e-14, max_iter=100000).fit(X, Y)
    ours = OrtLasso(alpha=1.0).fit(X, Y)
    assert_allclose(ours.coef_, reference.coef_, atol=1e-7 * np.abs(reference.coef_).max())
    assert len(ours.n_iter_) == 3


def test_collinear_features_fall_back_to_fista():
    """A duplicated column makes the path degenerate: the fit still reaches the minimum."""
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
