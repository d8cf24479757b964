"""Thread limits, optional libraries and the description of the machine.

Every library that spins worker threads gets the same explicit count: OpenBLAS /
OpenMP through threadpoolctl (numpy, scipy, scikit-learn), ``torch.set_num_threads``
and onnxruntime's ``intra_op_num_threads`` through ``ORTLEARN_NUM_THREADS``
(ortlearn's sessions use one inter-op thread; an engine runs a step of fewer
than ``PARALLEL_MIN_STEP_MACS`` multiply-adds on one thread whatever the variable
says).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import importlib.metadata
import importlib.util
import os
import platform

PACKAGES = ("ortlearn", "numpy", "scipy", "scikit-learn", "onnx", "onnxruntime",
            "onnxruntime-gpu", "skl2onnx", "torch", "jax", "jaxlib", "optax", "threadpoolctl",
            "matplotlib")


def import_torch():
    """Import torch if it is installed; None otherwise (its contenders are skipped)."""
    if importlib.util.find_spec("torch") is None:
        return None
    return importlib.import_module("torch")


def torch_device(torch, device: str) -> str:
    """Run torch on the GPU only when ortlearn does and torch can (CUDA beside WebGPU)."""
    if device.startswith(("cuda", "webgpu")) and torch.cuda.is_available():
        return "cuda:" + device.partition(":")[2] if ":" in device else "cuda"
    return "cpu"


def load_threaded_libraries() -> None:
    """Load the threaded libraries the benchmarks run, so that threadpoolctl's limits reach
    them: it acts on the libraries already loaded, and ortlearn imports its modules when
    first used. scikit-learn's linear models load its OpenMP runtime (their losses and
    gradients run on every core otherwise: ``PoissonRegressor`` on diabetes took 200 ms
    against 3 on the shared 2-core machine)."""
    import numpy  # noqa: F401  its BLAS
    import scipy.linalg  # noqa: F401  its BLAS
    import sklearn.linear_model  # noqa: F401  scikit-learn's OpenMP runtime


@contextlib.contextmanager
def thread_limits(threads: int, torch=None):
    """Limit every threaded library to ``threads`` for the duration of the block.

    Import ortlearn's estimators, scikit-learn and torch *before* entering:
    threadpoolctl only acts on the libraries already loaded.
    """
    from threadpoolctl import threadpool_limits

    load_threaded_libraries()
    if torch is not None:
        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):  # refused once torch ran parallel work
            torch.set_num_interop_threads(1)
    from ortlearn.training.device import NUM_THREADS_ENV

    previous = os.environ.get(NUM_THREADS_ENV)
    # ortlearn reads its default onnxruntime thread count from this variable
    os.environ[NUM_THREADS_ENV] = str(threads)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        if previous is None:
            del os.environ[NUM_THREADS_ENV]
        else:
            os.environ[NUM_THREADS_ENV] = previous


def thread_report(torch=None) -> dict:
    """Thread counts actually in force (call inside :func:`thread_limits`)."""
    from threadpoolctl import threadpool_info

    from ortlearn.training import device

    ort_options = device.make_session_options()
    report = {
        "onnxruntime_intra_op": ort_options.intra_op_num_threads,
        "onnxruntime_inter_op": ort_options.inter_op_num_threads,
        "blas": [{"api": info.get("internal_api"), "num_threads": info.get("num_threads")}
                 for info in threadpool_info()],
    }
    if torch is not None:
        report["torch_intra_op"] = torch.get_num_threads()
        report["torch_inter_op"] = torch.get_num_interop_threads()
    return report


def _cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def versions() -> dict:
    """Installed version of each package of interest (None when absent)."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def machine(device: str) -> dict:
    """What the numbers were measured on."""
    import onnxruntime

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
