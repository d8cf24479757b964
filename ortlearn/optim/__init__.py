"""Optimizer update graphs (standard ONNX) and learning-rate schedules.

- :class:`Optimizer`: the base of the update rules (subclass it for a new
  one); :class:`SGD`, :class:`Adam`, :class:`AdamW` (onnxruntime-training's
  kernel), :class:`TorchAdamW` (``torch.optim.AdamW``), :class:`PlainSGD`
  (scikit-learn's SGD estimators: ASGD, truncated L1): update rules that append
  their nodes to a :class:`~ortlearn.graph.GraphBuilder`;
  :func:`build_optimizer_model` writes them as ``optimizer_model.onnx``
  (onnxruntime-training's sequence layout), :func:`unpack_optimizer_model`
  gives the tensor layout the training session runs;
  :func:`clip_grad_norm` clips gradients by their global norm.
- :class:`Constant`, :class:`InvScaling`, :class:`Optimal`,
  :class:`Adaptive`, :class:`LinearLR`: learning-rate schedules.
"""

from .base import Optimizer, clip_grad_norm
from .model_file import build_optimizer_model, split_step_scalars, unpack_optimizer_model
from .rules import SGD, Adam, AdamW, PlainSGD, TorchAdamW
from .schedules import Adaptive, Constant, InvScaling, LinearLR, Optimal, per_sample_rates

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
    "PlainSGD",
    "TorchAdamW",
    "build_optimizer_model",
    "clip_grad_norm",
    "per_sample_rates",
    "split_step_scalars",
    "unpack_optimizer_model",
]
