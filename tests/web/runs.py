"""Runs of the same training steps in Node (js/tools/train_steps.mjs) and in Python
(ortlearn's TrainingSession), for the tests to compare."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from ortlearn import CheckpointState, TrainingSession
from tests.conftest import JS


def write_batches(path: Path, batches: list[dict]) -> Path:
    """The batches as train_steps.mjs reads them: ``batch/<i>/<input>`` tensors."""
    save_file({f"batch/{i}/{name}": np.ascontiguousarray(value)
               for i, batch in enumerate(batches) for name, value in batch.items()}, str(path))
    return path


def node_steps(node: str, artifacts: Path, batches: list[dict], steps: int, out: Path,
               checkpoint: Path | None = None, export: list[str] | None = None,
               extra: tuple = ()) -> list[float]:
    """Train ``steps`` steps in Node; the checkpoint goes to ``out``; the losses."""
    batch_file = write_batches(out.parent / f"{out.name}.batches.safetensors", batches)
    losses = out.parent / f"{out.name}.losses.json"
    command = [node, str(JS / "tools" / "train_steps.mjs"), "--artifacts", str(artifacts),
               "--batches", str(batch_file), "--steps", str(steps),
               "--out-checkpoint", str(out), "--losses", str(losses), *extra]
    if checkpoint is not None:
        command += ["--checkpoint", str(checkpoint)]
    if export:
        command += ["--export", str(out.parent / f"{out.name}.inference.onnx"),
                    "--export-outputs", ",".join(export)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(losses.read_text())


def python_steps(artifacts: Path, batches: list[dict], steps: int, out: Path,
                 checkpoint: Path | None = None) -> list[float]:
    """The same steps with ortlearn's TrainingSession; the checkpoint goes to ``out``."""
    state = CheckpointState.load_checkpoint(str(checkpoint or artifacts / "checkpoint"))
    session = TrainingSession(state, str(artifacts / "training_model.onnx"),
                              str(artifacts / "eval_model.onnx"),
                              str(artifacts / "optimizer_model.onnx"))
    names = session.input_names(training=True)
    losses = []
    for step in range(steps):
        batch = batches[step % len(batches)]
        session.lazy_reset_grad()
        outputs = session.train_step(*[batch[n] for n in names])
        session.optimizer_step()
        losses.append(float(np.asarray(outputs[0]).reshape(-1)[0]))
    CheckpointState.save_checkpoint(state, str(out), include_optimizer_state=True)
    session.close()
    return losses
