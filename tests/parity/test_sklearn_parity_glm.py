"""The full-batch smooth linear models against their scikit-learn counterparts.

``OrtLogisticRegression``, ``OrtRidge``, ``OrtPoissonRegressor``,
``OrtGammaRegressor``, ``OrtTweedieRegressor`` and ``OrtHuberRegressor``
reach the counterpart's objective (computed by one numpy formula from each
model's fitted attributes) within 1e-6 relative, predict the same, take the
counterpart's parameters, and pass scikit-learn's estimator checks.
"""

import warnings

import numpy as np
import pytest
from counterparts import (
    assert_reaches,
    check_counterpart_parameters,
    fit_both,
    sample_weights,
)
from numpy.testing import assert_allclose, assert_array_equal
from scipy import sparse
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import (
    GammaRegressor,
    HuberRegressor,
    LogisticRegression,
    PoissonRegressor,
    Ridge,
    TweedieRegressor,
)
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.estimator_checks import parametrize_with_checks

from ortlearn.estimators import (
    OrtGammaRegressor,
    OrtHuberRegressor,
    OrtLogisticRegression,
    OrtPoissonRegressor,
    OrtRidge,
    OrtTweedieRegressor,
)

PAIRS = [
    (OrtLogisticRegression, LogisticRegression),
    (OrtRidge, Ridge),
    (OrtPoissonRegressor, PoissonRegressor),
    (OrtGammaRegressor, GammaRegressor),
    (OrtTweedieRegressor, TweedieRegressor),
    (OrtHuberRegressor, HuberRegressor),
]


# scipy's and scikit-learn's solvers on one BLAS thread (conftest.py)
pytestmark = pytest.mark.usefixtures("one_blas_thread")


# ----------------------------------------------------------------- data
def _scaled(X):
    return StandardScaler().fit_transform(X)


_CACHE = {}


def _data(name):
    if name not in _CACHE:
        if name == "breast_cancer":
            X, y = load_breast_cancer(return_X_y=True)
        elif name == "digits":
            X, y = load_digits(return_X_y=True)
        elif name == "diabetes":
            X, y = load_diabetes(return_X_y=True)
        elif name == "regression":  # seeded, positive targets for the GLMs
            X, y = make_regression(n_samples=1000, n_features=10, noise=10.0,
                                   random_state=0)
            y = np.exp(y / y.std())
        elif name == "outliers":  # seeded, 2.5 % gross outliers for Huber
            X, y = make_regression(n_samples=2000, n_features=20, noise=5.0, random_state=0)
            y = y.copy()
            y[:50] += 500
        _CACHE[name] = (_scaled(X) if name != "outliers" else X, y)
    return _CACHE[name]


# ------------------------------------------------------------ objectives
def _logistic_objective(est, X, y, C, sample_weight):
    raw = X @ est.coef_.T + est.intercept_
    if raw.shape[1] == 1:
        target = (y == est.classes_[1]).astype(float)
        loss = np.logaddexp(0, raw[:, 0]) - target * raw[:, 0]
    else:
        index = np.searchsorted(est.classes_, y)
        loss = np.logaddexp.reduce(raw, axis=1) - raw[np.arange(len(y)), index]
    sw_sum = sample_weight.sum()
    penalty = 0.0 if C == np.inf else 0.5 / (C * sw_sum) * (est.coef_ ** 2).sum()
    return (sample_weight * loss).sum() / sw_sum + penalty


def _ridge_objective(est, X, y, alpha, sample_weight):
    coef = np.atleast_2d(est.coef_)
    residual = (y.reshape(len(y), -1) - X @ coef.T - est.intercept_)
    return ((sample_weight[:, None] * residual ** 2).sum()
            + (np.asarray(alpha) * (coef ** 2).sum(axis=1)).sum())


def _glm_objective(est, X, y, power, link, alpha, sample_weight):
    raw = X @ est.coef_ + est.intercept_
    if link == "identity":
        dev = 0.5 * (y - raw) ** 2
    elif power == 1:
        dev = np.exp(raw) - y * raw
    elif power == 2:
        dev = raw + y * np.exp(-raw)
    else:
        dev = (np.exp((2 - power) * raw) / (2 - power)
               - y * np.exp((1 - power) * raw) / (1 - power))
    return np.average(dev, weights=sample_weight) + 0.5 * alpha * est.coef_ @ est.coef_


def _huber_objective(est, X, y, epsilon, alpha, sample_weight):
    z = (y - X @ est.coef_ - est.intercept_) / est.scale_
    H = np.where(np.abs(z) <= epsilon, z ** 2, 2 * epsilon * np.abs(z) - epsilon ** 2)
    return ((sample_weight * (est.scale_ + est.scale_ * H)).sum()
            + alpha * est.coef_ @ est.coef_)


# ------------------------------------------------------------ parameters
@pytest.mark.parametrize("ort_cls, sk_cls", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_counterpart_parameters(ort_cls, sk_cls):
    added = ["device"]
    if ort_cls is OrtLogisticRegression:  # the mini-batch solvers' (MLPClassifier's idea)
        added += ["batch_size", "learning_rate", "eta0", "power_t", "momentum",
                  "nesterovs_momentum", "beta_1", "beta_2", "shuffle", "early_stopping",
                  "validation_fraction", "n_iter_no_change"]
    check_counterpart_parameters(ort_cls, sk_cls, added)


# ---------------------------------------------------- logistic regression
def _class_weights(class_weight, classes, y, sample_weight):
    """Per-row class weights, as scikit-learn 1.9 computes them (weighted counts)."""
    if class_weight is None:
        return np.ones(len(y))
    weights = compute_class_weight(class_weight, classes=classes, y=y,
                                   sample_weight=sample_weight)
    return weights[np.searchsorted(classes, y)]


@pytest.mark.parametrize("dataset, params, weighted", [
    ("breast_cancer", {}, False),
    ("breast_cancer", {"C": 0.05, "class_weight": "balanced"}, True),
    ("breast_cancer", {"fit_intercept": False}, False),
    ("digits", {}, False),
    ("digits", {"C": 0.1, "class_weight": {0: 2.0, 3: 0.5}}, True),
])
def test_logistic_objective(dataset, params, weighted):
    X, y = _data(dataset)
    sw, weights = sample_weights(len(y), weighted)
    ort, sk = fit_both(OrtLogisticRegression, LogisticRegression, X, y, sw, **params)
    weights = weights * _class_weights(params.get("class_weight"), sk.classes_, y, weights)
    C = params.get("C", 1.0)
    assert_reaches(_logistic_objective(ort, X, y, C, weights),
                    _logistic_objective(sk, X, y, C, weights))
    assert ort.coef_.shape == sk.coef_.shape and ort.intercept_.shape == sk.intercept_.shape
    assert ort.n_iter_.shape == sk.n_iter_.shape == (1,)
    assert_array_equal(ort.classes_, sk.classes_)
    assert_array_equal(ort.predict(X), sk.predict(X))
    assert_allclose(ort.predict_proba(X), sk.predict_proba(X), atol=1e-5)
    assert_allclose(ort.decision_function(X), sk.decision_function(X), rtol=1e-4, atol=1e-4)


def test_logistic_digits_accuracy_as_sklearn():
    """Unscaled digits, default max_iter: the held-out accuracy of LogisticRegression."""
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        sk = LogisticRegression().fit(X_train, y_train)
        ort = OrtLogisticRegression().fit(X_train, y_train)
    assert ort.n_iter_[0] == sk.n_iter_[0] == 100  # neither converges in 100 iterations
    assert ort.score(X_test, y_test) == pytest.approx(sk.score(X_test, y_test), abs=0.005)


def test_logistic_no_penalty_is_infinite_C():
    X, y = _data("breast_cancer")
    X = X[:, :5]  # not separable: the unpenalised minimum exists
    ort = OrtLogisticRegression(C=np.inf).fit(X, y)
    sk = LogisticRegression(C=np.inf).fit(X, y)
    ones = np.ones(len(y))
    assert_reaches(_logistic_objective(ort, X, y, np.inf, ones),
                    _logistic_objective(sk, X, y, np.inf, ones))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        none = OrtLogisticRegression(penalty=None).fit(X, y)
    assert_allclose(none.coef_, ort.coef_)


@pytest.mark.parametrize("params, match", [
    ({"solver": "saga"}, "solver='saga'"),
    ({"solver": "liblinear"}, "solver='liblinear'"),
    ({"penalty": "l1"}, "penalty='l1'"),
    ({"l1_ratio": 0.5}, "l1_ratio=0.5"),
    ({"dual": True}, "dual=True"),
])
def test_logistic_refuses_what_lbfgs_cannot_do(params, match):
    X, y = _data("breast_cancer")
    with pytest.raises(ValueError, match=match):
        OrtLogisticRegression(**params).fit(X[:50], y[:50])


def test_logistic_warm_start_continues():
    X, y = _data("digits")
    ort = OrtLogisticRegression(warm_start=True).fit(X, y)
    coef = ort.coef_.copy()
    ort.fit(X, y)
    assert ort.n_iter_[0] <= 1
    assert_allclose(ort.coef_, coef, atol=1e-4)


# -------------------------------------------------------------------- ridge
@pytest.mark.parametrize("dataset, params, weighted, two_targets", [
    ("diabetes", {}, False, False),
    ("diabetes", {"alpha": 0.01}, True, False),
    ("diabetes", {"fit_intercept": False}, False, False),
    ("diabetes", {"positive": True}, False, False),
    ("regression", {"alpha": np.array([1.0, 10.0])}, False, True),
])
def test_ridge_objective(dataset, params, weighted, two_targets):
    X, y = _data(dataset)
    if two_targets:
        y = np.column_stack([y, 2 * y + 1])
    sw, weights = sample_weights(len(y), weighted)
    ort, sk = fit_both(OrtRidge, Ridge, X, y, sw, **params)
    alpha = params.get("alpha", 1.0)
    assert_reaches(_ridge_objective(ort, X, y, alpha, weights),
                    _ridge_objective(sk, X, y, alpha, weights))
    assert np.shape(ort.coef_) == np.shape(sk.coef_)
    assert np.shape(ort.intercept_) == np.shape(sk.intercept_)
    # Ridge(positive=True) gives its tol to scipy as ftol too and stops earlier.
    rtol = 1e-3 if params.get("positive") else 1e-5
    assert_allclose(ort.predict(X), sk.predict(X), rtol=rtol, atol=1e-6 * np.abs(y).max())
    if params.get("positive"):
        assert (ort.coef_ >= 0).all()


def test_ridge_refuses_other_solvers():
    X, y = _data("diabetes")
    with pytest.raises(ValueError, match="solver='svd'"):
        OrtRidge(solver="svd").fit(X, y)
    with pytest.raises(ValueError, match="positive=True"):
        OrtRidge(solver="cholesky", positive=True).fit(X, y)
    with pytest.raises(ValueError, match="sparse"):
        OrtRidge(solver="cholesky").fit(sparse.csr_matrix(X), y)
    assert OrtRidge(solver="lbfgs").fit(X, y).n_iter_.shape == (1,)
    assert OrtRidge().fit(X, y).n_iter_.tolist() == [1]  # the normal equations: one pass


@pytest.mark.parametrize("solver", ["cholesky", "lbfgs"])
def test_ridge_solvers_give_sklearns_coefficients(solver):
    """Both solvers reach Ridge's coefficients: the direct one to rounding."""
    X, y = _data("diabetes")
    sw = np.random.RandomState(0).uniform(0.5, 2.0, len(y))
    Y = np.column_stack([y, 2 * y + 1])
    alpha = np.array([0.1, 3.0])
    sk = Ridge(alpha=alpha).fit(X, Y, sample_weight=sw)
    ort = OrtRidge(alpha=alpha, solver=solver).fit(X, Y, sample_weight=sw)
    rtol = 1e-10 if solver == "cholesky" else 1e-4
    assert_allclose(ort.coef_, sk.coef_, rtol=rtol, atol=rtol * np.abs(sk.coef_).max())
    assert_allclose(ort.intercept_, sk.intercept_, rtol=rtol, atol=rtol * np.abs(y).max())
    # the objective's value at the solution, from the products (halved, centred data)
    Xc = X - np.average(X, axis=0, weights=sw)
    Yc = Y - np.average(Y, axis=0, weights=sw)
    coef = ort.coef_.T
    expected = 0.5 * (sw @ np.square(Yc - Xc @ coef).sum(axis=1)
                      + alpha @ np.square(coef).sum(axis=0))
    assert ort.loss_ == pytest.approx(expected, rel=1e-8)


def test_ridge_normal_equations_without_penalty_on_collinear_columns():
    """A singular system: the minimum-norm least-squares solution (Ridge's Cholesky and
    SVD both return coefficients of about 1e16 here)."""
    X, y = _data("diabetes")
    X = np.column_stack([X, X[:, :2]])  # two columns repeated
    Xc, yc = X - X.mean(axis=0), y - y.mean()
    expected = np.linalg.lstsq(Xc, yc, rcond=None)[0]
    ort = OrtRidge(alpha=0.0, solver="cholesky").fit(X, y)
    assert_allclose(ort.coef_, expected, rtol=0, atol=1e-6 * np.abs(expected).max())
    assert_allclose(ort.predict(X) - y.mean(), Xc @ expected, atol=1e-6 * np.abs(y).max())


# --------------------------------------------------------------------- GLMs
GLMS = [
    (OrtPoissonRegressor, PoissonRegressor, {}, 1.0, "log"),
    (OrtGammaRegressor, GammaRegressor, {}, 2.0, "log"),
    (OrtTweedieRegressor, TweedieRegressor, {"power": 1.5}, 1.5, "log"),
    (OrtTweedieRegressor, TweedieRegressor, {"power": 3.0, "link": "log"}, 3.0, "log"),
    (OrtTweedieRegressor, TweedieRegressor, {"power": 0.0}, 0.0, "identity"),
]


@pytest.mark.parametrize("ort_cls, sk_cls, family, power, link", GLMS,
                         ids=["poisson", "gamma", "tweedie1.5", "tweedie3", "normal"])
@pytest.mark.parametrize("dataset, params, weighted", [
    ("diabetes", {}, False),
    ("regression", {"alpha": 0.01}, True),
])
def test_glm_objective(ort_cls, sk_cls, family, power, link, dataset, params, weighted):
    X, y = _data(dataset)
    sw, weights = sample_weights(len(y), weighted)
    with warnings.catch_warnings():
        # power 3 on diabetes needs more than 100 iterations in both
        warnings.simplefilter("ignore", ConvergenceWarning)
        ort, sk = fit_both(ort_cls, sk_cls, X, y, sw, **family, **params)
    alpha = params.get("alpha", 1.0)
    assert_reaches(_glm_objective(ort, X, y, power, link, alpha, weights),
                    _glm_objective(sk, X, y, power, link, alpha, weights))
    assert ort.coef_.shape == sk.coef_.shape and np.ndim(ort.intercept_) == 0
    assert isinstance(ort.n_iter_, int)
    assert_allclose(ort.predict(X), sk.predict(X), rtol=1e-5)
    assert ort.score(X, y) == pytest.approx(sk.score(X, y), abs=1e-6)


@pytest.mark.parametrize("params, match", [
    ({"power": 1.5, "link": "identity"}, "link='identity'"),
    ({"power": 0.5}, "0 < power < 1"),
    ({"solver": "newton-cholesky"}, "solver='newton-cholesky'"),
])
def test_tweedie_refuses(params, match):
    X, y = _data("regression")
    with pytest.raises(ValueError, match=match):
        OrtTweedieRegressor(**params).fit(X, y)


def test_glm_target_range():
    X, y = _data("diabetes")
    with pytest.raises(ValueError, match="out of the valid range"):
        OrtGammaRegressor().fit(X, y - y.mean())


def test_glm_warm_start_continues():
    X, y = _data("regression")
    ort = OrtPoissonRegressor(warm_start=True, alpha=0.01).fit(X, y)
    coef = ort.coef_.copy()
    ort.fit(X, y)
    assert ort.n_iter_ <= 1
    assert_allclose(ort.coef_, coef, atol=1e-4)


# -------------------------------------------------------------------- Huber
@pytest.mark.parametrize("dataset, params, weighted", [
    ("diabetes", {}, False),
    ("diabetes", {"alpha": 1.0, "epsilon": 1.1}, True),
    ("outliers", {}, False),
    ("outliers", {"fit_intercept": False}, False),
])
def test_huber_objective(dataset, params, weighted):
    X, y = _data(dataset)
    sw, weights = sample_weights(len(y), weighted)
    ort, sk = fit_both(OrtHuberRegressor, HuberRegressor, X, y, sw, **params)
    epsilon, alpha = params.get("epsilon", 1.35), params.get("alpha", 1e-4)
    assert_reaches(_huber_objective(ort, X, y, epsilon, alpha, weights),
                    _huber_objective(sk, X, y, epsilon, alpha, weights))
    assert ort.scale_ == pytest.approx(sk.scale_, rel=1e-5)
    assert_array_equal(ort.outliers_, sk.outliers_)
    assert ort.coef_.shape == sk.coef_.shape and np.ndim(ort.intercept_) == 0
    assert_allclose(ort.predict(X), sk.predict(X), rtol=1e-5, atol=1e-6 * np.abs(y).max())


def test_huber_warm_start_continues():
    X, y = _data("outliers")
    ort = OrtHuberRegressor(warm_start=True).fit(X, y)
    scale = ort.scale_
    ort.fit(X, y)
    assert ort.n_iter_ <= 2
    assert ort.scale_ == pytest.approx(scale, rel=1e-4)  # ftol=2.2e-9, as sklearn


# ------------------------------------------------------------------ to_onnx
@pytest.mark.parametrize("estimator, dataset", [
    (OrtLogisticRegression(), "breast_cancer"),
    (OrtLogisticRegression(), "digits"),
    (OrtRidge(), "diabetes"),
    (OrtPoissonRegressor(), "regression"),
    (OrtHuberRegressor(), "diabetes"),
], ids=["binary", "multinomial", "ridge", "poisson", "huber"])
def test_to_onnx_predicts_as_predict(estimator, dataset):
    import onnxruntime

    X, y = _data(dataset)
    X = X.astype(np.float32)
    estimator.fit(X, y)
    session = onnxruntime.InferenceSession(estimator.to_onnx().SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    outputs = dict(zip([o.name for o in session.get_outputs()],
                       session.run(None, {"X": X})))
    if "label" in outputs:
        assert_array_equal(outputs["label"], estimator.predict(X))
        assert_allclose(outputs["probabilities"], estimator.predict_proba(X), atol=1e-5)
    else:
        assert_allclose(outputs["variable"].ravel(), estimator.predict(X), rtol=1e-5)


# ------------------------------------------------------- estimator checks
def _mini_batch_failures(estimator):
    if getattr(estimator, "solver", None) != "adam":
        return {}
    why = ("mini-batches and shuffling: sample_weight is not equivalent to removing or "
           "repeating samples (scikit-learn declares the same for SGD*).")
    return {"check_sample_weight_equivalence_on_dense_data": why,
            "check_sample_weight_equivalence_on_sparse_data": why}


@parametrize_with_checks([
    OrtLogisticRegression(max_iter=5),
    OrtLogisticRegression(solver="adam", max_iter=5),
    OrtRidge(max_iter=20),
    OrtPoissonRegressor(max_iter=5),
    OrtGammaRegressor(max_iter=5),
    OrtTweedieRegressor(max_iter=5),
    OrtHuberRegressor(max_iter=5),
], expected_failed_checks=_mini_batch_failures)
def test_sklearn_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check(estimator)


def test_log_loss_gradient_at_zero_score():
    """At zero weights (where L-BFGS starts) the log-loss gradient is X^T (1/2 - y) / n."""
    import onnxruntime

    from ortlearn.autodiff import build_gradient
    from ortlearn.estimators._objective import linear_objective
    from ortlearn.loss import elementwise_loss

    X, y = _data("breast_cancer")
    model = linear_objective(
        X.shape[1], 1, lambda b, raw, label: elementwise_loss(b, "log", raw, label, np.float64),
        fit_intercept=False, data_scale=1.0 / len(y), l2=0.0)
    session = onnxruntime.InferenceSession(
        build_gradient(model, wrt=["coef"]).SerializeToString(),
        providers=["CPUExecutionProvider"])
    loss, grad = session.run(None, {"X": X, "y": y.reshape(-1, 1).astype(float),
                                    "sample_weight": np.ones(len(y))})
    assert loss == pytest.approx(np.log(2))
    assert_allclose(grad[:, 0], X.T @ (0.5 - y) / len(y), atol=1e-12)
