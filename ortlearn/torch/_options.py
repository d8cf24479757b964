"""What a user sets on an :class:`~ortlearn.torch.ORTModule`: logging, saved graphs, strictness."""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass

__all__ = ["DebugOptions", "LogLevel", "ORTModuleTorchModelException", "STRICT_ENV"]

#: Set to ``1`` to make every :class:`ORTModule` strict (no fallback to torch).
#: onnxruntime-training's ``ORTMODULE_FALLBACK_POLICY=FALLBACK_DISABLE`` is read too.
STRICT_ENV = "ORTLEARN_ORTMODULE_STRICT"
_ORT_FALLBACK_ENV = "ORTMODULE_FALLBACK_POLICY"
#: Folder where ``save_onnx`` writes (default: the working directory), as onnxruntime-training.
SAVE_PATH_ENV = "ORTMODULE_SAVE_ONNX_PATH"


class ORTModuleTorchModelException(Exception):
    """The torch module cannot be used as asked (for example ``add_module`` on an
    :class:`ORTModule`, or a strict module that cannot run in ONNX Runtime)."""


class LogLevel(enum.IntEnum):
    """Verbosity of an :class:`ORTModule`: its logger (``ortlearn.torch``) and its
    onnxruntime sessions' ``log_severity_level`` (same numbers)."""

    VERBOSE = 0
    INFO = 1
    WARNING = 2
    ERROR = 3
    FATAL = 4

    @property
    def logging_level(self) -> int:
        return (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
                logging.CRITICAL)[self]


@dataclass(frozen=True)
class DebugOptions:
    """Debug options of an :class:`ORTModule` (onnxruntime-training's signature).

    Parameters
    ----------
    log_level : LogLevel, default=LogLevel.WARNING
    save_onnx : bool, default=False
        Write the graphs of each mode into ``$ORTMODULE_SAVE_ONNX_PATH`` or
        the working directory, under onnxruntime-training's names
        (``<onnx_prefix>_torch_exported_<mode>.onnx``,
        ``<onnx_prefix>_pre_grad_optimized_<mode>.onnx``,
        ``<onnx_prefix>_optimized_<mode>.onnx``: in training, the gradient
        graph) and the forward and backward graphs ortlearn runs
        (``<onnx_prefix>_forward_<mode>.onnx``,
        ``<onnx_prefix>_backward_<mode>.onnx``).
    onnx_prefix : str, default=''
        Required when ``save_onnx`` is set: the start of the files' names, in
        that folder (a path, ``..`` or a separator raises a ``ValueError``:
        ``ORTMODULE_SAVE_ONNX_PATH`` chooses the folder).
    strict : bool, default=False
        Raise :class:`ORTModuleTorchModelException` where the module would
        fall back to torch (an ortlearn addition; also set by
        ``ORTLEARN_ORTMODULE_STRICT=1`` or
        ``ORTMODULE_FALLBACK_POLICY=FALLBACK_DISABLE``).
    """

    log_level: LogLevel = LogLevel.WARNING
    save_onnx: bool = False
    onnx_prefix: str = ""
    strict: bool = False

    def __post_init__(self):
        if not isinstance(self.log_level, LogLevel):
            raise TypeError(f"log_level must be a LogLevel, got {self.log_level!r}.")
        if not isinstance(self.onnx_prefix, str):
            raise TypeError(f"onnx_prefix must be a string, got {self.onnx_prefix!r}.")
        if self.save_onnx and not self.onnx_prefix:
            raise ValueError("save_onnx=True needs an onnx_prefix: the files are named "
                             "<onnx_prefix>_forward_<mode>.onnx and so on.")
        separators = {os.sep, os.altsep, "/"} - {None}
        if any(s in self.onnx_prefix for s in separators) or self.onnx_prefix in (".", ".."):
            raise ValueError(
                f"onnx_prefix={self.onnx_prefix!r} is a path: it names files inside the save "
                f"folder; set {SAVE_PATH_ENV} to choose the folder.")

    @property
    def fallback_disabled(self) -> bool:
        """Whether falling back to torch raises instead (the option or the environment)."""
        return (self.strict or os.environ.get(STRICT_ENV, "") not in ("", "0")
                or "FALLBACK_DISABLE" in os.environ.get(_ORT_FALLBACK_ENV, ""))

    @property
    def save_path(self) -> str:
        return os.environ.get(SAVE_PATH_ENV) or os.getcwd()
