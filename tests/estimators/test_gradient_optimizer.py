"""OrtGradientOptimizer: onnxcustom's example, numpy references, pickling, warm start."""

import copy
import pickle

import numpy as np
import pytest
from conftest import run_onnx
from onnx import numpy_helper
from skl2onnx import to_onnx
from sklearn.base import clone
from sklearn.datasets import make_regression
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state

from ortlearn import add_loss_output
from ortlearn.convert import set_weights
from ortlearn.estimators.gradient_optimizer import OrtGradientOptimizer
from ortlearn.exceptions import ConvergenceError
from ortlearn.optim import Adam
from ortlearn.training import Batches


@pytest.fixture(scope="module")
def seed_data():
    """onnxcustom's example: make_regression(n_features=10), float32, sample weights."""
    X, y = make_regression(400, n_features=10, noise=10.0, random_state=0)
    X, y = X.astype(np.float32), y.astype(np.float32)
    w = np.random.RandomState(0).uniform(0.5, 1.5, len(y)).astype(np.float32)
    X_train, X_test, y_train, y_test, w_train, _ = train_test_split(X, y, w, random_state=0)
    lr = LinearRegression().fit(X_train, y_train, sample_weight=w_train)
    onx = to_onnx(lr, X, black_op={"LinearRegressor"})
    onx_loss = add_loss_output(onx, weight_name="weight", score_name="elastic",
                               l1_weight=0.1, l2_weight=0.9, penalty={"coef": {"l2": 0.01}})
    return X_train, X_test, y_train, y_test, w_train, lr, onx_loss


@pytest.fixture(scope="module")
def mse_model(seed_data):
    X_train, *_, lr, _ = seed_data
    return add_loss_output(to_onnx(lr, X_train, black_op={"LinearRegressor"}))


# The elastic loss and the penalty 0.01 |coef|^2 are not LinearRegression's
# objective: the penalty shrinks coef by about 0.02 / (1.8 var(X)) ~ 1 %, the
# 0.1 |residual| term moves it a little more, and SGD with lr=1e-3 jitters it.
COEF_RTOL = 0.03


def test_seed_example(seed_data):
    X_train, _, y_train, _, w_train, lr, onx_loss = seed_data
    train_session = OrtGradientOptimizer(onx_loss, ["intercept", "coef"], learning_rate=1e-3,
                                         random_state=0)
    train_session.fit(X_train, y_train, w_train)
    state_tensors = train_session.get_state()
    losses = train_session.train_losses_
    assert len(losses) == train_session.n_iter_ == 100
    assert np.mean(losses[-10:]) < losses[0]
    scale = np.abs(lr.coef_).max()
    np.testing.assert_allclose(state_tensors["coef"].ravel(), lr.coef_, atol=COEF_RTOL * scale)


def _with_weights(model, weights):
    """A copy of ``model`` whose initializers ``weights`` get new (float32) values."""
    model = copy.deepcopy(model)
    for init in model.graph.initializer:
        if init.name in weights:
            value = np.asarray(weights[init.name], np.float32).reshape(init.dims)
            init.CopyFrom(numpy_helper.from_array(value, init.name))
    return model


def test_perturbed_start_converges(seed_data):
    X_train, _, y_train, _, w_train, lr, onx_loss = seed_data
    rs = np.random.RandomState(1)
    start = _with_weights(onx_loss, {"coef": lr.coef_ + rs.normal(0, 20, 10), "intercept": 0})
    est = OrtGradientOptimizer(start, ["intercept", "coef"], learning_rate=1e-3,
                               random_state=0).fit(X_train, y_train, w_train)
    losses = est.train_losses_
    assert losses[-1] < 0.25 * losses[0]
    scale = np.abs(lr.coef_).max()
    np.testing.assert_allclose(est.get_state()["coef"].ravel(), lr.coef_, atol=COEF_RTOL * scale)


def test_one_epoch_equals_numpy_sgd(seed_data, mse_model):
    X, _, y, *_ = seed_data
    X, y = X[:53], y[:53]
    est = OrtGradientOptimizer(mse_model, learning_rate=1e-3, batch_size=8, max_iter=1,
                               random_state=5).fit(X, y)
    init = {i.name: numpy_helper.to_array(i).astype(np.float64)
            for i in mse_model.graph.initializer}
    coef, intercept = init["coef"], init["intercept"]
    X64, y64 = X.astype(np.float64), y.astype(np.float64).reshape(-1, 1)
    # same batches: the estimator shuffles with _batches and check_random_state(random_state)
    for idx in Batches.for_epoch(len(X), 8, check_random_state(5)):
        residual = y64[idx] - X64[idx] @ coef - intercept
        coef = coef + 1e-3 * 2 / len(idx) * X64[idx].T @ residual
        intercept = intercept + 1e-3 * 2 / len(idx) * residual.sum(axis=0)
    state = est.get_state()
    np.testing.assert_allclose(state["coef"], coef, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state["intercept"], intercept, rtol=1e-5, atol=1e-5)


def test_adam_and_validation_losses(seed_data, mse_model):
    X_train, X_test, y_train, y_test, *_ = seed_data
    zeroed = _with_weights(mse_model, {"coef": np.zeros(10), "intercept": 0})
    est = OrtGradientOptimizer(zeroed, optimizer="adam", learning_rate=1.0, max_iter=8,
                               validation_every=0.25, random_state=0)
    est.fit(X_train, y_train, X_val=X_test, y_val=y_test)
    assert len(est.validation_losses_) == 4  # epochs 2, 4, 6, 8
    assert est.validation_losses_[-1] == pytest.approx(-est.score(X_test, y_test), rel=1e-6)
    pred = est.predict(X_test).ravel()
    assert est.validation_losses_[-1] == pytest.approx(np.mean((pred - y_test) ** 2), rel=1e-4)
    assert est.train_losses_[-1] < 0.1 * est.train_losses_[0]


def test_trained_onnx_equals_sklearn_with_written_back_weights(seed_data):
    X_train, X_test, y_train, _, w_train, lr, onx_loss = seed_data
    est = OrtGradientOptimizer(onx_loss, learning_rate=1e-3, max_iter=3, random_state=0)
    est.fit(X_train, y_train, w_train)
    trained = est.get_trained_onnx()
    assert [i.name for i in trained.graph.input] == ["X"]
    assert [o.name for o in trained.graph.output] == ["variable"]
    skl = copy.deepcopy(lr)
    set_weights(skl, est.get_state())
    got = run_onnx(trained, {"X": X_test})[0].ravel()
    np.testing.assert_allclose(got, skl.predict(X_test), rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(est.predict(X_test).ravel(), got)


def test_pickle_clone_and_warm_start(seed_data, mse_model):
    X_train, X_test, y_train, *_ = seed_data
    params = dict(learning_rate="invscaling", eta0=1e-2, batch_size=16, random_state=3,
                  optimizer="sgd", momentum=0.5)
    full = OrtGradientOptimizer(mse_model, max_iter=4, **params).fit(X_train, y_train)
    half = OrtGradientOptimizer(mse_model, max_iter=2, warm_start=True, **params)
    half.fit(X_train, y_train)
    restored = pickle.loads(pickle.dumps(half))
    np.testing.assert_array_equal(restored.predict(X_test), half.predict(X_test))
    restored.fit(X_train, y_train)  # continues: weights, momentum, epochs, shuffling
    assert restored.n_iter_ == 4
    np.testing.assert_allclose(restored.train_losses_, full.train_losses_, rtol=1e-6)
    for name, value in full.get_state().items():
        np.testing.assert_array_equal(restored.get_state()[name], value)
    assert not hasattr(clone(full), "state_")
    copy.deepcopy(full).predict(X_test)


def test_divergence_keeps_finite_weights(seed_data, mse_model):
    X_train, X_test, y_train, *_ = seed_data
    est = OrtGradientOptimizer(mse_model, learning_rate=1e10, max_iter=5, random_state=0)
    with pytest.raises(ConvergenceError, match="diverged"):
        est.fit(X_train, y_train)
    assert all(np.isfinite(v).all() for v in est.get_state().values())
    assert np.isfinite(est.predict(X_test)).all()


def test_float64_graph_without_weight_input():
    X, y = make_regression(120, n_features=3, noise=0.1, random_state=2)
    onx = add_loss_output(to_onnx(LinearRegression().fit(X, y), X,
                                  black_op={"LinearRegressor"}))
    est = OrtGradientOptimizer(onx, max_iter=5, random_state=0).fit(X, y)
    assert est.input_names_ == ["X", "label"]
    assert est.predict(X).dtype == np.float64
    # default schedule: invscaling, eta0=0.01, power_t=0.25 per epoch
    assert est._learning_rate_at(16) == pytest.approx(0.01 / 2)


def test_input_checks(seed_data, mse_model):
    X_train, _, y_train, _, w_train, _, onx_loss = seed_data
    est = OrtGradientOptimizer(onx_loss, max_iter=1)
    X_nan = X_train.copy()
    X_nan[0, 0] = np.nan
    with pytest.raises(ValueError, match="X contains NaN"):
        est.fit(X_nan, y_train)
    with pytest.raises(ValueError, match="y has"):
        est.fit(X_train, y_train[:-1])
    with pytest.raises(ValueError, match=r"sample_weight must have shape"):
        est.fit(X_train, y_train, w_train[:-1])
    with pytest.raises(ValueError, match="3 features, the graph.s input .X. expects 10"):
        est.fit(X_train[:, :3], y_train)
    with pytest.raises(ValueError, match=r"Unknown weights \['W'\]"):
        OrtGradientOptimizer(onx_loss, ["W"], max_iter=1).fit(X_train, y_train)
    with pytest.raises(ValueError, match="no input 'weight'"):
        OrtGradientOptimizer(mse_model, max_iter=1).fit(X_train, y_train, w_train)
    with pytest.raises(ValueError, match="learning_rate"):
        OrtGradientOptimizer(onx_loss, learning_rate="optimal").fit(X_train, y_train)
    with pytest.raises(ValueError, match="'optimizer' parameter of OrtGradientOptimizer"):
        OrtGradientOptimizer(onx_loss, optimizer="rmsprop").fit(X_train, y_train)
    fitted = OrtGradientOptimizer(onx_loss, max_iter=1).fit(X_train, y_train)
    with pytest.raises(ValueError, match=r"missing weights \['intercept'\]"):
        fitted.set_state({"coef": np.zeros((10, 1))})


@pytest.mark.parametrize("params, error, match", [
    ({"learning_rate": 0.0}, ValueError, "'learning_rate' parameter"),
    ({"learning_rate": float("inf")}, ValueError, "'learning_rate' parameter"),
    ({"eta0": -1.0}, ValueError, "'eta0' parameter"),
    ({"power_t": -0.5}, ValueError, "'power_t' parameter"),
    ({"max_iter": 0}, ValueError, "'max_iter' parameter"),
    ({"batch_size": 2.5}, ValueError, "'batch_size' parameter"),
    ({"momentum": 1.5}, ValueError, "'momentum' parameter"),
    ({"validation_every": 1.5}, ValueError, "'validation_every' parameter"),
    ({"validation_every": -1}, ValueError, "'validation_every' parameter"),
    ({"optimizer": object()}, ValueError, "'optimizer' parameter"),
    ({"weights_to_train": "coef"}, ValueError, "'weights_to_train' parameter"),
    ({"exc": 1}, ValueError, "'exc' parameter"),
    ({"device": 0}, ValueError, "'device' parameter"),
    ({"device": "tpu"}, ValueError, "Unknown device 'tpu'"),
])
def test_parameter_validation(seed_data, params, error, match):
    X_train, _, y_train, _, _, _, onx_loss = seed_data
    with pytest.raises(error, match=match):
        OrtGradientOptimizer(onx_loss, max_iter=params.pop("max_iter", 1),
                             **params).fit(X_train, y_train)


@pytest.mark.parametrize("params", [
    {"validation_every": 0}, {"validation_every": 0.5}, {"validation_every": 3},
    {"optimizer": Adam(beta_1=0.8)}, {"optimizer": "adamw"}, {"exc": np.bool_(False)},
    {"learning_rate": "constant", "eta0": 1e-3}, {"weights_to_train": ("coef",)},
])
def test_parameter_validation_accepts(seed_data, params):
    X_train, X_test, y_train, *_ , onx_loss = seed_data
    est = OrtGradientOptimizer(onx_loss, max_iter=3, learning_rate=params.pop(
        "learning_rate", 1e-3), **params).fit(X_train, y_train, X_val=X_test[:20],
                                            y_val=np.zeros(20, np.float32))
    assert est.n_iter_ == 3


def test_scalar_sample_weight_weights_every_row(seed_data):
    X_train, _, y_train, *_, onx_loss = seed_data
    params = dict(learning_rate=1e-3, max_iter=2, random_state=0)
    scalar = OrtGradientOptimizer(onx_loss, **params).fit(X_train, y_train, 2.0)
    array = OrtGradientOptimizer(onx_loss, **params).fit(
        X_train, y_train, np.full(len(y_train), 2.0, np.float32))
    for name, value in array.get_state().items():
        np.testing.assert_array_equal(scalar.get_state()[name], value)
