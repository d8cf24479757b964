"""BaseOrtEstimator is an ABC with overridable epoch hooks; one checker of sample weights."""

import pickle

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_regression

from ortlearn import OrtLinearRegressor, OrtMLPRegressor
from ortlearn.estimators._base import BaseOrtEstimator, OrtRegressorMixin
from ortlearn.estimators._validation import check_sample_weight

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


class CountingMLPRegressor(OrtMLPRegressor):
    """Counts its epochs and the losses it saw in the overridden hooks."""

    def _run_epoch(self, engine, train, batches):
        self.epochs_run_ = getattr(self, "epochs_run_", 0) + 1
        return super()._run_epoch(engine, train, batches)

    def _log_epoch(self, elapsed):
        self.logged_ = [*getattr(self, "logged_", []), (self.n_iter_, self.loss_)]
        super()._log_epoch(elapsed)


def _data():
    X, y = make_regression(80, n_features=4, noise=0.1, random_state=0)
    return X, y / np.abs(y).max()


def test_overridden_run_epoch_counts_epochs_and_keeps_the_weights():
    X, y = _data()
    params = dict(hidden_layer_sizes=(3,), max_iter=5, random_state=0)
    counted = CountingMLPRegressor(**params).fit(X, y)
    plain = OrtMLPRegressor(**params).fit(X, y)
    assert counted.epochs_run_ == counted.n_iter_ == 5
    assert counted.logged_ == list(zip(range(1, 6), counted.train_losses_))
    # The hooks add bookkeeping only: the training is the same.
    assert counted.train_losses_ == plain.train_losses_
    for name, value in plain.get_state().items():
        np.testing.assert_array_equal(counted.get_state()[name], value)
    counted.partial_fit(X, y)
    assert counted.epochs_run_ == 6
    # sklearn's clone and pickling keep the subclass
    assert type(clone(counted)) is CountingMLPRegressor
    restored = pickle.loads(pickle.dumps(counted))
    np.testing.assert_array_equal(restored.predict(X), counted.predict(X))


def test_a_subclass_missing_a_required_hook_cannot_be_instantiated():
    with pytest.raises(TypeError, match="abstract"):
        BaseOrtEstimator()

    class NoObjective(OrtRegressorMixin, BaseOrtEstimator):
        def _make_counterpart(self):
            return None

        def _optimizer(self):
            return None

        def _make_schedule(self):
            return None

        def _learning_rates(self):
            return None, None

    with pytest.raises(TypeError, match="_objective"):
        NoObjective()
    assert "_objective" in NoObjective.__abstractmethods__
    assert not OrtMLPRegressor.__abstractmethods__
    assert not OrtLinearRegressor.__abstractmethods__


def test_clone_and_pickle_of_the_abc_subclasses():
    X, y = _data()
    est = OrtLinearRegressor(max_iter=3, random_state=0).fit(X, y)
    assert clone(est).get_params() == est.get_params()
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(est)).predict(X), est.predict(X))


@pytest.mark.parametrize("value, error, match", [
    (np.ones(4), ValueError, r"sample_weight must have shape \(5,\), got \(4,\)"),
    (np.ones((5, 1)), ValueError, r"sample_weight must have shape \(5,\)"),
    ([1, 1, np.nan, 1, 1], ValueError, "sample_weight contains NaN or infinity"),
    ([1, 1, np.inf, 1, 1], ValueError, "sample_weight contains NaN or infinity"),
    ([1, 1, -1, 1, 1], ValueError, "sample_weight contains negative values"),
    (np.zeros(5), ValueError, "sample_weight is all zeros"),
    (0.0, ValueError, "sample_weight is all zeros"),
    (np.ones(5) + 1j, TypeError, "sample_weight has the complex dtype"),
    (["a"] * 5, TypeError, "sample_weight of dtype <U1 cannot be converted"),
])
def test_check_sample_weight_rejects(value, error, match):
    with pytest.raises(error, match=match):
        check_sample_weight(value, 5, np.float32)


def test_check_sample_weight_converts():
    assert check_sample_weight(None, 5, np.float32) is None
    out = check_sample_weight([1, 2, 0, 1, 1], 5, np.float32)
    assert out.dtype == np.float32 and out.tolist() == [1, 2, 0, 1, 1]
    np.testing.assert_array_equal(check_sample_weight(3, 5, np.float64), np.full(5, 3.0))
    given = np.ones(5)
    assert check_sample_weight(given, 5, np.float64) is given  # no copy


@pytest.mark.parametrize("estimator", [
    OrtLinearRegressor(max_iter=2, random_state=0),
    OrtMLPRegressor((3,), max_iter=2, random_state=0),
])
def test_estimators_share_the_sample_weight_messages(estimator):
    X, y = _data()
    with pytest.raises(ValueError, match=r"sample_weight must have shape \(80,\)"):
        estimator.fit(X, y, np.ones(79))
    with pytest.raises(ValueError, match="sample_weight contains negative values"):
        estimator.fit(X, y, -np.ones(80))
