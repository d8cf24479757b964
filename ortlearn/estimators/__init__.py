"""scikit-learn estimators trained with onnxruntime.

- :class:`OrtMLPRegressor`, :class:`OrtMLPClassifier`: scikit-learn's MLPs;
- :class:`OrtLinearRegressor`, :class:`OrtLinearClassifier`: linear models
  with the objectives of ``SGDRegressor`` / ``SGDClassifier(loss='log_loss')``;
- :class:`OrtLogisticRegression`, :class:`OrtRidge`, :class:`OrtPoissonRegressor`,
  :class:`OrtGammaRegressor`, :class:`OrtTweedieRegressor`,
  :class:`OrtHuberRegressor`: the objectives of their scikit-learn namesakes,
  minimised with ortlearn's full-batch L-BFGS;
- :class:`OrtSGDRegressor`, :class:`OrtSGDClassifier`: ``SGDRegressor`` /
  ``SGDClassifier`` with every loss, their updates and parameters;
- :class:`OrtGradientOptimizer`: trains any ONNX graph that computes its own loss.
"""

from ._glm import OrtGammaRegressor, OrtPoissonRegressor, OrtTweedieRegressor
from ._huber import OrtHuberRegressor
from ._linear import OrtLinearClassifier, OrtLinearRegressor
from ._logistic import OrtLogisticRegression
from ._mlp import OrtMLPClassifier, OrtMLPRegressor
from ._ridge import OrtRidge
from ._sgd import OrtSGDClassifier, OrtSGDRegressor
from .gradient_optimizer import OrtGradientOptimizer

__all__ = [
    "OrtGammaRegressor",
    "OrtGradientOptimizer",
    "OrtHuberRegressor",
    "OrtLinearClassifier",
    "OrtLinearRegressor",
    "OrtLogisticRegression",
    "OrtMLPClassifier",
    "OrtMLPRegressor",
    "OrtPoissonRegressor",
    "OrtRidge",
    "OrtSGDClassifier",
    "OrtSGDRegressor",
    "OrtTweedieRegressor",
]
