"""
Data-parallel training on a Dask cluster
========================================

:class:`ortlearn.parallel.DataParallel` trains one :class:`~ortlearn.OrtMLPRegressor` on the
shards of several Dask workers: each worker runs ``partial_fit`` on its own rows, and the
copies of the model (weights and Adam's moments) are averaged after every round, an epoch or a
number of mini-batches. This example runs it on a small local cluster started in this process
and compares it with the same estimator fitted in one process.
"""

# %%
# The data
# --------
#
# A regression problem from ``make_regression``, its target scaled to unit variance, as a dask
# array of four blocks of rows. The rows are in random order: each block, hence each
# worker's shard, is a sample of the whole data.

import time
import warnings

import dask.array as da
import matplotlib.pyplot as plt
import numpy as np
from distributed import Client, LocalCluster
from sklearn.base import clone
from sklearn.datasets import make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split

from ortlearn import OrtMLPRegressor
from ortlearn.parallel import DataParallel

X, y = make_regression(n_samples=5000, n_features=10, n_informative=6, noise=10.0,
                       random_state=0)
y = y / y.std()
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=1000, random_state=0)
dX = da.from_array(X_train, chunks=(1000, 10))
dy = da.from_array(y_train, chunks=1000)
print(f"training rows: {dX.shape[0]} in {dX.numblocks[0]} blocks, test rows: {len(X_test)}")

EPOCHS = 8
estimator = OrtMLPRegressor(hidden_layer_sizes=(16,), batch_size=50, learning_rate_init=1e-2,
                            max_iter=EPOCHS, random_state=0)

# %%
# One process
# -----------
#
# The reference: ``fit`` on all the training rows, for the same number of epochs. It stops at
# ``max_iter`` before its stopping rule is met, which scikit-learn reports with a
# ``ConvergenceWarning``; the short fit is on purpose, so the warning is ignored in this block
# only.

single = clone(estimator)
start = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)
    single.fit(X_train, y_train)
single_time = time.perf_counter() - start
print(f"one process: R2 {single.score(X_test, y_test):.4f} after {single.n_iter_} epochs "
      f"({single_time:.2f} s)")

# %%
# Two workers
# -----------
#
# A ``LocalCluster`` of two workers with one thread each, here threads of this process
# (``processes=False``: nothing to spawn, the worker's copies live in this process); on a real
# cluster, pass the scheduler's address to ``Client``. ``DataParallel`` runs on the default
# client, the last one created. It places a shard on each worker holding blocks of the dask
# array, and averages the copies once an epoch (``sync_every=None``), or every ``sync_every``
# mini-batches of each worker. The ``with`` block closes the client and the cluster at its end.
#
# The shards are the blocks each worker computed, and which worker computes which block is
# the scheduler's choice: from one run to the next, a shard may hold other blocks, and the
# scores below change in their third decimal whatever ``random_state`` says. Lists of numpy
# arrays, one per shard (``fit([X0, X1], [y0, y1])``), fix the shards.

results = {}
with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                  dashboard_address=None) as cluster, Client(cluster) as client:
    for label, sync_every in [("average every epoch", None),
                              ("average every 5 batches", 5)]:
        parallel = DataParallel(estimator, sync_every=sync_every, random_state=0)
        start = time.perf_counter()
        parallel.fit(dX, dy)
        elapsed = time.perf_counter() - start
        results[label] = parallel
        print(f"{label}: {parallel.n_shards_} shards, {parallel.n_rounds_} averages, "
              f"{parallel.t_} rows trained on, R2 {parallel.score(X_test, y_test):.4f} "
              f"({elapsed:.2f} s)")
print("cluster closed:", cluster.status.name)

# %%
# The fitted model is ``estimator_``, an ordinary ``OrtMLPRegressor`` holding the averaged
# weights: it predicts, pickles, exports to ONNX without the cluster.

averaged = results["average every epoch"].estimator_
rmse = np.sqrt(np.mean((averaged.predict(X_test) - y_test) ** 2))
print(f"{type(averaged).__name__}: test RMSE {rmse:.4f} "
      f"(the target's standard deviation is {y_test.std():.2f})")

# %%
# The loss curves
# ---------------
#
# ``train_losses_`` is the training loss of each epoch: for ``DataParallel``, the mean of the
# workers' batch losses weighted by their rows; for the single fit, the mean of its batch
# losses. In an epoch, each copy makes half the updates of the single fit (it sees half the
# rows), so the parallel fits learn less per epoch; their models still reach a test R2 close
# to the single fit's. Averaging every 5 batches gives about the same curve here as once an
# epoch, for eight times the averages: each one sends the model and Adam's moments to every
# worker and back, where the second fit's extra time above goes. :doc:`/scaling_out`
# discusses the trade-off and its measurements.

fig, ax = plt.subplots(figsize=(7, 4))
epochs = np.arange(1, EPOCHS + 1)
ax.plot(epochs, single.train_losses_, "o-", label="one process (fit)")
for label, parallel in results.items():
    ax.plot(epochs, parallel.train_losses_, "s--", label=f"2 workers, {label}")
ax.set_xlabel("epoch")
ax.set_ylabel("training loss")
ax.set_yscale("log")
ax.set_title("OrtMLPRegressor: one process against DataParallel on 2 workers")
ax.legend()
fig.tight_layout()

for label, parallel in [("one process", single), *results.items()]:
    print(f"{label:>24}: last epoch loss {parallel.train_losses_[-1]:.4f}")
