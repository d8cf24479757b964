"""W6 and W7: torch networks trained through the training API, against torch eager.

A torch module is exported once (TorchScript exporter, train mode, no
constant folding: the recipe of ``doc/torch_models.rst``), its artifacts are
generated with ``ortlearn.artifacts.generate_artifacts`` (cross-entropy,
AdamW), and ``ortlearn.api`` trains it; torch trains a copy of the same module
with ``torch.optim.AdamW`` on the same batches. ``time`` is milliseconds per
training step (forward, backward, AdamW update, gradient reset), the median
of the steps of one repetition after a warm-up; ``final_loss`` is the mean
loss of the last ten steps.

* W6: a LeNet-style CNN on digits 8x8 (two Conv+BatchNorm+ReLU+MaxPool
  stages, Dropout, a Linear head), batch 64.
* W7: a transformer encoder layer (embedding with padding_idx, 4-head
  self-attention with a key padding mask, LayerNorm, GELU, dropout) and a
  Linear head on mean-pooled tokens, batch 32 of 32 tokens.

:func:`step_memory` measures the peak resident memory that training steps add
to a process holding the model (and, for ortlearn, its opened sessions) and
the data: activations, gradients, optimizer state and allocator arenas, for
ortlearn and torch, each in a fresh child process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LR = 1e-3
WARMUP_STEPS = 5


def _cnn(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 2 * 2, 10))


def _transformer(torch, vocab=100, dim=64, heads=4):
    nn = torch.nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim, padding_idx=0)
            self.layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1,
                                                    activation="gelu", batch_first=True)
            self.head = nn.Linear(dim, 2)

        def forward(self, tokens):
            pad = tokens == 0
            h = self.layer(self.embed(tokens), src_key_padding_mask=pad)
            keep = (~pad).unsqueeze(-1).to(h.dtype)
            return self.head((h * keep).sum(1) / keep.sum(1))

    return Encoder()


def _digits_batches(batch: int, steps: int, seed: int):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    rng = np.random.default_rng(seed)
    picks = [rng.choice(len(X), batch, replace=False) for _ in range(steps)]
    return [(X[p], y[p].astype(np.int64)) for p in picks]


def _token_batches(batch: int, steps: int, seed: int, length=32, vocab=100):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        tokens = rng.integers(1, vocab, (batch, length))
        lengths = rng.integers(length // 4, length + 1, batch)
        tokens[np.arange(length)[None, :] >= lengths[:, None]] = 0  # padding
        # a learnable label: whether the first token is in the upper half of the vocabulary
        out.append((tokens.astype(np.int64), (tokens[:, 0] >= vocab // 2).astype(np.int64)))
    return out


NETWORKS = {
    "W6": ("LeNet-style CNN, digits 8x8", _cnn, _digits_batches, 64),
    "W7": ("transformer encoder layer", _transformer, _token_batches, 32),
}


def ortlearn_trainer(torch, module, example, directory):
    """``step(x, y) -> loss`` training ``module``'s export with ortlearn.api (AdamW)."""
    from ortlearn import api, artifacts
    from ortlearn.graph import get_train_initializer

    path = Path(directory) / "model.onnx"
    torch.onnx.export(module.train(), (torch.from_numpy(example),), str(path), dynamo=False,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})
    import onnx

    model = onnx.load(str(path))
    # requires_grad=None would train nothing (onnxruntime-training's default)
    artifacts.generate_artifacts(model, requires_grad=get_train_initializer(model),
                                 loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=directory)
    d = Path(directory)
    state = api.CheckpointState.load_checkpoint(str(d / "checkpoint"))
    trained = api.Module(str(d / "training_model.onnx"), state, str(d / "eval_model.onnx"))
    optimizer = api.Optimizer(str(d / "optimizer_model.onnx"), trained)
    optimizer.set_learning_rate(LR)
    trained.train()

    def step(x, y):
        loss = trained(x, y)
        optimizer.step()
        trained.lazy_reset_grad()
        return float(loss)

    return step


def torch_trainer(torch, module):
    """``step(x, y) -> loss`` with torch eager and ``torch.optim.AdamW``."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    module.train()

    def step(x, y):
        optimizer.zero_grad()
        loss = loss_fn(module(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def run_steps(step, batches) -> dict:
    """Time each step; the median after :data:`WARMUP_STEPS` warm-up steps."""
    times, losses = [], []
    for x, y in batches:
        start = time.perf_counter()
        losses.append(step(x, y))
        times.append(time.perf_counter() - start)
    return {"time": float(np.median(times[WARMUP_STEPS:])) * 1e3,
            "final_loss": float(np.mean(losses[-10:]))}


def build_network(key: str, opts):
    """The workload ``key`` (W6 or W7): ortlearn.api and, with torch, torch eager."""
    from benchmarks._harness import Contender, Workload

    title, make, batches_of, batch = NETWORKS[key]
    steps = max(int(round(100 * opts.scale)), 2 * WARMUP_STEPS + 10)
    w = Workload(key, title, "ms/step", "final_loss",
                 {"batch_size": batch, "steps": steps, "learning_rate": LR, "optimizer": "AdamW"},
                 torch_ref="torch_adamw")
    torch = opts.torch
    if torch is None:
        w.notes.append(f"{key} needs torch (the network is a torch module): skipped")
        return w

    def module(seed):
        torch.manual_seed(seed)
        return make(torch)

    def ortlearn_adamw(seed, warmup):
        data = batches_of(batch, WARMUP_STEPS + 2 if warmup else steps, seed)
        with tempfile.TemporaryDirectory() as directory:
            step = ortlearn_trainer(torch, module(seed), data[0][0], directory)
            return run_steps(step, data)

    def torch_adamw(seed, warmup):
        data = batches_of(batch, WARMUP_STEPS + 2 if warmup else steps, seed)
        return run_steps(torch_trainer(torch, module(seed)), data)

    w.contenders += [
        Contender("ortlearn_adamw", "ortlearn", ortlearn_adamw,
                  "generate_artifacts + api.Module/Optimizer: train step, AdamW step, reset"),
        Contender("torch_adamw", "torch", torch_adamw,
                  "zero_grad + forward + backward + AdamW step, eager"),
    ]
    return w


_MEMORY_CHILD = r"""
import json, sys, tempfile
import torch
from benchmarks import networks
from benchmarks.memory import STATUS_SOURCE
exec(STATUS_SOURCE)

key, library, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(threads)
import os
from ortlearn.training.device import NUM_THREADS_ENV
os.environ[NUM_THREADS_ENV] = str(threads)
title, make, batches_of, batch = networks.NETWORKS[key]
torch.manual_seed(0)
data = batches_of(batch, 6, 0)
with tempfile.TemporaryDirectory() as directory:
    if library == "ortlearn":
        step = networks.ortlearn_trainer(torch, make(torch), data[0][0], directory)
    else:
        step = networks.torch_trainer(torch, make(torch))
    # the model, its sessions (ortlearn) and the data are the baseline; what the steps
    # allocate (activations, gradients, optimizer state, arenas) is the measure
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM
    for x, y in data:
        step(x, y)
    print(json.dumps({"step_peak_bytes": status("VmHWM") - before}))
"""


def step_memory(key: str, library: str, threads: int = 2) -> int:
    """Peak resident bytes that training steps of ``key`` add, in a fresh process."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, key, library, str(threads)],
                         capture_output=True, text=True, check=True, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])["step_peak_bytes"]
