"""OrtMLPRegressor / OrtMLPClassifier against scikit-learn's MLPs."""

import pickle
import re
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import sklearn
from conftest import run_onnx
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, load_wine
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from splits import standardized_split

from ortlearn.convert import init_template, to_train_onnx
from ortlearn.estimators import OrtMLPClassifier, OrtMLPRegressor
from ortlearn.estimators._objective import mlp_objective
from ortlearn.exceptions import ConvergenceError


def _max_diff(a, b):
    return max(np.abs(x - y).max() for x, y in zip(a, b))


@pytest.fixture
def regression():
    rng = np.random.RandomState(0)
    X = rng.randn(120, 4)
    y = np.tanh(X @ [1.0, -2.0, 0.5, 0.0]) + 0.1 * rng.randn(120)
    return X, y


@pytest.fixture
def three_classes():
    rng = np.random.RandomState(1)
    X = rng.randn(150, 3)
    y = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.5, 0.5])
    return X, y


# --------------------------------------------------------------------- objective


def test_objective_equals_sklearn_loss(regression, three_classes):
    X, y = regression
    alpha, w = 0.3, np.ones(len(y))
    mlp = init_template(MLPRegressor(hidden_layer_sizes=(5,), alpha=alpha, random_state=0), X, y)
    (loss,) = run_onnx(mlp_objective(to_train_onnx(mlp, X), "regressor", alpha),
                       {"X": X, "y": y[:, None], "sample_weight": w})
    penalty = 0.5 * alpha * sum((c ** 2).sum() for c in mlp.coefs_) / len(y)
    assert loss == pytest.approx(0.5 * np.mean((y - mlp.predict(X)) ** 2) + penalty, rel=1e-12)

    X, y = three_classes
    sw = np.random.RandomState(0).uniform(0.5, 2, len(y))
    clf = init_template(MLPClassifier(hidden_layer_sizes=(5,), alpha=alpha, random_state=0), X, y)
    (loss,) = run_onnx(mlp_objective(to_train_onnx(clf, X), "multiclass", alpha),
                       {"X": X, "y": y.astype(np.int64), "sample_weight": sw})
    logp = np.log(clf.predict_proba(X))[np.arange(len(y)), y]
    penalty = 0.5 * alpha * sum((c ** 2).sum() for c in clf.coefs_) / sw.sum()
    assert loss == pytest.approx(-np.average(logp, weights=sw) + penalty, rel=1e-12)


def test_unweighted_objective_is_the_weighted_one_with_ones(regression, three_classes):
    for (X, y), kind, label in [(regression, "regressor", regression[1][:, None]),
                                (three_classes, "multiclass", three_classes[1])]:
        counterpart = MLPRegressor if kind == "regressor" else MLPClassifier
        mlp = init_template(counterpart(hidden_layer_sizes=(5,), random_state=0), X, y)
        inference = to_train_onnx(mlp, X)
        feeds = {"X": X, "y": label.astype(np.float64 if kind == "regressor" else np.int64)}
        unweighted = mlp_objective(inference, kind, alpha=0.3, weighted=False)
        assert [i.name for i in unweighted.graph.input] == ["X", "y"]
        (plain,) = run_onnx(unweighted, feeds)
        (ones,) = run_onnx(mlp_objective(inference, kind, alpha=0.3),
                           {**feeds, "sample_weight": np.ones(len(X))})
        assert plain == pytest.approx(ones, rel=1e-14)


# --------------------------------------------------------- same steps as sklearn


@pytest.mark.parametrize("solver, extra", [
    ("sgd", {"momentum": 0.9, "nesterovs_momentum": True, "learning_rate_init": 0.05}),
    ("sgd", {"momentum": 0.5, "nesterovs_momentum": False, "learning_rate": "invscaling",
             "learning_rate_init": 0.1}),
    ("adam", {"learning_rate_init": 0.01}),
])
def test_regressor_reproduces_sklearn_weights(regression, solver, extra):
    X, y = regression
    params = dict(hidden_layer_sizes=(8, 4), solver=solver, alpha=0.01, batch_size=32,
                  max_iter=4, shuffle=False, random_state=0, **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = OrtMLPRegressor(**params).fit(X, y)
        ref = MLPRegressor(**params).fit(X, y)
    assert _max_diff(ours.estimator_.coefs_, ref.coefs_) < 1e-6
    assert _max_diff(ours.estimator_.intercepts_, ref.intercepts_) < 1e-6
    np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_, rtol=1e-6)
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), atol=1e-6)
    assert ours.n_iter_ == ref.n_iter_ == 4 and ours.t_ == ref.t_


def test_classifier_reproduces_sklearn_with_shuffle_and_weights(three_classes):
    X, y = three_classes
    sw = np.random.RandomState(3).uniform(0.1, 3, len(y))
    params = dict(hidden_layer_sizes=(6,), solver="sgd", momentum=0.9, batch_size=20,
                  learning_rate_init=0.05, max_iter=3, random_state=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = OrtMLPClassifier(**params).fit(X, y, sample_weight=sw)
        ref = MLPClassifier(**params).fit(X, y, sample_weight=sw)
    assert _max_diff(ours.estimator_.coefs_, ref.coefs_) < 1e-6
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-6)
    np.testing.assert_allclose(ours.predict_log_proba(X), np.log(ref.predict_proba(X)),
                               atol=1e-5)
    assert ours.score(X, y, sample_weight=sw) == ref.score(X, y, sample_weight=sw)


def test_early_stopping_restores_best_weights_as_sklearn(regression):
    X, y = regression
    params = dict(hidden_layer_sizes=(8,), learning_rate_init=0.05, early_stopping=True,
                  n_iter_no_change=3, max_iter=60, random_state=0)
    ours = OrtMLPRegressor(**params).fit(X, y)
    ref = MLPRegressor(**params).fit(X, y)
    assert ours.n_iter_ == ref.n_iter_ < 60
    np.testing.assert_allclose(ours.validation_scores_, ref.validation_scores_, atol=1e-6)
    assert ours.best_validation_score_ == pytest.approx(ref.best_validation_score_, abs=1e-6)
    # the kept weights are the best epoch's, not the last one's
    assert ours.validation_scores_[-1] < ours.best_validation_score_
    assert _max_diff(ours.estimator_.coefs_, ref.coefs_) < 1e-6
    assert len(ours.validation_losses_) == ours.n_iter_


def test_partial_fit_and_warm_start_as_sklearn(three_classes):
    X, y = three_classes
    params = dict(hidden_layer_sizes=(6,), learning_rate_init=0.02, shuffle=False,
                  random_state=0)
    ours, ref = OrtMLPClassifier(**params), MLPClassifier(**params)
    for _ in range(3):
        ours.partial_fit(X[:100], y[:100], classes=[0, 1, 2])
        ref.partial_fit(X[:100], y[:100], classes=[0, 1, 2])
    assert _max_diff(ours.estimator_.coefs_, ref.coefs_) < 1e-6
    with pytest.raises(ValueError, match="classes"):
        OrtMLPClassifier().partial_fit(X, y)


def test_partial_fit_takes_weights_after_calls_without(three_classes):
    """Calls without weights train a graph without the weight input; a call with
    weights continues on the weighted graph from the same weights and Adam state."""
    X, y = three_classes
    sw = np.random.RandomState(2).uniform(0.5, 2, 100)
    params = dict(hidden_layer_sizes=(6,), learning_rate_init=0.02, shuffle=False,
                  random_state=0)
    ours, ref = OrtMLPClassifier(**params), MLPClassifier(**params)
    for weights, weighted_graph in [(None, False), (None, False), (sw, True), (None, True)]:
        ours.partial_fit(X[:100], y[:100], classes=[0, 1, 2], sample_weight=weights)
        ref.partial_fit(X[:100], y[:100], classes=[0, 1, 2], sample_weight=weights)
        assert ("sample_weight" in ours._runtime.engine.input_names) == weighted_graph
    assert _max_diff(ours.estimator_.coefs_, ref.coefs_) < 1e-6
    assert ours.n_iter_ == ref.n_iter_ and ours.t_ == ref.t_

    params.update(max_iter=2, warm_start=True)
    ours, ref = OrtMLPClassifier(**params), MLPClassifier(**params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for _ in range(2):
            ours.fit(X, y)
            ref.fit(X, y)
    assert _max_diff(ours.estimator_.coefs_, ref.coefs_) < 1e-6
    assert len(ours.loss_curve_) == 4


# ------------------------------------------------------------- real data sets


@pytest.mark.parametrize("load, classifier, lr, max_iter, floor", [
    (load_breast_cancer, True, 0.01, 25, 0.85),
    (load_wine, True, 0.01, 25, 0.85),
    (load_digits, True, 0.01, 25, 0.85),
    (load_diabetes, False, 0.05, 40, 0.3),
], ids=["breast_cancer", "wine", "digits", "diabetes"])
def test_held_out_score_matches_sklearn(load, classifier, lr, max_iter, floor):
    """Accuracy (classifiers) or R² (diabetes) on held-out data within 0.01 of
    scikit-learn's MLP trained with the same parameters."""
    X_tr, X_te, y_tr, y_te = standardized_split(load, classifier=classifier)
    params = dict(hidden_layer_sizes=(32,), learning_rate_init=lr, max_iter=max_iter,
                  random_state=0)
    ours_cls, ref_cls = ((OrtMLPClassifier, MLPClassifier) if classifier
                         else (OrtMLPRegressor, MLPRegressor))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = ours_cls(**params).fit(X_tr, y_tr)
        ref = ref_cls(**params).fit(X_tr, y_tr)
    assert abs(ours.score(X_te, y_te) - ref.score(X_te, y_te)) <= 0.01
    assert ours.score(X_te, y_te) > floor


def test_lbfgs_fits(regression):
    X, y = regression
    ours = OrtMLPRegressor(hidden_layer_sizes=(8,), solver="lbfgs", random_state=0).fit(X, y)
    ref = MLPRegressor(hidden_layer_sizes=(8,), solver="lbfgs", random_state=0).fit(X, y)
    assert ours.score(X, y) > 0.95
    assert ours.loss_ <= ref.loss_ * 1.05


# ---------------------------------------------------------- sklearn tooling


def test_grid_search_pipeline_and_pickle(regression):
    X, y = regression
    pipe = Pipeline([("scale", StandardScaler()),
                     ("mlp", OrtMLPRegressor(max_iter=15, random_state=0))])
    grid = {"mlp__hidden_layer_sizes": [(4,), (8,)], "mlp__learning_rate_init": [0.01, 0.05]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search = GridSearchCV(pipe, grid, cv=3).fit(X, y)
    best = search.best_estimator_
    before = best.predict(X)
    restored = pickle.loads(pickle.dumps(best))
    np.testing.assert_array_equal(restored.predict(X), before)


def test_metadata_routing_in_grid_search(regression):
    X, y = regression
    sw = np.random.RandomState(0).uniform(0.5, 2.0, len(y))
    with sklearn.config_context(enable_metadata_routing=True), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=5, random_state=0)
        est.set_fit_request(sample_weight=True).set_score_request(sample_weight=True)
        search = GridSearchCV(est, {"alpha": [1e-4, 1e-2]}, cv=3).fit(X, y, sample_weight=sw)
    assert np.isfinite(search.best_score_)


def test_same_random_state_same_predictions(three_classes):
    X, y = three_classes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a = OrtMLPClassifier(hidden_layer_sizes=(5,), max_iter=5, random_state=3).fit(X, y)
        b = OrtMLPClassifier(hidden_layer_sizes=(5,), max_iter=5, random_state=3).fit(X, y)
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))


def test_verbose_prints_one_line_per_epoch(regression, capsys):
    X, y = regression
    OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=200, learning_rate_init=0.05,
                    early_stopping=True,
                    n_iter_no_change=2, verbose=True, random_state=0).fit(X, y)
    lines = capsys.readouterr().out.strip().splitlines()
    # scikit-learn's lines: "Iteration %d, loss = %.8f", then "Validation score: %f"
    pattern = re.compile(r"^Iteration (\d+), loss = [0-9]+\.[0-9]{8}$")
    epochs = [int(pattern.match(line).group(1)) for line in lines if pattern.match(line)]
    assert epochs == list(range(1, len(epochs) + 1)) and len(epochs) >= 3
    scores = [line for line in lines if re.match(r"^Validation score: -?[0-9]+\.[0-9]{6}$", line)]
    assert len(scores) == len(epochs)
    assert lines[-1].startswith("Validation score did not improve")


# ------------------------------------------------------------- state, dtypes


def test_state_roundtrip_and_to_onnx(three_classes):
    X, y = three_classes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = OrtMLPClassifier(hidden_layer_sizes=(5,), max_iter=3, random_state=0).fit(X, y)
    state = clf.get_state()
    assert list(state) == ["coefficient", "intercepts", "coefficient1", "intercepts1"]
    proba = clf.predict_proba(X)
    sess = ort.InferenceSession(clf.to_onnx().SerializeToString(),
                                providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(["probabilities"], {"X": X})[0], proba, rtol=1e-12)
    np.testing.assert_allclose(clf.estimator_.predict_proba(X), proba, rtol=1e-10)
    clf.set_state({k: np.zeros_like(v) for k, v in state.items()})
    np.testing.assert_allclose(clf.predict_proba(X), 1 / 3)
    with pytest.raises(ValueError, match="missing"):
        clf.set_state({"coefficient": state["coefficient"]})


def test_float32_trains_in_float32(regression):
    X, y = regression
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reg = OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=3, random_state=0)
        reg.fit(X.astype(np.float32), y)
    assert reg.estimator_.coefs_[0].dtype == np.float32
    assert reg.predict(X).dtype == np.float32


def test_multioutput_regression(regression):
    X, y = regression
    Y = np.c_[y, -y]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = OrtMLPRegressor(hidden_layer_sizes=(6,), solver="sgd", max_iter=3,
                               shuffle=False, random_state=0).fit(X, Y)
        ref = MLPRegressor(hidden_layer_sizes=(6,), solver="sgd", max_iter=3,
                           shuffle=False, random_state=0).fit(X, Y)
    assert ours.predict(X).shape == (len(y), 2)
    assert _max_diff(ours.estimator_.coefs_, ref.coefs_) < 1e-6


# ---------------------------------------------------------------- errors


def test_bad_sample_weight_and_targets(regression, three_classes):
    X, y = regression
    reg = OrtMLPRegressor(max_iter=1)
    for sw, match in [(-np.ones(len(y)), "(?i)negative"), (np.zeros(len(y)), "(?i)zero"),
                      (np.full(len(y), np.nan), "NaN"), (np.ones(3), "")]:
        with pytest.raises(ValueError, match=match):
            reg.fit(X, y, sample_weight=sw)
    X, y = three_classes
    # multilabel indicator matrices are accepted (tests/parity/test_sklearn_parity_mlp.py),
    # multiclass-multioutput targets are not
    with pytest.raises(ValueError, match="not multi-output targets"):
        OrtMLPClassifier(max_iter=1).fit(X, np.c_[y, y])
    with pytest.raises(ValueError, match="early_stopping"):
        OrtMLPClassifier(early_stopping=True).partial_fit(X, y, classes=[0, 1, 2])


def test_divergence_keeps_finite_weights(regression):
    X, y = regression
    reg = OrtMLPRegressor(hidden_layer_sizes=(8,), solver="sgd", learning_rate_init=1e6,
                          momentum=0.0, max_iter=20, random_state=0)
    with pytest.raises(ConvergenceError):
        reg.fit(X * 1e3, y)
    assert all(np.isfinite(c).all() for c in reg.estimator_.coefs_)
    assert np.isfinite(reg.predict(X)).all()


def test_keyboard_interrupt_keeps_weights(regression, monkeypatch):
    X, y = regression
    from ortlearn.training import TrainingEngine

    original, calls = TrainingEngine.train_epoch, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TrainingEngine, "train_epoch", interrupted)
    with pytest.warns(UserWarning, match="interrupted"):
        reg = OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=10, random_state=0).fit(X, y)
    assert reg.n_iter_ == 2
    assert np.isfinite(reg.predict(X)).all()
