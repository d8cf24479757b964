"""Estimators write their training artifacts; ``ortlearn.api`` goes on from them.

A training started with ``partial_fit`` (or ``fit``) and continued from
``export_artifacts`` with ``Module``/``Optimizer`` on the same batches and
learning rates gives the weights and the epoch losses that ``partial_fit``
gives, bit for bit on the CPU: the training model computes the gradients
with the same nodes as the engine's fused step, the optimizer model the
same update (its in-graph scalars equal the engine's host-computed ones:
the learning rate goes through float32 in both, and the float64 bias
corrections are rounded to the weights' dtype in both), and the epoch loss
is the same float64 sum of ``loss * rows``.

Why the bits agree on every CPU: both sides run the same onnxruntime kernels on
the same shapes in the same order, so whatever SIMD path MLAS picks, it picks it
for both; the only scalars computed outside onnxruntime are the bias corrections
``1 - beta**t``, which the host takes from the C library's ``pow`` as
onnxruntime's Pow kernel does (``Optimizer.host_scalars``).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import pytest
from sklearn.exceptions import NotFittedError

from ortlearn import (
    OrtGradientOptimizer,
    OrtLinearClassifier,
    OrtLinearRegressor,
    OrtMLPClassifier,
    OrtMLPRegressor,
    add_loss_output,
    api,
)
from ortlearn.graph.format import OPTIMIZER_METADATA_KEY

BATCH = 16
N = 100


def _data(kind, dtype=np.float32, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(N, 5).astype(dtype)
    score = X @ rng.randn(5) + 0.1
    if kind == "regressor":
        return X, score.astype(dtype)
    if kind == "binary":
        return X, np.where(score > 0, "b", "a")
    return X, np.digitize(score, [-1.0, 0.5])  # 3 classes


def _open(directory):
    path = os.fspath(directory)
    state = api.CheckpointState.load_checkpoint(os.path.join(path, "checkpoint"))
    module = api.Module(os.path.join(path, "training_model.onnx"), state,
                        os.path.join(path, "eval_model.onnx"))
    optimizer = api.Optimizer(os.path.join(path, "optimizer_model.onnx"), module)
    return state, module, optimizer


def _epoch(module, optimizer, arrays, order, lr_of_step, batch=BATCH):
    """One epoch of ``ortlearn.api`` steps over the batches of ``order``; its mean loss."""
    total = 0.0
    for start in range(0, len(order), batch):
        rows = order[start:start + batch]
        optimizer.set_learning_rate(lr_of_step())
        module.lazy_reset_grad()
        loss = module(*[a[rows] for a in arrays])
        optimizer.step()
        # The engine sums loss * rows in float64.
        total += float(np.float64(loss)) * len(rows)
    return total / len(order)


def _encoded(est, X, y):
    """X and y as the exported graph reads them (what the estimator feeds its engine)."""
    return [np.asarray(X, est._dtype), est._encode_target(y)]


def _assert_same_weights(est, state):
    expected = est.get_state()
    for name, value in expected.items():
        got = state.parameters[name].data
        assert got.dtype == value.dtype, name
        np.testing.assert_array_equal(got, value, err_msg=name)


def _continue_and_compare(est, X, y, directory, epochs=2, fit_kwargs=None, sample_weight=None,
                          batch=BATCH):
    """Export ``est``, run ``epochs`` epochs with ortlearn.api and with partial_fit; compare."""
    fit_kwargs = fit_kwargs or {}
    est.export_artifacts(directory)
    state, module, optimizer = _open(directory)
    assert optimizer.get_learning_rate() == pytest.approx(est._optimizer_state["learning_rate"])
    arrays = _encoded(est, X, y)
    if sample_weight is not None:
        arrays.append(np.asarray(sample_weight, est._dtype))
    steps = [est._optimizer_state["step"]]

    def lr_of_step():
        steps[0] += 1
        # (MLPs and OrtLinear*: the rate does not depend on the batches' rows)
        lr_epoch, lr_for_step = est._learning_rates([1], steps[0])
        return lr_epoch if lr_epoch is not None else lr_for_step(steps[0])

    for _ in range(epochs):
        order = np.arange(len(X))
        if est.shuffle:
            # Each partial_fit shuffles a new arange with a fresh generator (as sklearn).
            np.random.RandomState(est.random_state).shuffle(order)
        loss = _epoch(module, optimizer, arrays, order, lr_of_step, batch)
        est.partial_fit(X, y, sample_weight=sample_weight, **fit_kwargs)
        assert loss == est.loss_
        _assert_same_weights(est, state)
    assert steps[0] == est._optimizer_state["step"]


MLP_SOLVERS = [
    pytest.param(dict(solver="sgd", momentum=0.0), id="sgd"),
    pytest.param(dict(solver="sgd", momentum=0.9, nesterovs_momentum=False), id="momentum"),
    pytest.param(dict(solver="sgd", momentum=0.9), id="nesterov"),
    pytest.param(dict(solver="adam"), id="adam"),
    pytest.param(dict(solver="adamw", alpha=0.01), id="adamw"),
]


@pytest.mark.parametrize("solver", MLP_SOLVERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mlp_regressor_continues_bit_for_bit(tmp_path, solver, dtype):
    X, y = _data("regressor", dtype)
    est = OrtMLPRegressor(hidden_layer_sizes=(7,), shuffle=False, batch_size=BATCH,
                          random_state=0, learning_rate_init=0.01, **solver)
    for _ in range(3):
        est.partial_fit(X, y)
    _continue_and_compare(est, X, y, tmp_path)


@pytest.mark.parametrize("solver", MLP_SOLVERS[1:4])
@pytest.mark.parametrize("kind", ["binary", "multiclass"])
def test_mlp_classifier_continues_bit_for_bit(tmp_path, solver, kind):
    X, y = _data(kind)
    est = OrtMLPClassifier(hidden_layer_sizes=(6, 4), activation="tanh", shuffle=False,
                           batch_size=BATCH, random_state=1, learning_rate_init=0.02, **solver)
    classes = np.unique(y)
    for _ in range(2):
        est.partial_fit(X, y, classes=classes)
    _continue_and_compare(est, X, y, tmp_path)


@pytest.mark.parametrize("solver", ["sgd", "adam"])
def test_larger_mlp_needs_the_engine_rewrites(tmp_path, solver):
    """Batches of 200 rows, 100 hidden units: without the engine's rewrite passes in the
    training model, the weights differ by 1 or 2 float32 ulps here (column sums)."""
    rng = np.random.RandomState(0)
    X = rng.randn(1000, 20).astype(np.float32)
    y = (X @ rng.randn(20)).astype(np.float32)
    est = OrtMLPRegressor(hidden_layer_sizes=(100,), solver=solver, shuffle=False,
                          batch_size=200, random_state=0, learning_rate_init=1e-3)
    est.partial_fit(X, y)
    _continue_and_compare(est, X, y, tmp_path, epochs=1, batch=200)


def test_mlp_shuffled_batches_and_invscaling(tmp_path):
    """Shuffled batches (the estimator's generator) and MLP's per-epoch invscaling rate."""
    X, y = _data("regressor")
    est = OrtMLPRegressor(hidden_layer_sizes=(5,), solver="sgd", learning_rate="invscaling",
                          power_t=0.5, shuffle=True, batch_size=BATCH, random_state=3)
    for _ in range(2):
        est.partial_fit(X, y)
    _continue_and_compare(est, X, y, tmp_path, epochs=3)


LINEAR_SOLVERS = [
    pytest.param(dict(solver="sgd", learning_rate="constant"), id="sgd"),
    pytest.param(dict(solver="sgd"), id="sgd-invscaling-per-step"),
    pytest.param(dict(solver="sgd", momentum=0.9, learning_rate="constant"), id="momentum"),
    pytest.param(dict(solver="adam", eta0=0.05), id="adam"),
]


@pytest.mark.parametrize("solver", LINEAR_SOLVERS)
def test_linear_regressor_continues_bit_for_bit(tmp_path, solver):
    X, y = _data("regressor", np.float64)
    est = OrtLinearRegressor(shuffle=False, batch_size=BATCH, random_state=0, **solver)
    for _ in range(3):
        est.partial_fit(X, y)
    _continue_and_compare(est, X, y, tmp_path)


@pytest.mark.parametrize("solver", LINEAR_SOLVERS[::2] + LINEAR_SOLVERS[3:])
@pytest.mark.parametrize("kind", ["binary", "multiclass"])
def test_linear_classifier_continues_bit_for_bit(tmp_path, solver, kind):
    X, y = _data(kind)
    est = OrtLinearClassifier(shuffle=False, batch_size=BATCH, random_state=0,
                              penalty="elasticnet", **solver)
    classes = np.unique(y)
    for _ in range(2):
        est.partial_fit(X, y, classes=classes)
    _continue_and_compare(est, X, y, tmp_path)


def test_weighted_graph_is_exported_after_weighted_fit(tmp_path):
    X, y = _data("regressor")
    w = np.random.RandomState(5).rand(N).astype(np.float32) + 0.5
    est = OrtMLPRegressor(hidden_layer_sizes=(4,), solver="adam", shuffle=False,
                          batch_size=BATCH, random_state=0)
    est.partial_fit(X, y, sample_weight=w)
    _continue_and_compare(est, X, y, tmp_path, sample_weight=w)
    inputs = [i.name for i in onnx.load(tmp_path / "training_model.onnx").graph.input]
    assert inputs[:3] == ["X", "y", "sample_weight"]


@pytest.mark.parametrize("estimator", [
    pytest.param(lambda: OrtMLPClassifier(hidden_layer_sizes=(5,), solver="adam",
                                          shuffle=False, batch_size=BATCH, random_state=0),
                 id="mlp-classifier"),
    pytest.param(lambda: OrtLinearRegressor(solver="sgd", momentum=0.5, shuffle=False,
                                            batch_size=BATCH, random_state=0), id="linear"),
])
def test_unfitted_estimator_exports_the_initial_weights(tmp_path, estimator):
    """With X and y, an unfitted estimator writes what fit starts from; it stays unfitted."""
    est = estimator()
    kind = "multiclass" if isinstance(est, OrtMLPClassifier) else "regressor"
    X, y = _data(kind)
    est.export_artifacts(tmp_path, X, y)
    assert not hasattr(est, "estimator_")
    state, module, optimizer = _open(tmp_path)
    kwargs = {"classes": np.unique(y)} if kind != "regressor" else {}
    est.partial_fit(X, y, **kwargs)  # one epoch from the initial weights
    steps = [0]

    def lr_of_step():
        steps[0] += 1
        # (MLPs and OrtLinear*: the rate does not depend on the batches' rows)
        lr_epoch, lr_for_step = est._learning_rates([1], steps[0])
        return lr_epoch if lr_epoch is not None else lr_for_step(steps[0])

    loss = _epoch(module, optimizer, _encoded(est, X, y), np.arange(N), lr_of_step)
    assert loss == est.loss_
    _assert_same_weights(est, state)


def test_files_are_those_of_generate_artifacts(tmp_path):
    X, y = _data("regressor")
    est = OrtMLPRegressor(hidden_layer_sizes=(3,), solver="adam", max_iter=2,
                          random_state=0).fit(X, y)
    est.export_artifacts(tmp_path, prefix="mlp_")
    assert sorted(os.listdir(tmp_path)) == ["mlp_checkpoint", "mlp_eval_model.onnx",
                                            "mlp_optimizer_model.onnx",
                                            "mlp_training_model.onnx"]
    optim = onnx.load(tmp_path / "mlp_optimizer_model.onnx")
    meta = {p.key: p.value for p in optim.metadata_props}
    assert '"type": "Adam"' in meta[OPTIMIZER_METADATA_KEY]
    state = api.CheckpointState.load_checkpoint(tmp_path / "mlp_checkpoint")
    assert state.optimizer_step == est._optimizer_state["step"]
    assert set(state.optimizer_state) == set(est.get_state())
    training = onnx.load(tmp_path / "mlp_training_model.onnx")
    ops = {n.domain for n in training.graph.node} | {n.domain for n in optim.graph.node}
    assert ops <= {"", "ai.onnx"}


def test_errors(tmp_path):
    X, y = _data("regressor")
    with pytest.raises(NotFittedError, match="export_artifacts"):
        OrtMLPRegressor().export_artifacts(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lbfgs = OrtMLPRegressor(hidden_layer_sizes=(3,), solver="lbfgs", max_iter=2).fit(X, y)
    with pytest.raises(ValueError, match="lbfgs"):
        lbfgs.export_artifacts(tmp_path)
    est = OrtLinearRegressor(max_iter=2, tol=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y)
    with pytest.raises(ValueError, match="unfitted"):
        est.export_artifacts(tmp_path, X, y)
    assert not os.listdir(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)  # an empty destination used to write into the working directory
    try:
        with pytest.raises(ValueError, match="artifact_directory is empty"):
            est.export_artifacts("")
    finally:
        os.chdir(cwd)
    assert not os.listdir(tmp_path)


def test_symlinks_in_the_destination_are_replaced_not_written_through(tmp_path):
    X, y = _data("regressor")
    est = OrtMLPRegressor(hidden_layer_sizes=(3,), solver="adam", max_iter=2,
                          random_state=0).fit(X, y)
    outside = tmp_path / "outside"
    outside.mkdir()
    destination = tmp_path / "artifacts"
    destination.mkdir()
    for name in ("checkpoint", "training_model.onnx"):
        (outside / name).write_bytes(b"keep me")
        (destination / name).symlink_to(outside / name)
    est.export_artifacts(destination)
    for name in ("checkpoint", "training_model.onnx"):
        assert (outside / name).read_bytes() == b"keep me", name
        assert not (destination / name).is_symlink(), name
    api.CheckpointState.load_checkpoint(destination / "checkpoint")
    onnx.load(destination / "training_model.onnx")


def _gradient_optimizer_model(X, y):
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    onx = to_onnx(LinearRegression().fit(X, y), X, black_op={"LinearRegressor"})
    return add_loss_output(onx)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_gradient_optimizer_continues_bit_for_bit(tmp_path, optimizer):
    X, y = _data("regressor")
    y = y.reshape(-1, 1)
    est = OrtGradientOptimizer(_gradient_optimizer_model(X, y), max_iter=2, batch_size=BATCH,
                               optimizer=optimizer, momentum=0.5, shuffle=False,
                               learning_rate="invscaling", eta0=0.01, warm_start=True)
    est.fit(X, y)
    est.export_artifacts(tmp_path)
    state, module, optimizer_ = _open(tmp_path)
    names = module.input_names()
    assert names == est.input_names_
    rate = est._learning_rate_at(est.n_iter_ + 1)
    loss = _epoch(module, optimizer_, [X, y], np.arange(N), lambda: rate)
    est.set_params(max_iter=1)
    est.fit(X, y)
    assert loss == est.train_losses_[-1]
    for name, value in est.get_state().items():
        np.testing.assert_array_equal(state.parameters[name].data, value, err_msg=name)


def test_artifacts_for_a_gpu_provider_hold_no_operator_it_lacks(tmp_path):
    """``passes=GPU_NODES`` (what export_web writes for float32 models): a training model
    without the operators WebGPU lacks (Sum, LogSoftmax, Mod, Size, a column sum's row of
    ones), which trains as the CPU's artifacts up to float32 rounding."""
    from ortlearn.estimators._export import export_estimator_artifacts
    from ortlearn.graph.passes import GPU_NODES
    from ortlearn.training import cpu_fallbacks

    X, y = _data("multiclass")
    est = OrtMLPClassifier((8,), batch_size=BATCH, random_state=0, shuffle=False)
    est.partial_fit(X, y, classes=[0, 1, 2])
    states = {}
    for name, passes in (("cpu", None), ("gpu", GPU_NODES)):
        directory = tmp_path / name
        export_estimator_artifacts(est, directory, **({"passes": passes} if passes else {}))
        found = cpu_fallbacks(onnx.load(directory / "training_model.onnx"))
        assert bool(found) is (name == "cpu"), found
        state, module, optimizer = _open(directory)
        for _ in range(3):
            _epoch(module, optimizer, _encoded(est, X, y), np.arange(N), lambda: 1e-3)
        states[name] = state
    for param in est.get_state():
        np.testing.assert_allclose(states["gpu"].parameters[param].data,
                                   states["cpu"].parameters[param].data, rtol=1e-5, atol=1e-6)
