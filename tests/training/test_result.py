"""``SolverResult``: every solver says how its run ended, the same way."""

import numpy as np
import pytest
from test_engine_gpu_paths import TRAINABLE, _problem

from ortlearn.exceptions import ConvergenceWarning
from ortlearn.training import SolverResult, minimize_fista, minimize_lbfgs
from ortlearn.training.result import CALLBACK, CONVERGED, MAX_ITER


def _lbfgs(**kwargs):
    loss_model, arrays = _problem(np.float64)  # starts from the fitted weights: zeros
    start = {"coef": np.zeros((3, 1)), "intercept": np.zeros(1)}
    return minimize_lbfgs(loss_model, TRAINABLE, start, arrays, ["X", "label"], **kwargs)


def test_lbfgs_says_how_it_ended():
    done = _lbfgs(tol=1e-10, max_iter=200)
    assert isinstance(done, SolverResult)
    assert done.converged and done.status == CONVERGED and 0 < done.n_iter < 200
    assert set(done.weights) == set(TRAINABLE) and np.isfinite(done.loss)
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        short = _lbfgs(tol=1e-10, max_iter=1)
    assert not short.converged and short.status == MAX_ITER and short.n_iter == 1
    seen = []
    stopped = _lbfgs(tol=1e-10, max_iter=200, callback=lambda w: seen.append(w) or True)
    assert not stopped.converged and stopped.status == CALLBACK and len(seen) == 1
    np.testing.assert_array_equal(stopped.weights["coef"], seen[0]["coef"])


def test_fista_says_it_per_column():
    b = np.array([[3.0, 0.1], [0.5, 0.2], [-2.0, 0.0]])
    fun = lambda x: (0.5 * float(((x - b) ** 2).sum()), x - b)
    prox = lambda v, step: np.sign(v) * np.maximum(np.abs(v) - step, 0.0)
    gap = lambda x, grad: np.abs(x - prox(x - grad, 1.0)).max(axis=0)
    result = minimize_fista(fun, np.zeros((3, 2)), prox, 1.0, gap=gap,
                            tol=np.array([1e-12, 1e-12]), max_iter=100)
    assert result.status == CONVERGED and result.converged.tolist() == [True, True]
    assert result.info["gap"].shape == (2,) and result.n_iter.shape == (2,)
    np.testing.assert_array_equal(result.weights, [[2.0, 0.0], [0.0, 0.0], [-1.0, 0.0]])
