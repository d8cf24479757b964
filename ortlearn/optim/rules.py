"""The update rules: SGD (momentum, Nesterov), Adam as scikit-learn's MLP, AdamW as
onnxruntime-training's kernel, ``torch.optim.AdamW``, and scikit-learn's plain SGD (averaging,
truncated L1). Each is an :class:`~ortlearn.optim.Optimizer`: hyper-parameters, state names
and the nodes of one update.
"""

from __future__ import annotations

import math

import numpy as np

from ..graph.format import (
    FIRST_ORDER_MOMENTS,
)
from .base import Optimizer, _check_range


class SGD(Optimizer):
    """Stochastic gradient descent, with scikit-learn's momentum convention.

    The update matches ``sklearn.neural_network._stochastic_optimizers.SGDOptimizer``
    (so that ortlearn's MLP estimators reproduce scikit-learn)::

        g = g + weight_decay * p             # L2 penalty folded into the gradient
        v = momentum * v - lr * g            # the velocity includes the learning rate
        p = p + v                            # nesterov=False
        p = p + (momentum * v - lr * g)      # nesterov=True (with the new v)

    With ``momentum=0`` the optimizer has no state and does ``p -= lr * g``.
    ``torch.optim.SGD`` differs when the learning rate changes over time: it
    keeps ``buf = momentum * buf + g`` and does ``p -= lr * buf`` (lr applied
    after the momentum), and its Nesterov step is ``p -= lr * (g + momentum * buf)``.
    Both agree for a constant learning rate.

    Parameters
    ----------
    momentum : float, default=0.0
        Momentum factor, in [0, 1].
    nesterov : bool, default=False
        Nesterov's momentum (scikit-learn's form above).
    weight_decay : float, default=0.0
        L2 coefficient added to the gradient (``g + weight_decay * p``), >= 0.
    clip_grad : float, optional
        Clip the global norm of all gradients to this value first (see
        :func:`clip_grad_norm`).

    Attributes
    ----------
    state_names : tuple of str
        ``('momentum',)`` when ``momentum > 0``, else ``()``.

    Examples
    --------
    >>> from ortlearn.optim import build_optimizer_model
    >>> opt = SGD(momentum=0.9, nesterov=True)
    >>> opt.state_names
    ('momentum',)
    >>> model = build_optimizer_model(opt, {"W": (1, [3, 2])})
    >>> [i.name for i in model.graph.input]
    ['learning_rate', 'step', 'params', 'gradients', 'first_order_moments']
    >>> model = build_optimizer_model(opt, {"W": (1, [3, 2])}, layout="tensors")
    >>> [i.name for i in model.graph.input]
    ['learning_rate', 'step', 'W', 'W.gradient', 'W.momentum']
    """

    elementwise = True

    def __init__(self, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                 clip_grad: float | None = None):
        super().__init__(clip_grad)
        _check_range("momentum", momentum, 0, 1)
        _check_range("weight_decay", weight_decay, 0, math.inf, high_open=True)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.weight_decay = float(weight_decay)
        self.state_names = ("momentum",) if self.momentum > 0 else ()
        # onnxruntime-training's SGD model has this input, unused: keep its input list
        self.declared_sequences = (FIRST_ORDER_MOMENTS,)

    @property
    def hyper(self) -> dict:
        return {"momentum": self.momentum, "nesterov": self.nesterov,
                "weight_decay": self.weight_decay, "clip_grad": self.clip_grad}

    def scalar_nodes(self, builder, lr, step):
        return {"lr": lr}

    def scalar_values(self, lr, step):
        return {"lr": lr.copy()}

    def update_nodes(self, builder, typed, scalars, p, g, state):
        if self.weight_decay:
            g = builder.op("Add", [g, builder.op("Mul", [typed(self.weight_decay), p])])
        lr_g = builder.op("Mul", [typed(scalars["lr"]), g])
        if not self.state_names:
            return builder.op("Sub", [p, lr_g]), {}
        mu = typed(self.momentum)
        velocity = builder.op("Sub", [builder.op("Mul", [mu, state["momentum"]]), lr_g])
        update = velocity
        if self.nesterov:
            update = builder.op("Sub", [builder.op("Mul", [mu, velocity]), lr_g])
        return builder.op("Add", [p, update]), {"momentum": velocity}


class _AdamBase(Optimizer):
    """Moments and bias corrections shared by :class:`Adam` and :class:`AdamW`."""

    state_names = ("exp_avg", "exp_avg_sq")
    elementwise = True

    def __init__(self, beta_1, beta_2, epsilon, weight_decay, clip_grad):
        super().__init__(clip_grad)
        _check_range("beta_1", beta_1, 0, 1, high_open=True)
        _check_range("beta_2", beta_2, 0, 1, high_open=True)
        _check_range("epsilon", epsilon, 0, math.inf, high_open=True)
        _check_range("weight_decay", weight_decay, 0, math.inf, high_open=True)
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.weight_decay = float(weight_decay)

    #: Compute with the hyper-parameters rounded to float32 and ``1 - beta`` in the
    #: parameter's dtype, as onnxruntime-training's kernels (float attributes) do.
    _float32_attributes = False

    def _coef(self, value: float) -> float:
        """The value of a hyper-parameter the update computes with."""
        return float(np.float32(value)) if self._float32_attributes else value

    def _bias_corrections(self, builder, step):
        """``1 - beta_1**t`` and ``1 - beta_2**t`` as float64 scalars."""
        one = builder.const(1.0, dtype=np.float64)
        return [builder.op("Sub", [one, builder.op(
                    "Pow", [builder.const(self._coef(beta), dtype=np.float64), step])])
                for beta in (self.beta_1, self.beta_2)]

    def _host_bias_corrections(self, step):
        """:meth:`_bias_corrections` on the host, the same bits on every CPU.

        onnxruntime's ``Pow`` kernel calls the C library's ``pow``, as Python's
        ``float ** float`` does; numpy's ``power`` may take a SIMD approximation
        (SVML on AVX-512) that differs from it in the last bit.
        """
        power = np.vectorize(math.pow, otypes=[np.float64])
        return (1.0 - power(self._coef(self.beta_1), step),
                1.0 - power(self._coef(self.beta_2), step))

    def _moments(self, builder, typed, g, state):
        """``m = b1 m + (1 - b1) g`` and ``v = b2 v + (1 - b2) g^2``.

        ``1 - b`` is computed in float64 then rounded (numpy's and torch's
        float32 ``1 - beta`` from a Python float), or with
        :attr:`_float32_attributes` in the parameter's dtype from the float32
        ``b`` (onnxruntime-training's kernels: 4.7e-5 apart in float32 for 0.999).
        """
        def one_minus(beta):
            if self._float32_attributes:
                return typed.complement(self._coef(beta))
            return typed(1.0 - beta)

        b1, b2 = self._coef(self.beta_1), self._coef(self.beta_2)
        m = builder.op("Add", [builder.op("Mul", [typed(b1), state["exp_avg"]]),
                               builder.op("Mul", [one_minus(self.beta_1), g])])
        v = builder.op("Add", [builder.op("Mul", [typed(b2), state["exp_avg_sq"]]),
                               builder.op("Mul", [one_minus(self.beta_2),
                                                  builder.op("Mul", [g, g])])])
        return m, v


class Adam(_AdamBase):
    """Adam, exactly as scikit-learn's MLP (``AdamOptimizer``) does it.

    For the update number ``t`` (1-based)::

        g = g + weight_decay * p             # L2 penalty folded into the gradient
        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g**2
        lr_t = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)
        p = p - lr_t * m / (sqrt(v) + epsilon)

    This is ``torch.optim.Adam`` up to where epsilon sits (torch adds it
    to ``sqrt(v) / sqrt(1 - beta_2**t)``); see :class:`AdamW` for that form.

    Parameters
    ----------
    beta_1, beta_2 : float, default=0.9, 0.999
        Decay rates of the first and second moments, in [0, 1).
    epsilon : float, default=1e-8
        Added to ``sqrt(v)``, >= 0.
    weight_decay : float, default=0.0
        L2 coefficient added to the gradient, >= 0.
    clip_grad : float, optional
        Clip the global norm of all gradients to this value first.

    Examples
    --------
    >>> opt = Adam()
    >>> opt.state_names
    ('exp_avg', 'exp_avg_sq')
    >>> sorted(opt.init_state(np.ones(3)))
    ['exp_avg', 'exp_avg_sq']
    """

    def __init__(self, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-8,
                 weight_decay: float = 0.0, clip_grad: float | None = None):
        super().__init__(beta_1, beta_2, epsilon, weight_decay, clip_grad)

    @property
    def hyper(self) -> dict:
        return {"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                "weight_decay": self.weight_decay, "clip_grad": self.clip_grad}

    def scalar_nodes(self, builder, lr, step):
        bc1, bc2 = self._bias_corrections(builder, step)
        lr_t = builder.op("Div", [builder.op("Mul", [lr, builder.op("Sqrt", [bc2])]), bc1])
        return {"lr_t": lr_t}

    def scalar_values(self, lr, step):
        bc1, bc2 = self._host_bias_corrections(step)
        return {"lr_t": lr * np.sqrt(bc2) / bc1}

    def update_nodes(self, builder, typed, scalars, p, g, state):
        if self.weight_decay:
            g = builder.op("Add", [g, builder.op("Mul", [typed(self.weight_decay), p])])
        m, v = self._moments(builder, typed, g, state)
        denom = builder.op("Add", [builder.op("Sqrt", [v]), typed(self.epsilon)])
        step = builder.op("Div", [builder.op("Mul", [typed(scalars["lr_t"]), m]), denom])
        return builder.op("Sub", [p, step]), {"exp_avg": m, "exp_avg_sq": v}


class AdamW(_AdamBase):
    """AdamW as onnxruntime-training's ``AdamWOptimizer`` kernel computes it.

    The rule of ``onnxruntime.training.onnxblock.optim.AdamW`` (and so of
    ``artifacts.OptimType.AdamW``): the kernel's ``adam_mode=1``, the
    HuggingFace ``transformers`` form, where the bias correction goes into
    the learning rate and the decoupled weight decay is applied **after**
    the update. For the update number ``t`` (1-based)::

        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g**2
        lr_t = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)   # lr_t = lr without bias_correction
        p = p - lr_t * m / (sqrt(v) + eps)                  # eps outside the correction
        p = p - (lr * weight_decay) * p                     # decay last, with the plain lr

    The defaults are onnxruntime-training's (``eps=1e-6``, no weight decay).
    As the kernel, which stores them as float attributes, the update computes
    with ``betas``, ``eps`` and ``weight_decay`` rounded to float32 (in
    float64 too), and ``1 - beta`` in the parameter's dtype; ``hyper`` keeps
    the values given. ``torch.optim.AdamW`` differs: eps is added to ``sqrt(v / (1 - beta_2**t))``
    and the decay comes first; :class:`TorchAdamW` computes that form.

    Parameters
    ----------
    betas : tuple of float, default=(0.9, 0.999)
        Decay rates of the first and second moments (the kernel's ``alpha``
        and ``beta``), each in [0, 1).
    eps : float, default=1e-6
        Added to ``sqrt(v)``, >= 0.
    weight_decay : float, default=0.0
        Decoupled decay coefficient, >= 0.
    bias_correction : bool, default=True
        Correct the learning rate for the zero initialisation of the moments
        (the kernel's ``correct_bias``).
    clip_grad : float, optional
        Clip the global norm of all gradients to this value first
        (onnxruntime-training's ``ClipGradNorm``).

    Examples
    --------
    >>> opt = AdamW(weight_decay=0.1, clip_grad=1.0)
    >>> opt.hyper["eps"], opt.hyper["weight_decay"]
    (1e-06, 0.1)
    """

    # the kernel keeps alpha, beta, epsilon and weight_decay as float attributes
    _float32_attributes = True

    def __init__(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, bias_correction: bool = True,
                 clip_grad: float | None = None):
        if len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta_1, beta_2), got {betas!r}.")
        super().__init__(betas[0], betas[1], eps, weight_decay, clip_grad)
        self.bias_correction = bool(bias_correction)

    @property
    def betas(self) -> tuple[float, float]:
        return (self.beta_1, self.beta_2)

    @property
    def eps(self) -> float:
        return self.epsilon

    @property
    def hyper(self) -> dict:
        return {"betas": [self.beta_1, self.beta_2], "eps": self.epsilon,
                "weight_decay": self.weight_decay, "bias_correction": self.bias_correction,
                "clip_grad": self.clip_grad}

    def scalar_nodes(self, builder, lr, step):
        scalars = {"step_size": lr}
        if self.bias_correction:
            bc1, bc2 = self._bias_corrections(builder, step)
            scalars["step_size"] = builder.op(
                "Div", [builder.op("Mul", [lr, builder.op("Sqrt", [bc2])]), bc1])
        if self.weight_decay:
            scalars["lr_decay"] = builder.op(
                "Mul", [lr, builder.const(self._coef(self.weight_decay), dtype=np.float64)])
        return scalars

    def scalar_values(self, lr, step):
        scalars = {"step_size": lr.copy()}
        if self.bias_correction:
            bc1, bc2 = self._host_bias_corrections(step)
            scalars["step_size"] = lr * np.sqrt(bc2) / bc1
        if self.weight_decay:
            scalars["lr_decay"] = lr * self._coef(self.weight_decay)
        return scalars

    def update_nodes(self, builder, typed, scalars, p, g, state):
        m, v = self._moments(builder, typed, g, state)
        denom = builder.op("Add", [builder.op("Sqrt", [v]), typed(self._coef(self.epsilon))])
        step = builder.op("Div", [builder.op("Mul", [typed(scalars["step_size"]), m]), denom])
        p = builder.op("Sub", [p, step])
        if self.weight_decay:
            # the kernel subtracts (lr * weight_decay) * p from the updated p
            p = builder.op("Sub", [p, builder.op("Mul", [typed(scalars["lr_decay"]), p])])
        return p, {"exp_avg": m, "exp_avg_sq": v}


class TorchAdamW(_AdamBase):
    """AdamW with ``torch.optim.AdamW`` semantics and defaults (ortlearn's addition).

    Decoupled weight decay applied first, bias corrections on the moments
    (onnxruntime-training's kernel computes this form with ``adam_mode=0``,
    which its onnxblock never sets; :class:`AdamW` is the form it uses).
    For the update number ``t`` (1-based)::

        p = p * (1 - lr * weight_decay)      # decoupled decay, applied first
        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g**2
        # bias_correction=True:
        p = p - (lr / (1 - beta_1**t)) * m / (sqrt(v) / sqrt(1 - beta_2**t) + eps)
        # bias_correction=False:
        p = p - lr * m / (sqrt(v) + eps)

    Parameters
    ----------
    betas : tuple of float, default=(0.9, 0.999)
        Decay rates of the first and second moments, each in [0, 1).
    eps : float, default=1e-8
        Added to the denominator, >= 0 (torch's default).
    weight_decay : float, default=1e-2
        Decoupled decay coefficient, >= 0 (torch's default).
    bias_correction : bool, default=True
        Correct the moments for their zero initialisation.
    clip_grad : float, optional
        Clip the global norm of all gradients to this value first (as
        ``torch.nn.utils.clip_grad_norm_`` before ``optimizer.step()``).

    Examples
    --------
    >>> opt = TorchAdamW(weight_decay=0.1, clip_grad=1.0)
    >>> opt.hyper["betas"], opt.hyper["eps"]
    ([0.9, 0.999], 1e-08)
    """

    def __init__(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, bias_correction: bool = True,
                 clip_grad: float | None = None):
        if len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta_1, beta_2), got {betas!r}.")
        super().__init__(betas[0], betas[1], eps, weight_decay, clip_grad)
        self.bias_correction = bool(bias_correction)

    betas = AdamW.betas
    eps = AdamW.eps
    hyper = AdamW.hyper

    def scalar_nodes(self, builder, lr, step):
        one = builder.const(1.0, dtype=np.float64)
        decay = builder.op("Sub", [one, builder.op(
            "Mul", [lr, builder.const(self.weight_decay, dtype=np.float64)])])
        if not self.bias_correction:
            return {"decay": decay, "step_size": lr}
        bc1, bc2 = self._bias_corrections(builder, step)
        return {"decay": decay, "step_size": builder.op("Div", [lr, bc1]),
                "sqrt_bc2": builder.op("Sqrt", [bc2])}

    def scalar_values(self, lr, step):
        decay = 1.0 - lr * self.weight_decay
        if not self.bias_correction:
            return {"decay": decay, "step_size": lr.copy()}
        bc1, bc2 = self._host_bias_corrections(step)
        return {"decay": decay, "step_size": lr / bc1, "sqrt_bc2": np.sqrt(bc2)}

    def update_nodes(self, builder, typed, scalars, p, g, state):
        if self.weight_decay:
            p = builder.op("Mul", [p, typed(scalars["decay"])])
        m, v = self._moments(builder, typed, g, state)
        root = builder.op("Sqrt", [v])
        if self.bias_correction:
            root = builder.op("Div", [root, typed(scalars["sqrt_bc2"])])
        denom = builder.op("Add", [root, typed(self.epsilon)])
        step = builder.op("Div", [builder.op("Mul", [typed(scalars["step_size"]), m]), denom])
        return builder.op("Sub", [p, step]), {"exp_avg": m, "exp_avg_sq": v}


class PlainSGD(Optimizer):
    """scikit-learn's ``SGDClassifier``/``SGDRegressor`` update: SGD, ASGD, truncated L1.

    The steps of ``_plain_sgd`` (``sklearn/linear_model/_sgd_fast.pyx.tp``)
    after the gradient, for the update number ``t`` (1-based) with learning
    rate ``lr``::

        p = p - lr * g                            # g: loss and L2 gradients
                                                  # (the intercept's step times
                                                  # intercept_decay)
        a = a + mu_t * (p - a)                    # ASGD, mu_t = 1 / (t - average + 1)
                                                  # from t = average on, else 0
        u = u + lr * l1                           # cumulative L1 penalty (l1 > 0)
        p = max(0, p - (u + q)) if p > 0          # truncated gradient (Tsuruoka
        p = min(0, p + (u - q)) if p < 0          # et al. 2009), parameters of
        q = q + (p_new - p_old)                   # ``l1_params`` only

    The L2 part of the penalty stays in the objective (its gradient is in
    ``g``): ``p - lr * (g_data + alpha p)`` is scikit-learn's
    ``p * (1 - lr * alpha) - lr * g_data``. The average takes the weights
    after the gradient step and before the L1 truncation, as scikit-learn's.
    Each parameter keeps its own tensors (no flat buffer: the L1 part
    applies to some parameters only), and the training engine feeds the
    schedule's rates in float64 (``exact_learning_rate``); the
    ``optimizer_model.onnx`` of the artifacts takes its ``learning_rate`` in
    float32, as onnxruntime-training's, so a continuation through
    :mod:`ortlearn.api` agrees with the engine to that rounding, not bit
    for bit. With ``average`` and an L1 part together the average differs
    from scikit-learn's (1.6e-2 on diabetes, 3 epochs), whose lazily kept
    average accumulates the gradient steps and not the truncations; this
    rule averages the weights as they are.

    Parameters
    ----------
    l1 : float, default=0.0
        ``alpha * l1_ratio`` of the estimator: the L1 penalty applied per
        unit of learning rate, >= 0 (0: no L1 state).
    l1_params : tuple of str, default=('coef',)
        The parameters the L1 penalty truncates (the intercept is not
        penalised).
    average : int, default=0
        First update (1-based) averaged into the ``average`` state; 0: no
        averaging (``average=True`` of scikit-learn is 1).
    intercept_decay : float, default=1.0
        Factor of the step of the parameters ``intercept_params``:
        scikit-learn's 0.01 on sparse data (``SPARSE_INTERCEPT_DECAY`` of
        ``sklearn.linear_model._base``, which keeps the intercept from
        oscillating where each row touches few weights), 1 on dense data.
    intercept_params : tuple of str, default=('intercept',)

    Attributes
    ----------
    state_names : tuple of str
        ``'average'`` when ``average > 0``, ``'l1_q'`` and ``'l1_u'`` when
        ``l1 > 0``.

    Examples
    --------
    >>> PlainSGD(l1=1e-5, average=1).state_names
    ('average', 'l1_q', 'l1_u')
    >>> PlainSGD(average=10).host_scalars([0.5, 0.5], [9, 11])["mu"]  # not yet, then 1/2
    array([0. , 0.5])
    """

    #: the rule differs per parameter: the training engine keeps them apart
    per_parameter = True
    #: the training engine feeds the float64 rates of the schedule unrounded (the
    #: float32 ``learning_rate`` of an optimizer model rounds them): at scikit-learn's
    #: large early rates, a rounding of 3e-8 grows to 1e-3 in the weights in a few epochs
    exact_learning_rate = True

    def __init__(self, l1: float = 0.0, l1_params=("coef",), average: int = 0,
                 intercept_decay: float = 1.0, intercept_params=("intercept",)):
        super().__init__(None)
        _check_range("l1", l1, 0, math.inf, high_open=True)
        _check_range("intercept_decay", intercept_decay, 0, 1, low_open=True)
        if isinstance(average, bool) or int(average) != average or average < 0:
            raise ValueError(f"average must be an int >= 0, got {average!r}.")
        self.l1 = float(l1)
        self.l1_params = tuple(l1_params)
        self.average = int(average)
        self.intercept_decay = float(intercept_decay)
        self.intercept_params = tuple(intercept_params)
        names = ("average",) if self.average else ()
        self.state_names = names + (("l1_q", "l1_u") if self.l1 else ())

    @property
    def hyper(self) -> dict:
        return {"l1": self.l1, "l1_params": list(self.l1_params), "average": self.average,
                "intercept_decay": self.intercept_decay,
                "intercept_params": list(self.intercept_params)}

    def scalar_nodes(self, builder, lr, step):
        scalars = {"lr": lr}
        if self.l1:
            scalars["l1_step"] = builder.op("Mul", [lr, builder.const(self.l1, dtype=np.float64)])
        if self.average:
            start = builder.const(float(self.average), dtype=np.float64)
            one = builder.const(1.0, dtype=np.float64)
            count = builder.op("Add", [builder.op("Sub", [step, start]), one])
            mu = builder.op("Div", [one, builder.op("Max", [count, one])])
            scalars["mu"] = builder.op("Where", [builder.op("Less", [step, start]),
                                                 builder.const(0.0, dtype=np.float64), mu])
        return scalars

    def scalar_values(self, lr, step):
        scalars = {"lr": lr.copy()}
        if self.l1:
            scalars["l1_step"] = lr * self.l1
        if self.average:
            count = step - self.average + 1
            scalars["mu"] = np.where(count >= 1, 1.0 / np.maximum(count, 1.0), 0.0)
        return scalars

    def update_nodes(self, builder, typed, scalars, p, g, state):
        b = builder
        step = b.op("Mul", [typed(scalars["lr"]), g])
        if self.intercept_decay != 1.0 and p in self.intercept_params:
            step = b.op("Mul", [step, typed(self.intercept_decay)])
        new = b.op("Sub", [p, step])
        states = {}
        if self.average:
            avg = state["average"]
            states["average"] = b.op("Add", [avg, b.op(
                "Mul", [typed(scalars["mu"]), b.op("Sub", [new, avg])])])
        if self.l1 and p in self.l1_params:
            u = b.op("Add", [state["l1_u"], typed(scalars["l1_step"])])
            q = state["l1_q"]
            zero = typed(0.0)
            shrunk = b.op("Relu", [b.op("Sub", [new, b.op("Add", [u, q])])])
            raised = b.op("Neg", [b.op("Relu", [b.op("Neg", [
                b.op("Add", [new, b.op("Sub", [u, q])])])])])
            truncated = b.op("Where", [b.op("Greater", [new, zero]), shrunk, b.op(
                "Where", [b.op("Less", [new, zero]), raised, new])])
            states["l1_q"] = b.op("Add", [q, b.op("Sub", [truncated, new])])
            states["l1_u"] = u
            new = truncated
        elif self.l1:
            # a parameter without L1 carries its (unused) states unchanged
            states.update({s: b.op("Identity", [state[s]]) for s in ("l1_q", "l1_u")})
        return new, states
