"""``ortlearn.training.svm_dual`` alone: liblinear's primal objective, and the exact polish
that takes an approximate solution to the minimum of the non-smooth primal."""

import numpy as np
import pytest
from sklearn.svm import LinearSVC, LinearSVR

from ortlearn.training.svm_dual import (
    POLISH_ROUNDS,
    is_primal_minimum,
    polish,
    polish_dual,
    primal_value,
)


def _hinge_problem(rng, n=60):
    X = rng.standard_normal((n, 3))
    y = np.where(X @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y[:, None], np.full((n, 1), 0.7)


def test_primal_value_is_liblinears_objective(rng):
    X, Y, cost = _hinge_problem(rng)
    w = rng.standard_normal((3, 1))
    hinge = 0.5 * float(w[:, 0] @ w[:, 0]) + 0.7 * np.maximum(0, 1 - Y[:, 0] * (X @ w[:, 0])).sum()
    assert primal_value(X, Y, cost, w, None)[0] == pytest.approx(hinge, rel=1e-15)
    eps = 0.2
    expected = 0.5 * float(w[:, 0] @ w[:, 0]) + 0.7 * np.maximum(
        0, np.abs(Y[:, 0] - X @ w[:, 0]) - eps).sum()
    assert primal_value(X, Y, cost, w, eps)[0] == pytest.approx(expected, rel=1e-15)


# liblinear's own run to tol=1e-12 may stop short of it: the polish must still reach it
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("loss", ["hinge", "epsilon_insensitive"])
def test_polish_reaches_liblinears_minimum_from_near_it(rng, loss):
    X, Y, cost = _hinge_problem(rng)
    if loss == "hinge":
        ref = LinearSVC(loss="hinge", C=0.7, fit_intercept=False, tol=1e-12,
                        max_iter=1_000_000).fit(X, Y[:, 0])
        epsilon = None
    else:
        Y = X @ np.array([[1.0], [-2.0], [0.5]]) + 0.1 * rng.standard_normal((60, 1))
        epsilon = 0.05
        ref = LinearSVR(loss=loss, C=0.7, epsilon=epsilon, fit_intercept=False, tol=1e-12,
                        max_iter=1_000_000, dual=True).fit(X, Y[:, 0])
    best = primal_value(X, Y, cost, ref.coef_.reshape(3, 1), epsilon)[0]
    near = ref.coef_.reshape(3, 1) + 1e-4 * rng.standard_normal((3, 1))
    assert primal_value(X, Y, cost, near, epsilon)[0] > best * (1 + 1e-9)
    polished = near
    for _ in range(POLISH_ROUNDS):  # as the solver: each round from the last one's w~
        polished = polish(X, Y, cost, polished, epsilon)
    # at or below liblinear's objective, to float64 rounding
    assert primal_value(X, Y, cost, polished, epsilon)[0] <= best * (1 + 1e-12)
    np.testing.assert_allclose(polished[:, 0], ref.coef_.ravel(), atol=1e-6)


def test_polish_never_raises_the_objective(rng):
    X, Y, cost = _hinge_problem(rng)
    far = rng.standard_normal((3, 1)) * 10
    assert (primal_value(X, Y, cost, polish(X, Y, cost, far, None), None)
            <= primal_value(X, Y, cost, far, None)).all()


def _dual_near(X, y, cost, w, epsilon):
    """A dual as L-BFGS-B leaves it near the minimum ``w``: each row at its bound where its
    loss is positive or 0 around it, half-way on the rows at the kink, and one of those
    pushed to its bound (the partition slightly wrong)."""
    gap = 1.0 - y * (X @ w) if epsilon is None else np.abs(y - X @ w) - epsilon
    sign = np.ones_like(y) if epsilon is None else np.sign(y - X @ w)
    kink = np.abs(gap) < 1e-6
    b = np.where(gap > 0, cost * sign, 0.0)
    b[kink] = 0.5 * cost[kink] * np.where(sign[kink] == 0, 1.0, sign[kink])
    assert kink.any()
    first = np.flatnonzero(kink)[0]
    b[first] = cost[first] * (1.0 if sign[first] >= 0 else -1.0)
    return b


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("epsilon", [None, 0.0, 0.05])
def test_polish_dual_solves_the_partition_exactly(rng, epsilon):
    """From a dual whose partition is nearly right (a row at the kink pushed to its bound),
    the active-set polish reaches liblinear's minimum, certified by the duality gap; a w~
    off the minimum is not certified."""
    X, Y, cost = _hinge_problem(rng)
    if epsilon is None:
        ref = LinearSVC(loss="hinge", C=0.7, fit_intercept=False, tol=1e-12,
                        max_iter=1_000_000).fit(X, Y[:, 0])
    else:
        Y = X @ np.array([[1.0], [-2.0], [0.5]]) + 0.1 * rng.standard_normal((60, 1))
        ref = LinearSVR(C=0.7, epsilon=epsilon, fit_intercept=False, tol=1e-12,
                        max_iter=1_000_000, dual=True).fit(X, Y[:, 0])
    best = primal_value(X, Y, cost, ref.coef_.reshape(3, 1), epsilon)[0]
    y, c = Y[:, 0], cost[:, 0]
    w = polish_dual(X, y, c, _dual_near(X, y, c, ref.coef_.ravel(), epsilon), epsilon)
    assert w is not None
    assert primal_value(X, Y, cost, w[:, None], epsilon)[0] <= best * (1 + 1e-12)
    assert is_primal_minimum(X, y, c, w, epsilon)
    assert not is_primal_minimum(X, y, c, w + 1e-3, epsilon)
    # from a dual far from it (every row at the kink): the minimum, or nothing
    far = polish_dual(X, y, c, np.full(len(y), 0.35), epsilon)
    assert far is None or is_primal_minimum(X, y, c, far, epsilon)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_linear_svr_stops_once_its_polished_primal_is_the_minimum():
    """diabetes, the defaults (epsilon 0): L-BFGS-B on the dual ran 253 iterations, its
    objective flattening out, and the band polish ended 1.4e-6 above the minimum; the
    active-set polish, tried on the way, certifies the minimum and gives it (from the
    smoothed primal's Newton steps since, from the dual's iterations before; liblinear:
    29 passes at tol 1e-4, 908 at 1e-12 to reach it)."""
    from sklearn.datasets import load_diabetes
    from sklearn.preprocessing import StandardScaler

    from ortlearn import OrtLinearSVR

    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    ours = OrtLinearSVR().fit(X, y)
    ref = LinearSVR(tol=1e-12, max_iter=10_000_000).fit(X, y)

    def objective(m):
        w = np.r_[m.coef_, m.intercept_]
        return 0.5 * w @ w + np.abs(y - X @ m.coef_ - m.intercept_).sum()

    assert ours.n_iter_ <= 60
    assert objective(ours) <= objective(ref) * (1 + 1e-12)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("loss", ["hinge", "epsilon_insensitive"])
def test_the_dual_solves_what_the_smoothing_does_not_certify(monkeypatch, loss):
    """The smoothed primal (the first try on dense data) left uncertified: L-BFGS-B on the
    dual and its polish reach the same minimum."""
    from sklearn.datasets import load_breast_cancer, load_diabetes
    from sklearn.preprocessing import StandardScaler

    import ortlearn.estimators._svm as svm
    from ortlearn import OrtLinearSVC, OrtLinearSVR
    from ortlearn.training.result import MAX_ITER, SolverResult

    hinge = loss == "hinge"
    X, y = (load_breast_cancer if hinge else load_diabetes)(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    make = (lambda: OrtLinearSVC(loss="hinge", C=0.1)) if hinge else OrtLinearSVR
    smoothed = make().fit(X, y)
    calls = []

    def uncertified(X, S, cost, **kwargs):
        calls.append(1)
        return SolverResult(np.zeros((X.shape[1], S.shape[1])), np.zeros(S.shape[1], int),
                            0.0, np.zeros(S.shape[1], bool), MAX_ITER)

    monkeypatch.setattr(svm, "minimize_l1_margin", uncertified)
    dual = make().fit(X, y)
    assert calls
    np.testing.assert_allclose(dual.coef_, smoothed.coef_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dual.intercept_, smoothed.intercept_, rtol=1e-6, atol=1e-8)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_the_dual_solves_only_the_problems_the_smoothing_left(monkeypatch):
    """One-vs-rest: the problems the smoothed primal certified are kept, the dual solves the
    one it left (a degenerate problem), and the fit is the certified one's."""
    import dataclasses

    from sklearn.datasets import load_iris
    from sklearn.preprocessing import StandardScaler

    import ortlearn.estimators._svm as svm
    from ortlearn import OrtLinearSVC
    from ortlearn.training.result import MAX_ITER

    X, y = load_iris(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    certified = OrtLinearSVC(loss="hinge", C=0.1).fit(X, y)
    smoothing, dual = svm.minimize_l1_margin, svm.solve_svm_dual
    columns = []

    def one_left(X, S, cost, **kwargs):
        result = smoothing(X, S, cost, **kwargs)
        weights, converged = result.weights.copy(), result.converged.copy()
        weights[:, 1], converged[1] = 0.0, False
        return dataclasses.replace(result, weights=weights, converged=converged,
                                   status=MAX_ITER)

    def counted(model, trainable, X, Y, *args, **kwargs):
        columns.append(Y.shape[1])
        return dual(model, trainable, X, Y, *args, **kwargs)

    monkeypatch.setattr(svm, "minimize_l1_margin", one_left)
    monkeypatch.setattr(svm, "solve_svm_dual", counted)
    fit = OrtLinearSVC(loss="hinge", C=0.1).fit(X, y)
    assert columns == [1]
    np.testing.assert_allclose(fit.coef_, certified.coef_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(fit.intercept_, certified.intercept_, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(fit.coef_[[0, 2]], certified.coef_[[0, 2]])
