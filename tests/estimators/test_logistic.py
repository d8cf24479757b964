"""``OrtLogisticRegression``'s solvers: one model, trained in full batch (L-BFGS) or in
mini-batches (through ``OrtLinearClassifier``), reaching scikit-learn's solution."""

import pickle
import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from scipy.special import logsumexp
from sklearn.datasets import load_breast_cancer, load_iris
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from ortlearn.estimators import OrtLinearClassifier, OrtLogisticRegression


def _data(load):
    X, y = load(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def _objective(coef, intercept, X, y, C, sw, l1_ratio=0.0):
    """LogisticRegression's objective in float64 (its docstring's formula)."""
    Z = X @ coef.T + intercept
    if Z.shape[1] == 1:
        loss = np.logaddexp(0, Z[:, 0]) - y * Z[:, 0]
    else:
        loss = logsumexp(Z, axis=1) - Z[np.arange(len(y)), y]
    penalty = (1 - l1_ratio) / 2 * (coef ** 2).sum() + l1_ratio * np.abs(coef).sum()
    return (sw * loss).sum() / sw.sum() + penalty / (C * sw.sum())


def _fit_quietly(estimator, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(*args, **kwargs)


# Full-batch steps of a constant rate, run to a standstill: the iterates converge to the
# minimiser of the objective the solver sees, whatever path the rule takes.
_TO_CONVERGENCE = {"adam": {"eta0": 0.05}, "sgd": {"eta0": 0.5, "momentum": 0.9}}


@pytest.mark.parametrize("load", [load_breast_cancer, load_iris], ids=["binary", "multinomial"])
@pytest.mark.parametrize("solver", ["adam", "sgd"])
def test_mini_batch_solvers_reach_scikit_learns_weighted_solution(load, solver):
    X, y = _data(load)
    sw = np.random.RandomState(0).uniform(0.5, 2.0, len(y))
    sk = LogisticRegression(C=0.5, max_iter=1000, tol=1e-10).fit(X, y, sample_weight=sw)
    ours = _fit_quietly(OrtLogisticRegression(
        C=0.5, solver=solver, max_iter=3000, tol=0.0, n_iter_no_change=50,
        learning_rate="constant", batch_size=len(y), random_state=0,
        **_TO_CONVERGENCE[solver]), X, y, sample_weight=sw)
    assert_allclose(ours.coef_, sk.coef_, atol=1e-5)
    assert_allclose(ours.intercept_, sk.intercept_, atol=1e-5)
    assert isinstance(ours.estimator_, OrtLinearClassifier)
    assert ours.estimator_.alpha == pytest.approx(1 / (0.5 * len(y)))
    assert ours.n_iter_.shape == (1,) and ours.n_iter_[0] == ours.estimator_.n_iter_


def test_class_weight_multiplies_the_sample_weights():
    X, y = _data(load_iris)
    sk = LogisticRegression(C=2.0, class_weight="balanced", max_iter=1000,
                            tol=1e-10).fit(X[:120], y[:120])
    ours = _fit_quietly(OrtLogisticRegression(
        C=2.0, class_weight="balanced", solver="adam", eta0=0.05, learning_rate="constant",
        batch_size=120, max_iter=4000, tol=0.0, n_iter_no_change=50), X[:120], y[:120])
    assert_allclose(ours.coef_, sk.coef_, atol=1e-5)


def test_small_batches_reach_a_near_optimal_objective():
    """Batches of 32 rows with Adam: within 1e-3 of the optimum, scores alike."""
    X, y = _data(load_breast_cancer)
    sw = np.ones(len(y))
    sk = LogisticRegression().fit(X, y)
    ours = _fit_quietly(OrtLogisticRegression(solver="adam", batch_size=32, eta0=0.01,
                                              random_state=0, max_iter=300), X, y)
    best = _objective(sk.coef_, sk.intercept_, X, y, 1.0, sw)
    gap = _objective(ours.coef_, ours.intercept_, X, y, 1.0, sw) - best
    assert -1e-9 < gap < 1e-3
    assert abs(ours.score(X, y) - sk.score(X, y)) <= 0.01


def test_elastic_net_is_a_mini_batch_penalty():
    """l1_ratio > 0 trains with the mini-batch solvers; L-BFGS refuses it."""
    X, y = _data(load_breast_cancer)
    sw = np.ones(len(y))
    saga = LogisticRegression(C=0.1, l1_ratio=0.5, solver="saga", max_iter=5000,
                              tol=1e-8).fit(X, y)
    ours = _fit_quietly(OrtLogisticRegression(
        C=0.1, l1_ratio=0.5, solver="adam", eta0=0.01, learning_rate="constant",
        batch_size=len(y), max_iter=3000, tol=0.0, n_iter_no_change=50), X, y)
    best = _objective(saga.coef_, saga.intercept_, X, y, 0.1, sw, 0.5)
    gap = _objective(ours.coef_, ours.intercept_, X, y, 0.1, sw, 0.5) - best
    # a subgradient oscillates around the kinks of |w|: near, not at, the optimum
    assert abs(gap) < 1e-4
    with pytest.raises(ValueError, match="l1_ratio=0.5"):
        OrtLogisticRegression(C=0.1, l1_ratio=0.5).fit(X, y)


def test_inference_model_and_probabilities_follow_the_mini_batch_weights():
    X, y = _data(load_iris)
    clf = _fit_quietly(OrtLogisticRegression(solver="sgd", max_iter=20, random_state=0), X, y)
    proba = clf.predict_proba(X)
    assert_allclose(proba, clf.estimator_.predict_proba(X), atol=1e-12)
    assert_allclose(clf.get_state()["coef"], clf.estimator_.get_state()["coef"])
    import onnxruntime

    session = onnxruntime.InferenceSession(clf.to_onnx().SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    label, probabilities = session.run(["label", "probabilities"], {"X": X})
    assert_allclose(probabilities, proba, atol=1e-10)
    assert (label == clf.predict(X)).all()


def test_warm_start_continues_the_mini_batch_fit():
    X, y = _data(load_breast_cancer)
    clf = OrtLogisticRegression(solver="adam", warm_start=True, max_iter=5, random_state=0)
    _fit_quietly(clf, X, y)
    first, inner = clf.train_losses_[-1], clf.estimator_
    _fit_quietly(clf, X, y)
    assert clf.estimator_ is inner
    # the curve goes on (as MLPClassifier's loss_curve_) from where the first fit ended
    assert len(clf.train_losses_) == 10 and clf.train_losses_[5] < first * 1.05
    _fit_quietly(clf.set_params(solver="lbfgs"), X, y)
    assert not hasattr(clf, "estimator_")  # an L-BFGS fit has no mini-batch estimator


def test_a_model_pickled_without_the_mini_batch_parameters_loads():
    """A pickle of the release before the mini-batch solvers lacks their parameters."""
    X, y = _data(load_iris)
    clf = OrtLogisticRegression().fit(X, y)
    state = dict(clf.__getstate__())
    for name in ("batch_size", "learning_rate", "eta0", "power_t", "momentum",
                 "nesterovs_momentum", "beta_1", "beta_2", "shuffle", "early_stopping",
                 "validation_fraction", "n_iter_no_change"):
        del state[name]
    old = OrtLogisticRegression.__new__(OrtLogisticRegression)
    old.__setstate__(state)
    assert old.get_params() == clf.get_params()
    assert_allclose(old.predict_proba(X), clf.predict_proba(X))
    restored = pickle.loads(pickle.dumps(clf))
    assert_allclose(restored.predict_proba(X), clf.predict_proba(X))


@pytest.mark.parametrize("params, match", [
    ({"solver": "adam", "dual": True}, "dual=True"),
    ({"solver": "adam", "penalty": "l2", "l1_ratio": 0.3}, "penalty='elasticnet'"),
    ({"solver": "saga"}, "'sgd', 'adam', 'adamw'"),
    ({"solver": "sgd", "C": np.inf}, "alpha must be > 0"),
])
def test_mini_batch_refusals_name_the_parameter(params, match):
    X, y = _data(load_breast_cancer)
    with pytest.raises(ValueError, match=match):
        OrtLogisticRegression(**params).fit(X[:50], y[:50])
