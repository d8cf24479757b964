"""Optimizer update rules written as standard ONNX nodes.

Each optimizer is a small spec (hyper-parameters, names of its state
tensors) whose :meth:`~Optimizer.build` appends the update rule to a
:class:`~ortlearn.graph.GraphBuilder`. The same rule therefore serves
twice: :func:`build_optimizer_model` writes it as the standalone
``optimizer_model.onnx`` (see ``doc/artifacts_format.md``), and a training
loop can fuse it with the forward and backward pass into one graph.

The per-step scalars (learning rate, bias corrections) are computed once in
float64 inside the graph, then cast to the dtype of each parameter, so
float32 and float64 parameters can be mixed in one graph. A caller that
knows the learning rate of every step ahead (the fused training epoch) can
compute them on the host with :meth:`~Optimizer.host_scalars` and pass
them to :meth:`~Optimizer.build` as graph values: the step then skips the
dozen scalar nodes, and the update rule itself is the same.
"""

from __future__ import annotations

import functools
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..graph import (
    DEFAULT_OPSET,
    FLOAT_TYPES,
    GraphBuilder,
    finalize_model,
    onnx_to_np_dtype,
)
from ..graph.format import (
    GRADIENT_SUFFIX,
    LEARNING_RATE,
    OPTIMIZER_METADATA_KEY,
    STEP,
    UPDATED_SUFFIX,
)

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "build_optimizer_model", "clip_grad_norm"]

#: Added to the global norm before dividing, as torch's ``clip_grad_norm_``
#: and onnxruntime-training's ``ClipGradNorm`` do.
_CLIP_EPS = 1e-6


def _check_range(name, value, low, high, *, low_open=False, high_open=False):
    """Raise ValueError unless ``low <(=) value <(=) high``."""
    ok = (value > low if low_open else value >= low) and (
        value < high if high_open else value <= high)
    if not ok:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ValueError(f"{name} must be in {lo}{low}, {high}{hi}, got {value!r}.")


class _Scalars:
    """Put float64 scalars and Python constants in the dtype of each parameter.

    With ``elem_types`` known, constants are emitted in the right dtype and
    graph scalars go through one cached ``Cast`` per dtype; otherwise every
    conversion is a ``CastLike`` to the parameter (opset >= 15).
    """

    def __init__(self, builder: GraphBuilder, params: Sequence[str],
                 elem_types: Sequence[int] | None):
        if elem_types is None and builder.opset < 15:
            raise ValueError(
                "elem_types is required below opset 15 (CastLike does not exist there); "
                f"the builder targets opset {builder.opset}.")
        if elem_types is not None:
            if len(elem_types) != len(params):
                raise ValueError(
                    f"Got {len(elem_types)} elem_types for {len(params)} parameters.")
            for p, et in zip(params, elem_types):
                if et not in FLOAT_TYPES:
                    raise TypeError(
                        f"Parameter {p!r} has element type {TensorProto.DataType.Name(et)}; "
                        "optimizers update float and double tensors only.")
        self.builder = builder
        self.params = list(params)
        self.elem_types = None if elem_types is None else list(elem_types)
        self._cache: dict[tuple, str] = {}
        self._value_types: dict[str, int] = {}

    def declare(self, names, elem_type: int) -> None:
        """Graph scalars ``names`` are of ``elem_type`` (float64 when not declared)."""
        self._value_types.update(dict.fromkeys(names, elem_type))

    def get(self, value, index: int) -> str:
        """``value`` (a float, or the name of a graph scalar) in parameter ``index``'s dtype."""
        b = self.builder
        if self.elem_types is not None:
            elem = self.elem_types[index]
            if not isinstance(value, str):
                return b.const(value, dtype=onnx_to_np_dtype(elem), hint="hyper")
            if elem == self._value_types.get(value, TensorProto.DOUBLE):
                return value
            key = (value, elem)
            if key not in self._cache:
                self._cache[key] = b.cast(value, elem)
            return self._cache[key]
        name = value if isinstance(value, str) else b.const(value, dtype=np.float64, hint="hyper")
        key = (name, self.params[index])
        if key not in self._cache:
            self._cache[key] = b.op("CastLike", [name, self.params[index]])
        return self._cache[key]


def clip_grad_norm(builder: GraphBuilder, grads: Sequence[str], max_norm: float,
                   elem_types: Sequence[int] | None = None) -> list[str]:
    """Scale all gradients together so that their global L2 norm is at most ``max_norm``.

    Same rule as ``torch.nn.utils.clip_grad_norm_`` and onnxruntime-training's
    ``ClipGradNorm``: ``total = sqrt(sum_i ||g_i||^2)`` (accumulated in
    float64), ``coef = min(max_norm / (total + 1e-6), 1)``, ``g_i *= coef``.

    Parameters
    ----------
    builder : GraphBuilder
        Receives the nodes.
    grads : list of str
        Names of the gradient tensors (float or double, possibly mixed).
    max_norm : float
        Largest global norm allowed, > 0.
    elem_types : list of int, optional
        ``TensorProto`` element type of each gradient; without it the
        conversions use ``CastLike`` (opset >= 15).

    Returns
    -------
    list of str
        Names of the clipped gradients, in the order of ``grads``.

    Raises
    ------
    ValueError
        If ``max_norm`` is not positive.

    Examples
    --------
    >>> from ortlearn.graph import GraphBuilder
    >>> b = GraphBuilder(prefix="clip_")
    >>> clipped = clip_grad_norm(b, ["W.gradient", "b.gradient"], 1.0)
    >>> len(clipped)
    2
    """
    _check_range("max_norm", max_norm, 0, math.inf, low_open=True, high_open=True)
    scalars = _Scalars(builder, grads, elem_types)
    squares = [builder.cast(builder.reduce("ReduceSumSquare", g, keepdims=0), TensorProto.DOUBLE)
               for g in grads]
    total = builder.op("Sqrt", [builder.op("Sum", squares)])
    denom = builder.op("Add", [total, builder.const(_CLIP_EPS, dtype=np.float64)])
    coef = builder.op("Min", [builder.op("Div", [builder.const(float(max_norm), dtype=np.float64),
                                                  denom]),
                              builder.const(1.0, dtype=np.float64)])
    return [builder.op("Mul", [g, scalars.get(coef, i)]) for i, g in enumerate(grads)]


def _rename_values(nodes: Sequence[onnx.NodeProto], mapping: Mapping[str, str]) -> None:
    """Rename values in place, in node inputs and outputs alike."""
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]
        for i, name in enumerate(node.output):
            if name in mapping:
                node.output[i] = mapping[name]


class Optimizer(ABC):
    """Base class of the update rules: what a new optimizer subclasses.

    :meth:`build` appends the update of every parameter to a
    :class:`~ortlearn.graph.GraphBuilder` (clipping, per-step scalars,
    names of the updated values); the training engine, the optimizer model
    of the artifacts and the onnxblock optimizer blocks all call it. A
    subclass sets :attr:`state_names` and defines four hooks:

    - :attr:`hyper`: its hyper-parameters, JSON-serialisable (written in
      the optimizer model's metadata);
    - :meth:`scalar_nodes`: the nodes of the float64 scalars a step shares
      between all parameters (``{name: value}``), from the learning rate and
      the 1-based step;
    - :meth:`scalar_values`: the same scalars computed in numpy, which the
      engine computes on the host for a whole epoch at once;
    - :meth:`update_nodes`: the nodes updating one parameter and its states.

    Parameters
    ----------
    clip_grad : float, optional
        Clip the global norm of all gradients to this value first (see
        :func:`clip_grad_norm`).
    """

    #: Names of the per-parameter state tensors, in the order of the model inputs.
    state_names: tuple[str, ...] = ()

    def __init__(self, clip_grad: float | None = None):
        if clip_grad is not None:
            _check_range("clip_grad", clip_grad, 0, math.inf, low_open=True, high_open=True)
        self.clip_grad = clip_grad

    @property
    def type(self) -> str:
        """Name written in the ``ortlearn.optimizer`` metadata (the class name)."""
        return type(self).__name__

    @property
    @abstractmethod
    def hyper(self) -> dict:
        """Hyper-parameters, JSON-serialisable (learning rate excluded: it is an input)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hyper.items())
        return f"{self.type}({args})"

    def init_state(self, param: np.ndarray) -> dict[str, np.ndarray]:
        """Initial state of one parameter: zeros of its shape and dtype, per state name.

        Parameters
        ----------
        param : ndarray
            The parameter.

        Returns
        -------
        dict
            ``{state_name: zeros_like(param)}`` for each of :attr:`state_names`.
        """
        param = np.asarray(param)
        return {s: np.zeros_like(param) for s in self.state_names}

    def build(self, builder: GraphBuilder, params: Sequence[str], grads: Sequence[str],
              states: Mapping[str, Mapping[str, str]], learning_rate: str, step: str, *,
              elem_types: Sequence[int] | None = None,
              updated_names: Mapping[str, str] | None = None,
              scalars: Mapping[str, str] | None = None,
              scalar_elem_type: int = TensorProto.DOUBLE):
        """Append the update of every parameter to ``builder``.

        Parameters
        ----------
        builder : GraphBuilder
            Receives the nodes.
        params, grads : list of str
            Names of the parameters and of their gradients, aligned.
        states : dict
            ``{param: {state_name: value name}}`` with every name of
            :attr:`state_names` for every parameter (may be empty when the
            optimizer has no state).
        learning_rate : str or None
            Name of a scalar float tensor (float32 in the artifacts; float64
            keeps a float64 update exact). Unused (may be None) with
            ``scalars``.
        step : str or None
            Name of a scalar numeric tensor (int64 in the artifacts): the
            1-based number of the update being made. Unused (may be None)
            with ``scalars``.
        elem_types : list of int, optional
            ``TensorProto`` element type of each parameter. Without it, the
            graph converts scalars with ``CastLike`` (opset >= 15).
        updated_names : dict, optional
            Exact output names: maps a parameter name or a state value name
            to the name its updated value must have (e.g. ``'W' ->
            'W.updated'``). The names are reserved in ``builder``. Names not
            listed get generated names.
        scalars : dict, optional
            ``{scalar name: value name}`` with a scalar tensor for each of
            :attr:`scalar_names`, holding what :meth:`host_scalars` computes
            for this step: the graph uses them instead of computing them from
            ``learning_rate`` and ``step``.
        scalar_elem_type : int, default=TensorProto.DOUBLE
            Element type of the ``scalars`` tensors. Those of a parameter's
            dtype are used as they are, the others are cast (fed in the
            parameters' dtype, they save a ``Cast`` per step).

        Returns
        -------
        new_params : list of str
            Names of the updated parameters, aligned with ``params``.
        new_states : dict
            ``{param: {state_name: updated value name}}``.

        Raises
        ------
        ValueError
            If the lists are not aligned, a state is missing, or ``scalars``
            does not name exactly :attr:`scalar_names`.
        TypeError
            If an element type is not float or double.

        Examples
        --------
        >>> from onnx import TensorProto
        >>> from ortlearn.graph import GraphBuilder
        >>> b = GraphBuilder(prefix="opt_")
        >>> new_params, new_states = SGD(momentum=0.9).build(
        ...     b, ["W"], ["W_grad"], {"W": {"momentum": "W_v"}}, "lr", "step",
        ...     elem_types=[TensorProto.FLOAT], updated_names={"W": "W_new"})
        >>> new_params
        ['W_new']
        """
        params, grads = list(params), list(grads)
        if len(params) != len(grads):
            raise ValueError(f"Got {len(grads)} gradients for {len(params)} parameters.")
        for p in params:
            missing = set(self.state_names) - set(states.get(p, {}))
            if missing:
                raise ValueError(f"{self.type}: parameter {p!r} lacks state(s) {sorted(missing)}.")
        if scalars is not None and set(scalars) != set(self.scalar_names):
            raise ValueError(f"{self.type} needs the scalars {list(self.scalar_names)}, "
                             f"got {sorted(scalars)}.")
        first_node = len(builder.nodes)
        converter = _Scalars(builder, params, elem_types)
        if scalars is not None:
            converter.declare(scalars.values(), scalar_elem_type)
        if self.clip_grad is not None:
            grads = clip_grad_norm(builder, grads, self.clip_grad, elem_types)
        if scalars is None:
            step_scalars = self.scalar_nodes(builder,
                                              builder.cast(learning_rate, TensorProto.DOUBLE),
                                              builder.cast(step, TensorProto.DOUBLE))
        else:
            step_scalars = dict(scalars)
        new_params, new_states = [], {}
        for i, (p, g) in enumerate(zip(params, grads)):
            typed = functools.partial(converter.get, index=i)
            new_p, new_s = self.update_nodes(builder, typed, step_scalars, p, g, states.get(p, {}))
            new_params.append(new_p)
            new_states[p] = new_s
        if updated_names:
            new_params, new_states = self._apply_names(
                builder, first_node, params, states, new_params, new_states, updated_names)
        return new_params, new_states

    @property
    def scalar_names(self) -> tuple[str, ...]:
        """Names of the per-step scalars: keys of :meth:`host_scalars`, ``build``'s ``scalars``."""
        return tuple(self.host_scalars(1.0, 1))

    def host_scalars(self, learning_rate, step) -> dict[str, np.ndarray]:
        """The per-step scalars of the update, computed on the host in float64.

        The same values the graph computes from ``learning_rate`` and
        ``step`` (to the last bit or so), for :meth:`build`'s ``scalars``.

        Parameters
        ----------
        learning_rate : float or array-like
            Learning rate of each step.
        step : int or array-like
            1-based number of each update, aligned with ``learning_rate``.

        Returns
        -------
        dict
            ``{scalar name: float64 array}`` of the shape of the inputs
            broadcast together.

        Examples
        --------
        >>> Adam().host_scalars([0.1, 0.1], [1, 2])["lr_t"].round(4)
        array([0.0316, 0.0235])
        """
        lr, t = np.broadcast_arrays(np.asarray(learning_rate, dtype=np.float64),
                                    np.asarray(step, dtype=np.float64))
        return {k: np.asarray(v, dtype=np.float64) for k, v in self.scalar_values(lr, t).items()}

    @abstractmethod
    def scalar_values(self, lr, step) -> dict:
        """:meth:`scalar_nodes` in numpy (float64 arrays in, float64 arrays out)."""

    def _apply_names(self, builder, first_node, params, states, new_params, new_states,
                     updated_names):
        """Give the updated values the exact names asked for."""
        mapping = {}
        for p, new_p in zip(params, new_params):
            if p in updated_names:
                mapping[new_p] = builder.reserve(updated_names[p])
            for s in self.state_names:
                old = states[p][s]
                if old in updated_names:
                    mapping[new_states[p][s]] = builder.reserve(updated_names[old])
        _rename_values(builder.nodes[first_node:], mapping)
        new_params = [mapping.get(n, n) for n in new_params]
        new_states = {p: {s: mapping.get(n, n) for s, n in d.items()}
                      for p, d in new_states.items()}
        return new_params, new_states

    @abstractmethod
    def scalar_nodes(self, builder, lr, step) -> dict[str, str]:
        """Float64 scalars shared by all parameters (computed once per step).

        ``lr`` and ``step`` name float64 scalars; returns ``{name: value}``.
        """

    @abstractmethod
    def update_nodes(self, builder, typed, scalars, p, g, state) -> tuple[str, dict[str, str]]:
        """Nodes updating one parameter: ``(new parameter, {state name: new state})``.

        ``typed(value)`` gives a float (or a scalar of ``scalars``) in the
        parameter's dtype; ``p``, ``g`` and ``state`` (``{state name: value}``)
        name the parameter, its gradient and its states.
        """


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
    >>> opt = SGD(momentum=0.9, nesterov=True)
    >>> opt.state_names
    ('momentum',)
    >>> model = build_optimizer_model(opt, {"W": (1, [3, 2])})
    >>> [i.name for i in model.graph.input]
    ['learning_rate', 'step', 'W', 'W.gradient', 'W.momentum']
    """

    def __init__(self, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                 clip_grad: float | None = None):
        super().__init__(clip_grad)
        _check_range("momentum", momentum, 0, 1)
        _check_range("weight_decay", weight_decay, 0, math.inf, high_open=True)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.weight_decay = float(weight_decay)
        self.state_names = ("momentum",) if self.momentum > 0 else ()

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

    def _bias_corrections(self, builder, step):
        """``1 - beta_1**t`` and ``1 - beta_2**t`` as float64 scalars."""
        one = builder.const(1.0, dtype=np.float64)
        return [builder.op("Sub", [one, builder.op(
                    "Pow", [builder.const(beta, dtype=np.float64), step])])
                for beta in (self.beta_1, self.beta_2)]

    def _host_bias_corrections(self, step):
        return 1.0 - self.beta_1 ** step, 1.0 - self.beta_2 ** step

    def _moments(self, builder, typed, g, state):
        """``m = b1 m + (1 - b1) g`` and ``v = b2 v + (1 - b2) g^2``."""
        m = builder.op("Add", [builder.op("Mul", [typed(self.beta_1), state["exp_avg"]]),
                               builder.op("Mul", [typed(1.0 - self.beta_1), g])])
        v = builder.op("Add", [builder.op("Mul", [typed(self.beta_2), state["exp_avg_sq"]]),
                               builder.op("Mul", [typed(1.0 - self.beta_2),
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
    """AdamW with ``torch.optim.AdamW`` semantics (decoupled weight decay).

    The defaults are those of onnxruntime-training's ``onnxblock.optim.AdamW``.
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
        Added to the denominator, >= 0.
    weight_decay : float, default=1e-2
        Decoupled decay coefficient, >= 0.
    bias_correction : bool, default=True
        Correct the moments for their zero initialisation.
    clip_grad : float, optional
        Clip the global norm of all gradients to this value first (as
        ``torch.nn.utils.clip_grad_norm_`` before ``optimizer.step()``).

    Examples
    --------
    >>> opt = AdamW(weight_decay=0.1, clip_grad=1.0)
    >>> opt.hyper["betas"]
    [0.9, 0.999]
    """

    def __init__(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, bias_correction: bool = True,
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


def build_optimizer_model(optimizer: Optimizer,
                          params: Mapping[str, tuple[int, Sequence]]) -> onnx.ModelProto:
    """Write ``optimizer_model.onnx``: one update of every parameter.

    Inputs: ``learning_rate`` (float32 scalar), ``step`` (int64 scalar, 1
    for the first update), then per parameter ``p``: ``p``, ``p.gradient``
    and ``p.<state>`` for each of ``optimizer.state_names``. Outputs:
    ``p.updated`` then ``p.<state>.updated``, per parameter.
    ``metadata_props['ortlearn.optimizer']`` holds
    ``{"type", "params", "states", "hyper"}`` as JSON.

    Parameters
    ----------
    optimizer : SGD, Adam or AdamW
        The update rule.
    params : dict
        ``{name: (elem_type, shape)}`` in the order of the trainable
        parameters; ``elem_type`` is ``TensorProto.FLOAT`` or ``DOUBLE``,
        ``shape`` a list of ints, symbolic names or None (dynamic dims).

    Returns
    -------
    onnx.ModelProto
        A checked model (ai.onnx opset ``DEFAULT_OPSET``).

    Raises
    ------
    ValueError
        If ``params`` is empty or two inputs would share a name.
    TypeError
        If a parameter is not float or double, or ``optimizer`` is not an
        optimizer of this module.

    Examples
    --------
    >>> from onnx import TensorProto
    >>> model = build_optimizer_model(AdamW(), {"W": (TensorProto.FLOAT, [4, 3])})
    >>> [o.name for o in model.graph.output]
    ['W.updated', 'W.exp_avg.updated', 'W.exp_avg_sq.updated']
    """
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"Expected an SGD, Adam or AdamW instance, got {type(optimizer).__name__}.")
    if not params:
        raise ValueError("build_optimizer_model needs at least one parameter.")
    names = list(params)
    elem_types = [params[p][0] for p in names]
    inputs = [helper.make_tensor_value_info(LEARNING_RATE, TensorProto.FLOAT, []),
              helper.make_tensor_value_info(STEP, TensorProto.INT64, [])]
    outputs, states, updated_names = [], {}, {}
    for p, (elem, shape) in params.items():
        shape = list(shape)
        states[p] = {s: f"{p}.{s}" for s in optimizer.state_names}
        for name in (p, f"{p}{GRADIENT_SUFFIX}", *states[p].values()):
            inputs.append(helper.make_tensor_value_info(name, elem, shape))
        for name in (p, *states[p].values()):
            updated_names[name] = f"{name}{UPDATED_SUFFIX}"
            outputs.append(helper.make_tensor_value_info(f"{name}{UPDATED_SUFFIX}", elem, shape))
    input_names = [i.name for i in inputs]
    clashes = sorted({n for n in input_names if input_names.count(n) > 1})
    if clashes:
        raise ValueError(f"Parameter names clash with other optimizer inputs: {clashes}.")

    builder = GraphBuilder(opset=DEFAULT_OPSET, used_names=input_names, prefix="optim_")
    optimizer.build(builder, names, [f"{p}{GRADIENT_SUFFIX}" for p in names], states,
                    LEARNING_RATE, STEP, elem_types=elem_types, updated_names=updated_names)
    graph = helper.make_graph(builder.nodes, "optimizer", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)],
                              producer_name="ortlearn")
    meta = {"type": optimizer.type, "params": names, "states": list(optimizer.state_names),
            "hyper": optimizer.hyper}
    helper.set_model_props(model, {OPTIMIZER_METADATA_KEY: json.dumps(meta)})
    return finalize_model(model)
