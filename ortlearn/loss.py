"""Add a scalar loss output (and weight penalties) to an ONNX graph.

:func:`add_loss_output` turns a prediction graph ``Y = f(W, X)`` into a
graph ``loss = L(f(W, X), label, sample_weight) + R(W)`` that the gradient
builder differentiates with respect to the trainable initializers ``W``.

Every user of a loss reads the same pieces of this module (the onnxblock
loss blocks and the estimators' objectives as well as
:func:`add_loss_output`):

- :data:`SCORES`, the one table of scores: a :class:`Score` per name, with
  its aliases, its keyword parameters and the function that emits its
  unreduced loss (:func:`get_score` resolves a name or an alias);
- :func:`elementwise_loss` emits the unreduced loss of one score name,
- :func:`reduce_rows` averages it over the columns, then over the rows
  (optionally weighted),
- :func:`penalty_terms` emits the L1/L2 penalty of named weights.

Examples
--------
>>> from ortlearn.loss import SCORES, SCORE_NAMES, get_score
>>> list(SCORES)[:6]
['squared_error', 'absolute_error', 'elastic', 'huber', 'log', 'cross_entropy']
>>> list(SCORES)[6:]  # doctest: +NORMALIZE_WHITESPACE
['hinge', 'squared_hinge', 'modified_huber', 'perceptron', 'epsilon_insensitive',
 'squared_epsilon_insensitive', 'pinball', 'poisson', 'gamma', 'tweedie']
>>> get_score('l1').name
'absolute_error'
>>> dict(SCORES['huber'].params)
{'epsilon': 1.0}
>>> SCORE_NAMES[:4]
('squared_error', 'l2', 'absolute_error', 'l1')
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import onnx
from onnx import TensorProto, helper

from .graph import (
    FLOAT_TYPES,
    GraphBuilder,
    elem_type_of,
    finalize_model,
    invalid_model_errors,
    load_model,
    mark_class_labels,
    np_dtype_to_onnx,
    onnx_to_np_dtype,
    shape_of,
    value_info_map,
)

__all__ = [
    "SCORES",
    "SCORE_NAMES",
    "Score",
    "add_loss_output",
    "elementwise_loss",
    "get_score",
    "penalty_terms",
    "reduce_rows",
]

_PENALTY_KEYS = ("l1", "l2")


@dataclass(frozen=True)
class Score:
    """One entry of :data:`SCORES`: a score name and how to emit its loss.

    Parameters
    ----------
    name : str
        Canonical name (a ``score_name`` of :func:`add_loss_output`).
    emit : callable
        ``emit(builder, pred, label, dtype, **params) -> str``: adds the
        nodes of the unreduced (per-element) loss to a
        :class:`~ortlearn.graph.GraphBuilder` and returns the name of its
        result, of shape ``pred.shape`` ((n, 1) for class labels). ``dtype``
        is the numpy float type of ``pred`` (that of the constants).
    aliases : tuple of str, default=()
        Other names of the same score.
    params : mapping, default={}
        The keyword parameters ``emit`` takes, with their defaults (read
        only). Each must be a finite real >= 0.
    positive : tuple of str, default=()
        Those of ``params`` that must also be > 0.
    class_labels : bool, default=False
        True when the label holds int64 class indices of shape (n,) (or
        (n, 1)); otherwise it has the prediction's type and shape.
    check_shape : callable, default=None
        ``check_shape(pred_name, shape)``: raises a ValueError when the
        prediction's shape does not suit the score.
    """

    name: str
    emit: Callable[..., str]
    aliases: tuple[str, ...] = ()
    params: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    positive: tuple[str, ...] = ()
    class_labels: bool = False
    check_shape: Callable[[str, tuple], None] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The canonical name, then the aliases."""
        return (self.name, *self.aliases)

    def resolve_params(self, **kwargs) -> dict[str, float]:
        """The defaults of :attr:`params` updated with ``kwargs``, checked.

        Raises
        ------
        TypeError
            For a keyword the score does not take (named in the message).
        ValueError
            For a value that is not a finite real >= 0 (or > 0 where
            :attr:`positive` says so).

        Examples
        --------
        >>> from ortlearn.loss import SCORES
        >>> SCORES['elastic'].resolve_params(l1_weight=0.1)
        {'l1_weight': 0.1, 'l2_weight': 0.5}
        """
        unknown = sorted(set(kwargs) - set(self.params))
        if unknown:
            accepted = ", ".join(self.params) if self.params else "no keyword argument"
            raise TypeError(
                f"Unexpected keyword argument(s) {unknown} for score_name={self.name!r}, "
                f"which takes {accepted}."
            )
        params = {**self.params, **kwargs}
        for key, value in params.items():
            _check_coefficient(value, key)
            if key in self.positive and value == 0:
                raise ValueError(f"{key} must be > 0 for the {self.name} loss, got 0.")
        return params


def _check_coefficient(value, what: str) -> float:
    """``value`` as a float; ValueError unless it is a finite real >= 0."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not np.isfinite(value) or value < 0):
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}.")
    return float(value)


# ---------------------------------------------------------------- scores
# One function per score: emit(builder, pred, label, dtype, **params) -> name.

def _squared_error(builder: GraphBuilder, pred: str, label: str, dtype) -> str:
    diff = builder.op("Sub", [pred, label])
    return builder.op("Mul", [diff, diff])


def _absolute_error(builder: GraphBuilder, pred: str, label: str, dtype) -> str:
    diff = builder.op("Sub", [pred, label])
    return builder.op("Abs", [diff])


def _elastic(builder: GraphBuilder, pred: str, label: str, dtype, *,
             l1_weight: float, l2_weight: float) -> str:
    diff = builder.op("Sub", [pred, label])
    l1_coef = builder.const(l1_weight, dtype)
    l2_coef = builder.const(l2_weight, dtype)
    l1 = builder.op("Mul", [l1_coef, builder.op("Abs", [diff])])
    l2 = builder.op("Mul", [l2_coef, builder.op("Mul", [diff, diff])])
    return builder.op("Add", [l1, l2])


def _huber(builder: GraphBuilder, pred: str, label: str, dtype, *, epsilon: float) -> str:
    # With a = |d| and m = min(a, eps): 0.5 m^2 + eps (a - m) equals 0.5 d^2
    # when a <= eps and eps (a - eps / 2) otherwise, without a Where.
    diff = builder.op("Sub", [pred, label])
    absd = builder.op("Abs", [diff])
    eps = builder.const(epsilon, dtype)
    clipped = builder.op("Min", [absd, eps])
    quad = builder.op("Mul", [builder.const(0.5, dtype), builder.op("Mul", [clipped, clipped])])
    lin = builder.op("Mul", [eps, builder.op("Sub", [absd, clipped])])
    return builder.op("Add", [quad, lin])


def _binary_log_loss(builder: GraphBuilder, score: str, label: str, dtype) -> str:
    # max(s, 0) - y s + log(1 + exp(-|s|)): exp never overflows. Softplus is
    # avoided on purpose: some onnxruntime builds lack its float64 kernel.
    # max(s, 0) is written (s + |s|) / 2: with the subgradients Relu'(0) = 0 and
    # Sign(0) = 0 of the reverse pass, Relu would make the gradient at s = 0 (the
    # zero weights every linear solver starts from) -y instead of 1/2 - y.
    one = builder.const(1.0, dtype)
    absolute = builder.op("Abs", [score])
    tail = builder.op("Exp", [builder.op("Neg", [absolute])])
    log1p = builder.op("Log", [builder.op("Add", [one, tail])])
    positive = builder.op("Mul", [builder.const(0.5, dtype),
                                  builder.op("Add", [score, absolute])])
    hinge = builder.op("Sub", [positive, builder.op("Mul", [label, score])])
    return builder.op("Add", [hinge, log1p])


def _cross_entropy(builder: GraphBuilder, logits: str, label: str, dtype) -> str:
    # GatherElements fails on an out-of-range class index instead of
    # silently contributing zero as a one-hot product would.
    logp = builder.op("LogSoftmax", [logits], axis=1)
    index = builder.op("Reshape", [label, builder.ints([-1, 1], hint="shape")])
    picked = builder.op("GatherElements", [logp, index], axis=1)
    return builder.op("Neg", [picked])


def _margin(builder: GraphBuilder, score: str, label: str, dtype) -> str:
    """``z = (2 y - 1) s``: the score signed by the label (labels in {0, 1})."""
    sign = builder.op("Sub", [builder.op("Mul", [builder.const(2.0, dtype), label]),
                              builder.const(1.0, dtype)])
    return builder.op("Mul", [sign, score])


def _threshold_loss(builder: GraphBuilder, score: str, label: str, dtype,
                    threshold: float) -> str:
    """``max(0, threshold - z)`` with scikit-learn's subgradient ``-1`` at ``z = threshold``.

    A ``Where`` on ``z <= threshold`` rather than a ``Relu``, whose gradient
    is 0 there: the perceptron (threshold 0) would never leave the zero
    weights it starts from, where every margin is 0.
    """
    margin = _margin(builder, score, label, dtype)
    limit = builder.const(threshold, dtype)
    return builder.op("Where", [builder.op("LessOrEqual", [margin, limit]),
                                builder.op("Sub", [limit, margin]), builder.const(0.0, dtype)])


def _hinge(builder: GraphBuilder, score: str, label: str, dtype) -> str:
    return _threshold_loss(builder, score, label, dtype, 1.0)


def _squared_hinge(builder: GraphBuilder, score: str, label: str, dtype) -> str:
    hinge = _hinge(builder, score, label, dtype)
    return builder.op("Mul", [hinge, hinge])


def _perceptron(builder: GraphBuilder, score: str, label: str, dtype) -> str:
    return _threshold_loss(builder, score, label, dtype, 0.0)


def _modified_huber(builder: GraphBuilder, score: str, label: str, dtype) -> str:
    # a = max(0, 1 - z), m = min(a, 2): m^2 + 4 (a - m) is a^2 for z >= -1 and -4 z below,
    # scikit-learn's piecewise form without a Where.
    hinge = _hinge(builder, score, label, dtype)
    clipped = builder.op("Min", [hinge, builder.const(2.0, dtype)])
    linear = builder.op("Mul", [builder.const(4.0, dtype),
                                builder.op("Sub", [hinge, clipped])])
    return builder.op("Add", [builder.op("Mul", [clipped, clipped]), linear])


def _epsilon_insensitive(builder: GraphBuilder, pred: str, label: str, dtype, *,
                         epsilon: float) -> str:
    absd = builder.op("Abs", [builder.op("Sub", [pred, label])])
    return builder.op("Relu", [builder.op("Sub", [absd, builder.const(epsilon, dtype)])])


def _squared_epsilon_insensitive(builder: GraphBuilder, pred: str, label: str, dtype, *,
                                 epsilon: float) -> str:
    excess = _epsilon_insensitive(builder, pred, label, dtype, epsilon=epsilon)
    return builder.op("Mul", [excess, excess])


def _pinball(builder: GraphBuilder, pred: str, label: str, dtype, *, quantile: float) -> str:
    # max(q d, (q - 1) d) = q d + max(0, -d) with d = y - p.
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1) for the pinball loss, got {quantile}.")
    diff = builder.op("Sub", [label, pred])
    return builder.op("Add", [builder.op("Mul", [builder.const(quantile, dtype), diff]),
                              builder.op("Relu", [builder.op("Neg", [diff])])])


def _poisson(builder: GraphBuilder, raw: str, label: str, dtype) -> str:
    # Half the Poisson deviance of mean exp(raw), without the terms of y alone.
    return builder.op("Sub", [builder.op("Exp", [raw]), builder.op("Mul", [label, raw])])


def _gamma(builder: GraphBuilder, raw: str, label: str, dtype) -> str:
    # Half the Gamma deviance of mean exp(raw), without the terms of y alone.
    return builder.op("Add", [raw, builder.op("Mul", [label, builder.op(
        "Exp", [builder.op("Neg", [raw])])])])


def _tweedie(builder: GraphBuilder, raw: str, label: str, dtype, *, power: float) -> str:
    """Half the Tweedie deviance of mean exp(raw), without the terms of y alone."""
    if power == 0:
        mean = builder.op("Exp", [raw])
        diff = builder.op("Sub", [mean, label])
        return builder.op("Mul", [builder.const(0.5, dtype), builder.op("Mul", [diff, diff])])
    if power == 1:
        return _poisson(builder, raw, label, dtype)
    if power == 2:
        return _gamma(builder, raw, label, dtype)
    if power < 1:
        raise ValueError(f"power must be 0 or >= 1 for the Tweedie loss (no distribution "
                         f"exists for 0 < power < 1), got {power}.")

    def scaled_exp(k: float) -> str:  # exp(k raw) / k
        return builder.op("Mul", [builder.const(1.0 / k, dtype), builder.op(
            "Exp", [builder.op("Mul", [builder.const(k, dtype), raw])])])

    return builder.op("Sub", [scaled_exp(2 - power),
                              builder.op("Mul", [label, scaled_exp(1 - power)])])


def _check_binary_scores(pred: str, shape) -> None:
    """(n,) or (n, 1), an unknown second dimension accepted."""
    if len(shape) == 1 or (len(shape) == 2
                           and (shape[1] == 1 or not isinstance(shape[1], int))):
        return
    raise ValueError(
        f"score_name='log' needs scores of shape (n,) or (n, 1); {pred!r} has shape "
        f"{shape}. Use score_name='cross_entropy' for multiclass logits."
    )


def _check_logits(pred: str, shape) -> None:
    if len(shape) != 2:
        raise ValueError(
            f"score_name='cross_entropy' needs logits of shape (n, n_classes); "
            f"{pred!r} has rank {len(shape)}."
        )


def _table(*scores: Score) -> Mapping[str, Score]:
    names = [name for score in scores for name in score.names]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ValueError(f"Score name(s) {duplicated} appear twice in the table.")
    return MappingProxyType({score.name: score for score in scores})


#: The scores of :func:`add_loss_output`, by canonical name (read only).
#: Aliases are not keys: :func:`get_score` resolves them.
SCORES: Mapping[str, Score] = _table(
    Score("squared_error", _squared_error, aliases=("l2",)),
    Score("absolute_error", _absolute_error, aliases=("l1",)),
    Score("elastic", _elastic,
          params=MappingProxyType({"l1_weight": 0.5, "l2_weight": 0.5})),
    Score("huber", _huber, params=MappingProxyType({"epsilon": 1.0}), positive=("epsilon",)),
    Score("log", _binary_log_loss, check_shape=_check_binary_scores),
    Score("cross_entropy", _cross_entropy, class_labels=True, check_shape=_check_logits),
    Score("hinge", _hinge),
    Score("squared_hinge", _squared_hinge),
    Score("modified_huber", _modified_huber),
    Score("perceptron", _perceptron),
    Score("epsilon_insensitive", _epsilon_insensitive,
          params=MappingProxyType({"epsilon": 0.1})),
    Score("squared_epsilon_insensitive", _squared_epsilon_insensitive,
          params=MappingProxyType({"epsilon": 0.1})),
    Score("pinball", _pinball, aliases=("quantile",),
          params=MappingProxyType({"quantile": 0.5}), positive=("quantile",)),
    Score("poisson", _poisson),
    Score("gamma", _gamma),
    Score("tweedie", _tweedie, params=MappingProxyType({"power": 1.5})),
)

#: Valid values of ``score_name`` in :func:`add_loss_output` (names and aliases).
SCORE_NAMES: tuple[str, ...] = tuple(name for score in SCORES.values() for name in score.names)

_BY_NAME = MappingProxyType({name: score for score in SCORES.values() for name in score.names})


def get_score(score_name: str) -> Score:
    """The entry of :data:`SCORES` named ``score_name`` (a name or an alias).

    Raises
    ------
    ValueError
        For an unknown name (named in the message, with the valid ones).

    Examples
    --------
    >>> from ortlearn.loss import get_score
    >>> get_score('l2').name
    'squared_error'
    """
    score = _BY_NAME.get(score_name) if isinstance(score_name, str) else None
    if score is None:
        raise ValueError(
            f"Unknown score_name {score_name!r}; expected one of {', '.join(SCORE_NAMES)}."
        )
    return score


def elementwise_loss(builder: GraphBuilder, score_name: str, pred: str, label: str,
                     dtype=np.float32, **params) -> str:
    """Emit the unreduced loss between ``pred`` and ``label``; return its name.

    Parameters
    ----------
    builder : GraphBuilder
    score_name : str
        One of :data:`SCORE_NAMES`.
    pred, label : str
        Names of the prediction and of the expected values. For
        ``'cross_entropy'``, ``pred`` holds logits of shape (n, k) and
        ``label`` int64 class indices of shape (n,) or (n, 1); otherwise
        both have the same shape.
    dtype : numpy dtype, default=np.float32
        Float type of ``pred`` (used for the constants).
    **params
        Parameters of the score (``l1_weight``, ``l2_weight``, ``epsilon``:
        see :attr:`Score.params`).

    Returns
    -------
    name : str
        Loss of shape ``pred.shape`` ((n, 1) for ``'cross_entropy'``).

    Raises
    ------
    ValueError
        For an unknown score name or a bad parameter value.
    TypeError
        For a parameter the score does not take.

    Examples
    --------
    >>> from ortlearn.graph import GraphBuilder
    >>> from ortlearn.loss import elementwise_loss
    >>> b = GraphBuilder()
    >>> out = elementwise_loss(b, 'l1', 'pred', 'label')
    >>> [node.op_type for node in b.nodes]
    ['Sub', 'Abs']
    """
    score = get_score(score_name)
    return score.emit(builder, pred, label, dtype, **score.resolve_params(**params))


def reduce_rows(builder: GraphBuilder, per_elem: str, weight: str | None = None,
                output: str | None = None) -> str:
    """Reduce an elementwise loss of shape (n,) or (n, ...) to a scalar.

    Each row is first averaged over its other dimensions; the result is the
    mean of these row losses, or their weighted mean ``sum(w l) / sum(w)``
    when ``weight`` (shape (n,)) is given.

    Parameters
    ----------
    builder : GraphBuilder
    per_elem : str
        Name of the elementwise loss.
    weight : str, default=None
        Name of the sample weights, of shape (n,).
    output : str, default=None
        Name of the result (a fresh name if None).

    Returns
    -------
    name : str
        The scalar loss.
    """
    flat = builder.op("Reshape", [per_elem, builder.ints([0, -1], hint="shape")])
    rows = builder.reduce("ReduceMean", flat, axes=[1], keepdims=0)
    if weight is None:
        return builder.reduce("ReduceMean", rows, keepdims=0, output=output)
    total = builder.reduce("ReduceSum", builder.op("Mul", [rows, weight]), keepdims=0)
    norm = builder.reduce("ReduceSum", weight, keepdims=0)
    return builder.op("Div", [total, norm], outputs=[output] if output else None)


def _normalize_penalty(penalty) -> dict[str, dict[str, float]]:
    """``{name: b}`` or ``{name: {'l1': a, 'l2': b}}`` -> ``{name: {'l1': a, 'l2': b}}``."""
    if penalty is None:
        return {}
    if not isinstance(penalty, dict):
        raise TypeError(
            "penalty must be a dict {weight_name: l2} or {weight_name: {'l1': a, 'l2': b}}, "
            f"got {type(penalty).__name__}."
        )
    normalized = {}
    for name, spec in penalty.items():
        if not isinstance(spec, dict):
            spec = {"l2": spec}
        unknown = sorted(set(spec) - set(_PENALTY_KEYS))
        if unknown:
            raise ValueError(
                f"Unknown penalty key(s) {unknown} for {name!r}; expected 'l1' and/or 'l2'."
            )
        normalized[name] = {
            key: spec[key] if isinstance(spec.get(key), str)
            else _check_coefficient(spec.get(key, 0.0), f"Penalty {key} on {name!r}")
            for key in _PENALTY_KEYS
        }
    return normalized


def penalty_terms(builder: GraphBuilder, penalty, dtypes: dict[str, int],
                  dtype=np.float32) -> str | None:
    """Emit ``sum_w l1 * sum|w| + l2 * sum w^2``; return its name (None if zero).

    Parameters
    ----------
    builder : GraphBuilder
    penalty : dict or None
        ``{name: l2}`` or ``{name: {'l1': a, 'l2': b}}``; a coefficient may be
        the name of a scalar value of the weight's dtype holding it (a
        hyper-parameter the graph reads, :data:`~ortlearn.graph.format.HYPER_PREFIX`).
    dtypes : dict
        ONNX element type of every weight that may be penalised.
    dtype : numpy dtype, default=np.float32
        Type of the result (each term is cast to it if needed).

    Returns
    -------
    name : str or None
        The scalar penalty; None when every coefficient is zero.

    Raises
    ------
    ValueError
        For a name missing from ``dtypes``, an unknown key or a coefficient
        that is not a finite real >= 0.
    TypeError
        For a weight that is not float32/float64, or a penalty that is not
        a dict.

    Examples
    --------
    >>> from onnx import TensorProto
    >>> from ortlearn.graph import GraphBuilder
    >>> from ortlearn.loss import penalty_terms
    >>> b = GraphBuilder()
    >>> penalty_terms(b, {'W': 0.0}, {'W': TensorProto.FLOAT}) is None
    True
    >>> out = penalty_terms(b, {'W': {'l1': 0.5}}, {'W': TensorProto.FLOAT})
    >>> [node.op_type for node in b.nodes]
    ['Abs', 'ReduceSum', 'Constant', 'Mul']
    """
    normalized = _normalize_penalty(penalty)
    missing = sorted(set(normalized) - set(dtypes))
    if missing:
        raise ValueError(
            f"penalty names unknown weight(s) {missing}; available initializers: "
            f"{sorted(dtypes)}."
        )
    target = np_dtype_to_onnx(dtype)
    terms = []
    for name, coefs in normalized.items():
        if dtypes[name] not in FLOAT_TYPES:
            raise TypeError(
                f"Cannot penalise {name!r}: it is a {TensorProto.DataType.Name(dtypes[name])} "
                "tensor, not float or double."
            )
        wdtype = onnx_to_np_dtype(dtypes[name])
        parts = []
        if coefs["l1"]:
            parts.append(_scaled_sum(builder, builder.op("Abs", [name]), coefs["l1"], wdtype))
        if coefs["l2"]:
            # No squares the size of the weight (the same sum as ReduceSum of Mul).
            parts.append(_scaled_sum(builder, name, coefs["l2"], wdtype, "ReduceSumSquare"))
        if parts:
            term = _add_all(builder, parts)
            terms.append(term if dtypes[name] == target else builder.cast(term, target))
    return _add_all(builder, terms) if terms else None


def _scaled_sum(builder: GraphBuilder, x: str, coef: float | str, dtype,
                op: str = "ReduceSum") -> str:
    total = builder.reduce(op, x, keepdims=0)
    factor = coef if isinstance(coef, str) else builder.const(coef, dtype)
    return builder.op("Mul", [factor, total])


def _add_all(builder: GraphBuilder, names: list[str]) -> str:
    result = names[0]
    for name in names[1:]:
        result = builder.op("Add", [result, name])
    return result


def _select_prediction(model: onnx.ModelProto, output_index) -> str:
    """Name of the value used as prediction."""
    outputs = [o.name for o in model.graph.output]
    if output_index is None:
        return outputs[0]
    if isinstance(output_index, str):
        produced = {name for node in model.graph.node for name in node.output}
        if output_index in outputs or output_index in produced:
            return output_index
        raise ValueError(
            f"output_index={output_index!r} is neither an output of the model nor a value "
            f"computed by one of its nodes; outputs: {outputs}."
        )
    if isinstance(output_index, bool) or not isinstance(output_index, numbers.Integral):
        raise TypeError(
            f"output_index must be an int or an output name, got {type(output_index).__name__}."
        )
    if not -len(outputs) <= output_index < len(outputs):
        raise ValueError(
            f"output_index={output_index} is out of range: the model has {len(outputs)} "
            f"output(s) {outputs}."
        )
    return outputs[output_index]


def _check_prediction(model, infos, pred: str, score: Score, output_index):
    """Return (element type, shape) of the prediction after checking them."""
    info = infos.get(pred)
    elem = elem_type_of(info) if info is not None else 0
    if elem not in FLOAT_TYPES:
        type_name = TensorProto.DataType.Name(elem) if elem else "of unknown type"
        floats = [f"{i} ({o.name!r})" for i, o in enumerate(model.graph.output)
                  if elem_type_of(o) in FLOAT_TYPES]
        hint = (f"pass output_index= the index or name of the scores, e.g. one of {floats}"
                if floats else "pass output_index= the name of a float value of the graph")
        raise TypeError(
            f"The prediction {pred!r} (output_index={output_index!r}) is {type_name}; "
            f"score_name={score.name!r} needs a float or double tensor: {hint}."
        )
    shape = shape_of(info)
    if shape is None:
        # no rank (a model built from an input declared without one, as onnxcustom's
        # users wrote them): onnxruntime runs it, the label is declared without one too
        return elem, None
    if not shape:
        raise ValueError(
            f"The prediction {pred!r} is a scalar; the loss needs a prediction of shape "
            "(n, ...), one row per sample."
        )
    if score.check_shape is not None:
        score.check_shape(pred, shape)
    return elem, shape


def _label_info(name: str, score: Score, elem: int, shape) -> onnx.ValueInfoProto:
    if score.class_labels:
        # Class indices of shape (n,), like scikit-learn's y (onnx.checker
        # wants a rank on every input, so (n, 1) cannot be declared too).
        return helper.make_tensor_value_info(name, TensorProto.INT64, [_batch_dim(shape)])
    if shape is None:  # the prediction's rank is unknown: so is the label's
        return helper.make_tensor_value_info(name, elem, None)
    return helper.make_tensor_value_info(name, elem, [_batch_dim(shape)] + list(shape[1:]))


def _batch_dim(shape) -> str:
    return shape[0] if shape and isinstance(shape[0], str) and shape[0] else "N"


def _reserve(builder: GraphBuilder, name: str, argument: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{argument} must be a non-empty string, got {name!r}.")
    try:
        return builder.reserve(name)
    except ValueError:
        raise ValueError(
            f"{argument}={name!r} is already a name in the graph; choose another {argument}."
        ) from None


def add_loss_output(onx, score_name: str = "squared_error", loss_name: str = "loss",
                    label_name: str = "label", weight_name: str | None = None,
                    penalty: dict | None = None, output_index=None,
                    **kwargs) -> onnx.ModelProto:
    """Add a scalar loss output computed from a prediction of the graph.

    The loss is::

        loss = mean_i l_i  (or sum_i w_i l_i / sum_i w_i with sample weights)
               + sum over penalised weights W of (l1 * sum|W| + l2 * sum W^2)

    where ``l_i`` is the elementwise loss of row ``i`` averaged over the
    output columns, so that a multi-output ``'squared_error'`` equals
    :func:`sklearn.metrics.mean_squared_error`. Penalties have no 1/2 factor
    and are not divided by the number of rows.

    Parameters
    ----------
    onx : onnx.ModelProto, bytes or path
        Model computing the prediction; it is not modified.
    score_name : str, default='squared_error'
        Elementwise loss between the prediction ``p`` and the label ``y``
        (``d = y - p``), one entry of :data:`SCORES` (or an alias):

        - ``'squared_error'`` or ``'l2'``: ``d ** 2``;
        - ``'absolute_error'`` or ``'l1'``: ``|d|``;
        - ``'elastic'``: ``l1_weight * |d| + l2_weight * d ** 2``;
        - ``'huber'``: ``0.5 * d ** 2`` if ``|d| <= epsilon`` else
          ``epsilon * (|d| - epsilon / 2)`` (the textbook form, as in
          :class:`sklearn.linear_model.SGDRegressor`);
        - ``'log'``: binary log-loss of scores (logits) ``s`` of shape (n,)
          or (n, 1) and labels in {0, 1}, computed as
          ``max(s, 0) - y s + log(1 + exp(-|s|))`` (finite for any ``s``);
        - ``'cross_entropy'``: multiclass log-loss ``-log softmax(s)[y]`` of
          logits of shape (n, n_classes) and int64 class indices in
          [0, n_classes) of shape (n,); an index out of range makes
          onnxruntime fail rather than count zero.

        - the margin losses of :class:`sklearn.linear_model.SGDClassifier`,
          of scores ``s`` and labels in {0, 1} (``z = (2 y - 1) s``):
          ``'hinge'`` ``max(0, 1 - z)``, ``'squared_hinge'`` its square,
          ``'perceptron'`` ``max(0, -z)``, ``'modified_huber'``
          ``max(0, 1 - z) ** 2`` for ``z >= -1`` and ``-4 z`` below (one
          column per class gives scikit-learn's one-vs-all sum);
        - ``'epsilon_insensitive'``: ``max(0, |d| - epsilon)`` (``epsilon``
          0.1 by default), ``'squared_epsilon_insensitive'`` its square;
        - ``'pinball'`` or ``'quantile'``: ``max(q d, (q - 1) d)`` for the
          ``quantile`` ``q`` in (0, 1) (0.5 by default);
        - ``'poisson'``, ``'gamma'`` and ``'tweedie'`` (``power`` 0 or >= 1,
          1.5 by default): half the deviance of the mean ``exp(p)`` (the
          prediction is the linear predictor of a log link), without the
          terms of ``y`` alone, as scikit-learn's GLMs minimise it:
          ``exp(p) - y p``, ``p + y exp(-p)`` and
          ``exp((2 - power) p) / (2 - power) - y exp((1 - power) p) / (1 - power)``.

        ``'log'`` and ``'cross_entropy'`` take logits, not probabilities:
        select the input of the final Sigmoid/Softmax with ``output_index``.
    loss_name : str, default='loss'
        Name of the new scalar output, of the prediction's float type.
    label_name : str, default='label'
        Name of the new input holding the expected values: same type and
        shape as the prediction, with a dynamic first dimension; int64
        class indices of shape (n,) for ``'cross_entropy'``.
    weight_name : str, default=None
        If given, name of a new input of shape (n,) and of the prediction's
        type holding sample weights.
    penalty : dict, default=None
        ``{initializer_name: {'l1': a, 'l2': b}}`` or
        ``{initializer_name: b}`` (meaning ``{'l2': b}``).
    output_index : int or str, default=None
        Which value is the prediction: an output index, an output name or
        the name of any value computed by a node. None means the first
        output.
    **kwargs
        Parameters of the score: ``l1_weight`` and ``l2_weight`` (both 0.5
        by default) for ``'elastic'``, ``epsilon`` (1.0) for ``'huber'``,
        (0.1) for the epsilon-insensitive losses, ``quantile`` for
        ``'pinball'``, ``power`` for ``'tweedie'``.

    Returns
    -------
    model : onnx.ModelProto
        A new model with the original inputs, then ``label_name`` (and
        ``weight_name``); its outputs are ``loss_name`` followed by the
        original outputs.

    Raises
    ------
    ValueError
        For an unknown score name, penalised weight or output, a name
        already present in the graph, a negative coefficient or a
        prediction of the wrong shape.
    TypeError
        For a prediction that is not float or double (pass
        ``output_index``), a keyword argument the score does not take, or a
        penalised weight that is not float.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LinearRegression
    >>> from skl2onnx import to_onnx
    >>> from ortlearn import add_loss_output
    >>> X = np.arange(20, dtype=np.float32).reshape(10, 2)
    >>> y = X @ np.array([1.0, 2.0], dtype=np.float32)
    >>> onx = to_onnx(LinearRegression().fit(X, y), X, black_op={'LinearRegressor'})
    >>> onx_loss = add_loss_output(onx, score_name='elastic', weight_name='weight',
    ...                            l1_weight=0.1, l2_weight=0.9,
    ...                            penalty={'coef': {'l2': 0.01}})
    >>> [i.name for i in onx_loss.graph.input]
    ['X', 'label', 'weight']
    >>> [o.name for o in onx_loss.graph.output]
    ['loss', 'variable']
    """
    with invalid_model_errors(onx):
        return _add_loss_output(onx, score_name, loss_name, label_name, weight_name, penalty,
                                output_index, kwargs)


def _add_loss_output(onx, score_name, loss_name, label_name, weight_name, penalty,
                     output_index, kwargs) -> onnx.ModelProto:
    score = get_score(score_name)
    params = score.resolve_params(**kwargs)
    model = load_model(onx)
    if not model.graph.output:
        raise ValueError("The model has no output to compute a loss from.")
    if weight_name is not None and weight_name == label_name:
        raise ValueError(f"label_name and weight_name are both {label_name!r}.")

    pred = _select_prediction(model, output_index)
    # Declared output types first: inferred ones carry generated dim names.
    infos = value_info_map(model)
    infos.update({o.name: o for o in model.graph.output if elem_type_of(o)})
    elem, shape = _check_prediction(model, infos, pred, score, output_index)
    dtype = onnx_to_np_dtype(elem)

    builder = GraphBuilder.for_model(model, prefix=f"{loss_name}_")
    loss = _reserve(builder, loss_name, "loss_name")
    label = _reserve(builder, label_name, "label_name")
    weight = None if weight_name is None else _reserve(builder, weight_name, "weight_name")

    inits = {init.name: init.data_type for init in model.graph.initializer}
    pen = penalty_terms(builder, penalty, inits, dtype)
    per_elem = score.emit(builder, pred, label, dtype, **params)
    data = reduce_rows(builder, per_elem, weight, output=None if pen else loss)
    if pen is not None:
        builder.op("Add", [data, pen], outputs=[loss])

    graph = model.graph
    builder.add_to_graph(graph)
    graph.input.append(_label_info(label, score, elem, shape))
    if weight is not None:
        graph.input.append(helper.make_tensor_value_info(weight, elem, [_batch_dim(shape)]))
    originals = list(graph.output)
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(loss, elem, []))
    graph.output.extend(originals)
    if score.class_labels:
        # Where labels enter from the host, they are checked against the classes.
        n_classes = (shape[1] if shape is not None and len(shape) > 1
                     and isinstance(shape[1], int) else None)
        mark_class_labels(model, label, n_classes)
    # onnx's checker wants a rank on every graph input, which onnxruntime does not need
    return finalize_model(model, check=shape is not None)
