"""Weights between scikit-learn estimators and their graphs; templates to train from.

- :data:`SUPPORTED_ESTIMATORS`, :data:`SUPPORTED_PREPROCESSORS`: what
  ortlearn converts, and the checks that say so;
- :func:`get_weights` / :func:`set_weights`: the weights of a fitted estimator
  named and shaped as the initializers of the graph
  :func:`~ortlearn.convert.to_train_onnx` writes, and back;
- :func:`init_template`: an estimator whose weights are those scikit-learn
  starts ``fit`` from (the private scikit-learn calls this needs are in
  ``_sklearn_private``).
"""

from __future__ import annotations

import numpy as np
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
from sklearn.utils.validation import check_is_fitted, validate_data

from . import _sklearn_private

__all__ = [
    "SUPPORTED_ESTIMATORS",
    "SUPPORTED_PREPROCESSORS",
    "get_weights",
    "init_template",
    "set_weights",
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


def _write_back(old, value, name, copy=True):
    """``value`` in the shape and dtype of the attribute ``old``, or ValueError.

    With ``copy=False``, ``value`` itself (or a view of it) where its dtype is already right.
    """
    old = np.asarray(old)
    value = np.asarray(value)
    if value.size != old.size:
        raise ValueError(
            f"Weight {name!r} has {value.size} values ({value.shape}); the estimator "
            f"expects {old.size} ({old.shape})."
        )
    dtype = old.dtype if np.issubdtype(old.dtype, np.floating) else value.dtype
    return value.reshape(old.shape).astype(dtype, copy=copy)


def set_weights(estimator, weights: dict, *, copy: bool = True) -> None:
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
    copy : bool, default=True
        Store copies of the values. False stores the arrays given (reshaped,
        transposed views) where their dtype is the estimator's: for fresh
        arrays of the caller's, a copy would only add their size to the peak
        memory.

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
                final.coefs_[i] = _write_back(final.coefs_[i], weights[wname], wname, copy)
            if bname in weights:
                final.intercepts_[i] = _write_back(final.intercepts_[i], weights[bname], bname,
                                                    copy)
        return
    if "coef" in weights:
        coef = np.asarray(weights["coef"])
        # The graph holds coef_.T: transpose back before restoring coef_'s shape.
        coef = coef.T if coef.ndim == 2 else coef
        final.coef_ = _write_back(final.coef_, coef, "coef", copy)
    if "intercept" in weights:
        intercept = _write_back(final.intercept_, weights["intercept"], "intercept",
                                copy)
        final.intercept_ = intercept[()] if intercept.ndim == 0 else intercept


# ---------------------------------------------------------------------------
# templates


def init_template(estimator, X, y, *, check_input: bool = True):
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
    check_input : bool, default=True
        Validate the estimator's parameters, ``X`` and ``y`` as its ``fit``
        does. False skips what a caller has checked already (a fit of the same
        parameters on the same data): ``X`` must then be a 2-D float array.

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
        _init_final(template.steps[-1][1], Xt, y, check_input)
    else:
        _init_final(template, X, y, check_input)
    return template


def _init_final(est, X, y, check_input: bool) -> None:
    if isinstance(est, _MLP):
        _init_mlp(est, X, y, check_input)
    else:
        _init_linear(est, X, y, check_input)


def _init_mlp(est, X, y, check_input: bool) -> None:
    """The first steps of ``BaseMultilayerPerceptron._fit``, without training."""
    _sklearn_private.check_mlp_hooks(est)
    if check_input:
        _sklearn_private.validate_params(est)
    hidden = est.hidden_layer_sizes
    hidden = list(hidden) if hasattr(hidden, "__iter__") else [hidden]
    if any(h <= 0 for h in hidden):
        raise ValueError(f"hidden_layer_sizes must be > 0, got {hidden}.")
    if check_input or is_classifier(est):
        # a classifier's also fits its label binarizer, which predict reads
        X, y = _sklearn_private.mlp_validate_input(est, X, y)
    else:
        y = np.asarray(y)
        est.n_features_in_ = X.shape[1]
    y = y.reshape(-1, 1) if y.ndim == 1 else y
    layer_units = [X.shape[1], *hidden, y.shape[1]]
    _sklearn_private.mlp_initialize(est, y, layer_units, X.dtype)


def _init_linear(est, X, y, check_input: bool) -> None:
    if check_input:
        _sklearn_private.validate_params(est)
        X, y = validate_data(est, X, y, dtype=(np.float64, np.float32), multi_output=True,
                             y_numeric=not is_classifier(est))
    else:
        y = np.asarray(y)
        est.n_features_in_ = X.shape[1]
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

