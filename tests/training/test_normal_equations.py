"""``ortlearn.training.normal_equations``: the products onnxruntime forms and the solve."""

import numpy as np
import pytest

from ortlearn.training import normal_equations
from ortlearn.training.normal_equations import solve_normal_equations, weighted_products


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((200, 6)), rng.standard_normal((200, 2))
    return X, Y, rng.uniform(0.5, 2.0, 200)


@pytest.mark.parametrize("weights", ["given", "ones"])
def test_products_are_numpys(data, weights):
    """With unit weights (the estimators' default) the products read X as it is, without the
    weights' graph and its scaled copy of X: the same products."""
    X, Y, w = data
    if weights == "ones":
        w = np.ones(len(X))
    gram, rhs, yy = weighted_products(X, Y, w)
    np.testing.assert_allclose(gram, X.T @ (w[:, None] * X), rtol=1e-12)
    np.testing.assert_allclose(rhs, X.T @ (w[:, None] * Y), rtol=1e-12)
    np.testing.assert_allclose(yy, w @ (Y * Y), rtol=1e-12)
    assert gram.shape == (6, 6) and rhs.shape == (6, 2) and yy.shape == (2,)


def test_solution_sets_the_gradient_to_zero(data):
    X, Y, w = data
    alpha = np.array([0.5, 20.0])  # one system per strength
    result = solve_normal_equations(X, Y, w, alpha)
    coef = result.weights["coef"]
    gradient = -X.T @ (w[:, None] * (Y - X @ coef)) + alpha * coef
    np.testing.assert_allclose(gradient, 0, atol=1e-10)
    expected = 0.5 * (w @ np.square(Y - X @ coef).sum(axis=1)
                      + alpha @ np.square(coef).sum(axis=0))
    assert result.loss == pytest.approx(expected, rel=1e-10)
    assert result.converged and result.n_iter == 1


def test_singular_system_gets_the_minimum_norm_solution(data):
    X, Y, w = data
    X = np.column_stack([X, X[:, 0]])  # a column repeated: X^T W X is singular
    coef = solve_normal_equations(X, Y[:, :1], np.ones(200), 0.0).weights["coef"]
    np.testing.assert_allclose(coef, np.linalg.lstsq(X, Y[:, :1], rcond=None)[0], atol=1e-8)
    # the repeated columns share their weight: the norm is the smallest
    assert coef[0, 0] == pytest.approx(coef[-1, 0], rel=1e-8)


def test_unit_weights_take_the_graph_without_weights(data):
    X, Y, _ = data
    weighted_products(X, Y, np.ones(len(X)))
    weighted_products(X, Y, np.full(len(X), 2.0))
    for weighted, inputs in ((False, ["X", "Y"]), (True, ["X", "Y", "sample_weight"])):
        session = normal_equations._SESSIONS.get(("cpu", weighted))
        assert [i.name for i in session.get_inputs()] == inputs
