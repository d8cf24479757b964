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
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto

from ..graph import (
    FLOAT_TYPES,
    GraphBuilder,
    onnx_to_np_dtype,
)
from ..graph.format import (
    FIRST_ORDER_MOMENTS,
    SECOND_ORDER_MOMENTS,
)

__all__ = ["Optimizer", "clip_grad_norm"]

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
    #: Whether :meth:`update_nodes` updates each element from the same element of the
    #: parameter, gradient and states and the step's scalars only: then one vector of every
    #: parameter updates as each would (the optimizer model's flat layout). A rule that
    #: reads a parameter as a whole (a norm, a trust ratio) leaves it False.
    elementwise: bool = False

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
        >>> from ortlearn.optim import SGD
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
        >>> from ortlearn.optim import Adam
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


