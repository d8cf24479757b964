"""``to_train_onnx`` keeps the last graphs it converted: an estimator of the same structure
(a fold, a clone) gets a copy with its own weights, the graph a fresh conversion gives."""

from functools import partial

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression, SGDRegressor
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from ortlearn.convert import SUPPORTED_ESTIMATORS, conversion, get_weights
from ortlearn.graph.cache import LRUCache

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


@pytest.fixture
def conversions(monkeypatch):
    """An empty cache, and the list of skl2onnx conversions made."""
    monkeypatch.setattr(conversion, "_CONVERTED", LRUCache(16))
    made, convert = [], conversion._skl2onnx_convert

    def counted(*args, **kwargs):
        made.append(1)
        return convert(*args, **kwargs)

    monkeypatch.setattr(conversion, "_skl2onnx_convert", counted)
    return made


def _bytes(model):
    return model.SerializeToString(deterministic=True)


def _fitted(make, seed, y_kind="binary"):
    rs = np.random.RandomState(seed)
    X = rs.randn(60, 4)
    y = (X[:, 0] > 0).astype(int) if y_kind == "binary" else rs.randint(0, 3, 60)
    return make().fit(X, y), X


@pytest.mark.parametrize("make", [lambda: LogisticRegression(), lambda: SGDRegressor(),
                                  lambda: MLPClassifier((5,), max_iter=5, random_state=0)])
def test_the_same_structure_is_converted_once_with_each_fits_weights(make, conversions):
    first, X = _fitted(make, 0)
    second, _ = _fitted(make, 1)
    ours, theirs = (next(iter(get_weights(est).values())) for est in (first, second))
    assert not np.array_equal(ours, theirs)
    graphs = [conversion.to_train_onnx(est, X) for est in (first, second)]
    assert len(conversions) == 1
    conversion._CONVERTED.clear()
    assert _bytes(conversion.to_train_onnx(second, X)) == _bytes(graphs[1])  # a fresh one
    assert _bytes(graphs[0]) != _bytes(graphs[1])


def test_other_classes_or_params_or_dtypes_convert_again(conversions):
    binary, X = _fitted(LogisticRegression, 0)
    three, _ = _fitted(LogisticRegression, 0, "three")
    for est, dtype in ((binary, np.float32), (three, np.float32), (binary, np.float64),
                       (LogisticRegression(fit_intercept=False).fit(X, binary.predict(X)),
                        np.float32)):
        conversion.to_train_onnx(est, X, dtype=dtype)
    assert len(conversions) == 4


def test_a_grid_over_training_parameters_converts_once(conversions):
    _, X = _fitted(LogisticRegression, 0)
    y = X[:, 0] > 0
    for C, seed in ((0.1, 0), (1.0, 1), (10.0, None)):
        conversion.to_train_onnx(LogisticRegression(C=C, random_state=seed).fit(X, y), X)
    assert len(conversions) == 1


def test_a_pipeline_is_converted_each_time(conversions):
    rs = np.random.RandomState(0)
    X = rs.randn(40, 3)
    pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, X[:, 0] > 0)
    conversion.to_train_onnx(pipe, X)
    conversion.to_train_onnx(pipe, X)
    assert len(conversions) == 2


def _alternatives(estimator, name):
    """Other values of parameter ``name``: every string option scikit-learn's constraints
    list, else a changed number or flag."""
    value = estimator.get_params()[name]
    options = []
    for constraint in type(estimator)._parameter_constraints.get(name, []):
        options += sorted(getattr(constraint, "options", ()), key=str)
        if constraint == "boolean":
            options += [True, False]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        options.append(value * 2 + 1)
    if value is None or name == "random_state":
        options.append(3 if name in ("random_state", "n_jobs") else "balanced")
    return [option for option in options if option is not value and option != value]


def _supported_fitted():
    rs = np.random.RandomState(0)
    X = rs.randn(30, 3)
    y3 = rs.randint(0, 3, 30)
    for est in SUPPORTED_ESTIMATORS:
        make = {"MLPClassifier": partial(MLPClassifier, (4,)),
                "SGDClassifier": partial(est, loss="log_loss")}.get(est.__name__, est)
        kind = ("classifier" if hasattr(est, "predict_proba") or "Classifier" in est.__name__
                else "regressor")
        yield pytest.param(make, X, y3 if kind == "classifier" else X[:, 0], id=est.__name__)


@pytest.mark.parametrize(("make", "X", "y"), list(_supported_fitted()))
def test_the_parameters_the_key_leaves_out_do_not_change_the_graph(make, X, y):
    """What the conversion cache shares across a grid must be what skl2onnx ignores: each
    left-out parameter, set to each of its other values, converts to the same graph."""
    fitted = make().set_params(**{"max_iter": 5} if "max_iter" in make().get_params() else {})
    fitted.fit(X, y)
    reference = _bytes(conversion._convert(fitted, get_weights(fitted), X, np.float32, 18))
    tried = 0
    for name in sorted(conversion._TRAINING_ONLY_PARAMS & set(fitted.get_params())):
        original = fitted.get_params()[name]
        for value in _alternatives(fitted, name):
            fitted.set_params(**{name: value})
            graph = conversion._convert(fitted, get_weights(fitted), X, np.float32, 18)
            assert _bytes(graph) == reference, (name, value)
            tried += 1
        fitted.set_params(**{name: original})
    assert tried >= 3
