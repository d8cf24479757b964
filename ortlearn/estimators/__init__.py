"""scikit-learn estimators trained with onnxruntime.

- :class:`OrtMLPRegressor`, :class:`OrtMLPClassifier`: scikit-learn's MLPs;
- :class:`OrtLinearRegressor`, :class:`OrtLinearClassifier`: linear models
  with the objectives of ``SGDRegressor`` / ``SGDClassifier(loss='log_loss')``;
- :class:`OrtLogisticRegression`, :class:`OrtRidge`, :class:`OrtPoissonRegressor`,
  :class:`OrtGammaRegressor`, :class:`OrtTweedieRegressor`,
  :class:`OrtHuberRegressor`, :class:`OrtLinearSVC`, :class:`OrtLinearSVR`: the
  objectives of their scikit-learn namesakes, minimised with ortlearn's
  full-batch L-BFGS (on liblinear's dual for the non-smooth SVM losses);
- :class:`OrtLasso`, :class:`OrtElasticNet`: the objectives of ``Lasso`` /
  ``ElasticNet``, minimised by a proximal gradient method (FISTA);
  :class:`OrtQuantileRegressor`: ``QuantileRegressor``'s linear program, by
  smoothing continuation with L-BFGS-B and a polish of its vertex;
- :class:`OrtSGDRegressor`, :class:`OrtSGDClassifier`: ``SGDRegressor`` /
  ``SGDClassifier`` with every loss, their updates and parameters;
- :class:`OrtGradientOptimizer`: trains any ONNX graph that computes its own loss;
- :func:`average_estimators`, :func:`average_training_states`,
  :func:`get_training_state`, :func:`set_training_state`: model averaging of
  copies of one estimator (what ``partial_fit`` continues from);
- :func:`session_cache_info`: the inference sessions this process built and
  shared between copies of fitted estimators (``doc/scaling_out.rst``).
"""

from ..lazy import lazy_exports

# public name -> the module defining it, imported when first used: a fit imports its own
# family's modules (the full-batch solvers need neither skl2onnx nor the training engine)
_LAZY = {
    "average_estimators": "._averaging", "average_training_states": "._averaging",
    "get_training_state": "._averaging", "set_training_state": "._averaging",
    "OrtElasticNet": "._coordinate", "OrtLasso": "._coordinate",
    "OrtGammaRegressor": "._glm", "OrtPoissonRegressor": "._glm", "OrtTweedieRegressor": "._glm",
    "OrtHuberRegressor": "._huber",
    "OrtLinearClassifier": "._linear", "OrtLinearRegressor": "._linear",
    "OrtLogisticRegression": "._logistic",
    "OrtMLPClassifier": "._mlp", "OrtMLPRegressor": "._mlp",
    "OrtQuantileRegressor": "._quantile",
    "OrtRidge": "._ridge",
    "session_cache_info": "._session_cache",
    "OrtSGDClassifier": "._sgd", "OrtSGDRegressor": "._sgd",
    "OrtLinearSVC": "._svm", "OrtLinearSVR": "._svm",
    "OrtGradientOptimizer": ".gradient_optimizer",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "OrtElasticNet",
    "OrtGammaRegressor",
    "OrtGradientOptimizer",
    "OrtHuberRegressor",
    "OrtLasso",
    "OrtLinearClassifier",
    "OrtLinearRegressor",
    "OrtLinearSVC",
    "OrtLinearSVR",
    "OrtLogisticRegression",
    "OrtMLPClassifier",
    "OrtMLPRegressor",
    "OrtPoissonRegressor",
    "OrtQuantileRegressor",
    "OrtRidge",
    "OrtSGDClassifier",
    "OrtSGDRegressor",
    "OrtTweedieRegressor",
    "average_estimators",
    "average_training_states",
    "get_training_state",
    "session_cache_info",
    "set_training_state",
]
