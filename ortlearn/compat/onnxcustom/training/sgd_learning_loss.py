"""onnxcustom's losses for ``OrtGradientForwardBackwardOptimizer``.

A loss object computes, on the training device, the loss of a batch and its
gradient with respect to the model's output (onnxcustom's reductions: sums
over the batch, not means):

- :class:`SquareLearningLoss`: ``0.5 * sum(w * (p - y)**2)``, gradient ``w * (p - y)``;
- :class:`AbsoluteLearningLoss`: ``sum(w * |p - y|)``, gradient ``w * sign(p - y)``;
- :class:`ElasticLearningLoss`: ``sum(w * (l1 |p - y| + l2 (p - y)**2))``, gradient
  ``w * (l1 sign(p - y) + 2 l2 (p - y))``;
- :class:`NegLogLearningLoss`: ``-sum(w * (y log q + (1 - y) log(1 - q)))``, gradient
  ``w * (q - y)``.

``y`` is the expected value, ``p`` the prediction, ``w`` the sample weight
(1 without), ``q = clip(sigmoid(p), eps, 1 - eps)`` with ``p`` the raw score
of a binary classifier and ``y`` its int64 label. The loss is a tensor of
shape ``[1]``. :meth:`~BaseLearningLoss.loss_scores` gives each row's term
before the sum (without the 0.5 of the square loss, as onnxcustom).

onnxcustom's absolute and elastic gradients had the sign of the L1 term
reversed (``sign(y - p)``); here it is the gradient of the loss.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ....graph import onnx_to_np_dtype
from ._base_onnx_function import BaseLearningOnnx
from ._functions import OrtFunction, as_device, as_ort_value, function_model

__all__ = [
    "AbsoluteLearningLoss",
    "BaseLearningLoss",
    "ElasticLearningLoss",
    "NegLogLearningLoss",
    "SquareLearningLoss",
]


class BaseLearningLoss(BaseLearningOnnx):
    """A loss and its gradient w.r.t. the output, computed by one ONNX function.

    Subclasses define :meth:`_terms`: the per-row loss terms and the gradient
    as ONNX nodes; this class adds the sample weights and the reduction.
    """

    #: Whether the expected values are int64 labels (the prediction stays float).
    integer_labels = False
    #: Factor of the summed terms in the loss.
    loss_scale = 1.0

    def build_onnx_function(self, opset, device, weight_name=None, dtype=np.float32):
        """Build the loss-and-gradient and the per-row score functions on ``device``.

        ``weight_name`` (onnxcustom's) only says the training has weights;
        both variants are built as they are needed.
        """
        self.device_ = as_device(device)
        self.dtype_ = np.dtype(dtype)
        self.weight_name = weight_name
        self.functions_ = {}
        self.loss_grad_onnx_ = self._model(self.dtype_, weighted=weight_name is not None,
                                           scores=False)

    def _function(self, device, dtype, weighted, scores):
        if getattr(self, "dtype_", None) != dtype or getattr(self, "device_", None) != device:
            self.build_onnx_function(None, device, getattr(self, "weight_name", None), dtype)
        key = (weighted, scores)
        if key not in self.functions_:
            self.functions_[key] = OrtFunction(self._model(dtype, weighted, scores), device)
        return self.functions_[key]

    def _model(self, dtype, weighted, scores):
        label_type = np.int64 if self.integer_labels else dtype

        def build(b):
            terms, grad = self._terms(b, "X1", "X2", dtype)
            if weighted:
                w = b.op("Reshape", ["weight", b.ints([-1, 1])])
                terms = b.op("Mul", [terms, w])
                grad = b.op("Mul", [grad, w])
            if scores:
                b.op("Identity", [terms], outputs=["Y"])
                return
            total = b.reduce("ReduceSum", terms, keepdims=0)
            if self.loss_scale != 1:
                total = b.op("Mul", [total, b.const(np.array(self.loss_scale, dtype=dtype))])
            b.op("Reshape", [total, b.ints([-1])], outputs=["Y"])
            b.op("Identity", [grad], outputs=["Y_grad"])

        inputs = [("X1", label_type, None), ("X2", dtype, None)]
        if weighted:
            inputs.append(("weight", dtype, None))
        outputs = [("Y", dtype, None)] if scores else [("Y", dtype, None), ("Y_grad", dtype, None)]
        return function_model(build, inputs, outputs)

    def _terms(self, b, expected, predicted, dtype):
        raise NotImplementedError("This method must be overwritten.")

    def _run(self, device, expected, predicted, weight, scores):
        device = as_device(device)
        predicted = as_ort_value(predicted, device)
        dtype = onnx_to_np_dtype(predicted.element_type())
        f = self._function(device, dtype, weight is not None, scores)
        args = [expected, predicted] + ([] if weight is None else [weight])
        return f(*args)

    def loss_gradient(self, device, expected, predicted, weight=None):
        """Return the loss of a batch (shape ``[1]``) and its gradient w.r.t. ``predicted``.

        Parameters
        ----------
        device : str or OrtDevice
        expected, predicted : numpy.ndarray or OrtValue
            Same shape (``[N, k]``); int64 labels for :class:`NegLogLearningLoss`.
        weight : numpy.ndarray or OrtValue, optional
            One weight per row.

        Returns
        -------
        loss, gradient : OrtValue
        """
        loss, grad = self._run(device, expected, predicted, weight, scores=False)
        return loss, grad

    def loss_scores(self, device, expected, predicted, weight=None):
        """Return the loss term of each row (weighted), as an OrtValue."""
        return self._run(device, expected, predicted, weight, scores=True)[0]

    @staticmethod
    def select(class_name, **kwargs):
        """A loss from an instance or a name.

        Parameters
        ----------
        class_name : BaseLearningLoss or str
            An instance (returned as is), a class name, or ``'square_error'``
            (``'square'``), ``'absolute_error'`` (``'absolute'``),
            ``'elastic_error'`` (``'elastic'``), ``'log'`` (``'neglog'``,
            ``'logloss'``).
        **kwargs
            Parameters of the class a name selects.

        Examples
        --------
        >>> BaseLearningLoss.select('elastic', l1_weight=0.1)
        ElasticLearningLoss(l1_weight=0.1, l2_weight=0.5)
        """
        if isinstance(class_name, BaseLearningLoss):
            return class_name
        aliases = {SquareLearningLoss: ["square_error", "square"],
                   AbsoluteLearningLoss: ["absolute_error", "absolute"],
                   ElasticLearningLoss: ["elastic_error", "elastic"],
                   NegLogLearningLoss: ["log", "neglog", "logloss"]}
        for cls, names in aliases.items():
            if class_name == cls.__name__ or class_name in names:
                return cls(**kwargs)
        raise ValueError(
            f"Unexpected loss {class_name!r}: expected an instance of BaseLearningLoss or one of "
            f"{[n for names in aliases.values() for n in names]} or a class name.")


class SquareLearningLoss(BaseLearningLoss):
    """``0.5 * sum((p - y)**2)``, gradient ``p - y``.

    Examples
    --------
    >>> import numpy as np
    >>> y, p = np.array([[1.0], [2.0]], np.float32), np.array([[2.0], [4.0]], np.float32)
    >>> loss, grad = SquareLearningLoss().loss_gradient("cpu", y, p)
    >>> loss.numpy(), grad.numpy().ravel()
    (array([2.5], dtype=float32), array([1., 2.], dtype=float32))
    """

    def __init__(self):
        pass

    #: onnxcustom scales the sum of the squares by 0.5 (the scores are not).
    loss_scale = 0.5

    def _terms(self, b, expected, predicted, dtype):
        diff = b.op("Sub", [predicted, expected])
        return b.op("Mul", [diff, diff]), diff


class AbsoluteLearningLoss(BaseLearningLoss):
    """``sum(|p - y|)``, gradient ``sign(p - y)``."""

    def __init__(self):
        pass

    def _terms(self, b, expected, predicted, dtype):
        diff = b.op("Sub", [predicted, expected])
        return b.op("Abs", [diff]), b.op("Sign", [diff])


class ElasticLearningLoss(BaseLearningLoss):
    """``sum(l1_weight |p - y| + l2_weight (p - y)**2)`` and its gradient.

    Parameters
    ----------
    l1_weight : float, default=0.5
    l2_weight : float, default=0.5
    """

    def __init__(self, l1_weight=0.5, l2_weight=0.5):
        self.l1_weight = l1_weight
        self.l2_weight = l2_weight

    def _terms(self, b, expected, predicted, dtype):
        diff = b.op("Sub", [predicted, expected])
        l1 = b.const(np.array([self.l1_weight], dtype=dtype))
        l2 = b.const(np.array([self.l2_weight], dtype=dtype))
        l2x2 = b.const(np.array([2 * self.l2_weight], dtype=dtype))
        terms = b.op("Add", [b.op("Mul", [b.op("Abs", [diff]), l1]),
                             b.op("Mul", [b.op("Mul", [diff, diff]), l2])])
        grad = b.op("Add", [b.op("Mul", [b.op("Sign", [diff]), l1]), b.op("Mul", [diff, l2x2])])
        return terms, grad


class NegLogLearningLoss(BaseLearningLoss):
    """The log loss of a binary classifier from its raw score, gradient ``q - y``.

    The model's output is the raw score ``s`` (before the sigmoid), the
    expected value the int64 label (0 or 1); ``q = clip(sigmoid(s), eps,
    1 - eps)``. The gradient is taken w.r.t. the raw score (the clipping is
    ignored there, as in onnxcustom and scikit-learn).

    Parameters
    ----------
    eps : float, default=1e-5
        Clipping of the probabilities (avoids ``log(0)``).
    probability_function : {'sigmoid'}, default='sigmoid'
    """

    integer_labels = True

    def __init__(self, eps=1e-5, probability_function="sigmoid"):
        if probability_function != "sigmoid":
            raise ValueError(f"Unexpected probability_function={probability_function!r}: "
                             "only 'sigmoid' is implemented (as in onnxcustom).")
        self.eps = eps
        self.probability_function = probability_function

    def _terms(self, b, expected, predicted, dtype):
        one = b.const(np.array([1], dtype=dtype))
        q = b.op("Clip", [b.op("Sigmoid", [predicted]), b.const(np.array(self.eps, dtype=dtype)),
                          b.const(np.array(1 - self.eps, dtype=dtype))])
        y1 = b.cast(expected, int(TensorProto.FLOAT if dtype == np.float32
                                  else TensorProto.DOUBLE))
        y0 = b.op("Sub", [one, y1])
        loglik = b.op("Add", [b.op("Mul", [y0, b.op("Log", [b.op("Sub", [one, q])])]),
                              b.op("Mul", [y1, b.op("Log", [q])])])
        return b.op("Neg", [loglik]), b.op("Sub", [q, y1])
