"""Reliability: one estimator fitted from several threads, what a fitted model keeps."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from benchmarks.memory import STATUS_SOURCE
from ortlearn import OrtGradientOptimizer, OrtLinearClassifier, OrtMLPRegressor, add_loss_output


def _data(n=96, d=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d), dtype=np.float32)
    return X, (X @ rng.standard_normal(d, dtype=np.float32)).astype(np.float32)


def _in_threads(calls):
    """Start every call at once (a barrier), wait, re-raise the first error."""
    barrier, errors = threading.Barrier(len(calls)), []

    def run(call):
        barrier.wait()
        try:
            call()
        except BaseException as error:  # noqa: BLE001 -- reported to the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _mlp(**kw):
    params = dict(hidden_layer_sizes=(32,), solver="adam", batch_size=16, max_iter=5,
                  random_state=0, shuffle=False)
    params.update(kw)
    return OrtMLPRegressor(**params)


def _equal_weights(a, b):
    sa, sb = a.get_state(), b.get_state()
    assert sa.keys() == sb.keys()
    for name in sa:
        np.testing.assert_array_equal(sa[name], sb[name], err_msg=name)


# ------------------------------------------------ one estimator, several threads
def test_partial_fit_from_threads_equals_the_same_calls_in_a_row():
    """Every call applies one whole pass: N calls from 4 threads = N calls in a row."""
    X, y = _data()
    shared, serial = _mlp(), _mlp()
    n_calls = 8
    _in_threads([lambda: [shared.partial_fit(X, y) for _ in range(2)]
                 for _ in range(n_calls // 2)])
    for _ in range(n_calls):
        serial.partial_fit(X, y)
    assert len(shared.train_losses_) == n_calls
    assert shared.t_ == serial.t_ == n_calls * len(X)
    np.testing.assert_array_equal(shared.train_losses_, serial.train_losses_)
    _equal_weights(shared, serial)


def test_fit_from_threads_runs_one_fit_after_the_other():
    X, y = _data()
    shared, serial = _mlp(), _mlp().fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter reached
        _in_threads([lambda: shared.fit(X, y)] * 3)
    # Each fit restarts: the history is that of one fit, not three interleaved.
    assert shared.n_iter_ == serial.n_iter_ == 5
    np.testing.assert_array_equal(shared.train_losses_, serial.train_losses_)
    _equal_weights(shared, serial)


def test_gradient_optimizer_fit_from_threads_warm_start():
    """Warm fits from threads chain: 3 fits of 2 epochs = 6 epochs in a row."""
    X, y = _data()
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", X.shape[1]])
    out = helper.make_tensor_value_info("variable", TensorProto.FLOAT, ["N", 1])
    coef = numpy_helper.from_array(np.zeros((X.shape[1], 1), np.float32), "coef")
    model = helper.make_model(
        helper.make_graph([helper.make_node("MatMul", ["X", "coef"], ["variable"])], "lin",
                          [x], [out], [coef]),
        opset_imports=[helper.make_opsetid("", 17)])
    loss = add_loss_output(model)

    def make():
        return OrtGradientOptimizer(loss, ["coef"], max_iter=2, learning_rate=1e-2,
                                    warm_start=True, random_state=0, batch_size=8)

    shared, serial = make(), make()
    shared.fit(X, y)
    serial.fit(X, y)
    _in_threads([lambda: shared.fit(X, y)] * 3)
    for _ in range(3):
        serial.fit(X, y)
    assert shared.n_iter_ == serial.n_iter_ == 8
    np.testing.assert_array_equal(shared.train_losses_, serial.train_losses_)
    for name, value in serial.get_state().items():
        np.testing.assert_array_equal(shared.get_state()[name], value)


def test_separate_estimators_in_threads_equal_serial_runs():
    X, y = _data(n=200, d=8)
    labels = (y > np.median(y)).astype(np.int64)
    makers = [lambda: _mlp(max_iter=4),
              lambda: _mlp(max_iter=4, solver="sgd", learning_rate_init=0.01),
              lambda: OrtLinearClassifier(max_iter=4, random_state=0, tol=None)]
    targets = [y, y, labels]
    threaded = [make() for make in makers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _in_threads([lambda e=e, t=t: e.fit(X, t) for e, t in zip(threaded, targets)])
        serial = [make().fit(X, t) for make, t in zip(makers, targets)]
    for a, b in zip(threaded, serial):
        np.testing.assert_array_equal(a.train_losses_, b.train_losses_)
        _equal_weights(a, b)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_estimators_with_a_fit_lock_still_clone_pickle_and_copy():
    import copy
    import pickle

    from sklearn.base import clone

    X, y = _data()
    est = _mlp(max_iter=2).fit(X, y)
    for twin in (pickle.loads(pickle.dumps(est)), copy.deepcopy(est)):
        np.testing.assert_array_equal(twin.predict(X), est.predict(X))
        twin.partial_fit(X, y)  # its own lock, its own engine
    assert clone(est).get_params() == est.get_params()


# ------------------------------------------- a fitted model keeps what predicting needs
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_fit_releases_the_training_session_and_partial_fit_rebuilds_it():
    X, y = _data()
    est = _mlp(max_iter=3).fit(X, y)
    assert est._runtime.engine is None
    # partial_fit after fit continues the optimizer from the saved state, as with the
    # engine kept: same numbers as a fit of 3 epochs followed by one pass in one engine.
    reference = _mlp(max_iter=4).fit(X, y)
    est.partial_fit(X, y)
    assert est._runtime.engine is not None
    np.testing.assert_allclose(est.train_losses_[-1], reference.train_losses_[-1], rtol=1e-6)
    for name, value in reference.get_state().items():
        np.testing.assert_allclose(est.get_state()[name], value, rtol=1e-5, atol=1e-6)


_KEPT_CHILD = STATUS_SOURCE + textwrap.dedent(r"""
    import ctypes, gc, json, os, warnings
    import numpy as np
    import ortlearn

    def settle():
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap back to the system

    def threads():
        return len(os.listdir("/proc/self/task"))

    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    # two steps of 200 rows: Adam's moments exist after the first
    X = rng.standard_normal((400, 256), dtype=np.float32)
    y = rng.standard_normal(400, dtype=np.float32)
    # Load the libraries and kernels a fit and a prediction use (not a cost per model).
    ortlearn.OrtMLPRegressor((16,), max_iter=1).fit(X[:64], y[:64]).predict(X[:8])
    settle()
    rss, n_threads = status("VmRSS"), threads()
    est = ortlearn.OrtMLPRegressor((1024, 1024), max_iter=1, batch_size=200, random_state=0)
    est.fit(X, y)
    settle()
    kept, threads_kept = status("VmRSS") - rss, threads()
    est.predict(X[:8])
    settle()
    weights = sum(v.nbytes for v in est.get_state().values())
    print(json.dumps({"kept": kept, "kept_predicting": status("VmRSS") - rss,
                      "weights": weights, "threads": [n_threads, threads_kept]}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_kept_fitted_model_costs_its_weights_not_its_training_session():
    result = subprocess.run([sys.executable, "-c", _KEPT_CHILD], capture_output=True,
                            text=True, timeout=120, check=True)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    weights = figures["weights"]  # 5.3 MB
    # The weights in estimator_ and Adam's two moments (4.4x the weights measured); with
    # the training session kept it was 40x.
    assert figures["kept"] <= 5 * weights + 8e6, figures
    # One inference session more: its copy of the weights, the model, onnxruntime's arena
    # (9x measured; 44x with the training session kept).
    assert figures["kept_predicting"] <= 8 * weights + 16e6, figures
    # The threads of the fit's session went with it.
    assert figures["threads"][1] == figures["threads"][0], figures
