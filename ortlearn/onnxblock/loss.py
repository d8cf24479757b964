"""Loss blocks with PyTorch's semantics, in standard ONNX operators.

The signatures are onnxruntime-training's: ``loss(output_name,
target_name='target')``, and ``CrossEntropyLoss()(scores_input_name,
labels_name='labels')``. The target (labels) becomes a new graph input
shaped like the output, unless the model already has a value of that name
(a graph input, or the output of a block such as ``LabelEncoder``), which is
used as it is. The block returns the name of the loss. ``reduction`` is
``'mean'`` (over every element, the default), ``'sum'`` or ``'none'``
(elementwise), as in ``torch.nn``.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..graph import mark_class_labels, onnx_to_np_dtype
from ..loss import SCORES, elementwise_loss
from . import _graph_utils
from .blocks import Block

__all__ = ["BCEWithLogitsLoss", "CrossEntropyLoss", "L1Loss", "MSELoss"]

_REDUCTIONS = ("mean", "sum", "none")


class ReductionError(ValueError, RuntimeError):
    """An unknown ``reduction``: a ValueError, and the RuntimeError onnxruntime-training raises."""


def _check_reduction(reduction: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ReductionError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}.")
    return reduction


def _reduce(b, values: str, reduction: str) -> str:
    if reduction == "none":
        return values
    op = "ReduceMean" if reduction == "mean" else "ReduceSum"
    return b.reduce(op, values, keepdims=0)


def _target_like(model, input_name: str, target_name: str, elem_type=None, drop_axis=None) -> str:
    """Declare ``target_name`` as a graph input shaped like ``input_name``.

    A value of the model already named ``target_name`` is used as it is.
    """
    if _graph_utils.value_exists(model, target_name):
        return target_name
    info = _graph_utils.find_value_info(model, input_name)
    dims = None if info is None else _graph_utils.shape_of(info)
    if dims is not None and drop_axis is not None:
        dims = dims[:drop_axis] + dims[drop_axis + 1:]
    if elem_type is None:
        elem_type = _graph_utils.float_type_of(model, input_name)
    return _graph_utils.add_graph_input(model, target_name, elem_type, dims)


class _Loss(Block):
    def __init__(self, reduction: str = "mean"):
        self._reduction = _check_reduction(reduction)


class _ElementwiseLoss(_Loss):
    """A score of ``output - target`` (``_score``, a key of :data:`ortlearn.loss.SCORES`),
    reduced."""

    _score = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls._score not in SCORES:
            raise ValueError(f"{cls.__name__}._score={cls._score!r} is not a key of "
                             f"ortlearn.loss.SCORES ({', '.join(SCORES)}).")

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        model = self.base
        elem = _graph_utils.float_type_of(model, loss_input_name)
        target = _target_like(model, loss_input_name, target_name, elem)
        b = _graph_utils.builder(model)
        errors = elementwise_loss(b, self._score, loss_input_name, target,
                                  onnx_to_np_dtype(elem))
        out = _reduce(b, errors, self._reduction)
        b.add_to_graph(model.graph)
        return out


class MSELoss(_ElementwiseLoss):
    """Mean squared error ``(output - target) ** 2``, reduced like ``torch.nn.MSELoss``.

    Parameters
    ----------
    reduction : {'mean', 'sum', 'none'}, default='mean'

    Examples
    --------
    >>> from ortlearn import onnxblock
    >>> loss = onnxblock.loss.MSELoss()
    >>> # inside `with onnxblock.base(model):` -> loss("output", target_name="target")
    """

    _score = "squared_error"


class L1Loss(_ElementwiseLoss):
    """Mean absolute error ``|output - target|``, reduced like ``torch.nn.L1Loss``.

    Parameters
    ----------
    reduction : {'mean', 'sum', 'none'}, default='mean'
    """

    _score = "absolute_error"


class CrossEntropyLoss(_Loss):
    """Softmax cross entropy of logits against class indices, like ``torch.nn.CrossEntropyLoss``.

    The input holds logits of shape ``(N, C)`` or ``(N, C, d1, ...)``; the
    labels (an int64 graph input named ``labels`` by default, as in
    onnxruntime-training) hold class indices of shape ``(N,)`` or ``(N, d1, ...)``.

    Parameters
    ----------
    weight : array-like of shape (C,), default=None
        Weight of each class. With ``reduction='mean'`` the loss is
        ``sum(w[t_i] * l_i) / sum(w[t_i])``, as in torch.
    reduction : {'mean', 'sum', 'none'}, default='mean'
    ignore_index : int, default=None
        Target value that contributes neither to the loss nor to the mean's
        denominator.
    """

    def __init__(self, weight=None, reduction: str = "mean", ignore_index: int | None = None):
        super().__init__(reduction)
        self._weight = None if weight is None else np.asarray(weight, dtype=np.float64).ravel()
        self._ignore_index = ignore_index

    def build(self, scores_input_name: str, labels_name: str = "labels") -> str:
        """Add the loss of the logits ``scores_input_name`` against the int64 ``labels_name``.

        Returns
        -------
        str
            The name of the loss.
        """
        model = self.base
        scores = scores_input_name
        elem = _graph_utils.float_type_of(model, scores)
        dtype = onnx_to_np_dtype(elem)
        dims = _graph_utils.shape(model, scores)
        rank = 2 if dims is None else len(dims)
        target = _target_like(model, scores, labels_name, TensorProto.INT64, drop_axis=1)
        if target in {i.name for i in model.graph.input}:
            # Out-of-range labels would give a zero loss: checked where they enter.
            n_classes = dims[1] if dims is not None and isinstance(dims[1], int) else None
            mark_class_labels(model, target, n_classes, self._ignore_index)
        b = _graph_utils.builder(model)
        logp = b.op("LogSoftmax", [scores], axis=1)
        # one_hot[n, c, ...] = (target[n, ...] == c), built with Equal so that
        # only differentiable ops lie on the path from the logits.
        n_classes = b.op("Gather", [b.op("Shape", [scores]), b.const(np.int64(1))], axis=0)
        classes = b.op("Range", [b.const(np.int64(0)), n_classes, b.const(np.int64(1))])
        trailing = list(range(1, rank - 1))
        if trailing:
            classes = b.unsqueeze(classes, trailing)
        one_hot = b.cast(b.op("Equal", [b.unsqueeze(target, [1]), classes]), elem)
        if self._weight is not None:
            w = self._weight.astype(dtype).reshape([-1] + [1] * (rank - 2))
            one_hot = b.op("Mul", [one_hot, b.const(w, hint="class_weight")])
        if self._ignore_index is not None:
            ignored = b.op("Equal", [target, b.const(np.int64(self._ignore_index))])
            keep = b.cast(b.op("Not", [ignored]), elem)
            one_hot = b.op("Mul", [one_hot, b.unsqueeze(keep, [1])])
        picked = b.reduce("ReduceSum", b.op("Mul", [one_hot, logp]), axes=[1], keepdims=0)
        nll = b.op("Neg", [picked])
        if self._reduction == "mean" and (self._weight is not None
                                          or self._ignore_index is not None):
            sample_weight = b.reduce("ReduceSum", one_hot, axes=[1], keepdims=0)
            out = b.op("Div", [b.reduce("ReduceSum", nll, keepdims=0),
                               b.reduce("ReduceSum", sample_weight, keepdims=0)])
        else:
            out = _reduce(b, nll, self._reduction)
        b.add_to_graph(model.graph)
        return out


class BCEWithLogitsLoss(_Loss):
    """Binary cross entropy on logits, like ``torch.nn.BCEWithLogitsLoss``.

    Computed in the numerically stable form
    ``max(x, 0) - x * y + log(1 + exp(-|x|))``; with ``pos_weight`` ``p``:
    ``(1 - y) * x + (1 + (p - 1) * y) * (log(1 + exp(-|x|)) + max(-x, 0))``.
    Finite for logits of any magnitude.

    Parameters
    ----------
    weight : array-like, default=None
        Weight of each element (broadcast against the input).
    reduction : {'mean', 'sum', 'none'}, default='mean'
    pos_weight : array-like, default=None
        Weight of the positive examples, broadcast along the last axis
        (one value per class).
    """

    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None):
        super().__init__(reduction)
        self._weight = None if weight is None else np.asarray(weight, dtype=np.float64)
        self._pos_weight = None if pos_weight is None else np.asarray(pos_weight, dtype=np.float64)

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        model = self.base
        x = loss_input_name
        elem = _graph_utils.float_type_of(model, x)
        dtype = onnx_to_np_dtype(elem)
        y = _target_like(model, x, target_name)
        b = _graph_utils.builder(model)
        if self._pos_weight is None:
            loss = elementwise_loss(b, "log", x, y, dtype)
        else:
            one = b.const(dtype.type(1))
            # log(1 + exp(-|x|)): Softplus has no float64 kernel on onnxruntime's CPU.
            log_term = b.op("Log", [b.op("Add", [
                one, b.op("Exp", [b.op("Neg", [b.op("Abs", [x])])])])])
            pw_minus_1 = b.const(self._pos_weight.astype(dtype) - 1, hint="pos_weight")
            log_weight = b.op("Add", [one, b.op("Mul", [pw_minus_1, y])])
            softplus_neg = b.op("Add", [log_term, b.op("Relu", [b.op("Neg", [x])])])
            loss = b.op("Add", [b.op("Mul", [b.op("Sub", [one, y]), x]),
                                b.op("Mul", [log_weight, softplus_neg])])
        if self._weight is not None:
            loss = b.op("Mul", [loss, b.const(self._weight.astype(dtype), hint="weight")])
        out = _reduce(b, loss, self._reduction)
        b.add_to_graph(model.graph)
        return out
