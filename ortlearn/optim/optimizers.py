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
from onnx import TensorProto, helper, numpy_helper

from ..graph import (
    DEFAULT_OPSET,
    FLOAT_TYPES,
    GraphBuilder,
    finalize_model,
    onnx_to_np_dtype,
)
from ..graph.format import (
    FIRST_ORDER_MOMENTS,
    GRADIENT_SUFFIX,
    GRADIENTS_SEQUENCE,
    LEARNING_RATE,
    OPTIMIZER_METADATA_KEY,
    PARAMS_SEQUENCE,
    SECOND_ORDER_MOMENTS,
    STEP,
    UPDATED_FLAG,
    UPDATED_SUFFIX,
)

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "PlainSGD", "TorchAdamW", "build_optimizer_model",
           "clip_grad_norm", "unpack_optimizer_model"]

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

    def complement(self, value: float, index: int) -> str:
        """``1 - value`` computed in parameter ``index``'s dtype, as a float kernel does.

        In float32, ``1 - float32(0.999)`` is not ``float32(1 - 0.999)``
        (4.7e-5 apart relatively): onnxruntime-training's kernels store their
        attributes as float and subtract in float.
        """
        if self.elem_types is not None:
            dtype = onnx_to_np_dtype(self.elem_types[index])
            one = np.asarray(1, dtype=dtype)
            return self.builder.const(one - np.asarray(value, dtype=dtype), dtype=dtype,
                                      hint="hyper")
        return self.builder.op("Sub", [self.get(1.0, index), self.get(float(value), index)])

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
    #: Sequence inputs the optimizer model declares even when no state fills
    #: them (onnxruntime-training's SGD model declares ``first_order_moments``).
    declared_sequences: tuple[str, ...] = ()

    def state_sequences(self) -> dict[str, str]:
        """Name of the optimizer model's sequence input holding each state.

        The first two states are onnxruntime-training's
        ``first_order_moments`` and ``second_order_moments``; further ones
        (a subclass's) are ``<state>_states``.

        Returns
        -------
        dict
            ``{state name: sequence input name}`` in :attr:`state_names` order.
        """
        names = (FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS)
        return {s: names[i] if i < len(names) else f"{s}_states"
                for i, s in enumerate(self.state_names)}

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
            # typed.complement(x): 1 - x in the parameter's dtype (see _Scalars.complement)
            typed.complement = functools.partial(converter.complement, index=i)
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

        The same values, bit for bit, that the graph computes from
        ``learning_rate`` and ``step``, for :meth:`build`'s ``scalars``.

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
    ['learning_rate', 'step', 'params', 'gradients', 'first_order_moments']
    >>> model = build_optimizer_model(opt, {"W": (1, [3, 2])}, layout="tensors")
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


#: Layouts of the optimizer model (see :func:`build_optimizer_model`).
LAYOUTS = ("sequence", "tensors")


def _check_params(optimizer, params) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"Expected an SGD, Adam, AdamW or TorchAdamW instance (an "
                        f"ortlearn.optim.Optimizer), got {type(optimizer).__name__}.")
    if not params:
        raise ValueError("build_optimizer_model needs at least one parameter.")


def _check_clashes(names: Sequence[str]) -> None:
    clashes = sorted({n for n in names if list(names).count(n) > 1})
    if clashes:
        raise ValueError(f"Parameter names clash with other optimizer inputs: {clashes}.")


def _metadata(model: onnx.ModelProto, optimizer: Optimizer, names, layout: str) -> None:
    meta = {"type": optimizer.type, "params": list(names), "states": list(optimizer.state_names),
            "hyper": optimizer.hyper, "layout": layout}
    if layout == "sequence":
        meta["sequences"] = optimizer.state_sequences()
    helper.set_model_props(model, {OPTIMIZER_METADATA_KEY: json.dumps(meta)})


def _names(optimizer: Optimizer, names) -> tuple[dict, dict]:
    """``{p: {state: 'p.state'}}`` and the updated name of every parameter and state."""
    states = {p: {s: f"{p}.{s}" for s in optimizer.state_names} for p in names}
    updated = {}
    for p in names:
        for name in (p, *states[p].values()):
            updated[name] = f"{name}{UPDATED_SUFFIX}"
    return states, updated


class PlainSGD(Optimizer):
    """scikit-learn's ``SGDClassifier``/``SGDRegressor`` update: SGD, ASGD, truncated L1.

    The steps of ``_plain_sgd`` (``sklearn/linear_model/_sgd_fast.pyx.tp``)
    after the gradient, for the update number ``t`` (1-based) with learning
    rate ``lr``::

        p = p - lr * g                            # g: loss and L2 gradients
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

    def __init__(self, l1: float = 0.0, l1_params=("coef",), average: int = 0):
        super().__init__(None)
        _check_range("l1", l1, 0, math.inf, high_open=True)
        if isinstance(average, bool) or int(average) != average or average < 0:
            raise ValueError(f"average must be an int >= 0, got {average!r}.")
        self.l1 = float(l1)
        self.l1_params = tuple(l1_params)
        self.average = int(average)
        names = ("average",) if self.average else ()
        self.state_names = names + (("l1_q", "l1_u") if self.l1 else ())

    @property
    def hyper(self) -> dict:
        return {"l1": self.l1, "l1_params": list(self.l1_params), "average": self.average}

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
        new = b.op("Sub", [p, b.op("Mul", [typed(scalars["lr"]), g])])
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


def build_optimizer_model(optimizer: Optimizer, params: Mapping[str, tuple[int, Sequence]],
                          layout: str = "sequence") -> onnx.ModelProto:
    """Write ``optimizer_model.onnx``: one update of every parameter.

    The default ``layout='sequence'`` follows onnxruntime-training's
    optimizer model (``doc/artifacts_format.md``). Inputs: ``learning_rate``
    (float32, shape [1]), ``step`` (int64, shape [1], 1 for the first
    update), then tensor sequences holding one tensor per parameter, in the
    order of ``params``: ``params``, ``gradients``, then the states,
    ``first_order_moments`` and ``second_order_moments`` (see
    :meth:`Optimizer.state_sequences`; SGD declares ``first_order_moments``
    even without momentum, as onnxruntime-training's SGD model does).
    Outputs: ``updated_flag`` (bool, shape [1], true), ``params.updated``,
    then ``<state sequence>.updated``.

    ``layout='tensors'`` is ortlearn's internal form (what
    :class:`~ortlearn.training.TrainingSession` runs, see
    :func:`unpack_optimizer_model`): inputs ``learning_rate`` and ``step``
    (scalars), then per parameter ``p``: ``p``, ``p.gradient`` and
    ``p.<state>``; outputs ``p.updated`` then ``p.<state>.updated``. Its
    parameters may mix float and double; a sequence holds one element type.

    ``metadata_props['ortlearn.optimizer']`` holds ``{"type", "params",
    "states", "hyper", "layout"}`` (and ``"sequences"``, the sequence of each
    state) as JSON.

    Parameters
    ----------
    optimizer : Optimizer
        The update rule (:class:`SGD`, :class:`Adam`, :class:`AdamW`,
        :class:`TorchAdamW` or a subclass of :class:`Optimizer`).
    params : dict
        ``{name: (elem_type, shape)}`` in the order of the trainable
        parameters; ``elem_type`` is ``TensorProto.FLOAT`` or ``DOUBLE``,
        ``shape`` a list of ints, symbolic names or None (dynamic dims).
    layout : {'sequence', 'tensors'}, default='sequence'
        The form of the inputs and outputs.

    Returns
    -------
    onnx.ModelProto
        A checked model (ai.onnx opset ``DEFAULT_OPSET``).

    Raises
    ------
    ValueError
        If ``params`` is empty, two inputs would share a name, the layout is
        unknown, or (sequence layout) the parameters do not share one
        element type.
    TypeError
        If a parameter is not float or double, or ``optimizer`` is not an
        :class:`Optimizer`.

    Examples
    --------
    >>> from onnx import TensorProto
    >>> model = build_optimizer_model(AdamW(), {"W": (TensorProto.FLOAT, [4, 3])})
    >>> [i.name for i in model.graph.input]
    ['learning_rate', 'step', 'params', 'gradients', 'first_order_moments', \
'second_order_moments']
    >>> [o.name for o in model.graph.output]
    ['updated_flag', 'params.updated', 'first_order_moments.updated', \
'second_order_moments.updated']
    """
    _check_params(optimizer, params)
    if layout == "tensors":
        return _tensor_model(optimizer, params)
    if layout != "sequence":
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
    return _sequence_model(optimizer, params)


def _tensor_model(optimizer: Optimizer, params) -> onnx.ModelProto:
    names = list(params)
    elem_types = [params[p][0] for p in names]
    states, updated_names = _names(optimizer, names)
    inputs = [helper.make_tensor_value_info(LEARNING_RATE, TensorProto.FLOAT, []),
              helper.make_tensor_value_info(STEP, TensorProto.INT64, [])]
    outputs = []
    for p, (elem, shape) in params.items():
        shape = list(shape)
        for name in (p, f"{p}{GRADIENT_SUFFIX}", *states[p].values()):
            inputs.append(helper.make_tensor_value_info(name, elem, shape))
        for name in (p, *states[p].values()):
            outputs.append(helper.make_tensor_value_info(updated_names[name], elem, shape))
    input_names = [i.name for i in inputs]
    _check_clashes(input_names)

    builder = GraphBuilder(opset=DEFAULT_OPSET, used_names=input_names, prefix="optim_")
    optimizer.build(builder, names, [f"{p}{GRADIENT_SUFFIX}" for p in names], states,
                    LEARNING_RATE, STEP, elem_types=elem_types, updated_names=updated_names)
    return _finish(builder, inputs, outputs, optimizer, names, "tensors")


def _finish(builder, inputs, outputs, optimizer, names, layout,
            value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph(builder.nodes, "optimizer", inputs, outputs,
                              value_info=list(value_info))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)],
                              producer_name="ortlearn")
    _metadata(model, optimizer, names, layout)
    return finalize_model(model)


def _sequence_model(optimizer: Optimizer, params) -> onnx.ModelProto:
    names = list(params)
    elem_types = {params[p][0] for p in names}
    if len(elem_types) > 1:
        found = {p: TensorProto.DataType.Name(params[p][0]) for p in names}
        raise ValueError(
            "The optimizer model passes the parameters as one tensor sequence (onnxruntime-"
            f"training's layout), which holds one element type; the parameters have {found}. "
            "Give them one type (cast the model's initializers), or build the model with "
            "layout='tensors'.")
    elem = elem_types.pop()
    states, updated_names = _names(optimizer, names)
    sequences = optimizer.state_sequences()
    declared = list(dict.fromkeys([*sequences.values(), *optimizer.declared_sequences]))
    seq_inputs = [PARAMS_SEQUENCE, GRADIENTS_SEQUENCE, *declared]
    inputs = [helper.make_tensor_value_info(LEARNING_RATE, TensorProto.FLOAT, [1]),
              helper.make_tensor_value_info(STEP, TensorProto.INT64, [1])]
    inputs += [helper.make_tensor_sequence_value_info(s, elem, None) for s in seq_inputs]
    seq_outputs = [PARAMS_SEQUENCE, *sequences.values()]
    outputs = [helper.make_tensor_value_info(UPDATED_FLAG, TensorProto.BOOL, [1])]
    outputs += [helper.make_tensor_sequence_value_info(f"{s}{UPDATED_SUFFIX}", elem, None)
                for s in seq_outputs]
    # the tensors unpacked from the sequences keep the names of the tensor layout
    tensor_names = [n for p in names for n in (p, f"{p}{GRADIENT_SUFFIX}", *states[p].values())]
    reserved = [i.name for i in inputs] + [o.name for o in outputs]
    _check_clashes(reserved + tensor_names + list(updated_names.values()))

    builder = GraphBuilder(opset=DEFAULT_OPSET, used_names=reserved + tensor_names,
                           prefix="optim_")
    # [1] -> scalar: the per-step scalars keep the shape of each parameter
    lr = builder.squeeze(LEARNING_RATE, [0])
    step = builder.squeeze(STEP, [0])
    for i, p in enumerate(names):
        position = builder.const(np.int64(i), hint="position")
        builder.op("SequenceAt", [PARAMS_SEQUENCE, position], outputs=[p])
        builder.op("SequenceAt", [GRADIENTS_SEQUENCE, position], outputs=[f"{p}{GRADIENT_SUFFIX}"])
        for s, name in states[p].items():
            builder.op("SequenceAt", [sequences[s], position], outputs=[name])
    optimizer.build(builder, names, [f"{p}{GRADIENT_SUFFIX}" for p in names], states,
                    lr, step, elem_types=[elem] * len(names), updated_names=updated_names)
    # the update is unconditional: the flag is always true, as the kernels' without
    # their optional update_signal input
    builder.op("Constant", [], outputs=[UPDATED_FLAG],
               value=numpy_helper.from_array(np.array([True]), UPDATED_FLAG))
    builder.op("SequenceConstruct", [updated_names[p] for p in names],
               outputs=[f"{PARAMS_SEQUENCE}{UPDATED_SUFFIX}"])
    for s, seq in sequences.items():
        builder.op("SequenceConstruct", [updated_names[states[p][s]] for p in names],
                   outputs=[f"{seq}{UPDATED_SUFFIX}"])
    # the types and shapes of the tensors in the sequences, which unpacking reads back
    value_info = []
    for p in names:
        own = (p, *states[p].values())
        value_info += [helper.make_tensor_value_info(name, elem, list(params[p][1]))
                       for name in (*own, f"{p}{GRADIENT_SUFFIX}",
                                    *(updated_names[n] for n in own))]
    return _finish(builder, inputs, outputs, optimizer, names, "sequence", value_info)


def _constant_ints(graph: onnx.GraphProto) -> dict[str, int]:
    """``{value name: int}`` for the integer scalars of Constant nodes and initializers."""
    found = {}
    tensors = [(t.name, t) for t in graph.initializer]
    tensors += [(n.output[0], a.t) for n in graph.node if n.op_type == "Constant"
                for a in n.attribute if a.name == "value"]
    for name, tensor in tensors:
        array = numpy_helper.to_array(tensor)
        if array.size == 1 and np.issubdtype(array.dtype, np.integer):
            found[name] = int(array.reshape(()))
    return found


def unpack_optimizer_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """The tensor layout of a sequence-layout optimizer model: the same update, no sequences.

    Each ``SequenceAt(<sequence input>, <constant i>)`` becomes a graph input
    (the tensor it extracted), each ``SequenceConstruct`` feeding a graph
    output is replaced by its tensors as outputs, ``updated_flag`` is dropped.
    What remains is the update itself, which a
    :class:`~ortlearn.training.TrainingSession` runs on tensors bound in
    place on the device (``IOBinding`` has no sequence of device tensors:
    a sequence would be copied through the host at every step). A model
    already in the tensor layout is returned unchanged.

    Parameters
    ----------
    model : onnx.ModelProto
        An optimizer model of :func:`build_optimizer_model`.

    Returns
    -------
    onnx.ModelProto
        A new model; ``learning_rate`` and ``step`` keep their shape [1].

    Raises
    ------
    ValueError
        If a sequence input is read other than by ``SequenceAt`` at a
        constant position, or a sequence output is not built by
        ``SequenceConstruct``.
    """
    graph = model.graph
    seq_inputs = {i.name: i.type.sequence_type.elem_type.tensor_type.elem_type
                  for i in graph.input if i.type.HasField("sequence_type")}
    if not seq_inputs:
        return model
    positions = _constant_ints(graph)
    infos = {v.name: v for v in graph.value_info}

    def tensor(name, elem):
        return infos.get(name) or helper.make_tensor_value_info(name, elem, None)

    producers = {o: n for n in graph.node for o in n.output}
    new_inputs = [i for i in graph.input if i.name not in seq_inputs]
    new_outputs, dropped = [], set()
    for node in graph.node:
        used = [x for x in node.input if x in seq_inputs]
        if not used:
            continue
        if node.op_type != "SequenceAt" or node.input[1] not in positions:
            raise ValueError(
                f"Cannot unpack the optimizer model: node {node.name!r} ({node.op_type}) "
                f"reads the sequence {used[0]!r} other than by SequenceAt at a constant "
                "position.")
        new_inputs.append(tensor(node.output[0], seq_inputs[node.input[0]]))
        dropped.add(id(node))
    for out in graph.output:
        if not out.type.HasField("sequence_type"):
            if out.name != UPDATED_FLAG:
                new_outputs.append(out)
            continue
        node = producers.get(out.name)
        if node is None or node.op_type != "SequenceConstruct":
            raise ValueError(f"Cannot unpack the optimizer model: its output {out.name!r} is "
                             "not built by SequenceConstruct.")
        elem = out.type.sequence_type.elem_type.tensor_type.elem_type
        new_outputs += [tensor(x, elem) for x in node.input]
        dropped.add(id(node))
    kept = [n for n in graph.node if id(n) not in dropped]
    kept = _prune(kept, [o.name for o in new_outputs])
    boundary = {v.name for v in new_inputs + new_outputs}
    new_graph = helper.make_graph(kept, graph.name, new_inputs, new_outputs,
                                  initializer=list(graph.initializer),
                                  value_info=[v for v in graph.value_info
                                              if v.name not in boundary])
    unpacked = helper.make_model(new_graph, opset_imports=list(model.opset_import),
                                 producer_name=model.producer_name)
    unpacked.ir_version = model.ir_version
    unpacked.metadata_props.extend(model.metadata_props)
    return unpacked


def _prune(nodes, outputs: Sequence[str]) -> list:
    """The nodes ``outputs`` depend on, in their order."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(node.input)
    return kept[::-1]
