"""The runtime of the full-batch fits: graph forms and the gradient-session cache.

Speed itself is measured in ``benchmarks/`` (W10-W13, W17, W18); these tests
check that the faster forms compute the same numbers and that the cache
serves what it should, and only that.
"""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.preprocessing import StandardScaler

import ortlearn
import ortlearn.training.lbfgs as lbfgs
from ortlearn.estimators._objective import linear_objective
from ortlearn.exceptions import ConvergenceWarning
from ortlearn.loss import elementwise_loss


@pytest.fixture
def counted(monkeypatch):
    """Counts the gradient graphs built (a cache miss builds one), from an empty cache."""
    calls = []
    original = lbfgs.build_gradient

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(lbfgs, "build_gradient", counting)
    monkeypatch.setattr(lbfgs, "_SESSIONS", type(lbfgs._SESSIONS)(lbfgs._CACHE_SIZE))
    return calls


def _cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def test_one_session_serves_other_sizes_and_strengths(counted):
    X, y = _cancer()
    fits = [ortlearn.OrtLogisticRegression(C=C).fit(X[:n], y[:n])
            for C, n in [(1.0, 569), (0.1, 569), (1.0, 400), (0.3, 300)]]
    assert len(counted) == 1
    # the same numbers as a fit that builds its own session
    for est, (C, n) in zip(fits, [(1.0, 569), (0.1, 569), (1.0, 400), (0.3, 300)]):
        lbfgs._SESSIONS.clear()
        fresh = ortlearn.OrtLogisticRegression(C=C).fit(X[:n], y[:n])
        np.testing.assert_array_equal(est.coef_, fresh.coef_)
    assert len(counted) == 5


def test_other_graphs_and_large_data_get_their_own_session(counted, monkeypatch):
    X, y = _cancer()
    ortlearn.OrtLogisticRegression().fit(X, y)
    ortlearn.OrtLogisticRegression(fit_intercept=False).fit(X, y)  # another graph
    ortlearn.OrtRidge(solver="lbfgs").fit(X, y.astype(float))
    assert len(counted) == 3 and len(lbfgs._SESSIONS) == 3
    monkeypatch.setattr(lbfgs, "_CACHE_MAX_DATA_BYTES", X.nbytes - 1)
    ortlearn.OrtLogisticRegression().fit(X, y)  # too large to keep a session for
    ortlearn.OrtLogisticRegression().fit(X, y)
    assert len(counted) == 5 and len(lbfgs._SESSIONS) == 3


def test_the_quantile_stages_share_a_session(counted):
    X, y = load_diabetes(return_X_y=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ortlearn.OrtQuantileRegressor(alpha=0.01).fit(X[:200], y[:200])
    assert len(counted) == 1


@pytest.mark.parametrize("n_outputs, x_offset", [(1, False), (1, True), (3, False)])
def test_the_gradient_is_numpys(n_outputs, x_offset):
    # X^T D computed as (D^T X)^T, one-output rows as vectors: the same objective and
    # gradient as numpy's formula
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((300, 7)), rng.standard_normal((300, n_outputs))
    w, coef = rng.uniform(0.5, 2, 300), rng.standard_normal((7, n_outputs))
    offset = rng.standard_normal(7) if x_offset else None
    model = linear_objective(
        7, n_outputs, lambda b, r, lab: elementwise_loss(b, "squared_error", r, lab, np.float64),
        fit_intercept=True, data_scale=0.25, l2=0.5, x_offset=offset)
    fun, _ = lbfgs.loss_and_gradient(model, ["coef", "intercept"], None, [X, Y, w],
                                     ["X", "y", "sample_weight"])
    intercept = rng.standard_normal(n_outputs)
    loss, grad = fun(np.concatenate([coef.ravel(), intercept]))
    Xc = X - offset if x_offset else X
    residual = Xc @ coef + intercept - Y
    assert loss == pytest.approx(0.25 * (w[:, None] * residual ** 2).sum()
                                 + 0.5 * (coef ** 2).sum(), rel=1e-13)
    expected = np.concatenate([(0.5 * Xc.T @ (w[:, None] * residual) + coef).ravel(),
                               0.5 * (w[:, None] * residual).sum(axis=0)])
    np.testing.assert_allclose(grad, expected, rtol=1e-12, atol=1e-12)


def test_the_data_gradient_reads_x_untransposed():
    from ortlearn.autodiff import build_gradient
    from ortlearn.graph import initializers_to_inputs

    model = linear_objective(
        5, 1, lambda b, r, lab: elementwise_loss(b, "squared_error", r, lab, np.float64),
        fit_intercept=True, data_scale=1.0, l2=0.0)
    initializers_to_inputs(model, ["coef", "intercept"])
    grad = lbfgs._data_gradient_as_row_products(build_gradient(model, ["coef", "intercept"]))
    # no Transpose of X is left: the gradient is D^T @ X
    assert not [n for n in grad.graph.node if n.op_type == "Transpose" and n.input[0] == "X"]
    assert [n for n in grad.graph.node if n.op_type == "MatMul" and n.input[1] == "X"]


def test_minimize_lbfgs_raises_where_the_run_diverges():
    """The solver's own divergence check: the error names the remedy given and carries
    where the run ended (what an estimator keeps)."""
    rs = np.random.RandomState(0)
    X = rs.randn(20, 3)
    Y = (X @ rs.randn(3) * 1e200).reshape(-1, 1)  # the squares overflow float64
    model = linear_objective(
        3, 1, lambda b, r, lab: elementwise_loss(b, "squared_error", r, lab, np.float64),
        fit_intercept=True, data_scale=1.0, l2=0.0)
    diverged = r"L-BFGS diverged: the loss is (inf|nan) .* Use smaller data\."
    with pytest.raises(ortlearn.exceptions.ConvergenceError, match=diverged) as info:
        lbfgs.minimize_lbfgs(model, ["coef", "intercept"], None, [X, Y, np.ones(20)],
                             ["X", "y", "sample_weight"], remedy="Use smaller data.")
    error = info.value
    assert not np.isfinite(error.loss) and error.n_iter == 0
    assert sorted(error.weights) == ["coef", "intercept"]
