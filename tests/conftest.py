"""Shared fixtures: seeded random generators and a one-call ONNX runner."""

import numpy as np
import onnxruntime as ort
import pytest

from ortlearn.training.device import cuda_available


def run_onnx(model, feeds, outputs=None):
    """Run ``model`` (ModelProto or bytes) once on the CPU; return the list of outputs."""
    data = model if isinstance(model, bytes) else model.SerializeToString()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return sess.run(outputs, feeds)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="onnxruntime has no CUDAExecutionProvider here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
