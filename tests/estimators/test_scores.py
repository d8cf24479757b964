"""The scores written from the models' formulas (ortlearn.estimators._scores): the numbers
of the graph ``to_onnx`` converts with skl2onnx, bit for bit."""

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from sklearn.datasets import load_diabetes, load_iris

from ortlearn.estimators import (
    OrtMLPClassifier,
    OrtMLPRegressor,
    OrtSGDClassifier,
    OrtSGDRegressor,
)
from ortlearn.estimators._scores import mlp_scores


def _converted(est, X, outputs):
    """``outputs`` of skl2onnx's graph of ``est`` (``to_onnx``) on ``X``."""
    session = ort.InferenceSession(est.to_onnx().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return dict(zip(outputs, session.run(outputs, {"X": X})))


def _fit(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a few epochs do not converge
        return est.fit(X, y)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("target", ["multiclass", "binary", "multilabel"])
@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic", "identity"])
def test_mlp_classifier_predicts_the_converted_graphs_numbers(dtype, target, activation):
    X, y = load_iris(return_X_y=True)
    X = X.astype(dtype)
    y = {"multiclass": y, "binary": y % 2, "multilabel": np.c_[y % 2, y // 2]}[target]
    est = _fit(OrtMLPClassifier((7, 5), activation=activation, max_iter=5, random_state=0),
               X, y)
    ref = _converted(est, X, ["label", "probabilities", "raw_scores"])
    np.testing.assert_array_equal(est.predict_proba(X), ref["probabilities"])
    np.testing.assert_array_equal(est.predict(X), ref["label"].reshape(est.predict(X).shape))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("loss", ["squared_error", "poisson"])
def test_mlp_regressor_predicts_the_converted_graphs_numbers(dtype, loss):
    X, y = load_diabetes(return_X_y=True)
    X = X.astype(dtype)
    est = _fit(OrtMLPRegressor((6,), loss=loss, max_iter=5, random_state=0), X, y / 100)
    ref = _converted(est, X, ["variable"])
    np.testing.assert_array_equal(est.predict(X), ref["variable"].ravel())


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_sgd_estimators_predict_the_converted_graphs_scores(fit_intercept):
    X, y = load_iris(return_X_y=True)
    clf = _fit(OrtSGDClassifier(fit_intercept=fit_intercept, max_iter=5, random_state=0),
               X, y)
    ref = _converted(clf, X, ["raw_scores"])
    np.testing.assert_array_equal(clf.decision_function(X), ref["raw_scores"])
    reg = _fit(OrtSGDRegressor(fit_intercept=fit_intercept, max_iter=5, random_state=0),
               X[:, :3], X[:, 3])
    np.testing.assert_array_equal(reg.predict(X[:, :3]),
                                  _converted(reg, X[:, :3], ["variable"])["variable"].ravel())


def test_mlp_scores_refuses_an_unknown_activation():
    weights = {"coefficient": np.zeros((2, 3)), "intercepts": np.zeros((1, 3))}
    with pytest.raises(ValueError, match="activation must be one of"):
        mlp_scores(weights, "regressor", "softplus", np.float64)
