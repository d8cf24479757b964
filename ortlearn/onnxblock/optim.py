"""Optimizer blocks: write the optimizer model of ``doc/artifacts_format.md``.

Called inside ``with onnxblock.empty_base():`` on the parameters of a
:class:`~ortlearn.onnxblock.TrainingBlock` (``block.parameters()``), an
optimizer block replaces the empty model with the optimizer model of
:func:`ortlearn.optim.build_optimizer_model`: onnxruntime-training's inputs
(``learning_rate``, ``step``, the sequences ``params``, ``gradients``,
``first_order_moments`` ...) and first output (the updated flag), its update
rule, in standard ONNX operators (onnxruntime-training used the com.microsoft
kernels ``AdamWOptimizer``/``SGDOptimizerV2``, which update the sequences in
place; here the updated sequences are outputs too). As there, calling the
block returns the name of the flag.

Examples
--------
>>> from onnx import TensorProto, helper
>>> from ortlearn import onnxblock
>>> w = helper.make_tensor("W", TensorProto.FLOAT, [2], [1.0, 2.0])
>>> with onnxblock.empty_base() as accessor:
...     flag = onnxblock.optim.AdamW()(([w], []))
>>> flag
'updated_flag'
>>> [o.name for o in accessor.model.graph.output]
['updated_flag', 'params.updated', 'first_order_moments.updated', \
'second_order_moments.updated']
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from .. import optim as _optim
from ..graph import DEFAULT_OPSET, opset_of
from ..graph.format import UPDATED_FLAG
from . import _graph_utils
from .blocks import Block

__all__ = ["SGD", "Adam", "AdamW", "ClipGradNorm", "TorchAdamW"]

#: Added to the global norm before dividing (onnxruntime-training's ClipGradNorm).
_CLIP_EPS = 1e-6


def _sequence_elem_type(model: onnx.ModelProto, name: str) -> int | None:
    """Element type of ``name`` if the model declares it a tensor sequence, else None."""
    g = model.graph
    for info in [*g.input, *g.value_info, *g.output]:
        if info.name == name and info.type.HasField("sequence_type"):
            return info.type.sequence_type.elem_type.tensor_type.elem_type
    return None


class ClipGradNorm(Block):
    """Scale gradients together so that their global L2 norm is at most ``max_norm``.

    ``coef = min(max_norm / (norm + 1e-6), 1)``, ``g *= coef``, the rule of
    onnxruntime-training's ``ClipGradNorm`` and of
    ``torch.nn.utils.clip_grad_norm_`` (see :func:`ortlearn.optim.clip_grad_norm`).
    Pass it as ``clip_grad`` to an optimizer block, or call it:

    - on the name of a **tensor sequence** (onnxruntime-training's form,
      e.g. the optimizer model's ``gradients`` input): returns the name of
      the clipped sequence;
    - on the names of gradient tensors (ortlearn's addition): returns the
      names of the clipped tensors.

    Parameters
    ----------
    max_norm : float
        Largest global norm allowed, > 0.
    """

    def __init__(self, max_norm: float):
        if not max_norm > 0:
            raise ValueError(f"max_norm must be > 0, got {max_norm!r}.")
        self.max_norm = float(max_norm)

    def build(self, *gradient_names: str):
        model = self.base
        if len(gradient_names) == 1:
            elem = _sequence_elem_type(model, gradient_names[0])
            if elem is not None:
                return self._clip_sequence(model, gradient_names[0], elem)
        b = _graph_utils.builder(model)
        types = [_graph_utils.float_type_of(model, g) for g in gradient_names]
        clipped = _optim.clip_grad_norm(b, list(gradient_names), self.max_norm, elem_types=types)
        b.add_to_graph(model.graph)
        return clipped

    def _clip_sequence(self, model: onnx.ModelProto, sequence: str, elem: int) -> str:
        """The clipped sequence, with SequenceMap (its length is known at run time only)."""
        b = _graph_utils.builder(model)
        # one float64 sum of squares per tensor, then the global norm in float64
        squares = helper.make_graph(
            [helper.make_node("ReduceSumSquare", ["g"], ["s"], keepdims=0),
             helper.make_node("Cast", ["s"], ["s64"], to=TensorProto.DOUBLE)],
            "sum_of_squares", [helper.make_tensor_value_info("g", elem, None)],
            [helper.make_tensor_value_info("s64", TensorProto.DOUBLE, [])])
        per_tensor = b.op("SequenceMap", [sequence], body=squares)
        stacked = b.op("ConcatFromSequence", [per_tensor], axis=0, new_axis=1)
        total = b.op("Sqrt", [b.reduce("ReduceSum", stacked, keepdims=0)])
        denom = b.op("Add", [total, b.const(_CLIP_EPS, dtype=np.float64)])
        coef = b.op("Min", [b.op("Div", [b.const(self.max_norm, dtype=np.float64), denom]),
                            b.const(1.0, dtype=np.float64)])
        coef = b.cast(coef, elem)
        scale = helper.make_graph(
            [helper.make_node("Mul", ["g", "c"], ["y"])], "scale",
            [helper.make_tensor_value_info("g", elem, None),
             helper.make_tensor_value_info("c", elem, [])],
            [helper.make_tensor_value_info("y", elem, None)])
        clipped = b.op("SequenceMap", [sequence, coef], body=scale)
        b.add_to_graph(model.graph)
        model.graph.value_info.append(helper.make_tensor_sequence_value_info(clipped, elem, None))
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

    def build(self, parameters) -> str:
        """Build the optimizer model for ``parameters = (trainable, frozen)`` TensorProtos.

        Returns
        -------
        str
            The name of the first output, the updated flag (``'updated_flag'``),
            as onnxruntime-training's optimizer blocks return.

        Raises
        ------
        ValueError
            If there is no trainable parameter, or the trainable parameters
            do not share one element type (a sequence holds one).
        """
        trainable, _ = parameters
        params = {p.name: (p.data_type, list(p.dims)) for p in trainable}
        # at the opset of the model being built (empty_base's: the base model's)
        model = _optim.build_optimizer_model(self.spec, params,
                                             opset=opset_of(self.base) or DEFAULT_OPSET)
        self.base.CopyFrom(model)
        return UPDATED_FLAG


class AdamW(_OptimizerBlock):
    """AdamW as onnxruntime-training computes it (see :class:`ortlearn.optim.AdamW`).

    Same signature and defaults as ``onnxruntime.training.onnxblock.optim.AdamW``:
    its kernel's HuggingFace mode (bias correction in the learning rate, eps
    added to ``sqrt(v)``, weight decay after the update). For
    ``torch.optim.AdamW``'s form use :class:`TorchAdamW`.

    Parameters
    ----------
    bias_correction : bool, default=True
    betas : tuple of float, default=(0.9, 0.999)
    eps : float, default=1e-6
    weight_decay : float, default=0.0
    clip_grad : ClipGradNorm or float, default=None
        Clip the global gradient norm first.
    """

    def __init__(self, bias_correction: bool = True, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, clip_grad=None):
        self.spec = _optim.AdamW(betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                 bias_correction=bias_correction, clip_grad=_max_norm(clip_grad))


class TorchAdamW(_OptimizerBlock):
    """AdamW with ``torch.optim.AdamW``'s rule and defaults (ortlearn's addition).

    See :class:`ortlearn.optim.TorchAdamW`: decay first, bias corrections on
    the moments, ``eps=1e-8``, ``weight_decay=0.01``.

    Parameters
    ----------
    bias_correction : bool, default=True
    betas : tuple of float, default=(0.9, 0.999)
    eps : float, default=1e-8
    weight_decay : float, default=0.01
    clip_grad : ClipGradNorm or float, default=None
    """

    def __init__(self, bias_correction: bool = True, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, clip_grad=None):
        self.spec = _optim.TorchAdamW(betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      bias_correction=bias_correction,
                                      clip_grad=_max_norm(clip_grad))


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
    """Stochastic gradient descent: ``p -= lr * g`` (onnxruntime-training's ``SGDOptimizerV2``).

    ``clip_grad`` comes first, as in onnxruntime-training's ``SGD(clip_grad=None)``.
    Momentum and weight decay are ortlearn's additions (see
    :class:`ortlearn.optim.SGD` for their rule); their defaults give plain SGD.

    Parameters
    ----------
    clip_grad : ClipGradNorm or float, default=None
    momentum : float, default=0.0
    nesterov : bool, default=False
    weight_decay : float, default=0.0
    """

    def __init__(self, clip_grad=None, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0):
        self.spec = _optim.SGD(momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                               clip_grad=_max_norm(clip_grad))
