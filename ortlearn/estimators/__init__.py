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

from ._averaging import (
    average_estimators,
    average_training_states,
    get_training_state,
    set_training_state,
)
from ._coordinate import OrtElasticNet, OrtLasso
from ._glm import OrtGammaRegressor, OrtPoissonRegressor, OrtTweedieRegressor
from ._huber import OrtHuberRegressor
from ._linear import OrtLinearClassifier, OrtLinearRegressor
from ._logistic import OrtLogisticRegression
from ._mlp import OrtMLPClassifier, OrtMLPRegressor
from ._quantile import OrtQuantileRegressor
from ._ridge import OrtRidge
from ._session_cache import session_cache_info
from ._sgd import OrtSGDClassifier, OrtSGDRegressor
from ._svm import OrtLinearSVC, OrtLinearSVR
from .gradient_optimizer import OrtGradientOptimizer

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
