"""ortlearn: train ONNX graphs with the ordinary onnxruntime, behind scikit-learn estimators.

Public names are imported lazily (skl2onnx and scikit-learn take a while to
import); ``from ortlearn import X`` works for every name in ``__all__``.
"""

from .lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "add_loss_output": "ortlearn.loss",
    "get_train_initializer": "ortlearn.convert",
    "to_train_onnx": "ortlearn.convert",
    "build_gradient": "ortlearn.autodiff",
    "TrainingSession": "ortlearn.training",
    "CheckpointState": "ortlearn.training",
    "OrtElasticNet": "ortlearn.estimators",
    "OrtGammaRegressor": "ortlearn.estimators",
    "OrtGradientOptimizer": "ortlearn.estimators",
    "OrtHuberRegressor": "ortlearn.estimators",
    "OrtLasso": "ortlearn.estimators",
    "OrtLinearRegressor": "ortlearn.estimators",
    "OrtLinearClassifier": "ortlearn.estimators",
    "OrtLinearSVC": "ortlearn.estimators",
    "OrtLinearSVR": "ortlearn.estimators",
    "OrtLogisticRegression": "ortlearn.estimators",
    "OrtMLPRegressor": "ortlearn.estimators",
    "OrtMLPClassifier": "ortlearn.estimators",
    "OrtPoissonRegressor": "ortlearn.estimators",
    "OrtQuantileRegressor": "ortlearn.estimators",
    "OrtRidge": "ortlearn.estimators",
    "OrtSGDClassifier": "ortlearn.estimators",
    "OrtSGDRegressor": "ortlearn.estimators",
    "OrtTweedieRegressor": "ortlearn.estimators",
    "ConvergenceError": "ortlearn.exceptions",
    "NoGradientRuleError": "ortlearn.exceptions",
}
_SUBMODULES = {"artifacts", "onnxblock", "api", "autodiff", "optim", "convert", "loss",
               "training", "estimators", "exceptions", "graph"}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, _SUBMODULES)
