"""onnxcustom's weight penalties for ``OrtGradientForwardBackwardOptimizer``.

:class:`ElasticLearningPenalty` adds ``l1 * sum|W| + l2 * sum(W**2)`` of every
trained weight to the loss of a batch (:meth:`~BaseLearningPenalty.penalty_loss`)
and, before each gradient step, shrinks every weight with
``W <- (1 - 2 * l2) * W - l1 * sign(W)`` (:meth:`~BaseLearningPenalty.update_weights`);
as in onnxcustom, that shrinkage does not depend on the learning rate.
"""

from __future__ import annotations

import numpy as np

from ....graph import onnx_to_np_dtype
from ._base_onnx_function import BaseLearningOnnx
from ._functions import OrtFunction, as_device, as_ort_value, function_model

__all__ = ["BaseLearningPenalty", "ElasticLearningPenalty", "NoLearningPenalty"]


class BaseLearningPenalty(BaseLearningOnnx):
    """A penalty on the weights: its share of the loss and its update of the weights."""

    @staticmethod
    def select(class_name, **kwargs):
        """A penalty from an instance or a name.

        Parameters
        ----------
        class_name : BaseLearningPenalty, str or None
            An instance (returned as is), None or ``''``
            (:class:`NoLearningPenalty`), ``'elastic'`` or ``'l1l2'``
            (:class:`ElasticLearningPenalty`), or a class name.

        Examples
        --------
        >>> BaseLearningPenalty.select(None)
        NoLearningPenalty()
        >>> BaseLearningPenalty.select('l1l2', l2=0.1)
        ElasticLearningPenalty(l1=0.5, l2=0.1)
        """
        if isinstance(class_name, BaseLearningPenalty):
            return class_name
        aliases = {NoLearningPenalty: [None, ""], ElasticLearningPenalty: ["elastic", "l1l2"]}
        for cls, names in aliases.items():
            if class_name == cls.__name__ or class_name in names:
                return cls(**kwargs)
        raise ValueError(f"Unexpected penalty {class_name!r}: expected an instance of "
                         "BaseLearningPenalty, None, 'elastic', 'l1l2' or a class name.")

    def penalty_loss(self, device, loss, *weights):
        """Return ``loss`` plus the penalty of ``weights``."""
        raise NotImplementedError("penalty_loss must be overwritten.")

    def update_weights(self, n_bind, device, statei):
        """Return the weight ``statei`` after the penalty's update."""
        raise NotImplementedError("update_weights must be overwritten.")


class NoLearningPenalty(BaseLearningPenalty):
    """No penalty: the loss and the weights are returned unchanged."""

    def __init__(self):
        pass

    def build_onnx_function(self, opset, device, n_tensors=1):
        """Nothing to build."""

    def penalty_loss(self, device, loss, *weights):
        """Return ``loss``."""
        return loss

    def update_weights(self, n_bind, device, statei):
        """Return ``statei``."""
        return statei


class ElasticLearningPenalty(BaseLearningPenalty):
    """L1 and L2 penalties on the weights (formulas in the module's docstring).

    Parameters
    ----------
    l1 : float, default=0.5
    l2 : float, default=0.5

    Examples
    --------
    >>> import numpy as np
    >>> pen = ElasticLearningPenalty(l1=0.1, l2=0.25)
    >>> w = np.array([2.0, -1.0], dtype=np.float32)
    >>> pen.penalty_loss("cpu", np.array([1.0], np.float32), w).numpy()   # 1 + 0.3 + 1.25
    array([2.55], dtype=float32)
    >>> pen.update_weights(0, "cpu", w).numpy()                          # 0.5 * w - 0.1 sign(w)
    array([ 0.9, -0.4], dtype=float32)
    """

    def __init__(self, l1=0.5, l2=0.5):
        self.l1 = l1
        self.l2 = l2

    def build_onnx_function(self, opset, device, n_tensors=1, dtype=np.float32):
        """Build the penalty of ``n_tensors`` weights and the weight update on ``device``."""
        self.device_ = as_device(device)
        self.dtype_ = np.dtype(dtype)
        self.n_tensors_ = n_tensors
        self.penalty_onnx_ = self._penalty_model(n_tensors, self.dtype_)
        self.penalty_sess_ = OrtFunction(self.penalty_onnx_, self.device_)
        self.penalty_grad_onnx_ = self._update_model(self.dtype_)
        self.penalty_grad_sess_ = OrtFunction(self.penalty_grad_onnx_, self.device_)

    def _ready(self, device, dtype, n_tensors):
        if (getattr(self, "dtype_", None) != dtype or getattr(self, "device_", None) != device
                or (n_tensors is not None and self.n_tensors_ != n_tensors)):
            self.build_onnx_function(None, device, n_tensors or 1, dtype)

    def _penalty_model(self, n_tensors, dtype):
        def build(b):
            l1, l2 = "l1", "l2"
            total = "loss"
            for i in range(n_tensors):
                w = f"W{i}"
                term = b.op("Add", [
                    b.op("Mul", [b.reduce("ReduceSum", b.op("Abs", [w]), keepdims=0), l1]),
                    b.op("Mul", [b.reduce("ReduceSumSquare", w, keepdims=0), l2])])
                total = b.op("Add", [total, term])
            b.op("Reshape", [total, b.ints([-1])], outputs=["Y"])

        inputs = [("loss", dtype, None)] + [(f"W{i}", dtype, None) for i in range(n_tensors)]
        return function_model(build, inputs, [("Y", dtype, None)],
                              scalars={"l1": (self.l1, dtype), "l2": (self.l2, dtype)})

    def _update_model(self, dtype):
        def build(b):
            shrink = b.op("Mul", ["X", "shrink"])
            sign = b.op("Mul", [b.op("Sign", ["X"]), "l1"])
            b.op("Sub", [shrink, sign], outputs=["Y"])

        # the hyper-parameters as initializers, as onnxcustom's saved graphs hold them
        return function_model(build, [("X", dtype, None)], [("Y", dtype, None)],
                              scalars={"shrink": (1 - 2 * self.l2, dtype),
                                       "l1": (self.l1, dtype)})

    def penalty_loss(self, device, loss, *weights):
        """Return ``loss + sum_i (l1 * sum|W_i| + l2 * sum(W_i**2))`` (shape ``[1]``)."""
        device = as_device(device)
        loss = as_ort_value(loss, device)
        self._ready(device, onnx_to_np_dtype(loss.element_type()), len(weights))
        return self.penalty_sess_(loss, *weights)[0]

    def update_weights(self, n_bind, device, statei):
        """Return ``(1 - 2 * l2) * statei - l1 * sign(statei)``."""
        device = as_device(device)
        statei = as_ort_value(statei, device)
        self._ready(device, onnx_to_np_dtype(statei.element_type()), None)
        return self.penalty_grad_sess_(statei)[0]
