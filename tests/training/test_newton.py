"""Newton's method on liblinear's primal objectives: the squared margins in about as many
iterations as liblinear's trust-region Newton; the hinge and epsilon-insensitive losses
smoothed, to their certified minimum."""

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
from ortlearn.training.newton import minimize_l1_margin
from ortlearn.training.svm_dual import is_primal_minimum, polish_dual, primal_value


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



# ------------------------------------------- the hinge and epsilon-insensitive losses
def _l1_problem(case):
    """(x~ with its 1, labels or targets, costs, epsilon) of a problem of each L1 loss."""
    if case == "hinge":
        X, y = _scaled(load_breast_cancer)
        return np.c_[X, np.ones(len(X))], np.where(y == 1, 1.0, -1.0), 0.5, None
    X, y = _scaled(load_diabetes)
    y = (y - y.mean()) / y.std()
    return np.c_[X, np.ones(len(X))], y, 2.0, {"epsilon 0": 0.0, "epsilon 0.3": 0.3}[case]


def _certify(X, S, cost, epsilon):
    def certify(dual, smooth, k):
        w = polish_dual(X, S[:, k], cost[:, k], dual, epsilon, rounds=3)
        ok = w is not None and is_primal_minimum(X, S[:, k], cost[:, k], w, epsilon)
        return w if ok else None
    return certify


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("case", ["hinge", "epsilon 0", "epsilon 0.3"])
def test_smoothing_reaches_liblinears_minimum(case):
    """Certified by a duality gap, at or below liblinear's dual run to tol=1e-12."""
    X, s, C, epsilon = _l1_problem(case)
    S, cost = s[:, None], np.full((len(s), 1), C)
    result = minimize_l1_margin(X, S, cost, epsilon=epsilon, max_iter=200,
                                certify=_certify(X, S, cost, epsilon))
    assert result.status == "converged" and result.converged.all()
    w = result.weights[:, 0]
    assert is_primal_minimum(X, s, cost[:, 0], w, epsilon)
    if epsilon is None:
        reference = LinearSVC(loss="hinge", C=C, tol=1e-12, max_iter=1_000_000,
                              intercept_scaling=1.0).fit(X[:, :-1], s)
    else:
        reference = LinearSVR(epsilon=epsilon, C=C, tol=1e-12, max_iter=1_000_000).fit(
            X[:, :-1], s)
    ref = np.r_[np.ravel(reference.coef_), reference.intercept_]
    ours_value = primal_value(X, S, cost, w[:, None], epsilon)[0]
    assert ours_value <= primal_value(X, S, cost, ref[:, None], epsilon)[0] * (1 + 1e-12)
    assert result.loss == pytest.approx(ours_value, rel=1e-12)
    assert result.n_iter[0] <= 60  # a few stages of a few Newton steps


def test_a_column_never_certified_is_max_iter():
    X, s, C, epsilon = _l1_problem("epsilon 0")
    S, cost = s[:, None], np.full((len(s), 1), C)
    result = minimize_l1_margin(X, S, cost, epsilon=epsilon, max_iter=7,
                                certify=lambda dual, w, k: None)
    assert result.status == "max_iter" and not result.converged.any()
    assert result.n_iter.tolist() == [7]


def test_a_callback_stops_the_smoothing_at_its_iteration():
    X, s, C, epsilon = _l1_problem("hinge")
    S, cost = s[:, None], np.full((len(s), 1), C)
    seen = []
    result = minimize_l1_margin(X, S, cost, epsilon=epsilon, max_iter=200,
                                certify=_certify(X, S, cost, epsilon),
                                callback=lambda w: seen.append(w) or len(seen) == 3)
    assert result.status == "callback" and result.n_iter.tolist() == [3]
    np.testing.assert_array_equal(result.weights, seen[-1])


def test_linear_svr_converges_where_liblinear_runs_to_max_iter():
    """A standardized target: liblinear's dual coordinate descent stops at max_iter with a
    warning (its objective above the minimum); the smoothed primal is certified."""
    from sklearn.datasets import make_regression

    X, y = make_regression(750, 20, noise=10.0, random_state=0)
    X, y = StandardScaler().fit_transform(X), (y - y.mean()) / y.std()
    with pytest.warns(Warning, match="converge"):
        reference = LinearSVR().fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        ours = OrtLinearSVR().fit(X, y)

    def objective(m):
        w = np.r_[m.coef_, m.intercept_]
        return 0.5 * w @ w + np.abs(y - X @ m.coef_ - m.intercept_).sum()

    assert ours.n_iter_ < 100 < reference.n_iter_
    assert objective(ours) < objective(reference)
    Xa = np.c_[X, np.ones(len(X))]
    assert is_primal_minimum(Xa, y, np.ones(len(y)), np.r_[ours.coef_, ours.intercept_], 0.0)
