"""Closed sessions and modules, and artifacts that are written completely or not at
all, with errors about what the user did."""

import gc
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn import api, artifacts, onnxblock
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


# ----------------------------------------------- closed sessions and modules

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


# ------------------------------------- artifacts written completely or not at all

def _old_files(directory, names):
    directory.mkdir(exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"old " + name.encode())


def _contents(directory):
    return {p.name: p.read_bytes() if p.is_file() else "dir" for p in directory.iterdir()}


@pytest.mark.parametrize("in_the_way", ["eval_model.onnx", "checkpoint",
                                        "optimizer_model.ort"])
def test_a_directory_in_the_way_is_refused_before_anything_is_written(tmp_path, in_the_way):
    out = tmp_path / "out"
    _old_files(out, ["training_model.onnx", "eval_model.onnx", "optimizer_model.onnx",
                     "checkpoint", "training_model.ort", "eval_model.ort",
                     "optimizer_model.ort"])
    (out / in_the_way).unlink()
    (out / in_the_way).mkdir()
    before = _contents(out)
    model, params = _linear_model()
    given = str(tmp_path / "." / "out")  # the path as the user wrote it
    with pytest.raises(ValueError) as err:
        artifacts.generate_artifacts(model, requires_grad=list(params),
                                     loss=artifacts.LossType.MSELoss,
                                     optimizer=artifacts.OptimType.SGD,
                                     artifact_directory=given, ort_format=True)
    message = str(err.value)
    assert f"{os.path.join(given, in_the_way)!r} is a directory" in message
    assert "Nothing was written" in message
    assert _contents(out) == before  # no new file, no temporary left


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root ignores file permissions")
def test_an_unwritable_file_in_the_way_is_refused(tmp_path):
    out = tmp_path / "out"
    _old_files(out, ["training_model.onnx", "checkpoint"])
    (out / "checkpoint").chmod(0o444)
    model, params = _linear_model()
    with pytest.raises(ValueError, match=r"'[^']*checkpoint' is not writable"):
        artifacts.generate_artifacts(model, requires_grad=list(params),
                                     loss=artifacts.LossType.MSELoss, artifact_directory=out)
    assert (out / "training_model.onnx").read_bytes() == b"old training_model.onnx"


def test_an_unwritable_file_is_refused_whoever_runs_the_test(tmp_path, monkeypatch):
    """As above where root ignores permissions: os.access answers as for another user."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    _old_files(out, ["training_model.onnx", "checkpoint"])
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: access(path, mode) and not (
        os.fspath(path).endswith("checkpoint") and mode & os.W_OK))
    model, params = _linear_model()
    with pytest.raises(ValueError, match=r"'out/checkpoint' is not writable.*Nothing was "
                                         r"written"):
        artifacts.generate_artifacts(model, requires_grad=list(params),
                                     loss=artifacts.LossType.MSELoss, artifact_directory="out")
    monkeypatch.undo()
    assert _contents(out) == {"training_model.onnx": b"old training_model.onnx",
                              "checkpoint": b"old checkpoint"}


def test_a_failed_ort_conversion_leaves_the_old_files(tmp_path):
    """onnxruntime cannot convert a model with an operator it does not know: refused as a
    ValueError before any file is replaced (the .onnx files used to be new, the .ort old)."""
    model, params = _linear_model()
    model.graph.node.append(helper.make_node("Foo", ["X"], ["z"], domain="my.domain"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3]))
    model.opset_import.append(helper.make_opsetid("my.domain", 1))
    out = tmp_path / "out"
    _old_files(out, ["training_model.onnx", "checkpoint", "training_model.ort"])
    before = _contents(out)
    with pytest.raises(ValueError, match=r"cannot convert 'training_model.ort' .*my.domain:Foo"
                                         r".*custom_op_library"):
        artifacts.generate_artifacts(model, requires_grad=list(params),
                                     loss=artifacts.LossType.MSELoss, artifact_directory=out,
                                     ort_format=True)
    assert _contents(out) == before


@pytest.mark.parametrize("trained", [["W", "b"], ["b"]])
def test_duplicate_initializer_names_are_named(trained):
    model, params = _linear_model()
    model.graph.initializer.append(numpy_helper.from_array(np.ones((3, 2), np.float32), "W"))
    # with W trained, one of the two was trained silently
    with pytest.raises(ValueError, match=r"several initializers named \['W'\].*Rename or "
                                         r"remove the duplicates"):
        artifacts.build_artifacts(model, requires_grad=trained,
                                  loss=artifacts.LossType.MSELoss)


class _ReturnsUnknown(onnxblock.TrainingBlock):
    def build(self, output_name):
        return [output_name, "logits"]


class _RefersToUnknown(onnxblock.TrainingBlock):
    def __init__(self):
        super().__init__()
        self.loss = onnxblock.loss.MSELoss()

    def build(self, output_name):
        return self.loss("prediction", "target")


class _InvalidNode(onnxblock.TrainingBlock):
    def build(self, output_name):
        self.base.graph.node.append(helper.make_node(
            "ReduceSum", [output_name], ["total"], keepdims=0, bogus=1))
        return "total"


def test_training_block_on_an_unknown_output_is_named():
    model, _ = _linear_model()
    with pytest.raises(ValueError, match=r"build\(\) returned \['logits'\].*not a value of "
                                         r"the model; the model's outputs are \['y'\]"):
        artifacts.build_artifacts(model, requires_grad=["W"], loss=_ReturnsUnknown())
    with pytest.raises(ValueError, match=r"build\(\) refers to \['prediction'\].*the model's "
                                         r"outputs are \['y'\]"):
        artifacts.build_artifacts(model, requires_grad=["W"], loss=_RefersToUnknown())


def test_build_artifacts_raises_no_onnx_checker_error():
    model, _ = _linear_model()
    with pytest.raises(ValueError) as err:
        artifacts.build_artifacts(model, requires_grad=["W"], loss=_InvalidNode())
    assert not isinstance(err.value, onnx.checker.ValidationError)
    assert "The loss block _InvalidNode built an invalid ONNX model" in str(err.value)
    assert "Unrecognized attribute: bogus" in str(err.value)
