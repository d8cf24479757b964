"""OrtLinearRegressor / OrtLinearClassifier against SGD* and LogisticRegression."""

import warnings

import numpy as np
import pytest
from conftest import run_onnx
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, load_wine
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, SGDClassifier, SGDRegressor
from splits import standardized_split

from ortlearn.convert import init_template, to_train_onnx
from ortlearn.estimators import OrtLinearClassifier, OrtLinearRegressor
from ortlearn.estimators._objective import sgd_objective


def _logistic_objective(X, y, coef, intercept, alpha, classes):
    """mean log-loss + alpha / 2 ||coef||^2 in numpy."""
    z = X @ np.atleast_2d(coef).T + intercept
    if z.shape[1] == 1:
        z = np.c_[np.zeros(len(z)), z]
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    index = np.searchsorted(classes, y)
    return -logp[np.arange(len(y)), index].mean() + alpha / 2 * (coef ** 2).sum()


@pytest.mark.parametrize("loss, penalty", [("squared_error", "elasticnet"), ("huber", "l1")])
def test_objective_equals_sgd_formula(loss, penalty):
    rng = np.random.RandomState(0)
    X, y = rng.randn(40, 3), rng.randn(40) * 2
    sw = rng.uniform(0, 2, 40)
    est = init_template(SGDRegressor(), X, y)
    est.coef_, est.intercept_ = rng.randn(3), np.array([0.3])
    alpha, l1_ratio, eps = 0.2, 0.3, 0.5
    model = sgd_objective(to_train_onnx(est, X), "regressor", loss=loss, penalty=penalty,
                          alpha=alpha, l1_ratio=l1_ratio, epsilon=eps)
    (value,) = run_onnx(model, {"X": X, "y": y[:, None], "sample_weight": sw})
    r = y - est.predict(X)
    if loss == "squared_error":
        data = 0.5 * r ** 2
    else:
        data = np.where(np.abs(r) <= eps, 0.5 * r ** 2, eps * (np.abs(r) - eps / 2))
    ratio = l1_ratio if penalty == "elasticnet" else 1.0
    reg = (1 - ratio) / 2 * (est.coef_ ** 2).sum() + ratio * np.abs(est.coef_).sum()
    assert value == pytest.approx(np.mean(sw * data) + alpha * reg, rel=1e-12)


def test_per_sample_sgd_reproduces_sgdregressor():
    rng = np.random.RandomState(0)
    X = rng.randn(50, 3)
    y = X @ [1.0, -1.0, 2.0] + 0.5 + 0.1 * rng.randn(50)
    params = dict(alpha=0.01, max_iter=3, tol=None, shuffle=False, eta0=0.05,
                  learning_rate="invscaling", power_t=0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = OrtLinearRegressor(batch_size=1, **params).fit(X, y)
        ref = SGDRegressor(**params).fit(X, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=1e-6)


def test_regressor_matches_sgdregressor_on_diabetes():
    X_tr, X_te, y_tr, y_te = standardized_split(load_diabetes, classifier=False)
    ours = OrtLinearRegressor(random_state=0).fit(X_tr, y_tr)
    ref = SGDRegressor(random_state=0).fit(X_tr, y_tr)
    assert abs(ours.score(X_te, y_te) - ref.score(X_te, y_te)) <= 0.01
    assert isinstance(ours.estimator_, SGDRegressor)
    np.testing.assert_allclose(ours.estimator_.predict(X_te), ours.predict(X_te), rtol=1e-10)


@pytest.mark.parametrize("load", [load_breast_cancer, load_wine, load_digits])
def test_classifier_matches_sgdclassifier(load):
    X_tr, X_te, y_tr, y_te = standardized_split(load, classifier=True)
    ours = OrtLinearClassifier(random_state=0).fit(X_tr, y_tr)
    ref = SGDClassifier(loss="log_loss", random_state=0).fit(X_tr, y_tr)
    if len(ours.classes_) == 2:
        # the same model (one logit, log-loss): same score, over a few seeds (one
        # test sample is 0.007 of the score: a single seed measures the shuffles)
        gaps = [OrtLinearClassifier(random_state=s).fit(X_tr, y_tr).score(X_te, y_te)
                - SGDClassifier(loss="log_loss", random_state=s).fit(X_tr, y_tr).score(X_te, y_te)
                for s in range(3)]
        assert abs(np.mean(gaps)) <= 0.01, gaps
    else:
        # SGDClassifier is one-vs-rest, ours a multinomial softmax: another
        # model, compared one-sided (digits: 0.956 vs 0.944; wine: 0.978 both)
        assert ours.score(X_te, y_te) >= ref.score(X_te, y_te) - 0.01


@pytest.mark.parametrize("load", [load_breast_cancer, load_wine])
def test_lbfgs_reaches_logistic_regression_objective(load):
    X_tr, _, y_tr, _ = standardized_split(load, classifier=True)
    C = 0.5
    alpha = 1 / (C * len(y_tr))
    ref = LogisticRegression(C=C, tol=1e-10, max_iter=2000).fit(X_tr, y_tr)
    ours = OrtLinearClassifier(solver="lbfgs", alpha=alpha, tol=1e-10, max_iter=2000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours.fit(X_tr, y_tr)
    classes = ours.classes_
    f_ours = _logistic_objective(X_tr, y_tr, ours.coef_, ours.intercept_, alpha, classes)
    f_ref = _logistic_objective(X_tr, y_tr, ref.coef_, ref.intercept_, alpha, classes)
    assert f_ours == pytest.approx(ours.loss_, rel=1e-9)
    assert f_ours <= f_ref * (1 + 1e-6)
    np.testing.assert_allclose(ours.predict_proba(X_tr), ref.predict_proba(X_tr), atol=1e-3)


def test_binary_decision_function_and_probabilities():
    X_tr, X_te, y_tr, _ = standardized_split(load_breast_cancer, classifier=True)
    clf = OrtLinearClassifier(random_state=0).fit(X_tr, y_tr)
    scores = clf.decision_function(X_te)
    assert scores.shape == (len(X_te),)
    proba = clf.predict_proba(X_te)
    np.testing.assert_allclose(proba[:, 1], 1 / (1 + np.exp(-scores)), rtol=1e-9, atol=1e-12)
    log_proba = clf.predict_log_proba(X_te)
    assert np.isfinite(log_proba).all()
    np.testing.assert_allclose(np.exp(log_proba), proba, atol=1e-12)
    np.testing.assert_array_equal(clf.predict(X_te), clf.classes_[(scores > 0).astype(int)])
    np.testing.assert_allclose(clf.estimator_.decision_function(X_te), scores, rtol=1e-10)


def test_multiclass_is_multinomial_softmax():
    X_tr, X_te, y_tr, _ = standardized_split(load_wine, classifier=True)
    clf = OrtLinearClassifier(random_state=0, max_iter=20).fit(X_tr, y_tr)
    z = clf.decision_function(X_te)
    assert z.shape == (len(X_te), 3)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    np.testing.assert_allclose(clf.predict_proba(X_te), e / e.sum(axis=1, keepdims=True),
                               rtol=1e-9)


@pytest.mark.parametrize("solver", ["adam", "adamw", "sgd"])
def test_solvers_and_partial_fit(solver):
    X_tr, X_te, y_tr, y_te = standardized_split(load_diabetes, classifier=False)
    reg = OrtLinearRegressor(solver=solver, eta0=0.1, learning_rate="constant",
                             random_state=0, max_iter=300, tol=1e-4)
    reg.fit(X_tr, y_tr)
    assert reg.score(X_te, y_te) > 0.3
    inc = OrtLinearRegressor(solver=solver, eta0=0.1, learning_rate="constant", random_state=0)
    first = inc.partial_fit(X_tr, y_tr).score(X_tr, y_tr)
    for _ in range(30):
        inc.partial_fit(X_tr, y_tr)
    assert inc.score(X_tr, y_tr) > first


def test_sample_weight_scales_the_data_loss():
    rng = np.random.RandomState(0)
    X = rng.randn(60, 2)
    y = X @ [1.0, 2.0]
    y[:30] += 5.0
    sw = np.r_[np.zeros(30), np.ones(30)]
    reg = OrtLinearRegressor(solver="lbfgs", alpha=0.0, penalty=None, tol=1e-10).fit(X, y, sw)
    np.testing.assert_allclose(reg.coef_, [1.0, 2.0], atol=1e-5)
    assert reg.score(X[30:], y[30:]) == pytest.approx(1.0, abs=1e-8)
    assert reg.score(X, y, sample_weight=sw) == pytest.approx(1.0, abs=1e-8)


def test_early_stopping_and_warm_start():
    X_tr, X_te, y_tr, y_te = standardized_split(load_breast_cancer, classifier=True)
    clf = OrtLinearClassifier(early_stopping=True, random_state=0).fit(X_tr, y_tr)
    assert clf.best_validation_score_ == max(clf.validation_scores_)
    assert clf.n_iter_ < 1000
    warm = OrtLinearClassifier(warm_start=True, max_iter=2, tol=None, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warm.fit(X_tr, y_tr)
        coef = warm.coef_.copy()
        warm.fit(X_tr, y_tr)
    assert len(warm.train_losses_) == 4
    assert not np.array_equal(coef, warm.coef_)


def test_errors():
    X, y = np.random.RandomState(0).randn(20, 2), np.arange(20) % 2
    with pytest.raises(ValueError, match="lbfgs"):
        OrtLinearClassifier(solver="lbfgs", penalty="l1").fit(X, y)
    with pytest.raises(ValueError, match="optimal"):
        OrtLinearClassifier(alpha=0.0).fit(X, y)
    with pytest.raises(ValueError, match="one class"):
        OrtLinearClassifier().fit(X, np.zeros(20))
