"""The mini-batch estimators the reliability suites run through the same hostile cases."""

from ortlearn import OrtLinearClassifier, OrtLinearRegressor, OrtMLPClassifier, OrtMLPRegressor

#: The mini-batch families by name (the parametrize ids of the suites).
CLASSES = {
    "mlp_regressor": OrtMLPRegressor,
    "mlp_classifier": OrtMLPClassifier,
    "linear_regressor": OrtLinearRegressor,
    "linear_classifier": OrtLinearClassifier,
}
