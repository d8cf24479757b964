"""What a scikit-learn user waits for: whole fits, searches and the first fit of a process.

::

    python -m benchmarks.endtoend [--reps 5] [--pairs ridge,lasso] [--sizes 1000,10000,100000]
                                  [--n-jobs 1,2] [--no-cold] [--out DIR]

Four tables, each ortlearn against its scikit-learn counterpart in the same
process, interleaved, medians of ``--reps`` repetitions after a warm-up fit,
BLAS and onnxruntime on one thread for both (``threadpoolctl`` and
``ORTLEARN_NUM_THREADS``):

* **fits**: one estimator with its default parameters (unless the row says
  otherwise) on a scikit-learn data set: the whole ``fit``, conversion, graph
  building and session creation included; the ratio ortlearn / scikit-learn
  (the target is at most 1.0) and each side's test score;
* **rows**: the same fits (but of the Huber, Poisson, quantile and MLP regressors)
  on ``make_regression`` / ``make_classification``
  data of 20 features at ``--sizes`` rows (the ratio against the rows: where
  the crossovers are), and on a sparse CSR matrix (``--sparse-rows`` x 2000,
  0.5 % non-zeros) for the linear families;
* **searches**: ``GridSearchCV`` over a family's usual parameter, 5 folds,
  ``n_jobs`` each of ``--n-jobs``: the whole search, the same ``best_params_``;
* **cold start** (``--no-cold`` skips it): in a fresh process where the data
  are loaded (scikit-learn's data module, as in a user's script), the first fit
  (its imports included) against the same fit warm, for each side; ortlearn's
  one-time cost beyond scikit-learn's is the extra (the target is at most 0.2 s).

It writes ``endtoend.json``, ``endtoend.png`` (the ratios of the fits and searches) and
``endtoend_rows.png`` (the ratio against the rows, a line per family) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.report import pyplot, save_figure


@dataclass(frozen=True)
class Pair:
    """An ortlearn estimator, its counterpart and a data set.

    ``ours()`` and ``theirs()`` make the estimators, each importing only its own
    library (what the cold-start table times).
    """

    key: str
    title: str
    ours: object
    theirs: object
    data: str
    search: dict | None = None  # the grid of the search table, when it has a row
    sparse: bool = True  # a row of the sparse case (the linear families)
    rows: bool = True  # rows of the synthetic data at each size

    def make(self) -> tuple:
        return self.ours(), self.theirs()

    @property
    def task(self) -> str:
        return "regression" if self.data == "diabetes" else "classification"


def _estimator(module: str, name: str, *args, **params):
    """``make() -> module.name(*args, **params)``, the module imported when called."""
    def make():
        import importlib

        return getattr(importlib.import_module(module), name)(*args, **params)
    return make


def _data(name: str):
    """(X_train, X_test, y_train, y_test) of a scikit-learn data set, standardized."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    loader = {"diabetes": datasets.load_diabetes, "breast_cancer": datasets.load_breast_cancer,
              "digits": datasets.load_digits, "wine": datasets.load_wine,
              "iris": datasets.load_iris}[name]
    X, y = loader(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
    scaler = StandardScaler().fit(X_train)
    return scaler.transform(X_train), scaler.transform(X_test), y_train, y_test


def _pairs() -> list[Pair]:
    ort, lm = "ortlearn.estimators", "sklearn.linear_model"
    mlp = {"max_iter": 50, "random_state": 0}
    return [
        Pair("sgd_regressor", "OrtSGDRegressor() / SGDRegressor()",
             _estimator(ort, "OrtSGDRegressor"), _estimator(lm, "SGDRegressor"), "diabetes"),
        Pair("sgd_classifier", "OrtSGDClassifier() / SGDClassifier()",
             _estimator(ort, "OrtSGDClassifier"), _estimator(lm, "SGDClassifier"),
             "breast_cancer"),
        Pair("ridge", "OrtRidge() / Ridge()", _estimator(ort, "OrtRidge"),
             _estimator(lm, "Ridge"), "diabetes", {"alpha": [0.01, 0.1, 1.0, 10.0, 100.0]}),
        Pair("lasso", "OrtLasso(alpha=0.1) / Lasso(alpha=0.1)",
             _estimator(ort, "OrtLasso", alpha=0.1), _estimator(lm, "Lasso", alpha=0.1),
             "diabetes", {"alpha": [0.01, 0.1, 1.0, 10.0]}),
        Pair("linear_svc", "OrtLinearSVC() / LinearSVC()", _estimator(ort, "OrtLinearSVC"),
             _estimator("sklearn.svm", "LinearSVC"), "breast_cancer"),
        Pair("logistic", "OrtLogisticRegression() / LogisticRegression()",
             _estimator(ort, "OrtLogisticRegression"), _estimator(lm, "LogisticRegression"),
             "breast_cancer", {"C": [0.01, 0.1, 1.0, 10.0, 100.0]}),
        Pair("mlp_classifier", "OrtMLPClassifier((32,), max_iter=50) / MLPClassifier(...)",
             _estimator(ort, "OrtMLPClassifier", (32,), **mlp),
             _estimator("sklearn.neural_network", "MLPClassifier", (32,), **mlp),
             "breast_cancer", {"alpha": [1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0]}, sparse=False),
        # the other families with a scikit-learn counterpart (the rows table: the fast ones)
        Pair("elastic_net", "OrtElasticNet(alpha=0.1) / ElasticNet(alpha=0.1)",
             _estimator(ort, "OrtElasticNet", alpha=0.1),
             _estimator(lm, "ElasticNet", alpha=0.1), "diabetes"),
        # its default loss is solved in the dual, which refuses a CSR X (a dense Gram matrix)
        Pair("linear_svr", "OrtLinearSVR() / LinearSVR()", _estimator(ort, "OrtLinearSVR"),
             _estimator("sklearn.svm", "LinearSVR"), "diabetes", sparse=False),
        Pair("huber", "OrtHuberRegressor() / HuberRegressor()",
             _estimator(ort, "OrtHuberRegressor"), _estimator(lm, "HuberRegressor"),
             "diabetes", sparse=False, rows=False),
        Pair("poisson", "OrtPoissonRegressor() / PoissonRegressor()",
             _estimator(ort, "OrtPoissonRegressor"), _estimator(lm, "PoissonRegressor"),
             "diabetes", sparse=False, rows=False),
        Pair("quantile", "OrtQuantileRegressor() / QuantileRegressor()",
             _estimator(ort, "OrtQuantileRegressor"), _estimator(lm, "QuantileRegressor"),
             "diabetes", sparse=False, rows=False),
        Pair("mlp_regressor", "OrtMLPRegressor((32,), max_iter=50) / MLPRegressor(...)",
             _estimator(ort, "OrtMLPRegressor", hidden_layer_sizes=(32,), **mlp),
             _estimator("sklearn.neural_network", "MLPRegressor", hidden_layer_sizes=(32,),
                        **mlp),
             "diabetes", sparse=False, rows=False),
    ]


#: features of the synthetic data of the rows table, and the sparse case's shape
N_FEATURES, SPARSE_FEATURES, SPARSE_DENSITY = 20, 2000, 0.005


def _synthetic(task: str, n_rows: int, sparse: bool = False):
    """(X_train, X_test, y_train, y_test): 75 % / 25 % of ``make_regression`` /
    ``make_classification`` rows (20 features, the target scaled to unit variance), or of a
    random CSR matrix with a sparse linear target."""
    from sklearn.datasets import make_classification, make_regression
    from sklearn.model_selection import train_test_split

    if sparse:
        import scipy.sparse as sp

        rng = np.random.default_rng(0)
        X = sp.random(n_rows, SPARSE_FEATURES, density=SPARSE_DENSITY, format="csr",
                      random_state=rng, data_rvs=rng.standard_normal)
        coef = rng.standard_normal(SPARSE_FEATURES) * (rng.random(SPARSE_FEATURES) < 0.2)
        score = X @ coef + 0.1 * rng.standard_normal(n_rows)
        y = score / score.std() if task == "regression" else (score > 0).astype(int)
    elif task == "regression":
        X, y = make_regression(n_rows, N_FEATURES, n_informative=10, noise=10.0,
                               random_state=0)
        y = y / y.std()
    else:
        X, y = make_classification(n_rows, N_FEATURES, n_informative=10, random_state=0)
    return train_test_split(X, y, test_size=0.25, random_state=0)


def _interleaved(runs: dict, reps: int) -> dict:
    """``{name: (times, result)}``: the runs alternate, one repetition each in turn."""
    out = {name: ([], run()) for name, run in runs.items()}  # warm-up
    for _ in range(reps):
        for name, run in runs.items():
            start = time.perf_counter()
            result = run()
            out[name][0].append(time.perf_counter() - start)
            out[name] = (out[name][0], result)
    return out


def _fit_row(pair, data, reps: int, label: str, **extra) -> dict:
    """The interleaved fits of ``pair`` on ``data`` (train and test splits): times, ratio,
    each side's held-out score and ``n_iter_``."""
    from sklearn.base import clone

    X_train, X_test, y_train, y_test = data
    runs = {side: (lambda e=est: clone(e).fit(X_train, y_train))
            for side, est in zip(("ortlearn", "sklearn"), pair.make())}
    timed = _interleaved(runs, reps)
    medians = {side: statistics.median(times) for side, (times, _) in timed.items()}
    row = {"pair": pair.key, "title": pair.title, "data": label, **extra,
           "ortlearn_s": medians["ortlearn"], "sklearn_s": medians["sklearn"],
           "ratio": medians["ortlearn"] / medians["sklearn"]}
    for side, (_, model) in timed.items():
        row[f"{side}_score"] = float(model.score(X_test, y_test))
        n_iter = getattr(model, "n_iter_", None)
        row[f"{side}_n_iter"] = None if n_iter is None else int(np.max(n_iter))
    print(_row(row), flush=True)
    return row


def fit_table(pairs, reps: int) -> list[dict]:
    return [_fit_row(pair, _data(pair.data), reps, pair.data) for pair in pairs]


def rows_table(pairs, sizes, reps: int, sparse_rows: int | None) -> list[dict]:
    """The fits on synthetic data of ``sizes`` rows, then the sparse case."""
    rows = []
    for pair in (p for p in pairs if p.rows):
        for n_rows in sizes:
            rows.append(_fit_row(pair, _synthetic(pair.task, n_rows), reps,
                                 f"make_{pair.task}", rows=n_rows, sparse=False))
        if sparse_rows and pair.sparse:
            rows.append(_fit_row(pair, _synthetic(pair.task, sparse_rows, sparse=True), reps,
                                 f"CSR {sparse_rows} x {SPARSE_FEATURES}", rows=sparse_rows,
                                 sparse=True))
    return rows


def search_table(pairs, reps: int, n_jobs=(1,)) -> list[dict]:
    from sklearn.model_selection import GridSearchCV

    rows = []
    for pair in pairs:
        if not pair.search:
            continue
        X_train, _, y_train, _ = _data(pair.data)
        ours, theirs = pair.make()
        for jobs in n_jobs:
            runs = {side: (lambda e=est: GridSearchCV(e, pair.search, cv=5, n_jobs=jobs)
                           .fit(X_train, y_train))
                    for side, est in (("ortlearn", ours), ("sklearn", theirs))}
            timed = _interleaved(runs, reps)
            medians = {side: statistics.median(times) for side, (times, _) in timed.items()}
            best = {side: result.best_params_ for side, (_, result) in timed.items()}
            rows.append({"pair": pair.key, "n_jobs": jobs,
                         "title": f"GridSearchCV({pair.title}, {pair.search}, n_jobs={jobs})",
                         "data": pair.data, "ortlearn_s": medians["ortlearn"],
                         "sklearn_s": medians["sklearn"],
                         "ratio": medians["ortlearn"] / medians["sklearn"],
                         "same_best_params": best["ortlearn"] == best["sklearn"],
                         "best_params": {k: repr(v) for k, v in best.items()}})
            print(_row(rows[-1]), flush=True)
    return rows


#: In a fresh process, the data loaded, then the first fit of one side of a pair (imports
#: included) and the same fit again, timed inside the child.
_COLD = """
import time
import warnings
warnings.simplefilter("ignore")
from benchmarks.endtoend import _data
X, _, y, _ = _data(DATA)
start = time.perf_counter()
from benchmarks.endtoend import _pairs
pair = {p.key: p for p in _pairs()}[KEY]
(pair.ours if SIDE == 0 else pair.theirs)().fit(X, y)
first = time.perf_counter() - start
start = time.perf_counter()
(pair.ours if SIDE == 0 else pair.theirs)().fit(X, y)
print(first, time.perf_counter() - start)
"""


def _cold(pair, side: int, pycache: str) -> tuple[float, float]:
    """(first fit s, the same fit again s) of ``pair``'s side (0 ortlearn, 1 scikit-learn).

    The child runs twice, timed the second time: a user's script imports modules whose
    bytecode its earlier runs (or pip) compiled, whatever ``PYTHONDONTWRITEBYTECODE``
    this process has (the bytecode goes to ``pycache``, out of the tree).
    """
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root),
                                                        os.environ.get("PYTHONPATH", "")]),
           "PYTHONPYCACHEPREFIX": pycache}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    code = (_COLD.replace("DATA", repr(pair.data)).replace("KEY", repr(pair.key))
            .replace("SIDE", str(side)))
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=True, cwd=root)
    first, warm = map(float, out.stdout.split()[-2:])
    return first, warm


def cold_table(pairs) -> list[dict]:
    """The one-time cost of the first fit of a process (its imports, ortlearn's first
    session), each side's, once scikit-learn's data module is loaded as a user's is."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="ortlearn-pycache-") as pycache:
        for pair in pairs:
            (first, warm), (skl_first, skl_warm) = (_cold(pair, 0, pycache),
                                                    _cold(pair, 1, pycache))
            extra = (first - warm) - (skl_first - skl_warm)
            rows.append({"pair": pair.key, "title": pair.title, "first_s": first,
                         "warm_s": warm, "sklearn_first_s": skl_first,
                         "sklearn_warm_s": skl_warm, "extra_s": extra})
            print(f"{pair.title:60s} first fit {first:.3f} s (warm {warm:.3f}), "
                  f"scikit-learn's {skl_first:.3f} s (warm {skl_warm:.3f}): ortlearn's "
                  f"one-time extra {extra:.3f} s", flush=True)
    return rows


def _row(row: dict) -> str:
    where = f" {row['data']}" + (f" {row['rows']}" if "rows" in row else "")
    return (f"{(row['title'][:48] + where)[:70]:70s} ortlearn {row['ortlearn_s'] * 1e3:9.1f} ms"
            f"  sklearn {row['sklearn_s'] * 1e3:9.1f} ms  ratio {row['ratio']:7.2f}")


def _plot(result: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    rows = result["fits"] + result["searches"]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.5))
    ax.barh([r["title"][:60] for r in rows], [r["ratio"] for r in rows], color="tab:blue")
    ax.axvline(1.0, color="tab:red", linestyle="--", label="scikit-learn (target: at most 1)")
    ax.set_xscale("log")
    ax.set_xlabel("ortlearn time / scikit-learn time (whole fit or search, log scale)")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _plot_rows(rows: list[dict], path: Path) -> bool:
    """The ratio against the rows, a line per family (dense), a cross for the sparse case."""
    plt = pyplot()
    if plt is None or not rows:
        return False
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for key in dict.fromkeys(r["pair"] for r in rows):
        dense = [(r["rows"], r["ratio"]) for r in rows if r["pair"] == key and not r["sparse"]]
        line, = ax.plot(*zip(*dense), marker="o", label=key)
        for r in rows:
            if r["pair"] == key and r["sparse"]:
                ax.plot(r["rows"], r["ratio"], marker="x", markersize=10, color=line.get_color())
    ax.axhline(1.0, color="k", linestyle="--", lw=1, label="scikit-learn (target: at most 1)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"training rows (75 % of the data; {N_FEATURES} features; x: sparse CSR, "
                  f"{SPARSE_FEATURES} features)")
    ax.set_ylabel("ortlearn fit time / scikit-learn fit time")
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.endtoend", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (median)")
    parser.add_argument("--pairs", default=None,
                        help="comma-separated subset of: " + ",".join(p.key for p in _pairs()))
    parser.add_argument("--sizes", default="1000,10000,100000",
                        help="rows of the synthetic data of the rows table ('' skips it)")
    parser.add_argument("--sparse-rows", type=int, default=20000,
                        help="rows of the sparse case of the rows table (0 skips it)")
    parser.add_argument("--n-jobs", default="1,2",
                        help="n_jobs of the searches (empty: no search table)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold-start table")
    parser.add_argument("--out", default="benchmark_results", help="folder of the results")
    args = parser.parse_args(argv)
    pairs = _pairs()
    if args.pairs:
        wanted = args.pairs.split(",")
        unknown = sorted(set(wanted) - {p.key for p in pairs})
        if unknown:
            parser.error(f"unknown pairs {unknown}")
        pairs = [p for p in pairs if p.key in wanted]
    from threadpoolctl import threadpool_limits

    from benchmarks._env import load_threaded_libraries
    from ortlearn.training.device import NUM_THREADS_ENV

    load_threaded_libraries()

    threads = os.environ.get(NUM_THREADS_ENV)
    os.environ[NUM_THREADS_ENV] = threads or "1"  # the child of the cold table inherits it
    try:
        with warnings.catch_warnings(), threadpool_limits(1):
            warnings.simplefilter("ignore")
            sizes = [int(s) for s in args.sizes.split(",") if s]
            result = {"reps": args.reps, "fits": fit_table(pairs, args.reps),
                      "rows": rows_table(pairs, sizes, args.reps, args.sparse_rows),
                      "searches": search_table(pairs, args.reps,
                                               [int(j) for j in args.n_jobs.split(",") if j]),
                      "cold": [] if args.no_cold else cold_table(pairs)}
    finally:
        if threads is None:
            del os.environ[NUM_THREADS_ENV]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "endtoend.json").write_text(json.dumps(result, indent=1))
    if _plot(result, out / "endtoend.png"):
        print(f"chart: {out / 'endtoend.png'}")
    if _plot_rows(result["rows"], out / "endtoend_rows.png"):
        print(f"chart: {out / 'endtoend_rows.png'}")
    worst = max((r["ratio"] for r in result["fits"] + result["rows"] + result["searches"]),
                default=np.nan)
    print(f"largest ratio ortlearn / scikit-learn: {worst:.2f} (target: at most 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
