"""Shared fixtures: seeded random generators, a one-call ONNX runner, one BLAS thread; the
skips of the tests that need a GPU; the programs the browser and Node tests drive."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from skl2onnx import to_onnx
from sklearn.linear_model import LinearRegression
from threadpoolctl import threadpool_limits

from ortlearn import onnxblock
from ortlearn.training.device import cuda_available
from ortlearn.training.webgpu import webgpu_available


def run_onnx(model, feeds, outputs=None):
    """Run ``model`` (ModelProto or bytes) once on the CPU; return the list of outputs."""
    data = model if isinstance(model, bytes) else model.SerializeToString()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return sess.run(outputs, feeds)


class WeightedAverageLoss(onnxblock.Block):
    """The custom loss of onnxruntime-training's documentation, as written there.

    Its ``__init__`` does not call ``super().__init__()``.
    """

    def __init__(self):
        self._loss1 = onnxblock.loss.MSELoss()
        self._loss2 = onnxblock.loss.MSELoss()
        self._w1 = onnxblock.blocks.Constant(0.4)
        self._w2 = onnxblock.blocks.Constant(0.6)
        self._add = onnxblock.blocks.Add()
        self._mul = onnxblock.blocks.Mul()

    def build(self, loss_input_name1, loss_input_name2):
        return self._add(
            self._mul(self._w1(), self._loss1(loss_input_name1, target_name="target1")),
            self._mul(self._w2(), self._loss2(loss_input_name2, target_name="target2")))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def require(found, reason: str):
    """``found``, or a skip where it is missing: a failure in CI, whose .ci/run installs it."""
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: .ci/run installs it")
    pytest.skip(reason)


#: headless Chromium without a network, a GPU or a sandbox (root in CI's containers)
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"]


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of a Chromium (Debian's package); playwright drives it, downloading no browser."""
    found = next(filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                                 "google-chrome"))), None)
    return require(found, "no Chromium on PATH (Debian: apt-get install chromium)")


@pytest.fixture(scope="session")
def node() -> str:
    return require(shutil.which("node"), "no Node.js on PATH")


#: the JavaScript package (ortlearn-training) of the repository
JS = Path(__file__).resolve().parents[1] / "js"


@pytest.fixture(scope="session")
def js_dir(node) -> Path:
    """js/ with its npm dependencies, installed from its lockfile on first use (``npm ci``),
    so that the README's test command runs the on-device tests wherever Node.js is."""
    if not (JS / "node_modules" / "onnxruntime-node").is_dir():
        npm = require(shutil.which("npm"), "no npm on PATH to install js/'s dependencies")
        result = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                                cwd=JS, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"npm ci in js/ failed: {result.stderr[-3000:]}"
    return JS


@pytest.fixture
def unlimited_threads(monkeypatch):
    """The thread policy of a process on 4 CPUs that started with no thread limit, whatever
    this one runs under (``OMP_NUM_THREADS``, ``ORTLEARN_NUM_THREADS``, the BLAS libraries'
    limits, the machine's cores); yields the 4."""
    from threadpoolctl import threadpool_limits

    from ortlearn.training import device

    monkeypatch.delenv(device.NUM_THREADS_ENV, raising=False)
    monkeypatch.setattr(device, "_OMP_NUM_THREADS_AT_IMPORT", None)
    monkeypatch.setattr(device, "_available_cpus", lambda: 4)
    with threadpool_limits(limits=4):
        yield 4


@pytest.fixture(scope="session")
def linear_onnx():
    """LinearRegression on 3 float32 features as MatMul + Add (``coef``, ``intercept``)."""
    X = np.random.RandomState(0).randn(20, 3).astype(np.float32)
    return to_onnx(LinearRegression().fit(X, X[:, 0]), X, black_op={"LinearRegressor"})


def pytest_collection_modifyitems(config, items):
    skips = {}
    if not cuda_available():
        skips["gpu"] = pytest.mark.skip(reason="onnxruntime has no CUDAExecutionProvider here")
    if not webgpu_available():
        skips["webgpu"] = pytest.mark.skip(
            reason="no WebGPU device here (the onnxruntime-ep-webgpu wheel and a GPU)")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def one_blas_thread():
    """One BLAS/OpenMP thread for scipy's L-BFGS-B and scikit-learn's solvers.

    On 2 shared, busy cores their thread pools spin against each other: a fit of
    digits takes 0.3 s with one thread and 1 to 10 s with two (both libraries).
    """
    with threadpool_limits(1):
        yield
