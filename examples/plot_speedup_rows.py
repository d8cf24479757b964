"""
Fit time against data size, for each estimator family
=====================================================

How long does an ortlearn ``fit`` take next to its scikit-learn counterpart, and how does that
change with the number of rows? This example times whole fits, end to end, of four estimator
families on data of 500 to 8000 rows and plots the ratio of the two times. It is a small live
run on the machine that builds this documentation; the full benchmark, with more workloads,
repetitions and the conditions of each measurement, is in :doc:`/benchmarks` (run it with
``python -m benchmarks``).
"""

# %%
# The contenders
# --------------
#
# Each family is a pair built with the same parameters:
#
# - ``MLPRegressor``: one hidden layer of 100 units, Adam, **10 epochs only** (``max_iter=10``
#   with ``tol=0``, so that every fit runs exactly 10 epochs whatever the data: both libraries
#   then warn that the optimisation has not converged, which is what we asked for here, so the
#   ``ConvergenceWarning`` is ignored around these fits and nowhere else);
# - ``SGDRegressor``: the defaults (it stops by its ``tol`` criterion after a few epochs).
#   ``OrtSGDRegressor`` updates the weights once per 32 rows by default
#   (``batch_size='auto'``), where scikit-learn updates them after every row;
# - ``Ridge``: the defaults (a linear system, solved once);
# - ``LogisticRegression``: the defaults (L-BFGS, to ``tol=1e-4``).
#
# The data come from ``make_regression`` and ``make_classification`` with 20 features; the
# regression target is divided by its standard deviation.

import math
import statistics
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import make_classification, make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, Ridge, SGDRegressor
from sklearn.neural_network import MLPRegressor
from threadpoolctl import threadpool_limits

from ortlearn import OrtLogisticRegression, OrtMLPRegressor, OrtRidge, OrtSGDRegressor

mlp_params = dict(hidden_layer_sizes=(100,), max_iter=10, tol=0.0, random_state=0)
families = {
    "MLPRegressor (10 epochs)": (
        lambda: MLPRegressor(**mlp_params), lambda: OrtMLPRegressor(**mlp_params), "regression"),
    "SGDRegressor": (
        lambda: SGDRegressor(random_state=0), lambda: OrtSGDRegressor(random_state=0),
        "regression"),
    "Ridge": (Ridge, OrtRidge, "regression"),
    "LogisticRegression": (LogisticRegression, OrtLogisticRegression, "classification"),
}
sizes = [500, 2000, 8000, 32000]


def make_data(kind, n_samples):
    if kind == "regression":
        X, y = make_regression(n_samples, 20, n_informative=10, noise=10.0, random_state=0)
        return X, y / y.std()
    return make_classification(n_samples, 20, n_informative=10, random_state=0)


# %%
# The timings
# -----------
#
# Each measurement is a whole ``fit`` of a fresh estimator: for ortlearn, its conversion to
# ONNX, the training graphs and sessions, and the training. Every estimator is fitted once
# before the measurements, so that imports and other one-time costs are left out. A fit
# shorter than 20 ms is repeated within a measurement (and the time divided). The two
# libraries are measured in turn, three times each (interleaved, so that a slow moment of the
# machine hits both), and the time kept is the median of the three. Both libraries run on one thread
# (``threadpool_limits``, which ortlearn also reads when it opens its onnxruntime sessions),
# as in :doc:`/benchmarks`: on a shared two-core machine, a second thread waiting for a busy
# core makes times swing widely. The table also gives ``n_iter_`` (epochs for the MLP and
# SGD, L-BFGS iterations for the logistic regression) and the training score (R² or
# accuracy) of each library's last fit: both fit the same model, in as many iterations.


def fits_per_measurement(make_model, X, y):
    """How many fits make a measurement of at least 20 ms (from one fit, timed)."""
    start = time.perf_counter()
    make_model().fit(X, y)
    return max(1, math.ceil(0.02 / (time.perf_counter() - start)))


def measure(make_model, X, y, number):
    """Seconds per fit of ``number`` fresh models, and the last model fitted."""
    models = [make_model() for _ in range(number)]
    start = time.perf_counter()
    for model in models:
        model.fit(X, y)
    return (time.perf_counter() - start) / number, models[-1]


def time_pair(make_sklearn, make_ortlearn, X, y, repeats=3):
    """Median seconds per fit of each library (interleaved), and a fitted model of each."""
    contenders = [make_sklearn, make_ortlearn]
    numbers = [fits_per_measurement(make, X, y) for make in contenders]
    seconds, models = [[], []], [None, None]
    for _ in range(repeats):
        for i, make in enumerate(contenders):
            elapsed, models[i] = measure(make, X, y, numbers[i])
            seconds[i].append(elapsed)
    return [statistics.median(s) for s in seconds], models


def iterations(model):
    """``n_iter_`` as one number (the largest over the targets), '-' where there is none."""
    n_iter = getattr(model, "n_iter_", None)
    return "-" if n_iter is None else str(int(np.max(n_iter)))


rows = []
with threadpool_limits(limits=1), warnings.catch_warnings():
    # only the 10-epoch MLPs warn, as they were told to stop early (see above)
    warnings.filterwarnings("ignore", category=ConvergenceWarning,
                            message=".*Maximum iterations \\(10\\)")
    for family, (make_sklearn, make_ortlearn, kind) in families.items():
        X_small, y_small = make_data(kind, sizes[0])
        make_sklearn().fit(X_small, y_small)  # warm-up
        make_ortlearn().fit(X_small, y_small)
        for n_samples in sizes:
            X, y = make_data(kind, n_samples)
            (sk_s, ort_s), (sk_model, ort_model) = time_pair(make_sklearn, make_ortlearn, X, y)
            rows.append((family, n_samples, sk_s, ort_s, ort_s / sk_s,
                         f"{iterations(sk_model)} / {iterations(ort_model)}",
                         f"{sk_model.score(X, y):.4f} / {ort_model.score(X, y):.4f}"))

print(f"{'family':<26}{'rows':>6}{'sklearn ms':>11}{'ortlearn ms':>12}{'ratio':>7}"
      f"{'n_iter_':>10}{'training score':>18}")
for family, n_samples, sk_s, ort_s, ratio, n_iter, score in rows:
    print(f"{family:<26}{n_samples:>6}{sk_s * 1e3:>11.2f}{ort_s * 1e3:>12.2f}{ratio:>7.2f}"
          f"{n_iter:>10}{score:>18}")

# %%
# The ratio of the fit times
# --------------------------
#
# Below the line, ortlearn's fit is the faster one. The ratio has a fixed part (building the
# graphs and sessions, a few milliseconds, which weighs most on small data and fast fits)
# and a part per row, per epoch or per evaluation of the objective.

fig, ax = plt.subplots(figsize=(8.5, 4.5))
for family in families:
    points = [(row[1], row[4]) for row in rows if row[0] == family]
    ax.plot(*zip(*points), marker="o", label=family)
ax.axhline(1.0, color="k", ls="--", lw=1, label="as fast as scikit-learn")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xticks(sizes, [str(n) for n in sizes])
ax.set_yticks([0.2, 0.5, 1, 2, 5, 10, 20], ["0.2", "0.5", "1", "2", "5", "10", "20"])
ax.minorticks_off()
ax.set_xlabel("training rows (20 features)")
ax.set_ylabel("ortlearn fit time / scikit-learn fit time")
ax.set_title("End-to-end fit time, ortlearn against scikit-learn (one thread)")
ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
fig.tight_layout()
plt.show()

# %%
# Reading the plot
# ----------------
#
# These are short fits on small data, timed on a shared machine: the ratios move from one
# build of this page to the next by tens of percent, and the ordering of the families is what
# to read. The MLP, where each mini-batch step is one onnxruntime call doing real work, is
# where ortlearn gains most, more so as the rows grow. The linear models fitted by L-BFGS or
# a linear solve stay within about 2x of scikit-learn: the logistic regression's ratio falls
# toward 1 as the rows grow and its fixed setup counts for less, while ``OrtRidge``'s rises
# slowly, forming ``X^T X`` and centring the data costing it more per row than scikit-learn.
# SGD with default parameters is the slowest, each 32-row step costing tens of microseconds
# against scikit-learn's Cython loop over single rows. :doc:`/benchmarks` measures larger
# workloads, first fits of a process and searches.
