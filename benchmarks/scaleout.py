"""W19: scale-out on Dask, with the ``dask`` extra.

Three contenders, each on a fresh ``dask.distributed.LocalCluster`` of worker processes with
one thread each on 127.0.0.1, started (and the workers' imports done) before the clock:

* ``dask_grid_1worker`` / ``dask_grid_2workers``: the wall time of a 16-point
  ``GridSearchCV`` (3 folds, 48 fits and the refit) over a scaler + ``OrtMLPRegressor``
  pipeline on joblib's dask backend. Their ratio is the speed-up of the second worker; the
  ideal is ``min(workers, cores)``, printed with it. Each worker gets
  ``ORTLEARN_NUM_THREADS = threads // workers`` (``--threads``). On one single-thread worker
  joblib runs the search in the calling process (its ``n_jobs == 1`` shortcut): the 1-worker
  time is the sequential search.
* ``dask_dataparallel_1worker`` / ``dask_dataparallel_2workers``: seconds per epoch of
  :class:`ortlearn.parallel.DataParallel` (a shard per worker, averaged each epoch) and the
  R² it reaches in the same number of epochs.
* ``dask_incremental_outofcore``: ``dask_ml.wrappers.Incremental(OrtMLPRegressor)`` over a
  dask array computed block by block, four times the size of a worker's memory limit (at
  ``--scale 1``), blocks shuffled; the time of the pass, the peak resident memory of the
  workers (sampled every 5 ms) and the R² on held-out rows.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from benchmarks._harness import Contender, Options, Unavailable, Workload

#: a worker's memory limit in the out-of-core run (its process: 320 to 440 MB of it is the
#: interpreter with scikit-learn, onnxruntime, dask-ml and ortlearn loaded, the more in a
#: fresh environment; past 80 % of the limit a worker pauses)
MEMORY_LIMIT = 1 << 30
N_FEATURES = 256
BLOCK_ROWS = (32 << 20) // (8 * N_FEATURES)   # 32 MiB blocks of float64
_W = np.random.RandomState(0).randn(8) / 2

GRID = {"ortmlpregressor__alpha": [1e-4, 1e-2],
        "ortmlpregressor__learning_rate_init": [1e-3, 3e-3, 1e-2, 3e-2],
        "ortmlpregressor__hidden_layer_sizes": [(16,), (32,)]}


def _import_everything():
    """Imports, and a first fit and prediction: what a process pays once (the converters)."""
    import warnings

    import dask_ml.wrappers  # noqa: F401
    import sklearn.model_selection  # noqa: F401

    from ortlearn import OrtMLPRegressor

    X = np.random.RandomState(0).randn(64, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=1).fit(X, X[:, 0]).predict(X)


class _Cluster:
    """A LocalCluster and its client, workers warmed up; closed on exit."""

    def __init__(self, n_workers: int, threads: int, memory_limit=None):
        try:
            from distributed import Client, LocalCluster
        except ImportError as exc:
            raise Unavailable("the dask extra is not installed "
                              "(pip install 'ortlearn[dask]')") from exc
        env = {"ORTLEARN_NUM_THREADS": str(max(1, threads // n_workers))}
        kwargs = {} if memory_limit is None else {"memory_limit": memory_limit}
        self.cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                    host="127.0.0.1", dashboard_address=None, env=env,
                                    **kwargs)
        self.client = Client(self.cluster, timeout=60)
        self.client.run(_import_everything)

    def __enter__(self):
        return self.client

    def __exit__(self, *exc):
        self.client.close(timeout=30)
        self.cluster.close(timeout=30)


# ------------------------------------------------------------------------------ the grid
def _grid_contender(n_workers: int, threads: int, n_rows: int) -> Contender:
    def run(seed, warmup):
        import joblib
        from sklearn.model_selection import GridSearchCV
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        from ortlearn import OrtMLPRegressor

        rs = np.random.RandomState(seed)
        X = rs.randn(n_rows, 20)
        y = np.tanh(X @ rs.randn(20) / 4) + 0.05 * rs.randn(n_rows)
        pipe = make_pipeline(StandardScaler(), OrtMLPRegressor(max_iter=10, batch_size=64,
                                                               random_state=0))
        grid = {k: v[:1] for k, v in GRID.items()} if warmup else GRID
        with _Cluster(n_workers, threads) as client:
            with joblib.parallel_backend("dask"):
                # Each cluster is new, and one worker runs the search in this process
                # (joblib's n_jobs == 1 shortcut), which earlier runs warmed: the same
                # search once untimed gives the workers what this process already has
                # (the converters and the sessions of these shapes).
                GridSearchCV(pipe, grid, cv=3).fit(X, y)
                start = time.perf_counter()
                search = GridSearchCV(pipe, grid, cv=3).fit(X, y)
                elapsed = time.perf_counter() - start
            assert len(client.scheduler_info()["workers"]) == n_workers
        return {"time": elapsed, "r2": float(search.best_score_),
                "fits": 3 * len(search.cv_results_["params"]) + 1}

    name = f"dask_grid_{n_workers}worker{'s' if n_workers > 1 else ''}"
    return Contender(name, "ortlearn", run,
                     note=f"16-point GridSearchCV, 3 folds, on {n_workers} worker process(es)")


# ------------------------------------------------------------------------- out of core
def _features(block_info=None):
    (start, stop), _ = block_info[None]["array-location"]
    rng = np.random.default_rng(block_info[None]["chunk-location"][0])
    X = rng.random((stop - start, N_FEATURES))
    X -= 0.5
    X *= 3.4
    return X


def _target(X):
    return np.tanh(X[:, :8] @ _W) + 0.1 * np.sin(1000 * X[:, 8])


def start_rss_sampler(dask_worker):
    """Sample this Dask worker's resident memory every 5 ms into its peak (``client.run``)."""
    import psutil

    state = dask_worker._bench_rss = {"peak": 0, "stop": False}
    process = psutil.Process()

    def sample():
        while not state["stop"]:
            state["peak"] = max(state["peak"], process.memory_info().rss)
            time.sleep(0.005)

    threading.Thread(target=sample, daemon=True).start()


def stop_rss_sampler(dask_worker) -> int:
    """Stop the sampler of :func:`start_rss_sampler`; the peak resident bytes it saw."""
    dask_worker._bench_rss["stop"] = True
    return dask_worker._bench_rss["peak"]


def _outofcore_contender(times_limit: float) -> Contender:
    def run(seed, warmup):
        import dask.array as da
        from dask_ml.wrappers import Incremental

        from ortlearn import OrtMLPRegressor

        n_blocks = 2 if warmup else max(2, round(times_limit * MEMORY_LIMIT
                                                 / (BLOCK_ROWS * N_FEATURES * 8)))
        X = da.map_blocks(_features, chunks=((BLOCK_ROWS,) * n_blocks, (N_FEATURES,)),
                          dtype=np.float64, meta=np.empty((0, N_FEATURES)))
        y = X.map_blocks(_target, drop_axis=1, dtype=np.float64)
        model = Incremental(OrtMLPRegressor(hidden_layer_sizes=(8,), batch_size=256,
                                            learning_rate_init=3e-3, random_state=seed),
                            shuffle_blocks=True, random_state=seed)
        with _Cluster(2, 2, memory_limit=MEMORY_LIMIT) as client:
            pids = client.run(os.getpid)
            client.run(start_rss_sampler)
            start = time.perf_counter()
            model.fit(X, y)
            elapsed = time.perf_counter() - start
            peak = max(client.run(stop_rss_sampler).values())
            restarted = client.run(os.getpid) != pids
        rng = np.random.default_rng(10_000 + seed)
        X_test = (rng.random((20_000, N_FEATURES)) - 0.5) * 3.4
        return {"time": elapsed, "r2": float(model.estimator_.score(X_test, _target(X_test))),
                "data_mb": X.nbytes / 2**20, "memory_limit_mb": MEMORY_LIMIT / 2**20,
                "peak_worker_mb": peak / 2**20, "workers_restarted": int(restarted),
                "gb_per_s": X.nbytes / 1e9 / elapsed}

    return Contender("dask_incremental_outofcore", "ortlearn", run,
                     note=f"Incremental over {times_limit:g}x a worker's memory limit "
                          f"({MEMORY_LIMIT >> 20} MiB), 2 workers, one pass, blocks shuffled")


# ------------------------------------------------------------------------ data parallel
def _dataparallel_contender(n_workers: int, threads: int, n_rows: int, epochs: int,
                            sync_every) -> Contender:
    def run(seed, warmup):
        import dask.array as da

        from ortlearn import OrtMLPRegressor
        from ortlearn.parallel import DataParallel

        rs = np.random.RandomState(0)
        w = rs.randn(20) / 4
        rows = 4000 if warmup else n_rows
        X = np.random.RandomState(seed).randn(rows + 20_000, 20)
        y = np.tanh(X @ w) + 0.05 * np.random.RandomState(seed + 1).randn(len(X))
        X_test, y_test, X, y = X[rows:], y[rows:], X[:rows], y[:rows]
        chunk = -(-rows // n_workers)
        dX, dy = da.from_array(X, chunks=(chunk, 20)), da.from_array(y, chunks=chunk)
        est = OrtMLPRegressor(hidden_layer_sizes=(64,), solver="adam", batch_size=256,
                              learning_rate_init=3e-3, random_state=0)
        with _Cluster(n_workers, threads):
            model = DataParallel(est, max_iter=2 if warmup else epochs, sync_every=sync_every,
                                 random_state=seed).fit(dX, dy)
        # the first epoch also builds each worker's training graph and session
        per_epoch = float(np.mean(model.epoch_times_[1:]))
        return {"time": per_epoch, "first_epoch_s": model.epoch_times_[0],
                "r2": float(model.score(X_test, y_test)), "shards": model.n_shards_,
                "rounds": model.n_rounds_}

    every = "each epoch" if sync_every is None else f"every {sync_every} batches"
    return Contender(f"dask_dataparallel_{n_workers}worker{'s' if n_workers > 1 else ''}",
                     "ortlearn", run,
                     note=f"DataParallel(OrtMLPRegressor 20-64-1, Adam), {n_rows} rows, "
                          f"{epochs} epochs, averaged {every}, {n_workers} worker(s): "
                          "s per epoch after the first")


def build_w19(opts: Options) -> Workload:
    """W19: the grid on 1 vs 2 Dask workers, and an out-of-core Incremental pass."""
    # --threads, as benchmarks.run puts it in force; the workers share it
    threads = int(os.environ.get("ORTLEARN_NUM_THREADS") or os.cpu_count() or 1)
    n_rows = max(int(round(2000 * opts.scale)), 200)
    times_limit = 4.0 * min(opts.scale, 1.0)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    dp_rows = max(int(round(400_000 * opts.scale)), 8000)
    dp_epochs = opts.epochs or 4
    contenders = [_grid_contender(1, threads, n_rows), _grid_contender(2, threads, n_rows),
                  _outofcore_contender(times_limit),
                  _dataparallel_contender(1, threads, dp_rows, dp_epochs, None),
                  _dataparallel_contender(2, threads, dp_rows, dp_epochs, None)]
    return Workload(
        "W19", "scale-out on Dask: a 16-point grid on 1 and 2 workers; out-of-core Incremental",
        "s", "r2",
        {"grid_rows": n_rows, "grid_points": 16, "folds": 3, "outofcore_times_limit": times_limit,
         "memory_limit_mb": MEMORY_LIMIT >> 20, "dataparallel_rows": dp_rows,
         "dataparallel_epochs": dp_epochs, "cores": cores},
        contenders,
        notes=[f"the ideal speed-up of the second worker on {cores} core(s) is "
               f"{min(2, cores)}x: dask_grid_2workers / dask_grid_1worker is its inverse; "
               "on 1 single-thread worker joblib runs the search in the calling process",
               "dask_incremental_outofcore: time of one pass; peak_worker_mb: the largest "
               "resident memory of a worker, sampled every 5 ms",
               "dask_dataparallel_*: seconds per epoch (after the first) of one model trained "
               "on a shard per worker, averaged each epoch; r2 on held-out rows"],
        pairs=[("dask_grid_2workers", "dask_grid_1worker"),
               ("dask_dataparallel_2workers", "dask_dataparallel_1worker")])
