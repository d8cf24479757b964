"""Devices: parse ``'cpu'`` / ``'cuda'`` / ``'cuda:N'``, pick providers, open sessions."""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx
import onnxruntime as ort

_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


@dataclass(frozen=True)
class Device:
    """A parsed device string.

    Attributes
    ----------
    kind : {'cpu', 'cuda'}
    index : int
        CUDA device id (0 for the CPU).
    """

    kind: str
    index: int = 0

    @property
    def ort_device_type(self) -> str:
        """Name OrtValue and IOBinding use for this device."""
        return self.kind

    def providers(self) -> list:
        """Execution providers (with options) for an ``InferenceSession``."""
        if self.kind == "cpu":
            return ["CPUExecutionProvider"]
        return [("CUDAExecutionProvider", {"device_id": self.index}), "CPUExecutionProvider"]

    def __str__(self) -> str:
        return self.kind if self.kind == "cpu" else f"cuda:{self.index}"


def parse_device(device) -> Device:
    """Validate a device string and check that onnxruntime can use it.

    Raises
    ------
    ValueError
        For a string that is not ``'cpu'``, ``'cuda'`` or ``'cuda:N'``, or when
        CUDA is asked for and onnxruntime has no CUDA execution provider.
    """
    if isinstance(device, Device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cpu' or 'cuda:0', got {device!r}.")
    match = _DEVICE_RE.match(device.strip().lower())
    if match is None:
        raise ValueError(f"Unknown device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'.")
    kind, index = match.group(1), int(match.group(2) or 0)
    if kind == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ValueError(
            f"device={device!r} needs onnxruntime's CUDAExecutionProvider, which this "
            "onnxruntime does not have. Install the GPU build: "
            "pip uninstall onnxruntime && pip install 'ortlearn[gpu]' (onnxruntime-gpu)."
        )
    return Device(kind, index)


def cuda_available() -> bool:
    """Whether onnxruntime offers the CUDA execution provider."""
    return "CUDAExecutionProvider" in ort.get_available_providers()


def make_session_options(intra_op_num_threads: int | None = None) -> ort.SessionOptions:
    """Session options ortlearn uses by default: all graph optimisations, quiet logs."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if intra_op_num_threads:
        so.intra_op_num_threads = intra_op_num_threads
    return so


def make_session(model, device="cpu", session_options: ort.SessionOptions | None = None
                 ) -> ort.InferenceSession:
    """Open an ``InferenceSession`` on ``device`` for a ModelProto, bytes or a path."""
    device = parse_device(device)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif hasattr(model, "__fspath__"):
        model = str(model)
    return ort.InferenceSession(
        model, sess_options=session_options or make_session_options(), providers=device.providers()
    )
