"""Train a ``torch.nn.Module`` through ONNX Runtime: ``ORTModule`` (the extra ``ortlearn[torch]``).

``from onnxruntime.training import ORTModule`` becomes
``from ortlearn.torch import ORTModule``; see ``doc/ortmodule.rst``.
"""

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "ortlearn.torch needs PyTorch: pip install 'ortlearn[torch]' (torch>=2.6 and "
        "onnxscript for its dynamo exporter).") from exc

from ._export import EXPORTERS, batchnorm_training_mode, quiet_exporters
from ._module import MAX_EXPORTS_PER_SCHEMA, ORTModule
from ._options import DebugOptions, LogLevel, ORTModuleTorchModelException

__all__ = [
    "EXPORTERS",
    "MAX_EXPORTS_PER_SCHEMA",
    "DebugOptions",
    "LogLevel",
    "ORTModule",
    "ORTModuleTorchModelException",
    "batchnorm_training_mode",
    "quiet_exporters",
]
