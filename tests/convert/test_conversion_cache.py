"""``to_train_onnx`` keeps the last graphs it converted: an estimator of the same structure
(a fold, a clone) gets a copy with its own weights, the graph a fresh conversion gives."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression, SGDRegressor
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from ortlearn.convert import conversion, get_weights
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


def test_a_pipeline_is_converted_each_time(conversions):
    rs = np.random.RandomState(0)
    X = rs.randn(40, 3)
    pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, X[:, 0] > 0)
    conversion.to_train_onnx(pipe, X)
    conversion.to_train_onnx(pipe, X)
    assert len(conversions) == 2
