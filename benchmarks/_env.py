"""Thread limits, optional libraries and the description of the machine.

Every library that spins worker threads gets the same explicit count: OpenBLAS /
OpenMP through threadpoolctl (numpy, scipy, scikit-learn), ``torch.set_num_threads``
and onnxruntime's ``intra_op_num_threads`` (``inter_op_num_threads`` 1).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys

PACKAGES = ("ortlearn", "numpy", "scipy", "scikit-learn", "onnx", "onnxruntime",
            "onnxruntime-gpu", "skl2onnx", "torch", "threadpoolctl", "matplotlib")


def import_torch():
    """Import torch if it is installed; None otherwise (its contenders are skipped)."""
    if importlib.util.find_spec("torch") is None:
        return None
    return importlib.import_module("torch")


def torch_device(torch, device: str) -> str:
    """Run torch on the GPU only when ortlearn does and torch can."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return device
    return "cpu"


def _ort_session_options_patches(threads: int):
    """(module, original, replacement) for each loaded ``make_session_options``.

    ortlearn's estimators open their sessions with
    ``ortlearn.training.device.make_session_options()``, which leaves
    onnxruntime's thread count to its default (all cores). The replacement asks
    for ``threads`` intra-op threads and one inter-op thread instead.
    """
    from ortlearn.training import device

    original = device.make_session_options

    def limited(intra_op_num_threads=None):
        options = original(intra_op_num_threads or threads)
        options.inter_op_num_threads = 1
        return options

    # session.py imported the function by name: patch every module that holds it
    return [(module, original, limited) for name, module in list(sys.modules.items())
            if name.split(".")[0] == "ortlearn"
            and getattr(module, "make_session_options", None) is original]


@contextlib.contextmanager
def thread_limits(threads: int, torch=None):
    """Limit every threaded library to ``threads`` for the duration of the block.

    Import ortlearn's estimators, scikit-learn and torch *before* entering:
    threadpoolctl only acts on the libraries already loaded.
    """
    from threadpoolctl import threadpool_limits

    import ortlearn.estimators  # noqa: F401  loads the modules whose sessions get limited

    if torch is not None:
        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):  # refused once torch ran parallel work
            torch.set_num_interop_threads(1)
    patches = _ort_session_options_patches(threads)
    for module, _, limited in patches:
        module.make_session_options = limited
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        for module, original, _ in patches:
            module.make_session_options = original


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
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
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
