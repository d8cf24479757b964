"""OrtMLPRegressor / OrtMLPClassifier as drop-ins for scikit-learn's MLPs.

Parameters (``loss``, every key of the counterpart's ``get_params``),
``MLPRegressor(loss='poisson')``, multilabel ``MLPClassifier`` and the fitted
attributes of the counterpart, each checked against scikit-learn 1.9 on the
same data with the same settings.
"""

import warnings

import numpy as np
import pytest
from conftest import run_onnx
from sklearn.base import clone
from sklearn.datasets import load_diabetes, make_multilabel_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from ortlearn.convert import init_template, to_train_onnx
from ortlearn.estimators import OrtMLPClassifier, OrtMLPRegressor
from ortlearn.estimators._objective import mlp_objective

_PAIRS = [(OrtMLPRegressor, MLPRegressor), (OrtMLPClassifier, MLPClassifier)]


def _max_diff(a, b):
    return max(np.abs(x - y).max() for x, y in zip(a, b))


def _fit_both(ours_cls, ref_cls, X, y, sample_weight=None, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = ours_cls(**params).fit(X, y, sample_weight=sample_weight)
        ref = ref_cls(**params).fit(X, y, sample_weight=sample_weight)
    return ours, ref


@pytest.fixture(scope="module")
def counts():
    """Poisson counts of a log-linear mean."""
    rng = np.random.RandomState(0)
    X = rng.randn(150, 4)
    y = rng.poisson(np.exp(0.5 * X[:, 0] - 0.3 * X[:, 1] + 0.2)).astype(float)
    return X, y


@pytest.fixture(scope="module")
def diabetes():
    X, y = load_diabetes(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.25, random_state=0)
    scaler = StandardScaler().fit(X_tr)
    return scaler.transform(X_tr), scaler.transform(X_te), y_tr, y_te


@pytest.fixture(scope="module")
def multilabel():
    X, Y = make_multilabel_classification(n_samples=300, n_features=10, n_classes=4,
                                          random_state=0)
    return StandardScaler().fit_transform(X), Y


def _poisson_objective(model, X, y, alpha):
    """MLPRegressor(loss='poisson')'s objective, in numpy, from coefs_/intercepts_."""
    mean = model.predict(X).reshape(len(X), -1)
    y = y.reshape(len(X), -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ylogy = np.where(y > 0, y * np.log(np.where(y > 0, y, 1) / mean), 0.0)
    data = np.mean(ylogy - y + mean, axis=0).sum()
    return data + 0.5 * alpha * sum((c ** 2).sum() for c in model.coefs_) / len(X)


# ----------------------------------------------------------------- parameters


@pytest.mark.parametrize("ours_cls, ref_cls", _PAIRS)
def test_counterpart_params_pass_through(ours_cls, ref_cls):
    ref_params = ref_cls().get_params()
    ours_params = ours_cls().get_params()
    # every parameter of the counterpart, with its default (max_fun, epsilon, loss included)
    assert set(ref_params) <= set(ours_params)
    assert {k: ours_params[k] for k in ref_params} == ref_params
    assert set(ours_params) - set(ref_params) == {"device"}
    est = ours_cls(**ref_params)
    assert est.get_params() == ours_params
    changed = {**ref_params, "max_fun": 7, "epsilon": 1e-6, "alpha": 0.5}
    assert clone(ours_cls().set_params(**changed)).get_params() == {**ours_params, **changed}


def test_max_fun_and_epsilon_are_honoured(counts):
    X, y = counts
    ours, ref = _fit_both(OrtMLPRegressor, MLPRegressor, X, y, hidden_layer_sizes=(5,),
                          solver="lbfgs", max_fun=6, random_state=0)
    assert ours.n_iter_ == ref.n_iter_ < 6
    assert _max_diff(ours.coefs_, ref.coefs_) < 1e-10
    ours, ref = _fit_both(OrtMLPRegressor, MLPRegressor, X, y, hidden_layer_sizes=(5,),
                          epsilon=1e-2, batch_size=50, max_iter=3, shuffle=False,
                          learning_rate_init=0.05, random_state=0)
    assert _max_diff(ours.coefs_, ref.coefs_) < 1e-6


def test_bad_loss_is_refused(counts):
    X, y = counts
    with pytest.raises(ValueError, match="loss"):
        OrtMLPRegressor(loss="absolute_error").fit(X, y)
    # negative targets are trained on as by MLPRegressor (same gradient exp(raw) - y)
    ours, ref = _fit_both(OrtMLPRegressor, MLPRegressor, X, y - 1, loss="poisson",
                          hidden_layer_sizes=(4,), max_iter=2, shuffle=False, random_state=0)
    assert _max_diff(ours.coefs_, ref.coefs_) < 1e-6


# -------------------------------------------------------------------- poisson


def test_poisson_objective_is_sklearn_loss(counts):
    X, y = counts
    sw = np.random.RandomState(1).uniform(0.5, 2, len(y))
    mlp = init_template(MLPRegressor(loss="poisson", hidden_layer_sizes=(5,), alpha=0.3,
                                     random_state=0), X, y)
    (loss,) = run_onnx(mlp_objective(to_train_onnx(mlp, X), "regressor", 0.3, loss="poisson"),
                       {"X": X, "y": y[:, None], "sample_weight": sw})
    mean = mlp.predict(X)
    ylogy = np.where(y > 0, y * np.log(np.where(y > 0, y, 1) / mean), 0.0)
    expected = (np.average(ylogy - y + mean, weights=sw)
                + 0.15 * sum((c ** 2).sum() for c in mlp.coefs_) / sw.sum())
    assert loss == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("solver, extra", [
    ("sgd", {"momentum": 0.9, "learning_rate_init": 0.01}),
    ("adam", {"learning_rate_init": 0.01}),
    ("lbfgs", {}),
])
def test_poisson_reproduces_sklearn_weights(counts, solver, extra):
    X, y = counts
    ours, ref = _fit_both(OrtMLPRegressor, MLPRegressor, X, y, loss="poisson",
                          hidden_layer_sizes=(8, 4), solver=solver, alpha=0.01, batch_size=32,
                          max_iter=4, shuffle=False, random_state=0, **extra)
    assert _max_diff(ours.coefs_, ref.coefs_) < 1e-5
    assert _max_diff(ours.intercepts_, ref.intercepts_) < 1e-5
    assert ours.loss_ == pytest.approx(ref.loss_, rel=1e-6)
    if solver != "lbfgs":
        np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_, rtol=1e-6)
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), rtol=1e-6)
    assert ours.out_activation_ == ref.out_activation_ == "exp"


def test_poisson_multioutput_and_weights_reproduce_sklearn(counts):
    X, y = counts
    Y = np.c_[y, np.random.RandomState(2).poisson(2.0, len(y))]
    sw = np.random.RandomState(3).uniform(0.2, 3, len(y))
    ours, ref = _fit_both(OrtMLPRegressor, MLPRegressor, X, Y, sample_weight=sw,
                          loss="poisson", hidden_layer_sizes=(6,), batch_size=40, max_iter=3,
                          learning_rate_init=0.01, random_state=5)
    assert _max_diff(ours.coefs_, ref.coefs_) < 1e-5
    np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_, rtol=1e-6)
    assert ours.predict(X).shape == ref.predict(X).shape == (len(y), 2)


def test_warm_start_with_another_loss_is_refused(counts):
    X, y = counts
    est = OrtMLPRegressor(hidden_layer_sizes=(3,), max_iter=1, warm_start=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
        with pytest.raises(ValueError, match="loss='poisson'"):
            est.set_params(loss="poisson").fit(X, y)
        est.set_params(warm_start=False).fit(X, y)
    assert est.out_activation_ == "exp"


def test_poisson_onnx_predicts_exp_of_raw(counts):
    X, y = counts
    ours = OrtMLPRegressor(loss="poisson", hidden_layer_sizes=(6,), max_iter=20,
                           learning_rate_init=0.01, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours.fit(X, y)
    onx = ours.to_onnx()
    assert [o.name for o in onx.graph.output] == ["variable"]
    assert "Exp" in [n.op_type for n in onx.graph.node]
    (pred,) = run_onnx(onx, {"X": X})
    # the trained weights in sklearn's forward pass (exp of the last layer)
    np.testing.assert_allclose(pred.ravel(), ours.estimator_.predict(X), rtol=1e-12)
    assert (pred > 0).all()


@pytest.mark.parametrize("loss", ["squared_error", "poisson"])
def test_lbfgs_stops_where_sklearn_does(counts, loss):
    # MLP*'s L-BFGS keeps scipy's ftol and maxls (not LogisticRegression's): a
    # converged fit stops at the same iteration with the same loss.
    X, y = counts
    ours, ref = _fit_both(OrtMLPRegressor, MLPRegressor, X, y, loss=loss,
                          hidden_layer_sizes=(3,), solver="lbfgs", alpha=1e-2, max_iter=500,
                          random_state=0)
    assert ours.n_iter_ == ref.n_iter_ < 500
    assert ours.loss_ == pytest.approx(ref.loss_, rel=1e-10)


def test_poisson_lbfgs_reaches_sklearn_objective_on_diabetes(diabetes):
    X_tr, X_te, y_tr, y_te = diabetes
    params = dict(loss="poisson", hidden_layer_sizes=(10,), solver="lbfgs", alpha=1e-3,
                  max_iter=60, random_state=0)
    ours, ref = _fit_both(OrtMLPRegressor, MLPRegressor, X_tr, y_tr, **params)
    ours_obj = _poisson_objective(ours, X_tr, y_tr, params["alpha"])
    ref_obj = _poisson_objective(ref, X_tr, y_tr, params["alpha"])
    assert ours_obj == pytest.approx(ref_obj, rel=1e-6)
    assert ours.loss_ == pytest.approx(ref.loss_, rel=1e-6)
    assert ours.n_iter_ == ref.n_iter_


def test_poisson_adam_scores_as_sklearn_on_diabetes(diabetes):
    X_tr, X_te, y_tr, y_te = diabetes
    ours, ref = _fit_both(OrtMLPRegressor, MLPRegressor, X_tr, y_tr, loss="poisson",
                          hidden_layer_sizes=(16,), learning_rate_init=0.05, max_iter=60,
                          random_state=0)
    assert abs(ours.score(X_te, y_te) - ref.score(X_te, y_te)) <= 0.01
    assert ours.score(X_te, y_te) > 0.2


# ----------------------------------------------------------------- multilabel


@pytest.mark.parametrize("solver", ["sgd", "adam", "lbfgs"])
def test_multilabel_reproduces_sklearn(multilabel, solver):
    X, Y = multilabel
    ours, ref = _fit_both(OrtMLPClassifier, MLPClassifier, X, Y, hidden_layer_sizes=(8,),
                          solver=solver, batch_size=32, max_iter=4, shuffle=False,
                          learning_rate_init=0.05, alpha=0.01, random_state=0)
    assert _max_diff(ours.coefs_, ref.coefs_) < 1e-5
    assert _max_diff(ours.intercepts_, ref.intercepts_) < 1e-5
    assert ours.loss_ == pytest.approx(ref.loss_, rel=1e-6)
    np.testing.assert_array_equal(ours.classes_, ref.classes_)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    assert ours.predict(X).dtype == ref.predict(X).dtype
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-6)
    np.testing.assert_allclose(ours.predict_log_proba(X), ref.predict_log_proba(X),
                               rtol=1e-5)
    assert ours.out_activation_ == ref.out_activation_ == "logistic"
    assert ours.n_outputs_ == ref.n_outputs_ == Y.shape[1]


def test_multilabel_shuffle_weights_and_early_stopping_as_sklearn(multilabel):
    X, Y = multilabel
    sw = np.random.RandomState(4).uniform(0.2, 3, len(X))
    ours, ref = _fit_both(OrtMLPClassifier, MLPClassifier, X, Y, sample_weight=sw,
                          hidden_layer_sizes=(8,), batch_size=32, max_iter=5,
                          learning_rate_init=0.02, early_stopping=True,
                          n_iter_no_change=2, random_state=3)
    assert ours.n_iter_ == ref.n_iter_
    assert ours.validation_scores_ == pytest.approx(ref.validation_scores_)
    assert ours.best_validation_score_ == pytest.approx(ref.best_validation_score_)
    assert _max_diff(ours.coefs_, ref.coefs_) < 1e-5


def test_multilabel_two_labels_and_onnx_outputs(multilabel):
    X, Y = multilabel
    Y2 = Y[:, :2]
    ours, ref = _fit_both(OrtMLPClassifier, MLPClassifier, X, Y2, hidden_layer_sizes=(6,),
                          max_iter=3, random_state=0)
    assert ours.predict_proba(X).shape == ref.predict_proba(X).shape == (len(X), 2)
    label, proba = run_onnx(ours.to_onnx(), {"X": X}, ["label", "probabilities"])
    np.testing.assert_array_equal(label, ours.predict(X))
    np.testing.assert_allclose(proba, ours.predict_proba(X))


def test_multilabel_partial_fit_and_mismatches(multilabel):
    X, Y = multilabel
    params = dict(hidden_layer_sizes=(5,), solver="sgd", learning_rate_init=0.05,
                  random_state=0)
    ours, ref = OrtMLPClassifier(**params), MLPClassifier(**params)
    for start in (0, 100, 200):
        rows = slice(start, start + 100)
        ours.partial_fit(X[rows], Y[rows], classes=[0, 1, 2, 3])
        ref.partial_fit(X[rows], Y[rows], classes=[0, 1, 2, 3])
    assert _max_diff(ours.coefs_, ref.coefs_) < 1e-6
    with pytest.raises(ValueError, match="labels"):
        ours.partial_fit(X, Y[:, :3])
    with pytest.raises(ValueError, match="multilabel"):
        ours.partial_fit(X, Y[:, 0])
    with pytest.raises(ValueError, match="classes must be passed"):
        OrtMLPClassifier().partial_fit(X, Y)
    warm = OrtMLPClassifier(max_iter=1, warm_start=True, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warm.fit(X, Y[:, 0])
    with pytest.raises(ValueError, match="multilabel"):
        warm.fit(X, Y)


def test_multilabel_scores_as_sklearn(multilabel):
    X, Y = multilabel
    X_tr, X_te, Y_tr, Y_te = train_test_split(X, Y, test_size=0.3, random_state=0)
    ours, ref = _fit_both(OrtMLPClassifier, MLPClassifier, X_tr, Y_tr,
                          hidden_layer_sizes=(32,), max_iter=100, random_state=0)
    assert abs(ours.score(X_te, Y_te) - ref.score(X_te, Y_te)) <= 0.01


# ---------------------------------------------------------- fitted attributes

_ATTRIBUTES = ("coefs_", "intercepts_", "n_layers_", "n_outputs_", "out_activation_",
               "best_validation_score_", "validation_scores_", "t_", "loss_", "best_loss_",
               "loss_curve_", "n_iter_")


def _same_attribute(name, ours, ref):
    a, b = getattr(ours, name), getattr(ref, name)
    if b is None:
        assert a is None, name
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), name
        for x, y in zip(a, b):
            if isinstance(y, np.ndarray):
                assert x.shape == y.shape and x.dtype == y.dtype, name
            else:
                assert isinstance(x, float), name
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7, err_msg=name)
    elif isinstance(b, str):
        assert a == b, name
    elif isinstance(b, (int, np.integer)) and not isinstance(b, bool):
        assert isinstance(a, (int, np.integer)) and a == b, name
    else:
        assert isinstance(a, float) and a == pytest.approx(b, rel=1e-6), name


@pytest.mark.parametrize("ours_cls, ref_cls", _PAIRS)
@pytest.mark.parametrize("early_stopping", [False, True])
def test_fitted_attributes_as_sklearn(ours_cls, ref_cls, early_stopping):
    rng = np.random.RandomState(0)
    X = rng.randn(120, 5).astype(np.float32)
    y = X[:, 0] - X[:, 1] if ours_cls is OrtMLPRegressor else (X[:, 0] > X[:, 1]).astype(int)
    ours, ref = _fit_both(ours_cls, ref_cls, X, y, hidden_layer_sizes=(6, 3), batch_size=30,
                          max_iter=4, learning_rate_init=0.01, early_stopping=early_stopping,
                          random_state=0)
    for name in _ATTRIBUTES:
        _same_attribute(name, ours, ref)
    assert (ours.validation_scores_ is None) == (not early_stopping)
    assert (ours.best_loss_ is None) == early_stopping
    assert ours.coefs_[0].dtype == np.float32


@pytest.mark.parametrize("ours_cls, ref_cls", _PAIRS)
def test_fitted_attributes_of_lbfgs_as_sklearn(ours_cls, ref_cls):
    rng = np.random.RandomState(0)
    X = rng.randn(80, 3)
    y = X[:, 0] ** 2 if ours_cls is OrtMLPRegressor else np.digitize(X[:, 0], [-0.5, 0.5])
    ours, ref = _fit_both(ours_cls, ref_cls, X, y, hidden_layer_sizes=(4,), solver="lbfgs",
                          max_iter=5, random_state=0)
    for name in ("coefs_", "intercepts_", "n_layers_", "n_outputs_", "out_activation_",
                 "t_", "loss_", "n_iter_"):
        _same_attribute(name, ours, ref)
    assert ours.t_ == 0
    # scikit-learn's L-BFGS sets none of these
    assert ours.best_loss_ is ours.validation_scores_ is ours.best_validation_score_ is None
    assert not hasattr(ref, "best_loss_")


def test_attributes_absent_before_fit():
    for est in (OrtMLPRegressor(), OrtMLPClassifier()):
        for name in ("coefs_", "intercepts_", "n_layers_", "n_outputs_", "out_activation_"):
            assert not hasattr(est, name)


# -------------------------------------------------------- scikit-learn checks


# positive_only shifts the checks' targets to [1, 7.5]: the default learning rate
# (MLPRegressor's too, with either loss) then scores R^2 0.38 in 200 epochs, under
# check_regressors_train's 0.5; 0.01 scores 0.98, as MLPRegressor(loss='poisson') does.
@parametrize_with_checks(
    [OrtMLPRegressor(loss="poisson", learning_rate_init=0.01),
     OrtMLPClassifier(hidden_layer_sizes=(20,))],
)
def test_sklearn_compatible(estimator, check):
    check(estimator)
