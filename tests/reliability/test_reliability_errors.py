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


# --------------------------------- partial_fit on targets of another shape
def _regression(n_outputs):
    rng = np.random.RandomState(0)
    X = rng.randn(20, 3)
    y = X @ rng.randn(3, max(n_outputs, 1))
    return X, (y[:, 0] if n_outputs == 0 else y)  # 0: a 1-D target, one output


def _snapshot(est):
    return (est.n_iter_, est.t_, list(est.loss_curve_), est.predict(_regression(0)[0]).copy(),
            [c.copy() for c in est.estimator_.coefs_] if hasattr(est.estimator_, "coefs_")
            else est.estimator_.coef_.copy())


def _assert_same(before, after):
    assert before[:3] == after[:3]
    np.testing.assert_array_equal(before[3], after[3])
    for a, b in zip(before[4], after[4]):
        np.testing.assert_array_equal(a, b)


# (outputs of the first partial_fit, outputs of the second); 0 is a 1-D target
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("first, second", [(0, 2), (1, 2), (2, 0), (2, 1), (2, 3)])
def test_mlp_partial_fit_rejects_other_n_outputs(first, second):
    from ortlearn import OrtMLPRegressor

    est = OrtMLPRegressor((3,), random_state=0).partial_fit(*_regression(first))
    est.partial_fit(*_regression(first))
    before = _snapshot(est)
    with pytest.raises(ValueError, match="output.*fitted with"):
        est.partial_fit(*_regression(second))
    _assert_same(before, _snapshot(est))
    est.partial_fit(*_regression(first))  # the right targets still train
    assert len(est.loss_curve_) == len(before[2]) + 1


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_linear_partial_fit_rejects_multi_output():
    from ortlearn import OrtLinearRegressor

    est = OrtLinearRegressor(random_state=0).partial_fit(*_regression(0))
    before = _snapshot(est)
    with pytest.raises(ValueError, match="1d array"):
        est.partial_fit(*_regression(2))
    _assert_same(before, _snapshot(est))
