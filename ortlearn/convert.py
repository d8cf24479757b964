"""Convert scikit-learn estimators into ONNX graphs whose weights can be trained.

skl2onnx does the conversion. What ortlearn adds:

* the ``ai.onnx.ml`` operators skl2onnx still emits (``LinearRegressor``,
  ``LinearClassifier``, ``Scaler``, ``Normalizer``, ``ArrayFeatureExtractor``)
  are lowered to standard operators (:func:`lower_ml_operators`), so that the
  graph can be differentiated and the weights become initializers;
* every initializer that is not a weight of the final estimator (scaler
  parameters, class labels, shapes, constants) becomes a ``Constant`` node,
  so :func:`get_train_initializer` returns exactly the trainable weights;
* classifiers get a ``raw_scores`` output (the logits the loss needs);
* :func:`init_template` builds an estimator whose weights are initialised as
  scikit-learn initialises them, and :func:`get_weights` /
  :func:`set_weights` move weights between an estimator and its graph.

Outputs of the graphs :func:`to_train_onnx` writes, in this order:

* regressors: ``variable``, shape ``(N, n_outputs)``;
* classifiers: ``label`` (shape ``(N,)``, the class labels),
  ``probabilities`` (``(N, n_classes)``) and ``raw_scores``: ``(N, 1)`` for a
  binary problem (the logit of the positive class, ``decision_function``),
  ``(N, n_classes)`` otherwise (the logits before the softmax, or the
  one-vs-rest decision functions of ``SGDClassifier``).

Trainable initializers, in graph order (:func:`get_weights` uses the same
names and layouts):

* linear models: ``coef`` ``(n_features, n_targets)`` and ``intercept``
  ``(n_targets,)`` (no ``intercept`` when ``fit_intercept=False``);
* MLPs: ``coefficient``, ``intercepts``, ``coefficient1``, ``intercepts1``, ...
  (``coefs_[i]`` and ``intercepts_[i]`` as a row ``(1, n_units)``).
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.base import clone, is_classifier
from sklearn.linear_model import (
    ElasticNet,
    Lasso,
    LinearRegression,
    LogisticRegression,
    Ridge,
    SGDClassifier,
    SGDRegressor,
)
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import MinMaxScaler, Normalizer, StandardScaler
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .graph import (
    DEFAULT_ML_OPSET,
    DEFAULT_OPSET,
    MIN_OPSET,
    GraphBuilder,
    elem_type_of,
    finalize_model,
    get_train_initializer,
    load_model,
    np_dtype_to_onnx,
    shape_of,
    value_info_map,
)

__all__ = [
    "SUPPORTED_ESTIMATORS",
    "SUPPORTED_PREPROCESSORS",
    "get_train_initializer",
    "get_weights",
    "init_template",
    "lower_ml_operators",
    "set_weights",
    "to_train_onnx",
]

#: Estimators :func:`to_train_onnx` converts (alone or last in a Pipeline).
SUPPORTED_ESTIMATORS = (
    LinearRegression,
    Ridge,
    Lasso,
    ElasticNet,
    SGDRegressor,
    LogisticRegression,
    SGDClassifier,
    MLPRegressor,
    MLPClassifier,
)
#: Frozen preprocessing steps allowed in front of the estimator in a Pipeline.
SUPPORTED_PREPROCESSORS = (StandardScaler, MinMaxScaler, Normalizer)

_LINEAR = (LinearRegression, Ridge, Lasso, ElasticNet, SGDRegressor,
           LogisticRegression, SGDClassifier)
_MLP = (MLPRegressor, MLPClassifier)
_ML_DOMAIN = "ai.onnx.ml"
RAW_SCORES = "raw_scores"


# ---------------------------------------------------------------------------
# trainable initializers


# ---------------------------------------------------------------------------
# estimators: checks, weights


def _final_estimator(estimator):
    return estimator.steps[-1][1] if isinstance(estimator, Pipeline) else estimator


def _supported_names() -> str:
    names = [cls.__name__ for cls in SUPPORTED_ESTIMATORS]
    pre = [cls.__name__ for cls in SUPPORTED_PREPROCESSORS]
    return f"{', '.join(names)}, or a Pipeline of {', '.join(pre)} followed by one of them"


def _check_supported(estimator) -> None:
    """Raise TypeError/ValueError unless ortlearn can train ``estimator``."""
    if isinstance(estimator, Pipeline):
        for name, step in estimator.steps[:-1]:
            if type(step) not in SUPPORTED_PREPROCESSORS:
                raise TypeError(
                    f"Pipeline step {name!r} is a {type(step).__name__}, which ortlearn cannot "
                    f"convert; supported: {_supported_names()}."
                )
        if isinstance(step, Normalizer) and step.norm == "max":
            raise ValueError(
                f"Pipeline step {name!r}: Normalizer(norm='max') is not supported (skl2onnx "
                "divides by the largest value, not the largest absolute value); use 'l1' or 'l2'."
            )
    final = _final_estimator(estimator)
    if type(final) not in SUPPORTED_ESTIMATORS:
        raise TypeError(
            f"ortlearn cannot convert a {type(final).__name__} into a trainable graph; "
            f"supported: {_supported_names()}."
        )
    if isinstance(final, SGDClassifier) and final.loss != "log_loss":
        raise ValueError(
            f"SGDClassifier(loss={final.loss!r}) is not supported: only loss='log_loss' "
            "defines the probabilities the graph computes."
        )


def _mlp_names(n_layers: int) -> list[tuple[str, str]]:
    """skl2onnx's names of the (coefficient, intercepts) of each MLP layer."""
    suffix = [""] + [str(i) for i in range(1, n_layers)]
    return [(f"coefficient{s}", f"intercepts{s}") for s in suffix]


def get_weights(estimator) -> dict[str, np.ndarray]:
    """Weights of a fitted estimator, named and shaped as in its ONNX graph.

    Parameters
    ----------
    estimator : estimator or Pipeline
        A fitted supported estimator (see :data:`SUPPORTED_ESTIMATORS`); for
        a Pipeline, the weights of its last step.

    Returns
    -------
    dict of str to ndarray
        Initializer name to value, in the order of the graph
        :func:`to_train_onnx` writes: ``coef`` ``(n_features, n_targets)`` and
        ``intercept`` ``(n_targets,)`` for linear models; ``coefficient``,
        ``intercepts``, ``coefficient1``, ... for MLPs (intercepts as rows
        ``(1, n_units)``).

    Raises
    ------
    TypeError
        The estimator is not supported.
    sklearn.exceptions.NotFittedError
        The estimator has no weights yet (see :func:`init_template`).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LogisticRegression
    >>> X = np.array([[0., 1.], [1., 0.], [2., 1.], [3., 0.]])
    >>> clf = LogisticRegression().fit(X, [0, 0, 1, 1])
    >>> {k: v.shape for k, v in get_weights(clf).items()}
    {'coef': (2, 1), 'intercept': (1,)}
    """
    _check_supported(estimator)
    final = _final_estimator(estimator)
    if isinstance(final, _MLP):
        check_is_fitted(final, "coefs_")
        weights = {}
        for (wname, bname), coef, intercept in zip(
            _mlp_names(len(final.coefs_)), final.coefs_, final.intercepts_
        ):
            weights[wname] = np.array(coef)
            weights[bname] = np.asarray(intercept).reshape(1, -1)
        return weights
    check_is_fitted(final, "coef_")
    coef = np.asarray(final.coef_)
    coef = coef.reshape(1, -1) if coef.ndim == 1 else coef
    weights = {"coef": np.ascontiguousarray(coef.T)}
    if final.fit_intercept:
        weights["intercept"] = np.asarray(final.intercept_, dtype=coef.dtype).reshape(-1)
    return weights


def _write_back(old, value, name):
    """``value`` in the shape and dtype of the attribute ``old``, or ValueError."""
    old = np.asarray(old)
    value = np.asarray(value)
    if value.size != old.size:
        raise ValueError(
            f"Weight {name!r} has {value.size} values ({value.shape}); the estimator "
            f"expects {old.size} ({old.shape})."
        )
    dtype = old.dtype if np.issubdtype(old.dtype, np.floating) else value.dtype
    return value.reshape(old.shape).astype(dtype)


def set_weights(estimator, weights: dict) -> None:
    """Write weights named as in the ONNX graph back into a fitted estimator.

    The inverse of :func:`get_weights`: shapes are those of the graph, the
    estimator's attributes (``coef_``/``intercept_``, ``coefs_``/
    ``intercepts_``) keep their own shapes and dtypes. Names not given are
    left unchanged.

    Parameters
    ----------
    estimator : estimator or Pipeline
        A fitted (or :func:`init_template`) supported estimator, modified in place.
    weights : dict of str to array-like
        Initializer name to value, e.g. the trained weights of a session.

    Raises
    ------
    TypeError
        The estimator is not supported.
    ValueError
        A name is not a weight of the estimator, or a value has the wrong size.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LinearRegression
    >>> X = np.array([[0., 1.], [1., 0.], [2., 1.]])
    >>> lr = LinearRegression().fit(X, [1., 2., 4.])
    >>> set_weights(lr, {'coef': np.array([[1.], [2.]]), 'intercept': np.array([3.])})
    >>> lr.coef_, lr.intercept_
    (array([1., 2.]), np.float64(3.0))
    """
    current = get_weights(estimator)
    unknown = sorted(set(weights) - set(current))
    if unknown:
        raise ValueError(
            f"{unknown} are not weights of {type(_final_estimator(estimator)).__name__}; "
            f"expected names among {list(current)}."
        )
    final = _final_estimator(estimator)
    if isinstance(final, _MLP):
        for i, (wname, bname) in enumerate(_mlp_names(len(final.coefs_))):
            if wname in weights:
                final.coefs_[i] = _write_back(final.coefs_[i], weights[wname], wname)
            if bname in weights:
                final.intercepts_[i] = _write_back(final.intercepts_[i], weights[bname], bname)
        return
    if "coef" in weights:
        coef = np.asarray(weights["coef"])
        # The graph holds coef_.T: transpose back before restoring coef_'s shape.
        coef = coef.T if coef.ndim == 2 else coef
        final.coef_ = _write_back(final.coef_, coef, "coef")
    if "intercept" in weights:
        intercept = _write_back(final.intercept_, weights["intercept"], "intercept")
        final.intercept_ = intercept[()] if intercept.ndim == 0 else intercept


# ---------------------------------------------------------------------------
# templates


def init_template(estimator, X, y):
    """A clone of ``estimator`` with the weights scikit-learn starts ``fit`` from.

    Nothing is trained: the weights are those scikit-learn would draw at the
    beginning of ``fit`` with the same ``random_state``, so that a graph from
    :func:`to_train_onnx` can be trained from the same starting point.

    * MLPs: Glorot-uniform weights drawn by the estimator's own
      initialisation (``MLPRegressor._initialize``), same random draws;
    * linear models: zero ``coef_`` and ``intercept_`` (what SGD and the
      solvers of LogisticRegression start from); ``classes_`` is set for
      classifiers.

    Steps in front of the estimator in a Pipeline (scalers) are fitted on
    ``X``: their parameters are data, not weights.

    Parameters
    ----------
    estimator : estimator or Pipeline
        A supported estimator (see :data:`SUPPORTED_ESTIMATORS`), fitted or not.
    X : array-like of shape (n_samples, n_features)
        Training data (gives the number of features and the dtype).
    y : array-like of shape (n_samples,) or (n_samples, n_outputs)
        Targets (give the number of outputs, or the classes).

    Returns
    -------
    estimator
        A new estimator, ready for :func:`to_train_onnx`.

    Raises
    ------
    TypeError
        The estimator is not supported.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.neural_network import MLPRegressor
    >>> X = np.random.rand(10, 3)
    >>> mlp = init_template(MLPRegressor(hidden_layer_sizes=(4,), random_state=0), X, X[:, 0])
    >>> [c.shape for c in mlp.coefs_]
    [(3, 4), (4, 1)]
    """
    _check_supported(estimator)
    template = clone(estimator)
    if isinstance(template, Pipeline):
        Xt = X
        for _, step in template.steps[:-1]:
            Xt = step.fit_transform(Xt, y)
        _init_final(template.steps[-1][1], Xt, y)
    else:
        _init_final(template, X, y)
    return template


def _init_final(est, X, y) -> None:
    if isinstance(est, _MLP):
        _init_mlp(est, X, y)
    else:
        _init_linear(est, X, y)


def _init_mlp(est, X, y) -> None:
    """The first steps of ``BaseMultilayerPerceptron._fit``, without training."""
    for hook in ("_validate_params", "_validate_input", "_initialize"):
        if not hasattr(est, hook):
            raise RuntimeError(
                f"This scikit-learn version has no {type(est).__name__}.{hook}: "
                "ortlearn cannot reproduce its weight initialisation."
            )
    est._validate_params()
    hidden = est.hidden_layer_sizes
    hidden = list(hidden) if hasattr(hidden, "__iter__") else [hidden]
    if any(h <= 0 for h in hidden):
        raise ValueError(f"hidden_layer_sizes must be > 0, got {hidden}.")
    X, y = est._validate_input(X, y, incremental=False, reset=True)
    y = y.reshape(-1, 1) if y.ndim == 1 else y
    layer_units = [X.shape[1], *hidden, y.shape[1]]
    est._random_state = check_random_state(est.random_state)
    est._initialize(y, layer_units, X.dtype)


def _init_linear(est, X, y) -> None:
    est._validate_params()
    X, y = validate_data(est, X, y, dtype=(np.float64, np.float32), multi_output=True,
                         y_numeric=not is_classifier(est))
    n_features = X.shape[1]
    if is_classifier(est):
        est.classes_ = np.unique(y)
        n_rows = 1 if len(est.classes_) == 2 else len(est.classes_)
        est.coef_ = np.zeros((n_rows, n_features), dtype=X.dtype)
        est.intercept_ = np.zeros(n_rows, dtype=X.dtype)
    elif isinstance(est, SGDRegressor):
        est.coef_ = np.zeros(n_features, dtype=X.dtype)
        est.intercept_ = np.zeros(1, dtype=X.dtype)
    elif y.ndim == 2:
        est.coef_ = np.zeros((y.shape[1], n_features), dtype=X.dtype)
        est.intercept_ = np.zeros(y.shape[1], dtype=X.dtype)
    else:
        est.coef_ = np.zeros(n_features, dtype=X.dtype)
        est.intercept_ = X.dtype.type(0)


# ---------------------------------------------------------------------------
# lowering of ai.onnx.ml operators


def lower_ml_operators(onx) -> onnx.ModelProto:
    """Replace the ``ai.onnx.ml`` operators of a model by standard operators.

    The lowered graph computes the same outputs with operators that can be
    differentiated; the weights of ``LinearRegressor`` and
    ``LinearClassifier`` (attributes of those operators) become float
    initializers named ``coef`` (``(n_features, n_targets)``) and
    ``intercept`` (``(n_targets,)``), which :func:`get_train_initializer`
    lists. The parameters of ``Scaler`` and ``Normalizer`` and the class
    labels become ``Constant`` nodes. A binary ``LinearClassifier`` written
    as two opposite rows (skl2onnx's form of a binary logistic regression) is
    lowered to its decision function, one column.

    Lowered: ``LinearRegressor`` (post_transform NONE), ``LinearClassifier``
    (NONE, LOGISTIC, SOFTMAX), ``Scaler``, ``Normalizer``,
    ``ArrayFeatureExtractor`` (as ``Gather``). The ml operators compute in
    float32: so does the lowered graph (other inputs are cast to float32).

    Parameters
    ----------
    onx : onnx.ModelProto, bytes or path
        The model; it is not modified.

    Returns
    -------
    onnx.ModelProto
        A new model without ``ai.onnx.ml`` nodes (the ``ai.onnx.ml`` opset
        import is removed).

    Raises
    ------
    ValueError
        An ``ai.onnx.ml`` operator (or attribute value) ortlearn cannot lower;
        the message names the node.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LinearRegression
    >>> from skl2onnx import to_onnx
    >>> X = np.random.rand(20, 3).astype(np.float32)
    >>> onx = to_onnx(LinearRegression().fit(X, X[:, 0]), X)
    >>> [n.op_type for n in onx.graph.node]
    ['LinearRegressor']
    >>> lowered = lower_ml_operators(onx)
    >>> [n.op_type for n in lowered.graph.node], get_train_initializer(lowered)
    (['MatMul', 'Add'], ['coef', 'intercept'])
    """
    model = load_model(onx)
    infos = value_info_map(model)
    b = GraphBuilder.for_model(model)
    nodes, inits = [], []
    for node in model.graph.node:
        if node.domain != _ML_DOMAIN:
            nodes.append(node)
            continue
        lower = _LOWERINGS.get(node.op_type)
        if lower is None:
            raise ValueError(
                f"ortlearn cannot lower the {_ML_DOMAIN} operator {node.op_type} "
                f"(node {node.name!r}) to standard operators; it lowers "
                f"{', '.join(sorted(_LOWERINGS))}."
            )
        start = len(b.nodes)
        inits.extend(lower(node, _attributes(node), b, infos))
        nodes.extend(b.nodes[start:])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(inits)
    # skl2onnx may import the main domain twice
    kept = {o.domain: o for o in reversed(model.opset_import) if o.domain != _ML_DOMAIN}
    del model.opset_import[:]
    model.opset_import.extend(kept.values())
    return model


def _attributes(node) -> dict:
    values = {}
    for att in node.attribute:
        value = helper.get_attribute_value(att)
        values[att.name] = value.decode() if isinstance(value, bytes) else value
    return values


def _unsupported_attribute(node, name, value):
    return ValueError(
        f"ortlearn cannot lower {node.op_type} node {node.name!r} with {name}={value!r}."
    )


def _as_float(name: str, b: GraphBuilder, infos) -> str:
    """``name`` cast to float32 unless it already is (ml operators compute in float)."""
    if name in infos and elem_type_of(infos[name]) == TensorProto.FLOAT:
        return name
    return b.cast(name, TensorProto.FLOAT)


def _linear(x: str, coef: np.ndarray, intercept: np.ndarray, b: GraphBuilder,
            output: str | None = None):
    """``x @ coef + intercept`` with the weights as new initializers."""
    wname, cname = b.unique_name("coef"), b.unique_name("intercept")
    product = b.op("MatMul", [x, wname])
    out = b.op("Add", [product, cname], outputs=[output] if output else None)
    inits = [numpy_helper.from_array(coef.astype(np.float32), wname),
             numpy_helper.from_array(intercept.astype(np.float32), cname)]
    return out, inits


def _lower_linear_regressor(node, att, b, infos):
    if att.get("post_transform", "NONE") != "NONE":
        raise _unsupported_attribute(node, "post_transform", att["post_transform"])
    targets = att.get("targets", 1)
    coef = np.asarray(att["coefficients"], dtype=np.float32).reshape(targets, -1).T
    intercept = np.asarray(att.get("intercepts", np.zeros(targets)), dtype=np.float32)
    x = _as_float(node.input[0], b, infos)
    _, inits = _linear(x, coef, intercept, b, output=node.output[0])
    return inits


def _class_labels(node, att, b) -> tuple[str, int]:
    if "classlabels_strings" in att:
        labels = np.array([s.decode() for s in att["classlabels_strings"]], dtype=object)
    else:
        labels = np.asarray(att["classlabels_ints"], dtype=np.int64)
    name = b.unique_name("classes")
    b.op("Constant", [], outputs=[name], value=numpy_helper.from_array(labels, name))
    return name, len(labels)


def _lower_linear_classifier(node, att, b, infos):
    post = att.get("post_transform", "NONE")
    if post not in ("NONE", "LOGISTIC", "SOFTMAX"):
        raise _unsupported_attribute(node, "post_transform", post)
    classes, n_classes = _class_labels(node, att, b)
    coefs = np.asarray(att["coefficients"], dtype=np.float32)
    n_rows = len(att["intercepts"]) if "intercepts" in att else n_classes
    intercepts = np.asarray(att.get("intercepts", np.zeros(n_rows)), dtype=np.float32)
    coefs = coefs.reshape(n_rows, -1)
    x = _as_float(node.input[0], b, infos)
    label_out = node.output[0]
    score_out = node.output[1] if len(node.output) > 1 and node.output[1] else None
    binary = (n_classes == 2 and n_rows == 2 and np.array_equal(coefs[0], -coefs[1])
              and intercepts[0] == -intercepts[1])
    if binary:
        # skl2onnx writes a binary model as rows (-w, w): one column of
        # weights (the decision function) is what sklearn trains.
        raw, inits = _linear(x, coefs[1:].T, intercepts[1:], b)
        index = b.cast(b.op("Greater", [raw, b.const(np.zeros(1, np.float32), hint="zero")]),
                       TensorProto.INT64)
        index = b.op("Reshape", [index, b.ints([-1], hint="flat")])
        if score_out:
            _binary_scores(raw, post, b, score_out)
    elif n_rows == n_classes:
        raw, inits = _linear(x, coefs.T, intercepts, b)
        index = b.op("ArgMax", [raw], axis=1, keepdims=0)
        if score_out:
            transform = {"NONE": "Identity", "LOGISTIC": "Sigmoid", "SOFTMAX": "Softmax"}[post]
            b.op(transform, [raw], outputs=[score_out])
    else:
        raise ValueError(
            f"ortlearn cannot lower LinearClassifier node {node.name!r}: {n_rows} rows of "
            f"coefficients for {n_classes} classes (expected {n_classes}, or two opposite "
            "rows for a binary problem)."
        )
    b.op("Gather", [classes, index], outputs=[label_out], axis=0)
    return inits


def _binary_scores(raw, post, b, output):
    """The two columns (negative class, positive class) of a binary classifier."""
    if post == "LOGISTIC":
        # 1 - p as in sklearn's predict_proba
        proba = b.op("Sigmoid", [raw])
        one = b.const(np.ones(1, np.float32), hint="one")
        b.op("Concat", [b.op("Sub", [one, proba]), proba], outputs=[output], axis=1)
        return
    both = b.op("Concat", [b.op("Neg", [raw]), raw], axis=1)
    b.op("Softmax" if post == "SOFTMAX" else "Identity", [both], outputs=[output])


def _lower_scaler(node, att, b, infos):
    offset = np.asarray(att.get("offset", [0.0]), dtype=np.float32)
    scale = np.asarray(att.get("scale", [1.0]), dtype=np.float32)
    x = _as_float(node.input[0], b, infos)
    shifted = b.op("Sub", [x, b.const(offset, hint="offset")])
    b.op("Mul", [shifted, b.const(scale, hint="scale")], outputs=[node.output[0]])
    return []


def _lower_normalizer(node, att, b, infos):
    norm = att.get("norm", "MAX")
    x = _as_float(node.input[0], b, infos)
    if norm == "MAX":
        size = b.reduce("ReduceMax", x, axes=[-1], keepdims=1)
    elif norm == "L1":
        size = b.reduce("ReduceSum", b.op("Abs", [x]), axes=[-1], keepdims=1)
    elif norm == "L2":
        size = b.op("Sqrt", [b.reduce("ReduceSumSquare", x, axes=[-1], keepdims=1)])
    else:
        raise _unsupported_attribute(node, "norm", norm)
    # rows of norm 0 are left as they are (onnxruntime and sklearn both do)
    zero = b.const(np.zeros(1, np.float32), hint="zero")
    one = b.const(np.ones(1, np.float32), hint="one")
    size = b.op("Where", [b.op("Equal", [size, zero]), one, size])
    b.op("Div", [x, size], outputs=[node.output[0]])
    return []


def _lower_array_feature_extractor(node, att, b, infos):
    data, indices = node.input
    flat = b.op("Reshape", [indices, b.ints([-1], hint="flat")])
    info = infos.get(data)
    shape = shape_of(info) if info is not None else None
    if shape is None:
        raise ValueError(
            f"ortlearn cannot lower ArrayFeatureExtractor node {node.name!r}: "
            f"the rank of {data!r} is unknown."
        )
    if len(shape) == 1:
        # ArrayFeatureExtractor returns a row (1, n) from a 1-D tensor
        picked = b.op("Gather", [data, flat], axis=0)
        b.op("Unsqueeze", [picked, b.ints([0])], outputs=[node.output[0]])
    else:
        b.op("Gather", [data, flat], axis=-1, outputs=[node.output[0]])
    return []


_LOWERINGS = {
    "ArrayFeatureExtractor": _lower_array_feature_extractor,
    "LinearClassifier": _lower_linear_classifier,
    "LinearRegressor": _lower_linear_regressor,
    "Normalizer": _lower_normalizer,
    "Scaler": _lower_scaler,
}


# ---------------------------------------------------------------------------
# conversion


def to_train_onnx(estimator, X, dtype=None, target_opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
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

    Returns
    -------
    onnx.ModelProto
        One input ``X`` of shape ``(N, n_features)``. Outputs: ``variable``
        ``(N, n_outputs)`` for regressors; ``label`` ``(N,)``,
        ``probabilities`` ``(N, n_classes)`` and ``raw_scores`` for
        classifiers: ``(N, 1)`` for binary problems (the logit of the
        positive class, ``decision_function``), ``(N, n_classes)`` otherwise
        (the logits the softmax or the sigmoids take).

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
    probe = _with_distinct_weights(estimator, weights)
    model = lower_ml_operators(_skl2onnx_convert(probe, X[:1].astype(dtype), target_opset))
    _freeze_initializers(model, list(weights))
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(np.asarray(weights[init.name], dtype=dtype),
                                              init.name))
    final = _final_estimator(estimator)
    n_scores = weights[[name for name in weights if name.startswith("coef")][-1]].shape[1]
    if is_classifier(final):
        # the Add of the last intercept (frozen when fit_intercept=False) gives the logits
        intercept = "intercept" if isinstance(final, _LINEAR) else list(weights)[-1]
        _add_raw_scores(model, intercept, np_dtype_to_onnx(dtype), n_scores)
    else:
        _set_output_columns(model, n_scores)
    _name_batch_dimension(model)
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", target_opset))
    return finalize_model(model)


def _with_distinct_weights(estimator, weights: dict):
    """A copy of ``estimator`` whose weights all hold different values.

    skl2onnx merges initializers holding equal values (the zero ``coef`` and
    ``intercept`` of a one-feature template become one tensor): the graph is
    converted from this copy, then gets the real weights back.
    """
    probe = copy.deepcopy(estimator)
    start, placeholders = 1.0, {}
    for name, value in weights.items():
        placeholders[name] = start + np.arange(value.size).reshape(value.shape) / 1024
        start += value.size
    set_weights(probe, placeholders)
    return probe


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


def _rename_value(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = new


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
            _rename_value(graph, RAW_SCORES, b.unique_name(RAW_SCORES))
        b.op("Identity", [source], outputs=[RAW_SCORES])
        graph.node.extend(b.nodes)
    graph.output.append(helper.make_tensor_value_info(RAW_SCORES, elem_type, ["N", n_scores]))
    if n_scores > 1:
        # sklearn predicts the argmax of the scores; saturated one-vs-rest
        # probabilities tie where the scores do not.
        for node in graph.node:
            if node.op_type == "ArgMax" and node.input[0] == "probabilities":
                node.input[0] = source


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
