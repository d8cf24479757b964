"""Learning-rate schedules: scikit-learn's and onnxruntime-training's.

Pure Python and cheap: a training loop asks for the learning rate once per
step (or per epoch) and feeds it to the optimizer graph as its
``learning_rate`` input. Every schedule has the same interface:

- ``learning_rate(step)``: the rate for ``step`` (what ``step`` counts is
  documented per class: samples, epochs or optimizer steps);
- ``on_plateau()``: called by the training loop when the loss stopped
  improving for ``n_iter_no_change`` epochs; returns True when training
  should stop, False when the schedule lowered the rate instead (only
  :class:`Adaptive` does).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = ["Adaptive", "Constant", "InvScaling", "LinearLR", "Optimal", "per_sample_rates"]


def _check_positive(name, value, strict=True):
    if not (value > 0 if strict else value >= 0) or not math.isfinite(value):
        kind = "> 0" if strict else ">= 0"
        raise ValueError(f"{name} must be a finite number {kind}, got {value!r}.")


def _check_step(step, first=1):
    if step < first:
        raise ValueError(f"step must be >= {first}, got {step!r}.")


def per_sample_rates(schedule, sizes, first_sample: int) -> list[float]:
    """Rates of updates of ``sizes`` rows each, for a schedule that counts samples.

    scikit-learn's SGD steps each sample with the rate of its own count
    ``t``. An update of ``n`` rows that descends their *mean* gradient with
    ``n`` times the rate of its first row gives each row the step the
    per-sample loop would (taken from the weights at the start of the
    update rather than after the previous row): the mini-batch path follows
    the per-sample one instead of taking ``n`` times fewer steps. One row
    per update is the per-sample loop itself.

    Parameters
    ----------
    schedule : object
        A schedule whose ``learning_rate(t)`` counts samples
        (:class:`InvScaling`, :class:`Optimal`; :class:`Constant` and
        :class:`Adaptive` ignore ``t``).
    sizes : sequence of int
        Rows of each update, in order.
    first_sample : int
        The 1-based count ``t`` of the first row of the first update.

    Returns
    -------
    list of float
        The rate of each update.

    Examples
    --------
    >>> per_sample_rates(InvScaling(0.1, power_t=0.5), [4, 4, 2], first_sample=1)
    [0.4, 0.17888543819998318, 0.06666666666666667]
    """
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    counts = sizes.cumsum() - sizes + int(first_sample)
    return (sizes * schedule.learning_rates(counts)).tolist()


class _Schedule:
    def learning_rate(self, step: int) -> float:
        raise NotImplementedError

    def learning_rates(self, steps: np.ndarray) -> np.ndarray:
        """The rates of the 1-based ``steps`` (an int64 array), as :meth:`learning_rate`'s."""
        return np.array([self.learning_rate(int(step)) for step in steps], dtype=np.float64)

    def on_plateau(self) -> bool:
        """The loss stopped improving: return True (stop training).

        Only :class:`Adaptive` lowers its rate and returns False instead.
        """
        return True

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class Constant(_Schedule):
    """The same learning rate at every step (scikit-learn's ``'constant'``).

    Parameters
    ----------
    eta0 : float
        The learning rate, > 0.

    Examples
    --------
    >>> Constant(0.01).learning_rate(1000)
    0.01
    """

    def __init__(self, eta0: float):
        _check_positive("eta0", eta0)
        self.eta0 = float(eta0)

    def learning_rate(self, step: int = 1) -> float:
        """``eta0``, whatever the step."""
        return self.eta0

    def learning_rates(self, steps: np.ndarray) -> np.ndarray:
        return np.full(len(steps), self.eta0)


class InvScaling(_Schedule):
    """``eta = eta0 / t**power_t`` (scikit-learn's ``'invscaling'``).

    ``t`` is 1-based. ``SGDRegressor``/``SGDClassifier`` step it once per
    sample (``t`` = number of the sample being learned, counted over all
    epochs). ``MLPRegressor``/``MLPClassifier`` (solver ``'sgd'``) change the
    rate at the end of each epoch only, to ``learning_rate(n_samples_seen + 1)``.

    Parameters
    ----------
    eta0 : float
        Initial learning rate, > 0.
    power_t : float, default=0.5
        Exponent, >= 0.

    Examples
    --------
    >>> InvScaling(0.1, power_t=0.5).learning_rate(4)
    0.05
    """

    def __init__(self, eta0: float, power_t: float = 0.5):
        _check_positive("eta0", eta0)
        _check_positive("power_t", power_t, strict=False)
        self.eta0 = float(eta0)
        self.power_t = float(power_t)

    def learning_rate(self, step: int) -> float:
        """Rate for the 1-based time step ``step``."""
        _check_step(step)
        return self.eta0 / step ** self.power_t


class Optimal(_Schedule):
    """``eta = 1 / (alpha * (t0 + t - 1))`` (scikit-learn SGD's ``'optimal'``).

    Léon Bottou's heuristic, as ``sklearn/linear_model/_sgd_fast.pyx.tp``
    computes it: ``typw = sqrt(1 / sqrt(alpha))``, ``eta_init = typw /
    max(1, dloss(1, -typw))``, ``t0 = 1 / (eta_init * alpha)``, so that the
    first step uses ``eta_init``. ``t`` is 1-based and, as in
    ``SGDRegressor``/``SGDClassifier``, stepped once per sample over all
    epochs.

    Parameters
    ----------
    alpha : float
        Regularization strength of the estimator, > 0.
    loss_gradient : callable, optional
        ``loss_gradient(y_true, raw_prediction)``: derivative of the loss
        with respect to the prediction. None means the derivative at
        ``(1, -typw)`` is at most 1, which holds for every loss of
        scikit-learn's SGD estimators (it is negative there), so
        ``eta_init = typw``.

    Attributes
    ----------
    t0 : float
        The offset ``1 / (eta_init * alpha)``.

    Examples
    --------
    >>> sched = Optimal(alpha=1e-4)
    >>> round(sched.learning_rate(1), 9)    # typw = sqrt(1 / sqrt(1e-4)) = 10
    10.0
    """

    def __init__(self, alpha: float, loss_gradient: Callable[[float, float], float] | None = None):
        _check_positive("alpha", alpha)
        self.alpha = float(alpha)
        typw = math.sqrt(1.0 / math.sqrt(self.alpha))
        dloss = -1.0 if loss_gradient is None else float(loss_gradient(1.0, -typw))
        eta_init = typw / max(1.0, dloss)
        self._t0 = 1.0 / (eta_init * self.alpha)

    @property
    def t0(self) -> float:
        return self._t0

    def learning_rate(self, step: int) -> float:
        """Rate for the 1-based sample count ``step``."""
        _check_step(step)
        return 1.0 / (self.alpha * (self._t0 + step - 1))

    def learning_rates(self, steps: np.ndarray) -> np.ndarray:
        # the same operations in the same order as learning_rate's: the same values
        if len(steps):
            _check_step(int(steps.min()))
        return 1.0 / (self.alpha * (self._t0 + steps - 1))


class Adaptive(_Schedule):
    """Constant until the loss stops improving, then divided by 5 (scikit-learn's ``'adaptive'``).

    The training loop counts the epochs without improvement (by ``tol``, on
    the training loss or the validation score) and calls :meth:`on_plateau`
    when the count reaches ``n_iter_no_change``; as in scikit-learn, it then
    resets its count. Same rule as ``SGDOptimizer.trigger_stopping`` (MLP)
    and ``_sgd_fast`` (SGD estimators).

    Parameters
    ----------
    eta0 : float
        Initial learning rate, > 0.

    Attributes
    ----------
    current : float
        The learning rate now (restore it to resume training).

    Examples
    --------
    >>> sched = Adaptive(0.1)
    >>> sched.on_plateau(), round(sched.learning_rate(), 6)
    (False, 0.02)
    """

    #: At or below this rate, a plateau stops training (scikit-learn's bound).
    min_learning_rate = 1e-6
    #: Divisor applied on each plateau.
    factor = 5.0

    def __init__(self, eta0: float):
        _check_positive("eta0", eta0)
        self.eta0 = float(eta0)
        self.current = self.eta0

    def learning_rate(self, step: int = 1) -> float:
        """The current rate (``step`` is ignored: only plateaus change it)."""
        return self.current

    def on_plateau(self) -> bool:
        """Divide the rate by 5 and return False, or return True once it is <= 1e-6."""
        if self.current <= self.min_learning_rate:
            return True
        self.current /= self.factor
        return False


class LinearLR(_Schedule):
    """Linear warmup then linear decay, as onnxruntime-training's ``LinearLRScheduler``.

    After ``step`` optimizer steps the rate is ``initial_lr * f(step)`` with::

        f(step) = step / max(1, warmup_step_count)                    if step < warmup_step_count
        f(step) = max(0, (total_step_count - step)
                         / max(1, total_step_count - warmup_step_count))  otherwise

    so it rises from 0 to ``initial_lr`` over the warmup, then falls to 0 at
    ``total_step_count`` (with ``total_step_count < warmup_step_count``, the rate
    drops to 0 after the warmup, as onnxruntime's formula gives). onnxruntime-training's
    ``SchedulerStep()``, called
    after each ``OptimizerStep()``, sets the rate to ``learning_rate(step)``
    where ``step`` counts the optimizer steps made so far. (onnxruntime
    computes in float32, this class in float64; the rate is fed to the graph
    as float32 anyway.)

    Parameters
    ----------
    warmup_step_count : int
        Number of warmup steps, >= 0.
    total_step_count : int
        Step at which the rate reaches 0, >= 0.
    initial_lr : float
        Peak learning rate, > 0.

    Examples
    --------
    >>> sched = LinearLR(warmup_step_count=2, total_step_count=6, initial_lr=1.0)
    >>> [sched.learning_rate(s) for s in range(7)]
    [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]
    """

    def __init__(self, warmup_step_count: int, total_step_count: int, initial_lr: float):
        if warmup_step_count < 0:
            raise ValueError(f"warmup_step_count must be >= 0, got {warmup_step_count!r}.")
        if total_step_count < 0:
            raise ValueError(f"total_step_count must be >= 0, got {total_step_count!r}.")
        _check_positive("initial_lr", initial_lr)
        self.warmup_step_count = int(warmup_step_count)
        self.total_step_count = int(total_step_count)
        self.initial_lr = float(initial_lr)

    def factor(self, step: int) -> float:
        """The multiplicative factor ``f(step)`` in [0, 1]."""
        _check_step(step, first=0)
        if step < self.warmup_step_count:
            return step / max(1, self.warmup_step_count)
        decay_steps = max(1, self.total_step_count - self.warmup_step_count)
        return max(0.0, (self.total_step_count - step) / decay_steps)

    def learning_rate(self, step: int) -> float:
        """Rate after ``step`` optimizer steps (0-based count, >= 0)."""
        return self.initial_lr * self.factor(step)
