"""Out-of-core training and blockwise prediction on a Dask cluster.

``partial_fit`` is one pass over the chunk it gets, so ``dask_ml.wrappers.Incremental``
trains an ortlearn MLP block by block (blocks shuffled) over a dask array twice the size of a
worker's memory limit; ``ParallelPostFit`` and a plain ``map_blocks`` predict blockwise,
equal to ``predict`` bit for bit, with one inference session built per worker process.
"""

import os

import numpy as np
import pytest

pytest.importorskip("distributed")
pytest.importorskip("dask_ml")

import dask.array as da  # noqa: E402
from dask_helpers import local_client  # noqa: E402

from benchmarks.scaleout import start_rss_sampler, stop_rss_sampler  # noqa: E402
from ortlearn import OrtMLPClassifier, OrtMLPRegressor  # noqa: E402
from ortlearn.estimators import session_cache_info  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

#: each worker's memory limit (the process's, imports included: 320 to 440 MB of it is the
#: interpreter with scikit-learn, onnxruntime, dask-ml and ortlearn loaded, the more where
#: no module was compiled before, as in a fresh environment)
MEMORY_LIMIT = 1 << 30
N_FEATURES = 256
BLOCK_ROWS = (32 << 20) // (8 * N_FEATURES)    # 32 MiB blocks of float64


def _import_everything():
    import dask_ml.wrappers  # noqa: F401

    import ortlearn.estimators  # noqa: F401


@pytest.fixture(scope="module")
def client():
    # A worker past the pause threshold (80 %) would wait for memory to be freed, forever
    # when it is the interpreter's own; without the pause, going past the limit fails the
    # test (the nanny ends the worker at 95 %, the task is not retried).
    with local_client(__name__, memory_limit=MEMORY_LIMIT,
                      config={"distributed.worker.memory.pause": False}) as client:
        client.run(_import_everything)
        yield client


# ----------------------------------------------------------- a data set that is computed
_W = np.random.RandomState(0).randn(8) / 2


def _features(block_info=None):
    """Block ``i`` of X: uniform features drawn from a generator seeded by ``i``."""
    (start, stop), _ = block_info[None]["array-location"]
    rng = np.random.default_rng(block_info[None]["chunk-location"][0])
    X = rng.random((stop - start, N_FEATURES))
    X -= 0.5
    X *= 3.4   # unit variance
    return X


def _target(X):
    # the signal reads 8 features; a deterministic "noise" of variance 0.005 reads another
    return np.tanh(X[:, :8] @ _W) + 0.1 * np.sin(1000 * X[:, 8])


def _dask_data(n_blocks):
    chunks = ((BLOCK_ROWS,) * n_blocks, (N_FEATURES,))
    X = da.map_blocks(_features, chunks=chunks, dtype=np.float64,
                      meta=np.empty((0, N_FEATURES)))
    return X, X.map_blocks(_target, drop_axis=1, dtype=np.float64)


def _in_memory(n_rows, seed):
    rng = np.random.default_rng(seed)
    X = (rng.random((n_rows, N_FEATURES)) - 0.5) * 3.4
    return X, _target(X)


def _mlp():
    return OrtMLPRegressor(hidden_layer_sizes=(8,), batch_size=256, learning_rate_init=3e-3,
                           random_state=0)


# ------------------------------------------------------------------- partial_fit: a pass
@pytest.mark.parametrize("est", [_mlp(), OrtMLPClassifier(hidden_layer_sizes=(4,),
                                                          random_state=0)],
                         ids=["regressor", "classifier"])
def test_partial_fit_is_one_pass_over_the_chunk(est):
    X, y = _in_memory(600, 1)
    kwargs = {}
    if "Classifier" in type(est).__name__:
        y, kwargs = (y > 0).astype(int), {"classes": [0, 1]}
    once = est.partial_fit(X, y, **kwargs)
    assert (once.n_iter_, once.t_) == (1, 600)
    # the epoch fit(max_iter=1) runs, on the same shuffle: the same weights
    fitted = est.__class__(**{**est.get_params(), "max_iter": 1}).fit(X, y)
    for name, value in fitted.get_state().items():
        np.testing.assert_array_equal(once.get_state()[name], value, err_msg=name)
    once.partial_fit(X[:300], y[:300])
    assert (once.n_iter_, once.t_) == (1, 900)


# ------------------------------------------------------------------ out of core: train
def test_incremental_trains_over_twice_a_workers_memory(client):
    from dask_ml.wrappers import Incremental

    n_blocks = 2 * MEMORY_LIMIT // (BLOCK_ROWS * N_FEATURES * 8) + 1
    dX, dy = _dask_data(n_blocks)
    assert dX.nbytes > 2 * MEMORY_LIMIT
    pids = client.run(os.getpid)
    client.run(start_rss_sampler)
    model = Incremental(_mlp(), shuffle_blocks=True, random_state=0).fit(dX, dy)
    peaks = client.run(stop_rss_sampler)
    # no worker died (the nanny restarts one past 95 % of its limit), none went past it
    assert client.run(os.getpid) == pids
    assert max(peaks.values()) < MEMORY_LIMIT, peaks
    est = model.estimator_
    assert est.t_ == dX.shape[0] and est.n_iter_ == 1

    # the same model in memory: fit on 1/8 of the rows, 8 epochs
    X, y = _in_memory(dX.shape[0] // 8, 2)
    in_memory = _mlp().set_params(max_iter=8).fit(X, y)
    X_test, y_test = _in_memory(20_000, 3)
    r2_ooc, r2_mem = est.score(X_test, y_test), in_memory.score(X_test, y_test)
    # the noise is 0.5 % of the target's variance: both near R² = 0.99
    assert r2_mem > 0.97
    assert abs(r2_ooc - r2_mem) <= 0.01, (r2_ooc, r2_mem)


# ------------------------------------------------------------ blockwise: predict
def _predict_block(X, est):
    return est.predict(X)


@pytest.mark.parametrize("how", ["ParallelPostFit", "map_blocks"])
def test_blockwise_predictions_are_predict_and_build_one_session_per_worker(client, how):
    from dask_ml.wrappers import ParallelPostFit

    X, y = _in_memory(4000, 4)
    est = _mlp().set_params(max_iter=2).fit(X[:1000], y[:1000])
    dX = da.from_array(X, chunks=(200, N_FEATURES))    # 20 blocks
    before = client.run(session_cache_info)
    if how == "ParallelPostFit":
        blockwise = ParallelPostFit(est).predict(dX).compute()
    else:
        blockwise = dX.map_blocks(_predict_block, est=est, drop_axis=1,
                                  dtype=np.float64).compute()
    after = client.run(session_cache_info)
    # a worker's 200-row blocks on its one thread, against all rows on this process's
    # threads: MLAS may split a product otherwise (float32 sums of at most 100 terms,
    # 100 * 2**-24 = 6e-6 relative)
    np.testing.assert_allclose(blockwise, est.predict(X), rtol=1e-5,
                               atol=1e-5 * np.abs(blockwise).max())
    builds = {w: after[w]["builds"] - before[w]["builds"] for w in after}
    served = {w: builds[w] + after[w]["hits"] - before[w]["hits"] for w in after}
    assert sum(served.values()) == 20, served      # every block predicted through the cache
    assert set(builds.values()) <= {0, 1}, builds  # one session per worker, not per block
