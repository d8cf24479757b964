"""Gradients of converted scikit-learn models with a loss.

Checked against finite differences, and for MLPs against sklearn's own backprop.
"""

import warnings

import numpy as np
import pytest
from gradcheck import assert_close, numeric_gradient, session
from skl2onnx import to_onnx
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.neural_network import MLPClassifier, MLPRegressor

from ortlearn.autodiff import build_gradient
from ortlearn.convert import get_train_initializer, to_train_onnx
from ortlearn.loss import add_loss_output

N = 12


def _data(seed=0, n_classes=None):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, 3))
    if n_classes is None:
        return X, X @ np.array([0.5, -1.0, 2.0]) + 0.3 + 0.1 * rng.standard_normal(N)
    return X, np.arange(N) % n_classes


def _check_against_fd(model, feeds):
    wrt = get_train_initializer(model)
    grad_model = build_gradient(model, wrt=wrt)
    values = session(grad_model).run(None, feeds)
    ref = numeric_gradient(model, feeds, wrt)
    for name, grad in zip(wrt, values[1:]):
        assert_close(grad, ref[name])
    return dict(zip(wrt, values[1:]))


def _fit_quietly(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y)


def test_linear_regression_black_op_graph():
    X, y = _data()
    onx = to_onnx(LinearRegression().fit(X, y), X, black_op={"LinearRegressor"})
    model = add_loss_output(onx, penalty={"coef": 0.1})
    _check_against_fd(model, {"X": X, "label": y.reshape(-1, 1)})


@pytest.mark.parametrize("n_classes", [2, 3])
def test_logistic_regression(n_classes):
    X, y = _data(n_classes=n_classes)
    model = to_train_onnx(LogisticRegression().fit(X, y), X, dtype=np.float64)
    if n_classes == 2:
        loss = add_loss_output(model, "log", output_index="raw_scores", label_name="y",
                               penalty={"coef": 0.1})
        label = y.reshape(-1, 1).astype(np.float64)
    else:
        loss = add_loss_output(model, "cross_entropy", output_index="raw_scores",
                               label_name="y", penalty={"coef": 0.1})
        label = y.astype(np.int64)
    _check_against_fd(loss, {"X": X, "y": label})


def _mlp_loss_model(est, X, alpha):
    """ortlearn's graph of sklearn's MLP objective (up to a factor, see below)."""
    model = to_train_onnx(est, X, dtype=np.float64)
    coefs = [n for n in get_train_initializer(model) if n.startswith("coefficient")]
    if isinstance(est, MLPRegressor):
        # ortlearn: mean squared error + alpha/n ||W||^2 == 2 * sklearn's objective
        return add_loss_output(model, penalty={c: alpha / N for c in coefs}), 0.5
    score = "log" if len(est.classes_) == 2 else "cross_entropy"
    # sklearn: mean log-loss + 0.5 * alpha / n ||W||^2
    penalty = {c: 0.5 * alpha / N for c in coefs}
    return add_loss_output(model, score, output_index="raw_scores", label_name="y",
                           penalty=penalty), 1.0


def _sklearn_gradients(est, X, y):
    """sklearn's own backprop: (loss, coef grads, intercept grads)."""
    units = [X.shape[1]] + list(est.hidden_layer_sizes) + [est.n_outputs_]
    activations = [X] + [None] * (len(units) - 1)
    deltas = [None] * (len(units) - 1)
    coef_grads = [np.empty((a, b)) for a, b in zip(units[:-1], units[1:])]
    intercept_grads = [np.empty(b) for b in units[1:]]
    return est._backprop(X, y, None, activations, deltas, coef_grads, intercept_grads)


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic", "identity"])
@pytest.mark.parametrize("kind", ["regressor", "binary", "multiclass"])
def test_mlp(activation, kind):
    alpha = 0.3
    if kind == "regressor":
        X, y = _data()
        est = MLPRegressor(hidden_layer_sizes=(4, 3), activation=activation, alpha=alpha,
                           max_iter=5, random_state=0)
        target = y.reshape(-1, 1)
    else:
        X, y = _data(n_classes=2 if kind == "binary" else 3)
        est = MLPClassifier(hidden_layer_sizes=(4,), activation=activation, alpha=alpha, max_iter=5,
                            random_state=0)
    _fit_quietly(est, X, y)
    model, factor = _mlp_loss_model(est, X, alpha)
    if kind == "regressor":
        label = target
    elif kind == "binary":
        label = y.reshape(-1, 1).astype(np.float64)
    else:
        label = y.astype(np.int64)
    feeds = {"X": X, ("label" if kind == "regressor" else "y"): label}
    grads = _check_against_fd(model, feeds)

    sk_target = target if kind == "regressor" else est._label_binarizer.transform(y)
    loss, coef_grads, intercept_grads = _sklearn_gradients(est, X, sk_target.astype(np.float64))
    ort_loss = session(model).run(["loss"], feeds)[0]
    np.testing.assert_allclose(factor * ort_loss, loss, rtol=1e-10)
    for i, (cg, ig) in enumerate(zip(coef_grads, intercept_grads)):
        suffix = str(i) if i else ""
        np.testing.assert_allclose(factor * grads[f"coefficient{suffix}"], cg, rtol=1e-9,
                                   atol=1e-12)
        np.testing.assert_allclose(factor * grads[f"intercepts{suffix}"].ravel(), ig,
                                   rtol=1e-9, atol=1e-12)
