"""AdamW and SGD against a numpy transcription of onnxruntime-training 1.19's CPU kernels.

The reference is what ``onnxruntime.training`` computes:

- ``onnxblock.optim.AdamW`` writes one com.microsoft ``AdamWOptimizer`` node with
  the attributes of :data:`ONNXBLOCK_ADAMW_ATTRIBUTES`; the kernel's own
  defaults are :data:`KERNEL_DEFAULTS`. ``onnxblock.optim.SGD`` writes one
  ``SGDOptimizerV2`` node; ``ClipGradNorm`` one ``InplaceClipGradNorm`` node.
- The training API's ``Optimizer.Step`` feeds ``step = steps made + 1`` and
  counts a step when the kernel's updated flag is true; the
  ``LinearLRScheduler`` sets ``initial_lr * f(steps made)``, in float32.

:class:`AdamWKernel`, :func:`sgd_kernel`, :func:`clip_grad_norm_kernel` and
:class:`TrainingApiOptimizer` transcribe those kernels and that driver in
numpy; the tests run ortlearn's optimizer model (by hand, as onnxruntime-
training's docs describe the model's inputs, and through ``ortlearn.api``) over
100 steps with random gradients and changing learning rates, and compare.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortlearn import api, artifacts, onnxblock
from ortlearn.graph import DEFAULT_OPSET, finalize_model

N_STEPS = 100
SHAPES = {"W1": (5, 4), "b1": (4,), "W2": (4, 3), "scale": ()}
ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}

#: AdamWOptimizer's attribute defaults (the kernel's constructor).
KERNEL_DEFAULTS = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-8, "weight_decay": 0.0,
                   "adam_mode": 0, "correct_bias": 1}
#: What onnxruntime-training's onnxblock.optim.AdamW() sets on the node.
ONNXBLOCK_ADAMW_ATTRIBUTES = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-6,
                              "weight_decay": 0.0, "adam_mode": 1, "correct_bias": 1}


# ---------------------------------------------------------------- the kernels, in numpy

class AdamWKernel:
    """``AdamWOptimizer`` (com.microsoft, CPU): one call updates every tensor of the sequences.

    The kernel stores its attributes as float and computes in float
    (``dtype=np.float32``, corrections rounded to float); ``np.float64`` runs
    the same formulas in double on those float attributes, the reference for
    float64 parameters (the kernel itself registers float only).
    """

    def __init__(self, dtype, float_attributes=True, **attributes):
        unknown = set(attributes) - set(KERNEL_DEFAULTS)
        assert not unknown, unknown
        attrs = {**KERNEL_DEFAULTS, **attributes}
        assert attrs["adam_mode"] in (0, 1) and attrs["correct_bias"] in (0, 1)
        # torch's form has no variant without bias correction (the kernel refuses it)
        assert attrs["adam_mode"] == 1 or attrs["correct_bias"] == 1
        self.t = dtype
        rounded = np.float32 if float_attributes else np.float64
        alpha, beta, epsilon, weight_decay = (dtype(rounded(attrs[k])) for k in (
            "alpha", "beta", "epsilon", "weight_decay"))
        self.alpha, self.beta, self.epsilon, self.weight_decay = alpha, beta, epsilon, weight_decay
        self.adam_mode, self.correct_bias = attrs["adam_mode"], attrs["correct_bias"]

    def __call__(self, lr, step, weights, gradients, m1, m2, update_signal=None):
        """``(updated_flag, weights, m1, m2)``; the inputs are left untouched."""
        if update_signal is not None and not update_signal:
            return False, weights, m1, m2
        t, one = self.t, self.t(1)
        lr = t(lr)
        alpha_correction = beta_correction = one
        lr_corrected = lr
        if self.correct_bias:
            # pow(float, int64) is computed in double, then rounded to the kernel's type
            alpha_correction = one - t(np.power(np.float64(self.alpha), step))
            beta_correction = one - t(np.power(np.float64(self.beta), step))
            lr_corrected = lr * (np.sqrt(beta_correction) / alpha_correction)
        new_w, new_m1, new_m2 = [], [], []
        for w, g, m, v in zip(weights, gradients, m1, m2):
            if self.adam_mode == 0:
                w = w - w * lr * self.weight_decay
            m = self.alpha * m + (one - self.alpha) * g
            v = self.beta * v + (one - self.beta) * g * g
            if self.adam_mode == 0:
                denom = np.sqrt(v / beta_correction) + self.epsilon
                w = w - (lr * m) / (alpha_correction * denom)
            else:
                w = w - lr_corrected * m / (np.sqrt(v) + self.epsilon)
                w = w - lr * self.weight_decay * w
            new_w.append(w)
            new_m1.append(m)
            new_m2.append(v)
        return True, new_w, new_m1, new_m2


def sgd_kernel(lr, weights, gradients, update_signal=None):
    """``SGDOptimizerV2``: ``w + (-lr * g)`` for each tensor; ``(updated_flag, weights)``."""
    if update_signal is not None and not update_signal:
        return False, weights
    return True, [w + (-w.dtype.type(lr) * g) for w, g in zip(weights, gradients)]


def clip_grad_norm_kernel(gradients, max_norm):
    """``InplaceClipGradNorm``: scale all by ``min(max_norm / (norm + 1e-6), 1)``."""
    t = gradients[0].dtype.type
    total = np.sqrt(sum(np.sum(g * g) for g in gradients))
    coef = min(t(max_norm) / (total + t(1e-6)), t(1))
    return [g * coef for g in gradients]


def linear_lr(step, warmup, total, initial_lr):
    """The training API's LinearLRScheduler: ``initial_lr * f(step)`` in float32."""
    f32 = np.float32
    if step < warmup:
        factor = f32(step) / max(f32(1), f32(warmup))
    else:
        factor = max(f32(0), f32(total - step) / max(f32(1), f32(total - warmup)))
    return f32(initial_lr) * factor


class TrainingApiOptimizer:
    """The training API's ``Optimizer``: its step counting around one kernel.

    ``step`` starts at 0 (or the checkpoint's), the model gets ``step + 1``,
    and the count grows when the kernel reports an update.
    """

    def __init__(self, kernel, params, clip=None, step=0, moments=None):
        self.kernel, self.clip = kernel, clip
        self.params = [np.array(p) for p in params]
        self.m1, self.m2 = moments or ([np.zeros_like(p) for p in params],
                                       [np.zeros_like(p) for p in params])
        self.step, self.lr = step, np.float32(1e-3)

    def optimizer_step(self, gradients):
        if self.clip is not None:
            gradients = clip_grad_norm_kernel(gradients, self.clip)
        if isinstance(self.kernel, AdamWKernel):
            flag, self.params, self.m1, self.m2 = self.kernel(
                self.lr, self.step + 1, self.params, gradients, self.m1, self.m2)
        else:
            flag, self.params = sgd_kernel(self.lr, self.params, gradients)
        if flag:
            self.step += 1


# ---------------------------------------------------------------- helpers

def _tensors(dtype):
    return [helper.make_tensor(name, ONNX_TYPE[dtype], list(shape),
                               np.zeros(shape, dtype).ravel().tolist())
            for name, shape in SHAPES.items()]


def _optimizer_model(block, dtype):
    with onnxblock.empty_base() as accessor:
        flag = block((_tensors(dtype), []))
    assert flag == "updated_flag"
    return accessor.model


def _assert_close(got, expected, rtol, what):
    for name, g, e in zip(SHAPES, got, expected):
        np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * np.abs(e).max(),
                                   err_msg=f"{what}: {name}")


def _random_run(rng, dtype):
    params = [rng.standard_normal(s).astype(dtype) for s in SHAPES.values()]
    grads = [[rng.standard_normal(s).astype(dtype) for s in SHAPES.values()]
             for _ in range(N_STEPS)]
    lrs = np.float32(10.0) ** rng.uniform(-3, -1, N_STEPS).astype(np.float32)
    return params, grads, lrs


def _run_by_hand(model, params, grads, lrs, n_moments):
    """Feed the optimizer model as onnxruntime-training's docs describe its inputs."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    params = list(params)
    moments = [[np.zeros_like(p) for p in params] for _ in range(n_moments)]
    declared = {"first_order_moments", "second_order_moments"} & set(names)
    for step, (g, lr) in enumerate(zip(grads, lrs), start=1):
        feeds = {"learning_rate": np.array([lr], np.float32),
                 "step": np.array([step], np.int64), "params": params, "gradients": g}
        for i, name in enumerate(sorted(declared)):
            # SGD declares first_order_moments without reading it: zeros, as the API feeds
            feeds[name] = moments[i] if i < n_moments else [np.zeros_like(p) for p in params]
        outputs = sess.run(None, feeds)
        assert outputs[0].dtype == bool and outputs[0].tolist() == [True]
        params, moments = outputs[1], outputs[2:]
    return params, moments


# ---------------------------------------------------------------- defaults and layout

def test_adamw_defaults_are_onnxruntime_training_s(tmp_path):
    """OptimType.AdamW and onnxblock.optim.AdamW() set the kernel's attributes onnxblock sets."""
    artifacts.generate_artifacts(_linear_model(np.float32), requires_grad=["W", "b"],
                                 loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)
    meta = json.loads(onnx.load(tmp_path / "optimizer_model.onnx").metadata_props[0].value)
    for hyper in (meta["hyper"], onnxblock.optim.AdamW().spec.hyper):
        assert {"alpha": hyper["betas"][0], "beta": hyper["betas"][1],
                "epsilon": hyper["eps"], "weight_decay": hyper["weight_decay"],
                "adam_mode": 1, "correct_bias": int(hyper["bias_correction"])
                } == ONNXBLOCK_ADAMW_ATTRIBUTES
        assert hyper["clip_grad"] is None
    assert meta["type"] == "AdamW"
    # the torch-style rule keeps its own name and torch's defaults
    torch_hyper = onnxblock.optim.TorchAdamW().spec.hyper
    assert (torch_hyper["eps"], torch_hyper["weight_decay"]) == (1e-8, 0.01)


@pytest.mark.parametrize("block, sequences", [
    (onnxblock.optim.AdamW(), ["first_order_moments", "second_order_moments"]),
    (onnxblock.optim.SGD(), ["first_order_moments"]),
])
def test_optimizer_model_inputs_and_outputs_follow_onnxruntime_training(block, sequences):
    """The names and order of onnxblock/optim (1.19) and of the C++ Optimizer's check."""
    model = _optimizer_model(block, np.float32)
    g = model.graph
    assert [i.name for i in g.input] == ["learning_rate", "step", "params", "gradients",
                                         *sequences]
    assert [(i.type.tensor_type.elem_type, [d.dim_value for d in i.type.tensor_type.shape.dim])
            for i in g.input[:2]] == [(TensorProto.FLOAT, [1]), (TensorProto.INT64, [1])]
    assert all(i.type.sequence_type.elem_type.tensor_type.elem_type == TensorProto.FLOAT
               for i in g.input[2:])
    assert g.output[0].name == "updated_flag"
    assert g.output[0].type.tensor_type.elem_type == TensorProto.BOOL
    updated = ["params", *sequences] if isinstance(block, onnxblock.optim.AdamW) else ["params"]
    assert [o.name for o in g.output[1:]] == [f"{s}.updated" for s in updated]
    assert {o.domain for o in model.opset_import} == {""}  # standard ONNX only


# ---------------------------------------------------------------- the update rules

ADAMW_CASES = [
    pytest.param({}, {}, id="defaults"),
    pytest.param({"betas": (0.8, 0.99), "eps": 1e-7, "weight_decay": 0.1},
                 {"alpha": 0.8, "beta": 0.99, "epsilon": 1e-7, "weight_decay": 0.1},
                 id="decay"),
    pytest.param({"bias_correction": False, "weight_decay": 0.05},
                 {"correct_bias": 0, "weight_decay": 0.05}, id="no-bias-correction"),
]


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("kwargs, attributes", ADAMW_CASES)
def test_adamw_model_matches_kernel(rng, dtype, rtol, kwargs, attributes):
    """100 steps of random gradients and learning rates, run by hand on the sequences."""
    params, grads, lrs = _random_run(rng, dtype)
    model = _optimizer_model(onnxblock.optim.AdamW(**kwargs), dtype)
    got, (m1, m2) = _run_by_hand(model, params, grads, lrs, n_moments=2)
    kernel = AdamWKernel(dtype, **{**ONNXBLOCK_ADAMW_ATTRIBUTES, **attributes})
    expected, em1, em2 = params, [np.zeros_like(p) for p in params], \
        [np.zeros_like(p) for p in params]
    for step, (g, lr) in enumerate(zip(grads, lrs), start=1):
        _, expected, em1, em2 = kernel(lr, step, expected, g, em1, em2)
    assert all(a.dtype == dtype for a in got)
    _assert_close(got, expected, rtol, "params")
    _assert_close(m1, em1, rtol, "first_order_moments")
    _assert_close(m2, em2, rtol, "second_order_moments")
    assert not np.allclose(got[0], params[0], rtol=1e-2)  # it moved: the comparison means something


def test_adamw_first_step_is_not_torchs():
    """One step from zero moments, where eps placement and decay order differ from torch's."""
    w, g = [np.array([1.0])], [np.array([1e-6])]
    hf = AdamWKernel(np.float64, **ONNXBLOCK_ADAMW_ATTRIBUTES)
    torch_form = AdamWKernel(np.float64, **{**ONNXBLOCK_ADAMW_ATTRIBUTES, "adam_mode": 0})
    lr = np.float32(0.1)  # the model's learning_rate input is float32
    _, (hf_w,), _, _ = hf(lr, 1, w, g, [np.zeros(1)], [np.zeros(1)])
    _, (torch_w,), _, _ = torch_form(lr, 1, w, g, [np.zeros(1)], [np.zeros(1)])
    with onnxblock.empty_base() as accessor:
        onnxblock.optim.AdamW()(([helper.make_tensor("w", TensorProto.DOUBLE, [1], [1.0])], []))
    sess = ort.InferenceSession(accessor.model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, {"learning_rate": np.array([lr]),
                          "step": np.array([1]), "params": w, "gradients": g,
                          "first_order_moments": [np.zeros(1)],
                          "second_order_moments": [np.zeros(1)]})[1][0]
    np.testing.assert_allclose(got, hf_w, rtol=1e-12)
    # torch's form: eps inside the correction, a step 16 times larger here
    assert (1 - torch_w[0]) > 10 * (1 - got[0])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_torch_adamw_is_the_kernels_torch_mode(rng, dtype):
    """TorchAdamW (ortlearn's torch-style rule) is the kernel's adam_mode=0 (with torch's
    double hyper-parameters in float64)."""
    params, grads, lrs = _random_run(rng, dtype)
    model = _optimizer_model(onnxblock.optim.TorchAdamW(weight_decay=0.1), dtype)
    got, _ = _run_by_hand(model, params, grads, lrs, n_moments=2)
    kernel = AdamWKernel(dtype, float_attributes=dtype is np.float32, alpha=0.9, beta=0.999,
                         epsilon=1e-8, weight_decay=0.1, adam_mode=0)
    expected, m1, m2 = params, [np.zeros_like(p) for p in params], \
        [np.zeros_like(p) for p in params]
    for step, (g, lr) in enumerate(zip(grads, lrs), start=1):
        _, expected, m1, m2 = kernel(lr, step, expected, g, m1, m2)
    _assert_close(got, expected, 1e-12 if dtype is np.float64 else 2e-6, "params")


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("max_norm", [None, 0.5])
def test_sgd_model_matches_kernel(rng, dtype, rtol, max_norm):
    params, grads, lrs = _random_run(rng, dtype)
    model = _optimizer_model(onnxblock.optim.SGD(max_norm and onnxblock.optim.ClipGradNorm(
        max_norm)), dtype)
    got, _ = _run_by_hand(model, params, grads, lrs, n_moments=0)
    expected = params
    for g, lr in zip(grads, lrs):
        if max_norm:
            g = clip_grad_norm_kernel(g, max_norm)
        _, expected = sgd_kernel(lr, expected, g)
    _assert_close(got, expected, rtol, "params")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_clip_grad_norm_on_a_sequence(rng, dtype):
    """ClipGradNorm called on a tensor sequence, as onnxruntime-training's optimizers do."""
    seq = helper.make_tensor_sequence_value_info("gradients", ONNX_TYPE[dtype], None)
    model = finalize_model(helper.make_model(
        helper.make_graph([], "clip", [seq], []),
        opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)]))
    with onnxblock.base(model) as accessor:
        clipped = onnxblock.optim.ClipGradNorm(2.0)("gradients")
    built = accessor.model
    built.graph.output.append(
        helper.make_tensor_sequence_value_info(clipped, ONNX_TYPE[dtype], None))
    sess = ort.InferenceSession(built.SerializeToString(), providers=["CPUExecutionProvider"])
    for scale in (10.0, 0.01):  # above and below the bound
        grads = [np.asarray(scale * rng.standard_normal(s), dtype) for s in SHAPES.values()]
        got = sess.run(None, {"gradients": grads})[0]
        _assert_close(got, clip_grad_norm_kernel(grads, 2.0), 1e-6, f"scale {scale}")


# ---------------------------------------------------------------- through ortlearn.api

def _linear_model(dtype):
    """pred = X @ W + b, W (3, 2) and b (2,) initializers of ``dtype``."""
    rng = np.random.default_rng(3)
    W = onnx.numpy_helper.from_array(rng.standard_normal((3, 2)).astype(dtype), "W")
    b = onnx.numpy_helper.from_array(rng.standard_normal(2).astype(dtype), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "b"],
                                                                          ["pred"])],
        "linear", [helper.make_tensor_value_info("X", ONNX_TYPE[dtype], ["N", 3])],
        [helper.make_tensor_value_info("pred", ONNX_TYPE[dtype], ["N", 2])], [W, b])
    return finalize_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)]))


def _api(directory, checkpoint="checkpoint"):
    state = api.CheckpointState.load_checkpoint(directory / checkpoint)
    module = api.Module(directory / "training_model.onnx", state, directory / "eval_model.onnx")
    return state, module, api.Optimizer(directory / "optimizer_model.onnx", module)


def _train_both(rng, state, module, optimizer, reference, n_steps, lr_of_step, scheduler=None):
    """Train ortlearn and step the reference with ortlearn's gradients; compare every step."""
    module.train()
    for _ in range(n_steps):
        lr = lr_of_step(reference.step)
        if lr is not None:
            optimizer.set_learning_rate(float(lr))
        reference.lr = np.float32(optimizer.get_learning_rate())
        X = rng.standard_normal((8, 3))
        module(X, rng.standard_normal((8, 2)))
        grads = [np.asarray(state.parameters[n].grad) for n in ("W", "b")]
        optimizer.step()
        reference.optimizer_step(grads)
        if scheduler is not None:
            scheduler.step()
        module.lazy_reset_grad()
        for name, expected in zip(("W", "b"), reference.params):
            np.testing.assert_allclose(state.parameters[name].data, expected, rtol=1e-6,
                                       atol=1e-9, err_msg=f"step {reference.step}: {name}")


@pytest.mark.parametrize("optim", ["AdamW", "SGD"])
def test_api_training_matches_kernel_with_lr_changes_and_resume(rng, tmp_path, optim):
    """float64 through generate_artifacts + api: set_learning_rate, LinearLRScheduler, and a
    checkpoint resumed mid-way (the step count, hence the bias correction, carries on)."""
    artifacts.generate_artifacts(_linear_model(np.float64), requires_grad=["W", "b"],
                                 loss=artifacts.LossType.MSELoss,
                                 optimizer=getattr(artifacts.OptimType, optim),
                                 artifact_directory=tmp_path)
    state, module, optimizer = _api(tmp_path)
    assert optimizer.get_learning_rate() == pytest.approx(1e-3)  # the API's initial rate
    kernel = (AdamWKernel(np.float64, **ONNXBLOCK_ADAMW_ATTRIBUTES) if optim == "AdamW"
              else None)
    reference = TrainingApiOptimizer(kernel, [state.parameters[n].data for n in ("W", "b")])
    # 40 steps at the initial rate, then a new rate every 10 steps
    _train_both(rng, state, module, optimizer, reference, 40,
                lambda step: None if step < 40 else 0.02)
    _train_both(rng, state, module, optimizer, reference, 20,
                lambda step: 0.05 * 0.5 ** ((step - 40) // 10))
    api.CheckpointState.save_checkpoint(state, tmp_path / "resumed", include_optimizer_state=True)
    assert api.CheckpointState.load_checkpoint(tmp_path / "resumed").optimizer_step == 60

    state, module, optimizer = _api(tmp_path, "resumed")
    scheduler = api.LinearLRScheduler(optimizer, warmup_step_count=70, total_step_count=120,
                                      initial_lr=0.05)
    # the schedule reads the optimizer's step count: 60 steps made, in the warmup, which
    # lasts total_step_count steps: onnxruntime-training passes the counts swapped
    assert optimizer.get_learning_rate() == linear_lr(60, 120, 70, 0.05)
    _train_both(rng, state, module, optimizer, reference, 40, lambda step: None,
                scheduler=scheduler)
    assert reference.step == 100
    assert optimizer.get_learning_rate() == linear_lr(100, 120, 70, 0.05)


def test_same_numbers_as_a_recording_of_onnxruntime_training(tmp_path):
    """The script of ``tests/data/record_training_api.py`` (a small MLP, MSELoss, AdamW then
    SGD, ``set_learning_rate`` and ``LinearLRScheduler``, six steps each) gives through ortlearn
    the losses, learning rates and parameters onnxruntime-training 1.19.2 gave (recorded in
    ``tests/data/onnxruntime_training_1_19_2.npz``): the learning rates to the last bit (host
    arithmetic), SGD and AdamW to float32 rounding.

    The recording is of one CPU and onnxruntime 1.19.2's kernels: MatMul and Tanh round by a
    few float32 ulps otherwise on another CPU (sums of at most 8 terms: 8 * 2**-24 = 4.8e-7
    relative), and six SGD steps of lr <= 0.05 carry that into the parameters (1e-6
    relative, 1e-7 absolute for values near 0). AdamW's update divides by ``sqrt(v)`` of
    such gradients, which amplifies a gradient's relative error on the first steps: 2e-5.
    """
    import subprocess
    import sys
    from pathlib import Path

    data = Path(__file__).parents[1] / "data"
    out = tmp_path / "ortlearn.npz"
    subprocess.run([sys.executable, str(data / "record_training_api.py"), "ortlearn", str(out)],
                   check=True, capture_output=True)
    reference, ours = np.load(data / "onnxruntime_training_1_19_2.npz"), np.load(out)
    assert sorted(reference.files) == sorted(ours.files)
    for key in reference.files:
        if "_lr" in key:
            np.testing.assert_array_equal(ours[key], reference[key], err_msg=key)
        elif key.startswith("SGD"):
            np.testing.assert_allclose(ours[key], reference[key], rtol=1e-6, atol=1e-7,
                                       err_msg=key)
        else:
            np.testing.assert_allclose(ours[key], reference[key], rtol=2e-5, atol=1e-6,
                                       err_msg=key)
