"""The engine's GPU code paths: on host memory everywhere, on CUDA where onnxruntime has it.

A GPU changes where the engine keeps its buffers, not what it computes: the
weights, optimizer states and loss sum are device OrtValues read back by copy
(on the CPU: numpy arrays onnxruntime writes in place), the row order and the
reordered labels are copied into bound buffers at each epoch (on the CPU:
read in place), and ``epoch_loop='auto'`` runs small steps one call per batch
(on the CPU: always one ``Loop`` call per epoch). :class:`HostMemoryCuda`
takes every one of those branches with onnxruntime's CPU provider, so they
run on every machine, bit for bit against the CPU branches.
"""

from dataclasses import dataclass

import numpy as np
import pytest
from skl2onnx import to_onnx
from sklearn.datasets import load_diabetes, load_digits
from sklearn.linear_model import LinearRegression

from ortlearn import (
    OrtLinearClassifier,
    OrtLinearRegressor,
    OrtMLPClassifier,
    OrtMLPRegressor,
    add_loss_output,
)
from ortlearn.exceptions import ConvergenceError
from ortlearn.optim import SGD, Adam
from ortlearn.training import Batches, TrainingEngine, _buffers
from ortlearn.training import engine as _engine
from ortlearn.training.device import Device, make_session_options

TRAINABLE = ["coef", "intercept"]
N, BATCH = 45, 8  # a final partial batch of 5


@dataclass(frozen=True)
class HostMemoryCuda(Device):
    """A device the engine treats as a GPU, whose tensors onnxruntime keeps on the CPU."""

    kind: str = "cuda"

    @property
    def ort_device_type(self) -> str:
        return "cpu"

    def providers(self) -> list:
        return ["CPUExecutionProvider"]


def _problem(dtype, weighted=False, n=N):
    """A linear regression loss graph (coef, intercept) and its data, with sample weights."""
    rs = np.random.RandomState(0)
    X = rs.randn(n, 3).astype(dtype)
    y = (X @ [1.0, -2.0, 0.5] + 0.1 * rs.randn(n)).astype(dtype)[:, None]
    onx = to_onnx(LinearRegression().fit(X, y.ravel()), X, black_op={"LinearRegressor"})
    if weighted:
        w = rs.uniform(0.5, 2.0, n).astype(dtype)
        return add_loss_output(onx, weight_name="weight"), [X, y, w]
    return add_loss_output(onx), [X, y]


def _engine_on(device, loss_model, optimizer, epoch_loop, **kwargs):
    # one thread for both devices: the same kernels split the same way
    return TrainingEngine(loss_model, TRAINABLE, optimizer, device=device,
                          epoch_loop=epoch_loop, session_options=make_session_options(1),
                          initial_weights={"coef": np.full((3, 1), 0.3)}, **kwargs)


def _train(engine, arrays, n_rows=N):
    """Epochs of every kind: one Batches shuffled in place, a subset of the rows, rows
    drawn twice, a per-step schedule; returns the losses."""
    rs = np.random.RandomState(1)
    order = np.arange(n_rows)
    batches = Batches(order, BATCH)
    losses = []
    engine.set_learning_rate(0.02)
    for _ in range(3):
        rs.shuffle(order)
        losses.append(engine.train_epoch(arrays, batches))
    losses.append(engine.train_epoch(arrays, Batches.for_epoch(n_rows, BATCH, rs)[:2]))
    losses.append(engine.train_epoch(arrays, Batches(rs.randint(0, n_rows, 2 * n_rows),
                                                     BATCH)))
    losses.append(engine.train_epoch(arrays, batches, lr_for_step=lambda step: 0.1 / step))
    return losses


def _assert_same_training(engine, reference):
    state, expected = engine.get_state(), reference.get_state()
    for name in TRAINABLE:
        np.testing.assert_array_equal(state[name], expected[name], err_msg=name)
    opt, expected_opt = engine.optimizer_state(), reference.optimizer_state()
    assert opt["step"] == expected_opt["step"]
    assert opt["learning_rate"] == expected_opt["learning_rate"]
    for name, states in expected_opt["states"].items():
        for key, value in states.items():
            np.testing.assert_array_equal(opt["states"][name][key], value, err_msg=key)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("optimizer", [SGD, lambda: SGD(momentum=0.9), Adam])
@pytest.mark.parametrize("epoch_loop", [True, False])
def test_gpu_branches_train_as_the_cpu_ones_bit_for_bit(epoch_loop, optimizer, dtype, weighted):
    loss_model, arrays = _problem(dtype, weighted)
    engines = [_engine_on(d, loss_model, optimizer(), epoch_loop)
               for d in (HostMemoryCuda(), "cpu")]
    assert engines[0]._steps[epoch_loop][2]._hosts is None  # device buffers, not numpy
    losses = [_train(engine, arrays) for engine in engines]
    assert losses[0] == losses[1]
    assert np.isfinite(losses[0]).all() and losses[0][2] < losses[0][0]
    _assert_same_training(*engines)
    X, y = arrays[:2]
    assert engines[0].eval_loss(arrays) == engines[1].eval_loss(arrays)
    np.testing.assert_allclose(  # the unweighted loss, from the weights read back
        engines[0].eval_loss([X, y] + [np.ones(N, dtype)] * weighted),
        np.mean((X @ engines[0].get_state()["coef"] + engines[0].get_state()["intercept"]
                 - y) ** 2), rtol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("epoch_loop", [True, False])
def test_gpu_branches_write_state_back(epoch_loop):
    """set_state, load_optimizer_state and checkpoint_state through device buffers."""
    loss_model, arrays = _problem(np.float64)
    source = _engine_on("cpu", loss_model, Adam(), epoch_loop)
    _train(source, arrays)
    engine = _engine_on(HostMemoryCuda(), loss_model, Adam(), epoch_loop)
    engine.set_state(source.get_state())
    engine.load_optimizer_state(source.optimizer_state())
    _assert_same_training(engine, source)
    checkpoint = engine.checkpoint_state()
    np.testing.assert_array_equal(checkpoint.parameters["coef"].data, source.get_state()["coef"])
    np.testing.assert_array_equal(checkpoint.optimizer_state["intercept"]["exp_avg_sq"],
                                  source.optimizer_state()["states"]["intercept"]["exp_avg_sq"])
    # and training goes on from there as it does on the CPU
    for e in (engine, source):
        e.train_epoch(arrays, Batches.for_epoch(N, BATCH))
    _assert_same_training(engine, source)


@pytest.mark.parametrize("device", [HostMemoryCuda(),
                                    pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("epoch_loop", [True, False])
def test_gpu_restores_the_last_finite_epoch(epoch_loop, device):
    """The weights kept for a divergence are copies, not the device buffers the diverging
    epoch overwrote; the optimizer starts again."""
    loss_model, arrays = _problem(np.float32)
    engine = _engine_on(device, loss_model, Adam(), epoch_loop)
    engine.set_learning_rate(0.01)
    engine.train_epoch(arrays, Batches.for_epoch(N, BATCH))
    finite = engine.get_state()
    with pytest.raises(ConvergenceError, match="diverged"):
        engine.train_epoch([arrays[0] * np.float32(1e30), arrays[1]], Batches.for_epoch(N, BATCH))
    for name, value in engine.get_state().items():
        np.testing.assert_array_equal(value, finite[name], err_msg=name)
    opt = engine.optimizer_state()
    assert opt["step"] == 0
    assert all(not v.any() for states in opt["states"].values() for v in states.values())


@pytest.mark.parametrize("epoch_loop", [True, False])
def test_gpu_epochs_keep_the_checked_weights_as_their_restore_point(epoch_loop, monkeypatch):
    """Off the CPU a read of the weights is a copy (and waits for the GPU): the copy that an
    epoch's end checks finite is what a divergence of the next epoch restores, read once;
    a write of the weights in between (set_state) makes the engine copy them again."""
    plain_host = _buffers.BufferPairs.host
    reads = []

    def host(self, name, *args, **kwargs):  # as a GPU's: a fresh array each read
        reads.append(name)
        return np.array(plain_host(self, name, *args, **kwargs))

    monkeypatch.setattr(_buffers.BufferPairs, "host", host)
    monkeypatch.setattr(_buffers.BufferPairs, "host_copy", host)
    loss_model, arrays = _problem(np.float32)
    engine = _engine_on(HostMemoryCuda(), loss_model, Adam(), epoch_loop)
    engine.set_learning_rate(0.01)
    batches = Batches.for_epoch(N, BATCH)
    engine.train_epoch(arrays, batches)
    reads.clear()
    engine.train_epoch(arrays, batches)
    layout = engine._steps[engine._current].layout
    weights = set(layout.weights.values())
    # the loss, and the weights once
    assert sorted(reads) == sorted([layout.loss_sum, *weights])
    finite = engine.get_state()
    with pytest.raises(ConvergenceError, match="diverged"):
        engine.train_epoch([arrays[0] * np.float32(1e30), arrays[1]], batches)
    for name, value in engine.get_state().items():
        np.testing.assert_array_equal(value, finite[name], err_msg=name)
    engine.set_state({"coef": np.full((3, 1), 0.5), "intercept": np.zeros(1)})
    written = engine.get_state()
    with pytest.raises(ConvergenceError, match="diverged"):
        engine.train_epoch([arrays[0] * np.float32(1e30), arrays[1]], batches)
    for name, value in engine.get_state().items():
        np.testing.assert_array_equal(value, written[name], err_msg=name)


def test_auto_runs_small_steps_per_batch_on_a_gpu(monkeypatch):
    """On a GPU, 'auto' chooses per epoch from the step's size and carries the weights and
    optimizer state across a change of mode."""
    loss_model, arrays = _problem(np.float64, n=64)
    weights = 4  # 3 coefficients and an intercept
    monkeypatch.setattr(_engine, "LOOP_MIN_STEP_MACS", 16 * weights)
    engine = _engine_on(HostMemoryCuda(), loss_model, Adam(), "auto")
    cpu = _engine_on("cpu", loss_model, Adam(), "auto")
    assert cpu._current is True
    modes = []
    for batch in (8, 16, 8):  # steps of 32 multiply-adds, then 64, then 32 again
        batches = Batches.for_epoch(64, batch, np.random.RandomState(batch))
        for e in (engine, cpu):
            e.train_epoch(arrays, batches)
        modes.append(engine._current)
    assert modes == [False, True, False]
    assert cpu._current is True
    for name, value in cpu.get_state().items():  # one call per batch or per epoch
        np.testing.assert_allclose(engine.get_state()[name], value, rtol=1e-13, atol=1e-15)


# ----------------------------------------------------------- on a real GPU
def _estimators():
    X, y = load_diabetes(return_X_y=True, scaled=True)
    digits_X, digits_y = load_digits(return_X_y=True)
    digits_X = digits_X / 16.0
    mlp = {"hidden_layer_sizes": (32,), "max_iter": 5, "random_state": 0, "tol": 0.0}
    linear = {"max_iter": 5, "random_state": 0, "tol": None, "eta0": 0.01,
              "learning_rate": "constant"}
    return [(OrtMLPRegressor, {**mlp, "learning_rate_init": 0.05}, X, y),
            (OrtMLPClassifier, {**mlp, "solver": "adamw"}, digits_X, digits_y),
            (OrtLinearRegressor, linear, X, y),
            (OrtLinearClassifier, {**linear, "solver": "adam"}, digits_X, digits_y),
            (OrtLinearClassifier, {"solver": "lbfgs", "alpha": 1e-3}, digits_X, digits_y)]


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("cls, params, X, y", _estimators())
def test_cuda_estimators_fit_as_on_the_cpu(cls, params, X, y):
    """float32 on both devices: the GPU's kernels sum in another order, so close, not equal."""
    fitted = [cls(device=device, **params).fit(X, y) for device in ("cpu", "cuda")]
    cpu, gpu = fitted
    assert gpu.n_iter_ == cpu.n_iter_
    np.testing.assert_allclose(gpu.train_losses_, cpu.train_losses_, rtol=2e-3)
    for name, value in cpu.get_state().items():
        np.testing.assert_allclose(gpu.get_state()[name], value, rtol=2e-2, atol=2e-3)
    assert gpu.score(X, y) == pytest.approx(cpu.score(X, y), abs=0.02)


@pytest.mark.gpu
@pytest.mark.parametrize("epoch_loop", [True, False])
def test_cuda_engine_trains_as_the_cpu_one(epoch_loop):
    loss_model, arrays = _problem(np.float32, weighted=True)
    engines = [_engine_on(d, loss_model, Adam(), epoch_loop) for d in ("cuda", "cpu")]
    losses = [_train(engine, arrays) for engine in engines]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
    for name, value in engines[1].get_state().items():
        np.testing.assert_allclose(engines[0].get_state()[name], value, rtol=1e-4, atol=1e-5)
    assert engines[0].optimizer_state()["step"] == engines[1].optimizer_state()["step"]

