"""Six training steps of a small MLP through the training API, AdamW then SGD, with a
``LinearLRScheduler``: the loss, the learning rate and the parameters after each step.

``python tests/data/record_training_api.py ort tests/data/onnxruntime_training_1_19_2.npz``,
run with onnxruntime-training-cpu 1.19.2 and onnx 1.16.2 (its artifacts need IR <= 9), wrote
the recording ``tests/fidelity/test_optimizer_fidelity.py`` compares ortlearn with;
``... ortlearn out.npz`` runs the same script through ortlearn.
"""

import os
import sys
import tempfile

import numpy as np
from onnx import TensorProto, helper, numpy_helper

WEIGHTS = ("W1", "b1", "W2", "b2")


def mlp(rng) -> "onnx.ModelProto":  # noqa: F821
    """x (N, 4) -> MatMul, Add, Tanh, MatMul, Add -> y (N, 3), float32, opset 17, IR 8."""
    shapes = {"W1": (4, 5), "b1": (5,), "W2": (5, 3), "b2": (3,)}
    inits = [numpy_helper.from_array(rng.normal(size=shapes[n]).astype(np.float32), n)
             for n in WEIGHTS]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["h1"]),
             helper.make_node("Tanh", ["h1"], ["h2"]),
             helper.make_node("MatMul", ["h2", "W2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def record(artifacts, api) -> dict:
    rng = np.random.default_rng(0)
    model = mlp(rng)
    X = rng.normal(size=(6, 8, 4)).astype(np.float32)
    Y = rng.normal(size=(6, 8, 3)).astype(np.float32)
    results = {}
    for name in ("AdamW", "SGD"):
        folder = tempfile.mkdtemp()
        artifacts.generate_artifacts(model, requires_grad=list(WEIGHTS),
                                     loss=artifacts.LossType.MSELoss,
                                     optimizer=getattr(artifacts.OptimType, name),
                                     artifact_directory=folder)
        state = api.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
        module = api.Module(os.path.join(folder, "training_model.onnx"), state,
                            os.path.join(folder, "eval_model.onnx"))
        optimizer = api.Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
        optimizer.set_learning_rate(0.05)
        scheduler = api.LinearLRScheduler(optimizer, warmup_step_count=2, total_step_count=6,
                                          initial_lr=0.05)
        module.train()
        for step in range(6):
            loss = module(X[step], Y[step])
            optimizer.step()
            module.lazy_reset_grad()
            scheduler.step()
            results[f"{name}_loss{step}"] = np.asarray(loss)
            results[f"{name}_lr{step}"] = np.asarray(optimizer.get_learning_rate())
            for weight in WEIGHTS:
                results[f"{name}_{weight}_{step}"] = np.array(state.parameters[weight].data)
    return results


if __name__ == "__main__":
    which, out = sys.argv[1], sys.argv[2]
    if which == "ort":
        from onnxruntime.training import api, artifacts
    else:
        from ortlearn import api, artifacts
    np.savez(out, **record(artifacts, api))
