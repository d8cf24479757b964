"""Issue 22, items 5 and 15: closed sessions and modules, and artifacts that are
written completely or not at all, with errors about what the user did."""

import gc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn import api, artifacts
from ortlearn.graph import make_model
from ortlearn.training import TrainingSession


def _linear_model():
    """y = X @ W + b, 3 features -> 2 outputs (float32)."""
    rng = np.random.default_rng(0)
    params = {"W": rng.normal(size=(3, 2)).astype(np.float32),
              "b": np.zeros(2, np.float32)}
    nodes = [helper.make_node("MatMul", ["X", "W"], ["XW"]),
             helper.make_node("Add", ["XW", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "linear", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    return make_model(graph, [helper.make_opsetid("", 18)]), params


@pytest.fixture(scope="module")
def linear_artifacts(tmp_path_factory):
    directory = tmp_path_factory.mktemp("linear")
    model, params = _linear_model()
    artifacts.generate_artifacts(model, requires_grad=list(params),
                                 loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD,
                                 artifact_directory=directory)
    return directory


def _batch():
    rng = np.random.default_rng(1)
    return rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32)


def _state(directory):
    return api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))


def _module(directory, state):
    return api.Module(str(directory / "training_model.onnx"), state,
                      str(directory / "eval_model.onnx"))


def _session(directory, state):
    return TrainingSession(state, directory / "training_model.onnx",
                           directory / "eval_model.onnx", directory / "optimizer_model.onnx")


# --------------------------------------------------------------- item 5

def test_closed_training_session_refuses_every_method(linear_artifacts, tmp_path):
    state = _state(linear_artifacts)
    session = _session(linear_artifacts, state)
    X, y = _batch()
    session.train_step(X, y)
    session.optimizer_step()
    trained = session.get_parameter("W")
    session.close()
    session.close()  # twice: nothing more happens
    # the state holds the trained values, unbound
    np.testing.assert_array_equal(state.parameters["W"].data, trained)
    calls = {
        "train_step": lambda: session.train_step(X, y),
        "eval_step": lambda: session.eval_step(X, y),
        "optimizer_step": session.optimizer_step,
        "lazy_reset_grad": session.lazy_reset_grad,
        "set_learning_rate": lambda: session.set_learning_rate(0.1),
        "get_learning_rate": session.get_learning_rate,
        "register_linear_lr_scheduler": lambda: session.register_linear_lr_scheduler(1, 2, 0.1),
        "scheduler_step": session.scheduler_step,
        "to_buffer": lambda: session.to_buffer(True),
        "from_buffer": lambda: session.from_buffer(np.zeros(8, np.float32)),
        "get_parameter": lambda: session.get_parameter("W"),
        "set_parameter": lambda: session.set_parameter("W", np.zeros((3, 2), np.float32)),
        "export_optimizer_state": session.export_optimizer_state,
        "export_model_for_inferencing": lambda: session.export_model_for_inferencing(
            tmp_path / "inference.onnx", ["y"]),
        "attach_optimizer": lambda: session.attach_optimizer(
            linear_artifacts / "optimizer_model.onnx"),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=rf"TrainingSession\.{name} was called after "
                                               r"close\(\)"):
            call()
    assert not (tmp_path / "inference.onnx").exists()
    # the step through the closed session changed nothing in the state
    np.testing.assert_array_equal(state.parameters["W"].data, trained)
    # and a new session binds the state, starting from the trained values
    again = _session(linear_artifacts, state)
    np.testing.assert_array_equal(again.get_parameter("W"), trained)


def test_module_close_and_context_manager(linear_artifacts, tmp_path):
    state = _state(linear_artifacts)
    X, y = _batch()
    with _module(linear_artifacts, state) as model:
        optimizer = api.Optimizer(str(linear_artifacts / "optimizer_model.onnx"), model)
        model(X, y)
        optimizer.step()
        scheduler = api.LinearLRScheduler(optimizer, 1, 4, 0.1)
        trained = state.parameters["W"].data
    assert not (trained == _linear_model()[1]["W"]).all()
    np.testing.assert_array_equal(state.parameters["W"].data, trained)
    calls = {
        "Module.__call__": lambda: model(X, y),
        "Module.train": model.train,
        "Module.eval": model.eval,
        "Module.lazy_reset_grad": model.lazy_reset_grad,
        "Module.get_contiguous_parameters": model.get_contiguous_parameters,
        "Module.get_parameters_size": model.get_parameters_size,
        "Module.copy_buffer_to_parameters": lambda: model.copy_buffer_to_parameters(
            np.zeros(8, np.float32)),
        "Module.export_model_for_inferencing": lambda: model.export_model_for_inferencing(
            str(tmp_path / "inference.onnx"), ["y"]),
        "Module.input_names": model.input_names,
        "Module.output_names": model.output_names,
        "Optimizer.step": optimizer.step,
        "Optimizer.set_learning_rate": lambda: optimizer.set_learning_rate(0.5),
        "Optimizer.get_learning_rate": optimizer.get_learning_rate,
        "LinearLRScheduler.step": scheduler.step,
        r"Optimizer\(\)": lambda: api.Optimizer(
            str(linear_artifacts / "optimizer_model.onnx"), model),
        r"LinearLRScheduler\(\)": lambda: api.LinearLRScheduler(optimizer, 1, 4, 0.1),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=rf"{name} was called after Module\.close\(\)"):
            call()
    np.testing.assert_array_equal(state.parameters["W"].data, trained)
    model.close()  # twice: nothing more happens
    with pytest.raises(RuntimeError, match="cannot be reopened"):
        with model:
            pass
    # the state is free: a new module trains on from the trained values
    with _module(linear_artifacts, state) as again:
        np.testing.assert_array_equal(again.get_contiguous_parameters().numpy()[:6],
                                      trained.ravel())


def test_collected_module_releases_its_state(linear_artifacts):
    state = _state(linear_artifacts)
    X, y = _batch()
    model = _module(linear_artifacts, state)
    optimizer = api.Optimizer(str(linear_artifacts / "optimizer_model.onnx"), model)
    model(X, y)
    optimizer.step()
    trained = state.parameters["W"].data
    del model
    gc.collect()
    # the optimizer keeps its module (and the state bound) alive
    with pytest.raises(RuntimeError, match=r"Close the first one \(module\.close\(\)"):
        _module(linear_artifacts, state)
    del optimizer
    gc.collect()
    again = _module(linear_artifacts, state)
    np.testing.assert_array_equal(state.parameters["W"].data, trained)
    np.testing.assert_array_equal(again.get_contiguous_parameters().numpy()[:6],
                                  trained.ravel())


def test_two_live_sessions_on_one_state_are_refused(linear_artifacts):
    state = _state(linear_artifacts)
    first = _module(linear_artifacts, state)
    for second in (lambda: _module(linear_artifacts, state),
                   lambda: _session(linear_artifacts, state)):
        with pytest.raises(RuntimeError, match="already bound to a live training session") as err:
            second()
        assert "diverging copies" in str(err.value) and "module.close()" in str(err.value)
    # the refused ones left the binding alone: the first still trains the state
    X, y = _batch()
    first(X, y)
    np.testing.assert_array_equal(state.parameters["W"].grad,
                                  first._session.get_gradient("W"))
    first.close()
    _session(linear_artifacts, state).close()
