"""Optimizer update graphs (standard ONNX) and learning-rate schedules.

- :class:`Optimizer`: the base of the update rules (subclass it for a new
  one); :class:`SGD`, :class:`Adam`, :class:`AdamW`: update rules that append
  their nodes to a :class:`~ortlearn.graph.GraphBuilder`;
  :func:`build_optimizer_model` writes them as ``optimizer_model.onnx``;
  :func:`clip_grad_norm` clips gradients by their global norm.
- :class:`Constant`, :class:`InvScaling`, :class:`Optimal`,
  :class:`Adaptive`, :class:`LinearLR`: learning-rate schedules.
"""

from .optimizers import SGD, Adam, AdamW, Optimizer, build_optimizer_model, clip_grad_norm
from .schedules import Adaptive, Constant, InvScaling, LinearLR, Optimal

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "Adaptive",
    "Constant",
    "InvScaling",
    "LinearLR",
    "Optimal",
    "Optimizer",
    "build_optimizer_model",
    "clip_grad_norm",
]
