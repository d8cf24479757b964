"""TrainingEngine and minimize_lbfgs against numpy and scikit-learn references."""

import numpy as np
import pytest
from skl2onnx import to_onnx
from sklearn.datasets import make_classification
from sklearn.linear_model import LinearRegression, LogisticRegression

from ortlearn import CheckpointState, add_loss_output
from ortlearn.convert import to_train_onnx
from ortlearn.exceptions import ConvergenceError
from ortlearn.optim import SGD, Adam
from ortlearn.training import Batches, TrainingEngine, minimize_lbfgs

N_FEATURES = 4


@pytest.fixture(scope="module")
def data():
    rs = np.random.RandomState(0)
    X = rs.randn(50, N_FEATURES).astype(np.float32)
    y = (X @ rs.randn(N_FEATURES) + 0.5 + 0.1 * rs.randn(50)).astype(np.float32)
    return X, y.reshape(-1, 1)


@pytest.fixture(scope="module")
def loss_model(data):
    X, y = data
    onx = to_onnx(LinearRegression().fit(X, y.ravel()), X, black_op={"LinearRegressor"})
    return add_loss_output(onx)  # mean squared error, inputs X, label


ZERO = {"coef": np.zeros((N_FEATURES, 1), np.float32), "intercept": np.zeros(1, np.float32)}


def _grad(X, y, w, b):
    """Gradient of mean((y - Xw - b)^2) and the loss, in float64."""
    residual = y - X @ w - b
    m = len(X)
    return -2 / m * X.T @ residual, -2 / m * residual.sum(axis=0), float(np.mean(residual ** 2))


def test_batches_cover_rows_in_the_generator_order():
    batches = Batches.for_epoch(11, 4, np.random.RandomState(3))
    assert [len(b) for b in batches] == [4, 4, 3]
    np.testing.assert_array_equal(np.concatenate(batches), np.random.RandomState(3).permutation(11))
    assert [b.tolist() for b in Batches.for_epoch(3, 2)] == [[0, 1], [2]]
    with pytest.raises(ValueError, match="batch_size"):
        Batches.for_epoch(3, 0)


def test_sgd_epoch_equals_numpy_minibatch_sgd(data, loss_model):
    X, y = data
    engine = TrainingEngine(loss_model, ["coef", "intercept"], SGD(), initial_weights=ZERO)
    assert engine.input_names == ["X", "label"]
    lr = 0.05
    engine.set_learning_rate(lr)
    batches = Batches.for_epoch(len(X), 7, np.random.RandomState(0))
    loss = engine.train_epoch([X, y], batches)

    X64, y64 = X.astype(np.float64), y.astype(np.float64)
    w, b = np.zeros((N_FEATURES, 1)), np.zeros(1)
    losses = []
    for idx in batches:
        gw, gb, batch_loss = _grad(X64[idx], y64[idx], w, b)
        losses.append(batch_loss * len(idx))
        w, b = w - lr * gw, b - lr * gb
    state = engine.get_state()
    np.testing.assert_allclose(state["coef"], w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state["intercept"], b, rtol=1e-5, atol=1e-5)
    assert loss == pytest.approx(sum(losses) / len(X), rel=1e-5)
    assert engine.n_steps == len(batches)


def test_adam_epoch_equals_numpy_adam(data, loss_model):
    X, y = data
    engine = TrainingEngine(loss_model, ["coef", "intercept"], Adam(), initial_weights=ZERO)
    lr = 0.01
    engine.set_learning_rate(lr)
    batches = Batches.for_epoch(len(X), 10, np.random.RandomState(1))
    engine.train_epoch([X, y], batches)

    params = [np.zeros((N_FEATURES, 1)), np.zeros(1)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t, idx in enumerate(batches, start=1):
        grads = _grad(X[idx].astype(np.float64), y[idx].astype(np.float64), *params)[:2]
        lr_t = lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)  # scikit-learn's Adam
        for i, g in enumerate(grads):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g ** 2
            params[i] = params[i] - lr_t * m[i] / (np.sqrt(v[i]) + 1e-8)
    state = engine.get_state()
    np.testing.assert_allclose(state["coef"], params[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state["intercept"], params[1], rtol=1e-4, atol=1e-5)


def test_eval_loss_and_lr_schedule(data, loss_model):
    X, y = data
    engine = TrainingEngine(loss_model, ["coef", "intercept"], SGD(), input_names=["label", "X"],
                            initial_weights=ZERO)
    # arrays follow input_names, not the graph's order
    assert engine.eval_loss([y, X]) == pytest.approx(float(np.mean(y.astype(np.float64) ** 2)),
                                                     rel=1e-6)
    seen = []
    engine.train_epoch([y, X], Batches.for_epoch(len(X), 20),
                       lr_for_step=lambda step: seen.append(step) or 0.01 / step)
    assert seen == [1, 2, 3]
    assert engine.optimizer_state()["learning_rate"] == pytest.approx(0.01 / 3)


def test_state_round_trip_and_errors(data, loss_model):
    engine = TrainingEngine(loss_model, ["coef", "intercept"], SGD())
    state = engine.get_state()
    assert list(state) == ["coef", "intercept"]
    new = {"coef": np.arange(N_FEATURES, dtype=np.float64).reshape(-1, 1),
           "intercept": np.array([2.0])}
    engine.set_state(new)  # float64 values are cast to the graph's float32
    got = engine.get_state()
    assert got["coef"].dtype == np.float32
    np.testing.assert_array_equal(got["coef"].ravel(), np.arange(N_FEATURES))
    with pytest.raises(ValueError, match=r"unknown weights \['bias'\].*missing weights "
                                         r"\['intercept'\]"):
        engine.set_state({"coef": new["coef"], "bias": np.zeros(1)})
    with pytest.raises(ValueError, match=r"'coef' has shape \(4,\), expected \(4, 1\)"):
        engine.set_state({"coef": np.zeros(N_FEATURES), "intercept": np.zeros(1)})


def test_constructor_errors(loss_model):
    with pytest.raises(ValueError, match=r"Unknown weights \['W'\]"):
        TrainingEngine(loss_model, ["W"], SGD())
    with pytest.raises(ValueError, match="not float32/float64"):
        TrainingEngine(loss_model, ["shape_tensor"], SGD())
    with pytest.raises(ValueError, match=r"missing \['label'\]"):
        TrainingEngine(loss_model, ["coef"], SGD(), input_names=["X"])
    with pytest.raises(ValueError, match="no output 'cost'"):
        TrainingEngine(loss_model, ["coef"], SGD(), loss_output="cost")
    with pytest.raises(TypeError, match="optimizer"):
        TrainingEngine(loss_model, ["coef"], "sgd")
    with pytest.raises(ValueError, match="shape"):
        TrainingEngine(loss_model, ["coef"], SGD(), initial_weights={"coef": np.zeros(3)})


def test_optimizer_state_resumes_identically(data, loss_model, tmp_path):
    X, y = data
    epochs = [Batches.for_epoch(len(X), 8, np.random.RandomState(seed)) for seed in (0, 1)]
    reference = TrainingEngine(loss_model, ["coef", "intercept"], Adam(), initial_weights=ZERO)
    reference.set_learning_rate(0.02)
    for batches in epochs:
        reference.train_epoch([X, y], batches)

    first = TrainingEngine(loss_model, ["coef", "intercept"], Adam(), initial_weights=ZERO)
    first.set_learning_rate(0.02)
    first.train_epoch([X, y], epochs[0])
    CheckpointState.save_checkpoint(first.checkpoint_state(), tmp_path / "ckpt",
                                    include_optimizer_state=True)
    saved = CheckpointState.load_checkpoint(tmp_path / "ckpt")
    assert saved.optimizer_step == len(epochs[0])

    resumed = TrainingEngine(loss_model, ["coef", "intercept"], Adam(),
                             initial_weights=first.get_state())
    resumed.load_optimizer_state(first.optimizer_state())
    assert resumed.n_steps == len(epochs[0])
    resumed.train_epoch([X, y], epochs[1])
    for name, value in reference.get_state().items():
        np.testing.assert_array_equal(resumed.get_state()[name], value)


def test_divergence_restores_last_finite_weights(data, loss_model):
    X, y = data
    engine = TrainingEngine(loss_model, ["coef", "intercept"], SGD(), initial_weights=ZERO)
    engine.set_learning_rate(1e-3)
    engine.train_epoch([X, y], Batches.for_epoch(len(X), 10))
    before = engine.get_state()
    engine.set_learning_rate(1e10)
    with pytest.raises(ConvergenceError, match="diverged"):
        engine.train_epoch([X, y], Batches.for_epoch(len(X), 10))
    after = engine.get_state()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])
    # still usable
    engine.set_learning_rate(1e-3)
    assert np.isfinite(engine.train_epoch([X, y], Batches.for_epoch(len(X), 10)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lbfgs_reaches_logistic_regression_objective(dtype):
    X, y = make_classification(200, 5, random_state=0)
    C, n = 0.5, len(y)
    clf = LogisticRegression(C=C, tol=1e-10, max_iter=1000).fit(X, y)
    onx = to_train_onnx(clf, X, dtype=dtype)
    # mean log-loss + 1/(2Cn) |w|^2 = (C sum loss + |w|^2 / 2) / (C n): same minimiser
    loss = add_loss_output(onx, "log", label_name="y", output_index="raw_scores",
                           penalty={"coef": 1 / (2 * C * n)})
    start = {"coef": np.zeros((5, 1)), "intercept": np.zeros(1)}
    result = minimize_lbfgs(
        loss, ["coef", "intercept"], start, [X.astype(dtype), y.astype(dtype).reshape(-1, 1)],
        max_iter=1000, tol=1e-10 if dtype == np.float64 else 1e-6)
    weights, value = result.weights, result.loss
    assert 0 < result.n_iter < 1000 and result.converged and result.status == "converged"

    def objective(coef, intercept):
        z = X @ np.ravel(coef).astype(np.float64) + float(np.ravel(intercept)[0])
        return C * np.sum(np.logaddexp(0, z) - y * z) + 0.5 * np.sum(np.square(coef, dtype=float))

    expected = objective(clf.coef_, clf.intercept_)
    rel = 1e-6 if dtype == np.float64 else 1e-5
    assert objective(weights["coef"], weights["intercept"]) == pytest.approx(expected, rel=rel)
    assert value == pytest.approx(expected / (C * n), rel=rel)
    assert weights["coef"].dtype == dtype


@pytest.mark.filterwarnings("ignore:L-BFGS failed to converge")
def test_weight_stubs_train_from_the_initial_weights_given(data, loss_model):
    """A graph whose weights hold no values (to_train_onnx(values=False)) trains from the
    initial weights given, as the graph holding them does; without them, a ValueError."""
    from ortlearn.graph import weight_stub

    X, y = data
    start = {"coef": np.arange(N_FEATURES, dtype=np.float32).reshape(-1, 1) / 10,
             "intercept": np.array([0.5], np.float32)}
    stubbed = type(loss_model)()
    stubbed.CopyFrom(loss_model)
    for init in stubbed.graph.initializer:
        if init.name in start:
            init.CopyFrom(weight_stub(init.name, init.data_type, init.dims))
    with pytest.raises(ValueError, match=r"\['coef', 'intercept'\] hold no value .* "
                                         "initial_weights"):
        TrainingEngine(stubbed, ["coef", "intercept"], SGD())
    states = []
    for model in (loss_model, stubbed):
        engine = TrainingEngine(model, ["coef", "intercept"], SGD(), initial_weights=start)
        engine.train_epoch([X, y], Batches.for_epoch(len(X), 8, np.random.RandomState(0)))
        states.append(engine.get_state())
    for name in start:
        np.testing.assert_array_equal(states[0][name], states[1][name])
    result = minimize_lbfgs(stubbed, ["coef", "intercept"], start, [X, y], max_iter=5)
    expected = minimize_lbfgs(loss_model, ["coef", "intercept"], start, [X, y], max_iter=5)
    for name in start:
        np.testing.assert_array_equal(result.weights[name], expected.weights[name])
