"""scikit-learn estimators trained with onnxruntime.

- :class:`OrtMLPRegressor`, :class:`OrtMLPClassifier`: scikit-learn's MLPs;
- :class:`OrtLinearRegressor`, :class:`OrtLinearClassifier`: linear models
  with the objectives of ``SGDRegressor`` / ``SGDClassifier(loss='log_loss')``;
- :class:`OrtSGDRegressor`, :class:`OrtSGDClassifier`: ``SGDRegressor`` /
  ``SGDClassifier`` with every loss, their updates and parameters;
- :class:`OrtGradientOptimizer`: trains any ONNX graph that computes its own loss.
"""

from ._linear import OrtLinearClassifier, OrtLinearRegressor
from ._mlp import OrtMLPClassifier, OrtMLPRegressor
from ._sgd import OrtSGDClassifier, OrtSGDRegressor
from .gradient_optimizer import OrtGradientOptimizer

__all__ = [
    "OrtGradientOptimizer",
    "OrtLinearClassifier",
    "OrtLinearRegressor",
    "OrtMLPClassifier",
    "OrtMLPRegressor",
    "OrtSGDClassifier",
    "OrtSGDRegressor",
]
