"""``ortlearn.training.device``: sessions opened with onnxruntime's profiler on request."""

import gc
import json

import numpy as np
from onnx import TensorProto, helper

from ortlearn.graph import DEFAULT_OPSET, finalize_model
from ortlearn.training.device import PROFILE_ENV, make_session


def _relu():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return finalize_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)]))


def test_profile_env_makes_sessions_write_their_profile(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "run"))
    session = make_session(_relu())
    assert session.get_session_options().enable_profiling
    session.run(None, {"x": np.array([-1.0, 0.0, 2.0], np.float32)})
    del session
    gc.collect()
    (path,) = tmp_path.glob("run_*.json")  # written when the session is released
    events = json.loads(path.read_text())
    assert any(e.get("args", {}).get("op_name") == "Relu" for e in events)


def test_no_profile_without_the_env(tmp_path, monkeypatch):
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    session = make_session(_relu())
    assert not session.get_session_options().enable_profiling
    del session
    gc.collect()
    assert list(tmp_path.iterdir()) == []
