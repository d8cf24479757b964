"""Training through ``ortlearn.torch.ORTModule`` follows plain torch.

Each comparison starts two copies of one seeded module from the same weights (the
reference is a ``copy.deepcopy`` taken before wrapping), feeds both the same batches
and steps both with ``torch.optim.Adam``:

1. 50 steps (batch sizes vary where the export has a free batch axis): the loss of
   every step and the final weights (BatchNorm's running statistics and
   ``num_batches_tracked`` too) within 1e-4 relative in float32 and 1e-5 in float64;
   one export, no warning. Models: the MLP and the LeNet-style CNN with BatchNorm
   (both exporters; the MLP also in float64), the transformer encoder layer (dropout
   off; dynamo: the TorchScript export bakes MultiheadAttention's sequence length) in
   float32 and, with ReLU instead of GELU, in float64, and the LSTM/GRU model
   (dynamo). onnxruntime's CPU build has no float64 Conv, Erf (GELU) or LSTM kernel:
   in float64 those models run in torch after one warning naming the kernel, and
   train exactly as torch does.
2. Input gradients (``x.requires_grad_()``) equal torch's.
3. With dropout on, LeNets trained on the digits reach torch's test accuracy.
4. BatchNorm: train mode updates the running statistics as torch does, eval mode
   uses them, and switching train/eval/train exports once per mode.

Null directions. Some parameters get an exactly zero gradient from torch: a
convolution's bias before a train-mode BatchNorm (the normalisation subtracts it
again) and the key third of MultiheadAttention's ``in_proj_bias`` (it adds the same
``q . b`` to every key's score, which the softmax removes). In float32 both sides
compute these gradients as round-off (the transformer's key bias: 4e-8 of the
largest gradient), and Adam divides each gradient by the square root of its own
running second moment: the round-off becomes steps of up to ``lr`` in a random
direction. After 50 steps the key bias differs between ONNX Runtime and torch by
1.4e-2 while every gradient of every step agrees to 6e-7 of the largest; a
convolution's bias drifts alike and, through BatchNorm, moves ``running_mean``. So
the LeNet here has ``bias=False`` convolutions (as BatchNorm networks usually have:
the bias is redundant), and the transformer's comparison checks that the key bias's
gradient stays below 1e-6 of the step's largest gradient at every step, for torch and
for ONNX Runtime, then compares the weights everywhere else. (A weight behind a dead
ReLU gets an exactly zero gradient on both sides: Adam leaves it alone, and it is
compared.)

The models are exported once per module (a module-scoped cache of the trained
pairs: a dynamo export takes seconds); tests that reuse a trained pair reload its
weights in place, which exports nothing.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import numpy as np
import onnxruntime
import pytest
import torch
import torch.nn.functional as F
import torch_models as tm
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from ortlearn.torch import ORTModule

STEPS, LR = 50, 1e-2
RTOL = {torch.float32: 1e-4, torch.float64: 1e-5}
#: A gradient below this fraction of the step's largest one at every step is null.
NULL = 1e-6


def _lenet(batch, seed):
    return tm.lenet(batch=batch, seed=seed, bias=False)


def _relu_transformer(batch, seed):
    return tm.transformer(batch=batch, seed=seed, activation="relu")


def _recurrent(batch, seed):
    # One batch shape (3 sequences of 4 steps): torch specialises the sequence length of
    # a second dynamo export of an LSTM in one process, and test_torch_sequence exports
    # one before.
    return tm.recurrent(seed=seed)


#: name -> (builder(batch, seed) -> (model, inputs, target), null directions:
#: {parameter: slice of its elements}).
MODELS = {
    "mlp": (lambda batch, seed: tm.mlp(batch=batch, seed=seed), {}),
    "lenet": (_lenet, {}),
    "transformer": (lambda batch, seed: tm.transformer(batch=batch, seed=seed),
                    {"encoder.self_attn.in_proj_bias": slice(8, 16)}),
    "transformer_relu": (_relu_transformer, {"encoder.self_attn.in_proj_bias": slice(8, 16)}),
    "recurrent": (_recurrent, {}),
}

F32, F64 = torch.float32, torch.float64
#: (model, exporter, dtype) trained through onnxruntime.
CASES = [
    ("mlp", "dynamo", F32), ("mlp", "torchscript", F32), ("mlp", "torchscript", F64),
    ("lenet", "dynamo", F32), ("lenet", "torchscript", F32),
    ("transformer", "dynamo", F32), ("transformer_relu", "dynamo", F64),
    ("recurrent", "dynamo", F32),
]
#: (model, exporter, the float64 kernel onnxruntime's CPU build lacks). The fallback
#: comes from the first run of the exported graphs, whichever exporter wrote them: the
#: TorchScript one (under a second) where it exports the model in float64; the
#: transformer needs dynamo (TorchScript cannot export its float64 attention mask).
FALLBACKS = [("lenet", "torchscript", "Conv"), ("transformer", "dynamo", "Erf"),
             ("recurrent", "torchscript", "LSTM")]


def _ids(case):
    return "-".join(str(c).removeprefix("torch.") for c in case)


def _cast(tensors, dtype):
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)


def _batches(name, dtype, n, start=1):
    """``n`` different batches (inputs, target) of model ``name``, of 4 to 6 samples
    (the recurrent model's: 3)."""
    build = MODELS[name][0]
    out = []
    for i in range(start, start + n):
        _, inputs, target = build(4 + i % 3, 100 + i)
        out.append((_cast(inputs, dtype), target))
    return out


def _model(name, dtype):
    model = MODELS[name][0](4, 0)[0]
    return tm.dropout_off(model).to(dtype)


@dataclass
class Trained:
    """Two copies of one module after the same Adam steps: ``ort`` through ORTModule."""

    ort: ORTModule
    ref: torch.nn.Module
    losses: tuple  # (onnxruntime, torch): one float per step
    grads: tuple  # (onnxruntime, torch): one {name: gradient} per step
    states: tuple  # (onnxruntime, torch): the state_dicts after the steps
    export_count: int  # after the steps
    warnings: list  # the messages of the warnings the steps through ORTModule emitted


def _adam_steps(model, batches):
    """Adam steps of ``model`` on ``batches``: the losses and the gradients of each step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses, grads = [], []
    for inputs, target in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(*inputs), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        grads.append({k: p.grad.detach().clone() for k, p in model.named_parameters()})
    return losses, grads


def _train(name, exporter, dtype, steps=STEPS) -> Trained:
    model = _model(name, dtype)
    ref = copy.deepcopy(model)
    ort = ORTModule(model, exporter=exporter)
    batches = _batches(name, dtype, 5) * (steps // 5)  # 5 batches of random labels, learnt
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ort_losses, ort_grads = _adam_steps(ort, batches)
    ref_losses, ref_grads = _adam_steps(ref, batches)
    states = tuple({k: v.clone() for k, v in m.state_dict().items()} for m in (ort, ref))
    return Trained(ort, ref, (ort_losses, ref_losses), (ort_grads, ref_grads), states,
                   ort.export_count, [str(w.message) for w in caught])


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread for torch: these models are so small that a thread pool's
    hand-offs cost more than their kernels (and spin on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained():
    """``trained(name, exporter, dtype)``: the pair after :data:`STEPS` Adam steps, trained
    once per test module."""
    cache = {}

    def get(name, exporter, dtype):
        key = (name, exporter, dtype)
        if key not in cache:
            cache[key] = _train(*key)
        return cache[key]

    return get


def _null_mask(grads, name) -> torch.Tensor:
    """Elements of parameter ``name`` whose gradient stays below :data:`NULL` of the
    step's largest gradient at every step."""
    mask = None
    for step in grads:
        largest = max(float(g.abs().max()) for g in step.values())
        null = step[name].abs() <= NULL * largest
        mask = null if mask is None else mask & null
    return mask


def _assert_close(got, expected, rtol, what, mask=None):
    """``got`` within ``rtol`` of the largest magnitude of ``expected`` (outside ``mask``)."""
    got, expected = got.double(), expected.double()
    if mask is not None:
        got, expected = got[~mask], expected[~mask]
    scale = max(float(expected.abs().max()), 1e-30)
    err = float((got - expected).abs().max())
    assert err <= rtol * scale, f"{what}: max error {err:.3g}, scale {scale:.3g}"


# --------------------------------------------------------------------------- 1. 50 steps


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_adam_steps_follow_torch(trained, case):
    name, _, dtype = case
    run = trained(*case)
    rtol = RTOL[dtype]
    # batches of 4 to 6 rows: the first one's shapes, then symbolic dimensions (the
    # recurrent model's batches all have 3)
    assert run.export_count == (1 if name == "recurrent" else 2)
    assert run.ort._fallback_reason is None
    assert run.warnings == []
    ort_losses, ref_losses = map(np.array, run.losses)
    assert len(ort_losses) == STEPS
    np.testing.assert_allclose(ort_losses, ref_losses, rtol=rtol, atol=0)
    assert ref_losses[-5:].mean() < 0.9 * ref_losses[:5].mean()  # it learns the batches

    null = MODELS[name][1]
    got_state, ref_state = run.states
    assert got_state.keys() == ref_state.keys()
    for key, ref_value in ref_state.items():
        mask = None
        if key in null:
            mask = torch.zeros(ref_value.numel(), dtype=torch.bool)
            mask[null[key]] = True
            mask = mask.reshape(ref_value.shape)
            for grads in run.grads:  # null for torch and for onnxruntime at every step
                assert _null_mask(grads, key)[mask].all(), key
        if ref_value.is_floating_point():
            _assert_close(got_state[key], ref_value, rtol, key, mask)
        else:  # num_batches_tracked
            assert torch.equal(got_state[key], ref_value), key


@pytest.mark.parametrize("case", FALLBACKS, ids=_ids)
def test_float64_fallback_trains_in_torch(case):
    name, exporter, kernel = case
    model = _model(name, F64)
    ref = copy.deepcopy(model)
    ort = ORTModule(model, exporter=exporter)
    batches = _batches(name, F64, 5)
    with pytest.warns(UserWarning) as caught:
        ort_losses, _ = _adam_steps(ort, batches)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(messages) == 1, messages
    assert "in torch, not in ONNX Runtime" in messages[0] and kernel in messages[0]
    assert kernel in ort._fallback_reason
    ref_losses, _ = _adam_steps(ref, batches)
    assert ort_losses == ref_losses
    ref_state = ref.state_dict()
    for key, value in ort.state_dict().items():
        assert torch.equal(value, ref_state[key]), key


# --------------------------------------------------------------------------- 2. input gradients


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("mlp", "lenet")], ids=_ids)
def test_input_gradients(trained, case):
    """``x.requires_grad_()``: ``x.grad`` (and the weights' gradients) equal torch's; a
    new backward graph, not a new export."""
    run = trained(*case)
    count = run.ort.export_count
    run.ort.train()
    run.ref.train()
    run.ort.load_state_dict(run.ref.state_dict())
    (x,), target = _batches(case[0], case[2], 1, start=STEPS + 1)[0]
    grads = []
    for model in (run.ort, run.ref):
        model.zero_grad()
        xg = x.clone().requires_grad_()
        F.cross_entropy(model(xg), target).backward()
        grads.append((xg.grad, {k: p.grad.clone() for k, p in model.named_parameters()}))
    (got_x, got_w), (ref_x, ref_w) = grads
    assert got_x is not None and float(ref_x.abs().max()) > 0
    _assert_close(got_x, ref_x, RTOL[case[2]], "x.grad")
    for key, value in ref_w.items():
        _assert_close(got_w[key], value, RTOL[case[2]], key)
    assert run.ort.export_count == count


def test_eval_export_after_input_gradient(trained):
    """An input whose ``.grad`` is set (it went through a backward) exports again, here in
    eval mode: torch.export fails on such an example input, ORTModule exports it
    detached (before, it fell back to torch)."""
    run = trained("lenet", "dynamo", F32)
    ort, ref = run.ort, run.ref
    ort.train()
    (x,), target = _batches("lenet", F32, 1, start=STEPS + 1)[0]
    x.requires_grad_()
    F.cross_entropy(ort(x), target).backward()
    assert x.grad is not None
    ref.load_state_dict(ort.state_dict())
    ort.eval()
    ref.eval()
    try:
        with torch.no_grad():
            got, expected = ort(x), ref(x)
    finally:
        ort.train()
        ref.train()
    assert ort._fallback_reason is None
    _assert_close(got, expected, 1e-5, "eval outputs")


# --------------------------------------------------------------------------- 3. digits


class LeNets(torch.nn.Module):
    """``members`` copies of :class:`torch_models.LeNet` side by side in one module.

    Member ``r`` owns channels ``[4r, 4r + 4)`` of ``conv1``/``bn1`` and
    ``[8r, 8r + 8)`` of ``conv2`` (grouped)/``bn2``, and its own Linear layers;
    the loss is the sum of the members' mean cross-entropies. Gradients,
    BatchNorm statistics, dropout masks and Adam's elementwise updates never mix
    members: each trains as a LeNet would alone, at the cost of one call.
    """

    def __init__(self, members, n_classes=10, p=0.25):
        super().__init__()
        self.members = members
        self.conv1 = torch.nn.Conv2d(1, 4 * members, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(4 * members)
        self.conv2 = torch.nn.Conv2d(4 * members, 8 * members, 3, padding=1, groups=members)
        self.bn2 = torch.nn.BatchNorm2d(8 * members)
        self.dropout = torch.nn.Dropout(p)
        self.fc1_weight = torch.nn.Parameter(torch.empty(members, 32, 16))
        self.fc1_bias = torch.nn.Parameter(torch.empty(members, 1, 16))
        self.fc2_weight = torch.nn.Parameter(torch.empty(members, 16, n_classes))
        self.fc2_bias = torch.nn.Parameter(torch.empty(members, 1, n_classes))
        for weight, bias in ((self.fc1_weight, self.fc1_bias), (self.fc2_weight, self.fc2_bias)):
            bound = weight.shape[1] ** -0.5  # torch.nn.Linear's initialisation
            torch.nn.init.uniform_(weight, -bound, bound)
            torch.nn.init.uniform_(bias, -bound, bound)

    def forward(self, x):
        """``(members, N, n_classes)`` logits."""
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.dropout(x.reshape(x.shape[0], self.members, 32).transpose(0, 1))
        return F.relu(x @ self.fc1_weight + self.fc1_bias) @ self.fc2_weight + self.fc2_bias


MEMBERS, EPOCHS, BATCH = 16, 8, 32


def _fit_digits(model, data, seed):
    """Adam with a linear decay to 0 over :data:`EPOCHS` epochs of minibatches (the same
    order for every model); the test accuracy of each member after each epoch."""
    x_train, x_test, y_train, y_test = data
    torch.manual_seed(seed)  # torch's dropout masks
    onnxruntime.set_seed(seed)  # onnxruntime's
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    n_steps = EPOCHS * -(-len(x_train) // BATCH)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / n_steps)
    order = torch.Generator().manual_seed(0)
    accuracies = []
    for _ in range(EPOCHS):
        model.train()
        for idx in torch.randperm(len(x_train), generator=order).split(BATCH):
            logits = model(x_train[idx])
            loss = MEMBERS * F.cross_entropy(logits.flatten(0, 1), y_train[idx].repeat(MEMBERS))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        model.eval()
        with torch.no_grad():
            accuracies.append((model(x_test).argmax(-1) == y_test).double().mean(1))
    return accuracies


def test_dropout_training_converges_on_digits():
    """With dropout on (p=0.25), LeNets trained through ORTModule reach torch's test
    accuracy on the 8x8 digits.

    onnxruntime draws other dropout masks than torch, so the two trainings are two
    samples of a random outcome: over 20 seeds, one LeNet's test accuracy after these
    epochs has a standard deviation of 0.01 (through torch and through onnxruntime
    alike, with means 0.948 and 0.947), and one run of each would miss a 0.01 margin
    one time in four. Hence 16 LeNets trained at once (:class:`LeNets`) and the
    comparison of their mean accuracies: over 4 seeds the difference (onnxruntime
    minus torch) was -0.003, +0.010, -0.003 and +0.002. Train and eval modes alternate
    each epoch: in train mode an export for the first batch's shapes and one with
    symbolic dimensions (the last batch is smaller), in eval mode one.
    """
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
    data = train_test_split(x, torch.tensor(digits.target), test_size=0.25,
                            stratify=digits.target, random_state=0)
    torch.manual_seed(0)
    model = LeNets(MEMBERS)
    ref = copy.deepcopy(model)
    wrapped = ORTModule(model, exporter="torchscript")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _fit_digits(wrapped, data, seed=0)
    expected = _fit_digits(ref, data, seed=0)
    assert wrapped.export_count == 3
    assert float(got[-1].mean()) >= float(expected[-1].mean()) - 0.01
    assert float(got[-1].mean()) >= 0.92 and float(got[-1].min()) >= 0.85  # chance: 0.1


# --------------------------------------------------------------------------- 4. BatchNorm


@pytest.mark.parametrize("exporter", tm.EXPORTERS)
def test_batchnorm_train_eval(trained, exporter):
    """After training, eval mode normalises with the running statistics (outputs equal
    torch's eval outputs, statistics untouched); train mode again updates them as torch
    does; eval mode is one export more (the training batches of 4 to 6 rows made two)."""
    run = trained("lenet", exporter, F32)
    ort, ref = run.ort, run.ref
    ort.train()
    ref.train()
    ort.load_state_dict(ref.state_dict())
    stats = {k: v.clone() for k, v in ref.state_dict().items() if "running" in k}
    # 50 steps moved the statistics from their initial zeros (mean) and ones (var)
    moved = [float((v - float(k.endswith("var"))).abs().max()) for k, v in stats.items()]
    assert min(moved) > 0.01, moved
    (x,), _ = _batches("lenet", F32, 1, start=STEPS + 1)[0]

    def eval_outputs():
        ort.eval()
        ref.eval()
        with torch.no_grad():
            return ort(x), ref(x)

    got, expected = eval_outputs()
    _assert_close(got, expected, 1e-5, "eval outputs")
    with torch.no_grad():
        ref.train()
        batch_stats = ref(x)  # the same batch normalised by its own statistics
    assert float((batch_stats - expected).abs().max()) > 1e-2 * float(expected.abs().max())
    for key, value in stats.items():
        assert torch.equal(ort.get_buffer(key), value), f"eval mode changed {key}"

    ort.train()
    ref.train()
    ref.load_state_dict(ort.state_dict())  # the extra forward stepped torch's statistics
    tracked = int(ref.get_buffer("bn1.num_batches_tracked"))
    batches = _batches("lenet", F32, 6, start=STEPS + 2)
    ort_losses, _ = _adam_steps(ort, batches)
    ref_losses, _ = _adam_steps(ref, batches)
    np.testing.assert_allclose(ort_losses, ref_losses, rtol=1e-4)
    ref_state = ref.state_dict()
    for key, value in ort.state_dict().items():
        if key.endswith("num_batches_tracked"):
            assert int(value) == int(ref_state[key]) == tracked + 6, key
        else:
            _assert_close(value, ref_state[key], 1e-4, key)
    assert not torch.equal(ort.get_buffer("bn1.running_mean"), stats["bn1.running_mean"])
    got, expected = eval_outputs()
    _assert_close(got, expected, 1e-4, "eval outputs after more training")
    assert ort.export_count == 3
    assert ort._fallback_reason is None
    ort.train()
    ref.train()
