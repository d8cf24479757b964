"""Tests of ortlearn.convert: sklearn -> trainable ONNX graphs."""

import functools
import warnings

import numpy as np
import onnx
import pytest
from conftest import run_onnx
from onnx import TensorProto, helper, numpy_helper
from scipy.special import expit
from skl2onnx import to_onnx
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris, load_wine
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import (
    ElasticNet,
    Lasso,
    LinearRegression,
    LogisticRegression,
    Ridge,
    SGDClassifier,
    SGDRegressor,
)
from sklearn.neighbors import KNeighborsRegressor
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import (
    MinMaxScaler,
    Normalizer,
    PolynomialFeatures,
    StandardScaler,
)

from ortlearn.convert import (
    get_train_initializer,
    get_weights,
    init_template,
    lower_ml_operators,
    set_weights,
    to_train_onnx,
)
from ortlearn.graph import DEFAULT_OPSET


@functools.cache
def _data(name):
    loader = {"iris": load_iris, "diabetes": load_diabetes,
              "breast_cancer": load_breast_cancer, "wine": load_wine}[name]
    X, y = loader(return_X_y=True)
    return X, y


def _mlp(cls, **kw):
    return cls(hidden_layer_sizes=(7,), max_iter=30, random_state=0, **kw)


# name -> (estimator factory, dataset)
CASES = {
    "LinearRegression": (LinearRegression, "diabetes"),
    "Ridge": (lambda: Ridge(alpha=0.5), "diabetes"),
    "Lasso": (lambda: Lasso(alpha=0.1), "diabetes"),
    "ElasticNet": (lambda: ElasticNet(alpha=0.01), "diabetes"),
    "SGDRegressor": (lambda: SGDRegressor(max_iter=20, random_state=0), "diabetes"),
    "LogisticRegression-binary": (lambda: LogisticRegression(max_iter=50), "breast_cancer"),
    "LogisticRegression-multi": (lambda: LogisticRegression(max_iter=200), "iris"),
    "SGDClassifier-binary": (lambda: SGDClassifier(loss="log_loss", max_iter=20,
                                                   random_state=0), "breast_cancer"),
    "SGDClassifier-multi": (lambda: SGDClassifier(loss="log_loss", max_iter=20,
                                                  random_state=0), "wine"),
    "MLPRegressor": (lambda: _mlp(MLPRegressor, activation="tanh"), "diabetes"),
    "MLPClassifier-binary": (lambda: _mlp(MLPClassifier, activation="logistic"), "breast_cancer"),
    "MLPClassifier-multi": (lambda: _mlp(MLPClassifier), "iris"),
}
SCALERS = {"plain": None, "standard": StandardScaler, "minmax": MinMaxScaler,
           "normalizer": Normalizer}


@functools.cache
def _fitted(case, scaler):
    factory, dataset = CASES[case]
    X, y = _data(dataset)
    est = factory() if SCALERS[scaler] is None else make_pipeline(SCALERS[scaler](), factory())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
    return est, X


def _tol(dtype):
    return {"rtol": 1e-4, "atol": 1e-4} if dtype == np.float32 else {"rtol": 1e-9, "atol": 1e-9}


def _close(got, expected, dtype):
    """allclose with an absolute tolerance relative to the size of the values."""
    expected = np.asarray(expected, dtype=np.float64)
    tol = _tol(dtype)
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(got, expected, rtol=tol["rtol"], atol=tol["atol"] * scale)


def _logits(est, X):
    """Raw scores sklearn computes: decision_function, or the MLP's last layer."""
    final = est[-1] if hasattr(est, "steps") else est
    if not isinstance(final, MLPClassifier):
        scores = est.decision_function(X)
        return scores.reshape(len(X), -1)
    h = est[:-1].transform(X) if hasattr(est, "steps") else X
    act = {"identity": lambda z: z, "logistic": expit, "tanh": np.tanh,
           "relu": lambda z: np.maximum(z, 0)}[final.activation]
    for i, (W, b) in enumerate(zip(final.coefs_, final.intercepts_)):
        h = h @ W + b
        if i < len(final.coefs_) - 1:
            h = act(h)
    return h


def _check_graph(onx, est, dtype):
    onnx.checker.check_model(onx)
    assert {n.domain for n in onx.graph.node} <= {""}
    assert [(o.domain, o.version) for o in onx.opset_import] == [("", DEFAULT_OPSET)]
    assert not any(i.data_type not in (TensorProto.FLOAT, TensorProto.DOUBLE)
                   for i in onx.graph.initializer)
    (x,) = onx.graph.input
    assert x.name == "X"
    assert x.type.tensor_type.elem_type == helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    assert x.type.tensor_type.shape.dim[0].dim_param == "N"
    weights = get_weights(est)
    assert get_train_initializer(onx) == list(weights)
    for init in onx.graph.initializer:
        value = numpy_helper.to_array(init)
        assert value.dtype == dtype
        assert value.shape == weights[init.name].shape, init.name
        np.testing.assert_array_equal(value, weights[init.name].astype(dtype))


@pytest.mark.parametrize("scaler", list(SCALERS))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_to_train_onnx_matches_sklearn(case, scaler, dtype):
    est, X = _fitted(case, scaler)
    onx = to_train_onnx(est, X, dtype=dtype)
    _check_graph(onx, est, dtype)
    outputs = run_onnx(onx, {"X": X.astype(dtype)})
    names = [o.name for o in onx.graph.output]
    if not hasattr(est, "predict_proba"):
        assert names == ["variable"]
        (pred,) = outputs
        assert pred.shape == (len(X), 1) and pred.dtype == dtype
        _close(pred[:, 0], est.predict(X), dtype)
        return
    assert names == ["label", "probabilities", "raw_scores"]
    label, proba, raw = outputs
    n_classes = len(est.classes_)
    assert proba.shape == (len(X), n_classes) and proba.dtype == dtype
    assert raw.shape == (len(X), 1 if n_classes == 2 else n_classes) and raw.dtype == dtype
    assert label.shape == (len(X),) and label.dtype == np.int64
    _close(proba, est.predict_proba(X), dtype)
    _close(raw, _logits(est, X), dtype)
    decision = raw[:, 0] > 0 if n_classes == 2 else np.argmax(raw, axis=1)
    np.testing.assert_array_equal(label, est.classes_[decision.astype(int)])
    agree = np.mean(label == est.predict(X))
    assert agree == 1.0 if dtype == np.float64 else agree > 0.99


@pytest.mark.parametrize("activation", ["identity", "logistic", "tanh", "relu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mlp_activations(activation, dtype):
    X, y = _data("iris")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = _mlp(MLPClassifier, activation=activation).fit(X, y)
        reg = MLPRegressor(hidden_layer_sizes=(5, 4), activation=activation, max_iter=20,
                           random_state=0).fit(X, np.c_[y, X[:, 0]])
    label, proba, raw = run_onnx(to_train_onnx(clf, X, dtype=dtype), {"X": X.astype(dtype)})
    _close(proba, clf.predict_proba(X), dtype)
    _close(raw, _logits(clf, X), dtype)
    onx = to_train_onnx(reg, X, dtype=dtype)
    assert get_train_initializer(onx) == ["coefficient", "intercepts", "coefficient1",
                                          "intercepts1", "coefficient2", "intercepts2"]
    (pred,) = run_onnx(onx, {"X": X.astype(dtype)})
    assert pred.shape == (len(X), 2)
    _close(pred, reg.predict(X), dtype)


def test_multi_output_linear_regression():
    X, y = _data("diabetes")
    Y = np.c_[y, -2 * y + X[:, 0]]
    est = LinearRegression().fit(X, Y)
    onx = to_train_onnx(est, X, dtype=np.float64)
    assert numpy_helper.to_array(onx.graph.initializer[0]).shape == (X.shape[1], 2)
    (pred,) = run_onnx(onx, {"X": X})
    _close(pred, est.predict(X), np.float64)


@pytest.mark.parametrize("est", [LinearRegression(fit_intercept=False),
                                 LogisticRegression(fit_intercept=False, max_iter=50),
                                 SGDClassifier(loss="log_loss", fit_intercept=False, max_iter=5,
                                               random_state=0)])
def test_no_intercept_is_not_trained(est):
    X, y = _data("iris")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
    onx = to_train_onnx(est, X, dtype=np.float64)
    assert get_train_initializer(onx) == ["coef"] == list(get_weights(est))
    outputs = run_onnx(onx, {"X": X})
    if hasattr(est, "predict_proba"):
        _close(outputs[1], est.predict_proba(X), np.float64)
    else:
        _close(outputs[0][:, 0], est.predict(X), np.float64)


# -- get_train_initializer ----------------------------------------------------


def test_get_train_initializer_onnxcustom_example():
    """The graph onnxcustom's OrtGradientOptimizer example trains."""
    X, y = _data("diabetes")
    X = X.astype(np.float32)
    onx = to_onnx(LinearRegression().fit(X, y), X, black_op={"LinearRegressor"})
    assert get_train_initializer(onx) == ["coef", "intercept"]
    assert get_train_initializer(onx.SerializeToString()) == ["coef", "intercept"]
    (pred,) = run_onnx(onx, {"X": X})
    assert pred.shape == (len(X), 1)


def test_get_train_initializer_types_and_constants():
    inits = [numpy_helper.from_array(np.ones(2, dtype=t), name)
             for t, name in [(np.float16, "h"), (np.int64, "shape"), (np.float64, "d"),
                             (np.int32, "i"), (np.float32, "f")]]
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
        np.ones(2, np.float32)))
    node = helper.make_node("Add", ["f", "c"], ["y"])
    graph = helper.make_graph([const, node], "g", [], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], inits)
    assert get_train_initializer(helper.make_model(graph)) == ["h", "d", "f"]


# -- lowering -----------------------------------------------------------------


def _ml_cases():
    Xi, yi = _data("iris")
    Xb, yb = _data("breast_cancer")
    Xd, yd = _data("diabetes")
    rng = np.random.default_rng(0)
    Xn = np.vstack([rng.normal(size=(30, 4)), np.zeros((1, 4))])  # negatives, a zero row
    yn = (Xn[:, 0] > 0).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return [
            (LinearRegression().fit(Xd, yd), Xd),
            (LinearRegression().fit(Xd, np.c_[yd, Xd[:, :2]]), Xd),
            (LogisticRegression(max_iter=50).fit(Xb, yb), Xb),
            (LogisticRegression(max_iter=200).fit(Xi, yi), Xi),
            (LogisticRegression().fit(Xi, np.array(["a", "b", "c"])[yi]), Xi),
            (make_pipeline(StandardScaler(), MinMaxScaler(), Ridge()).fit(Xd, yd), Xd),
            # onnxruntime's MAX norm is max(x) (sklearn: max(|x|)): positive data
            (make_pipeline(Normalizer("max"), LogisticRegression()).fit(Xn ** 2, yn), Xn ** 2),
            (make_pipeline(Normalizer("l1"), LogisticRegression()).fit(Xn, yn), Xn),
            (make_pipeline(Normalizer("l2"), LinearRegression()).fit(Xn, Xn[:, 1]), Xn),
            (SGDClassifier(loss="log_loss", max_iter=5, random_state=0).fit(Xi, yi), Xi),
        ]


@pytest.mark.parametrize("index", range(10))
def test_lower_ml_operators_same_outputs(index):
    est, X = _ml_cases()[index]
    X = X.astype(np.float32)
    options = {"zipmap": False} if hasattr(est, "predict_proba") else None
    original = to_onnx(est, X[:1], options=options, target_opset={"": 18, "ai.onnx.ml": 3})
    assert any(n.domain == "ai.onnx.ml" for n in original.graph.node)
    lowered = lower_ml_operators(original)
    assert all(n.domain == "" for n in lowered.graph.node)
    assert [o.domain for o in lowered.opset_import] == [""]
    onnx.checker.check_model(lowered)
    expected = run_onnx(original, {"X": X})
    got = run_onnx(lowered, {"X": X})
    for e, g in zip(expected, got):
        assert e.dtype == g.dtype and e.shape == g.shape
        if e.dtype.kind in "iOU":
            np.testing.assert_array_equal(g, e)
        else:
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * max(1, np.abs(e).max()))
    X = X.astype(np.float64)
    if options:
        _close(got[1], est.predict_proba(X), np.float32)
    else:
        pred = est.predict(X)
        _close(got[0].reshape(pred.shape), pred, np.float32)


def test_lower_ml_operators_unknown_operator():
    node = helper.make_node("TreeEnsembleRegressor", ["X"], ["Y"], domain="ai.onnx.ml",
                            name="trees")
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])], [
        helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(ValueError, match="TreeEnsembleRegressor.*'trees'"):
        lower_ml_operators(model)


# -- errors -------------------------------------------------------------------


def test_unsupported_estimator():
    X, y = _data("diabetes")
    with pytest.raises(TypeError, match="KNeighborsRegressor.*LinearRegression.*MLPClassifier"):
        to_train_onnx(KNeighborsRegressor().fit(X, y), X)
    pipe = make_pipeline(PolynomialFeatures(), LinearRegression()).fit(X, y)
    with pytest.raises(TypeError, match="PolynomialFeatures"):
        to_train_onnx(pipe, X)
    with pytest.raises(ValueError, match="norm='max'"):
        to_train_onnx(make_pipeline(Normalizer("max"), Ridge()).fit(X, y), X)
    with pytest.raises(ValueError, match="loss='hinge'"):
        to_train_onnx(SGDClassifier(max_iter=100, tol=None, random_state=0).fit(X, y > 100), X)


def test_bad_arguments():
    est, X = _fitted("LinearRegression", "plain")
    with pytest.raises(NotFittedError):
        to_train_onnx(LinearRegression(), X)
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        to_train_onnx(est, X, dtype=np.int64)
    with pytest.raises(ValueError, match="2-D"):
        to_train_onnx(est, X[0])
    with pytest.raises(ValueError, match="target_opset"):
        to_train_onnx(est, X, target_opset=11)
    assert to_train_onnx(est, X.astype(np.float32)).graph.input[0].type.tensor_type.elem_type \
        == TensorProto.FLOAT
    assert to_train_onnx(est, X).graph.input[0].type.tensor_type.elem_type == TensorProto.DOUBLE


# -- templates ----------------------------------------------------------------


@pytest.mark.parametrize("cls,dataset", [(MLPRegressor, "diabetes"),
                                         (MLPClassifier, "breast_cancer"),
                                         (MLPClassifier, "iris")])
@pytest.mark.parametrize("activation", ["relu", "logistic"])
def test_init_template_mlp_same_weights_as_sklearn(cls, dataset, activation):
    X, y = _data(dataset)
    params = dict(hidden_layer_sizes=(6, 5), activation=activation, random_state=3)
    template = init_template(cls(**params), X, y)
    # One sklearn epoch with a learning rate of 1e-300 leaves the initial weights unchanged.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref = cls(solver="sgd", learning_rate_init=1e-300, max_iter=1, **params).fit(X, y)
    for got, expected in zip(template.coefs_ + template.intercepts_,
                             ref.coefs_ + ref.intercepts_):
        np.testing.assert_array_equal(got, expected)
    assert not hasattr(cls(**params), "coefs_")
    onx = to_train_onnx(template, X)
    outputs = run_onnx(onx, {"X": X})
    if cls is MLPClassifier:
        np.testing.assert_array_equal(template.classes_, np.unique(y))
        _close(outputs[1], template.predict_proba(X), np.float64)
    else:
        _close(outputs[0][:, 0], template.predict(X), np.float64)
    other = init_template(cls(**{**params, "random_state": 4}), X, y)
    assert not np.array_equal(other.coefs_[0], template.coefs_[0])


@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith("MLP")])
def test_init_template_linear_zeros(case):
    factory, dataset = CASES[case]
    X, y = _data(dataset)
    template = init_template(make_pipeline(StandardScaler(), factory()), X, y)
    np.testing.assert_allclose(template[0].mean_, X.mean(axis=0))
    final = template[-1]
    assert not np.any(final.coef_) and not np.any(final.intercept_)
    onx = to_train_onnx(template, X, dtype=np.float32)
    outputs = run_onnx(onx, {"X": X.astype(np.float32)})
    if hasattr(final, "classes_"):
        n_classes = len(np.unique(y))
        np.testing.assert_array_equal(final.classes_, np.unique(y))
        assert final.coef_.shape == ((1 if n_classes == 2 else n_classes), X.shape[1])
        np.testing.assert_allclose(outputs[1], 1 / n_classes, rtol=1e-6)
        assert not np.any(outputs[2])
    else:
        assert np.shape(final.coef_) == (X.shape[1],)
        assert not np.any(outputs[0])


@pytest.mark.parametrize("case", list(CASES))
def test_init_template_without_checks_is_the_same_template(case):
    """check_input=False (a caller that validated the parameters and the data) skips
    scikit-learn's checks and builds the same template: weights, shapes, fitted
    attributes."""
    factory, dataset = CASES[case]
    X, y = _data(dataset)
    estimator = factory()
    if "random_state" in estimator.get_params():
        estimator.set_params(random_state=2)
    checked = init_template(estimator, X, y)
    unchecked = init_template(estimator, X, y, check_input=False)
    for name in ("coefs_", "intercepts_", "coef_", "intercept_", "classes_",
                 "n_features_in_", "n_outputs_", "out_activation_"):
        if hasattr(checked, name):
            got, expected = getattr(unchecked, name), getattr(checked, name)
            if isinstance(expected, list):  # an MLP's layers
                assert len(got) == len(expected)
                for a, b in zip(got, expected):
                    np.testing.assert_array_equal(a, b)
            else:
                np.testing.assert_array_equal(got, expected)
        else:
            assert not hasattr(unchecked, name), name
    np.testing.assert_array_equal(unchecked.predict(X), checked.predict(X))


# -- weights write-back ---------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_set_weights_round_trip(case):
    est, X = _fitted(case, "standard")
    est = __import__("copy").deepcopy(est)
    doubled = {k: 2 * v for k, v in get_weights(est).items()}
    set_weights(est, doubled)
    onx = to_train_onnx(est, X, dtype=np.float64)
    for init in onx.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(init), doubled[init.name])
    outputs = run_onnx(onx, {"X": X})
    if hasattr(est, "predict_proba"):
        _close(outputs[1], est.predict_proba(X), np.float64)
        _close(outputs[2], _logits(est, X), np.float64)
    else:
        _close(outputs[0][:, 0], est.predict(X), np.float64)


def test_set_weights_keeps_sklearn_layout():
    X, y = _data("breast_cancer")
    clf = LogisticRegression(max_iter=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    w = np.arange(X.shape[1], dtype=np.float32).reshape(-1, 1)
    set_weights(clf, {"coef": w, "intercept": np.array([0.5], np.float32)})
    assert clf.coef_.shape == (1, X.shape[1]) and clf.coef_.dtype == np.float64
    np.testing.assert_array_equal(clf.coef_[0], w[:, 0])
    assert clf.intercept_.shape == (1,)
    with pytest.raises(ValueError, match="'bias'.*'coef', 'intercept'"):
        set_weights(clf, {"bias": w})
    with pytest.raises(ValueError, match="'coef' has 3 values"):
        set_weights(clf, {"coef": np.ones(3)})


@pytest.mark.parametrize("opset", [13, 17])
def test_older_opset(opset):
    est, X = _fitted("LogisticRegression-multi", "normalizer")
    onx = to_train_onnx(est, X, target_opset=opset)
    assert [(o.domain, o.version) for o in onx.opset_import] == [("", opset)]
    _close(run_onnx(onx, {"X": X})[1], est.predict_proba(X), np.float64)


def test_equal_weights_are_not_merged_by_skl2onnx():
    # skl2onnx merges initializers with equal values: a one-feature template
    # (zero coef and zero intercept) must still expose both weights.
    from sklearn.linear_model import LogisticRegression

    X = np.array([[0.0], [1.0], [2.0], [3.0]])
    template = init_template(LogisticRegression(), X, np.array([0, 0, 1, 1]))
    onx = to_train_onnx(template, X)
    assert get_train_initializer(onx) == ["coef", "intercept"]
    (raw,) = run_onnx(onx, {"X": X}, ["raw_scores"])
    np.testing.assert_array_equal(raw, np.zeros((4, 1)))


# ----------------------------------------------- wide inputs: a narrow probe converts
@pytest.mark.parametrize("make, target", [
    (lambda: LinearRegression(), "regression"),
    (lambda: LinearRegression(), "two_outputs"),
    (lambda: SGDRegressor(max_iter=5), "regression"),
    (lambda: LogisticRegression(), "binary"),
    (lambda: LogisticRegression(), "multiclass"),
    (lambda: SGDClassifier(loss="log_loss", max_iter=5), "multiclass"),
    (lambda: MLPRegressor(hidden_layer_sizes=(5,), max_iter=5), "two_outputs"),
    (lambda: MLPRegressor(hidden_layer_sizes=(5,), loss="poisson", max_iter=5), "positive"),
    (lambda: MLPClassifier(hidden_layer_sizes=(5,), max_iter=5), "binary"),
    (lambda: MLPClassifier(hidden_layer_sizes=(5,), max_iter=5), "multilabel"),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_wide_estimators_convert_from_a_narrow_probe_to_the_same_graph(monkeypatch, make,
                                                                       target, dtype):
    """Above NARROW_ABOVE features the graph comes from a probe of 2 features, then gets
    its width and weights: the model is the one converted from the full estimator."""
    from ortlearn.convert import conversion

    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 7)).astype(dtype)
    y = {"regression": rng.standard_normal(30), "two_outputs": rng.standard_normal((30, 2)),
         "positive": rng.gamma(2.0, 1.0, 30), "binary": rng.integers(0, 2, 30),
         "multiclass": rng.integers(0, 3, 30),
         "multilabel": rng.integers(0, 2, (30, 3))}[target]
    fitted = make().fit(X, y)
    monkeypatch.setattr(conversion, "NARROW_ABOVE", 10**9)
    full = to_train_onnx(fitted, X)
    monkeypatch.setattr(conversion, "NARROW_ABOVE", 3)
    narrow = to_train_onnx(fitted, X)
    assert narrow == full
    assert fitted.n_features_in_ == 7  # the estimator converted is left alone


def test_a_graph_without_values_holds_the_weights_names_types_and_shapes():
    """values=False: the initializers are weight stubs, which the checker reads as the
    graph inputs they stand for; the rest of the graph is the graph with values."""
    from ortlearn.graph import check_model, is_weight_stub

    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 5))
    fitted = LogisticRegression().fit(X, rng.integers(0, 3, 30))
    full, stubbed = to_train_onnx(fitted, X), to_train_onnx(fitted, X, values=False)
    check_model(stubbed)
    assert [(i.name, i.data_type, list(i.dims)) for i in stubbed.graph.initializer] == [
        (i.name, i.data_type, list(i.dims)) for i in full.graph.initializer]
    assert all(is_weight_stub(i) for i in stubbed.graph.initializer)
    assert not any(is_weight_stub(i) for i in full.graph.initializer)
    assert stubbed.graph.node == full.graph.node
    assert stubbed.ByteSize() < full.ByteSize()
