"""Callbacks and verbose logging of the full-batch estimators.

scikit-learn 1.9's callbacks (``sklearn.callback``) see one task per fit and
one subtask ``'iteration'`` per iteration of the solver (L-BFGS, FISTA);
``verbose`` logs a line per L-BFGS iteration through the ``ortlearn`` logger.
"""

import warnings

import numpy as np
import pytest
from counterparts import ortlearn_log
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.preprocessing import StandardScaler

import ortlearn
import ortlearn.log
from ortlearn.exceptions import ConvergenceWarning

callback = pytest.importorskip("sklearn.callback")


def _data():
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X[:200])
    y = y[:200]
    Xr, yr = load_diabetes(return_X_y=True, scaled=True)
    return X, y, Xr[:200], (yr[:200] - yr.mean()) / yr.std()


X, Y, XR, YR = _data()


class Recorder:
    """A FitCallback recording the tasks and the predictions of each iteration's model."""

    def __init__(self, stop_after=None):
        self.events, self.predictions, self.stop_after = [], [], stop_after

    def setup(self, estimator, context):
        self.events.append(("setup", context.task_name))

    def on_fit_task_begin(self, estimator, context):
        self.events.append(("begin", context.task_name))

    def on_fit_task_end(self, estimator, context, *, fitted_estimator=None, X=None, y=None):
        self.events.append(("end", context.task_name))
        if context.task_name == "iteration":
            self.predictions.append(fitted_estimator.predict(X))
        done = sum(e == ("end", "iteration") for e in self.events)
        return self.stop_after is not None and done >= self.stop_after

    def teardown(self, estimator, context):
        self.events.append(("teardown", context.task_name))


CASES = [  # (estimator, data, whether the last iteration's weights are the fitted ones)
    (lambda: ortlearn.OrtLogisticRegression(C=0.1), "clf", True),
    (lambda: ortlearn.OrtRidge(alpha=1.0, solver="lbfgs"), "reg", True),
    (lambda: ortlearn.OrtPoissonRegressor(alpha=0.1), "counts", True),
    (lambda: ortlearn.OrtHuberRegressor(), "reg", True),
    (lambda: ortlearn.OrtLasso(alpha=0.01), "reg", True),
    (lambda: ortlearn.OrtLinearSVC(C=0.1), "clf", True),
    (lambda: ortlearn.OrtLinearSVC(C=0.1, loss="hinge"), "clf", False),  # then polished
    # (epsilon=0 is a ridge, which Newton's first step solves: one iteration)
    (lambda: ortlearn.OrtLinearSVR(loss="squared_epsilon_insensitive", epsilon=0.5), "reg",
     True),
    (lambda: ortlearn.OrtQuantileRegressor(alpha=0.01), "reg", False),  # then polished
]


def _xy(kind):
    if kind == "clf":
        return X, Y
    if kind == "counts":
        return XR, np.exp(YR / 2)
    return XR, YR


@pytest.mark.parametrize("make, kind, last_is_fitted", CASES,
                         ids=[f"{type(m()).__name__}-{i}" for i, (m, _, _) in enumerate(CASES)])
def test_one_subtask_per_iteration_with_its_weights(make, kind, last_is_fitted):
    Xd, yd = _xy(kind)
    rec = Recorder()
    est = make().set_callbacks(rec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(Xd, yd)
    n = sum(e == ("end", "iteration") for e in rec.events)
    assert rec.events == ([("setup", "fit"), ("begin", "fit")]
                          + [("begin", "iteration"), ("end", "iteration")] * n
                          + [("end", "fit"), ("teardown", "fit")])
    assert n >= 2
    if last_is_fitted:
        assert n == np.max(est.n_iter_)
        np.testing.assert_array_equal(rec.predictions[-1], est.predict(Xd))
    # each iteration's model is that iteration's: the predictions change on the way
    assert not np.array_equal(rec.predictions[0], rec.predictions[-1])
    assert not hasattr(est, "_callback_fit_ctx") and not hasattr(est, "_callback_task")


def test_the_normal_equations_are_one_iteration():
    rec = Recorder()
    est = ortlearn.OrtRidge(alpha=1.0).set_callbacks(rec).fit(XR, YR)
    assert rec.events == [("setup", "fit"), ("begin", "fit"), ("begin", "iteration"),
                          ("end", "iteration"), ("end", "fit"), ("teardown", "fit")]
    np.testing.assert_array_equal(rec.predictions[0], est.predict(XR))


@pytest.mark.parametrize("make, kind, last_is_fitted", CASES,
                         ids=[f"{type(m()).__name__}-{i}" for i, (m, _, _) in enumerate(CASES)])
def test_a_callback_stops_the_fit_at_its_iteration(make, kind, last_is_fitted):
    Xd, yd = _xy(kind)
    rec = Recorder(stop_after=2)
    est = make().set_callbacks(rec)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # a stop asked for: no warning
        est.fit(Xd, yd)
    assert sum(e == ("end", "iteration") for e in rec.events) == 2
    # the fitted model is the one of the iteration the callback stopped at
    np.testing.assert_allclose(est.predict(Xd), rec.predictions[-1], rtol=1e-12, atol=1e-12)
    if not isinstance(est, ortlearn.OrtQuantileRegressor):
        assert np.max(est.n_iter_) == 2


def test_scoring_monitor_scores_each_iteration():
    monitor = callback.ScoringMonitor(scoring="accuracy")
    est = ortlearn.OrtLogisticRegression(C=0.1).set_callbacks(monitor).fit(X, Y)
    log = monitor.get_logs()
    rows = [row for row in log.data if row["task_name"] == "iteration"]
    assert len(rows) == est.n_iter_[0]
    assert rows[-1]["accuracy"] == est.score(X, Y)
    assert rows[0]["accuracy"] < rows[-1]["accuracy"]
    assert log.estimator_name == "OrtLogisticRegression"


def test_progress_bar_shows_the_fit(capsys):
    pytest.importorskip("rich")
    ortlearn.OrtRidge().set_callbacks(callback.ProgressBar()).fit(XR, YR)
    out = capsys.readouterr()
    assert "OrtRidge - fit" in out.out + out.err


def test_no_callbacks_no_subtasks_and_the_same_fit():
    plain = ortlearn.OrtLogisticRegression(C=0.1).fit(X, Y)
    watched = ortlearn.OrtLogisticRegression(C=0.1).set_callbacks(Recorder()).fit(X, Y)
    np.testing.assert_array_equal(plain.coef_, watched.coef_)


@pytest.mark.parametrize("make", [lambda v: ortlearn.OrtLogisticRegression(verbose=v),
                                  lambda v: ortlearn.OrtPoissonRegressor(verbose=v),
                                  lambda v: ortlearn.OrtLinearSVC(verbose=v)])
def test_verbose_logs_each_iteration_through_the_ortlearn_logger(make, capsys):
    Xd, yd = (XR, np.exp(YR / 2)) if "Poisson" in type(make(0)).__name__ else (X, Y)
    with ortlearn_log() as stream:
        quiet = make(0).fit(Xd, yd)
        assert stream.getvalue() == ""
        est = make(1).fit(Xd, yd)
    assert capsys.readouterr().out == ""  # the default handler removed: nothing printed
    lines = stream.getvalue().splitlines()
    assert len(lines) == np.max(est.n_iter_) >= 2
    solver = "Newton" if isinstance(est, ortlearn.OrtLinearSVC) else "L-BFGS"
    assert lines[0].startswith(f"{solver} iteration 1: loss=")
    np.testing.assert_array_equal(quiet.coef_, est.coef_)
