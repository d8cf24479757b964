"""Optimizer blocks: write the optimizer model of ``doc/artifacts_format.md``.

Called inside ``with onnxblock.empty_base():`` on the parameters of a
:class:`~ortlearn.onnxblock.TrainingBlock` (``block.parameters()``), an
optimizer block replaces the empty model with the update graph of
:func:`ortlearn.optim.build_optimizer_model`, in standard ONNX operators
(onnxruntime-training used com.microsoft ``AdamWOptimizer``/``SGDOptimizerV2``).

Examples
--------
>>> from onnx import TensorProto, helper
>>> from ortlearn import onnxblock
>>> w = helper.make_tensor("W", TensorProto.FLOAT, [2], [1.0, 2.0])
>>> with onnxblock.empty_base() as accessor:
...     outputs = onnxblock.optim.AdamW()(([w], []))
>>> outputs
['W.updated', 'W.exp_avg.updated', 'W.exp_avg_sq.updated']
"""

from __future__ import annotations

from .. import optim as _optim
from . import _graph_utils
from .blocks import Block

__all__ = ["SGD", "Adam", "AdamW", "ClipGradNorm"]


class ClipGradNorm(Block):
    """Scale gradients together so that their global L2 norm is at most ``max_norm``.

    ``torch.nn.utils.clip_grad_norm_``'s rule (see
    :func:`ortlearn.optim.clip_grad_norm`). Pass it as ``clip_grad`` to an
    optimizer block, or call it on gradient names.

    Parameters
    ----------
    max_norm : float
        Largest global norm allowed, > 0.
    """

    def __init__(self, max_norm: float):
        if not max_norm > 0:
            raise ValueError(f"max_norm must be > 0, got {max_norm!r}.")
        self.max_norm = float(max_norm)

    def build(self, *gradient_names: str) -> list[str]:
        model = self.base
        b = _graph_utils.builder(model)
        types = [_graph_utils.float_type_of(model, g) for g in gradient_names]
        clipped = _optim.clip_grad_norm(b, list(gradient_names), self.max_norm, elem_types=types)
        b.add_to_graph(model.graph)
        return clipped


def _max_norm(clip_grad) -> float | None:
    if clip_grad is None or isinstance(clip_grad, ClipGradNorm):
        return None if clip_grad is None else clip_grad.max_norm
    if isinstance(clip_grad, (int, float)):
        return float(clip_grad)
    raise TypeError(f"clip_grad must be a ClipGradNorm, a float or None, got {clip_grad!r}.")


class _OptimizerBlock(Block):
    """Replace the (empty) base model with the optimizer model of ``self.spec``."""

    spec = None

    def build(self, parameters) -> list[str]:
        """Build the optimizer model for ``parameters = (trainable, frozen)`` TensorProtos.

        Returns
        -------
        list of str
            The outputs: ``p.updated`` then ``p.<state>.updated`` per parameter.
        """
        trainable, _ = parameters
        params = {p.name: (p.data_type, list(p.dims)) for p in trainable}
        model = _optim.build_optimizer_model(self.spec, params)
        self.base.CopyFrom(model)
        return [o.name for o in model.graph.output]


class AdamW(_OptimizerBlock):
    """AdamW (``torch.optim.AdamW`` semantics, see :class:`ortlearn.optim.AdamW`).

    Parameters
    ----------
    bias_correction : bool, default=True
    betas : tuple of float, default=(0.9, 0.999)
    eps : float, default=1e-8
    weight_decay : float, default=0.01
    clip_grad : ClipGradNorm or float, default=None
        Clip the global gradient norm first.
    """

    def __init__(self, bias_correction: bool = True, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, clip_grad=None):
        self.spec = _optim.AdamW(betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                 bias_correction=bias_correction, clip_grad=_max_norm(clip_grad))


class Adam(_OptimizerBlock):
    """Adam as scikit-learn's MLP does it (ortlearn's addition, see :class:`ortlearn.optim.Adam`).

    Parameters
    ----------
    betas : tuple of float, default=(0.9, 0.999)
    eps : float, default=1e-8
    weight_decay : float, default=0.0
        L2 coefficient added to the gradient.
    clip_grad : ClipGradNorm or float, default=None
    """

    def __init__(self, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 clip_grad=None):
        beta_1, beta_2 = betas
        self.spec = _optim.Adam(beta_1=beta_1, beta_2=beta_2, epsilon=eps,
                                weight_decay=weight_decay, clip_grad=_max_norm(clip_grad))


class SGD(_OptimizerBlock):
    """Stochastic gradient descent, optionally with (Nesterov) momentum.

    See :class:`ortlearn.optim.SGD` for the update rule. onnxruntime-training's
    ``SGD`` only takes ``clip_grad``; momentum and weight decay are ortlearn's
    additions (their defaults give plain SGD).

    Parameters
    ----------
    momentum : float, default=0.0
    nesterov : bool, default=False
    weight_decay : float, default=0.0
    clip_grad : ClipGradNorm or float, default=None
    """

    def __init__(self, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                 clip_grad=None):
        self.spec = _optim.SGD(momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                               clip_grad=_max_norm(clip_grad))
