"""The WebGPU execution provider: onnxruntime's vendor-neutral GPU backend.

It runs on Vulkan (Linux, Android), Metal (macOS) and Direct3D 12 (Windows),
so one step graph trains on NVIDIA, AMD, Intel and Apple GPUs; it is also the
backend of onnxruntime-web in browsers. It ships as a *plugin* execution
provider in its own small wheel, ``onnxruntime-ep-webgpu``
(``pip install 'ortlearn[webgpu]'``), which onnxruntime (1.24.4 or later)
loads at run time: :func:`register` loads it once per process and
:func:`ep_device` finds the device a session is put on
(``SessionOptions.add_provider_for_devices``).

On Linux it needs a Vulkan loader (``libvulkan.so.1``, Debian's ``libvulkan1``)
and a GPU driver with Vulkan; onnxruntime lists no WebGPU device on a machine
without a GPU. The provider has no float64 kernels, and without its
``enableInt64`` option (which ortlearn sets) it computes int64 tensors in 32
bits.
"""

from __future__ import annotations

import os
import threading

import onnxruntime as ort

__all__ = ["EP_NAME", "GRAPH_CAPTURE_ENV", "OPTIONS_ENV", "check_float32",
           "default_graph_capture", "ep_device", "provider_options", "register",
           "webgpu_available"]

#: The provider's name in onnxruntime (``session.get_providers()``).
EP_NAME = "WebGpuExecutionProvider"

#: The name ortlearn registers the plugin library under.
_LIBRARY_NAME = "ortlearn-webgpu"

_INSTALL = ("pip install 'ortlearn[webgpu]' (the onnxruntime-ep-webgpu wheel, with "
            "onnxruntime >= 1.24.4)")

#: Environment variable: ``0`` trains without graph capture on WebGPU (default ``1``).
GRAPH_CAPTURE_ENV = "ORTLEARN_WEBGPU_GRAPH_CAPTURE"

#: Environment variable: more provider options, ``key=value`` pairs separated by commas
#: (``validationMode=disabled,maxNumPendingDispatches=64``), for every WebGPU session.
OPTIONS_ENV = "ORTLEARN_WEBGPU_OPTIONS"

#: The options ortlearn sets itself: the GPU, 64-bit integers (without them a classifier
#: trains on wrong labels), graph capture (``ORTLEARN_WEBGPU_GRAPH_CAPTURE``).
_OWN_OPTIONS = ("deviceId", "enableInt64", "enableGraphCapture")

_registered: list = []  # the library path once registered in this process
_LOCK = threading.Lock()


def register() -> None:
    """Load the WebGPU plugin library into onnxruntime (once per process).

    Raises
    ------
    ValueError
        If the ``onnxruntime-ep-webgpu`` wheel is not installed, or this
        onnxruntime cannot load plugin execution providers.
    """
    with _LOCK:  # fits on several threads may ask for the device at once
        if not _registered:
            _register()


def _register() -> None:
    try:
        import onnxruntime_ep_webgpu
    except ImportError:
        raise ValueError(f"device='webgpu' needs onnxruntime's WebGPU execution provider: "
                         f"{_INSTALL}.") from None
    if not hasattr(ort, "register_execution_provider_library"):
        raise ValueError(f"device='webgpu' needs onnxruntime >= 1.24.4 (plugin execution "
                         f"providers); this is onnxruntime {ort.__version__}.")
    path = onnxruntime_ep_webgpu.get_library_path()
    if not any(d.ep_name == EP_NAME for d in ort.get_ep_devices()):
        try:
            ort.register_execution_provider_library(_LIBRARY_NAME, path)
        except Exception as exc:  # an onnxruntime older than the plugin needs
            raise ValueError(f"onnxruntime {ort.__version__} could not load the WebGPU "
                             f"execution provider ({path}): {exc}") from exc
    _registered.append(path)


def _devices() -> list:
    return [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]


def webgpu_available() -> bool:
    """Whether the WebGPU provider is installed and onnxruntime lists a device for it.

    Examples
    --------
    >>> isinstance(webgpu_available(), bool)
    True
    """
    try:
        register()
    except ValueError:
        return False
    return bool(_devices())


def ep_device() -> ort.OrtEpDevice:
    """The WebGPU device a session is put on.

    The provider takes one of onnxruntime's devices and picks the physical
    GPU itself (its ``deviceId`` option, set by :func:`provider_options`).

    Raises
    ------
    ValueError
        Without the wheel, or when onnxruntime lists no WebGPU device (no GPU,
        no GPU driver with Vulkan, or no Vulkan loader).
    """
    register()
    devices = _devices()
    if not devices:
        found = sorted({f"{d.ep_name} ({d.device.type.name})" for d in ort.get_ep_devices()})
        raise ValueError(
            "device='webgpu': onnxruntime lists no WebGPU device on this machine (it found "
            f"{', '.join(found)}). The provider needs a GPU whose driver offers Vulkan (Metal "
            "on macOS, Direct3D 12 on Windows) and, on Linux, the Vulkan loader libvulkan.so.1 "
            "(Debian and Ubuntu: apt-get install libvulkan1).")
    return devices[0]


def provider_options(index: int = 0, graph_capture: bool = False) -> dict:
    """The provider options of a training session on GPU ``index``.

    Parameters
    ----------
    index : int, default=0
        The GPU (the provider's ``deviceId``).
    graph_capture : bool, default=False
        Record the session's GPU commands at its first run and replay them
        afterwards (``enableGraphCapture``): every input and output must be
        bound to a fixed device buffer (:class:`onnxruntime.IOBinding`).

    Returns
    -------
    dict of str to str

    Examples
    --------
    >>> provider_options(1, graph_capture=True)
    {'deviceId': '1', 'enableInt64': '1', 'enableGraphCapture': '1'}

    :data:`OPTIONS_ENV` adds options of the provider's own (``validationMode``,
    ``maxNumPendingDispatches``, the buffer-cache modes, ...).
    """
    # int64 kernels: without them the provider computes int64 tensors (class labels,
    # row numbers) in 32 bits and a classifier trains on wrong labels, silently
    options = {"deviceId": str(index), "enableInt64": "1"}
    if graph_capture:
        options["enableGraphCapture"] = "1"
    return {**options, **_environment_options()}


def _environment_options() -> dict:
    """The options of :data:`OPTIONS_ENV`; a ``ValueError`` naming a malformed or
    reserved one."""
    text = os.environ.get(OPTIONS_ENV, "").strip()
    options = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not (sep and key and value):
            raise ValueError(f"{OPTIONS_ENV}: {item!r} is not key=value (for example "
                             "validationMode=disabled).")
        if key in _OWN_OPTIONS:
            raise ValueError(f"{OPTIONS_ENV}: ortlearn sets {key} itself (the device's index, "
                             f"64-bit integers, and {GRAPH_CAPTURE_ENV} for graph capture).")
        options[key] = value
    return options


def default_graph_capture() -> bool:
    """Whether a step on WebGPU is recorded once and replayed (``ORTLEARN_WEBGPU_GRAPH_CAPTURE``).

    Raises
    ------
    ValueError
        If the variable is set to something other than 0 or 1.
    """
    value = os.environ.get(GRAPH_CAPTURE_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{GRAPH_CAPTURE_ENV} must be 0 or 1, got {value!r}.")
    return value != "0"


def check_float32(dtypes: dict, remedy: str = "Convert the data to float32 "
                  "(X.astype(np.float32)) before fitting.") -> None:
    """Refuse float64 weights or data: the provider computes no float64.

    Parameters
    ----------
    dtypes : dict of str to numpy.dtype
        The dtype of each weight and data input, by name.
    remedy : str
        The end of the message: what to do instead.

    Raises
    ------
    ValueError
        Naming the float64 ones and the remedy.

    Examples
    --------
    >>> import numpy as np
    >>> check_float32({"coef": np.dtype(np.float32)})
    """
    wide = sorted(name for name, dtype in dtypes.items() if dtype == "float64")
    if wide:
        raise ValueError(
            f"device='webgpu' trains float32 models: the WebGPU provider has no float64 "
            f"kernels, and {wide} are float64 (the step would run on the CPU). {remedy}")
