"""Errors a user can act on: checks before onnxruntime runs, estimators left untouched."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn import CheckpointState, TrainingSession
from ortlearn.artifacts import LossType, OptimType, generate_artifacts
from ortlearn.graph import make_model

LOSSES = {"mse": LossType.MSELoss, "cross_entropy": LossType.CrossEntropyLoss}


def _artifacts(directory, batch_dim, loss):
    """Artifacts of ``pred = X @ W`` whose output (so the target) declares ``batch_dim``."""
    X = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])
    pred = helper.make_tensor_value_info("pred", TensorProto.FLOAT, [batch_dim, 3])
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["pred"])], "f", [X],
                              [pred], [numpy_helper.from_array(np.ones((4, 3), np.float32), "W")])
    generate_artifacts(make_model(graph, [helper.make_opsetid("", 18)]), requires_grad=["W"],
                       loss=LOSSES[loss], optimizer=OptimType.SGD, artifact_directory=directory)
    return TrainingSession(CheckpointState.load_checkpoint(directory / "checkpoint"),
                           directory / "training_model.onnx", directory / "eval_model.onnx",
                           directory / "optimizer_model.onnx")


def _target(loss, rows):
    return np.zeros(rows, np.int64) if loss == "cross_entropy" else np.ones((rows, 3), np.float32)


# 'N': the target shares X's symbol; 'M' and None: only the loss's graph ties them
@pytest.mark.parametrize("batch_dim", ["N", "M", None])
@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("step", ["train_step", "eval_step"])
def test_session_rejects_disagreeing_batches(tmp_path, capfd, batch_dim, loss, step):
    session = _artifacts(tmp_path, batch_dim, loss)
    X = np.ones((8, 4), np.float32)
    with pytest.raises(ValueError, match=r"'(target|labels)'.*\(5,") as info:
        getattr(session, step)(X, _target(loss, 5))
    assert "8" in str(info.value)  # the other side of the disagreement
    assert "onnxruntime" not in capfd.readouterr().err  # onnxruntime never ran
    ort_X = ort.OrtValue.ortvalue_from_numpy(X)
    getattr(session, step)(ort_X, _target(loss, 8))  # agreeing sizes still run
    session.close()


@pytest.mark.parametrize("step", ["train_step", "eval_step"])
def test_session_rejects_ortvalue_of_wrong_dtype(tmp_path, capfd, step):
    session = _artifacts(tmp_path, "N", "mse")
    X = ort.OrtValue.ortvalue_from_numpy(np.ones((8, 4), np.float64))
    with pytest.raises(TypeError, match=r"'X'.*float32.*tensor\(double\)"):
        getattr(session, step)(X, _target("mse", 8))
    assert "onnxruntime" not in capfd.readouterr().err
    session.close()


def test_session_allows_broadcast_of_one_row(tmp_path):
    """A size of 1 broadcasts in onnxruntime: the check refuses only what it would."""
    session = _artifacts(tmp_path, "M", "mse")
    loss, = session.eval_step(np.ones((8, 4), np.float32), _target("mse", 1))
    assert np.isfinite(loss)
    session.close()
