"""TrainingSession: training through generate_artifacts against numpy references."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn import artifacts
from ortlearn.graph import make_model
from ortlearn.optim import SGD, AdamW, build_optimizer_model
from ortlearn.training import CheckpointState, TrainingSession
from ortlearn.training.device import cuda_available

N_FEATURES, N_HIDDEN = 4, 5


# --------------------------------------------------------------------- models
def _linear_model(rng):
    W = rng.normal(size=(N_FEATURES, 1)).astype(np.float32)
    b = np.array([0.3], dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["XW"]),
             helper.make_node("Add", ["XW", "b"], ["pred"])]
    return _model(nodes, {"W": W, "b": b})


def _mlp_model(rng):
    params = {"W1": rng.normal(size=(N_FEATURES, N_HIDDEN)).astype(np.float32) / 2,
              "b1": rng.normal(size=(N_HIDDEN,)).astype(np.float32) / 2,
              "W2": rng.normal(size=(N_HIDDEN, 1)).astype(np.float32) / 2,
              "b2": np.array([0.1], dtype=np.float32)}
    nodes = [helper.make_node("MatMul", ["X", "W1"], ["h0"]),
             helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]),
             helper.make_node("MatMul", ["h", "W2"], ["o0"]),
             helper.make_node("Add", ["o0", "b2"], ["pred"])]
    return _model(nodes, params)


def _model(nodes, params):
    X = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", N_FEATURES])
    graph = helper.make_graph(
        nodes, "forward", [X],
        [helper.make_tensor_value_info("pred", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    return make_model(graph, [helper.make_opsetid("", 18)]), params


def _linear_grads(p, X, y):
    d = 2 * (X @ p["W"] + p["b"] - y) / y.size  # MSELoss, mean over all elements
    return {"W": X.T @ d, "b": d.sum(axis=0)}


def _mlp_grads(p, X, y):
    h1 = X @ p["W1"] + p["b1"]
    h = np.maximum(h1, 0)
    d = 2 * (h @ p["W2"] + p["b2"] - y) / y.size
    dh = (d @ p["W2"].T) * (h1 > 0)
    return {"W2": h.T @ d, "b2": d.sum(axis=0), "W1": X.T @ dh, "b1": dh.sum(axis=0)}


MODELS = {"linear": (_linear_model, _linear_grads), "mlp": (_mlp_model, _mlp_grads)}


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    """Artifacts of each model with each optimizer: ``art[model, optim] -> (dir, params)``."""
    out = {}
    for name, (build, _) in MODELS.items():
        model, params = build(np.random.default_rng(0))
        for optim in ("SGD", "AdamW"):
            directory = tmp_path_factory.mktemp(f"{name}_{optim}")
            artifacts.generate_artifacts(
                model, requires_grad=list(params), loss=artifacts.LossType.MSELoss,
                optimizer=getattr(artifacts.OptimType, optim), artifact_directory=directory,
                additional_output_names=["pred"], nominal_checkpoint=True)
            out[name, optim] = directory, params
    return out


def _session(directory, state=None, device="cpu", optimizer=True, eval_model=True):
    state = state or CheckpointState.load_checkpoint(directory / "checkpoint")
    return TrainingSession(
        state, directory / "training_model.onnx",
        directory / "eval_model.onnx" if eval_model else None,
        directory / "optimizer_model.onnx" if optimizer else None, device=device)


def _batches(n_steps, batch=16, seed=1):
    rng = np.random.default_rng(seed)
    for _ in range(n_steps):
        X = rng.normal(size=(batch, N_FEATURES)).astype(np.float32)
        yield X, (X.sum(axis=1, keepdims=True) * 0.5 - 1).astype(np.float32)


def _train(session, n_steps, seed=1):
    for X, y in _batches(n_steps, seed=seed):
        session.train_step(X, y)
        session.optimizer_step()
        session.lazy_reset_grad()


def _weights(session, names):
    return {n: session.get_parameter(n) for n in names}


# ---------------------------------------------------------------- references
@pytest.mark.parametrize("name", list(MODELS))
def test_sgd_matches_numpy(art, name):
    directory, params = art[name, "SGD"]
    session = _session(directory)
    session.set_learning_rate(0.05)
    _train(session, 100)
    ref = {k: v.astype(np.float64) for k, v in params.items()}
    for X, y in _batches(100):
        grads = MODELS[name][1](ref, X.astype(np.float64), y.astype(np.float64))
        ref = {k: ref[k] - 0.05 * grads[k] for k in ref}
    for k, value in _weights(session, params).items():
        np.testing.assert_allclose(value, ref[k], atol=1e-5, err_msg=k)
        assert not np.allclose(value, params[k], atol=1e-3)  # it did train


def _adamw_reference(params, grad_fn, lr, hyper, n_steps):
    """numpy AdamW as onnxruntime-training's kernel (adam_mode=1) updates: bias correction
    in the step size, eps added to sqrt(v), decay after the update
    (tests/fidelity/test_optimizer_fidelity.py transcribes the kernel in full)."""
    (beta1, beta2), eps, wd = hyper["betas"], hyper["eps"], hyper["weight_decay"]
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, (X, y) in enumerate(_batches(n_steps), start=1):
        g = grad_fn(p, X.astype(np.float64), y.astype(np.float64))
        for k in p:
            m[k] = beta1 * m[k] + (1 - beta1) * g[k]
            v[k] = beta2 * v[k] + (1 - beta2) * g[k] ** 2
            step_size = lr * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
            p[k] = p[k] - step_size * m[k] / (np.sqrt(v[k]) + eps)
            p[k] = p[k] - lr * wd * p[k]
    return p


@pytest.mark.parametrize("name", list(MODELS))
def test_adamw_matches_onnxruntime_training_kernel(art, name):
    directory, params = art[name, "AdamW"]
    meta = json.loads(onnx.load(directory / "optimizer_model.onnx").metadata_props[0].value)
    hyper = meta["hyper"]
    assert meta["type"] == "AdamW" and hyper["bias_correction"] and hyper["clip_grad"] is None
    assert hyper["eps"] == 1e-6 and hyper["weight_decay"] == 0.0
    session = _session(directory)
    session.set_learning_rate(0.01)
    _train(session, 100)
    ref = _adamw_reference(params, MODELS[name][1], 0.01, hyper, 100)
    for k, value in _weights(session, params).items():
        np.testing.assert_allclose(value, ref[k], atol=1e-5, err_msg=k)


def test_gradient_accumulation_equals_concatenated_batch(art):
    directory, params = art["mlp", "SGD"]
    (XA, yA), (XB, yB) = _batches(2)
    concat = _session(directory)
    concat.train_step(np.vstack([XA, XB]), np.vstack([yA, yB]))
    g_concat = {k: concat.get_gradient(k) for k in params}

    session = _session(directory)
    state = session._state
    # no step yet: zeros, as onnxruntime-training gives
    np.testing.assert_array_equal(state.parameters["W1"].grad,
                                  np.zeros((N_FEATURES, 5), np.float32))
    session.train_step(XA, yA)
    g_A = {k: state.parameters[k].grad for k in params}
    session.train_step(XB, yB)  # accumulates
    for k in params:
        # MSELoss(mean) on two equal halves: g_A + g_B = 2 * g(A ∪ B).
        np.testing.assert_allclose(state.parameters[k].grad, 2 * g_concat[k], atol=1e-6)
    session.set_learning_rate(0.1)
    session.optimizer_step()
    for k in params:
        np.testing.assert_allclose(session.get_parameter(k), params[k] - 0.2 * g_concat[k],
                                   atol=1e-6)
    # lazy_reset_grad: the next step's gradient is that batch's alone.
    fresh = _session(directory)
    fresh.train_step(XA, yA)
    fresh.lazy_reset_grad()
    fresh.train_step(XA, yA)
    for k in params:
        np.testing.assert_allclose(fresh.get_gradient(k), g_A[k], atol=1e-7)


def test_resume_from_checkpoint_is_bitwise_identical(art, tmp_path):
    directory, params = art["mlp", "AdamW"]
    straight = _session(directory)
    straight.set_learning_rate(0.02)
    _train(straight, 5)

    first = _session(directory)
    first.set_learning_rate(0.02)
    _train(first, 5)
    CheckpointState.save_checkpoint(first._state, tmp_path / "ckpt", include_optimizer_state=True)
    state = CheckpointState.load_checkpoint(tmp_path / "ckpt")
    assert state.optimizer_step == 5 and set(state.optimizer_state["W1"]) == {"exp_avg",
                                                                              "exp_avg_sq"}
    resumed = _session(directory, state)
    assert resumed.get_learning_rate() == pytest.approx(0.02)
    _train(resumed, 5, seed=2)
    _train(straight, 5, seed=2)
    for k in params:
        assert np.array_equal(resumed.get_parameter(k), straight.get_parameter(k)), k
        assert np.array_equal(state.parameters[k].data, straight.get_parameter(k)), k


def test_state_is_bound_to_the_session(art):
    directory, params = art["linear", "SGD"]
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    session = _session(directory, state)
    _train(session, 3)
    np.testing.assert_array_equal(state.parameters["W"].data, session.get_parameter("W"))
    assert not np.array_equal(state.parameters["W"].data, params["W"])
    state.parameters["W"].data = np.zeros((N_FEATURES, 1), np.float32)
    state.parameters["b"].data = np.array([2.0], np.float32)
    X, y = next(_batches(1))
    loss, pred = session.eval_step(X, y)
    np.testing.assert_array_equal(pred, np.full((16, 1), 2.0, np.float32))
    np.testing.assert_allclose(loss, np.mean((2.0 - y) ** 2), rtol=1e-6)
    session.close()  # the values go back into the state, which another session may use
    other = _session(directory, state)
    np.testing.assert_array_equal(other.get_parameter("b"), [2.0])


def test_values_read_from_a_session_are_copies(art):
    """What get_parameter, get_gradient and export_optimizer_state return stays as it was
    when training goes on (on the CPU, OrtValue.numpy() is a view of a live buffer)."""
    directory, _ = art["mlp", "AdamW"]
    session = _session(directory)
    _train(session, 3)
    X, y = next(_batches(1))
    session.train_step(X, y)
    read = {"parameter": session.get_parameter("W1"), "gradient": session.get_gradient("W1"),
            "exp_avg": session.export_optimizer_state()[0]["W1"]["exp_avg"]}
    kept = {k: v.copy() for k, v in read.items()}
    session.optimizer_step()
    session.lazy_reset_grad()
    _train(session, 3, seed=5)
    assert not np.array_equal(session.get_parameter("W1"), kept["parameter"])
    for name, value in read.items():
        np.testing.assert_array_equal(value, kept[name], err_msg=name)


# --------------------------------------------------------------- parameters
def test_to_buffer_from_buffer_round_trip(art):
    directory, params = art["mlp", "SGD"]
    session = _session(directory)
    expected = np.concatenate([params[k].ravel() for k in ["W1", "b1", "W2", "b2"]])
    buffer = session.to_buffer(only_trainable=True)
    assert buffer.dtype == np.float32 and buffer.ndim == 1
    np.testing.assert_array_equal(buffer, expected)
    assert session.parameters_size(True) == expected.size
    session.from_buffer(buffer * 2)
    np.testing.assert_array_equal(session.get_parameter("b1"), params["b1"] * 2)
    np.testing.assert_array_equal(session.to_buffer(False), expected * 2)
    with pytest.raises(ValueError, match="has 3 elements"):
        session.from_buffer(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="float32"):
        session.from_buffer(expected.astype(np.float64))


def test_frozen_parameters_in_buffer_and_untouched(tmp_path):
    model, params = _linear_model(np.random.default_rng(3))
    artifacts.generate_artifacts(model, requires_grad=["W"], frozen_params=["b"],
                                 loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    session = _session(tmp_path)
    assert session.parameters_size(True) == N_FEATURES
    assert session.parameters_size(False) == N_FEATURES + 1
    session.set_learning_rate(0.1)
    _train(session, 5)
    buffer = session.to_buffer(False)
    assert buffer[-1] == params["b"][0]  # frozen last, never updated
    np.testing.assert_array_equal(buffer[:-1], session.to_buffer(True))


def test_nominal_checkpoint_completed_by_from_buffer(art):
    directory, params = art["linear", "SGD"]
    full = _session(directory)
    nominal = CheckpointState.load_checkpoint(directory / "nominal_checkpoint")
    assert nominal.is_nominal
    session = _session(directory, nominal)
    session.from_buffer(full.to_buffer(False))
    assert not nominal.is_nominal
    np.testing.assert_array_equal(nominal.parameters["W"].data, params["W"])
    X, y = next(_batches(1))
    np.testing.assert_array_equal(session.train_step(X, y)[0], full.train_step(X, y)[0])


def test_export_model_for_inferencing(art, tmp_path):
    directory, params = art["mlp", "AdamW"]
    session = _session(directory)
    _train(session, 5)
    path = tmp_path / "inference.onnx"
    session.export_model_for_inferencing(path, ["pred"])
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == ["X"]
    assert [o.name for o in model.graph.output] == ["pred"]
    assert sorted(i.name for i in model.graph.initializer) == sorted(params)
    X, y = next(_batches(1, seed=5))
    expected = session.eval_step(X, y)[1]
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"X": X})
    np.testing.assert_allclose(got[0], expected, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="nope"):
        session.export_model_for_inferencing(tmp_path / "bad.onnx", ["nope"])


def test_input_and_output_names(art):
    session = _session(art["linear", "SGD"][0])
    assert session.input_names(True) == ["X", "target"]
    assert session.input_names(False) == ["X", "target"]
    assert session.output_names(True) == ["loss", "pred"]
    assert session.output_names(False) == ["loss", "pred"]
    loss, pred = session.train_step(*next(_batches(1)))
    assert loss.shape == () and pred.shape == (16, 1)
    ortvalues = session.train_step(*next(_batches(1)), return_ortvalues=True)
    assert isinstance(ortvalues[0], ort.OrtValue)
    # The batch size may change from one call to the next.
    for size in (5, 16, 1):
        X, y = next(_batches(1, batch=size))
        for step in (session.train_step, session.eval_step):
            loss, pred = step(X, y)
            assert loss.shape == () and pred.shape == (size, 1)


# ------------------------------------------------------------ learning rate
def test_learning_rate_get_set_and_used(art):
    directory, params = art["linear", "SGD"]
    session = _session(directory)
    assert session.get_learning_rate() == pytest.approx(1e-3)
    session.set_learning_rate(0.25)
    assert session.get_learning_rate() == pytest.approx(0.25)
    X, y = next(_batches(1))
    session.train_step(X, y)
    grad = session.get_gradient("W")
    session.optimizer_step()
    np.testing.assert_allclose(session.get_parameter("W"), params["W"] - 0.25 * grad, atol=1e-7)


def test_both_optimizer_layouts_give_the_same_steps(art):
    """The sequence file (onnxruntime-training's layout) and the older per-tensor file train
    alike: the session runs the file's update nodes on the tensors in both cases."""
    directory, params = art["mlp", "AdamW"]
    sequence = onnx.load(directory / "optimizer_model.onnx")
    assert [i.name for i in sequence.graph.input][2:4] == ["params", "gradients"]
    spec = {n: (TensorProto.FLOAT, list(params[n].shape)) for n in params}
    tensors = build_optimizer_model(AdamW(), spec, layout="tensors")
    trained = []
    for optimizer in (sequence, tensors):
        session = TrainingSession(CheckpointState.load_checkpoint(directory / "checkpoint"),
                                  directory / "training_model.onnx", None, optimizer)
        session.set_learning_rate(0.01)
        _train(session, 5)
        trained.append(_weights(session, params))
    for name in params:
        np.testing.assert_array_equal(trained[0][name], trained[1][name], err_msg=name)
        assert not np.allclose(trained[0][name], params[name])


def test_linear_lr_scheduler_values(art, tmp_path):
    """The factor is that of the optimizer's step count (onnxruntime-training's scheduler)."""
    session = _session(art["linear", "SGD"][0])
    session.register_linear_lr_scheduler(2, 6, 1.0)
    rates = [session.get_learning_rate()]
    session.scheduler_step()  # no optimizer step yet: the rate stays at f(0)
    assert session.get_learning_rate() == 0.0
    for X, y in _batches(7):
        session.train_step(X, y)
        session.optimizer_step()
        session.scheduler_step()
        rates.append(session.get_learning_rate())
    np.testing.assert_allclose(rates, [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0])
    # resumed from a checkpoint after 3 steps, a new scheduler continues the schedule
    resumed = _session(art["linear", "SGD"][0])
    _train(resumed, 3)
    CheckpointState.save_checkpoint(resumed._state, tmp_path / "ckpt",
                                    include_optimizer_state=True)
    again = _session(art["linear", "SGD"][0],
                     state=CheckpointState.load_checkpoint(tmp_path / "ckpt"))
    again.register_linear_lr_scheduler(2, 6, 1.0)
    assert again.get_learning_rate() == 0.75


# ------------------------------------------------------------------- errors
def test_clear_errors(art, tmp_path):
    linear_dir = art["linear", "SGD"][0]
    session = _session(linear_dir, optimizer=False, eval_model=False)
    X, y = next(_batches(1))
    with pytest.raises(ValueError, match=r"expects 2 input\(s\) \['X', 'target'\], got 1"):
        session.train_step(X)
    with pytest.raises(TypeError, match="'X' of train_step must be float32, got float64"):
        session.train_step(X.astype(np.float64), y)
    with pytest.raises(ValueError, match="optimizer_step needs an optimizer model"):
        session.optimizer_step()
    with pytest.raises(ValueError, match="needs an optimizer model"):
        session.set_learning_rate(0.1)
    with pytest.raises(ValueError, match="eval_step needs an eval model"):
        session.eval_step(X, y)
    other = CheckpointState.load_checkpoint(art["mlp", "SGD"][0] / "checkpoint")
    with pytest.raises(ValueError, match=r"missing parameters \['W', 'b'\].*'W1'"):
        _session(linear_dir, other)
    with pytest.raises(ValueError, match="Unknown device 'tpu'"):
        _session(linear_dir, device="tpu")
    full = _session(linear_dir)
    with pytest.raises(ValueError, match="scheduler_step needs"):
        full.scheduler_step()
    wrong = build_optimizer_model(SGD(), {"V": (TensorProto.FLOAT, [N_FEATURES, 1])})
    with pytest.raises(ValueError, match=r"optimizer parameters \['V'\]"):
        session.attach_optimizer(wrong)
    _train(full, 1)  # an SGD optimizer state cannot resume an AdamW training
    sgd_state = CheckpointState.load_checkpoint(full._state.to_bytes(include_optimizer_state=True))
    with pytest.raises(ValueError, match=r"optimizer state .* lacks W.exp_avg"):
        _session(art["linear", "AdamW"][0], sgd_state)


@pytest.mark.skipif(cuda_available(), reason="onnxruntime has CUDA here")
def test_cuda_without_provider_is_a_clear_error(art):
    with pytest.raises(ValueError, match="CUDAExecutionProvider"):
        _session(art["linear", "SGD"][0], device="cuda")


# ---------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("optim", ["SGD", "AdamW"])
def test_cuda_training_matches_cpu(art, optim):
    directory, params = art["mlp", optim]
    sessions = [_session(directory, device=d) for d in ("cpu", "cuda")]
    for session in sessions:
        session.set_learning_rate(0.01)
        _train(session, 20)
    X, y = next(_batches(1, seed=9))
    cpu_loss, gpu_loss = (s.eval_step(X, y)[0] for s in sessions)
    np.testing.assert_allclose(gpu_loss, cpu_loss, rtol=1e-4)
    np.testing.assert_allclose(sessions[1].to_buffer(False), sessions[0].to_buffer(False),
                               atol=1e-5)


def test_float64_step_is_exact(tmp_path):
    rng = np.random.default_rng(4)
    W, b = rng.normal(size=(N_FEATURES, 1)), np.array([0.2])
    nodes = [helper.make_node("MatMul", ["X", "W"], ["XW"]),
             helper.make_node("Add", ["XW", "b"], ["pred"])]
    graph = helper.make_graph(
        nodes, "forward", [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 4])],
        [helper.make_tensor_value_info("pred", TensorProto.DOUBLE, ["N", 1])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b")])
    artifacts.generate_artifacts(make_model(graph, [helper.make_opsetid("", 18)]),
                                 requires_grad=["W", "b"], loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    session = _session(tmp_path)
    session.set_learning_rate(0.5)  # float32 input: 0.5 is exact
    X, y = rng.normal(size=(6, N_FEATURES)), rng.normal(size=(6, 1))
    [loss] = session.train_step(X, y)
    session.optimizer_step()
    np.testing.assert_allclose(loss, np.mean((X @ W + b - y) ** 2), rtol=1e-14)
    grads = _linear_grads({"W": W, "b": b}, X, y)
    np.testing.assert_allclose(session.get_parameter("W"), W - 0.5 * grads["W"], rtol=1e-13)
    np.testing.assert_allclose(session.get_parameter("b"), b - 0.5 * grads["b"], rtol=1e-13)


def test_train_step_checks_shapes_before_running(art):
    """Wrong feature count or rows that disagree: a ValueError, not onnxruntime's error."""
    session = _session(art["linear", "SGD"][0])
    X, y = next(_batches(1))
    with pytest.raises(ValueError, match="has shape"):
        session.train_step(X[:, :-1], y)
    with pytest.raises(ValueError, match="symbols"):
        session.train_step(X, y[:-1])
    session.train_step(X[:3], y[:3])  # a smaller batch is fine


def test_a_second_optimizer_goes_on_from_the_state_reached(art):
    """As a second onnxruntime.training Optimizer on one module: the optimizer state reached
    (step, moments, learning rate) carries over, so 2 steps, a new optimizer, 3 steps are the
    5 steps of one optimizer, bit for bit."""
    linear_dir, names = art["linear", "AdamW"][0], ["W", "b"]
    one = _session(linear_dir)
    one.set_learning_rate(0.05)
    _train(one, 5)
    two = _session(linear_dir)
    two.set_learning_rate(0.05)
    batches = list(_batches(5))
    for X, y in batches[:2]:
        two.train_step(X, y)
        two.optimizer_step()
        two.lazy_reset_grad()
    two.attach_optimizer(linear_dir / "optimizer_model.onnx")
    assert two.get_learning_rate() == one.get_learning_rate()
    for X, y in batches[2:]:
        two.train_step(X, y)
        two.optimizer_step()
        two.lazy_reset_grad()
    for name, value in _weights(one, names).items():
        np.testing.assert_array_equal(_weights(two, names)[name], value)
    assert two.export_optimizer_state()[1] == 5


def _edited(directory, name, edit, tmp_path):
    """A copy of the artifacts of ``directory`` whose model ``name`` went through ``edit``."""
    import shutil

    target = tmp_path / f"edited_{len(list(tmp_path.iterdir()))}"
    shutil.copytree(directory, target)
    model = onnx.load(target / name)
    edit(model)
    onnx.save(model, target / name)
    return target


def test_malformed_artifacts_are_refused_with_a_value_error(art, tmp_path):
    """What the fuzz script found escaping raw: each a ValueError naming the problem."""
    linear_dir = art["linear", "AdamW"][0]

    def opset(model):
        model.opset_import[0].version = 10000

    def undefined_input(model):
        model.graph.input[0].type.tensor_type.elem_type = 0

    def missing_parameter(model):
        meta = {p.key: p for p in model.metadata_props}["ortlearn.training"]
        layout = json.loads(meta.value)
        meta.value = json.dumps({**layout, "frozen": layout["frozen"] + ["nowhere"]})

    def list_metadata(model):
        {p.key: p for p in model.metadata_props}["ortlearn.optimizer"].value = "[1, 2]"

    cases = [("training_model.onnx", opset, "onnxruntime cannot load"),
             ("training_model.onnx", undefined_input, "no ONNX tensor type"),
             ("training_model.onnx", missing_parameter, r"does not have: \['nowhere'\]"),
             ("eval_model.onnx", missing_parameter, r"does not have: \['nowhere'\]"),
             ("optimizer_model.onnx", list_metadata, "is a JSON list, not an object")]
    for name, edit, message in cases:
        with pytest.raises(ValueError, match=message):
            _session(_edited(linear_dir, name, edit, tmp_path))


def test_a_step_onnxruntime_cannot_run_names_the_step(art, tmp_path):
    from ortlearn.exceptions import TrainingApiValueError

    def shapeless_target(model):  # nothing declares the target's length: onnxruntime finds out
        for graph_input in model.graph.input:
            if graph_input.name == "target":
                graph_input.type.tensor_type.ClearField("shape")

    directory = _edited(art["linear", "AdamW"][0], "training_model.onnx", shapeless_target,
                        tmp_path)
    session = _session(directory, eval_model=False)
    X, y = next(_batches(1))
    session.train_step(X, y)
    with pytest.raises(TrainingApiValueError, match="onnxruntime could not run train_step"):
        session.train_step(X, y[:5])
