"""Data-parallel training of one model on a Dask cluster:
``ortlearn.parallel.DataParallel`` and the model averaging under it."""

import sys

import numpy as np
import pytest

from ortlearn import OrtMLPClassifier, OrtMLPRegressor, OrtSGDRegressor
from ortlearn.estimators import average_estimators

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


_W = np.random.RandomState(42).randn(10) / 3


def _data(n=4000, seed=0):
    rs = np.random.RandomState(seed)
    X = rs.randn(n, 10)
    return X, np.tanh(X @ _W) + 0.05 * rs.randn(n)


def _mlp(**params):
    return OrtMLPRegressor(**{"hidden_layer_sizes": (16,), "solver": "adam", "batch_size": 50,
                              "learning_rate_init": 1e-2, "max_iter": 8, "random_state": 0,
                              **params})


# ------------------------------------------------------------------------ averaging
def test_average_is_the_weighted_mean_of_weights_and_optimizer_state():
    X, y = _data(600)
    a = _mlp().partial_fit(X[:300], y[:300])
    b = _mlp().partial_fit(X[300:], y[300:])
    mean = average_estimators([a, b], weights=[1, 3])
    for name, value in mean.get_state().items():
        np.testing.assert_allclose(value, (a.get_state()[name] + 3 * b.get_state()[name]) / 4,
                                   rtol=1e-12, err_msg=name)
    for param, moments in mean._optimizer_state["states"].items():
        for key, value in moments.items():
            np.testing.assert_allclose(
                value, (a._optimizer_state["states"][param][key]
                        + 3 * b._optimizer_state["states"][param][key]) / 4, rtol=1e-12)
    # a copy: the ones given are untouched, and the mean predicts with its own weights
    assert not np.array_equal(a.predict(X), mean.predict(X))
    # the mean trains on: partial_fit starts from its weights and moments
    assert mean.partial_fit(X, y).t_ == a.t_ + 600
    with pytest.raises(ValueError, match="non-negative"):
        average_estimators([a, b], weights=[0, 0])
    with pytest.raises(TypeError, match="copies of one estimator"):
        average_estimators([a, OrtSGDRegressor().partial_fit(X, y)])


# ---------------------------------------------------------------------- the cluster
pytest.importorskip("distributed")

import dask.array as da  # noqa: E402
from dask_helpers import local_client  # noqa: E402

from ortlearn.parallel import DataParallel, _shard_rows  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with local_client(__name__) as client:
        yield client


def test_one_shard_is_the_same_partial_fit_calls_here(client):
    """One shard: averaging one copy is no change, so the model is the partial_fit of each
    epoch's order of the rows, bit for bit (the copies travel to a worker and back)."""
    X, y = _data(1000)
    model = DataParallel(_mlp(), max_iter=3, random_state=0).fit([X], [y])
    seed = int(np.random.RandomState(0).randint(2**31 - 1))
    here = _mlp()
    for epoch in range(3):
        rows = _shard_rows(seed, epoch, 0, 1000)
        here.partial_fit(X[rows], y[rows])
    for name, value in here.get_state().items():
        np.testing.assert_array_equal(model.estimator_.get_state()[name], value, err_msg=name)
    assert (model.n_iter_, model.n_rounds_, model.t_, model.n_shards_) == (3, 3, 3000, 1)
    np.testing.assert_array_equal(model.predict(X), here.predict(X))


@pytest.mark.parametrize("sync_every", [None, 10])
def test_two_workers_reach_the_single_worker_quality(client, sync_every):
    """Stated tolerance: on 2 workers (a shard each), 8 epochs reach the R² of 8 epochs of
    one fit on all the rows within 0.02 (held-out rows)."""
    X, y = _data(4000)
    X_test, y_test = _data(2000, seed=1)
    dX, dy = da.from_array(X, chunks=(1000, 10)), da.from_array(y, chunks=1000)
    model = DataParallel(_mlp(), sync_every=sync_every, random_state=0).fit(dX, dy)
    single = _mlp().fit(X, y)
    assert model.n_shards_ == 2 and model.t_ == 8 * 4000
    # 2 shards of 2000 rows, 40 batches each: 1 average an epoch, or 4 (every 10 batches)
    assert model.n_rounds_ == 8 * (1 if sync_every is None else 4)
    r2, r2_single = model.score(X_test, y_test), single.score(X_test, y_test)
    assert r2_single > 0.9
    assert r2 >= r2_single - 0.02, (r2, r2_single)
    assert len(model.train_losses_) == 8 and model.train_losses_[-1] < model.train_losses_[0]
    # the workers' copies (kept from round to round with their sessions) are gone
    assert set(client.run(_resident_copies).values()) == {0}


def test_a_seeded_fit_on_a_dask_array_is_reproducible(client):
    """With random_state, the blocks go to the same workers on every run, wherever the
    scheduler computed them: two fits give the same weights."""
    X, y = _data(2000)
    dX, dy = da.from_array(X, chunks=(250, 10)), da.from_array(y, chunks=250)
    fits = [DataParallel(_mlp(max_iter=2), random_state=0).fit(dX, dy) for _ in range(3)]
    for other in fits[1:]:
        for a, b in zip(fits[0].estimator_.coefs_, other.estimator_.coefs_):
            np.testing.assert_array_equal(a, b)


def test_a_lost_worker_or_a_closed_client_is_named():
    """What a round's failure says: a cancelled future (the data of a dead or restarted
    worker, "already forgotten") or a killed worker is a shard gone, a closed client is
    named as such; other errors pass through unchanged."""
    import concurrent.futures
    from types import SimpleNamespace

    from distributed import KilledWorker
    from distributed.client import FutureCancelledError

    from ortlearn.parallel import _lost

    running, closed = SimpleNamespace(status="running"), SimpleNamespace(status="closed")
    killed = KilledWorker("task", SimpleNamespace(address="tcp://w"), 3)
    for exc in (FutureCancelledError("x", reason="already forgotten"),
                concurrent.futures.CancelledError(), killed):
        meaning = _lost(exc, running)
        assert isinstance(meaning, RuntimeError) and "fit again" in str(meaning)
        assert "did a worker die or restart" in str(meaning)
    assert "client was closed" in str(_lost(AttributeError("'NoneType' ... broadcast"), closed))
    assert _lost(ValueError("a user's error"), running) is None


def _resident_copies():
    from ortlearn import parallel

    return len(parallel._RESIDENT)


def test_classifier_shards_in_a_list(client):
    X, y = _data(2000)
    labels = (y > 0).astype(int)
    clf = OrtMLPClassifier(hidden_layer_sizes=(8,), learning_rate_init=1e-2, batch_size=50,
                           max_iter=5, random_state=0)
    model = DataParallel(clf, random_state=0).fit([X[:1000], X[1000:]],
                                                   [labels[:1000], labels[1000:]])
    assert model.n_shards_ == 2
    np.testing.assert_array_equal(model.estimator_.classes_, [0, 1])
    X_test, y_test = _data(2000, seed=1)
    accuracy = model.score(X_test, (y_test > 0).astype(int))
    single = clf.fit(X, labels).score(X_test, (y_test > 0).astype(int))
    assert single > 0.9 and accuracy >= single - 0.03, (accuracy, single)


@pytest.mark.parametrize("max_iter", [0, -1, 2.5, True])
def test_bad_max_iter_is_refused_before_any_work(max_iter):
    """max_iter=0 used to train the estimator's own max_iter epochs (``self.max_iter or``)."""
    X, y = _data(100)
    with pytest.raises(ValueError, match="max_iter must be a positive integer or None"):
        DataParallel(_mlp(), max_iter=max_iter).fit([X], [y])


def test_without_dask_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    X, y = _data(100)
    with pytest.raises(ImportError, match=r"pip install 'ortlearn\[dask\]'"):
        DataParallel(_mlp()).fit([X], [y])


def test_estimators_do_not_import_dask():
    import subprocess

    code = ("import sys, ortlearn, ortlearn.estimators, ortlearn.parallel; "
            "print(sorted(m for m in ('dask', 'distributed', 'dask_ml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_shards_are_checked_before_training(client):
    """Empty shards are left out (one used to end in NotFittedError, all of them in an
    IndexError); other feature counts are refused before any worker trains; shards each
    holding one class (a dask array sorted by label) warn with the remedy."""
    X, y = _data(400)
    model = DataParallel(_mlp(max_iter=1), random_state=0)
    with pytest.warns(UserWarning, match="1 of 2 shards hold no row"):
        model.fit([X[:0], X], [y[:0], y])
    assert model.n_shards_ == 1
    with pytest.raises(ValueError, match="Every shard is empty"):
        model.fit([X[:0], X[:0]], [y[:0], y[:0]])
    with pytest.raises(ValueError, match=r"different numbers of features: \[10, 9\]"):
        model.fit([X[:200], X[200:, :9]], [y[:200], y[200:]])
    labels = (y > 0).astype(int)
    order = np.argsort(labels, kind="stable")
    clf = OrtMLPClassifier(hidden_layer_sizes=(4,), max_iter=1, random_state=0)
    half = len(order) // 2
    with pytest.warns(UserWarning, match=r"shard 1: classes \[1\]\).*Shuffle the rows"):
        DataParallel(clf).fit([X[order[:half]], X[order[half:]]],
                              [labels[order[:half]], labels[order[half:]]])
