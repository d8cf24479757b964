"""The conversion: a fitted scikit-learn estimator to an ONNX graph to train.

:func:`to_train_onnx` calls skl2onnx, lowers the ``ai.onnx.ml`` operators left
(:mod:`~ortlearn.convert.lowering`), freezes every initializer that is not a
weight, puts the estimator's weights back (:mod:`~ortlearn.convert.weights`)
and fixes up the outputs (``raw_scores`` of classifiers, output columns of
regressors, a named batch dimension).
"""

from __future__ import annotations

import copy
import hashlib

import numpy as np
import onnx
from onnx import helper, numpy_helper
from sklearn.base import is_classifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline

from ..graph import (
    DEFAULT_ML_OPSET,
    DEFAULT_OPSET,
    MIN_OPSET,
    GraphBuilder,
    finalize_model,
    needed_nodes,
    np_dtype_to_onnx,
    rename_value,
    weight_stub,
)
from ..graph.cache import LRUCache
from .lowering import _ML_DOMAIN, lower_ml_operators
from .weights import _LINEAR, _MLP, _final_estimator, get_weights, set_weights

__all__ = ["RAW_PREDICTIONS", "RAW_SCORES", "to_train_onnx"]

#: Name of the output of classifiers that holds the logits (see :func:`to_train_onnx`).
RAW_SCORES = "raw_scores"
#: Name of the value (not an output) a regressor with a log link exponentiates:
#: ``MLPRegressor(loss='poisson')`` predicts ``exp(raw_predictions)``.
RAW_PREDICTIONS = "raw_predictions"


def to_train_onnx(estimator, X, dtype=None, target_opset: int = DEFAULT_OPSET,
                  values: bool = True) -> onnx.ModelProto:
    """Convert a fitted scikit-learn estimator into an ONNX graph to train.

    skl2onnx converts the estimator (no ZipMap for classifiers); the
    ``ai.onnx.ml`` operators left are lowered to standard operators
    (:func:`lower_ml_operators`); every initializer that is not a weight of
    the final estimator becomes a ``Constant`` node (scalers are frozen), so
    that :func:`get_train_initializer` lists exactly the weights of
    :func:`get_weights`, in that order.

    Parameters
    ----------
    estimator : estimator or Pipeline
        A fitted estimator of :data:`SUPPORTED_ESTIMATORS`, possibly last in a
        Pipeline whose other steps are in :data:`SUPPORTED_PREPROCESSORS`. Use
        :func:`init_template` to get the initial weights of an unfitted one.
    X : array-like of shape (n_samples, n_features)
        Sample input: gives the number of features (and the dtype when
        ``dtype`` is None).
    dtype : {numpy.float32, numpy.float64}, default=None
        Element type of the input, the weights and the float outputs. None
        takes X's dtype when it is float32 or float64, float32 otherwise.
    target_opset : int, default=DEFAULT_OPSET
        ai.onnx opset of the graph.
    values : bool, default=True
        False: the weights' initializers hold their names, types and shapes
        but no values (:func:`~ortlearn.graph.weight_stub`), for a caller
        that gives the values to the training session itself
        (``initial_weights``): a large model's weights are then not copied
        into the graph and every graph built from it.

    Returns
    -------
    onnx.ModelProto
        One input ``X`` of shape ``(N, n_features)``. Outputs: ``variable``
        ``(N, n_outputs)`` for regressors; ``label`` ``(N,)``,
        ``probabilities`` ``(N, n_classes)`` and ``raw_scores`` for
        classifiers: ``(N, 1)`` for binary problems (the logit of the
        positive class, ``decision_function``), ``(N, n_classes)`` otherwise
        (the logits the softmax or the sigmoids take). A multilabel
        ``MLPClassifier`` has ``label`` ``(N, n_labels)`` (the 0/1 indicator
        matrix) and ``probabilities`` ``(N, n_labels)`` (one sigmoid per
        label). ``MLPRegressor(loss='poisson')`` computes ``variable`` as
        ``exp(raw_predictions)``.

    Raises
    ------
    TypeError
        The estimator (or a Pipeline step) is not supported.
    ValueError
        Bad ``X``, ``dtype`` or ``target_opset``.
    sklearn.exceptions.NotFittedError
        The estimator has no weights.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LogisticRegression
    >>> from ortlearn.convert import get_train_initializer
    >>> X = np.array([[0., 1.], [1., 0.], [2., 1.], [3., 0.]])
    >>> onx = to_train_onnx(LogisticRegression().fit(X, [0, 0, 1, 1]), X)
    >>> [o.name for o in onx.graph.output], get_train_initializer(onx)
    (['label', 'probabilities', 'raw_scores'], ['coef', 'intercept'])
    """
    weights = get_weights(estimator)
    dtype = _resolve_dtype(X, dtype)
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"X must be a non-empty 2-D array, got shape {X.shape}.")
    if not MIN_OPSET <= target_opset <= DEFAULT_OPSET:
        raise ValueError(
            f"target_opset must be between {MIN_OPSET} and {DEFAULT_OPSET}, got {target_opset}."
        )
    key = _structure_key(estimator, weights, dtype, X.shape[1], target_opset)
    cached = None if key is None else _CONVERTED.get(key)
    if cached is None:
        cached = _convert(estimator, weights, X, dtype, target_opset)
        if key is not None:
            _CONVERTED.put(key, cached)
    model = onnx.ModelProto()
    model.CopyFrom(cached)
    # every initializer is a weight (the others are Constant nodes): this fit's values
    for init in model.graph.initializer:
        value = weights[init.name]
        init.CopyFrom(numpy_helper.from_array(np.asarray(value, dtype=dtype), init.name)
                      if values else weight_stub(init.name, init.data_type, np.shape(value)))
    return model


#: The last graphs ``to_train_onnx`` converted, by structure: a fit of the same
#: estimator on other rows (a fold of a search, a clone, a refit) gets a copy
#: with its own weights instead of a new skl2onnx conversion.
_CONVERTED = LRUCache(16)
#: Larger models are converted anew: their conversion is small beside their
#: training, and a kept copy would hold their weights.
_CONVERTED_MAX_WEIGHT_BYTES = 1 << 20


def _structure_key(estimator, weights: dict, dtype, n_features: int, target_opset: int):
    """What the converted graph depends on besides the weights' values; None: not cached.

    A Pipeline is not: its steps' fitted values (a scaler's) are constants of
    the graph; nor a model of more than ``_CONVERTED_MAX_WEIGHT_BYTES`` of
    weights. An estimator's graph depends on its class, its parameters, the
    shapes of its weights and the fitted attributes that choose the outputs
    (the classes, the output activation, multilabel or not).
    """
    if isinstance(estimator, Pipeline) or sum(
            np.asarray(w).nbytes for w in weights.values()) > _CONVERTED_MAX_WEIGHT_BYTES:
        return None
    fitted = [_fingerprint(getattr(estimator, name, None)) for name in _STRUCTURAL_ATTRIBUTES]
    params = {name: value for name, value in estimator.get_params(deep=False).items()
              if name not in _TRAINING_ONLY_PARAMS}
    return (type(estimator).__module__, type(estimator).__qualname__, _fingerprint(params),
            tuple((name, np.shape(w), np.asarray(w).dtype.str) for name, w in weights.items()),
            tuple(fitted), _is_multilabel(estimator), np.dtype(dtype).str, n_features,
            target_opset)


#: Parameters skl2onnx's converters of :data:`SUPPORTED_ESTIMATORS` never read (they read
#: the fitted weights, ``loss``, ``activation``, ``solver`` and ``multi_class``): fits that
#: differ only in these (a search's grid, seeds, folds) share one conversion. Any other
#: parameter keys the graph, so a parameter a later converter reads converts anew.
_TRAINING_ONLY_PARAMS = frozenset({
    "alpha", "average", "batch_size", "beta_1", "beta_2", "C", "class_weight", "copy_X",
    "dual", "early_stopping", "epsilon", "eta0", "intercept_scaling", "l1_ratio",
    "learning_rate", "learning_rate_init", "max_fun", "max_iter", "momentum",
    "n_iter_no_change", "n_jobs", "nesterovs_momentum", "penalty", "positive", "power_t",
    "precompute", "random_state", "selection", "shuffle", "tol", "validation_fraction",
    "verbose", "warm_start",
})
#: Fitted attributes (besides the weights) the converted graph depends on.
_STRUCTURAL_ATTRIBUTES = ("classes_", "out_activation_", "n_outputs_", "n_layers_")


def _fingerprint(value):
    """A hashable, exact stand-in for ``value`` (arrays by their bytes)."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape,
                hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
                if value.dtype != object else repr(value.tolist()))
    if isinstance(value, dict):
        return tuple(sorted((k, _fingerprint(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_fingerprint(v) for v in value)
    return repr(value)


def _convert(estimator, weights: dict, X, dtype, target_opset: int) -> onnx.ModelProto:
    """The graph of :func:`to_train_onnx`, converted by skl2onnx and made trainable; its
    initializers still hold the probe's values (the caller writes the weights)."""
    n_features = X.shape[1]
    narrow = not isinstance(estimator, Pipeline) and n_features > NARROW_ABOVE
    probe = _with_distinct_weights(estimator, weights, narrow)
    sample = X[:1, :_NARROW] if narrow else X[:1]
    model = lower_ml_operators(_skl2onnx_convert(probe, sample.astype(dtype), target_opset))
    _freeze_initializers(model, list(weights))
    if narrow:
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = n_features
    final = _final_estimator(estimator)
    n_scores = weights[[name for name in weights if name.startswith("coef")][-1]].shape[1]
    if is_classifier(final):
        # the Add of the last intercept (frozen when fit_intercept=False) gives the logits
        intercept = "intercept" if isinstance(final, _LINEAR) else list(weights)[-1]
        _add_raw_scores(model, intercept, np_dtype_to_onnx(dtype), n_scores)
        if _is_multilabel(final):
            _multilabel_outputs(model, n_scores)
    else:
        _set_output_columns(model, n_scores)
        if getattr(final, "out_activation_", None) == "exp":
            _exp_output(model, list(weights)[-1])
    _name_batch_dimension(model)
    # Without the nodes no output reads (a converter's spare Constant), which onnxruntime
    # would warn about at every load.
    kept = needed_nodes(model.graph.node, [o.name for o in model.graph.output])
    del model.graph.node[:]
    model.graph.node.extend(kept)
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", target_opset))
    return finalize_model(model)


#: Above this many input features, an estimator (not a Pipeline: its scalers hold a
#: value per feature) is converted from a probe reading ``_NARROW`` features, and the
#: graph gets its real input width and weights afterwards: skl2onnx copies every
#: weight several times while it converts (112 MB of peak for the 8 MB of a
#: 200 000-feature MLP), and the graph of ``X @ coef`` does not depend on the width.
NARROW_ABOVE = 256
_NARROW = 2


def _with_distinct_weights(estimator, weights: dict, narrow: bool = False):
    """A copy of ``estimator`` whose weights all hold different values.

    skl2onnx merges initializers holding equal values (the zero ``coef`` and
    ``intercept`` of a one-feature template become one tensor): the graph is
    converted from this copy, then gets the real weights back. With
    ``narrow``, the first weight (the one multiplying ``X``) keeps only
    ``_NARROW`` rows and the copy reads ``_NARROW`` features.
    """
    # The weight arrays are shared, not copied: set_weights replaces them in the
    # probe (and the probe is converted, never trained), so a copy would only
    # add the weights' size to the fit's peak memory.
    final = _final_estimator(estimator)
    shared = [v for v in vars(final).values() if isinstance(v, np.ndarray)]
    shared += [a for v in vars(final).values() if isinstance(v, list)
               for a in v if isinstance(a, np.ndarray)]
    probe = copy.deepcopy(estimator, {id(a): a for a in shared})
    first = next(iter(weights))
    start, placeholders = 1.0, {}
    for name, value in weights.items():
        shape = (_NARROW, *value.shape[1:]) if narrow and name == first else value.shape
        # start + arange / 1024, computed in place: one array, no temporaries
        placeholder = np.arange(int(np.prod(shape)), dtype=np.float64)
        placeholder /= 1024
        placeholder += start
        placeholders[name] = placeholder.reshape(shape)
        start += placeholder.size
    if narrow:
        _set_narrow_first_weight(_final_estimator(probe), placeholders.pop(first))
    set_weights(probe, placeholders, copy=False)
    return probe


def _set_narrow_first_weight(final, value: np.ndarray) -> None:
    """Give ``final`` a first weight of ``_NARROW`` input rows (graph layout ``value``)."""
    if isinstance(final, _MLP):
        final.coefs_[0] = value.astype(final.coefs_[0].dtype)
    else:
        coef = value.T if np.ndim(final.coef_) == 2 else value.reshape(-1)
        final.coef_ = np.ascontiguousarray(coef, dtype=final.coef_.dtype)
    final.n_features_in_ = _NARROW
    if hasattr(final, "feature_names_in_"):
        del final.feature_names_in_


def _resolve_dtype(X, dtype) -> np.dtype:
    if dtype is None:
        dtype = getattr(X, "dtype", None)
        if dtype is None or np.dtype(dtype) not in (np.float32, np.float64):
            dtype = np.float32
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}.")
    return dtype


def _skl2onnx_convert(estimator, X, target_opset) -> onnx.ModelProto:
    from skl2onnx import to_onnx

    final = _final_estimator(estimator)
    if isinstance(final.intercept_ if isinstance(final, _LINEAR) else None, float):
        # skl2onnx expects an array, fit_intercept=False leaves a float
        estimator = copy.deepcopy(estimator)
        final = _final_estimator(estimator)
        final.intercept_ = np.asarray(final.intercept_)
    if getattr(final, "out_activation_", None) == "exp":
        # skl2onnx has no 'exp' output activation (MLPRegressor(loss='poisson')): the
        # graph of the identity gets its Exp from _exp_output.
        estimator = copy.deepcopy(estimator)
        final = _final_estimator(estimator)
        final.out_activation_ = "identity"
    options = {id(final): {"zipmap": False}} if is_classifier(final) else None
    # skl2onnx writes these with standard operators when asked (it always
    # does in float64); Normalizer is left to lower_ml_operators, skl2onnx
    # has no standard form of its 'max' norm.
    black_op = {"LinearRegressor", "LinearClassifier", "Scaler"}
    model = to_onnx(estimator, X, options=options, black_op=black_op,
                    target_opset={"": target_opset, _ML_DOMAIN: DEFAULT_ML_OPSET})
    if isinstance(final, LogisticRegression):
        _one_row_of_weights(model)
    return model


def _one_row_of_weights(model: onnx.ModelProto) -> None:
    """Give a LogisticRegression graph the weights sklearn trains.

    skl2onnx computes the scores ``x @ coef + intercept`` with
    ``coef = (-w, w)`` for a binary problem: the weights would be trained
    twice. The graph gets ``coef = w`` ``(n_features, 1)`` and
    ``intercept = b`` ``(1,)``, and computes the two columns as
    ``Concat(-z, z)`` from the decision function ``z``. Multiclass
    intercepts ``(1, n_classes)`` become ``(n_classes,)`` (same broadcast).
    """
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    coef = numpy_helper.to_array(inits["coef"])
    intercept = numpy_helper.to_array(inits["intercept"]).reshape(-1)
    if coef.shape[1] == 2:
        if not (np.array_equal(coef[:, 0], -coef[:, 1]) and intercept[0] == -intercept[1]):
            raise RuntimeError("skl2onnx's binary LogisticRegression graph has changed form.")
        coef, intercept = coef[:, 1:], intercept[1:]
        (index, add), = [(i, n) for i, n in enumerate(graph.node)
                         if n.op_type == "Add" and "intercept" in n.input]
        b = GraphBuilder.for_model(model)
        both = add.output[0]
        add.output[0] = b.unique_name("decision")
        b.op("Concat", [b.op("Neg", [add.output[0]]), add.output[0]], outputs=[both], axis=1)
        nodes = list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes[:index + 1] + b.nodes + nodes[index + 1:])
    inits["coef"].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(coef), "coef"))
    inits["intercept"].CopyFrom(numpy_helper.from_array(intercept, "intercept"))


def _freeze_initializers(model: onnx.ModelProto, keep: list[str]) -> None:
    """Turn every initializer not in ``keep`` into a Constant node; order the rest as ``keep``."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    missing = [name for name in keep if name not in inits]
    if missing:
        raise RuntimeError(
            f"The graph skl2onnx wrote has no initializer {missing}: this version of "
            "skl2onnx names the weights differently from what ortlearn expects."
        )
    b = GraphBuilder.for_model(model)
    for name, init in inits.items():
        if name not in keep:
            b.op("Constant", [], outputs=[name], value=init)
    nodes = b.nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(inits[name] for name in keep)


def _add_raw_scores(model, intercept: str, elem_type: int, n_scores: int) -> None:
    """Expose the output of the last ``+ intercept`` (the logits) as ``raw_scores``.

    The predicted label of a multiclass model becomes the argmax of these scores.
    """
    graph = model.graph
    adds = [n for n in graph.node if n.op_type == "Add" and intercept in n.input]
    if len(adds) != 1:
        raise RuntimeError(f"Expected one Add node taking {intercept!r}, found {len(adds)}.")
    source = adds[0].output[0]
    b = GraphBuilder.for_model(model)
    if source != RAW_SCORES:
        if any(RAW_SCORES in (*n.input, *n.output) for n in graph.node):
            rename_value(model, RAW_SCORES, b.unique_name(RAW_SCORES))
        b.op("Identity", [source], outputs=[RAW_SCORES])
        graph.node.extend(b.nodes)
    graph.output.append(helper.make_tensor_value_info(RAW_SCORES, elem_type, ["N", n_scores]))
    if n_scores > 1:
        # sklearn predicts the argmax of the scores; saturated one-vs-rest
        # probabilities tie where the scores do not.
        for node in graph.node:
            if node.op_type == "ArgMax" and node.input[0] == "probabilities":
                node.input[0] = source


def _is_multilabel(final) -> bool:
    binarizer = getattr(final, "_label_binarizer", None)
    return getattr(binarizer, "y_type_", None) == "multilabel-indicator"


def _multilabel_outputs(model, n_labels: int) -> None:
    """A multilabel MLPClassifier's outputs: one probability and one 0/1 label per label.

    skl2onnx declares the labels ``(N,)`` and, for two labels, builds the
    probabilities of a binary problem ``(1 - p, p)``, four columns; the
    probabilities are the sigmoids of the logits, as sklearn's
    ``predict_proba`` returns them.
    """
    graph = model.graph
    sigmoids = [n for n in graph.node if n.op_type == "Sigmoid"
                and any(m.op_type == "Identity" and m.output[0] == RAW_SCORES
                        and m.input[0] == n.input[0] for m in graph.node)]
    if len(sigmoids) != 1:
        raise RuntimeError("skl2onnx's multilabel MLPClassifier graph has changed form.")
    (producer,) = [n for n in graph.node if "probabilities" in n.output]
    del producer.input[:]
    producer.input.append(sigmoids[0].output[0])
    producer.op_type = "Identity"
    del producer.attribute[:]
    for output in graph.output:
        if output.name in ("label", "probabilities"):
            dims = output.type.tensor_type.shape.dim
            del dims[:]
            dims.add().dim_param = "N"
            dims.add().dim_value = n_labels
    # the Sub of a two-label graph now feeds nothing
    kept = needed_nodes(graph.node, [o.name for o in graph.output])
    del graph.node[:]
    graph.node.extend(kept)


def _exp_output(model, intercept: str) -> None:
    """``variable = exp(raw_predictions)``: the output activation of a log link.

    The graph was converted with the identity output activation; the output
    of the last ``+ intercept`` is renamed :data:`RAW_PREDICTIONS` (the raw
    value the Poisson loss takes) and exponentiated before the output's
    reshape.
    """
    graph = model.graph
    adds = [n for n in graph.node if n.op_type == "Add" and intercept in n.input]
    if len(adds) != 1:
        raise RuntimeError(f"Expected one Add node taking {intercept!r}, found {len(adds)}.")
    source = adds[0].output[0]
    outputs = {o.name for o in graph.output}
    b = GraphBuilder.for_model(model)
    if source in outputs:  # the Add wrote the output itself: the Exp takes its place
        adds[0].output[0] = RAW_PREDICTIONS
        mean = source
        b.op("Exp", [RAW_PREDICTIONS], outputs=[mean])
    else:
        rename_value(model, source, RAW_PREDICTIONS)
        mean = b.unique_name("exp_predictions")
        for node in graph.node:
            for j, name in enumerate(node.input):
                if name == RAW_PREDICTIONS:
                    node.input[j] = mean
        b.op("Exp", [RAW_PREDICTIONS], outputs=[mean])
    nodes = list(graph.node)
    index = nodes.index(adds[0])
    del graph.node[:]
    graph.node.extend(nodes[:index + 1] + b.nodes + nodes[index + 1:])


def _set_output_columns(model, n_outputs: int) -> None:
    """Make a regressor's output ``(N, n_outputs)``.

    skl2onnx reshapes the output of MLPRegressor to ``(-1, 1)`` even when it
    has several outputs.
    """
    graph = model.graph
    (output,) = graph.output
    reshapes = [n for n in graph.node if n.op_type == "Reshape" and n.output[0] == output.name]
    if reshapes:
        b = GraphBuilder.for_model(model)
        reshapes[0].input[1] = b.ints([-1, n_outputs], hint="output_shape")
        nodes = b.nodes + list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes)
    dims = output.type.tensor_type.shape.dim
    del dims[:]
    dims.add().dim_param = "N"
    dims.add().dim_value = n_outputs


def _name_batch_dimension(model) -> None:
    """Call the first (batch) dimension of the input and outputs ``N`` when unnamed."""
    for value in list(model.graph.input) + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value") and not dims[0].dim_param:
            dims[0].dim_param = "N"
