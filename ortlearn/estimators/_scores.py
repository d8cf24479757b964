"""The scores the mini-batch objectives read, written from the models' formulas.

:func:`ortlearn.convert.to_train_onnx` converts an estimator with skl2onnx: a graph of its
predictions (labels, probabilities) around its scores. The objectives of
:mod:`._objective` read only the scores and prune the rest, so a fit builds the scores
itself: the same input, weights and operators in the same order as skl2onnx's graph (the
training is the same bit for bit), without importing skl2onnx (0.2 s and about 30 MB: it
imports scikit-learn's ensemble, tree and mixture modules for its converter registry). The
MLPs' predictions add the probabilities as skl2onnx writes them; ``to_onnx`` converts.

* :func:`linear_scores`: ``X @ coef + intercept``;
* :func:`mlp_scores`: the layers of ``MLPRegressor`` / ``MLPClassifier`` up to the output
  activation (the logits), or through ``exp`` for ``loss='poisson'``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import DEFAULT_OPSET, GraphBuilder, finalize_model, weight_stub
from ._objective import _PREDICTION, COEF, INTERCEPT

__all__ = ["linear_scores", "mlp_scores"]

PROBABILITIES = "probabilities"
#: scikit-learn's hidden activations and their operator ('identity': none)
_ACTIVATIONS = {"relu": "Relu", "tanh": "Tanh", "logistic": "Sigmoid", "identity": None}


def linear_scores(weights: dict, kind: str, dtype, values: bool = True) -> onnx.ModelProto:
    """The scores ``X @ coef + intercept`` of a linear model.

    Parameters
    ----------
    weights : dict of str to ndarray
        ``get_weights`` of the linear model: ``coef`` ``(n_features, n_outputs)``
        and, with an intercept, ``intercept`` ``(n_outputs,)``.
    kind : {'regressor', 'binary', 'multiclass'}
        The output is ``variable`` for a regressor, ``raw_scores`` otherwise.
    dtype : {numpy.float32, numpy.float64}
        Of the input, the weights and the output.
    values : bool, default=True
        False: the weights are :func:`~ortlearn.graph.weight_stub` initializers.

    Returns
    -------
    onnx.ModelProto
        Input ``X`` ``(N, n_features)``, one output ``(N, n_outputs)``.
    """
    b = _builder(weights, kind)
    raw = b.op("MatMul", ["X", COEF])
    if INTERCEPT in weights:
        raw = b.op("Add", [raw, INTERCEPT])
    return _model(b, raw, weights, kind, dtype, values)


def mlp_scores(weights: dict, kind: str, activation: str, dtype, values: bool = True,
               log_link: bool = False, probabilities: bool = False) -> onnx.ModelProto:
    """The layers of an MLP, ``h = activation(h @ W + b)``, up to its output's logits.

    Parameters
    ----------
    weights : dict of str to ndarray
        ``get_weights`` of the MLP: each layer's coefficients then intercepts
        ``(1, width)``, in order.
    kind : {'regressor', 'binary', 'multiclass', 'multilabel'}
        The output is ``variable`` for a regressor, ``raw_scores`` (the logits)
        otherwise.
    activation : {'relu', 'tanh', 'logistic', 'identity'}
        Of the hidden layers.
    dtype : {numpy.float32, numpy.float64}
    values : bool, default=True
        False: the weights are :func:`~ortlearn.graph.weight_stub` initializers.
    log_link : bool, default=False
        ``MLPRegressor(loss='poisson')``: the last layer's value is
        ``raw_predictions``, the output its ``exp``.
    probabilities : bool, default=False
        A classifier's graph also outputs ``probabilities``, as skl2onnx writes
        them: the softmax of the logits (multiclass), their sigmoids
        (multilabel), ``[1 - p, p]`` with ``p`` the logit's sigmoid (binary).

    Returns
    -------
    onnx.ModelProto
        Input ``X`` ``(N, n_features)``, one output ``(N, n_outputs)`` (and
        ``probabilities``).
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got "
                         f"{activation!r}.")
    names = list(weights)
    b = _builder(weights, kind)
    h = "X"
    for i, (coef, intercept) in enumerate(zip(names[::2], names[1::2])):
        h = b.op("Add", [b.op("MatMul", [h, coef]), intercept])
        if i < len(names) // 2 - 1 and _ACTIVATIONS[activation] is not None:
            h = b.op(_ACTIVATIONS[activation], [h])
    if log_link:
        from ..convert import RAW_PREDICTIONS

        b.op("Identity", [h], outputs=[RAW_PREDICTIONS])
        h = b.op("Exp", [RAW_PREDICTIONS])
    extra = {}
    if probabilities and kind != "regressor":
        b.reserve(PROBABILITIES)
        if kind == "multiclass":
            b.op("Softmax", [h], outputs=[PROBABILITIES])
        elif kind == "multilabel":
            b.op("Sigmoid", [h], outputs=[PROBABILITIES])
        else:
            p = b.op("Sigmoid", [h])
            b.op("Concat", [b.op("Sub", [b.const(1.0, dtype), p]), p], outputs=[PROBABILITIES],
                 axis=1)
        extra[PROBABILITIES] = 2 if kind == "binary" else None
    return _model(b, h, weights, kind, dtype, values, extra)


def _builder(weights: dict, kind: str) -> GraphBuilder:
    return GraphBuilder(used_names=["X", _output(kind), *weights], prefix="scores_")


def _output(kind: str) -> str:
    return _PREDICTION["regressor" if kind == "regressor" else "classifier"]


def _model(b: GraphBuilder, scores: str, weights: dict, kind: str, dtype,
           values: bool, extra: dict | None = None) -> onnx.ModelProto:
    """The graph of ``b``'s nodes: input ``X``, ``scores`` as the output (and the outputs
    ``extra``, ``{name: columns}``, None: the scores'), the weights."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    output = _output(kind)
    b.op("Identity", [scores], outputs=[output])
    inits = [numpy_helper.from_array(np.asarray(value, dtype), name) if values
             else weight_stub(name, elem, np.shape(value)) for name, value in weights.items()]
    n_features, n_outputs = np.shape(weights[next(iter(weights))])[0], np.shape(
        weights[list(weights)[-1]])[-1]
    graph = helper.make_graph(
        b.nodes, "scores", [helper.make_tensor_value_info("X", elem, ["N", n_features])],
        [helper.make_tensor_value_info(name, elem, ["N", columns or n_outputs])
         for name, columns in {output: None, **(extra or {})}.items()], inits)
    return finalize_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)]))
