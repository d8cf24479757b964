"""scikit-learn's estimator checks on the four estimators, with their default parameters; the
mini-batch estimators warn in scikit-learn's words."""

import warnings

import pytest
from sklearn.datasets import load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDRegressor
from sklearn.neural_network import MLPRegressor
from sklearn.utils.estimator_checks import parametrize_with_checks

from ortlearn.estimators import (
    OrtLinearClassifier,
    OrtLinearRegressor,
    OrtMLPClassifier,
    OrtMLPRegressor,
    OrtSGDRegressor,
)

_SAMPLE_WEIGHT = ("mini-batches and shuffling: sample_weight is not equivalent to "
                  "removing/repeating samples (scikit-learn declares the same for SGD*).")
_EXPECTED_FAILURES = {
    "check_sample_weight_equivalence_on_dense_data": _SAMPLE_WEIGHT,
    "check_sample_weight_equivalence_on_sparse_data": _SAMPLE_WEIGHT,
}


def _expected_failed_checks(estimator):
    # The MLPs pass the equivalence check with their defaults (weighted means per batch).
    linear = isinstance(estimator, (OrtLinearRegressor, OrtLinearClassifier))
    return _EXPECTED_FAILURES if linear else {}


@parametrize_with_checks(
    [OrtMLPRegressor(), OrtMLPClassifier(), OrtLinearRegressor(), OrtLinearClassifier()],
    expected_failed_checks=_expected_failed_checks,
)
def test_sklearn_compatible(estimator, check):
    check(estimator)


@pytest.mark.parametrize("ours, theirs", [
    (OrtSGDRegressor(max_iter=2, random_state=0), SGDRegressor(max_iter=2, random_state=0)),
    (OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=2, random_state=0),
     MLPRegressor(hidden_layer_sizes=(4,), max_iter=2, random_state=0)),
])
def test_max_iter_warning_has_scikit_learn_words(ours, theirs):
    """A filter written for scikit-learn's ConvergenceWarning message catches ortlearn's."""
    X, y = load_diabetes(return_X_y=True, scaled=True)
    messages = []
    for estimator in (theirs, ours):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            estimator.fit(X, y)
        messages.append([str(w.message) for w in caught
                         if issubclass(w.category, ConvergenceWarning)])
    assert messages[0] and messages[1] == messages[0]
