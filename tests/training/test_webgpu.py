"""Training on WebGPU: the table-fed step, its engine path, the device's errors.

WebGPU's provider computes no float64 and runs ``Slice`` bounds on the
CPU, so on it the engine runs a *table-fed* step: one call per batch, the
epoch's row numbers and the optimizer's scalars written once per epoch into
fixed device buffers (tables read at the step's batch number), the loss sum
in the loss's dtype, the step recorded once and replayed (graph capture).
:class:`HostMemoryWebGPU` takes that path with onnxruntime's CPU provider,
so it runs on every machine, bit for bit against the CPU's own path: the
same kernels compute the same operations on the same values (the weights,
the gradients and the update); only the running loss sum is in float32 for
a float32 loss. The tests marked ``webgpu`` need a GPU
and the ``onnxruntime-ep-webgpu`` wheel (``benchmarks/gpu.py`` runs them on one).
"""

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from sklearn.datasets import load_digits
from test_engine_gpu_paths import (
    TRAINABLE,
    HostMemoryCuda,
    N,
    _assert_same_training,
    _problem,
    _train,
)

from ortlearn import OrtMLPClassifier, OrtMLPRegressor, OrtSGDClassifier, OrtSGDRegressor
from ortlearn.estimators import _base
from ortlearn.optim import SGD, Adam, AdamW
from ortlearn.training import Batches, TrainingEngine, webgpu
from ortlearn.training import engine as _engine
from ortlearn.training.device import make_session, make_session_options, parse_device
from ortlearn.training.fused import BATCH, ROWS, STEP_IN_EPOCH, build_fused_step


@dataclass(frozen=True)
class HostMemoryWebGPU(HostMemoryCuda):
    """A device the engine treats as WebGPU, whose tensors onnxruntime keeps on the CPU."""

    kind: str = "webgpu"

    def session_options(self, options, graph_capture=False):
        return options  # no plugin provider to add, no recording on the CPU


def _engine_on(device, loss_model, optimizer, **kwargs):
    # one thread for both devices: the same kernels split the same way
    return TrainingEngine(loss_model, TRAINABLE, optimizer, device=device,
                          session_options=make_session_options(1),
                          initial_weights={"coef": np.full((3, 1), 0.3)}, **kwargs)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("optimizer", [SGD, lambda: SGD(momentum=0.9), Adam, AdamW])
def test_batch_table_step_trains_as_the_cpu_bit_for_bit(optimizer, dtype, weighted):
    loss_model, arrays = _problem(dtype, weighted)
    engine = _engine_on(HostMemoryWebGPU(), loss_model, optimizer())
    reference = _engine_on("cpu", loss_model, optimizer())
    assert engine._steps[False].layout.batch_table and engine._steps[False].feeds is not None
    losses = [_train(e, arrays) for e in (engine, reference)]
    _assert_same_training(engine, reference)
    # the loss sum of a float32 loss is a float32 sum of at most N // 8 + 1 terms
    rtol = 0 if dtype == np.float64 else (N // 8 + 1) * 2.0 ** -24
    np.testing.assert_allclose(losses[0], losses[1], rtol=rtol)
    assert np.isfinite(losses[0]).all() and losses[0][2] < losses[0][0]


def test_batch_table_step_trains_batches_of_any_sizes_bit_for_bit():
    """Batches of uneven sizes: each size other than the first one's is a table of its own."""
    loss_model, arrays = _problem(np.float32, weighted=False)
    engine = _engine_on(HostMemoryWebGPU(), loss_model, Adam())
    reference = _engine_on("cpu", loss_model, Adam())
    rows = np.random.RandomState(0).permutation(N)
    batches = [rows[:8], rows[8:16], rows[16:21], rows[21:29], rows[29:30], rows[30:]]
    for e in (engine, reference):
        e.set_learning_rate(0.02)
    for _ in range(2):
        losses = [e.train_epoch(arrays, batches) for e in (engine, reference)]
        np.testing.assert_allclose(losses[0], losses[1], rtol=len(batches) * 2.0 ** -24)
    _assert_same_training(engine, reference)


def test_batch_table_epoch_copies_to_the_device_whatever_its_batches(monkeypatch):
    """Each copy to a GPU waits for it: an epoch writes its tables once, not per step."""
    loss_model, arrays = _problem(np.float32, weighted=False)
    engine = _engine_on(HostMemoryWebGPU(), loss_model, Adam())
    copies = []
    update = ort.OrtValue.update_inplace
    monkeypatch.setattr(ort.OrtValue, "update_inplace",
                        lambda self, array: copies.append(1) or update(self, array))
    counts = []
    for batch in (15, 3, 1):  # 3, 15 and 45 steps
        engine.train_epoch(arrays, Batches(np.arange(N), batch))
        copies.clear()
        engine.train_epoch(arrays, Batches(np.arange(N), batch))
        counts.append(len(copies))
    assert counts[0] == counts[1] == counts[2] <= 8, counts


def test_a_table_that_holds_its_values_is_not_written_again(monkeypatch):
    """SGD at a constant rate: the batch sizes and the rates of an epoch are those of the
    last, not copied again; a new order copies the row numbers alone. What is left is the
    two counters an epoch starts from."""
    loss_model, arrays = _problem(np.float32, weighted=False)
    engine = _engine_on(HostMemoryWebGPU(), loss_model, SGD())
    copies = []
    update = ort.OrtValue.update_inplace
    monkeypatch.setattr(ort.OrtValue, "update_inplace",
                        lambda self, array: copies.append(array.copy()) or update(self, array))
    order = np.arange(N)
    engine.train_epoch(arrays, Batches(order, 15))
    copies.clear()
    engine.train_epoch(arrays, Batches(order, 15))
    assert len(copies) == 2 and all(c.size == 1 and not c.any() for c in copies)
    copies.clear()
    shuffled = np.random.RandomState(0).permutation(N)
    engine.train_epoch(arrays, Batches(shuffled, 15))
    (rows,) = [c for c in copies if c.size > 1]
    np.testing.assert_array_equal(rows.ravel(), shuffled)


def test_batch_table_step_needs_no_cpu_kernel():
    """No float64 value, no computed Slice bounds (the provider reads them on the host), int32
    batch numbers and row numbers, no control flow: every node of the step can stay on the
    GPU."""
    loss_model, _ = _problem(np.float32, weighted=True)
    model, layout = build_fused_step(loss_model, TRAINABLE, ["X", "label", "weight"], Adam(),
                                     batch_table=True)
    assert layout.batch_table and layout.epoch_inputs[:2] == (BATCH, ROWS)
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    assert types[BATCH] == types[STEP_IN_EPOCH] == onnx.TensorProto.INT32
    assert STEP_IN_EPOCH in layout.carried
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
    values = list(inferred.input) + list(inferred.value_info) + list(inferred.output)
    assert not [v.name for v in values if v.type.tensor_type.elem_type == onnx.TensorProto.DOUBLE]
    assert not {n.op_type for n in model.graph.node} & {"Loop", "If", "Scan"}
    # a Slice's or a Split's bounds are read on the host: no Slice, and the flat weights'
    # views are one Split of constant sizes
    constants = {i.name for i in model.graph.initializer}
    constants |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    assert not [n for n in model.graph.node if n.op_type == "Slice"]
    (split,) = [n for n in model.graph.node if n.op_type == "Split"]
    assert split.input[1] in constants
    with pytest.raises(ValueError, match="epoch-ordered"):
        build_fused_step(loss_model, TRAINABLE, ["X", "label", "weight"], Adam(),
                         epoch_ordered=["label"], batch_table=True)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("cls", [OrtMLPRegressor, OrtMLPClassifier])
def test_mlp_fits_through_the_batch_table_step(cls, monkeypatch):
    """An estimator's fit on the table-fed path: the weights of the CPU's bit for bit, and a
    step without ``Size`` (a CPU operator on GPU providers: its value comes from ``rows``)."""
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    if cls is OrtMLPRegressor:
        y = X[:, :8].sum(axis=1)
    params = {"hidden_layer_sizes": (16,), "max_iter": 3, "random_state": 0, "tol": 0.0,
              "batch_size": 100}
    reference = cls(**params).fit(X, y)
    engines, steps = [], []
    make_engine, build = _base.TrainingEngine, _engine.build_fused_step

    def on_host_memory_webgpu(*args, device, **kwargs):
        engines.append(make_engine(*args, device=HostMemoryWebGPU(), **kwargs))
        return engines[-1]

    def kept(*args, **kwargs):
        model, layout = build(*args, **kwargs)
        steps.append(model)
        return model, layout

    monkeypatch.setattr(_base, "TrainingEngine", on_host_memory_webgpu)
    monkeypatch.setattr(_engine, "build_fused_step", kept)
    fit = cls(**params).fit(X, y)
    assert engines and all(e._batch_table for e in engines)
    for ours, theirs in zip(fit.coefs_ + fit.intercepts_,
                            reference.coefs_ + reference.intercepts_):
        np.testing.assert_array_equal(ours, theirs)
    # float32 loss sums of 18 batches
    np.testing.assert_allclose(fit.loss_curve_, reference.loss_curve_, rtol=18 * 2.0 ** -24)
    assert steps and not any(n.op_type in ("Size", "Loop") for m in steps for n in m.graph.node)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("make", [
    lambda: OrtSGDClassifier(loss="hinge"),                     # labels' int64 Unsqueeze
    lambda: OrtSGDClassifier(loss="log_loss", penalty="l1"),    # Sign
    lambda: OrtSGDRegressor(loss="huber", average=True),
], ids=["hinge", "log_loss_l1", "huber_average"])
def test_sgd_fits_through_the_webgpu_step(make, monkeypatch):
    """The SGD estimators' step as built for WebGPU (table-fed, GPU_NODES), run by the CPU
    provider: no node that WebGPU lacks (its Sign, its join's IsNaN and sum, the labels'
    Unsqueeze are rewritten), and the CPU path's weights to float32 rounding."""
    from ortlearn.graph.passes import GPU_NODES
    from ortlearn.training import cpu_fallbacks

    X, y = load_digits(return_X_y=True)
    X = ((X - X.mean(axis=0)) / (X.std(axis=0) + 1.0)).astype(np.float32)
    estimator = make()
    if isinstance(estimator, OrtSGDRegressor):
        y = X[:, :8].sum(axis=1)
    elif estimator.loss == "log_loss":
        y = (y > 4).astype(np.int64)
    params = {"max_iter": 3, "tol": None, "random_state": 0}
    reference = make().set_params(**params).fit(X, y)
    steps, make_engine, build = [], _base.TrainingEngine, _engine.build_fused_step

    def as_on_webgpu(*args, device, **kwargs):
        return make_engine(*args, device=HostMemoryWebGPU(), **kwargs)

    def gpu_step(*args, **kwargs):
        model, layout = build(*args, **{**kwargs, "passes": GPU_NODES})
        steps.append(model)
        return model, layout

    monkeypatch.setattr(_base, "TrainingEngine", as_on_webgpu)
    monkeypatch.setattr(_engine, "build_fused_step", gpu_step)
    fit = estimator.set_params(**params).fit(X, y)
    assert steps and all(cpu_fallbacks(m) == [] for m in steps)
    np.testing.assert_allclose(fit.coef_, reference.coef_, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fit.intercept_, reference.intercept_, rtol=1e-4, atol=1e-5)


def _recording(engine, monkeypatch, refuse: bool):
    """The engine's feeds as on WebGPU with graph capture; its runs' graph ids, recorded."""
    feeds = engine._steps[False].feeds
    feeds.capture, ids = True, []
    run = feeds.session.run_with_iobinding

    def run_with_iobinding(binding, options):
        ids.append(options.get_run_config_entry("gpu_graph_id"))
        if refuse and ids[-1] != "-1":
            raise RuntimeError("cannot record")
        run(binding, options)

    monkeypatch.setattr(feeds.session, "run_with_iobinding", run_with_iobinding)
    return feeds, ids


def test_recorded_steps_alternate_two_graphs_and_new_data_releases_them(monkeypatch):
    """Batches of the first size run as graphs 0 and 1 (the parities of the carried
    buffers), others unrecorded; new data releases the recordings, which replay old buffers."""
    loss_model, arrays = _problem(np.float32)
    engine = _engine_on(HostMemoryWebGPU(), loss_model, Adam())
    feeds, ids = _recording(engine, monkeypatch, refuse=False)
    released = []
    monkeypatch.setattr(feeds.session, "release_captured_graph", released.append)
    engine.train_epoch(arrays, Batches.for_epoch(N, 8))  # 5 batches of 8, one of 5
    assert ids == ["0", "1", "0", "1", "0", "-1"]
    engine.train_epoch([a.copy() for a in arrays], Batches.for_epoch(N, 8))
    assert sorted(released) == [0, 1]


def test_a_step_the_provider_cannot_record_runs_unrecorded(monkeypatch):
    loss_model, arrays = _problem(np.float32)
    engine = _engine_on(HostMemoryWebGPU(), loss_model, Adam())
    reference = _engine_on("cpu", loss_model, Adam())
    feeds, ids = _recording(engine, monkeypatch, refuse=True)
    with pytest.warns(RuntimeWarning, match="without graph capture"):
        _train(engine, arrays)
    _train(reference, arrays)
    assert not feeds.capture and ids[0] == "0" and set(ids[1:]) == {"-1"}
    _assert_same_training(engine, reference)


def test_float64_is_refused_on_webgpu():
    with pytest.raises(ValueError, match=r"float32 models.*\['X'\].*astype"):
        webgpu.check_float32({"coef": np.dtype(np.float32), "X": np.dtype(np.float64)})


def test_batch_table_refuses_an_epoch_loop():
    loss_model, _ = _problem(np.float32)
    with pytest.raises(ValueError, match="epoch_loop=True"):
        _engine_on("cpu", loss_model, Adam(), batch_table=True, epoch_loop=True)


def test_the_device_says_what_is_missing():
    if webgpu.webgpu_available():
        pytest.skip("this machine has a WebGPU device")
    with pytest.raises(ValueError, match=r"ortlearn\[webgpu\]|no WebGPU device"):
        parse_device("webgpu:0")
    with pytest.raises(ValueError, match="webgpu"):
        parse_device("vulkan")
    with pytest.raises(ValueError, match="graph_capture is a WebGPU option"):
        make_session(_problem(np.float32)[0], "cpu", graph_capture=True)


def test_provider_options_and_graph_capture_switch(monkeypatch):
    assert webgpu.provider_options() == {"deviceId": "0", "enableInt64": "1"}
    assert webgpu.default_graph_capture()
    monkeypatch.setenv(webgpu.GRAPH_CAPTURE_ENV, "0")
    assert not webgpu.default_graph_capture()
    monkeypatch.setenv(webgpu.GRAPH_CAPTURE_ENV, "yes")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        webgpu.default_graph_capture()


def test_provider_options_of_the_environment(monkeypatch):
    monkeypatch.setenv(webgpu.OPTIONS_ENV,
                       " validationMode = disabled, maxNumPendingDispatches=64,")
    assert webgpu.provider_options(2, graph_capture=True) == {
        "deviceId": "2", "enableInt64": "1", "enableGraphCapture": "1",
        "validationMode": "disabled", "maxNumPendingDispatches": "64"}
    for wrong, message in [("validationMode", "is not key=value"),
                           ("=disabled", "is not key=value"),
                           ("enableInt64=0", "sets enableInt64 itself"),
                           ("enableGraphCapture=0", "ORTLEARN_WEBGPU_GRAPH_CAPTURE")]:
        monkeypatch.setenv(webgpu.OPTIONS_ENV, wrong)
        with pytest.raises(ValueError, match=message):
            webgpu.provider_options()


# ----------------------------------------------------------- on a real GPU
@pytest.mark.webgpu
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("capture", ["1", "0"])
@pytest.mark.parametrize("cls", [OrtMLPRegressor, OrtMLPClassifier])
def test_webgpu_fit_matches_the_cpu(cls, capture, monkeypatch):
    """The same fit on the GPU and the CPU: float32 kernels of another order of summation,
    so the weights agree to float32 rounding, amplified by a few epochs of Adam."""
    monkeypatch.setenv(webgpu.GRAPH_CAPTURE_ENV, capture)
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    if cls is OrtMLPRegressor:
        y = X[:, :8].sum(axis=1)
    params = {"hidden_layer_sizes": (64,), "max_iter": 5, "random_state": 0, "tol": 0.0,
              "batch_size": 100}  # 17 full batches and one of 97
    fits = [cls(device=d, **params).fit(X, y) for d in ("webgpu", "cpu")]
    np.testing.assert_allclose(fits[0].loss_curve_, fits[1].loss_curve_, rtol=1e-4)
    for a, b in zip(fits[0].coefs_, fits[1].coefs_):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(fits[0].predict(X[:50]).astype(float),
                               fits[1].predict(X[:50]).astype(float), rtol=1e-3, atol=1e-3)


@pytest.mark.webgpu
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("loss", ["hinge", "log_loss"])
def test_webgpu_sgd_fit_is_recorded_and_matches_the_cpu(loss, monkeypatch):
    """The SGD classifier on the GPU: its step holds no CPU node (Sign, the join's IsNaN, the
    labels' Unsqueeze rewritten), so the provider records it; the weights are the CPU's to
    float32 rounding over a few epochs."""
    X, y = load_digits(return_X_y=True)
    X = ((X - X.mean(axis=0)) / (X.std(axis=0) + 1.0)).astype(np.float32)
    params = {"loss": loss, "max_iter": 3, "tol": None, "random_state": 0}
    sessions, open_session = [], TrainingEngine._step_session
    monkeypatch.setattr(TrainingEngine, "_step_session",
                        lambda self, model: sessions.append(open_session(self, model))
                        or sessions[-1])
    fits = [OrtSGDClassifier(device=d, **params).fit(X, y) for d in ("webgpu", "cpu")]
    session, capture = sessions[0]  # the GPU's step, recorded at its first run
    assert session.get_providers()[0] == webgpu.EP_NAME and capture
    np.testing.assert_allclose(fits[0].coef_, fits[1].coef_, rtol=1e-3, atol=1e-4)


@pytest.mark.webgpu
def test_webgpu_engine_keeps_its_buffers_on_the_gpu():
    loss_model, arrays = _problem(np.float32)
    engine = _engine_on("webgpu", loss_model, Adam())
    engine.set_learning_rate(0.02)
    engine.train_epoch(arrays, Batches.for_epoch(N, 8))
    step = engine._steps[False]
    assert step.session.get_providers()[0] == webgpu.EP_NAME
    assert {v.device_name() for v in step.buffers.pairs[step.layout.loss_sum]} == {"webgpu"}
    assert step.feeds.capture  # the provider recorded the step: no node needed the CPU


def test_classifier_step_holds_only_operators_webgpu_has():
    """The MLP classifier's step as built for WebGPU: the label gradient's index wrap is a
    Where (WebGPU has no Mod), the log-softmax and the gradient sums are written with the
    operators it has, and the batch's size comes from the rows table."""
    from ortlearn.graph.passes import GPU_NODES

    model = _classifier_step(GPU_NODES)
    ops = {n.op_type for n in model.graph.node}
    assert not ops & {"Mod", "Size", "Sum", "LogSoftmax", "Loop", "If"}, ops
    assert {"GatherElements", "Where"} <= ops
    # each kernel costs microseconds on a GPU: the mean's divisor is the rows table's float
    # itself, not cast to int64 and back; a ReLU's gradient mask is one Where
    assert not [n for n in model.graph.node if n.op_type == "Cast"
                and n.attribute[0].i == onnx.TensorProto.INT64]
    assert not [n for n in model.graph.node if n.name.endswith(".masked")]  # a Cast * Mul


def _classifier_step(passes):
    """The MLP classifier's step on digits as built for WebGPU (``passes``: GPU_NODES), or
    with the CPU's rewrites and a float64 loss sum (the step the CPU runs)."""
    from sklearn.neural_network import MLPClassifier

    from ortlearn.convert import to_train_onnx
    from ortlearn.estimators._objective import LOSS, input_names, mlp_objective
    from ortlearn.graph.passes import GPU_NODES

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    mlp = MLPClassifier((16,), max_iter=1).fit(X[:100], y[:100])
    loss = mlp_objective(to_train_onnx(mlp, X), "multiclass", alpha=1e-4, weighted=False)
    trainable = [i.name for i in loss.graph.initializer if i.name.startswith(("coef", "inter"))]
    gpu = passes is GPU_NODES
    model, _ = build_fused_step(loss, trainable, input_names(False), Adam(), LOSS,
                                batch_table=gpu, flat=True, passes=passes)
    return model


@pytest.mark.webgpu
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_cpu_fallbacks_agree_with_the_provider():
    """cpu_fallbacks' verdict, from its kernel table, against the provider itself: a
    session with onnxruntime's CPU fallback disabled opens exactly when no node falls back."""
    from onnx import TensorProto, helper

    from ortlearn.graph.passes import CHEAPER_NODES, GPU_NODES
    from ortlearn.training.placement import cpu_fallbacks

    def model_of(op, dtype):
        graph = helper.make_graph(
            [helper.make_node(op, ["a", "b"], ["c"])], "g",
            [helper.make_tensor_value_info(n, dtype, [4]) for n in "ab"],
            [helper.make_tensor_value_info("c", dtype, [4])])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])

    def opens(model):
        options = make_session_options()
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        try:
            make_session(model, parse_device("webgpu"), options)
        except Exception as exc:
            assert "fallback to CPU EP has been explicitly" in str(exc), exc
            return False
        return True

    models = {"the WebGPU step": _classifier_step(GPU_NODES),
              "the CPU's step": _classifier_step(CHEAPER_NODES),
              "Mod": model_of("Mod", TensorProto.INT64),
              "float64 Add": model_of("Add", TensorProto.DOUBLE),
              "int64 Add": model_of("Add", TensorProto.INT64)}
    verdicts = {name: (not cpu_fallbacks(m), opens(m)) for name, m in models.items()}
    assert all(predicted == actual for predicted, actual in verdicts.values()), verdicts
    assert verdicts["the WebGPU step"] == (True, True)
