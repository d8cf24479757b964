"""The training API (``TrainingSession``, ``api.Module``/``Optimizer``) on WebGPU.

:class:`HostMemoryWebGPU` takes the session's WebGPU path with onnxruntime's CPU
provider, so these tests run on every machine: the models the session opens
are those it would open on a GPU (the operators WebGPU lacks rewritten, the
optimizer's step scalars computed on the host), run by the CPU's kernels.
Where the rewrites leave every operation as it was (a mean squared error:
``Size`` as a product of ``Shape``, integers), a step computes what the CPU's
session computes, bit for bit; a cross-entropy's ``LogSoftmax`` is written
as ``x - max - log(sum(exp(x - max)))``, a few float32 roundings apart. The
test marked ``webgpu`` runs on a GPU (``benchmarks/gpu.py``).
"""

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_webgpu import HostMemoryWebGPU

from ortlearn import api, artifacts
from ortlearn.graph import make_model
from ortlearn.optim import unpack_optimizer_model
from ortlearn.training import CheckpointState, TrainingSession, cpu_fallbacks, webgpu
from ortlearn.training import session as _session
from ortlearn.training.device import make_session_options
from ortlearn.training.step_scalars import StepScalars
from ortlearn.training.webgpu import webgpu_available

N_FEATURES, N_HIDDEN, N_CLASSES, BATCH = 6, 8, 3, 16


def _mlp(dtype=np.float32):
    rng = np.random.default_rng(0)
    params = {"W1": rng.normal(size=(N_FEATURES, N_HIDDEN)) / 2,
              "b1": rng.normal(size=(N_HIDDEN,)) / 2,
              "W2": rng.normal(size=(N_HIDDEN, N_CLASSES)) / 2,
              "b2": np.zeros(N_CLASSES)}
    params = {k: v.astype(dtype) for k, v in params.items()}
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    nodes = [helper.make_node("Gemm", ["X", "W1", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]),
             helper.make_node("Gemm", ["h", "W2", "b2"], ["scores"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("X", elem, ["N", N_FEATURES])],
        [helper.make_tensor_value_info("scores", elem, ["N", N_CLASSES])],
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    return make_model(graph, [helper.make_opsetid("", 18)]), list(params)


def _artifacts(directory, loss, optimizer, dtype=np.float32):
    model, params = _mlp(dtype)
    artifacts.generate_artifacts(model, requires_grad=params, loss=loss, optimizer=optimizer,
                                 artifact_directory=directory)
    return directory


def _batches(loss, dtype=np.float32, n=6):
    rng = np.random.default_rng(1)
    for _ in range(n):
        X = rng.normal(size=(BATCH, N_FEATURES)).astype(dtype)
        y = (rng.integers(0, N_CLASSES, BATCH) if loss == artifacts.LossType.CrossEntropyLoss
             else rng.normal(size=(BATCH, N_CLASSES)).astype(dtype))
        yield X, y


def _session_on(directory, device):
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    return state, TrainingSession(state, directory / "training_model.onnx",
                           directory / "eval_model.onnx", directory / "optimizer_model.onnx",
                           device=device, session_options=make_session_options(1))


def _train(opened, loss):
    """Six steps, the learning rate changed after the third; the losses, eval losses and
    parameters."""
    state, session = opened
    losses, evals = [], []
    for i, (X, y) in enumerate(_batches(loss)):
        if i == 3:
            session.set_learning_rate(0.05)
        losses.append(np.asarray(session.train_step(X, y)[0]))
        session.optimizer_step()
        session.lazy_reset_grad()
        evals.append(np.asarray(session.eval_step(X, y)[0]))
    return losses, evals, {name: np.array(p.data) for name, p in state.parameters.items()}


@pytest.mark.parametrize("optimizer", [artifacts.OptimType.AdamW, artifacts.OptimType.SGD],
                         ids=lambda o: o.name)
def test_a_squared_error_trains_on_webgpu_as_on_the_cpu_bit_for_bit(tmp_path, optimizer):
    loss = artifacts.LossType.MSELoss
    directory = _artifacts(tmp_path, loss, optimizer)
    expected = _train(_session_on(directory, "cpu"), loss)
    actual = _train(_session_on(directory, HostMemoryWebGPU()), loss)
    for a, e in zip(actual[:2], expected[:2]):
        np.testing.assert_array_equal(a, e)
    for name, value in expected[2].items():
        np.testing.assert_array_equal(actual[2][name], value, err_msg=name)
    assert expected[0][-1] < expected[0][0]  # it trains


def test_a_cross_entropy_trains_on_webgpu_as_on_the_cpu(tmp_path):
    """LogSoftmax, which WebGPU has only for float16, is written out: float32 roundings
    apart (AdamW's steps move each weight by about the learning rate, whatever the size
    of its gradient, so they do not grow)."""
    loss = artifacts.LossType.CrossEntropyLoss
    directory = _artifacts(tmp_path, loss, artifacts.OptimType.AdamW)
    expected = _train(_session_on(directory, "cpu"), loss)
    actual = _train(_session_on(directory, HostMemoryWebGPU()), loss)
    np.testing.assert_allclose(actual[0], expected[0], rtol=1e-5)
    np.testing.assert_allclose(actual[1], expected[1], rtol=1e-5)
    for name, value in expected[2].items():
        np.testing.assert_allclose(actual[2][name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("loss", [artifacts.LossType.MSELoss,
                                  artifacts.LossType.CrossEntropyLoss,
                                  artifacts.LossType.BCEWithLogitsLoss],
                         ids=lambda o: o.name)
def test_the_models_a_webgpu_session_opens_hold_no_node_it_lacks(tmp_path, loss, monkeypatch):
    """generate_artifacts' models hold LogSoftmax, Size, an int64 Unsqueeze and, in the
    optimizer, float64 bias corrections: none reaches the provider."""
    directory = _artifacts(tmp_path, loss, artifacts.OptimType.AdamW)
    assert any(cpu_fallbacks(onnx.load(directory / name)) for name in
               ("training_model.onnx", "optimizer_model.onnx"))
    opened, make = [], _session.make_session

    def kept(model, *args, **kwargs):
        opened.append(model)
        return make(model, *args, **kwargs)

    monkeypatch.setattr(_session, "make_session", kept)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left to warn about
        _session_on(directory, HostMemoryWebGPU())
    assert len(opened) == 3
    assert [cpu_fallbacks(model) for model in opened] == [[], [], []]


def test_the_api_classes_train_on_webgpu_as_on_the_cpu(tmp_path):
    directory = _artifacts(tmp_path, artifacts.LossType.MSELoss, artifacts.OptimType.AdamW)
    results = []
    for device in ("cpu", HostMemoryWebGPU()):
        state = api.CheckpointState.load_checkpoint(directory / "checkpoint")
        module = api.Module(directory / "training_model.onnx", state,
                            directory / "eval_model.onnx", device=device)
        optimizer = api.Optimizer(directory / "optimizer_model.onnx", module)
        module.train()
        losses = []
        for X, y in _batches(artifacts.LossType.MSELoss):
            losses.append(np.asarray(module(X, y)))
            optimizer.step()
            module.lazy_reset_grad()
        results.append((losses, module.get_contiguous_parameters().numpy()))
    np.testing.assert_array_equal(results[1][0], results[0][0])
    np.testing.assert_array_equal(results[1][1], results[0][1])


def test_float64_artifacts_are_refused_on_webgpu(tmp_path):
    directory = _artifacts(tmp_path, artifacts.LossType.MSELoss, artifacts.OptimType.SGD,
                           dtype=np.float64)
    with pytest.raises(ValueError, match=r"no float64 kernels, and \['W1', .* are float64.*"
                                         r"from a float32 model"):
        _session_on(directory, HostMemoryWebGPU())


def _recorded_ids(session, monkeypatch, refuse=False):
    """The graph ids of the optimizer's runs, as the WebGPU provider would see them."""
    ids, run = [], session._optimizer.run_with_iobinding

    def run_with_iobinding(binding, options=None):
        ids.append(None if options is None else options.get_run_config_entry("gpu_graph_id"))
        if refuse and ids[-1] not in (None, "-1"):
            raise RuntimeError("cannot record")
        run(binding, options)

    monkeypatch.setattr(session._optimizer, "run_with_iobinding", run_with_iobinding)
    return ids


def test_the_optimizer_step_is_recorded_once_per_binding_and_replayed(tmp_path, monkeypatch):
    """The parameters and the gradients alternate between two buffers each: two bindings,
    two recordings, each replayed."""
    loss = artifacts.LossType.MSELoss
    directory = _artifacts(tmp_path, loss, artifacts.OptimType.AdamW)
    opened = _session_on(directory, HostMemoryWebGPU())
    ids = _recorded_ids(opened[1], monkeypatch)
    trained = _train(opened, loss)
    assert ids == ["0", "1"] * 3
    expected = _train(_session_on(directory, "cpu"), loss)
    for name, value in expected[2].items():
        np.testing.assert_array_equal(trained[2][name], value, err_msg=name)


def test_an_optimizer_step_the_provider_cannot_record_runs_unrecorded(tmp_path, monkeypatch):
    loss = artifacts.LossType.MSELoss
    directory = _artifacts(tmp_path, loss, artifacts.OptimType.AdamW)
    opened = _session_on(directory, HostMemoryWebGPU())
    ids = _recorded_ids(opened[1], monkeypatch, refuse=True)
    with pytest.warns(RuntimeWarning, match="could not record the optimizer step"):
        trained = _train(opened, loss)
    assert ids == ["0"] + ["-1"] * 6  # the refused run, then each step unrecorded
    expected = _train(_session_on(directory, "cpu"), loss)
    for name, value in expected[2].items():
        np.testing.assert_array_equal(trained[2][name], value, err_msg=name)


def test_without_graph_capture_the_optimizer_step_runs_unrecorded(tmp_path, monkeypatch):
    monkeypatch.setenv(webgpu.GRAPH_CAPTURE_ENV, "0")
    directory = _artifacts(tmp_path, artifacts.LossType.MSELoss, artifacts.OptimType.SGD)
    opened = _session_on(directory, HostMemoryWebGPU())
    ids = _recorded_ids(opened[1], monkeypatch)
    _train(opened, artifacts.LossType.MSELoss)
    assert ids == [None] * 6


def test_step_scalars_are_copied_to_the_device_only_when_they_change(tmp_path):
    """SGD at a fixed learning rate: its step size is copied once; Adam's bias corrections
    change at every step."""
    counts = {}
    for optimizer in (artifacts.OptimType.SGD, artifacts.OptimType.AdamW):
        directory = _artifacts(tmp_path / optimizer.name, artifacts.LossType.MSELoss,
                               optimizer)
        model = unpack_optimizer_model(onnx.load(directory / "optimizer_model.onnx"))
        scalars = StepScalars(model, HostMemoryWebGPU())
        scalars.write(0.01, 1)
        copies = []
        for name, value in list(scalars.values.items()):
            scalars.values[name] = _Counting(value, copies)
        for step in range(2, 7):
            scalars.write(0.01, step)
        counts[optimizer.name] = len(copies)
    assert counts == {"SGD": 0, "AdamW": 5}


class _Counting:
    """An OrtValue that counts its copies from the host."""

    def __init__(self, value, copies):
        self._value, self._copies = value, copies

    def update_inplace(self, array):
        self._copies.append(array)
        self._value.update_inplace(array)


@pytest.mark.webgpu
@pytest.mark.skipif(not webgpu_available(), reason="no WebGPU device here (the "
                    "onnxruntime-ep-webgpu wheel and a GPU)")
def test_webgpu_session_trains_as_the_cpu(tmp_path):
    """On a GPU: the provider's float32 kernels round as they do (another order of sums)."""
    loss = artifacts.LossType.CrossEntropyLoss
    directory = _artifacts(tmp_path, loss, artifacts.OptimType.AdamW)
    expected = _train(_session_on(directory, "cpu"), loss)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        actual = _train(_session_on(directory, "webgpu"), loss)
    np.testing.assert_allclose(actual[0], expected[0], rtol=1e-4)
    for name, value in expected[2].items():
        np.testing.assert_allclose(actual[2][name], value, rtol=1e-4, atol=1e-5, err_msg=name)
