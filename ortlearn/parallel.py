"""Data-parallel training of one model on a Dask cluster (extra ``ortlearn[dask]``).

:class:`DataParallel` trains one estimator on the shards of several Dask workers: each worker
runs ``partial_fit`` on its own rows, and every round (an epoch, or ``sync_every`` mini-batches)
the copies are averaged, weights and optimizer state (model averaging, or "local SGD"). The
models travel as Dask futures: no socket of ortlearn's own.

This is the one module of ortlearn that uses Dask; it imports it when a fit starts, so that
``import ortlearn.parallel`` works without the extra. The estimators themselves need no Dask
code to run on a cluster (``doc/scaling_out.rst``).
"""

from __future__ import annotations

import copy
import math
import numbers
import time
import uuid
import warnings

import numpy as np
from sklearn.base import BaseEstimator, MetaEstimatorMixin, clone, is_classifier
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from .estimators import average_training_states, get_training_state, set_training_state
from .training.engine import DEFAULT_BATCH_ROWS

__all__ = ["DataParallel"]


def _distributed():
    try:
        import distributed
    except ImportError as exc:
        raise ImportError(
            "ortlearn.parallel needs dask.distributed, which is not installed: "
            "pip install 'ortlearn[dask]' (dask[array,distributed] and dask-ml).") from exc
    return distributed


def _shard_rows(seed: int, epoch: int, shard: int, n_rows: int) -> np.ndarray:
    """The rows of a shard in the order of an epoch (a generator per seed, epoch, shard)."""
    return np.random.default_rng([seed, epoch, shard]).permutation(n_rows)


#: On a worker: the copy of the model each shard trains, by ``(fit id, shard)``, kept
#: between rounds with its training session (a round sends it the averaged state only).
_RESIDENT: dict = {}


def _train_round(key, model, state, X, y, seed, epoch, shard, start, stop, fit_kwargs):
    """On the shard's worker: ``partial_fit`` of its copy on rows ``start:stop`` of the epoch's
    order, from the averaged ``state`` (None on the first round, where ``model`` is given).

    Returns the copy's training state, its loss and the rows it trained on (0: none left).
    """
    est = _RESIDENT.get(key)
    if est is None:
        if model is None:
            raise RuntimeError(f"The copy of shard {shard} is gone from its worker (did the "
                               "worker restart?): fit again.")
        # the model given to the tasks of one worker may be one object: train a copy
        est = _RESIDENT[key] = copy.deepcopy(model)
    if state is not None:
        set_training_state(est, *state)
    rows = _shard_rows(seed, epoch, shard, X.shape[0])[start:stop]
    if rows.size == 0:
        return None, 0.0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a last slice smaller than a batch
        est.partial_fit(X[rows], y[rows], **fit_kwargs)
    return get_training_state(est), float(est.loss_), int(rows.size)


def _take_resident(key):
    """The copy of a shard, without its training session (a fitted estimator to return)."""
    return copy.deepcopy(_RESIDENT[key])


def _drop_resident(fit_id):
    for key in [k for k in _RESIDENT if k[0] == fit_id]:
        del _RESIDENT[key]


def _lost(exc: BaseException, client) -> BaseException | None:
    """What a round's failure means to the user: the client closed, or a worker gone with its
    shard (a killed or restarted worker forgets its data and its copy); None: another error."""
    import concurrent.futures

    distributed = _distributed()
    if getattr(client, "status", "running") != "running":
        return RuntimeError("The Dask client was closed during DataParallel.fit: keep it open "
                            "until fit returns, then fit again.")
    if isinstance(exc, (concurrent.futures.CancelledError, distributed.KilledWorker)):
        return RuntimeError(f"A shard is gone with its worker (did a worker die or restart?): "
                            f"fit again. ({type(exc).__name__}: {exc})")
    return None


def _concatenate(*blocks):
    return np.concatenate(blocks) if len(blocks) > 1 else blocks[0]


def _blocks_by_worker(client, futures, deterministic: bool) -> dict:
    """``{worker: [block index]}``: where each block of a dask array is trained.

    Where its blocks were computed (no block moves), or, ``deterministic``, contiguous runs
    of blocks on the workers in name order: the same shards, and so the same fit, on every
    run (the scheduler places blocks differently from run to run).
    """
    if deterministic:
        workers = sorted(client.scheduler_info()["workers"])
        count = min(len(workers), len(futures))
        return {workers[k]: list(range(k * len(futures) // count,
                                       (k + 1) * len(futures) // count))
                for k in range(count)}
    where = client.who_has(futures)
    by_worker: dict = {}
    for i, future in enumerate(futures):
        by_worker.setdefault(sorted(where[future.key])[0], []).append(i)
    return by_worker


def _place_shards(client, X, y, deterministic: bool = False) -> list:
    """``[(worker, X future, y future, rows)]``: a shard per worker holding data.

    A dask array's blocks are joined per worker (:func:`_blocks_by_worker`). A list of arrays
    is scattered, one array per worker in turn.
    """
    import dask.array as da

    if isinstance(X, da.Array):
        if not isinstance(y, da.Array) or y.chunks[0] != X.chunks[0]:
            raise ValueError("With a dask array X, y must be a dask array whose row chunks "
                             f"are X's: {X.chunks[0]}; got {getattr(y, 'chunks', type(y))}.")
        X = X.rechunk({1: -1}) if X.ndim == 2 else X
        x_blocks = [b for b in X.to_delayed().ravel()]
        y_blocks = [b for b in (y.to_delayed().ravel() if y.ndim == 1
                                else y.rechunk({1: -1}).to_delayed().ravel())]
        x_futures = client.compute(x_blocks)
        y_futures = client.compute(y_blocks)
        distributed = _distributed()
        distributed.wait(x_futures + y_futures)
        shards = []
        by_worker = _blocks_by_worker(client, x_futures, deterministic)
        for worker, index in sorted(by_worker.items()):
            Xs = client.submit(_concatenate, *[x_futures[i] for i in index], workers=[worker],
                               pure=False)
            ys = client.submit(_concatenate, *[y_futures[i] for i in index], workers=[worker],
                               pure=False)
            shards.append((worker, Xs, ys, int(sum(X.chunks[0][i] for i in index))))
        return shards
    if not isinstance(X, (list, tuple)) or not isinstance(y, (list, tuple)) or len(X) != len(y):
        raise TypeError("DataParallel.fit takes a dask array X and y, or lists of shards X and "
                        "y of the same length (numpy arrays, one shard per worker).")
    workers = sorted(client.scheduler_info()["workers"])
    shards = []
    for i, (Xi, yi) in enumerate(zip(X, y)):
        Xi, yi = np.asarray(Xi), np.asarray(yi)
        if Xi.shape[0] != yi.shape[0]:
            raise ValueError(f"Shard {i}: X has {Xi.shape[0]} rows but y has {yi.shape[0]}.")
        worker = workers[i % len(workers)]
        shards.append((worker, client.scatter(Xi, workers=[worker]),
                       client.scatter(yi, workers=[worker]), Xi.shape[0]))
    return shards


def _shard_summary(X, y, classify: bool) -> tuple:
    """On the shard's worker: its feature count and, for a classifier, its classes' counts."""
    counts = None
    if classify and len(y):
        labels, n = np.unique(np.asarray(y), return_counts=True)
        counts = dict(zip(labels.tolist(), n.tolist()))
    return (X.shape[1] if X.ndim == 2 else None), counts


#: A shard whose class frequencies are farther than this (total variation) from the
#: whole data's trains its copy on another problem: the averaged model is then no good.
NON_IID_DISTANCE = 0.4


def _checked_shards(client, shards: list, classify: bool) -> list:
    """The shards with rows, after checking them on their workers (nothing trained yet).

    Empty shards are left out, with a warning; shards with other feature counts are a
    ValueError; classifier shards whose class frequencies are far from the whole data's
    (a dask array sorted by label, chunked as it is) are a warning naming the remedy.
    """
    kept = [s for s in shards if s[3] > 0]
    if not kept:
        raise ValueError("Every shard is empty: DataParallel needs rows to train on.")
    if len(kept) < len(shards):
        warnings.warn(f"{len(shards) - len(kept)} of {len(shards)} shards hold no row: they "
                      "are left out.", UserWarning, stacklevel=3)
    summaries = client.gather([client.submit(_shard_summary, Xs, ys, classify,
                                             workers=[worker], pure=False)
                               for worker, Xs, ys, _ in kept])
    features = {n for n, _ in summaries}
    if len(features) > 1:
        raise ValueError(f"The shards have different numbers of features: "
                         f"{[n for n, _ in summaries]} (one per shard); every shard must "
                         "hold the same columns.")
    if classify:
        total: dict = {}
        for _, counts in summaries:
            for label, n in counts.items():
                total[label] = total.get(label, 0) + n
        n_rows = sum(total.values())
        far = []
        for i, (_, counts) in enumerate(summaries):
            rows = sum(counts.values())
            distance = 0.5 * sum(abs(counts.get(c, 0) / rows - total[c] / n_rows)
                                 for c in total)
            if distance > NON_IID_DISTANCE:
                far.append(f"shard {i}: classes {sorted(counts)}")
        if far:
            warnings.warn(
                f"The shards' classes are far from the whole data's ({'; '.join(far)}): each "
                "copy learns another problem and the averaged model does poorly. Shuffle the "
                "rows before chunking them (e.g. sklearn.utils.shuffle before "
                "dask.array.from_array).", UserWarning, stacklevel=3)
    return kept


class DataParallel(MetaEstimatorMixin, BaseEstimator):
    """Train one estimator on several Dask workers, each on its shard, averaging the copies.

    Each round, every worker trains a copy of the current model on its own rows with
    ``partial_fit`` (the shard in a new shuffled order each epoch), then the copies are
    averaged, weights and optimizer state, weighted by the rows each trained on
    (:func:`~ortlearn.estimators.average_training_states`). A round is an epoch
    (``sync_every=None``) or ``sync_every`` mini-batches of each worker. The trade-off of
    model averaging: fewer rounds move less data (two copies of the model per worker per
    round) but let the copies drift apart between averages; averaging every step is
    synchronous data-parallel SGD with an effective batch of ``workers x batch_size`` rows.

    Runs on the default Dask client (``distributed.Client`` made before ``fit``). Each worker
    keeps its copy, with its training session, from round to round; a round sends it the
    averaged weights and optimizer state and brings back its own (two copies of the weights
    and the optimizer state per worker per round).

    Parameters
    ----------
    estimator : estimator with ``partial_fit``
        An ortlearn mini-batch estimator (``OrtMLPRegressor``, ``OrtSGDClassifier``, ...);
        its ``max_iter`` is the default number of epochs, and its ``random_state`` (drawn
        from ``random_state`` when None) gives every copy the same initial weights.
    max_iter : int, default=None
        Epochs (passes over every shard). None: the estimator's ``max_iter``.
    sync_every : int, default=None
        Mini-batches of each worker between two averages; None: one average per epoch.
    random_state : int, RandomState instance or None, default=None
        Seeds the shuffles of the shards (and the estimator's seed when it has none). Not
        None: a dask array's blocks are also shared out the same way on every run
        (contiguous runs of blocks to the workers in name order, moving the blocks computed
        elsewhere), so that a fit is reproducible; None: each worker trains the blocks it
        computed, moving none.

    Attributes
    ----------
    estimator_ : estimator
        The averaged, fitted model (it predicts on its own).
    n_iter_ : int
        Epochs run.
    n_rounds_ : int
        Averages made.
    t_ : int
        Rows trained on, over all workers.
    train_losses_ : list of float
        Each epoch's training loss: the mean of the workers' batch losses, weighted by rows.
    epoch_times_ : list of float
        Wall time of each epoch in seconds (training, transfers and averaging).
    n_shards_ : int
        Shards trained in parallel (workers holding data).

    Examples
    --------
    >>> from distributed import Client, LocalCluster               # doctest: +SKIP
    >>> client = Client(LocalCluster(n_workers=2, threads_per_worker=1))  # doctest: +SKIP
    >>> model = DataParallel(OrtMLPRegressor(max_iter=10)).fit(dask_X, dask_y)  # doctest: +SKIP
    """

    def __init__(self, estimator, *, max_iter=None, sync_every=None, random_state=None):
        self.estimator = estimator
        self.max_iter = max_iter
        self.sync_every = sync_every
        self.random_state = random_state

    def fit(self, X, y):
        """Train ``estimator`` on the shards of X and y.

        Parameters
        ----------
        X : dask array of shape (n_samples, n_features), or list of ndarray
            A dask array (each worker trains on the blocks it computes), or one array of
            rows per shard (scattered to the workers in turn).
        y : dask array of shape (n_samples,), or list of ndarray
            Targets, chunked or listed as X.

        Returns
        -------
        self : object
        """
        if self.sync_every is not None and (not isinstance(self.sync_every, int)
                                            or self.sync_every < 1):
            raise ValueError(f"sync_every must be a positive integer or None, got "
                             f"{self.sync_every!r}.")
        if self.max_iter is not None and (isinstance(self.max_iter, bool)
                                          or not isinstance(self.max_iter, numbers.Integral)
                                          or self.max_iter < 1):
            raise ValueError(f"max_iter must be a positive integer or None (the estimator's "
                             f"max_iter), got {self.max_iter!r}.")
        distributed = _distributed()
        client = distributed.default_client()
        rng = check_random_state(self.random_state)
        seed = int(rng.randint(2**31 - 1))
        model = clone(self.estimator)
        if not hasattr(model, "partial_fit"):
            raise TypeError(f"DataParallel trains with partial_fit, which "
                            f"{type(model).__name__} does not have.")
        if model.get_params().get("random_state", 0) is None:
            # every copy starts from the same initial weights
            model.set_params(random_state=int(rng.randint(2**31 - 1)))
        max_iter = model.get_params()["max_iter"] if self.max_iter is None else self.max_iter
        fit_kwargs = {"classes": _classes(X, y)} if is_classifier(model) else {}
        shards = _checked_shards(client, _place_shards(client, X, y, self.random_state is not None),
                                 is_classifier(model))
        rows_per_round = None
        if self.sync_every is not None:
            batch = model.get_params().get("batch_size", "auto")
            batch = DEFAULT_BATCH_ROWS if batch == "auto" else int(batch)
            rows_per_round = self.sync_every * batch
        longest = max(n for *_, n in shards)
        n_rounds = 1 if rows_per_round is None else math.ceil(longest / rows_per_round)
        self.train_losses_, self.epoch_times_, self.t_, self.n_rounds_ = [], [], 0, 0
        fit_id, state = uuid.uuid4().hex, None
        try:
            for epoch in range(max_iter):
                start_time, losses = time.perf_counter(), []
                for r in range(n_rounds):
                    start = 0 if rows_per_round is None else r * rows_per_round
                    stop = None if rows_per_round is None else start + rows_per_round
                    first = epoch == 0 and r == 0
                    futures = [client.submit(_train_round, (fit_id, i), model if first else None,
                                             state, Xs, ys, seed, epoch, i, start, stop,
                                             fit_kwargs, workers=[worker], pure=False)
                               for i, (worker, Xs, ys, _) in enumerate(shards)]
                    try:
                        trained = [t for t in client.gather(futures) if t[2]]
                    except Exception as exc:
                        meaning = _lost(exc, client)
                        if meaning is None:
                            raise
                        raise meaning from exc
                    state = average_training_states([t[0] for t in trained],
                                                    [t[2] for t in trained])
                    losses += [(t[1], t[2]) for t in trained]
                    self.t_ += sum(t[2] for t in trained)
                    self.n_rounds_ += 1
                self.train_losses_.append(float(sum(loss * n for loss, n in losses)
                                                / sum(n for _, n in losses)))
                self.epoch_times_.append(time.perf_counter() - start_time)
            fitted = client.submit(_take_resident, (fit_id, 0), workers=[shards[0][0]],
                                   pure=False).result()
        finally:
            if getattr(client, "status", "running") == "running":
                client.run(_drop_resident, fit_id)
        set_training_state(fitted, *state)
        self.n_iter_ = max_iter
        self.n_shards_ = len(shards)
        self.estimator_ = fitted
        return self

    def predict(self, X):
        """``estimator_.predict(X)``."""
        check_is_fitted(self)
        return self.estimator_.predict(X)

    def score(self, X, y, sample_weight=None):
        """``estimator_.score(X, y)``."""
        check_is_fitted(self)
        return self.estimator_.score(X, y, sample_weight=sample_weight)


def _classes(X, y):
    import dask.array as da

    if isinstance(y, da.Array):
        return np.unique(da.unique(y).compute())
    return np.unique(np.concatenate([np.unique(np.asarray(part)) for part in y]))
