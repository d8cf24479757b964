"""``ortlearn.training.quantile`` alone: the exact objective, the certificate of a minimum
and the vertex polish, against scikit-learn's ``QuantileRegressor`` (HiGHS's linear
program)."""

import numpy as np
import pytest
from sklearn.linear_model import QuantileRegressor

from ortlearn.training.quantile import QuantileProblem, is_optimal, objective, polish_vertex


@pytest.fixture(params=[(0.5, 0.0, True), (0.3, 0.05, True), (0.8, 0.02, False)],
                ids=["median", "q0.3-l1", "q0.8-no-intercept"])
def solved(request, rng):
    q, alpha, fit_intercept = request.param
    X = rng.standard_normal((80, 4))
    y = X @ np.array([1.5, 0.0, -2.0, 0.3]) + rng.standard_t(3, 80)
    w = rng.uniform(0.5, 2.0, 80)
    ref = QuantileRegressor(quantile=q, alpha=alpha, fit_intercept=fit_intercept,
                            solver="highs").fit(X, y, sample_weight=w)
    return QuantileProblem(X, y, w, q, alpha, fit_intercept), ref


def test_objective_is_scikit_learns(solved, rng):
    problem, ref = solved
    coef, intercept = rng.standard_normal(4), 0.4
    r = problem.y - problem.X @ coef - intercept
    q, w = problem.quantile, problem.sample_weight
    expected = (w * np.where(r > 0, q * r, (q - 1) * r)).sum() / w.sum() + problem.alpha * np.abs(
        coef).sum()
    assert objective(problem, coef, intercept) == pytest.approx(expected, rel=1e-14)


def test_highs_minimum_is_certified_and_a_perturbed_point_is_not(solved, rng):
    problem, ref = solved
    assert is_optimal(problem, ref.coef_, ref.intercept_)
    moved = ref.coef_ + 1e-3 * rng.standard_normal(4)
    assert not is_optimal(problem, moved, ref.intercept_)


def test_polish_finds_the_vertex_near_a_smoothed_minimiser(solved, rng):
    problem, ref = solved
    near = ref.coef_ + 1e-7 * rng.standard_normal(4)
    near_intercept = ref.intercept_ + (1e-7 if problem.fit_intercept else 0.0)
    coef, intercept = polish_vertex(problem, near, near_intercept)
    best = objective(problem, ref.coef_, ref.intercept_)
    assert objective(problem, coef, intercept) <= best * (1 + 1e-12) + 1e-15
    assert is_optimal(problem, coef, intercept)
