"""``OrtSGDRegressor`` / ``OrtSGDClassifier``'s ``solver``: scikit-learn's objective trained
by Adam, AdamW or L-BFGS reaches the minimiser scikit-learn's exact solvers find."""

import pickle
import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Lasso, LogisticRegression, Ridge
from sklearn.preprocessing import StandardScaler

from ortlearn.estimators import OrtLinearRegressor, OrtSGDClassifier, OrtSGDRegressor


def _diabetes():
    X, y = load_diabetes(return_X_y=True)
    return StandardScaler().fit_transform(X), (y - y.mean()) / y.std()


def _fit_quietly(estimator, X, y, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(X, y, **kwargs)


def test_lbfgs_reaches_ridges_solution():
    """mean 0.5 (y - p)^2 + alpha / 2 ||w||^2 is Ridge's objective over 2n, alpha n."""
    X, y = _diabetes()
    ridge = Ridge(alpha=0.01 * len(y)).fit(X, y)
    ours = _fit_quietly(OrtSGDRegressor(solver="lbfgs", alpha=0.01, penalty="l2",
                                        tol=1e-10, max_iter=500), X, y)
    assert_allclose(ours.coef_, ridge.coef_, atol=1e-6)
    assert_allclose(ours.intercept_, ridge.intercept_, atol=1e-6)


@pytest.mark.parametrize("penalty", ["l2", "l1"])
def test_adam_reaches_the_penalised_minimum(penalty):
    """Full batches of Adam at a constant rate: Ridge's coefficients (L2); near Lasso's
    objective (L1: a subgradient oscillates around the kinks, by about the rate)."""
    X, y = _diabetes()
    alpha = 0.01
    ours = _fit_quietly(OrtSGDRegressor(solver="adam", alpha=alpha, penalty=penalty,
                                        eta0=0.01, batch_size=len(y), tol=None,
                                        max_iter=3000, random_state=0), X, y)
    if penalty == "l2":
        reference = Ridge(alpha=alpha * len(y)).fit(X, y)
        assert_allclose(ours.coef_, reference.coef_, atol=1e-5)
        return
    reference = Lasso(alpha=alpha, tol=1e-12, max_iter=100000).fit(X, y)

    def lasso_objective(coef, intercept):
        return (0.5 * np.mean((y - X @ coef - intercept) ** 2)
                + alpha * np.abs(coef).sum())

    gap = (lasso_objective(ours.coef_, ours.intercept_[0])
           - lasso_objective(reference.coef_, reference.intercept_))
    assert -1e-12 < gap < 1e-4


def test_lbfgs_log_loss_is_logistic_regression():
    """Two classes, log-loss, L2: LogisticRegression with C = 1 / (alpha n)."""
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    alpha = 1e-3
    reference = LogisticRegression(C=1 / (alpha * len(y)), tol=1e-10, max_iter=1000).fit(X, y)
    ours = _fit_quietly(OrtSGDClassifier(loss="log_loss", solver="lbfgs", alpha=alpha,
                                         tol=1e-10, max_iter=1000), X, y)
    assert_allclose(ours.coef_, reference.coef_, atol=1e-5)
    assert_allclose(ours.predict_proba(X), reference.predict_proba(X), atol=1e-6)


def test_adamw_steps_are_torchs():
    """AdamW: no L2 term in the objective, torch's decoupled decay of every weight by
    alpha (``penalty='l2'``); full batches follow torch.optim.AdamW step for step."""
    torch = pytest.importorskip("torch")
    X, _ = _diabetes()
    y = load_diabetes(return_X_y=True)[1] / 100  # not centred: the intercept moves too
    ours = _fit_quietly(OrtSGDRegressor(solver="adamw", alpha=0.1, eta0=0.01, shuffle=False,
                                        batch_size=len(y), tol=None, max_iter=20), X, y)
    coef = torch.zeros(X.shape[1], dtype=torch.float64, requires_grad=True)
    intercept = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.AdamW([coef, intercept], lr=0.01, weight_decay=0.1)  # penalty='l2'
    X_t, y_t = torch.tensor(X), torch.tensor(y)
    for _ in range(20):
        optimizer.zero_grad()
        (0.5 * ((y_t - X_t @ coef - intercept) ** 2).mean()).backward()
        optimizer.step()
    # onnxruntime and torch round the gradient sums differently; Adam's division by
    # sqrt(v) + eps carries that into the last digits (a decay of 0.085 is 2e-4 off)
    assert_allclose(ours.coef_, coef.detach().numpy(), atol=1e-7)
    assert_allclose(ours.intercept_, intercept.detach().numpy(), atol=1e-7)


@pytest.mark.parametrize("params, match", [
    ({"solver": "adam", "average": True}, "needs solver='sgd'"),
    ({"solver": "lbfgs", "loss": "epsilon_insensitive"}, "loss='epsilon_insensitive'"),
    ({"solver": "lbfgs", "penalty": "l1"}, "penalty='l1'"),
])
def test_refusals_name_the_parameter(params, match):
    X, y = _diabetes()
    with pytest.raises(ValueError, match=match):
        OrtSGDRegressor(**params).fit(X, y)


def test_hinge_loss_is_refused_by_lbfgs():
    X, y = load_breast_cancer(return_X_y=True)
    with pytest.raises(ValueError, match="loss='hinge'"):
        OrtSGDClassifier(solver="lbfgs").fit(X, y)


def test_a_model_pickled_without_the_solver_loads():
    X, y = _diabetes()
    reg = _fit_quietly(OrtSGDRegressor(max_iter=3, random_state=0), X, y)
    state = dict(reg.__getstate__())
    for name in ("solver", "beta_1", "beta_2"):
        del state[name]
    old = OrtSGDRegressor.__new__(OrtSGDRegressor)
    old.__setstate__(state)
    assert old.get_params() == reg.get_params()
    assert_allclose(old.predict(X), reg.predict(X))
    assert_allclose(pickle.loads(pickle.dumps(reg)).predict(X), reg.predict(X))


def test_a_model_pickled_without_the_intercept_factor_exports_and_trains(tmp_path):
    """Fitted before the sparse data's intercept factor existed: as on dense data."""
    X, y = _diabetes()
    state = dict(_fit_quietly(OrtSGDRegressor(max_iter=3, random_state=0), X, y).__getstate__())
    del state["_intercept_decay"]
    old = OrtSGDRegressor.__new__(OrtSGDRegressor)
    old.__setstate__(state)
    assert old._optimizer().intercept_decay == 1.0
    old.export_artifacts(tmp_path)
    _fit_quietly(old, X, y)


def test_linear_regressor_is_the_sgd_model_with_mlp_rules():
    """OrtLinearRegressor is an OrtSGDRegressor: momentum SGD, steps counted per batch."""
    X, y = _diabetes()
    reg = _fit_quietly(OrtLinearRegressor(momentum=0.9, max_iter=3, random_state=0), X, y)
    assert isinstance(reg, OrtSGDRegressor)
    assert reg.t_ == 3 * len(y)  # MLP's count: from 0
    sgd = _fit_quietly(OrtSGDRegressor(max_iter=3, random_state=0), X, y)
    assert sgd.t_ == 3 * len(y) + 1  # scikit-learn SGD's: from 1


def _epoch_rows(monkeypatch, estimator, X, y):
    """``(rows per update, updates, t_)`` of each epoch of a fit."""
    seen = []
    run_epoch = type(estimator)._run_epoch

    def recording(self, engine, train, batches):
        seen.append((len(batches[0]), len(batches), int(self.t_)))
        return run_epoch(self, engine, train, batches)

    monkeypatch.setattr(type(estimator), "_run_epoch", recording)
    _fit_quietly(estimator, X, y)
    return seen


def test_auto_batches_grow_as_the_rate_decays(monkeypatch):
    """An update of n rows steps n times its first row's rate: 'auto' takes more rows as
    the schedule decays, never stepping further than its first 32-row update, and keeps at
    least 64 updates an epoch; the held-out score is scikit-learn's."""
    from sklearn.datasets import make_regression
    from sklearn.linear_model import SGDRegressor
    from sklearn.model_selection import train_test_split

    X, y = make_regression(20_000, 10, noise=10, random_state=0)
    X = StandardScaler().fit_transform(X)
    y = (y - y.mean()) / y.std()
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
    ours = OrtSGDRegressor(random_state=0)
    seen = _epoch_rows(monkeypatch, ours, X_train, y_train)
    first_rate = ours._schedule.learning_rate(1)
    assert seen[0][0] == 32 and max(rows for rows, _, _ in seen) > 32
    for rows, updates, t in seen:
        assert rows % 32 == 0 and 32 <= rows <= 256
        assert rows == 32 or (updates >= 64 and rows * ours._schedule.learning_rate(t)
                              <= 32 * first_rate)
    theirs = SGDRegressor(random_state=0).fit(X_train, y_train)
    assert abs(ours.score(X_test, y_test) - theirs.score(X_test, y_test)) < 0.005
    # 'adaptive' divides its rate by 5 at each plateau (tol=10: every epoch is one)
    for fixed in (dict(learning_rate="constant"), dict(average=True), dict(batch_size=32),
                  dict(learning_rate="adaptive", tol=10.0, n_iter_no_change=1)):
        rows = {rows for rows, _, _ in _epoch_rows(
            monkeypatch, OrtSGDRegressor(random_state=0, max_iter=4, **fixed), X_train, y_train)}
        assert rows == {32}, fixed
