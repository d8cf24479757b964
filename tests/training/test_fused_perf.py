"""The cheaper forms of the fused step give the same numbers."""

import numpy as np
import pytest
from conftest import run_onnx
from onnx import TensorProto
from sklearn.datasets import make_classification

from ortlearn.estimators import OrtLinearClassifier, OrtMLPRegressor
from ortlearn.estimators._objective import input_names, sgd_objective
from ortlearn.optim import SGD, Adam
from ortlearn.training import Batches, TrainingEngine, default_session_options
from ortlearn.training.device import Device
from ortlearn.training.fused import build_fused_step


def _mlp_loss():
    """The weighted loss graph of a small MLP, its weights, data inputs and data."""
    rs = np.random.RandomState(0)
    X = rs.randn(60, 4)
    y = X @ rs.randn(4) + 0.1 * rs.randn(60)
    est = OrtMLPRegressor(hidden_layer_sizes=(5,), random_state=0).partial_fit(
        X, y, sample_weight=np.ones(60))
    model, trainable = est._loss_model(weighted=True, values=True)
    return model, trainable, input_names(True), [X, y.reshape(-1, 1), np.ones(60)]


def _mlp_engine(optimizer, loop):
    model, trainable, names, arrays = _mlp_loss()
    return TrainingEngine(model, trainable, optimizer, input_names=names,
                          epoch_loop=loop), arrays


def test_stateful_optimizers_keep_weights_and_state_in_flat_buffers():
    loss, trainable, names, _ = _mlp_loss()
    model, layout = build_fused_step(loss, trainable, names, Adam())
    # one buffer for the 4 weights of the MLP, one per moment; no weight is an input
    assert len({layout.weights[p] for p in trainable}) == 1
    assert len({layout.states[p]["exp_avg"] for p in trainable}) == 1
    assert not {i.name for i in model.graph.input} & set(trainable)
    sizes = {p: int(np.prod(s)) for p, (_, s) in layout.offsets.items()}
    offsets = [layout.offsets[p][0] for p in trainable]
    assert offsets == list(np.cumsum([0] + [sizes[p] for p in trainable])[:-1])
    # SGD without momentum has no state: nothing to flatten
    _, plain = build_fused_step(loss, trainable, names, SGD())
    assert plain.offsets == {}


@pytest.mark.parametrize("loop", [False, True])
def test_flat_optimizer_state_reads_and_writes_per_weight(loop):
    engine, arrays = _mlp_engine(Adam(), loop)
    engine.set_learning_rate(0.01)
    engine.train_epoch(arrays, Batches.for_epoch(60, 16, np.random.RandomState(0)))
    state = engine.optimizer_state()
    for p, w in engine.get_state().items():
        assert state["states"][p]["exp_avg"].shape == w.shape
        assert np.abs(state["states"][p]["exp_avg_sq"]).sum() > 0
    # a fresh engine loaded with the state continues exactly as the first one
    other, _ = _mlp_engine(Adam(), not loop)
    other.set_state(engine.get_state())
    other.load_optimizer_state(state)
    batches = Batches.for_epoch(60, 16, np.random.RandomState(1))
    engine.train_epoch(arrays, batches)
    other.train_epoch(arrays, batches)
    for p, w in engine.get_state().items():
        np.testing.assert_allclose(other.get_state()[p], w, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(other.optimizer_state()["states"][p]["exp_avg"],
                               engine.optimizer_state()["states"][p]["exp_avg"],
                               rtol=1e-12, atol=1e-15)
    # the loss of the flat weights is the one of the same weights held one by one
    plain, _ = _mlp_engine(SGD(), loop)
    plain.set_state(engine.get_state())
    assert plain._steps[plain._current][1].offsets == {}
    assert engine.eval_loss(arrays) == plain.eval_loss(arrays)


def test_float64_loss_sums_a_float32_objective_in_float64():
    X, y = make_classification(n_samples=300, n_features=5, random_state=0)
    X = X.astype(np.float32)
    est = OrtLinearClassifier(solver="lbfgs", loss="log_loss", max_iter=3).fit(X, y)
    inference = est._inference_model()
    plain = sgd_objective(inference, "binary", loss="log_loss", alpha=0.01)
    precise = sgd_objective(inference, "binary", loss="log_loss", alpha=0.01,
                            sum_in_float64=True)
    assert plain.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert precise.graph.output[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    feeds = {"X": X, "y": y.astype(np.float32).reshape(-1, 1),
             "sample_weight": np.ones(len(X), np.float32)}
    w = est.coef_.astype(np.float64).ravel()
    z = X.astype(np.float64) @ w + float(np.ravel(est.intercept_)[0])
    expected = np.mean(np.logaddexp(0, z) - y * z) + 0.01 * 0.5 * w @ w
    loss64 = run_onnx(precise, feeds)[0]
    assert loss64.dtype == np.float64
    np.testing.assert_allclose(loss64, expected, rtol=1e-6)
    np.testing.assert_allclose(run_onnx(plain, feeds)[0], loss64, rtol=1e-6)


def test_float32_lbfgs_reaches_the_float64_objective():
    X, y = make_classification(n_samples=2000, n_features=20, random_state=0)
    fits = {dtype: OrtLinearClassifier(solver="lbfgs", loss="log_loss", alpha=1e-3,
                                       tol=1e-6, max_iter=200).fit(X.astype(dtype), y)
            for dtype in (np.float32, np.float64)}
    np.testing.assert_allclose(fits[np.float32].loss_, fits[np.float64].loss_, rtol=1e-6)
    # a float64 loss keeps scipy's line search from stalling on float32 noise
    assert fits[np.float32].n_iter_ <= fits[np.float64].n_iter_ + 3


SPIN = "session.intra_op.allow_spinning"


@pytest.mark.parametrize("batch_size, threads, spinning", [
    (8, 1, "0"),             # 8 x 31 weights: one thread, nothing to spin
    (None, 1, "0"),          # 200 rows assumed
    (40_000, 0, "1"),        # 1.24 M multiply-adds: onnxruntime's threads, spinning
])
def test_threads_follow_the_work_of_a_step(monkeypatch, unlimited_threads, batch_size, threads,
                                           spinning):
    monkeypatch.delenv("ORTLEARN_ALLOW_SPINNING", raising=False)
    loss, trainable, names, _ = _mlp_loss()
    engine = TrainingEngine(loss, trainable, SGD(), input_names=names, batch_size=batch_size)
    options = engine._session_options
    assert options.intra_op_num_threads == threads
    assert options.get_session_config_entry(SPIN) == spinning


def test_spinning_can_be_turned_off_and_is_checked(monkeypatch):
    loss, trainable, names, _ = _mlp_loss()

    def options():
        return TrainingEngine(loss, trainable, SGD(), input_names=names,
                              batch_size=40_000)._session_options

    monkeypatch.setenv("ORTLEARN_ALLOW_SPINNING", "0")
    monkeypatch.setenv("ORTLEARN_NUM_THREADS", "2")
    assert options().get_session_config_entry(SPIN) == "0"
    assert options().intra_op_num_threads == 2
    monkeypatch.setenv("ORTLEARN_ALLOW_SPINNING", "yes")
    with pytest.raises(ValueError, match="ORTLEARN_ALLOW_SPINNING must be 0 or 1"):
        options()


def test_deterministic_kernels_are_asked_on_a_gpu_only():
    cuda, cpu = Device("cuda"), Device("cpu")
    assert default_session_options(cuda, 10, deterministic=True).use_deterministic_compute
    assert not default_session_options(cuda, 10).use_deterministic_compute
    # the CPU kernels are deterministic for a thread count; the option only slows them
    for macs in (10, 10**7):
        assert not default_session_options(cpu, macs, True).use_deterministic_compute


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("random_state, expected", [(0, True), (None, False)])
def test_a_random_state_asks_for_reproducible_training(monkeypatch, random_state, expected):
    import ortlearn.estimators._base as base_module
    import ortlearn.training.engine as engine_module

    asked = []
    options = engine_module.default_session_options
    monkeypatch.setattr(engine_module, "default_session_options",
                        lambda device, macs, det=False, *rest: asked.append(det)
                        or options(device, macs, det, *rest))
    lbfgs = base_module.minimize_lbfgs
    monkeypatch.setattr(base_module, "minimize_lbfgs",
                        lambda *a, **k: asked.append(k["deterministic"]) or lbfgs(*a, **k))
    X, y = make_classification(n_samples=60, n_features=4, random_state=0)
    OrtMLPRegressor(hidden_layer_sizes=(3,), max_iter=1, random_state=random_state).fit(X, y)
    OrtLinearClassifier(solver="lbfgs", max_iter=2, random_state=random_state).fit(X, y)
    assert asked == [expected, expected]


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_estimators_tell_the_engine_their_batch_size(monkeypatch):
    monkeypatch.delenv("ORTLEARN_ALLOW_SPINNING", raising=False)
    rs = np.random.RandomState(0)
    X = rs.randn(300, 4)
    y = X @ rs.randn(4)

    def options(batch_size):
        est = OrtMLPRegressor(hidden_layer_sizes=(2000,), batch_size=batch_size,
                              random_state=0).partial_fit(X, y)
        return est._runtime.engine._session_options

    # 12 001 weights: 16 rows make 0.19 M multiply-adds, 'auto' (200 rows) 2.4 M
    assert options(16).intra_op_num_threads == 1
    assert options("auto").get_session_config_entry(SPIN) == "1"


@pytest.mark.parametrize("batch_size, n_rows, threads", [(10, 400, 1), (400, 20, 1),
                                                        (400, 400, 0)])
def test_gradient_optimizer_tells_the_engine_its_batch_size(monkeypatch, unlimited_threads,
                                                             batch_size, n_rows, threads):
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    from ortlearn import add_loss_output
    from ortlearn.estimators import OrtGradientOptimizer

    rs = np.random.RandomState(0)
    X = rs.randn(n_rows, 3000).astype(np.float32)  # 3 001 weights
    y = X[:, 0].astype(np.float32)
    onx = add_loss_output(to_onnx(LinearRegression().fit(X, y), X, black_op={"LinearRegressor"}))
    opt = OrtGradientOptimizer(onx, ["coef", "intercept"], max_iter=1, batch_size=batch_size,
                               learning_rate=1e-4)
    engines = []  # the fit's engine (fit does not keep it)
    new_engine = OrtGradientOptimizer._new_engine
    monkeypatch.setattr(OrtGradientOptimizer, "_new_engine",
                        lambda self, *a, **k: engines.append(new_engine(self, *a, **k))
                        or engines[-1])
    opt.fit(X, y)
    # batches of 10 or 20 rows: 30 k or 60 k multiply-adds; of 400 rows: 1.2 M
    assert engines[0]._session_options.intra_op_num_threads == threads
