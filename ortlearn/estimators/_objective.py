"""Loss graphs whose objective is the one of the scikit-learn counterpart.

Each function takes the inference graph of :func:`ortlearn.convert.to_train_onnx`
and returns a graph with the inputs ``X``, ``label``, ``sample_weight`` and
one scalar output ``loss``; only the nodes the loss needs are kept (class
labels, ``ArgMax`` and probabilities are pruned). With ``weighted=False``
the graph has no ``sample_weight`` input and takes plain means: a fit
without weights then holds no column of ones and no reordered copy of it
(8 bytes per row in float32), and its step has a few nodes less.

* :func:`mlp_objective`: ``MLPRegressor`` / ``MLPClassifier``, per batch
  ``data_loss + 0.5 * alpha * sum ||W||^2 / sum(sample_weight)`` (intercepts
  unpenalised; ``sum(sample_weight)`` is the number of rows of the batch
  without weights), with scikit-learn 1.9's weighted average of the data loss.
* :func:`sgd_objective`: ``SGDRegressor`` / ``SGDClassifier``,
  ``mean(sample_weight * loss) + alpha * R(coef)`` with
  ``R = (1 - l1_ratio) / 2 ||w||^2 + l1_ratio ||w||_1``.

The full-batch models' objectives are float64 graphs written from their formula, with
the weights as initializers (what :func:`ortlearn.training.minimize_lbfgs` trains):

* :func:`linear_objective`: ``data_scale * sum(w * row_loss(X coef + b, y)) + l2 ||coef||^2``,
  the GLMs, Ridge, Huber, logistic regression and the smooth part of the elastic net;
* :func:`svm_primal_objective`, :func:`svm_dual_objective`: liblinear's primal (squared
  losses) and dual (hinge, epsilon-insensitive) problems;
* :func:`pinball_objective`: the smoothed pinball loss of quantile regression.

Every graph's value names are this module's constants (``LOSS``, ``LABEL``, ``COEF``...).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..graph import DEFAULT_OPSET, GraphBuilder, finalize_model, load_model, needed_nodes
from ..graph.cache import LRUCache
from ..graph.format import HYPER_PREFIX
from ..loss import elementwise_loss, penalty_terms

__all__ = ["LOSS", "input_names", "label_dtype", "linear_objective", "mlp_objective",
           "ova_sgd_objective", "pinball_objective", "sgd_objective",
           "svm_dual_objective", "svm_primal_objective"]

# The names of the objective graphs' values.
LOSS = "loss"
LABEL = "y"
SAMPLE_WEIGHT = "sample_weight"
COEF, INTERCEPT = "coef", "intercept"
#: untrained initializers of the full-batch objectives: minimize_lbfgs feeds them as data,
#: so that the gradient session of a graph serves every data size and strength (its cache)
DATA_SCALE, L2 = "data_scale", "l2_strength"
#: liblinear's dual variables (the regression's in two halves) and the per-row costs
COST, DUAL, DUAL_NEG = "cost", "dual", "dual_negative"
#: The diagonal term of the squared hinge's dual, ``1 / (4 C_i)`` per row.
DUAL_DIAG = "dual_diagonal"
#: quantile regression's coefficients, split in two non-negative halves
POS, NEG = "coef_positive", "coef_negative"
#: the L2 penalty's strength of the mini-batch objectives, a hyper-parameter input of
#: the training engine: the fits of a search over alpha share one compiled step
HYPER_L2, HYPER_L1 = HYPER_PREFIX + "l2", HYPER_PREFIX + "l1"

_PREDICTION = {"regressor": "variable", "classifier": "raw_scores"}
# The score (a key of ortlearn.loss.SCORES) of a classifier; a regressor's is its `loss`.
# A multilabel classifier has one logit, and one binary log-loss, per label.
_CLASSIFIER_SCORE = {"binary": "log", "multiclass": "cross_entropy", "multilabel": "log"}
_KINDS = ("regressor", "binary", "multiclass", "multilabel")

def input_names(weighted: bool = True) -> list[str]:
    """Inputs of an objective graph, in order."""
    return ["X", LABEL, SAMPLE_WEIGHT] if weighted else ["X", LABEL]


def _widen(b: GraphBuilder, values: list[str], elem: int, sum_in_float64: bool):
    """``values`` cast to float64 when a float32 objective is summed in float64.

    Returns the values, the numpy dtype and the element type of the sums.
    Full-batch L-BFGS needs float64 sums: the float32 sum of 100 000 row
    losses is too noisy for scipy's line search (``ftol = 64 eps``), which
    then needs about three times as many evaluations.
    """
    if sum_in_float64 and elem == TensorProto.FLOAT:
        return [b.cast(v, TensorProto.DOUBLE) for v in values], np.float64, TensorProto.DOUBLE
    return values, (np.float64 if elem == TensorProto.DOUBLE else np.float32), elem


def _label_input(kind: str, n_outputs: int, elem: int) -> onnx.ValueInfoProto:
    # multilabel: (N, n_labels) 0/1 floats, as a regressor's targets
    if kind == "multiclass":
        return helper.make_tensor_value_info(LABEL, TensorProto.INT64, ["N"])
    return helper.make_tensor_value_info(LABEL, elem, ["N", n_outputs])


def _data_loss(b: GraphBuilder, kind: str, score: str, pred: str, dtype, label: str = LABEL,
               **kwargs) -> str:
    """Unreduced loss of each element: ``(N, k)`` for regressors, ``(N, 1)`` otherwise.

    Of the shape of ``pred`` and ``label``, ``(N,)`` when both are vectors.
    """
    if kind in _CLASSIFIER_SCORE:
        return elementwise_loss(b, _CLASSIFIER_SCORE[kind], pred, label, dtype)
    per_elem = elementwise_loss(b, score, pred, label, dtype, **kwargs)
    if score == "squared_error":
        # scikit-learn's squared loss carries a 1/2.
        per_elem = b.op("Mul", [b.const(0.5, dtype), per_elem])
    return per_elem


def _poisson_deviance_rest(b: GraphBuilder, per_elem: str, dtype) -> str:
    """``per_elem + xlogy(y, y) - y``: the half Poisson deviance, as MLPRegressor reports it.

    The score table's ``'poisson'`` leaves out the terms of ``y`` alone (they
    have no gradient); they are added back so that the loss values
    (``loss_``, ``loss_curve_``) are scikit-learn's. ``xlogy(0, 0) = 0``.
    """
    zero = b.const(0.0, dtype)
    positive = b.op("Greater", [LABEL, zero])
    safe = b.op("Where", [positive, LABEL, b.const(1.0, dtype)])  # log(1) = 0 where y = 0
    rest = b.op("Sub", [b.op("Mul", [LABEL, b.op("Log", [safe])]), LABEL])
    return b.op("Add", [per_elem, rest])


def _row_losses(b: GraphBuilder, per_elem: str, one_column: bool, weighted: bool) -> str:
    """The loss of each row: ``per_elem`` summed over its columns.

    A loss of one column is its own row sum: without sample weights it is
    averaged as it is, (N, 1), so that the gradient of the mean reaches the
    loss as one value broadcast, with no ``Unsqueeze`` back to (N, 1).
    """
    if one_column and not weighted:
        return per_elem
    return b.reduce("ReduceSum", per_elem, axes=[1], keepdims=0)


def _mean_and_count(b: GraphBuilder, rows: str, weight: str | None,
                    elem: int) -> tuple[str, str]:
    """``(sum(w * rows) / sum(w), sum(w))`` of (N,) vectors; ``(mean(rows), N)`` without ``w``.

    The value of :func:`ortlearn.loss.reduce_rows` for rows that are
    already scalars, without its reshape and per-row mean: each node of
    the loss costs its gradient nodes at every training step. Without
    ``w``, ``rows`` may also be (N, 1).
    """
    if weight is None:
        count = b.cast(b.op("Size", [rows]), elem)
        return b.reduce("ReduceMean", rows, keepdims=0), count
    count = b.reduce("ReduceSum", weight, keepdims=0)
    total = b.reduce("ReduceSum", b.op("Mul", [rows, weight]), keepdims=0)
    return b.op("Div", [total, count]), count


def _finish(model: onnx.ModelProto, b: GraphBuilder, loss: str, label_info, weighted: bool,
            loss_elem: int | None = None) -> onnx.ModelProto:
    """Add the nodes, the label and weight inputs, keep only ``loss`` and its ancestors."""
    graph = model.graph
    b.add_to_graph(graph)
    elem = graph.input[0].type.tensor_type.elem_type
    graph.input.append(label_info)
    if weighted:
        graph.input.append(helper.make_tensor_value_info(SAMPLE_WEIGHT, elem, ["N"]))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(loss, loss_elem or elem, []))
    kept = needed_nodes(graph.node, [loss])  # the inference outputs' nodes go
    del graph.node[:]
    graph.node.extend(kept)
    return finalize_model(model)


def _start(model, kind: str):
    model = load_model(model)
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, _KINDS))}, got {kind!r}.")
    pred = _PREDICTION["regressor" if kind == "regressor" else "classifier"]
    outputs = {o.name: o for o in model.graph.output}
    if pred not in outputs:
        raise ValueError(
            f"The inference graph has no output {pred!r} (outputs: {sorted(outputs)}): "
            "build it with ortlearn.convert.to_train_onnx."
        )
    elem = outputs[pred].type.tensor_type.elem_type
    dims = outputs[pred].type.tensor_type.shape.dim
    n_outputs = dims[1].dim_value if len(dims) > 1 and dims[1].dim_value else 1
    b = GraphBuilder.for_model(model, prefix="objective_")
    for name in (LOSS, LABEL, SAMPLE_WEIGHT):
        b.reserve(name)
    dtype = np.float64 if elem == TensorProto.DOUBLE else np.float32
    return model, b, pred, elem, n_outputs, dtype


def _weights_dtypes(model) -> dict[str, int]:
    return {init.name: init.data_type for init in model.graph.initializer}


def _penalties(model, b: GraphBuilder, weights: list, strengths: dict, dtype) -> str | None:
    """The penalty terms of ``weights`` (``{'l1': a, 'l2': b}``, the same for each), None if
    zero. Each non-zero strength is a hyper-parameter initializer of the weights' dtype
    (``hyper.l1``, ``hyper.l2``), which the training engine feeds as an input."""
    dtypes = _weights_dtypes(model)
    wdtype = onnx.helper.tensor_dtype_to_np_dtype(dtypes[weights[0]])
    names = {"l1": HYPER_L1, "l2": HYPER_L2}
    spec = {}
    for key, value in strengths.items():
        if value:
            model.graph.initializer.append(
                numpy_helper.from_array(np.array(value, dtype=wdtype), names[key]))
            spec[key] = names[key]
    return penalty_terms(b, dict.fromkeys(weights, spec), dtypes, dtype) if spec else None


def mlp_objective(model, kind: str, alpha: float, sum_in_float64: bool = False,
                  weighted: bool = True, loss: str = "squared_error") -> onnx.ModelProto:
    """The per-batch objective of scikit-learn's MLPs.

    With ``w`` the sample weights of the batch (ones without weights)::

        regressor:  0.5 * sum_k sum_i w_i (y_ik - p_ik)^2 / sum_i w_i
        poisson:    sum_k sum_i w_i (exp(r_ik) - y_ik r_ik + xlogy(y_ik, y_ik) - y_ik)
                        / sum_i w_i                           (r: the raw prediction)
        binary:     sum_i w_i logloss(y_i, z_i) / sum_i w_i       (z: the logit)
        multiclass: sum_i w_i crossentropy(y_i, z_i) / sum_i w_i  (z: the logits)
        multilabel: sum_k sum_i w_i logloss(y_ik, z_ik) / sum_i w_i  (a logit per label)
        loss = data + 0.5 * alpha * sum_layers ||W||^2 / sum_i w_i

    The multi-output regressor sums over the outputs: ``MLPRegressor``
    reports the mean over the outputs as its loss but its gradient
    (``activations - y``, not divided by the number of outputs) is the one of
    the sum, and that is what it descends.

    Parameters
    ----------
    model : onnx.ModelProto
        Inference graph of an MLP from :func:`ortlearn.convert.to_train_onnx`.
    kind : {'regressor', 'binary', 'multiclass', 'multilabel'}
        The label of a regressor is ``(N, n_outputs)`` floats, of a binary
        classifier ``(N, 1)`` in {0, 1}, of a multiclass one ``(N,)`` int64
        class indices, of a multilabel one ``(N, n_labels)`` in {0, 1}.
    alpha : float
        L2 coefficient (0 disables the penalty).
    sum_in_float64 : bool, default=False
        Sum the row losses of a float32 graph in float64 (``loss`` is then
        float64): full-batch L-BFGS needs the precision.
    weighted : bool, default=True
        False: no ``sample_weight`` input, every row weighs 1.
    loss : {'squared_error', 'poisson'}, default='squared_error'
        ``MLPRegressor``'s ``loss`` (regressors only). ``'poisson'``: the
        half Poisson deviance of ``exp`` of the graph's
        ``raw_predictions`` (:func:`ortlearn.convert.to_train_onnx` of an
        ``MLPRegressor(loss='poisson')``).

    Returns
    -------
    onnx.ModelProto
        Inputs ``X``, ``label`` and, when ``weighted``, ``sample_weight``;
        output ``loss``.
    """
    if loss not in ("squared_error", "poisson"):
        raise ValueError(f"loss must be 'squared_error' or 'poisson', got {loss!r}.")
    if loss == "poisson" and kind != "regressor":
        raise ValueError("loss='poisson' is a regressor's loss.")
    model, b, pred, elem, n_outputs, dtype = _start(model, kind)
    if loss == "poisson":
        # here, not at import: the conversion's modules import much of scikit-learn, which
        # the full-batch estimators (building their objectives from _objective) never need
        from ..convert import RAW_PREDICTIONS

        if not any(RAW_PREDICTIONS in node.output for node in model.graph.node):
            raise ValueError(
                f"loss='poisson' needs the value {RAW_PREDICTIONS!r} (the log of the "
                "prediction): build the graph of an MLPRegressor(loss='poisson') with "
                "ortlearn.convert.to_train_onnx.")
        per_elem = _poisson_deviance_rest(
            b, _data_loss(b, kind, "poisson", RAW_PREDICTIONS, dtype), dtype)
    else:
        per_elem = _data_loss(b, kind, "squared_error", pred, dtype)
    one_column = kind in ("binary", "multiclass") or n_outputs == 1
    rows = _row_losses(b, per_elem, one_column, weighted)
    values = [rows, SAMPLE_WEIGHT] if weighted else [rows]
    values, dtype, loss_elem = _widen(b, values, elem, sum_in_float64)
    data, count = _mean_and_count(b, values[0], values[1] if weighted else None, loss_elem)
    loss = data
    coefs = [name for name in _weights_dtypes(model) if name.startswith("coefficient")]
    penalty = _penalties(model, b, coefs, {"l2": 0.5 * alpha}, dtype)
    if penalty is not None:
        loss = b.op("Add", [data, b.op("Div", [penalty, count])])
    b.op("Identity", [loss], outputs=[LOSS])
    return _finish(model, b, LOSS, _label_input(kind, n_outputs, elem), weighted, loss_elem)


def sgd_objective(model, kind: str, loss: str = "squared_error", penalty: str | None = "l2",
                  alpha: float = 1e-4, l1_ratio: float = 0.15,
                  epsilon: float = 0.1, sum_in_float64: bool = False,
                  weighted: bool = True, flat: bool | None = None) -> onnx.ModelProto:
    """The objective of ``SGDRegressor`` / ``SGDClassifier`` (and of logistic regression).

    ::

        loss = mean_i (w_i * l(y_i, p_i)) + alpha * R(coef)
        R = (1 - l1_ratio) / 2 * ||coef||^2 + l1_ratio * ||coef||_1

    with ``l = 0.5 * (y - p)^2`` (``'squared_error'``), the Huber loss of
    threshold ``epsilon`` (``'huber'``), the binary log-loss of the logit, or
    the multinomial cross-entropy of the logits (multiclass). ``penalty``
    'l2' means ``l1_ratio = 0``, 'l1' ``l1_ratio = 1``, None ``alpha = 0``.
    The intercept is not penalised. Sample weights multiply the loss of
    their row, the mean divides by the number of rows (as SGD does).

    Parameters
    ----------
    model : onnx.ModelProto
        Inference graph of a linear model from :func:`ortlearn.convert.to_train_onnx`.
    kind : {'regressor', 'binary', 'multiclass'}
        As in :func:`mlp_objective`.
    loss : {'squared_error', 'huber', 'log_loss'}, default='squared_error'
        Data loss of a regressor (classifiers always use the log-loss).
    penalty : {'l2', 'l1', 'elasticnet'} or None, default='l2'
    alpha : float, default=1e-4
    l1_ratio : float, default=0.15
        Used by 'elasticnet' only.
    epsilon : float, default=0.1
        Threshold of the Huber loss.
    sum_in_float64 : bool, default=False
        As in :func:`mlp_objective`.
    weighted : bool, default=True
        As in :func:`mlp_objective`.
    flat : bool or None, default=None
        With one column (a binary classifier, a single-output regressor),
        work on ``(N,)`` vectors from the prediction on (the same numbers,
        fewer slow broadcasts); None: with ``sum_in_float64`` (the
        full-batch objective of L-BFGS).

    Returns
    -------
    onnx.ModelProto
        As in :func:`mlp_objective`.
    """
    if kind == "regressor" and loss not in ("squared_error", "huber"):
        raise ValueError(f"A regressor's loss must be 'squared_error' or 'huber', got {loss!r}.")
    model, b, pred, elem, n_outputs, dtype = _start(model, kind)
    kwargs = {"epsilon": epsilon} if loss == "huber" else {}
    # The full-batch objective (summed in float64: L-BFGS) of one column works on
    # (N,) vectors from the prediction on: onnxruntime broadcasts a (N, 1) tensor with
    # a scalar much slower than a (N,) one, and the loss and its gradient hold a dozen
    # such operations (the same numbers bit for bit; doc/performance_notes.rst, the section
    # on W4's full-batch L-BFGS). The mini-batch step graphs keep (N, 1): their
    # batches are small.
    flat = (sum_in_float64 if flat is None else flat) and n_outputs == 1 and kind in (
        "binary", "regressor")
    label = LABEL
    if flat:
        pred = b.op("Reshape", [pred, b.ints([-1], hint="rows")])
        label = b.op("Reshape", [LABEL, b.ints([-1], hint="rows")])
    per_elem = _data_loss(b, kind, loss, pred, dtype, label=label, **kwargs)
    rows = per_elem if flat else _row_losses(b, per_elem, kind != "regressor" or n_outputs == 1,
                                             weighted)
    if weighted:
        rows = b.op("Mul", [rows, SAMPLE_WEIGHT])
    (rows,), dtype, loss_elem = _widen(b, [rows], elem, sum_in_float64)
    data = b.reduce("ReduceMean", rows, keepdims=0)
    ratio = {"l2": 0.0, "l1": 1.0, "elasticnet": l1_ratio, None: 0.0}[penalty]
    strength = 0.0 if penalty is None else alpha
    terms = _penalties(model, b, ["coef"],
                       {"l1": strength * ratio, "l2": strength * (1 - ratio) / 2}, dtype)
    b.op("Identity", [data if terms is None else b.op("Add", [data, terms])], outputs=[LOSS])
    return _finish(model, b, LOSS, _label_input(kind, n_outputs, elem), weighted, loss_elem)


#: Losses of ``SGDClassifier`` that score a margin (labels in {0, 1}, as ortlearn.loss
#: takes them); the others are regression losses of the labels -1 / +1, as scikit-learn's.
_MARGIN_SCORES = {"hinge": "hinge", "squared_hinge": "squared_hinge",
                  "perceptron": "perceptron", "modified_huber": "modified_huber",
                  "log_loss": "log"}
_EPSILON_LOSSES = ("huber", "epsilon_insensitive", "squared_epsilon_insensitive")
#: scikit-learn's SGD clips the derivative of the loss to +-MAX_DLOSS
_MAX_DLOSS = 1e12


def ova_sgd_objective(model, kind: str, loss: str, alpha_l2: float = 0.0,
                      alpha_l1: float = 0.0, epsilon: float = 0.1, class_weight=None,
                      sum_in_float64: bool = False, weighted: bool = True) -> onnx.ModelProto:
    """The objective ``SGDRegressor`` / ``SGDClassifier`` descend, one-vs-all for classes.

    ::

        loss = mean_i w_i sum_k c_ik l(Y_ik, z_ik) + alpha_l2 / 2 * ||coef||^2
               + alpha_l1 * ||coef||_1

    ``z_ik`` is the score of row ``i`` for column ``k`` (one column for a
    regressor or two classes, one per class otherwise: scikit-learn's
    one-vs-all, each column a binary problem), ``Y_ik`` the label of the
    column: the target of a regressor, 1 when row ``i`` is of class ``k``
    (of ``classes_[1]`` for two classes) and 0 otherwise. Margin losses
    (``'hinge'``, ``'squared_hinge'``, ``'perceptron'``, ``'modified_huber'``,
    ``'log_loss'``) read these labels as they are; the regression losses of a
    classifier read ``2 Y - 1`` (scikit-learn's -1 / +1). ``c_ik`` is the
    class weight of the column: ``neg_k + Y_ik (pos_k - neg_k)``.
    ``'squared_error'`` is ``0.5 (y - p)^2`` (linear beyond ``|y - p| = 1e12``,
    where scikit-learn clips its derivative). scikit-learn's rule keeps only
    the L2 part of the penalty here (``alpha_l1=0``): the L1 part is
    :class:`~ortlearn.optim.PlainSGD`'s truncated update; the other solvers
    descend it as a subgradient.

    Parameters
    ----------
    model : onnx.ModelProto
        Inference graph of a linear model from :func:`ortlearn.convert.to_train_onnx`.
    kind : {'regressor', 'binary', 'multiclass'}
        The label of a regressor is ``(N, 1)`` floats, of a binary classifier
        ``(N, 1)`` in {0, 1}, of a multiclass one ``(N,)`` int64 class
        indices (one-hot encoded in the graph).
    loss : str
        A loss of ``SGDClassifier`` (or of ``SGDRegressor`` for a regressor).
    alpha_l2 : float, default=0.0
        ``alpha * (1 - l1_ratio)`` (0: no penalty term).
    alpha_l1 : float, default=0.0
        ``alpha * l1_ratio`` (0: no L1 term).
    epsilon : float, default=0.1
        Of ``'huber'``, ``'epsilon_insensitive'``, ``'squared_epsilon_insensitive'``.
    class_weight : tuple of two arrays, default=None
        ``(neg, pos)``, each of shape ``(n_columns,)``: the weights of the rows
        whose column label is 0 and 1 (classifiers only).
    sum_in_float64, weighted : bool
        As in :func:`mlp_objective`.

    Returns
    -------
    onnx.ModelProto
        As in :func:`mlp_objective`.
    """
    model, b, pred, elem, n_outputs, dtype = _start(model, kind)
    column = LABEL  # Y: the target, or 0/1 per column
    if kind == "multiclass":
        # one-hot columns (onnxruntime's OneHot has no float64 kernel)
        index = b.op("Unsqueeze", [LABEL, b.ints([-1], hint="axes")])
        classes = b.const(np.arange(n_outputs, dtype=np.int64).reshape(1, -1), hint="classes")
        column = b.cast(b.op("Equal", [index, classes]), elem)
    label = column
    if kind != "regressor" and loss not in _MARGIN_SCORES:
        label = b.op("Sub", [b.op("Mul", [b.const(2.0, dtype), column]), b.const(1.0, dtype)])
    score = _MARGIN_SCORES.get(loss, loss)
    kwargs = {"epsilon": epsilon} if loss in _EPSILON_LOSSES else {}
    if score == "squared_error":
        # 0.5 r^2, linear beyond |r| = MAX_DLOSS, where scikit-learn clips the derivative
        # (a diverging fit grows its weights linearly, finite, as scikit-learn's does):
        # 0.5 c (2 r - c) with c = clip(r) is that function, and its gradient is c, r
        # itself inside (2 r - c - c is exactly 0 there; the Huber score's gradient
        # cancels eps * g terms, 1e-4 off); fewer nodes than a Where between the pieces.
        r = b.op("Sub", [pred, label])
        c = b.op("Clip", [r, b.const(-_MAX_DLOSS, dtype), b.const(_MAX_DLOSS, dtype)])
        per_elem = b.op("Mul", [b.const(0.5, dtype),
                                b.op("Mul", [c, b.op("Sub", [b.op("Add", [r, r]), c])])])
    else:
        per_elem = elementwise_loss(b, score, pred, label, dtype, **kwargs)
    if class_weight is not None and kind != "regressor":
        neg, pos = (np.asarray(c, dtype=dtype).reshape(1, -1) for c in class_weight)
        if not (np.all(neg == 1) and np.all(pos == 1)):
            factor = b.op("Add", [b.const(neg), b.op("Mul", [column, b.const(pos - neg)])])
            per_elem = b.op("Mul", [per_elem, factor])
    rows = _row_losses(b, per_elem, n_outputs == 1, weighted)
    if weighted:
        rows = b.op("Mul", [rows, SAMPLE_WEIGHT])
    (rows,), dtype, loss_elem = _widen(b, [rows], elem, sum_in_float64)
    data = b.reduce("ReduceMean", rows, keepdims=0)
    terms = _penalties(model, b, ["coef"], {"l1": alpha_l1, "l2": alpha_l2 / 2}, dtype)
    b.op("Identity", [data if terms is None else b.op("Add", [data, terms])], outputs=[LOSS])
    info = _label_input("multiclass" if kind == "multiclass" else "regressor", n_outputs, elem)
    return _finish(model, b, LOSS, info, weighted, loss_elem)


def label_dtype(kind: str, dtype) -> np.dtype:
    """numpy dtype of the ``label`` input of an objective graph."""
    return np.dtype(np.int64) if kind == "multiclass" else np.dtype(dtype)


#: The objective graphs of the last structures (:func:`linear_objective`'s ``loss_key``): a
#: search's fits, a cross-validation's folds build theirs once.
_OBJECTIVES = LRUCache(32)


def linear_objective(n_features: int, n_outputs: int, row_loss, *, fit_intercept: bool,
                     data_scale: float, l2, int_label: bool = False,
                     extra_weights: dict | None = None,
                     x_offset: np.ndarray | None = None, loss_key=None) -> onnx.ModelProto:
    """The float64 objective graph of a linear model with a smooth loss.

    Parameters
    ----------
    n_features, n_outputs : int
        ``coef`` has shape ``(n_features, n_outputs)``, ``intercept``
        ``(n_outputs,)``.
    row_loss : callable
        ``row_loss(builder, raw, label) -> name``: the loss of each row, of
        shape ``(N, k)`` (summed over its columns); with one output (and
        float labels) ``raw`` and ``label`` are vectors ``(N,)`` and so is
        the row loss.
    fit_intercept : bool
        Give the graph an ``intercept`` initializer.
    data_scale : float
        Factor of the weighted sum of the row losses.
    l2 : float or array of shape (n_outputs,)
        Factor of the squared norm of each column of ``coef``.
    int_label : bool, default=False
        The label is int64 class indices ``(N,)`` (else float64 ``(N, n_outputs)``).
    extra_weights : dict of str to ndarray, default=None
        More float64 initializers (trained too) the row loss reads.
    x_offset : ndarray of shape (n_features,), default=None
        ``raw = (X - x_offset) @ coef``: the centred data of a sparse ``X``
        that centring would densify.
    loss_key : hashable, default=None
        Names everything ``row_loss`` writes (the loss, its constants): given,
        the graph of a structure (this key, the shapes, ``fit_intercept``,
        ``int_label``, whether there is an L2 term, the extra weights' names and
        shapes) is built once and kept; a later call gets a copy holding its own
        ``data_scale``, ``l2`` and extra weights (not with ``x_offset``, a
        constant of the graph).

    Returns
    -------
    onnx.ModelProto
        Inputs ``X``, ``y``, ``sample_weight``; output ``loss``; initializers
        ``coef``, ``intercept`` (with ``fit_intercept``), ``extra_weights``,
        and, not trained, ``data_scale`` and ``l2_strength`` (with an L2 term).
    """
    dtype = np.float64
    l2 = np.broadcast_to(np.asarray(l2, dtype), (n_outputs,))
    extra_weights = {name: np.asarray(value, dtype) for name, value in
                     (extra_weights or {}).items()}
    values = {DATA_SCALE: np.asarray(data_scale, dtype), L2: l2.copy(), **extra_weights}
    key = None
    if loss_key is not None and x_offset is None:
        key = (loss_key, n_features, n_outputs, bool(fit_intercept), bool(int_label),
               bool(np.any(l2)), tuple((name, v.shape) for name, v in extra_weights.items()))
        kept = _OBJECTIVES.get(key)
        if kept is not None:
            return _with_values(kept, values)
    model = _build_linear_objective(n_features, n_outputs, row_loss, fit_intercept, values,
                                    int_label, x_offset)
    if key is not None:
        _OBJECTIVES.put(key, model)
        return _with_values(model, values)
    return model


def _with_values(model: onnx.ModelProto, values: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers named in ``values`` hold those values."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for init in copy.graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(values[init.name], init.name))
    return copy


def _build_linear_objective(n_features, n_outputs, row_loss, fit_intercept, values: dict,
                            int_label, x_offset) -> onnx.ModelProto:
    """:func:`linear_objective`'s graph; ``values``: the initializers ``data_scale``,
    ``l2_strength`` (of every output) and the extra weights."""
    dtype = np.float64
    l2 = values[L2]
    extra_weights = {n: v for n, v in values.items() if n not in (DATA_SCALE, L2)}
    b = GraphBuilder(used_names=["X", LABEL, SAMPLE_WEIGHT, COEF, INTERCEPT, LOSS, DATA_SCALE,
                                 L2, *extra_weights], prefix="objective_")
    # One output: the rows are vectors (N,) from the product on. onnxruntime 1.31
    # broadcasts a (N, 1) tensor with a scalar or a (1,) one 15 to 30 times slower
    # than a (N,) one (2 ms against 0.13 for 100 000 rows), and the objective and
    # its gradient hold a dozen such operations.
    flat = n_outputs == 1 and not int_label
    raw = b.op("MatMul", ["X", COEF])
    if flat:
        raw = b.op("Reshape", [raw, b.ints([-1], hint="rows")])
        label = b.op("Reshape", [LABEL, b.ints([-1], hint="rows")])
    else:
        label = LABEL
    if x_offset is not None:
        offset = b.const(np.asarray(x_offset, dtype).reshape(1, n_features), dtype)
        centre = b.op("MatMul", [offset, COEF])  # (1, k)
        raw = b.op("Sub", [raw, b.op("Reshape", [centre, b.ints([-1], hint="rows")])
                           if flat else centre])
    inits = [numpy_helper.from_array(np.zeros((n_features, n_outputs), dtype), COEF)]
    if fit_intercept:
        raw = b.op("Add", [raw, INTERCEPT])
        inits.append(numpy_helper.from_array(np.zeros(n_outputs, dtype), INTERCEPT))
    for name, value in extra_weights.items():
        inits.append(numpy_helper.from_array(value, name))
    rows = row_loss(b, raw, label)
    # (N, k) row losses: the weights (N, 1) broadcast over the columns.
    weight = SAMPLE_WEIGHT if flat else b.unsqueeze(SAMPLE_WEIGHT, [1])
    data = b.reduce("ReduceSum", b.op("Mul", [rows, weight]), keepdims=0)
    loss = b.op("Mul", [DATA_SCALE, data])
    inits.append(numpy_helper.from_array(values[DATA_SCALE], DATA_SCALE))
    if np.any(l2):
        squares = b.op("Mul", [COEF, COEF])
        penalty = b.reduce("ReduceSum", b.op("Mul", [squares, L2]), keepdims=0)
        loss = b.op("Add", [loss, penalty])
        inits.append(numpy_helper.from_array(l2, L2))
    b.op("Identity", [loss], outputs=[LOSS])
    label = (helper.make_tensor_value_info(LABEL, TensorProto.INT64, ["N"]) if int_label
             else helper.make_tensor_value_info(LABEL, TensorProto.DOUBLE, ["N", n_outputs]))
    graph = helper.make_graph(
        b.nodes, "objective",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", n_features]), label,
         helper.make_tensor_value_info(SAMPLE_WEIGHT, TensorProto.DOUBLE, ["N"])],
        [helper.make_tensor_value_info(LOSS, TensorProto.DOUBLE, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)])
    return finalize_model(model)


def svm_primal_objective(n_features, n_outputs, cost, score, **score_params):
    """``1/2 ||w~||^2 + sum_ik cost_ik * loss(x~_i . w~_k, y_ik)`` (w~ holds the intercept).

    ``cost`` (N, n_outputs) is an initializer the fit does not train.
    """
    def row_loss(b, raw, label):
        return b.op("Mul", [elementwise_loss(b, score, raw, label, np.float64, **score_params),
                            COST])

    # one output: the row losses are vectors (N,) (linear_objective), the costs too
    return linear_objective(n_features, n_outputs, row_loss, fit_intercept=False,
                            data_scale=1.0, l2=0.5,
                            extra_weights={COST: cost.ravel() if n_outputs == 1 else cost},
                            loss_key=("svm", score, *sorted(score_params.items())))


def svm_dual_objective(n_features, n_samples, n_outputs, epsilon=None, squared=False):
    """liblinear's dual of the hinge (``epsilon=None``) or epsilon-insensitive loss.

    Inputs ``X`` (N, n_features), ``y`` (N, n_outputs): signs in {-1, 1} (hinge)
    or targets; trained ``dual`` (and ``dual_negative`` for the regression).
    ``squared``: the squared hinge's dual, with the input ``dual_diagonal``
    (N, n_outputs), ``1 / (4 C_i)``: ``+ sum_i a_i^2 / (4 C_i)`` (liblinear's
    ``D_ii = 1 / (2 C_i)`` in ``a^T (Q + D) a / 2``), and no upper bound on ``a``.
    """
    f64 = np.float64
    b = GraphBuilder(used_names=["X", LABEL, DUAL, DUAL_NEG, DUAL_DIAG, LOSS], prefix="dual_")
    inits = [numpy_helper.from_array(np.zeros((n_samples, n_outputs), f64), DUAL)]
    if epsilon is None:
        signed = b.op("Mul", [DUAL, LABEL])
        linear = b.reduce("ReduceSum", DUAL, keepdims=0)
    else:
        inits.append(numpy_helper.from_array(np.zeros((n_samples, n_outputs), f64), DUAL_NEG))
        signed = b.op("Sub", [DUAL, DUAL_NEG])
        total = b.reduce("ReduceSum", b.op("Add", [DUAL, DUAL_NEG]), keepdims=0)
        fit = b.reduce("ReduceSum", b.op("Mul", [signed, LABEL]), keepdims=0)
        linear = b.op("Sub", [fit, b.op("Mul", [b.const(float(epsilon), f64), total])])
    w = b.op("MatMul", [b.op("Transpose", ["X"], perm=[1, 0]), signed])
    half = b.op("Mul", [b.const(0.5, f64), b.reduce("ReduceSum", b.op("Mul", [w, w]),
                                                    keepdims=0)])
    inputs = [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", n_features]),
              helper.make_tensor_value_info(LABEL, TensorProto.DOUBLE, ["N", n_outputs])]
    if squared:
        diagonal = b.reduce("ReduceSum", b.op("Mul", [DUAL_DIAG, b.op("Mul", [DUAL, DUAL])]),
                            keepdims=0)
        half = b.op("Add", [half, diagonal])
        inputs.append(helper.make_tensor_value_info(DUAL_DIAG, TensorProto.DOUBLE,
                                                    ["N", n_outputs]))
    b.op("Sub", [half, linear], outputs=[LOSS])
    graph = helper.make_graph(
        b.nodes, "dual", inputs,
        [helper.make_tensor_value_info(LOSS, TensorProto.DOUBLE, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)])
    return finalize_model(model)


def pinball_objective(n_features, fit_intercept, quantile, alpha, width, data_scale,
                       sparse=False):
    """Smoothed pinball on ``X @ (pos - neg) + intercept`` plus ``alpha sum(pos + neg)``.

    ``sparse``: ``X @ pos - X @ neg``, the form a sparse ``X`` needs (it may
    only multiply trained weights, :func:`ortlearn.training.minimize_lbfgs`).
    """
    f64 = np.float64
    # the numbers are untrained initializers, fed as data by minimize_lbfgs: every
    # smoothing stage reuses the first stage's gradient session
    numbers = {"smoothing_width": width, "smoothing_factor": 0.5 / width, "quantile": quantile,
               DATA_SCALE: data_scale, "l1_strength": alpha}
    b = GraphBuilder(used_names=["X", LABEL, SAMPLE_WEIGHT, POS, NEG, INTERCEPT, LOSS,
                                 *numbers], prefix="quantile_")
    if sparse:
        raw = b.op("Sub", [b.op("MatMul", ["X", POS]), b.op("MatMul", ["X", NEG])])
    else:
        raw = b.op("MatMul", ["X", b.op("Sub", [POS, NEG])])
    # vectors (N,) from here: onnxruntime broadcasts (N, 1) with scalars slowly
    # (linear_objective says how much)
    raw = b.op("Reshape", [raw, b.ints([-1], hint="rows")])
    inits = [numpy_helper.from_array(np.zeros((n_features, 1), f64), POS),
             numpy_helper.from_array(np.zeros((n_features, 1), f64), NEG),
             *(numpy_helper.from_array(np.asarray(v, f64), k) for k, v in numbers.items())]
    if fit_intercept:
        raw = b.op("Add", [raw, INTERCEPT])
        inits.append(numpy_helper.from_array(np.zeros(1, f64), INTERCEPT))
    residual = b.op("Sub", [b.op("Reshape", [LABEL, b.ints([-1], hint="rows")]), raw])
    # q r + relu(-r), relu smoothed: m = min(relu(z), width), m^2 / (2 width) + relu(z) - m.
    below = b.op("Relu", [b.op("Neg", [residual])])
    m = b.op("Min", [below, "smoothing_width"])
    smooth = b.op("Add", [b.op("Mul", [b.op("Mul", [m, m]), "smoothing_factor"]),
                          b.op("Sub", [below, m])])
    rows = b.op("Add", [b.op("Mul", ["quantile", residual]), smooth])
    data = b.reduce("ReduceSum", b.op("Mul", [rows, SAMPLE_WEIGHT]), keepdims=0)
    l1 = b.reduce("ReduceSum", b.op("Add", [POS, NEG]), keepdims=0)
    b.op("Add", [b.op("Mul", [DATA_SCALE, data]), b.op("Mul", ["l1_strength", l1])],
         outputs=[LOSS])
    graph = helper.make_graph(
        b.nodes, "quantile",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", n_features]),
         helper.make_tensor_value_info(LABEL, TensorProto.DOUBLE, ["N", 1]),
         helper.make_tensor_value_info(SAMPLE_WEIGHT, TensorProto.DOUBLE, ["N"])],
        [helper.make_tensor_value_info(LOSS, TensorProto.DOUBLE, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)])
    return finalize_model(model)
