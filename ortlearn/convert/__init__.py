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

* regressors: ``variable``, shape ``(N, n_outputs)`` (``exp(raw_predictions)``
  for ``MLPRegressor(loss='poisson')``);
* classifiers: ``label`` (shape ``(N,)``, the class labels),
  ``probabilities`` (``(N, n_classes)``) and ``raw_scores``: ``(N, 1)`` for a
  binary problem (the logit of the positive class, ``decision_function``),
  ``(N, n_classes)`` otherwise (the logits before the softmax, or the
  one-vs-rest decision functions of ``SGDClassifier``); a multilabel
  ``MLPClassifier`` has ``label`` and ``probabilities`` of shape
  ``(N, n_labels)`` (indicator matrix, one sigmoid per label).

Trainable initializers, in graph order (:func:`get_weights` uses the same
names and layouts):

* linear models: ``coef`` ``(n_features, n_targets)`` and ``intercept``
  ``(n_targets,)`` (no ``intercept`` when ``fit_intercept=False``);
* MLPs: ``coefficient``, ``intercepts``, ``coefficient1``, ``intercepts1``, ...
  (``coefs_[i]`` and ``intercepts_[i]`` as a row ``(1, n_units)``).

The modules of the package:

- :mod:`~ortlearn.convert.conversion`: :func:`to_train_onnx` (the skl2onnx
  call and the fix-ups of its graph), :data:`RAW_SCORES`, :data:`RAW_PREDICTIONS`;
- :mod:`~ortlearn.convert.lowering`: :func:`lower_ml_operators`, one lowering
  function per ``ai.onnx.ml`` operator, registered in a table;
- :mod:`~ortlearn.convert.weights`: :func:`get_weights`, :func:`set_weights`,
  :func:`init_template`, :data:`SUPPORTED_ESTIMATORS`,
  :data:`SUPPORTED_PREPROCESSORS`;
- ``_sklearn_private`` (private): every call into scikit-learn's private API,
  with why each is needed and the versions it was checked on.

:func:`get_train_initializer` is defined in :mod:`ortlearn.graph` and
re-exported here.
"""

from ..lazy import lazy_exports

# public name -> the module defining it, imported when first used (the conversion's
# modules import much of scikit-learn; a constant of them should not)
_LAZY = {
    "get_train_initializer": "ortlearn.graph",
    "RAW_PREDICTIONS": "ortlearn.convert.conversion",  # public, not in __all__
    "RAW_SCORES": "ortlearn.convert.conversion",  # public, not in __all__
    "to_train_onnx": "ortlearn.convert.conversion",
    "lower_ml_operators": "ortlearn.convert.lowering",
    "SUPPORTED_ESTIMATORS": "ortlearn.convert.weights",
    "SUPPORTED_PREPROCESSORS": "ortlearn.convert.weights",
    "get_weights": "ortlearn.convert.weights",
    "init_template": "ortlearn.convert.weights",
    "set_weights": "ortlearn.convert.weights",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

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
