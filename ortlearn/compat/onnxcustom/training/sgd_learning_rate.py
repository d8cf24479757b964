"""onnxcustom's learning rates: the schedule of the step size and the weight update.

The schedules and the updates follow onnxcustom 0.4 exactly:

- ``'invscaling'``: after epoch ``t`` (0-based, the value
  :meth:`~LearningRateSGD.update_learning_rate` receives) the rate becomes
  ``eta0 / (t + 1) ** power_t``; :meth:`~BaseLearningRate.loop` passes
  ``t = 1, 2, ...`` so it yields ``eta0, eta0 / 2**power_t, eta0 / 3**power_t, ...``;
- ``'optimal'``: ``eta0 / eta_b * 1 / (alpha * (t0 + t))`` with Léon Bottou's
  ``eta_b = typw / max(1, 2 * (1 + typw))``, ``typw = sqrt(1 / sqrt(alpha))``,
  ``t0 = 1 / (eta_b * alpha)`` (the first value is ``eta0``);
- ``'constant'``: ``eta0``.

:class:`LearningRateSGD` updates a weight with ``W - eta / batch_size * G``
(``G`` is the gradient summed over the batch). :class:`LearningRateSGDNesterov`
keeps a velocity ``V``: ``V' = momentum * V - eta / batch_size * G`` and
``W' = W + momentum * V' - eta / batch_size * G`` (``W' = W + V'`` with
``nesterov=False``).
"""

from __future__ import annotations

import numpy as np

from ....graph import onnx_to_np_dtype
from ._base_onnx_function import BaseLearningOnnx
from ._functions import OrtFunction, as_device, as_ort_value, axpy_model, axpyw_model

__all__ = ["BaseLearningRate", "LearningRateSGD", "LearningRateSGDNesterov"]


class BaseLearningRate(BaseLearningOnnx):
    """The learning rate after every epoch, and the weight update it drives.

    Subclasses define :meth:`init_learning_rate` (start of training),
    :meth:`update_learning_rate` (end of an epoch), :attr:`value`,
    :attr:`needs_grad` and :meth:`update_weights`.
    """

    def init_learning_rate(self):
        """Start the schedule; return self."""
        raise NotImplementedError("This method must be overwritten.")

    def update_learning_rate(self, t):
        """Move the schedule to the end of iteration ``t``; return self."""
        raise NotImplementedError("This method must be overwritten.")

    @property
    def value(self):
        """The current learning rate."""
        raise NotImplementedError("This method must be overwritten.")

    @property
    def needs_grad(self):
        """Whether the update keeps a state per weight (a velocity)."""
        raise NotImplementedError("This method must be overwritten.")

    def update_weights(self, n_bind, device, statei, gradienti, batch_size, velocity=None):
        """Return the updated weight ``statei`` given its gradient (see subclasses)."""
        raise NotImplementedError("This method must be overwritten.")

    def __repr_extended__(self):
        value = getattr(self, "value_", None)
        return "" if value is None else f", value={value!r}"

    def loop(self, n=1000):
        """Yield the first ``n`` learning rates of the schedule.

        Examples
        --------
        >>> [round(v, 6) for v in LearningRateSGD(eta0=0.1, power_t=0.5).loop(3)]
        [0.1, 0.070711, 0.057735]
        """
        self.init_learning_rate()
        for i in range(n):
            yield self.value
            self.update_learning_rate(i + 1)

    @staticmethod
    def select(class_name, **kwargs):
        """A learning rate from an instance, a float or a name.

        Parameters
        ----------
        class_name : BaseLearningRate, float or str
            An instance (returned as is); a float, the ``eta0`` of a
            :class:`LearningRateSGD`; ``'SGD'`` or ``'LearningRateSGD'``;
            ``'SGDNesterov'``, ``'Nesterov'`` or ``'LearningRateSGDNesterov'``.
        **kwargs
            Parameters of the class a name selects.

        Examples
        --------
        >>> BaseLearningRate.select(0.05)
        LearningRateSGD(eta0=0.05, alpha=0.0001, power_t=0.25, learning_rate='invscaling')
        >>> BaseLearningRate.select('Nesterov', momentum=0.5)  # doctest: +NORMALIZE_WHITESPACE
        LearningRateSGDNesterov(eta0=0.01, alpha=0.0001, power_t=0.25,
                                learning_rate='invscaling', momentum=0.5, nesterov=True)
        """
        if isinstance(class_name, BaseLearningRate):
            return class_name
        if isinstance(class_name, (float, np.floating)):
            return LearningRateSGD(float(class_name))
        aliases = {LearningRateSGD: ["SGD"], LearningRateSGDNesterov: ["SGDNesterov", "Nesterov"]}
        for cls, names in aliases.items():
            if class_name == cls.__name__ or class_name in names:
                return cls(**kwargs)
        raise ValueError(
            f"Unexpected learning rate {class_name!r}: expected an instance of BaseLearningRate, "
            "a float, or one of 'SGD', 'LearningRateSGD', 'SGDNesterov', 'Nesterov', "
            "'LearningRateSGDNesterov'.")


class LearningRateSGD(BaseLearningRate):
    """Stochastic gradient descent with scikit-learn's schedules, as onnxcustom computed them.

    Parameters
    ----------
    eta0 : float, default=0.01
        Initial learning rate.
    alpha : float, default=0.0001
        Only used by the ``'optimal'`` schedule.
    power_t : float, default=0.25
        Exponent of the ``'invscaling'`` schedule.
    learning_rate : {'invscaling', 'optimal', 'constant'}, default='invscaling'
        The schedule (formulas in the module's docstring).

    Attributes
    ----------
    eta0_ : float
        Initial rate (set by :meth:`init_learning_rate`).
    optimal_init_, optimal_fact_ : float
        ``t0`` and the factor of the ``'optimal'`` schedule.
    value_ : float or None
        The current rate (:attr:`value`).

    Examples
    --------
    >>> lr = LearningRateSGD(eta0=0.1, power_t=0.5).init_learning_rate()
    >>> lr.value, round(lr.update_learning_rate(3).value, 6)
    (0.1, 0.05)
    """

    def __init__(self, eta0=0.01, alpha=0.0001, power_t=0.25, learning_rate="invscaling"):
        if learning_rate not in ("invscaling", "optimal", "constant"):
            raise ValueError(f"Unexpected value for learning_rate={learning_rate!r}: expected "
                             "'invscaling', 'optimal' or 'constant'.")
        self.eta0 = eta0
        self.alpha = alpha
        self.power_t = power_t
        self.learning_rate = learning_rate
        self.value_ = None

    @property
    def value(self):
        """The current learning rate."""
        if self.value_ is None:
            raise RuntimeError("init_learning_rate() was never called.")
        return self.value_

    @property
    def needs_grad(self):
        """False: the update keeps no state."""
        return False

    def init_learning_rate(self):
        """Start the schedule at ``eta0``; return self."""
        self.eta0_ = self.eta0
        if self.learning_rate == "optimal":
            typw = np.sqrt(1.0 / np.sqrt(self.alpha))
            eta_b = typw / max(1.0, (1 + typw) * 2)
            self.optimal_init_ = float(1.0 / (eta_b * self.alpha))
            self.optimal_fact_ = float(self.eta0 / (1.0 / (self.alpha * self.optimal_init_)))
        self.value_ = self.eta0_
        return self

    def update_learning_rate(self, t):
        """The rate after iteration ``t``; return self."""
        if self.learning_rate == "optimal":
            self.value_ = float(self.optimal_fact_ / (self.alpha * (self.optimal_init_ + t)))
        elif self.learning_rate == "invscaling":
            self.value_ = float(self.eta0_ / np.power(t + 1, self.power_t))
        return self

    def build_onnx_function(self, opset, device, n_tensors=1, dtype=np.float32):
        """Build the update ``Y = alpha * X1 + X2`` (onnxcustom's ``axpy``) on ``device``."""
        self.axpy_onnx_ = axpy_model(np.dtype(dtype))
        self.axpy_sess_ = OrtFunction(self.axpy_onnx_, device)
        self.dtype_ = np.dtype(dtype)
        self.device_ = as_device(device)

    def _function(self, name, device, dtype):
        if (getattr(self, "dtype_", None) != dtype or getattr(self, "device_", None) != device
                or getattr(self, f"{name}_sess_", None) is None):
            self.build_onnx_function(None, device, 1, dtype)
        return getattr(self, f"{name}_sess_")

    def update_weights(self, n_bind, device, statei, gradienti, batch_size, velocity=None):
        """Return ``statei - value / batch_size * gradienti`` (an OrtValue on ``device``).

        Parameters
        ----------
        n_bind : int
            Index of the weight (kept for onnxcustom's signature).
        device : str, Device or OrtDevice
        statei, gradienti : numpy.ndarray or OrtValue
            The weight and its gradient summed over the batch.
        batch_size : int
        velocity : None
            This update keeps no velocity.

        Unlike onnxcustom, the weight is not overwritten in place: the caller
        keeps the returned value.
        """
        if velocity is not None:
            raise ValueError("LearningRateSGD keeps no velocity: velocity must be None.")
        device = as_device(device)
        statei = as_ort_value(statei, device)
        dtype = _dtype_of(statei)
        alpha = np.array([-self.value / batch_size], dtype=dtype)
        return self._function("axpy", device, dtype)(gradienti, statei, alpha)[0]


class LearningRateSGDNesterov(LearningRateSGD):
    """Stochastic gradient descent with (Nesterov's) momentum, as onnxcustom computed it.

    Parameters
    ----------
    eta0, alpha, power_t, learning_rate
        As :class:`LearningRateSGD`.
    momentum : float, default=0.9
        Weight of the previous velocity, >= 0.
    nesterov : bool, default=True
        Nesterov's momentum; False gives the classical momentum.

    Examples
    --------
    >>> import numpy as np
    >>> lr = LearningRateSGDNesterov(eta0=0.1, momentum=0.5).init_learning_rate()
    >>> w, v = lr.update_weights(0, "cpu", np.ones(2, np.float32), np.ones(2, np.float32), 1,
    ...                          np.zeros(2, np.float32))
    >>> w.numpy(), v.numpy()      # V' = -0.1, W' = 1 + 0.5 * V' - 0.1
    (array([0.85, 0.85], dtype=float32), array([-0.1, -0.1], dtype=float32))
    """

    def __init__(self, eta0=0.01, alpha=0.0001, power_t=0.25, learning_rate="invscaling",
                 momentum=0.9, nesterov=True):
        super().__init__(eta0=eta0, alpha=alpha, power_t=power_t, learning_rate=learning_rate)
        self.momentum = momentum
        self.nesterov = nesterov

    @property
    def needs_grad(self):
        """True: the update keeps a velocity per weight."""
        return True

    def build_onnx_function(self, opset, device, n_tensors=1, dtype=np.float32):
        """Build the update (onnxcustom's ``axpyw2``, or ``axpyw`` without Nesterov)."""
        self.axpyw_onnx_ = axpyw_model(np.dtype(dtype), self.nesterov)
        self.axpyw_sess_ = OrtFunction(self.axpyw_onnx_, device)
        self.dtype_ = np.dtype(dtype)
        self.device_ = as_device(device)

    def update_weights(self, n_bind, device, statei, gradienti, batch_size, velocity=None):
        """Return ``[new weight, new velocity]`` (OrtValues on ``device``).

        Parameters as :meth:`LearningRateSGD.update_weights`; ``velocity``
        (same shape as the weight) is required.
        """
        if velocity is None:
            raise ValueError("LearningRateSGDNesterov needs the velocity of the weight.")
        device = as_device(device)
        statei = as_ort_value(statei, device)
        dtype = _dtype_of(statei)
        alpha = np.array([-self.value / batch_size], dtype=dtype)
        beta = np.array([self.momentum], dtype=dtype)
        return self._function("axpyw", device, dtype)(gradienti, statei, velocity, alpha, beta)


def _dtype_of(value):
    return onnx_to_np_dtype(value.element_type())
