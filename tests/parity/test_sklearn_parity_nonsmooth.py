"""The non-smooth linear models against their scikit-learn counterparts.

``OrtLasso`` / ``OrtElasticNet`` (FISTA, the gradient from onnxruntime) and
``OrtLinearSVC`` / ``OrtLinearSVR`` (L-BFGS on liblinear's primal, or L-BFGS-B
on its dual for the non-smooth losses) and ``OrtQuantileRegressor`` (smoothing
continuation and a vertex polish, against HiGHS's linear program) reach the counterpart's objective
(computed by one numpy formula from each model's fitted attributes) within
1e-6 relative, take the counterpart's parameters, and pass scikit-learn's
estimator checks.
"""

import warnings

import numpy as np
import pytest
import scipy.sparse
from counterparts import (
    RTOL,
    assert_reaches,
    check_counterpart_parameters,
    fit_both,
    sample_weights,
)
from numpy.testing import assert_array_equal
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris, make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import ElasticNet, Lasso, QuantileRegressor
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC, LinearSVR
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.estimator_checks import parametrize_with_checks

import ortlearn.estimators._svm as svm_module
from ortlearn.estimators import (
    OrtElasticNet,
    OrtLasso,
    OrtLinearSVC,
    OrtLinearSVR,
    OrtQuantileRegressor,
)
from ortlearn.training.svm_dual import polish_squared_hinge

PAIRS = [
    (OrtLasso, Lasso),
    (OrtElasticNet, ElasticNet),
    (OrtLinearSVC, LinearSVC),
    (OrtLinearSVR, LinearSVR),
    (OrtQuantileRegressor, QuantileRegressor),
]


# scipy's and scikit-learn's solvers on one BLAS thread (conftest.py)
pytestmark = pytest.mark.usefixtures("one_blas_thread")


_CACHE = {}


def _data(name):
    if name not in _CACHE:
        if name == "breast_cancer":
            X, y = load_breast_cancer(return_X_y=True)
            X = StandardScaler().fit_transform(X)
        elif name == "iris":
            X, y = load_iris(return_X_y=True)
        elif name == "diabetes":
            X, y = load_diabetes(return_X_y=True)
        elif name == "diabetes_scaled":
            X, y = load_diabetes(return_X_y=True)
            X = StandardScaler().fit_transform(X)
        elif name == "regression":
            X, y = make_regression(n_samples=300, n_features=40, n_informative=8,
                                   n_targets=2, noise=5.0, random_state=0)
        elif name == "wide":  # more features than the exact eigenvalue takes: backtracking
            X, y = make_regression(n_samples=200, n_features=150, n_informative=10,
                                   noise=5.0, random_state=1)
        elif name == "wider":  # more features than rows: onnxruntime evaluates each step
            X, y = make_regression(n_samples=100, n_features=150, n_informative=10,
                                   noise=5.0, random_state=1)
        _CACHE[name] = (X, y)
    return _CACHE[name]


# ------------------------------------------------------------ parameters
@pytest.mark.parametrize("ort_cls, sk_cls", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_counterpart_parameters(ort_cls, sk_cls):
    check_counterpart_parameters(ort_cls, sk_cls)


# ------------------------------------------------------------ elastic net
def _enet_objective(est, X, y, alpha, l1_ratio, sample_weight):
    sw = sample_weight * len(y) / sample_weight.sum()
    coef = np.atleast_2d(est.coef_)
    residual = y.reshape(len(y), -1) - X @ coef.T - est.intercept_
    return (0.5 * (sw[:, None] * residual ** 2).sum() / len(y)
            + alpha * l1_ratio * np.abs(coef).sum()
            + 0.5 * alpha * (1 - l1_ratio) * (coef ** 2).sum())


@pytest.mark.parametrize("ort_cls, sk_cls", PAIRS[:2], ids=["lasso", "enet"])
@pytest.mark.parametrize("dataset, params, weighted", [
    ("diabetes", {"alpha": 0.01, "tol": 1e-8}, False),
    ("diabetes", {"alpha": 0.1}, False),
    ("diabetes", {"alpha": 0.003, "positive": True, "tol": 1e-8}, True),
    ("diabetes", {"alpha": 0.01, "fit_intercept": False, "tol": 1e-8}, False),
    ("regression", {"alpha": 0.5, "tol": 1e-8}, True),
    ("wide", {"alpha": 0.3, "tol": 1e-8}, False),
    ("wider", {"alpha": 0.3, "tol": 1e-8}, True),
])
def test_enet_objective(ort_cls, sk_cls, dataset, params, weighted):
    X, y = _data(dataset)
    sw, weights = sample_weights(len(y), weighted)
    params = {"max_iter": 100_000, **params}
    ort, sk = fit_both(ort_cls, sk_cls, X, y, sw, **params)
    l1_ratio = 1.0 if sk_cls is Lasso else 0.5
    ours = _enet_objective(ort, X, y, params["alpha"], l1_ratio, weights)
    theirs = _enet_objective(sk, X, y, params["alpha"], l1_ratio, weights)
    assert_reaches(ours, theirs)
    assert ort.coef_.shape == sk.coef_.shape
    assert np.shape(ort.intercept_) == np.shape(sk.intercept_)
    assert np.shape(ort.dual_gap_) == np.shape(sk.dual_gap_)
    assert type(ort.n_iter_) is type(sk.n_iter_)
    tol = params.get("tol", 1e-4) * (np.atleast_2d(y.T) ** 2).sum(axis=1) / len(y)
    # the gap is below scikit-learn's tolerance (on the centred, weighted y: a bound)
    assert np.all(np.asarray(ort.dual_gap_) <= tol)
    if params.get("tol") == 1e-8:  # converged: the same exact zeros
        assert_array_equal(ort.coef_ == 0, sk.coef_ == 0)


def test_enet_backtracking_recovers_a_low_step_estimate(monkeypatch):
    """One power iteration underestimates L: the backtracking test raises it, same minimum."""
    from ortlearn.training import fista

    monkeypatch.setattr(fista, "POWER_ITERATIONS", 1)
    X, y = _data("wide")
    ort, sk = fit_both(OrtLasso, Lasso, X, y, alpha=0.3, tol=1e-8, max_iter=100_000)
    weights = np.ones(len(y))
    assert_reaches(_enet_objective(ort, X, y, 0.3, 1.0, weights),
                    _enet_objective(sk, X, y, 0.3, 1.0, weights))


def test_enet_max_iter_warns_and_counts():
    X, y = _data("diabetes")
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        reg = OrtLasso(alpha=0.001, max_iter=3, tol=1e-12).fit(X, y)
    assert reg.n_iter_ == 3


def test_enet_warm_start_converged_is_zero_iterations():
    X, y = _data("diabetes")
    reg = OrtElasticNet(alpha=0.01, warm_start=True).fit(X, y)
    coef = reg.coef_.copy()
    reg.fit(X, y)
    assert reg.n_iter_ == 0
    assert_array_equal(reg.coef_, coef)


# ------------------------------------------------------------------- SVMs
def _svc_objective(est, X, y, C, loss, class_weight, scaling, sample_weight):
    classes = est.classes_
    index = np.searchsorted(classes, y)
    cw = compute_class_weight(class_weight, classes=classes, y=y, sample_weight=sample_weight)
    coef = np.atleast_2d(est.coef_)
    intercept = np.broadcast_to(est.intercept_, coef.shape[:1])
    total = 0.0
    for k in range(coef.shape[0]):
        positive = index == (1 if coef.shape[0] == 1 else k)
        cost = C * sample_weight * (cw[index] if coef.shape[0] == 1
                                    else np.where(positive, cw[k], 1.0))
        hinge = np.maximum(0, 1 - np.where(positive, 1.0, -1.0) * (X @ coef[k] + intercept[k]))
        total += (0.5 * (coef[k] @ coef[k] + (intercept[k] / scaling) ** 2)
                  + (cost * (hinge ** 2 if loss == "squared_hinge" else hinge)).sum())
    return total


def _svr_objective(est, X, y, C, loss, epsilon, scaling, sample_weight):
    intercept = np.ravel(est.intercept_)[0]
    excess = np.maximum(0, np.abs(y - X @ est.coef_ - intercept) - epsilon)
    return (0.5 * (est.coef_ @ est.coef_ + (intercept / scaling) ** 2)
            + C * (sample_weight * (excess ** 2 if loss.startswith("squared") else excess)).sum())


@pytest.mark.parametrize("dataset, params, weighted", [
    ("breast_cancer", {}, False),
    ("breast_cancer", {"loss": "hinge"}, False),
    ("breast_cancer", {"C": 0.1, "class_weight": "balanced"}, True),
    ("iris", {}, False),
    ("iris", {"loss": "hinge"}, False),
    ("iris", {"C": 0.1, "class_weight": {0: 2.0, 2: 0.5}, "intercept_scaling": 3.0}, True),
    ("iris", {"fit_intercept": False}, False),
])
def test_svc_objective(dataset, params, weighted):
    X, y = _data(dataset)
    sw, weights = sample_weights(len(y), weighted)
    ort, sk = fit_both(OrtLinearSVC, LinearSVC, X, y, sw, **params)
    args = (X, y, params.get("C", 1.0), params.get("loss", "squared_hinge"),
            params.get("class_weight"), params.get("intercept_scaling", 1.0), weights)
    assert_reaches(_svc_objective(ort, *args), _svc_objective(sk, *args))
    assert ort.coef_.shape == sk.coef_.shape
    assert np.shape(ort.intercept_) == np.shape(sk.intercept_)
    assert isinstance(ort.n_iter_, int)
    assert_array_equal(ort.classes_, sk.classes_)
    assert np.mean(ort.predict(X) == sk.predict(X)) >= 0.98


def _wide_rows(sparse):
    """Fewer rows than columns: 60 rows of 3 000 sparse columns, or 40 dense rows of 600."""
    rng = np.random.default_rng(0)
    if sparse:
        X = scipy.sparse.random(60, 3000, density=0.01, format="csr", random_state=0)
    else:
        X = rng.standard_normal((40, 600))
    return X, np.arange(X.shape[0]) % 3


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("params, weighted", [
    ({}, False),
    ({"C": 0.1, "class_weight": "balanced", "intercept_scaling": 2.0}, True),
    ({"fit_intercept": False}, False),
])
def test_svc_wide_data_solves_the_squared_hinge_dual(sparse, params, weighted, monkeypatch):
    """Fewer rows than columns (scikit-learn's dual='auto' rule): the squared hinge's dual
    through the rows' Gram matrix, its support solved exactly, reaches liblinear's minimum
    (3 classes, weighted rows, one of them weighing nothing); dual=False solves the primal,
    to the same minimum."""
    X, y = _wide_rows(sparse)
    sw, weights = sample_weights(len(y), weighted)
    if weighted:
        sw[3] = weights[3] = 0.0
    polished = []
    monkeypatch.setattr(svm_module, "polish_squared_hinge",
                        lambda *a: polished.append(1) or polish_squared_hinge(*a))
    ort, sk = fit_both(OrtLinearSVC, LinearSVC, X, y, sw, tol=1e-8, max_iter=100_000,
                       **params)
    args = (X, y, params.get("C", 1.0), "squared_hinge", params.get("class_weight"),
            params.get("intercept_scaling", 1.0), weights)
    assert polished and ort.coef_.shape == (3, X.shape[1])
    assert abs(_svc_objective(ort, *args) - _svc_objective(sk, *args)) <= 1e-9 * abs(
        _svc_objective(sk, *args))
    assert abs(ort.loss_ - _svc_objective(sk, *args)) <= 1e-9 * abs(_svc_objective(sk, *args))
    primal, _ = fit_both(OrtLinearSVC, LinearSVC, X, y, sw, dual=False, **params)
    assert len(polished) == 1
    assert_reaches(_svc_objective(primal, *args), _svc_objective(sk, *args))


@pytest.mark.parametrize("dataset", ["breast_cancer", "iris"])
def test_svc_hinge_reaches_the_converged_minimum(dataset):
    """The dual + polish reach the minimum liblinear reaches only with a tight tol (1e-10)."""
    X, y = _data(dataset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        sk = LinearSVC(loss="hinge", tol=1e-10, max_iter=300_000, random_state=0).fit(X, y)
    ort = OrtLinearSVC(loss="hinge").fit(X, y)
    args = (X, y, 1.0, "hinge", None, 1.0, np.ones(len(y)))
    ours, theirs = _svc_objective(ort, *args), _svc_objective(sk, *args)
    assert abs(ours - theirs) / theirs <= RTOL, (ours, theirs)


@pytest.mark.parametrize("params, weighted", [
    ({}, False),
    ({"epsilon": 5.0, "C": 10.0}, True),
    ({"loss": "squared_epsilon_insensitive"}, False),
    ({"loss": "squared_epsilon_insensitive", "epsilon": 10.0, "C": 0.1,
      "intercept_scaling": 2.0}, True),
])
def test_svr_objective(params, weighted):
    X, y = _data("diabetes_scaled")
    sw, weights = sample_weights(len(y), weighted)
    ort, sk = fit_both(OrtLinearSVR, LinearSVR, X, y, sw, **params)
    args = (X, y, params.get("C", 1.0), params.get("loss", "epsilon_insensitive"),
            params.get("epsilon", 0.0), params.get("intercept_scaling", 1.0), weights)
    assert_reaches(_svr_objective(ort, *args), _svr_objective(sk, *args))
    assert ort.coef_.shape == sk.coef_.shape
    assert np.shape(ort.intercept_) == np.shape(sk.intercept_)


def _quantile_objective(est, X, y, quantile, alpha, sample_weight):
    residual = y - X @ est.coef_ - est.intercept_
    pinball = np.maximum(quantile * residual, (quantile - 1) * residual)
    return sample_weight @ pinball / sample_weight.sum() + alpha * np.abs(est.coef_).sum()


@pytest.mark.parametrize("dataset, params, weighted", [
    ("diabetes", {"alpha": 0.01}, False),
    ("diabetes", {"quantile": 0.8, "alpha": 0.1}, True),
    ("regression_1", {"quantile": 0.3, "alpha": 0.05}, False),
    ("regression_1", {"alpha": 0.5, "fit_intercept": False}, True),
])
def test_quantile_objective(dataset, params, weighted):
    if dataset == "regression_1":
        X, y = _data("regression")
        y = y[:, 0]
    else:
        X, y = _data(dataset)
    sw, weights = sample_weights(len(y), weighted)
    ort, sk = fit_both(OrtQuantileRegressor, QuantileRegressor, X, y, sw, **params)
    args = (X, y, params.get("quantile", 0.5), params["alpha"], weights)
    assert_reaches(_quantile_objective(ort, *args), _quantile_objective(sk, *args))
    assert ort.coef_.shape == sk.coef_.shape
    assert np.shape(ort.intercept_) == np.shape(sk.intercept_)
    assert ort.loss_ == pytest.approx(_quantile_objective(ort, *args), rel=1e-12)


@pytest.mark.parametrize("est, match", [
    (OrtLinearSVC(penalty="l1", dual=False), "penalty='l1'"),
    (OrtLinearSVC(multi_class="crammer_singer"), "crammer_singer"),
    (OrtLinearSVC(loss="hinge", dual=False), "dual=False"),
    (OrtLinearSVR(dual=False), "dual=False"),
    (OrtQuantileRegressor(solver="interior-point"), "interior-point"),
    (OrtQuantileRegressor(solver_options={"presolve": False}), "solver_options"),
])
def test_unsupported_values_raise(est, match):
    X, y = _data("iris")
    with pytest.raises(ValueError, match=match):
        est.fit(X, y)


def test_to_onnx_predicts_as_predict():
    import onnxruntime

    X, y = _data("iris")
    for est in (OrtLinearSVC().fit(X, y), OrtLasso(alpha=0.1).fit(X, X[:, 0])):
        session = onnxruntime.InferenceSession(est.to_onnx().SerializeToString(),
                                               providers=["CPUExecutionProvider"])
        out = session.run(None, {"X": X})
        if isinstance(est, OrtLinearSVC):
            assert_array_equal(out[0], est.predict(X))
        else:
            np.testing.assert_allclose(out[0].ravel(), est.predict(X), rtol=1e-10)


@parametrize_with_checks([
    OrtLasso(max_iter=50),
    OrtElasticNet(max_iter=50),
    OrtLinearSVC(max_iter=20),
    OrtLinearSVR(max_iter=20),
    OrtQuantileRegressor(),
])
def test_sklearn_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check(estimator)
