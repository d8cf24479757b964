"""Newton's method on liblinear's squared margins: liblinear's primal solution, in about as
many iterations as its trust-region Newton."""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC, LinearSVR
from sklearn.utils.class_weight import compute_class_weight

from ortlearn.estimators import OrtLinearSVC, OrtLinearSVR
from ortlearn.exceptions import ConvergenceWarning
from ortlearn.training import minimize_squared_margin


def _scaled(load):
    X, y = load(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def _gradient(w, X, s, cost, epsilon=None):
    """The gradient of 1/2 ||w||^2 + sum_i c_i max(0, m_i)^2, in numpy (x with its 1)."""
    z = X @ w
    if epsilon is None:
        margin, slope = 1 - s * z, -s
    else:
        margin, slope = np.abs(s - z) - epsilon, -np.sign(s - z)
    return w + X.T @ (2 * cost * np.maximum(margin, 0) * slope)


def _problems(est, X, y, sw, params):
    """(w~ of each one-vs-rest problem, x~, labels, costs) of a fitted OrtLinearSVC."""
    Xa = np.c_[X, np.ones(len(X))] if params.get("fit_intercept", True) else X
    classes = est.classes_
    weights = compute_class_weight(params.get("class_weight"), classes=classes, y=y,
                                   sample_weight=sw)
    rows = []
    for k in range(est.coef_.shape[0]):
        positive = y == classes[k if len(classes) > 2 else 1]
        cost = params.get("C", 1.0) * sw * np.where(
            positive, weights[k if len(classes) > 2 else 1],
            1.0 if len(classes) > 2 else weights[0])
        rows.append((Xa, np.where(positive, 1.0, -1.0), cost))
    return rows


@pytest.mark.parametrize("load, params", [
    (load_breast_cancer, {}),
    (load_iris, {"C": 10.0, "class_weight": "balanced"}),
    (load_breast_cancer, {"C": 0.05, "fit_intercept": False}),
])
def test_liblinears_primal_minimum(load, params):
    """Ours is the minimum (gradient at rounding); scikit-learn's liblinear is within the
    distance its own gradient allows: f is 1-strongly convex, so ||w - w*|| <= ||grad f(w)||."""
    X, y = _scaled(load)
    sw = np.random.RandomState(0).uniform(0.5, 2.0, len(y))
    reference = LinearSVC(dual=False, tol=1e-12, max_iter=10000, **params).fit(
        X, y, sample_weight=sw)
    ours = OrtLinearSVC(tol=1e-10, **params).fit(X, y, sample_weight=sw)
    fit_intercept = params.get("fit_intercept", True)
    for k, (Xa, s, cost) in enumerate(_problems(ours, X, y, sw, params)):
        w = np.r_[ours.coef_[k], ours.intercept_[k]] if fit_intercept else ours.coef_[k]
        ref = (np.r_[reference.coef_[k], reference.intercept_[k]] if fit_intercept
               else reference.coef_[k])
        assert np.abs(_gradient(w, Xa, s, cost)).max() <= 1e-9
        distance = np.linalg.norm(_gradient(ref, Xa, s, cost))
        assert np.linalg.norm(w - ref) <= distance + 1e-12
    # a handful of Newton steps a problem, as liblinear's (L-BFGS took 30 to 90)
    assert ours.n_iter_ <= 15 * ours.coef_.shape[0]


def test_squared_epsilon_insensitive_regression():
    X, y = load_diabetes(return_X_y=True, scaled=True)
    y = (y - y.mean()) / y.std()
    params = {"loss": "squared_epsilon_insensitive", "epsilon": 0.5, "C": 3.0}
    reference = LinearSVR(dual=False, tol=1e-12, max_iter=10000, **params).fit(X, y)
    ours = OrtLinearSVR(tol=1e-10, **params).fit(X, y)
    Xa, cost = np.c_[X, np.ones(len(X))], np.full(len(y), 3.0)
    w = np.r_[ours.coef_, ours.intercept_]
    ref = np.r_[reference.coef_, reference.intercept_]
    assert np.abs(_gradient(w, Xa, y, cost, 0.5)).max() <= 1e-9
    assert np.linalg.norm(w - ref) <= np.linalg.norm(_gradient(ref, Xa, y, cost, 0.5))


def test_the_gradient_at_the_end_is_below_tol():
    X, y = _scaled(load_breast_cancer)
    S = np.where(y == 1, 1.0, -1.0)[:, None]
    cost = np.full_like(S, 2.0)
    result = minimize_squared_margin(X, S, cost, tol=1e-9, max_iter=50)
    w = result.weights[:, 0]
    assert result.status == "converged"
    assert np.abs(_gradient(w, X, S[:, 0], cost[:, 0])).max() <= 1e-9
    margin = np.maximum(1 - S[:, 0] * (X @ w), 0)
    assert result.loss == pytest.approx(0.5 * w @ w + np.sum(cost[:, 0] * margin ** 2))


def test_max_iter_warns_in_liblinears_words():
    X, y = _scaled(load_breast_cancer)
    with pytest.warns(ConvergenceWarning, match="Liblinear failed to converge"):
        OrtLinearSVC(max_iter=1, tol=1e-12).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        OrtLinearSVC().fit(X, y)  # the default converges

