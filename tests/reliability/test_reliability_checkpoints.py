"""Reliability of checkpoint files: untrusted paths and optimizer states.

An untrusted path is read only if it is a regular file, and the
header length and declared tensor sizes are checked against the file's size
before the body is read. A path that would hang or exhaust memory is tried in
a subprocess with a timeout and a memory limit, so that a regression fails
the test instead of hanging the suite.

The optimizer state of a checkpoint (learning rate, step, moments),
from a file or from ``set_optimizer_state``, is refused when it is not a
state a training could resume from.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import safetensors.numpy

from ortlearn import CheckpointState, api
from ortlearn.training.checkpoint import _OptimizerSnapshot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Loads argv[1] with a 1 GiB address-space limit and prints the outcome.
_LOADER = textwrap.dedent("""
    import resource, sys
    from ortlearn.training.checkpoint import CheckpointState
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    try:
        CheckpointState.load_checkpoint(sys.argv[1])
    except ValueError as exc:
        print("ValueError:", exc)
    except BaseException as exc:
        print("OTHER:", type(exc).__name__, exc)
    else:
        print("LOADED")
""")


def _load_in_subprocess(path) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        done = subprocess.run([sys.executable, "-c", _LOADER, str(path)], env=env,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"load_checkpoint({str(path)!r}) did not return within 60 s")
    return done.stdout.strip() + done.stderr.strip()


def _state():
    return CheckpointState.from_parameters({"w": np.ones((2, 1), np.float32)})


# ------------------------------------------------------------- paths

def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "checkpoint"
    os.mkfifo(fifo)
    out = _load_in_subprocess(fifo)
    assert out.startswith("ValueError:") and "not a regular file" in out, out


def test_device_is_refused_without_reading_it():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    out = _load_in_subprocess("/dev/zero")
    assert out.startswith("ValueError:") and "not a regular file" in out, out


def test_directory_and_missing_file_keep_their_oserrors(tmp_path):
    with pytest.raises(IsADirectoryError):
        CheckpointState.load_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError):
        CheckpointState.load_checkpoint(tmp_path / "missing")


def test_save_over_a_fifo_does_not_block(tmp_path):
    # The save first peeks at the existing file (is it a checkpoint with
    # values?); a FIFO there must not block it.
    fifo = tmp_path / "checkpoint"
    os.mkfifo(fifo)
    code = ("import sys, numpy as np\n"
            "from ortlearn.training.checkpoint import CheckpointState\n"
            "s = CheckpointState.from_parameters({'w': np.ones(2, np.float32)}, nominal=True)\n"
            "CheckpointState.save_checkpoint(s, sys.argv[1])\nprint('SAVED')\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        done = subprocess.run([sys.executable, "-c", code, str(fifo)], env=env,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("save_checkpoint over a FIFO did not return within 60 s")
    assert "SAVED" in done.stdout, done.stderr
    assert CheckpointState.load_checkpoint(fifo).parameters["w"].nominal


# ------------------------------------------------- declared sizes

def _sparse_file(path, header: dict, total: int) -> None:
    """A file of ``total`` bytes (sparse: costs no disk) starting with ``header``."""
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(total)


def test_header_length_beyond_the_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "checkpoint"
    path.write_bytes((1 << 62).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match=r"header declares \d+ bytes, longer than the file's 2 "):
        CheckpointState.load_checkpoint(path)
    with pytest.raises(ValueError, match="header declares"):
        CheckpointState.load_checkpoint(path.read_bytes())


def test_huge_header_in_a_huge_file_is_refused_before_reading(tmp_path):
    # A header length that fits in a 3 GiB (sparse) file but no checkpoint
    # has: refused without reading 3 GiB (the subprocess has 1 GiB).
    path = tmp_path / "checkpoint"
    total = 3 << 30
    with open(path, "wb") as f:
        f.write((total - 8).to_bytes(8, "little"))
        f.truncate(total)
    out = _load_in_subprocess(path)
    assert out.startswith("ValueError:") and "more than the" in out, out


def test_tensor_larger_than_the_file_is_refused_before_reading(tmp_path):
    # The tensor declares 16 TiB; the 3 GiB body is never read.
    path = tmp_path / "checkpoint"
    header = {"__metadata__": {"ortlearn.checkpoint": "1"},
              "param/w": {"dtype": "F32", "shape": [1 << 42], "data_offsets": [0, 1 << 44]}}
    _sparse_file(path, header, 3 << 30)
    out = _load_in_subprocess(path)
    assert out.startswith("ValueError:") and "out of proportion" in out, out


@pytest.mark.parametrize("entry", [
    {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]},        # 16 bytes declared in 8
    {"dtype": "F32", "shape": [1 << 62, 1 << 62], "data_offsets": [0, 16]},  # overflows int64
    {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},       # past the body's end
    {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]},         # unknown dtype
    {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]},       # negative dimension
])
def test_declared_tensor_sizes_are_checked(tmp_path, entry):
    text = json.dumps({"__metadata__": {"ortlearn.checkpoint": "1"}, "param/w": entry}).encode()
    data = len(text).to_bytes(8, "little") + text + bytes(8)
    path = tmp_path / "checkpoint"
    path.write_bytes(data)
    for source in (path, data):
        with pytest.raises(ValueError, match="tensor 'param/w'"):
            CheckpointState.load_checkpoint(source)


def test_valid_checkpoints_still_load(tmp_path):
    state = _state()
    state.set_optimizer_state({"w": {"m": np.full((2, 1), 0.5, np.float32)}}, 3, 0.01)
    CheckpointState.save_checkpoint(state, tmp_path / "c", include_optimizer_state=True)
    back = CheckpointState.load_checkpoint(tmp_path / "c")
    assert back.parameters["w"].data.tolist() == [[1.0], [1.0]]
    assert back.optimizer_step == 3
    # An empty state (no tensor at all) too.
    CheckpointState.save_checkpoint(CheckpointState(), tmp_path / "e")
    assert len(CheckpointState.load_checkpoint(tmp_path / "e").parameters) == 0
    assert safetensors.numpy.load_file(tmp_path / "c")["param/w"].shape == (2, 1)


# ----------------------------------------------- optimizer state values

def _moments(value=0.5):
    return {"w": {"exp_avg": np.full((2, 1), value, np.float32)}}


def _file_with(states, step, learning_rate) -> bytes:
    """A checkpoint file (valid checksum) holding an optimizer state as given.

    The snapshot is set behind ``set_optimizer_state``'s back, as a foreign
    writer or an older ortlearn could have written it.
    """
    state = _state()
    state._optimizer = _OptimizerSnapshot(states, step, learning_rate)
    return state.to_bytes(include_optimizer_state=True)


BAD_RATES = [float("nan"), float("inf"), -float("inf"), -0.1, 1e39]
BAD_STEPS = [-1, 2**63, 2**70]
BAD_MOMENTS = [float("nan"), float("inf"), -float("inf")]


@pytest.mark.parametrize("rate", BAD_RATES)
def test_bad_learning_rate_is_refused(rate):
    with pytest.raises(ValueError, match=r"learning_rate must be a finite number >= 0") as err:
        _state().set_optimizer_state(_moments(), 1, rate)
    assert repr(rate) in str(err.value)
    with pytest.raises(ValueError, match=r"learning_rate must be a finite number >= 0"):
        CheckpointState.load_checkpoint(_file_with(_moments(), 1, rate))


@pytest.mark.parametrize("step", BAD_STEPS)
def test_bad_step_is_refused(step):
    with pytest.raises(ValueError, match=rf"step must .*got {step}"):
        _state().set_optimizer_state(_moments(), step, 0.01)
    with pytest.raises(ValueError, match=rf"step must .*got {step}"):
        CheckpointState.load_checkpoint(_file_with(_moments(), step, 0.01))


@pytest.mark.parametrize("value", BAD_MOMENTS)
def test_non_finite_moments_are_refused(value):
    moments = _moments()
    moments["w"]["exp_avg"][1, 0] = value
    with pytest.raises(ValueError, match=r"'exp_avg' of 'w' has 1 NaN or infinite"):
        _state().set_optimizer_state(moments, 1, 0.01)
    with pytest.raises(ValueError, match=r"'exp_avg' of 'w' has 1 NaN or infinite"):
        CheckpointState.load_checkpoint(_file_with(moments, 1, 0.01))


def test_learning_rate_of_another_type_is_a_type_error():
    with pytest.raises(TypeError, match="learning_rate must be a real number, got str"):
        _state().set_optimizer_state(_moments(), 1, "0.1")


@pytest.mark.parametrize("rate, step", [
    (0.0, 0), (0.01, 2**63 - 1), (float(np.finfo(np.float32).max), 5), (np.float32(0.1), 1),
])
def test_valid_optimizer_state_edges_round_trip(rate, step):
    state = _state()
    state.set_optimizer_state(_moments(), step, rate)
    back = CheckpointState.load_checkpoint(state.to_bytes(include_optimizer_state=True))
    assert back.optimizer_step == step
    assert back.optimizer_learning_rate == float(rate)
    assert back.optimizer_state["w"]["exp_avg"].tolist() == [[0.5], [0.5]]
    # Integer states (a counter) have no NaN to check.
    state.set_optimizer_state({"w": {"count": np.array([3], np.int64)}}, step, rate)


def _linear_artifacts(directory):
    """Artifacts of ``y = x @ w`` (3 features, MSE, AdamW) in ``directory``; their state."""
    from onnx import TensorProto, helper, numpy_helper

    from ortlearn import artifacts
    from ortlearn.graph import make_model

    w = numpy_helper.from_array(np.ones((3, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "lin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])], [w])
    artifacts.generate_artifacts(make_model(graph, [helper.make_opsetid("", 18)]),
                                 requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=directory)
    return CheckpointState.load_checkpoint(str(directory / "checkpoint"))


def test_training_does_not_resume_from_nan_parameters(tmp_path):
    """A checkpoint saved after a divergence: binding it for training is refused, naming
    the parameters (it used to load and train on from NaN)."""
    state = _linear_artifacts(tmp_path)
    state.parameters["w"].data = np.array([[1.0], [np.nan], [2.0]], np.float32)
    broken = state.to_bytes()
    state = api.CheckpointState.load_checkpoint(broken)  # loading it is allowed: inspection
    assert np.isnan(state.parameters["w"].data).any()
    with pytest.raises(ValueError, match=r"parameters \['w'\] hold NaN or infinite"):
        api.Module(str(tmp_path / "training_model.onnx"), state)
    state.parameters["w"].data = np.ones((3, 1), np.float32)  # the remedy the error names
    with api.Module(str(tmp_path / "training_model.onnx"), state) as module:
        module.train()


def test_a_step_at_the_int64_limit_is_a_clear_error(tmp_path):
    """A checkpoint whose step is 2^63-1 (valid, it round-trips): the next optimizer step
    used to end in numpy's raw OverflowError."""
    state = _linear_artifacts(tmp_path)
    moments = {"w": {"exp_avg": np.zeros((3, 1), np.float32),
                     "exp_avg_sq": np.zeros((3, 1), np.float32)}}
    state.set_optimizer_state(moments, 2**63 - 1, 0.01)
    module = api.Module(str(tmp_path / "training_model.onnx"), state)
    optimizer = api.Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
    module(np.ones((4, 3), np.float32), np.ones((4, 1), np.float32))
    with pytest.raises(ValueError, match="made 9223372036854775807 steps"):
        optimizer.step()
