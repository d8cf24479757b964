"""Same seed, same result; resuming equals not stopping; predict from many threads."""

import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from families import CLASSES
from sklearn.base import clone

from ortlearn import (
    OrtGradientOptimizer,
    add_loss_output,
)
from ortlearn.estimators import _session_cache as _runtime

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")



def _make(name, solver="sgd", **kwargs):
    if name.startswith("mlp"):
        kwargs.setdefault("hidden_layer_sizes", (4,))
    return CLASSES[name](solver=solver, max_iter=4, batch_size=6, **kwargs)


def _data(name):
    rng = np.random.RandomState(0)
    X = rng.randn(24, 3)
    y = np.arange(24) % 3 if name.endswith("classifier") else X @ [1.0, -2.0, 0.5]
    return X, y


def _output(est, X):
    if hasattr(est, "predict_proba"):
        return est.predict_proba(X)
    return est.predict(X)


@pytest.mark.parametrize("solver", ["sgd", "adam", "adamw", "lbfgs"])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_same_random_state_same_predictions(name, solver):
    X, y = _data(name)
    first = _make(name, solver, random_state=3).fit(X, y)
    second = _make(name, solver, random_state=3).fit(X, y)
    np.testing.assert_array_equal(_output(first, X), _output(second, X))
    assert first.train_losses_ == second.train_losses_


@pytest.mark.parametrize("name", ["mlp_regressor", "mlp_classifier"])
def test_different_random_state_different_weights(name):
    X, y = _data(name)
    first = _make(name, random_state=0).fit(X, y).get_state()
    second = _make(name, random_state=1).fit(X, y).get_state()
    assert not np.array_equal(first["coefficient"], second["coefficient"])


@pytest.mark.parametrize("solver", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_resume_after_pickling_equals_uninterrupted(name, solver):
    """partial_fit x4 == partial_fit x2, pickle round trip (optimizer state kept), x2."""
    X, y = _data(name)
    kwargs = {"classes": np.unique(y)} if name.endswith("classifier") else {}
    straight = _make(name, solver, random_state=0)
    for _ in range(4):
        straight.partial_fit(X, y, **kwargs)
    stopped = _make(name, solver, random_state=0)
    for _ in range(2):
        stopped.partial_fit(X, y, **kwargs)
    resumed = pickle.loads(pickle.dumps(stopped))
    for _ in range(2):
        resumed.partial_fit(X, y)
    for key, value in straight.get_state().items():
        np.testing.assert_array_equal(resumed.get_state()[key], value, err_msg=key)
    np.testing.assert_array_equal(_output(resumed, X), _output(straight, X))


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_set_state_transfers_the_model_exactly(name):
    X, y = _data(name)
    source = _make(name, random_state=0).fit(X, y)
    target = clone(source).set_params(random_state=5, max_iter=1).fit(X, y)
    target.set_state(source.get_state())
    np.testing.assert_array_equal(_output(target, X), _output(source, X))


@pytest.fixture(scope="module")
def loss_onnx(linear_onnx):
    return add_loss_output(linear_onnx)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_gradient_optimizer_warm_start_equals_one_long_fit(loss_onnx, optimizer):
    X = np.random.RandomState(1).randn(30, 3).astype(np.float32)
    y = X @ np.array([1.0, -1.0, 2.0], dtype=np.float32)
    kwargs = dict(optimizer=optimizer, learning_rate="invscaling", eta0=0.05, batch_size=7,
                  random_state=0)
    straight = OrtGradientOptimizer(loss_onnx, max_iter=6, **kwargs).fit(X, y)
    halves = OrtGradientOptimizer(loss_onnx, max_iter=3, warm_start=True, **kwargs)
    halves.fit(X, y)
    halves = pickle.loads(pickle.dumps(halves))  # the engine is rebuilt from the host state
    halves.fit(X, y)
    assert halves.train_losses_ == straight.train_losses_
    for key, value in straight.get_state().items():
        np.testing.assert_array_equal(halves.get_state()[key], value, err_msg=key)


# ------------------------------------------------------------------ concurrency

def _slow_make_session(module, monkeypatch):
    """Count session creations and widen the window in which threads race."""
    real, created = module.make_session, []

    def make_session(*args, **kwargs):
        created.append(threading.get_ident())
        time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "make_session", make_session)
    return created


def _hammer(predict, X, n_threads=8, repeat=3):
    """``predict`` on slices of X from ``n_threads`` threads at once."""
    batches = [X[i::n_threads] for i in range(n_threads)] * repeat
    with ThreadPoolExecutor(n_threads) as pool:
        results = list(pool.map(predict, batches))
    return batches, results


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_predict_from_eight_threads(name, monkeypatch):
    X, y = _data(name)
    est = _make(name, random_state=0).fit(X, y)
    fresh = pickle.loads(pickle.dumps(est))  # no inference session yet
    created = _slow_make_session(_runtime, monkeypatch)
    batches, results = _hammer(lambda b: _output(fresh, b), X)
    assert len(created) == 1
    for batch, got in zip(batches, results):
        np.testing.assert_array_equal(got, _output(est, batch))


def test_gradient_optimizer_predict_from_eight_threads(loss_onnx, monkeypatch):
    X = np.random.RandomState(1).randn(40, 3).astype(np.float32)
    ogo = OrtGradientOptimizer(loss_onnx, max_iter=2, random_state=0).fit(X, X[:, 0])
    fresh = pickle.loads(pickle.dumps(ogo))
    created = _slow_make_session(_runtime, monkeypatch)
    batches, results = _hammer(fresh.predict, X)
    assert len(created) == 1
    for batch, got in zip(batches, results):
        np.testing.assert_array_equal(got, ogo.predict(batch))
