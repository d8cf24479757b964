"""Seconds per training step of the same artifacts in Node.js and in Python, in one run.

Usage::

    python -m benchmarks.edge [--hidden 64] [--batch 32] [--steps 300] [--reps 5]
                              [--threads 1] [--out benchmark_results]

An ``OrtMLPClassifier`` fitted one epoch on digits is exported (``export_web``: the optimizer
model in its flat layout, three vectors a step); then, ``--reps`` times and alternately, the same
``--steps`` steps (``lazy_reset_grad``, a training step on a batch, an optimizer step) run in
Python with ``ortlearn.TrainingSession`` and in Node with ``js/``'s ``TrainingSession`` on
onnxruntime-node (``js/tools/train_steps.mjs --time``). Each side times its own loop, after 3
warm-up steps: the median seconds per step, not the process start nor the session creation.
Both run onnxruntime's CPU kernels with ``--threads`` intra-op threads. Prints a table (the
medians over the repetitions and their ratio, Node / Python) and writes ``edge.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks.report import finish_figure, pyplot

JS = Path(__file__).resolve().parents[1] / "js"
WARMUP = 3


def export(directory: Path, hidden: int, batch: int):
    """The artifacts of a digits MLP and the batches of the run: ``(batches, file)``."""
    from safetensors.numpy import save_file
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning

    from ortlearn import OrtMLPClassifier

    X, y = load_digits(return_X_y=True)
    X = (X / 16).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = OrtMLPClassifier(hidden_layer_sizes=(hidden,), batch_size=batch, max_iter=1,
                               random_state=0).fit(X, y)
    # what `python -m ortlearn export-web` writes: the optimizer model in the flat layout
    est.export_web(directory, X, y)
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(16):
        rows = rng.choice(len(X), batch, replace=False)
        batches.append({"X": X[rows], "y": y[rows].astype(np.int64)})
    file = directory / "batches.safetensors"
    save_file({f"batch/{i}/{k}": v for i, b in enumerate(batches) for k, v in b.items()},
              str(file))
    return batches, file


def python_seconds(directory: Path, batches, steps: int) -> float:
    from ortlearn import CheckpointState, TrainingSession

    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    session = TrainingSession(state, str(directory / "training_model.onnx"),
                              str(directory / "eval_model.onnx"),
                              str(directory / "optimizer_model.onnx"))
    times = []
    for step in range(steps + WARMUP):
        batch = batches[step % len(batches)]
        start = time.perf_counter()
        session.lazy_reset_grad()
        session.train_step(batch["X"], batch["y"])
        session.optimizer_step()
        times.append(time.perf_counter() - start)
    session.close()
    return statistics.median(times[WARMUP:])


def node_seconds(directory: Path, file: Path, steps: int, threads: int) -> float:
    out = directory / "node_checkpoint"
    result = subprocess.run(
        ["node", str(JS / "tools" / "train_steps.mjs"), "--artifacts", str(directory),
         "--batches", str(file), "--steps", str(steps + WARMUP), "--out-checkpoint", str(out),
         "--threads", str(threads), "--time"],
        capture_output=True, text=True, check=True, timeout=600)
    return json.loads(result.stdout.strip().splitlines()[-1])["seconds_per_step"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.edge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmark_results")
    args = parser.parse_args(argv)
    os.environ["ORTLEARN_NUM_THREADS"] = str(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        batches, file = export(directory, args.hidden, args.batch)
        python, node = [], []
        for _ in range(args.reps):  # alternately: a drift of the machine hits both
            python.append(python_seconds(directory, batches, args.steps))
            node.append(node_seconds(directory, file, args.steps, args.threads))
    p, n = statistics.median(python), statistics.median(node)
    print(f"MLP 64-{args.hidden}-10 on digits, batch {args.batch}, {args.steps} steps, "
          f"{args.threads} thread(s), median of {args.reps}")
    print(f"{'runtime':<32}{'ms per step':>12}")
    print(f"{'Python TrainingSession':<32}{p * 1e3:>12.3f}")
    print(f"{'Node (onnxruntime-node)':<32}{n * 1e3:>12.3f}")
    print(f"{'ratio Node / Python':<32}{n / p:>12.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    if plt is None:
        print("matplotlib is not installed: no plot")
        return 0
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(["Python", "Node"], [p * 1e3, n * 1e3], color=["tab:blue", "tab:orange"])
    for i, values in enumerate((python, node)):
        ax.plot([i] * len(values), np.array(values) * 1e3, "k.", label="repetitions" if i else None)
    finish_figure(fig, ax, out / "edge.png", ylabel="ms per training + optimizer step",
                  title=f"Same artifacts, same batches (ratio {n / p:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
