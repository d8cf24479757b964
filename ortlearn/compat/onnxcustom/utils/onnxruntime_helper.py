"""onnxcustom's device helpers, on ortlearn's devices (:mod:`ortlearn.training.device`).

They return what onnxcustom returned, onnxruntime's pybind classes
(``onnxruntime.capi._pybind_state.OrtDevice`` and ``OrtValue``, "C_OrtDevice" and
"C_OrtValue" in onnxcustom's documentation), so that code written for onnxcustom
(``isinstance(v, C_OrtValue)``, ``C_OrtValue.ortvalue_from_numpy(x, opt.device)``) runs;
they accept those, the public :class:`onnxruntime.OrtDevice`, an ortlearn
:class:`~ortlearn.training.Device`, or a string (``'cpu'``, ``'cuda'``, ``'cuda:1'``,
``'gpu'``, ``'gpu:1'``). The rest of ortlearn uses the public classes.
"""

from __future__ import annotations

import onnxruntime as ort
from onnxruntime.capi._pybind_state import OrtDevice as C_OrtDevice
from onnxruntime.capi._pybind_state import OrtValue as C_OrtValue

from ....training import device_value, parse_device

__all__ = [
    "device_to_providers",
    "get_ort_device",
    "get_ort_device_from_session",
    "numpy_to_ort_value",
    "ort_device_to_string",
    "provider_to_device",
    "to_c_ort_value",
]


def as_device(device):
    """An ortlearn :class:`~ortlearn.training.Device` from a string, an OrtDevice (public or
    C), a Device or None (the CPU)."""
    if device is None:
        return parse_device("cpu")
    if isinstance(device, ort.OrtDevice) or (
            hasattr(device, "device_type") and hasattr(device, "device_id")):
        # onnxruntime numbers the CPU 0 and CUDA 1, in both OrtDevice classes.
        if device.device_type() == 0:
            return parse_device("cpu")
        if device.device_type() == 1:
            return parse_device(f"cuda:{device.device_id()}")
        raise ValueError(f"Unsupported OrtDevice type {device.device_type()!r}: "
                         "expected the CPU or CUDA.")
    if isinstance(device, str) and device.strip().lower().startswith("gpu"):
        device = "cuda" + device.strip()[3:]
    return parse_device(device)


def provider_to_device(provider_name):
    """``'cpu'`` or ``'cuda'`` for an execution provider's name.

    Examples
    --------
    >>> provider_to_device('CPUExecutionProvider')
    'cpu'
    """
    names = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda"}
    if provider_name not in names:
        raise ValueError(f"Unexpected value for provider_name={provider_name!r}: expected "
                         "'CPUExecutionProvider' or 'CUDAExecutionProvider'.")
    return names[provider_name]


def get_ort_device(device):
    """onnxruntime's C ``OrtDevice`` for a string, an OrtDevice or an ortlearn Device.

    Examples
    --------
    >>> device = get_ort_device('cpu')
    >>> type(device).__name__, ort_device_to_string(device)
    ('OrtDevice', 'cpu')
    """
    if isinstance(device, C_OrtDevice):
        return device
    if isinstance(device, ort.OrtDevice):
        return device._get_c_device()
    parsed = as_device(device)
    return ort.OrtDevice.make(parsed.kind, parsed.index)._get_c_device()


def ort_device_to_string(device):
    """``'cpu'``, ``'cuda'`` or ``'cuda:N'`` (N > 0): the inverse of :func:`get_ort_device`."""
    if isinstance(device, str):
        raise TypeError(f"device must be an OrtDevice, not the string {device!r}.")
    parsed = as_device(device)
    return parsed.kind if parsed.index == 0 else f"{parsed.kind}:{parsed.index}"


def numpy_to_ort_value(arr, device=None):
    """A copy of the numpy array ``arr`` as onnxruntime's C ``OrtValue`` on ``device``.

    Unlike onnxcustom, the value owns its memory on the CPU too: changing
    ``arr`` later does not change it.

    Examples
    --------
    >>> import numpy as np
    >>> numpy_to_ort_value(np.arange(3, dtype=np.float32)).numpy()
    array([0., 1., 2.], dtype=float32)
    """
    return to_c_ort_value(device_value(arr, as_device(device)))


def to_c_ort_value(value):
    """onnxruntime's C ``OrtValue`` of ``value`` (public or C; None stays None), what
    onnxcustom's functions handed out."""
    if value is None or isinstance(value, C_OrtValue):
        return value
    return value._get_c_value()


def device_to_providers(device):
    """The execution providers for ``device``, to give an ``InferenceSession``.

    CUDA comes with its device id and the CPU provider as fallback (onnxcustom
    listed ``'CUDAExecutionProvider'`` alone).

    Examples
    --------
    >>> device_to_providers('cpu')
    ['CPUExecutionProvider']
    """
    return as_device(device).providers()


def get_ort_device_from_session(sess):
    """The :class:`onnxruntime.OrtDevice` an ``InferenceSession`` runs on."""
    providers = sess.get_providers()
    if providers[0] == "CPUExecutionProvider":
        return get_ort_device("cpu")
    if providers[0] == "CUDAExecutionProvider":
        options = sess.get_provider_options().get("CUDAExecutionProvider", {})
        return get_ort_device(f"cuda:{int(options.get('device_id', 0))}")
    raise NotImplementedError(f"Cannot tell the device of a session with providers {providers}.")
