"""The CNN family of the torch zoo, against torch.

LeNet-style CNN (BatchNorm, Dropout, MaxPool) on the 8x8 digits, MobileNetV2 inverted
residual (depthwise Conv, BatchNorm, ReLU6, HardSwish), ResNet basic block (skip
connection), U-Net block (ConvTranspose, Resize), exported by both torch exporters with
the recipe of doc/torch_models.rst (tests/torch_models.py):

1. gradients of the loss vs torch autograd on the same weights and batch, through
   build_gradient and through generate_artifacts' training model: float64 (onnx's
   reference evaluator: onnxruntime has no float64 Conv kernel) and float32 (onnxruntime);
2. 30 AdamW steps of generate_artifacts + ortlearn.api follow torch.optim.AdamW (losses per
   step, weights and BatchNorm running statistics at the end);
3. with dropout on, the loss falls and the exported inference model agrees with torch's
   eval mode on the trained weights;
4. frozen backbone: only LeNet's classifier trains; no gradient node for the rest, and the
   BatchNorm statistics follow the documented rule.
"""

import copy
import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch_models
from reference_ops import Float64Reference
from sklearn.datasets import load_digits
from torch_models import (
    EXPORTERS,
    LOSS_TYPES,
    ZOO,
    assert_gradients_close,
    dropout_off,
    export,
    gradient_grid,
    ortlearn_gradients,
    parameter_map,
    torch_gradients,
)

from ortlearn import api, artifacts

CNNS = ["lenet", "inverted_residual", "basic_block", "unet_block"]
TOL = {torch.float64: 1e-6, torch.float32: 1e-4}
STEPS, LR = 30, 0.01


@functools.cache
def _export(name, exporter, dtype=torch.float32, dropout=False):
    """(model, inputs, target, onnx); cached per test module (a dynamo export takes seconds).
    The model is returned with the seeded initial weights, dropout off unless ``dropout``."""
    build, loss = ZOO[name]
    model, inputs, target = build()
    if not dropout:
        dropout_off(model)
    model = model.to(dtype)
    inputs = tuple(x.to(dtype) for x in inputs)
    if loss == "mse":
        target = target.to(dtype)
    onx = export(model, inputs, exporter)
    return model, inputs, target, onx


def _fresh(name, exporter, dtype=torch.float32, dropout=False):
    """The cached export with a new module of the same seed: its initial weights and
    statistics (a train-mode forward of the cached one steps its running statistics)."""
    _, inputs, target, onx = _export(name, exporter, dtype, dropout)
    model = ZOO[name][0]()[0]
    if not dropout:
        dropout_off(model)
    return model.to(dtype), inputs, target, onx


def _assert_close_to_torch(got, expected, rtol):
    """Each gradient within ``rtol`` of its largest magnitude, plus ``rtol`` times 1% of the
    model's largest gradient: some gradients cancel to nearly nothing (a Conv bias before a
    train-mode BatchNorm: exactly 0; the inverted residual's bn1.weight: 2e-5 of the
    largest), where float32 torch itself is 4.5e-4 away from float64 torch."""
    largest = max(float(np.abs(v).max()) for v in expected.values())
    assert_gradients_close(got, expected, rtol=rtol, atol=rtol * 0.01 * largest)


# ----------------------------------------------------------------- 1. gradients vs torch


@gradient_grid(CNNS)
def test_gradients_match_torch(name, exporter, dtype, via):
    model, inputs, target, onx = _export(name, exporter, dtype)
    loss = ZOO[name][1]
    expected_loss, expected = torch_gradients(model, inputs, target, loss)
    # float32 in onnxruntime (build_gradient's graph, or a TrainingSession step); float64
    # in onnx's reference evaluator (onnxruntime has no float64 Conv)
    got_loss, got = ortlearn_gradients(
        onx, inputs, target, loss, model=model, via=via,
        evaluator=Float64Reference if dtype == torch.float64 else None)
    assert sorted(got) == sorted(k for k, _ in model.named_parameters())
    assert got_loss == pytest.approx(expected_loss, rel=TOL[dtype])
    _assert_close_to_torch(got, expected, TOL[dtype])


# ----------------------------------------------------------------- 2. AdamW follows torch


def _batches(name, inputs, target, steps=STEPS, seed=0):
    """``steps`` batches of 16: the 8x8 digits (scaled to [0, 1]) for LeNet, two random
    batches in turn for the others."""
    rng = np.random.default_rng(seed)
    size = 16
    if name == "lenet":
        digits = load_digits()
        x = (digits.images / 16.0).astype(np.float32)[:, None]
        y = digits.target.astype(np.int64)
        rows = [rng.choice(len(x), size, replace=False) for _ in range(steps)]
        return [(x[r], y[r]) for r in rows]
    shape = tuple(inputs[0].shape[1:])
    fixed = []
    for _ in range(2):  # two batches in turn: a task the loss can fall on
        x = rng.standard_normal((size, *shape)).astype(np.float32)
        if target.dtype == torch.int64:
            y = rng.integers(0, 3, size)  # inverted_residual, basic_block: 3 classes
        else:
            y = rng.standard_normal((size, *target.shape[1:])).astype(np.float32)
        fixed.append((x, y))
    return [fixed[i % 2] for i in range(steps)]


def _falls(losses):
    return np.mean(losses[-5:]) < 0.95 * np.mean(losses[:5])


def _train_torch(model, data, loss, trainable=None):
    """torch.optim.AdamW with the defaults ortlearn's OptimType.TorchAdamW has (betas (0.9, 0.999),
    eps 1e-8, weight_decay 0.01), lr ``LR``; the losses of each step."""
    model.train()
    params = [p for k, p in model.named_parameters() if trainable is None or k in trainable]
    for k, p in model.named_parameters():
        p.requires_grad_(trainable is None or k in trainable)
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses = []
    for x, y in data:
        opt.zero_grad()
        value = torch_models._torch_loss(loss, model(torch.from_numpy(x)), torch.from_numpy(y))
        value.backward()
        opt.step()
        losses.append(value.item())
    return losses


def _train_ortlearn(onx, data, loss, directory, **kwargs):
    loss_type = LOSS_TYPES[loss]
    artifacts.generate_artifacts(onx, loss=loss_type, optimizer=artifacts.OptimType.TorchAdamW,
                                 artifact_directory=directory, **kwargs)
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state,
                        str(directory / "eval_model.onnx"))
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(LR)
    module.train()
    losses = []
    for x, y in data:
        losses.append(float(np.asarray(module(x, y)).reshape(-1)[0]))
        optimizer.step()
        module.lazy_reset_grad()
    return losses, state, module


def _rel(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / max(np.abs(b).max(), 1e-12))


def _assert_state_equals_torch(state, model, onx, rtol, keys=None, atol=None):
    """Checkpoint values vs the module's parameters and buffers (running statistics):
    each within ``rtol`` of its largest magnitude, plus ``atol[key]`` if given."""
    atol = atol or {}
    checked = []
    for init, (key, transposed) in parameter_map(onx, model).items():
        if init not in state.parameters or (keys is not None and key not in keys):
            continue
        value = state.parameters[init].data
        value = value.T if transposed else value
        ref = model.state_dict()[key].detach().numpy()
        error = float(np.abs(value - ref).max())
        allowed = rtol * max(float(np.abs(ref).max()), 1e-12) + atol.get(key, 0.0)
        assert error <= allowed, (key, error, allowed)
        checked.append(key)
    return checked


def _adamw_rounding_drift(model, data, loss):
    """Per parameter, how far ``STEPS`` float32 AdamW steps may drift from torch's through
    the rounding of the parameter's own gradient.

    Adam's step ``lr * m / (sqrt(v) + eps)`` does not depend on the gradient's scale, so a
    gradient that cancels to almost nothing (the inverted residual's ``bn1.weight``: a sum
    of products of both signs, 2e-5 of the model's largest gradient) is stepped by about
    ``lr`` on digits that float32 does not hold. If each side computes the gradient to a
    relative error ``rho``, one step of each differs by at most ``2 * rho * lr`` (a
    relative error ``r`` of ``g`` moves ``m / sqrt(v)`` by at most ``2 r`` times its
    magnitude, which is at most 1 here), so the two trainings drift apart by at most
    ``STEPS * 4 * rho * lr``. ``rho`` is the float32 rounding error of the gradient, read
    as torch float32 against torch float64 on the training batches at the initial
    weights: the sum's condition number times float32's epsilon, for that parameter and
    this data, not a figure of one machine's kernels.
    """
    rho = {}
    models = {dtype: copy.deepcopy(model).to(dtype) for dtype in (torch.float32, torch.float64)}
    for x, y in data:
        grads = {}
        for dtype, net in models.items():
            target = torch.from_numpy(y)
            target = target.to(dtype) if target.dtype.is_floating_point else target
            _, grads[dtype] = torch_models.torch_gradients(
                net, (torch.from_numpy(x).to(dtype),), target, loss)
        for key, g64 in grads[torch.float64].items():
            error = np.abs(grads[torch.float32][key] - g64).max() / max(np.abs(g64).max(), 1e-30)
            rho[key] = max(rho.get(key, 0.0), float(error))
    return {key: STEPS * 4 * r * LR for key, r in rho.items()}


#: Parameters whose gradient is exactly zero: a Conv bias before a train-mode BatchNorm
#: (the normalisation subtracts it). AdamW steps them by about ``lr`` on the rounding
#: noise of their gradient (m / sqrt(v) of noise is of order 1), in torch as in ortlearn,
#: each on its own noise (measured: LeNet's conv1.bias 40% apart after 30 steps, and
#: the running means with it, while the losses agree): frozen on both sides.
NULL_GRADIENT = {"lenet": ["conv1.bias", "conv2.bias"]}


def _running_statistics(model):
    return [k for k in model.state_dict() if k.endswith(("running_mean", "running_var"))]


@pytest.mark.parametrize("name", CNNS)
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_adamw_follows_torch(name, exporter, tmp_path):
    model, inputs, target, onx = _fresh(name, exporter)
    loss = ZOO[name][1]
    data = _batches(name, inputs, target)
    frozen = NULL_GRADIENT.get(name, [])
    trainable = [k for k, _ in model.named_parameters() if k not in frozen]
    stats = _running_statistics(model)
    got, state, _ = _train_ortlearn(onx, data, loss, tmp_path, requires_grad=trainable,
                                    frozen_params=frozen + stats)
    drift = _adamw_rounding_drift(model, data, loss)  # before torch trains the module
    drift = {k: v for k, v in drift.items() if k in trainable}  # the frozen stay exact
    expected = _train_torch(model, data, loss, trainable)
    for step, (a, b) in enumerate(zip(got, expected)):
        assert a == pytest.approx(b, rel=1e-4), f"step {step}: {a} vs {b}"
    assert _falls(got)
    # 1e-4: the errors each parameter's update takes from the others (about 1e-6 here);
    # plus the drift through the parameter's own gradient rounding (see the helper)
    checked = _assert_state_equals_torch(state, model, onx, rtol=1e-4, atol=drift)
    assert sorted(checked) == sorted(trainable + frozen + stats)


# ----------------------------------------------------------------- 3. dropout on, inference


@pytest.mark.parametrize("name,exporter", [*((n, "torchscript") for n in CNNS),
                                           ("lenet", "dynamo")])
def test_dropout_on_trains_and_inference_model_matches_torch_eval(name, exporter, tmp_path):
    has_dropout = name == "lenet"  # the others have no Dropout
    model, inputs, target, onx = _fresh(name, exporter, dropout=has_dropout)
    if has_dropout:
        assert [n for n in onx.graph.node if n.op_type == "Dropout"]
    api.set_seed(0)
    data = _batches(name, inputs, target)
    trainable = [k for k, _ in model.named_parameters()]
    losses, state, module = _train_ortlearn(onx, data, ZOO[name][1], tmp_path,
                                            requires_grad=trainable,
                                            frozen_params=_running_statistics(model))
    assert _falls(losses), losses
    module.export_model_for_inferencing(str(tmp_path / "inference.onnx"), ["output"])
    inference = onnx.load(str(tmp_path / "inference.onnx"))
    for node in inference.graph.node:  # Dropout, if kept, is in inference mode: its
        # training_mode input left out, as onnxruntime-training's eval model
        assert node.op_type != "Dropout" or len(node.input) < 3 or node.input[2] == ""
    # the trained weights and statistics into the torch module, through parameter_map
    values = {}
    for init, (key, transposed) in parameter_map(onx, model).items():
        if init in state.parameters:
            value = state.parameters[init].data
            values[key] = torch.from_numpy((value.T if transposed else value).copy())
    model.load_state_dict(values, strict=False)
    assert sorted(values) == sorted(trainable + _running_statistics(model))
    model.eval()
    plain = ort.InferenceSession(str(tmp_path / "inference.onnx"),
                                 providers=["CPUExecutionProvider"])
    x = data[0][0]
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    got = plain.run(None, {plain.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


# ----------------------------------------------------------------- 4. frozen backbone


CLASSIFIER = ["fc2.weight", "fc2.bias"]
#: gradient nodes of a Conv, BatchNorm or MaxPool: none when only the classifier trains
BACKWARD_OPS = {"ConvTranspose", "ReduceSum", "Where", "GatherElements", "ScatterElements",
                "Pad", "Equal"}


def _op_counts(model):
    counts = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_frozen_backbone_builds_no_gradient_for_it(exporter):
    model, _, _, onx = _export("lenet", exporter)
    stats = _running_statistics(model)
    params = [k for k, _ in model.named_parameters()]
    backbone = [k for k in params if k not in CLASSIFIER]
    full, eval_model, _, _ = artifacts.build_artifacts(
        onx, requires_grad=params, frozen_params=stats, loss=artifacts.LossType.CrossEntropyLoss)
    head, _, _, _ = artifacts.build_artifacts(
        onx, requires_grad=CLASSIFIER, frozen_params=backbone + stats,
        loss=artifacts.LossType.CrossEntropyLoss)
    full_ops, head_ops, eval_ops = _op_counts(full), _op_counts(head), _op_counts(eval_model)
    # the full model differentiates the convolutions (ConvTranspose, or Conv for the
    # weights) and the pooling; the head-only model has the forward's Convs only
    assert full_ops.get("Conv", 0) + full_ops.get("ConvTranspose", 0) > eval_ops["Conv"]
    assert head_ops.get("Conv", 0) == eval_ops["Conv"] == 2
    assert "ConvTranspose" not in head_ops
    # what the head adds to the forward: the loss, fc2's Gemm gradient, the accumulation
    # and the running statistics; the full model adds the backbone's backward too
    forward = sum(eval_ops.values())
    added_head, added_full = len(head.graph.node) - forward, len(full.graph.node) - forward
    assert added_full > 2 * added_head, (added_head, added_full)
    outputs = [o.name for o in head.graph.output]
    assert [o for o in outputs if o.endswith("_grad.accumulation.out")] == [
        f"{k}_grad.accumulation.out" for k in CLASSIFIER]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_frozen_backbone_batchnorm_statistics_follow_torch(exporter, tmp_path):
    """The documented rule (doc/torch_models.rst, "Frozen backbones"): statistics listed
    in frozen_params are updated by each train step as torch's train mode does, also when
    the BatchNorm's scale and bias are frozen (torch: requires_grad=False), and so they
    are when left out of both lists."""
    _, inputs, target, onx = _export("lenet", exporter)
    data = _batches("lenet", inputs, target, steps=10)
    model = _fresh("lenet", exporter)[0]
    stats = _running_statistics(model)
    backbone = [k for k, _ in model.named_parameters() if k not in CLASSIFIER]
    got, state, _ = _train_ortlearn(onx, data, "cross_entropy", tmp_path / "state",
                                    requires_grad=CLASSIFIER, frozen_params=backbone + stats)
    expected = _train_torch(model, data, "cross_entropy", CLASSIFIER)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    checked = _assert_state_equals_torch(state, model, onx, rtol=1e-4)
    assert sorted(checked) == sorted(CLASSIFIER + backbone + stats)
    initial = _fresh("lenet", exporter)[0]
    assert _rel(model.bn1.running_var.numpy(), initial.bn1.running_var.numpy()) > 0.1  # they moved

    # running statistics in neither list: training state all the same, as in torch
    got, state, _ = _train_ortlearn(onx, data, "cross_entropy", tmp_path / "unlisted",
                                    requires_grad=CLASSIFIER, frozen_params=backbone)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    assert sorted(_assert_state_equals_torch(state, model, onx, rtol=1e-4)) == sorted(checked)
