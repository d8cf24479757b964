"""``ortlearn.training.svm_dual`` alone: liblinear's primal objective, and the exact polish
that takes an approximate solution to the minimum of the non-smooth primal."""

import numpy as np
import pytest
from sklearn.svm import LinearSVC, LinearSVR

from ortlearn.training.svm_dual import POLISH_ROUNDS, polish, primal_value


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
