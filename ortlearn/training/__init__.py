"""Training runtime: checkpoints, the training session, devices.

- :class:`CheckpointState`: parameters, optimizer state and properties, saved
  as safetensors.
- :class:`TrainingSession`: runs the training, eval and optimizer models of
  ``ortlearn.artifacts.generate_artifacts`` with the ordinary onnxruntime, the
  weights kept on the device.
- :func:`parse_device`, :func:`cuda_available`: ``'cpu'``, ``'cuda'``, ``'cuda:N'``.
"""

from .checkpoint import CheckpointState
from .device import Device, cuda_available, parse_device
from .session import TrainingSession

__all__ = ["CheckpointState", "Device", "TrainingSession", "cuda_available", "parse_device"]
