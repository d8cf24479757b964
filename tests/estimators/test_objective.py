"""``linear_objective``'s kept graphs: a structure is built once, and what a fit gets from
the cache is the graph a fresh build gives, with the fit's own values."""

import warnings

import numpy as np
import pytest
import scipy.sparse
from onnx import numpy_helper
from sklearn.datasets import make_classification, make_regression

import ortlearn.estimators._objective as objective
from ortlearn.estimators import (
    OrtHuberRegressor,
    OrtLinearSVC,
    OrtLinearSVR,
    OrtLogisticRegression,
    OrtPoissonRegressor,
    OrtRidge,
    OrtTweedieRegressor,
)
from ortlearn.graph.cache import LRUCache, model_digest

X, Y = make_classification(120, 6, n_informative=4, n_classes=3, random_state=0)
XR, YR = make_regression(120, 6, noise=1.0, random_state=0)

# each family twice or more, with the parameters its row loss reads changed between fits
FITS = [
    *(OrtLogisticRegression(C=c) for c in (1.0, 0.1)),
    ("binary", OrtLogisticRegression(C=0.5)),
    *(OrtHuberRegressor(epsilon=e, alpha=a) for e, a in ((1.35, 1e-4), (2.0, 1e-4), (2.0, 1.0))),
    *(OrtTweedieRegressor(power=p, alpha=0.1) for p in (0.0, 1.5, 1.5, 2.5)),
    *(OrtPoissonRegressor(alpha=a) for a in (1.0, 0.1)),
    *(OrtRidge(alpha=a, solver="lbfgs") for a in (1.0, 3.0)),
    *(OrtLinearSVC(C=c, dual=False) for c in (1.0, 0.2)),
    *(OrtLinearSVR(loss="squared_epsilon_insensitive", epsilon=e, dual=False)
      for e in (0.0, 0.5, 0.5)),
]


def _data(fit):
    binary = isinstance(fit, tuple)
    est = fit[1] if binary else fit
    if isinstance(est, OrtLogisticRegression):
        return est, X, (Y > 0).astype(int) if binary else Y
    if isinstance(est, OrtLinearSVC):  # (sparse: the primal by L-BFGS, not Newton's method)
        return est, scipy.sparse.csr_matrix(X), Y
    if isinstance(est, OrtLinearSVR):
        return est, scipy.sparse.csr_matrix(XR), YR
    y = np.exp(YR / YR.std()) if isinstance(est, (OrtTweedieRegressor,
                                                  OrtPoissonRegressor)) else YR
    return est, XR, y


def _graphs(monkeypatch, cache):
    """The objective graph of each fit of FITS, with ``cache`` as the kept graphs."""
    monkeypatch.setattr(objective, "_OBJECTIVES", cache)
    built, real = [], objective.linear_objective

    def record(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    for module in ("_logistic", "_huber", "_glm", "_ridge", "_objective"):
        target = f"ortlearn.estimators.{module}.linear_objective"
        monkeypatch.setattr(target, record)
    graphs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fit in FITS:
            est, Xd, yd = _data(fit)
            start = len(built)
            est.fit(Xd, yd)
            graphs.append([model_digest(m) for m in built[start:]])
    monkeypatch.undo()
    return graphs


def test_a_kept_graph_is_the_graph_a_fresh_build_gives(monkeypatch):
    kept = LRUCache(32)
    cached = _graphs(monkeypatch, kept)
    fresh = _graphs(monkeypatch, LRUCache(0))  # nothing kept: each fit builds its own
    assert all(cached) and cached == fresh
    # the same structure and loss, other strengths: one build, other values
    assert cached[0] != cached[1]
    # the repeated structures came from the cache
    assert len(kept) < sum(len(g) for g in cached)


def test_a_parameter_of_the_row_loss_is_another_structure():
    def squared(b, raw, label):
        return b.op("Mul", [raw, label])

    def build(**kwargs):
        base = {"fit_intercept": True, "data_scale": 1.0, "l2": 0.5, "loss_key": "k"}
        return objective.linear_objective(4, 1, squared, **{**base, **kwargs})

    objective._OBJECTIVES.clear()
    first = build()
    assert model_digest(build(data_scale=2.0)) != model_digest(first)  # its value
    assert len(objective._OBJECTIVES) == 1
    for change in ({"fit_intercept": False}, {"l2": 0.0}, {"loss_key": "other"},
                   {"extra_weights": {"s": np.ones(1)}}):
        build(**change)
    assert len(objective._OBJECTIVES) == 5
    # a constant of the graph: never kept
    build(x_offset=np.ones(4))
    assert len(objective._OBJECTIVES) == 5


@pytest.mark.parametrize("l2", [0.5, [0.5, 2.0]])
def test_a_kept_graph_holds_the_calls_values(l2):
    def squared(b, raw, label):
        return b.op("Mul", [raw, label])

    objective._OBJECTIVES.clear()
    kwargs = {"fit_intercept": False, "loss_key": "k"}
    objective.linear_objective(3, 2, squared, data_scale=1.0, l2=3.0, **kwargs)
    model = objective.linear_objective(3, 2, squared, data_scale=0.25, l2=l2, **kwargs)
    values = {i.name: i for i in model.graph.initializer}
    assert numpy_helper.to_array(values[objective.DATA_SCALE]) == 0.25
    np.testing.assert_array_equal(numpy_helper.to_array(values[objective.L2]),
                                  np.broadcast_to(l2, (2,)))
