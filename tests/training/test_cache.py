"""The compiled training problems a process shares: a fit of the same structure (a fold, a
clone, a refit) starts from the step graph and session another fit built, and trains to the
same bits as a fit that built its own."""

import threading
import warnings

import numpy as np
import pytest
from sklearn.datasets import make_regression

from ortlearn import OrtMLPRegressor
from ortlearn.graph.cache import LRUCache
from ortlearn.training import cache
from ortlearn.training import engine as _engine

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


@pytest.fixture(autouse=True)
def builds(monkeypatch):
    """An empty cache, and the count of the epoch graphs built."""
    monkeypatch.setattr(cache, "COMPILED_STEPS", LRUCache(cache.COMPILED_STEPS.size))
    monkeypatch.setattr(_engine, "COMPILED_STEPS", cache.COMPILED_STEPS)
    built, build = [], _engine.build_fused_epoch

    def counted(*args, **kwargs):
        built.append(1)
        return build(*args, **kwargs)

    monkeypatch.setattr(_engine, "build_fused_epoch", counted)
    return built


def _data(seed):
    X, y = make_regression(120, 6, noise=1.0, random_state=seed)
    return X.astype(np.float32), y.astype(np.float32)


def _fit(X, y, **params):
    return OrtMLPRegressor(**{"hidden_layer_sizes": (8,), "max_iter": 4, "random_state": 0,
                              **params}).fit(X, y)


def _same(a, b):
    for ours, theirs in zip(a.coefs_ + a.intercepts_, b.coefs_ + b.intercepts_):
        np.testing.assert_array_equal(ours, theirs)
    assert a.loss_curve_ == b.loss_curve_


def test_a_fit_of_the_same_structure_starts_from_the_cache_and_trains_the_same(builds):
    cold = _fit(*_data(1))
    cache.COMPILED_STEPS.clear()
    _fit(*_data(2))  # another fold: other rows, the same graph
    assert len(builds) == 2 and len(cache.COMPILED_STEPS) == 1
    warm = _fit(*_data(1))
    assert len(builds) == 2  # the cached graph and session
    _same(warm, cold)


@pytest.mark.parametrize("change", [{"alpha": 0.0}, {"hidden_layer_sizes": (9,)},
                                    {"solver": "sgd"}, {"beta_1": 0.8}])
def test_a_parameter_that_changes_the_graph_or_the_optimizer_misses(change, builds):
    X, y = _data(1)
    _fit(X, y)
    _fit(X, y, **change)
    assert len(builds) == 2 and len(cache.COMPILED_STEPS) == 2


def test_the_grid_points_of_a_penalty_share_one_step(builds):
    """alpha is an input of the step (``hyper.l2``): a search over it compiles once, and
    each point trains as a fit that compiled its own."""
    X, y = _data(1)
    cold = {}
    for alpha in (1e-4, 0.1, 3.0):
        cache.COMPILED_STEPS.clear()
        cold[alpha] = _fit(X, y, alpha=alpha)
    builds.clear()
    cache.COMPILED_STEPS.clear()
    for alpha in (1e-4, 0.1, 3.0):
        _same(_fit(X, y, alpha=alpha), cold[alpha])
    assert len(builds) == 1 and len(cache.COMPILED_STEPS) == 1
    assert cold[3.0].coefs_[0].std() < cold[1e-4].coefs_[0].std()  # the penalty acts


def test_concurrent_fits_share_the_session_safely(builds):
    data = [_data(seed) for seed in range(4)]
    expected = [_fit(X, y) for X, y in data]
    cache.COMPILED_STEPS.clear()
    results = [None] * len(data)

    def fit(i):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results[i] = _fit(*data[i])

    threads = [threading.Thread(target=fit, args=(i,)) for i in range(len(data))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ours, theirs in zip(results, expected):
        _same(ours, theirs)


def test_the_cache_keeps_the_last_structures_only(builds):
    X, y = _data(1)
    for width in range(4, 4 + 3 * cache.COMPILED_STEPS.size):
        _fit(X, y, hidden_layer_sizes=(width,), max_iter=1)
    assert len(cache.COMPILED_STEPS) == cache.COMPILED_STEPS.size


def test_own_session_options_are_never_shared(builds):
    from ortlearn.optim import Adam
    from ortlearn.training import TrainingEngine
    from ortlearn.training.device import make_session_options

    model = _fit(*_data(1))._loss_model(weighted=False, values=True)
    builds.clear()
    cache.COMPILED_STEPS.clear()
    for _ in range(2):
        TrainingEngine(model[0], model[1], Adam(), session_options=make_session_options(1),
                       input_names=["X", "y"], loss_output="loss")
    assert len(builds) == 2 and len(cache.COMPILED_STEPS) == 0


def test_a_large_model_keeps_its_session_to_its_fit(builds, monkeypatch):
    """Its epochs outlast its setup; its session (arena, threads) goes with the fit."""
    monkeypatch.setattr(_engine, "COMPILED_MAX_WEIGHT_BYTES", 100)
    X, y = _data(1)
    _fit(X, y)
    _fit(X, y)
    assert len(builds) == 2 and len(cache.COMPILED_STEPS) == 0
