"""Divergence, KeyboardInterrupt and failed saves: the last good weights survive."""

import os
import warnings

import numpy as np
import pytest
from families import CLASSES
from skl2onnx import to_onnx
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression

from ortlearn import (
    CheckpointState,
    OrtGradientOptimizer,
    TrainingSession,
    add_loss_output,
)
from ortlearn.artifacts import LossType, OptimType, generate_artifacts
from ortlearn.exceptions import ConvergenceError
from ortlearn.optim import SGD
from ortlearn.training import Batches, TrainingEngine

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")



def _make(name, solver, lr=None, **kwargs):
    cls = CLASSES[name]
    if name.startswith("mlp"):
        kwargs.setdefault("hidden_layer_sizes", (3,))
        if lr is not None:
            kwargs["learning_rate_init"] = lr
    elif lr is not None:
        kwargs.update(eta0=lr, learning_rate="constant")
    return cls(solver=solver, random_state=0, **kwargs)


def _data(name, dtype=np.float32):
    rng = np.random.RandomState(0)
    X = rng.randn(20, 3).astype(dtype)
    y = np.arange(20) % 2 if name.endswith("classifier") else X @ [1.0, -2.0, 0.5]
    return X, y


def _all_finite(state):
    return all(np.isfinite(v).all() for v in state.values())


# ------------------------------------------------------------------- divergence

@pytest.mark.parametrize("solver", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_overflowing_learning_rate_stops_with_finite_weights(name, solver):
    X, y = _data(name)
    # float32 and a step of 1e36: the weights overflow within the first epochs
    est = _make(name, solver, lr=1e36, max_iter=5)
    with pytest.raises(ConvergenceError, match="diverged"):
        est.fit(X * 1e3, y)
    assert est.n_iter_ < 5
    assert np.isfinite(est.train_losses_).all()
    assert _all_finite(est.get_state())
    pred = est.predict(X)
    assert pred.shape == (20,) and np.isfinite(pred.astype(float)).all()


@pytest.mark.parametrize("batch", [4, 20])
@pytest.mark.parametrize("epoch_loop", [True, False])
def test_a_diverging_epoch_restores_the_previous_epochs_weights(epoch_loop, batch):
    """Bit for bit, one onnxruntime call per epoch or per batch. Batches of 4 and no loop:
    the epoch's runs overwrite both ping-pong halves, the weights kept are a copy; one
    run (a loop, or one batch) reads them from the halves it does not write. Each time
    what is restored is what was live when the epoch began: the initial weights, an
    epoch's, those ``set_state`` wrote, those a restore wrote."""
    X, y = _data("linear_regressor")
    y = y.astype(np.float32)[:, None]
    onx = to_onnx(LinearRegression().fit(X, y.ravel()), X, black_op={"LinearRegressor"})
    engine = TrainingEngine(add_loss_output(onx), ["coef", "intercept"], SGD(),
                            epoch_loop=epoch_loop)
    batches = Batches.for_epoch(len(X), batch)
    finite = engine.get_state()

    def epochs_to_divergence():
        """Epochs at a rate of 1e30 until one diverges; that one's start is restored."""
        engine.set_learning_rate(1e30)
        for epoch in range(5):
            start = engine.get_state()
            try:
                engine.train_epoch([X, y], batches)
            except ConvergenceError:
                for name, value in engine.get_state().items():
                    np.testing.assert_array_equal(value, start[name], err_msg=name)
                return epoch
        pytest.fail("no divergence")

    epochs_to_divergence()
    epochs_to_divergence()  # from the weights a restore wrote
    engine.set_state(finite)
    engine.set_learning_rate(0.01)
    engine.train_epoch([X, y], batches)
    epochs_to_divergence()
    # weights of 1e18: the first epoch overflows, back to what set_state wrote
    engine.set_state({name: np.full_like(value, 1e18) for name, value in finite.items()})
    assert epochs_to_divergence() == 0
    np.testing.assert_array_equal(engine.get_state()["coef"], np.float32(1e18))


@pytest.mark.parametrize("name", ["mlp_regressor", "linear_regressor"])
def test_lbfgs_overflow_is_a_convergence_error(name):
    X, y = _data(name, np.float64)
    est = _make(name, "lbfgs", max_iter=5)
    # (1e200)^2 overflows float64: the loss is infinite from the start
    with pytest.raises(ConvergenceError, match="L-BFGS diverged"):
        est.fit(X, y * 1e200)
    assert est.train_losses_ == []
    assert _all_finite(est.get_state())
    assert np.isfinite(est.predict(X)).all()


@pytest.mark.parametrize("solver", ["sgd", "adam", "adamw", "lbfgs"])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_huge_features_never_leave_non_finite_weights(name, solver):
    """Whatever happens with huge data: an error, or finite weights and losses."""
    X, y = _data(name, np.float64)
    est = _make(name, solver, max_iter=3)
    try:
        est.fit(X * 1e150, y)
    except ConvergenceError:
        pass
    assert np.isfinite(est.train_losses_).all()
    assert _all_finite(est.get_state())


@pytest.fixture(scope="module")
def loss_onnx(linear_onnx):
    return add_loss_output(linear_onnx)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_gradient_optimizer_divergence_raises_or_warns(loss_onnx, optimizer):
    X, y = _data("linear_regressor")
    kwargs = dict(optimizer=optimizer, learning_rate=1e36, max_iter=5, batch_size=5,
                  random_state=0)
    with pytest.raises(ConvergenceError, match="diverged"):
        OrtGradientOptimizer(loss_onnx, **kwargs).fit(X * 1e3, y)
    ogo = OrtGradientOptimizer(loss_onnx, exc=False, **kwargs)
    with pytest.warns(ConvergenceWarning, match="diverged"):
        ogo.fit(X * 1e3, y)
    assert ogo.n_iter_ < 5
    assert np.isfinite(ogo.train_losses_).all()
    assert _all_finite(ogo.get_state())
    assert np.isfinite(ogo.predict(X)).all()
    # still usable: a sane continuation trains from the kept weights
    ogo.set_params(learning_rate=1e-3, warm_start=True, max_iter=1)
    ogo.fit(X, y)
    assert np.isfinite(ogo.train_losses_).all()


# ----------------------------------------------------------------- interruption

def _interrupt_mid_epoch(monkeypatch, at_epoch):
    """Epoch ``at_epoch`` learns its first batch only, then Ctrl-C arrives."""
    original, calls = TrainingEngine.train_epoch, []

    def train_epoch(self, arrays, batch_indices, *args, **kwargs):
        calls.append(1)
        if len(calls) == at_epoch:
            original(self, arrays, batch_indices[:1], *args, **kwargs)
            raise KeyboardInterrupt
        return original(self, arrays, batch_indices, *args, **kwargs)

    monkeypatch.setattr(TrainingEngine, "train_epoch", train_epoch)


@pytest.mark.parametrize("solver", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_keyboard_interrupt_keeps_the_weights_reached(name, solver, monkeypatch):
    X, y = _data(name, np.float64)

    def interrupted_fit():
        est = _make(name, solver, lr=0.05, max_iter=10, batch_size=5, tol=None
                    if name.startswith("linear") else 0.0)
        with pytest.warns(UserWarning, match="interrupted"):
            est.fit(X, y)
        return est

    _interrupt_mid_epoch(monkeypatch, at_epoch=3)
    est = interrupted_fit()
    assert est.n_iter_ == 2 and len(est.train_losses_) == 2
    state = est.get_state()
    assert _all_finite(state)
    # the batch learned during the interrupted epoch is kept
    two_epochs = _make(name, solver, lr=0.05, max_iter=2, batch_size=5, tol=None
                       if name.startswith("linear") else 0.0).fit(X, y)
    assert any(not np.array_equal(v, two_epochs.get_state()[k]) for k, v in state.items())
    # the ONNX predictions are those of the kept weights
    np.testing.assert_allclose(est.predict(X), est.estimator_.predict(X), rtol=1e-6, atol=1e-8)
    # and deterministic
    _interrupt_mid_epoch(monkeypatch, at_epoch=3)
    again = interrupted_fit().get_state()
    for key, value in state.items():
        np.testing.assert_array_equal(value, again[key])


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_keyboard_interrupt_during_lbfgs_keeps_the_best_weights(name, monkeypatch):
    from ortlearn.training import lbfgs as _lbfgs

    X, y = _data(name, np.float64)
    evaluate = _lbfgs._LossAndGradient.__call__
    losses = []

    def interrupted(self, flat):
        if self.n_calls == 3:
            raise KeyboardInterrupt
        loss, grad = evaluate(self, flat)
        losses.append(loss)
        return loss, grad

    monkeypatch.setattr(_lbfgs._LossAndGradient, "__call__", interrupted)
    est = _make(name, "lbfgs", max_iter=50)
    with pytest.warns(UserWarning, match="interrupted"):
        est.fit(X, y)
    assert len(losses) == 3 and est.loss_ == min(losses)
    assert _all_finite(est.get_state())
    np.testing.assert_allclose(est.predict(X), est.estimator_.predict(X), rtol=1e-6, atol=1e-8)


def test_gradient_optimizer_keyboard_interrupt(loss_onnx, monkeypatch):
    X, y = _data("linear_regressor")
    _interrupt_mid_epoch(monkeypatch, at_epoch=2)
    ogo = OrtGradientOptimizer(loss_onnx, learning_rate=0.01, max_iter=5, batch_size=5,
                               random_state=0)
    with pytest.warns(UserWarning, match="interrupted by user after 1 epochs"):
        ogo.fit(X, y)
    assert ogo.n_iter_ == 1 and len(ogo.train_losses_) == 1
    state = ogo.get_state()
    assert _all_finite(state)
    reference = OrtGradientOptimizer(loss_onnx, learning_rate=0.01, max_iter=1, batch_size=5,
                                     random_state=0).fit(X, y).get_state()
    assert not np.array_equal(state["coef"], reference["coef"])
    expected = X @ state["coef"].reshape(3, -1) + state["intercept"]
    np.testing.assert_allclose(ogo.predict(X).reshape(expected.shape), expected, rtol=1e-5)


# -------------------------------------------------------------- failed saves

def _fail_fsync_at(monkeypatch, call):
    real, calls = os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == call:
            raise OSError("disk full")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_failed_checkpoint_save_during_training_keeps_previous(tmp_path, monkeypatch):
    X, y = _data("linear_regressor")
    onx = to_onnx(LinearRegression().fit(X, y), X, black_op={"LinearRegressor"})
    generate_artifacts(onx, requires_grad=["coef", "intercept"], loss=LossType.MSELoss,
                       optimizer=OptimType.AdamW, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    session = TrainingSession(state, tmp_path / "training_model.onnx",
                              optimizer_model=tmp_path / "optimizer_model.onnx")
    target = y.reshape(-1, 1).astype(np.float32)

    def step():
        session.lazy_reset_grad()
        session.train_step(X, target)
        session.optimizer_step()

    step()
    path = tmp_path / "resume"
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    saved = path.read_bytes()
    step()
    _fail_fsync_at(monkeypatch, 1)
    with pytest.raises(OSError, match="disk full"):
        CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    monkeypatch.undo()
    assert path.read_bytes() == saved
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    resumed = CheckpointState.load_checkpoint(path)
    assert resumed.optimizer_step == 1


def test_generate_artifacts_failing_midway_keeps_old_files(tmp_path, monkeypatch):
    X, y = _data("linear_regressor")
    old = to_onnx(LinearRegression().fit(X, y), X, black_op={"LinearRegressor"})
    new = to_onnx(LinearRegression().fit(X, -y), X, black_op={"LinearRegressor"})
    kwargs = dict(requires_grad=["coef", "intercept"], optimizer=OptimType.SGD,
                  artifact_directory=tmp_path)
    generate_artifacts(old, loss=LossType.MSELoss, **kwargs)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    # each file costs two fsyncs (file, directory): the third is eval_model's
    _fail_fsync_at(monkeypatch, 3)
    with pytest.raises(OSError, match="disk full"):
        generate_artifacts(new, loss=LossType.L1Loss, **kwargs)
    monkeypatch.undo()
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(after) == sorted(before)  # no temporary file left
    assert after["training_model.onnx"] != before["training_model.onnx"]  # replaced whole
    for name in ("eval_model.onnx", "checkpoint", "optimizer_model.onnx"):
        assert after[name] == before[name], name
    CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate_artifacts(new, loss=LossType.L1Loss, **kwargs)  # a later call succeeds
