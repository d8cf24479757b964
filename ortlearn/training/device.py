"""Devices and the sessions on them: parse ``'cpu'`` / ``'cuda[:N]'`` / ``'webgpu[:N]'``,
pick providers, and the performance policy of the runtime (threads, spinning, session options,
when an epoch is one call). The measurements behind each threshold are in
``doc/performance_notes.rst``."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass

import onnx
import onnxruntime as ort

from .. import fileio
from ..fileio import model_data_size
from . import webgpu

_DEVICE_RE = re.compile(r"^(cpu|cuda|webgpu)(?::(\d+))?$")


@dataclass(frozen=True)
class Device:
    """A parsed device string.

    Attributes
    ----------
    kind : {'cpu', 'cuda', 'webgpu'}
    index : int
        GPU number (0 for the CPU).
    """

    kind: str
    index: int = 0

    @property
    def ort_device_type(self) -> str:
        """Name OrtValue and IOBinding use for this device."""
        return self.kind

    def providers(self) -> list:
        """Execution providers (with options) for an ``InferenceSession``.

        Empty for WebGPU, a plugin provider that :func:`make_session` adds to the
        session options instead.
        """
        if self.kind == "cpu":
            return ["CPUExecutionProvider"]
        if self.kind == "webgpu":
            return []
        return [("CUDAExecutionProvider", {"device_id": self.index}), "CPUExecutionProvider"]

    def session_options(self, options: ort.SessionOptions,
                        graph_capture: bool = False) -> ort.SessionOptions:
        """``options`` for a session on this device (WebGPU: a copy holding the provider).

        Raises
        ------
        ValueError
            For ``graph_capture`` on a device other than WebGPU.
        """
        if self.kind == "webgpu":
            return _webgpu_options(options, self.index, graph_capture)
        if graph_capture:
            raise ValueError(f"graph_capture is a WebGPU option; the device is {self}.")
        return options

    def __str__(self) -> str:
        return self.kind if self.kind == "cpu" else f"{self.kind}:{self.index}"


def parse_device(device) -> Device:
    """Validate a device string and check that onnxruntime can use it.

    Raises
    ------
    ValueError
        For a string that is not ``'cpu'``, ``'cuda'``, ``'cuda:N'``, ``'webgpu'``
        or ``'webgpu:N'``, when CUDA is asked for and onnxruntime has no CUDA
        execution provider, or WebGPU and the provider or a GPU is missing.
    """
    if isinstance(device, Device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cpu', 'cuda:0' or 'webgpu', "
                        f"got {device!r}.")
    match = _DEVICE_RE.match(device.strip().lower())
    if match is None:
        raise ValueError(f"Unknown device {device!r}: expected 'cpu', 'cuda', 'cuda:N', "
                         "'webgpu' or 'webgpu:N'.")
    kind, index = match.group(1), int(match.group(2) or 0)
    if kind == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ValueError(
            f"device={device!r} needs onnxruntime's CUDAExecutionProvider, which this "
            "onnxruntime does not have. Install the GPU build (both wheels provide the "
            "'onnxruntime' module; keep only the GPU one): pip install 'ortlearn[gpu]' && "
            "pip uninstall -y onnxruntime && pip install --force-reinstall --no-deps "
            "onnxruntime-gpu."
        )
    if kind == "webgpu":
        webgpu.ep_device()  # raises, naming what is missing
    return Device(kind, index)


def cuda_available() -> bool:
    """Whether onnxruntime offers the CUDA execution provider."""
    return "CUDAExecutionProvider" in ort.get_available_providers()


#: Environment variable holding the default number of onnxruntime intra-op threads.
NUM_THREADS_ENV = "ORTLEARN_NUM_THREADS"


def default_num_threads() -> int | None:
    """Intra-op threads asked for by ``ORTLEARN_NUM_THREADS``, None when it is unset.

    Raises
    ------
    ValueError
        If the variable is set to something other than a positive integer.
    """
    value = os.environ.get(NUM_THREADS_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{NUM_THREADS_ENV} must be a positive integer, got {value!r}.")
    return int(value)


def _available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


#: ``OMP_NUM_THREADS`` when ortlearn was imported. Read once, as an OpenMP runtime reads it
#: when it loads: a ``LocalCluster`` of worker processes sets it to 1 in the process that
#: starts it (the nanny's ``pre-spawn-environ``, meant for the workers it spawns), which
#: must not turn the fits of that process to one thread. joblib's and Dask's workers get
#: it before they start, so before they import ortlearn.
_OMP_NUM_THREADS_AT_IMPORT = os.environ.get("OMP_NUM_THREADS")


def _omp_num_threads() -> int | None:
    # OMP_NUM_THREADS is OpenMP's variable, not ours: a value it would not take
    # ("4,2" takes the outer level) is no limit rather than an error.
    value = (_OMP_NUM_THREADS_AT_IMPORT or "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


# threadpoolctl's controller lists the libraries loaded when it is made (a scan of
# the process's shared objects, ~8 ms); it is made again once modules were imported
_CONTROLLER: list = [None, -1]


def _controller():
    """threadpoolctl's controller of the libraries loaded now (kept while no module is imported)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a dependency of scikit-learn
        return None
    controller, n_modules = _CONTROLLER
    if controller is None or n_modules != len(sys.modules):
        controller = ThreadpoolController()
        _CONTROLLER[:] = [controller, len(sys.modules)]
    return controller


def _library_num_threads() -> list:
    """Threads of the OpenMP and BLAS libraries loaded (what ``threadpool_limits`` sets)."""
    controller = _controller()
    if controller is None:
        return []
    return [info["num_threads"] for info in controller.info()
            if isinstance(info.get("num_threads"), int) and info["num_threads"] > 0]


def single_thread_blas():
    """A context in which the BLAS libraries loaded run one thread.

    For a host-side solver whose linear algebra is tiny (scipy's L-BFGS-B on
    a hundred weights): a threaded BLAS call wakes its workers for microseconds
    of work, and on a loaded machine each wake-up waits for a core
    (``doc/performance_notes.rst``, the section on W4's full-batch L-BFGS). The
    cached controller spares the scan of the loaded libraries a fresh
    ``threadpool_limits`` makes.

    Returns
    -------
    context manager
        threadpoolctl's limiter, or a no-op one without threadpoolctl.

    Examples
    --------
    >>> with single_thread_blas():
    ...     pass
    """
    controller = _controller()
    if controller is None:  # pragma: no cover - a dependency of scikit-learn
        return contextlib.nullcontext()
    return controller.limit(limits=1, user_api="blas")


def context_num_threads() -> int | None:
    """The thread limit of the context this process runs in; None where there is none.

    The smallest of ``OMP_NUM_THREADS`` as it was when ortlearn was imported
    (joblib's workers get it from ``inner_max_num_threads``, a Dask nanny sets
    it to 1 for its workers) and the threads of the OpenMP and BLAS libraries loaded, as
    threadpoolctl reads them (``threadpool_limits``), when it is below the
    CPUs the process may run on.

    Returns
    -------
    int or None

    Examples
    --------
    >>> from threadpoolctl import threadpool_limits
    >>> with threadpool_limits(limits=1):
    ...     context_num_threads()
    1
    """
    limits = [n for n in [_omp_num_threads(), *_library_num_threads()] if n is not None]
    limit = min(limits, default=None)
    return limit if limit is not None and limit < _available_cpus() else None


def resolve_num_threads(intra_op_num_threads: int | None = None) -> int | None:
    """Intra-op threads of a session: the runtime's one thread policy.

    The first set of, in order: ``intra_op_num_threads`` (the caller's own
    setting), ``ORTLEARN_NUM_THREADS``, :func:`context_num_threads`; None
    (onnxruntime's default, one thread per physical core) when none is. onnxruntime
    itself reads none of the environment's limits: without this, each task
    of a Dask worker or a joblib process would take every core.

    Parameters
    ----------
    intra_op_num_threads : int, default=None

    Returns
    -------
    int or None

    Examples
    --------
    >>> resolve_num_threads(3)
    3
    """
    return intra_op_num_threads or default_num_threads() or context_num_threads()


#: Environment variable that turns the spinning of onnxruntime's worker threads
#: on (``1``) or off (``0``) where ortlearn would otherwise choose.
SPINNING_ENV = "ORTLEARN_ALLOW_SPINNING"


def default_allow_spinning(default: bool) -> bool:
    """``ORTLEARN_ALLOW_SPINNING`` as a bool, ``default`` when it is unset.

    Raises
    ------
    ValueError
        If the variable is set to something other than 0 or 1.
    """
    value = os.environ.get(SPINNING_ENV, "").strip()
    if not value:
        return default
    if value not in ("0", "1"):
        raise ValueError(f"{SPINNING_ENV} must be 0 or 1, got {value!r}.")
    return value == "1"


def make_session_options(intra_op_num_threads: int | None = None, *,
                         allow_spinning: bool = False,
                         deterministic: bool = False) -> ort.SessionOptions:
    """Session options ortlearn uses by default.

    All graph optimisations, quiet logs, one inter-op thread, and:

    Parameters
    ----------
    intra_op_num_threads : int, default=None
        Threads of one operator. None: :func:`resolve_num_threads`
        (``ORTLEARN_NUM_THREADS``, else the context's limit, else
        onnxruntime's default: one per physical core).
    allow_spinning : bool, default=False
        Let idle worker threads spin for the next task. Spinning saves a few
        microseconds per operator on an idle machine but takes cores from
        every other process, which on a loaded machine slows small models
        down many times over (``doc/performance_notes.rst``), so it is off unless
        asked for.
    deterministic : bool, default=False
        Ask onnxruntime for deterministic kernels (reproducible reductions).

    Returns
    -------
    onnxruntime.SessionOptions

    Examples
    --------
    >>> make_session_options(2).intra_op_num_threads
    2
    """
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    threads = resolve_num_threads(intra_op_num_threads)
    if threads:
        so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if allow_spinning else "0")
    if deterministic:
        so.use_deterministic_compute = True
    return so


#: Graph optimizers every ortlearn session turns off. onnxruntime 1.32's
#: ``ConstantSharing`` merges equal initializers: a fresh BatchNorm's scale
#: (ones) with its running variance, its bias (zeros) with its running mean;
#: a training-mode BatchNormalization kernel then writes the running
#: statistics into the shared buffer and the scale drifts from run to run
#: (``tests/torch/test_torch_export.py`` shows it on a plain session).
DISABLED_OPTIMIZERS = ("ConstantSharing",)


#: Environment variable: a path prefix. Every session ortlearn opens while it is set
#: runs with onnxruntime's profiler (``SessionOptions.enable_profiling``) and writes
#: its profile to ``<prefix>_<date and time>.json`` when it is released
#: (``python -m benchmarks.profile`` reads them).
PROFILE_ENV = "ORTLEARN_PROFILE"


def _profiled(options: ort.SessionOptions) -> ort.SessionOptions:
    prefix = os.environ.get(PROFILE_ENV, "").strip()
    if prefix:
        options.enable_profiling = True
        options.profile_file_prefix = prefix
    return options


def make_session(model, device="cpu", session_options: ort.SessionOptions | None = None,
                 graph_capture: bool = False) -> ort.InferenceSession:
    """Open an ``InferenceSession`` on ``device`` for a ModelProto, bytes or a path.

    Without the optimizers of :data:`DISABLED_OPTIMIZERS`; with onnxruntime's
    profiler where :data:`PROFILE_ENV` is set. A ModelProto whose weights
    exceed :data:`ortlearn.fileio.EXTERNAL_DATA_THRESHOLD` (protobuf cannot
    serialize 2 GB) is saved with external data to a temporary directory and
    opened from there.

    On WebGPU the provider is added to a copy of ``session_options``
    (:meth:`Device.session_options`); ``graph_capture`` records the GPU commands of
    the first run and replays them afterwards (every input and output then
    bound to a fixed device buffer).
    """
    device = parse_device(device)
    session_options = device.session_options(
        _profiled(session_options or make_session_options()), graph_capture)
    if isinstance(model, onnx.ModelProto):
        if model_data_size(model) > fileio.EXTERNAL_DATA_THRESHOLD:
            return _session_from_file(model, device, session_options)
        model = model.SerializeToString()
    elif hasattr(model, "__fspath__"):
        model = str(model)
    return ort.InferenceSession(
        model, sess_options=session_options, providers=device.providers(),
        disabled_optimizers=list(DISABLED_OPTIMIZERS))


#: Session settings ortlearn sets through config entries, carried over by :func:`_webgpu_options`.
_CONFIG_KEYS = ("session.intra_op.allow_spinning", "session.disable_cpu_ep_fallback")
_OPTION_ATTRIBUTES = (
    "graph_optimization_level", "log_severity_level", "log_verbosity_level",
    "intra_op_num_threads", "inter_op_num_threads", "execution_mode", "execution_order",
    "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse",
    "use_deterministic_compute", "enable_profiling", "profile_file_prefix", "logid",
    "optimized_model_filepath")


def _webgpu_options(options: ort.SessionOptions, index: int,
                    graph_capture: bool) -> ort.SessionOptions:
    """A copy of ``options`` with the WebGPU provider on GPU ``index``.

    A plugin provider is added to the options themselves, once: a copy lets one
    set of options (an engine's) open several sessions, with or without graph
    capture. The copy holds the options' attributes and ortlearn's own config
    entries.
    """
    copy = ort.SessionOptions()
    for name in _OPTION_ATTRIBUTES:
        setattr(copy, name, getattr(options, name))
    for key in _CONFIG_KEYS:
        try:
            copy.add_session_config_entry(key, options.get_session_config_entry(key))
        except RuntimeError:  # not set
            pass
    if graph_capture:
        # a captured graph replays fixed buffers: no arena pattern may move them
        copy.enable_mem_pattern = False
    copy.add_provider_for_devices([webgpu.ep_device()],
                                  webgpu.provider_options(index, graph_capture))
    return copy


def _session_from_file(model: onnx.ModelProto, device, session_options) -> ort.InferenceSession:
    # onnxruntime reads the external data while the session is created; the
    # files are not needed afterwards (ignore_cleanup_errors: Windows cannot
    # delete a file onnxruntime still maps)
    with tempfile.TemporaryDirectory(prefix="ortlearn-model-", ignore_cleanup_errors=True) as tmp:
        path = os.path.join(tmp, "model.onnx")
        fileio.save_model(model, path)
        return ort.InferenceSession(
            path, sess_options=session_options, providers=device.providers(),
            disabled_optimizers=list(DISABLED_OPTIMIZERS))
