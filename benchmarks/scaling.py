"""How an epoch's cost grows: ortlearn beside JAX and scikit-learn.

Usage::

    python -m benchmarks.scaling [--full] [--reps 3] [--threads 2] [--epochs 2]
                                 [--axes rows,width,depth,batch] [--scale 1] [--out DIR]

An MLP regressor (relu, Adam, ``alpha=0``) on ``make_regression(rows, 100)``
is trained from the same initial weights and batch order by the three
contenders (JAX: :mod:`benchmarks.xla`, skipped when not installed), and the
time of one epoch is measured while one setting moves away from the base
point (W2's model on fewer rows: 20 000 rows, one hidden layer of 100, batch
256):

* ``rows``: 10k to 100k (``--full``: to 1M);
* ``width``: the hidden layer's width, 32 to 512 (``--full``: to 1024);
* ``depth``: 1 to 2 hidden layers of 100 (``--full``: to 4);
* ``batch``: 32 to 2048 (``--full``: to 4096).

Each point times the contenders interleaved, their order rotated every
repetition; the medians over ``--reps`` are reported, with the ratios of
ortlearn to JAX and to scikit-learn (of the medians, and the median of the
per-repetition ratios, "paired"). ortlearn's epoch is timed by difference of a
1-epoch and an ``(1 + --epochs)``-epoch fit (its setup left out), scikit-learn's
fit divided by its epochs, JAX's epochs after the compilation; the epochs of a
point are at least ``--epochs``, more where an epoch is short (about
``--target-s`` seconds of scikit-learn's epochs, from its warm-up). Writes
``scaling.json``, ``scaling.md`` and, with matplotlib, ``scaling.png`` (log
axes, one panel per setting) to ``--out``; the load average of the machine at
the start and the end is in the JSON and under the table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from benchmarks import _env, report, xla

BASE = {"rows": 20_000, "width": 100, "depth": 1, "batch": 256}
GRIDS = {"rows": [10_000, 30_000, 100_000], "width": [32, 128, 512], "depth": [1, 2],
         "batch": [32, 256, 2048]}
FULL_GRIDS = {"rows": [10_000, 30_000, 100_000, 300_000, 1_000_000],
              "width": [32, 64, 128, 256, 512, 1024], "depth": [1, 2, 3, 4],
              "batch": [32, 64, 128, 256, 512, 1024, 2048, 4096]}
FEATURES = 100
LIBRARIES = ("ortlearn", "jax", "sklearn")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true",
                        help="the full grids (rows to 1M, width to 1024, depth to 4, batch to "
                             "4096): about an hour on 2 cores")
    parser.add_argument("--axes", default=",".join(GRIDS),
                        help="comma-separated subset of %(default)s")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions (median)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2,
                        help="fewest epochs timed per fit (ortlearn: on top of a 1-epoch fit); "
                             "more where an epoch is short (--target-s)")
    parser.add_argument("--target-s", type=float, default=0.3,
                        help="seconds of scikit-learn's epochs a fit aims at (sets the epochs)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of the rows (of the base point and the rows axis)")
    parser.add_argument("--pause", type=float, default=0.2)
    parser.add_argument("--out", default="benchmark_results")
    args = parser.parse_args(argv)
    args.axes = [a.strip() for a in args.axes.split(",") if a.strip()]
    unknown = sorted(set(args.axes) - set(GRIDS))
    if unknown or not args.axes:
        parser.error(f"unknown axes {unknown}; choose among {list(GRIDS)}")
    for name in ("reps", "threads", "epochs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if not 0 < args.scale <= 1:
        parser.error(f"--scale must be in (0, 1], got {args.scale}")
    return args


def _data(rows: int):
    from sklearn.datasets import make_regression

    X, y = make_regression(n_samples=rows, n_features=FEATURES, noise=1.0, random_state=0)
    return X.astype(np.float32), y.astype(np.float32)


def _contenders(X, y, hidden, batch, epochs, jax_modules):
    """``{library: run(seed) -> seconds per epoch}`` for one point (``epochs``: a callable,
    the epochs to time, decided after the warm-up)."""
    from sklearn.neural_network import MLPRegressor

    from benchmarks._harness import ADAM_LR, ortlearn_epochs, ortlearn_estimator, sklearn_epochs

    common = {"hidden_layer_sizes": hidden, "activation": "relu", "solver": "adam",
              "batch_size": batch, "learning_rate_init": ADAM_LR, "alpha": 0.0, "tol": 0.0,
              "early_stopping": False, "shuffle": True}

    def ortlearn(seed):
        def make(max_iter):
            return ortlearn_estimator("OrtMLPRegressor", {**common, "max_iter": max_iter,
                                                 "random_state": seed},
                             {"n_iter_no_change": max_iter + 1})
        return ortlearn_epochs(make, X, y, epochs() + 1, False)[0]["time"]

    def sklearn(seed):
        est = MLPRegressor(**common, max_iter=epochs(), n_iter_no_change=epochs() + 1,
                           random_state=seed)
        return sklearn_epochs(est, X, y)[0]["time"]

    runs = {"ortlearn": ortlearn, "sklearn": sklearn}
    if jax_modules[0] is not None:
        model = xla.JaxMLP(*jax_modules, X, y, hidden, batch, False, ADAM_LR)
        model.fit(0, 1)  # compiles
        runs["jax"] = lambda seed: model.fit(seed, epochs())["time"]
    return runs


def measure_point(setting: dict, reps: int, epochs: int, pause: float, jax_modules,
                  target_s: float = 0.3) -> dict:
    """Time the contenders at one point; medians, ratios and the raw times.

    The epochs timed are at least ``epochs``, more when an epoch is short: about
    ``target_s`` of scikit-learn's epochs (from its warm-up), so that ortlearn's
    difference of two fits is not lost in the noise of its setup.
    """
    X, y = _data(setting["rows"])
    hidden = (setting["width"],) * setting["depth"]
    chosen = [1]
    runs = _contenders(X, y, hidden, min(setting["batch"], len(X)), lambda: chosen[0],
                       jax_modules)
    raw = {lib: [] for lib in runs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter is fixed on purpose
        for run in runs.values():  # warm-up: imports, first sessions, caches
            per_epoch = run(1000)
        chosen[0] = int(min(max(epochs, round(target_s / max(per_epoch, 1e-6))), 100))
        for rep in range(reps):
            libs = list(runs)
            for lib in libs[rep % len(libs):] + libs[:rep % len(libs)]:
                time.sleep(pause)
                raw[lib].append({"rep": rep, "time": runs[lib](rep)})
    point = {"setting": setting, "epochs": chosen[0], "raw": raw,
             "median_s": {lib: report.summarize(r)["time"] for lib, r in raw.items()}}
    for ref in ("jax", "sklearn"):
        point[f"ortlearn_to_{ref}"] = report.ratio(point["median_s"]["ortlearn"],
                                                   point["median_s"].get(ref))
        point[f"paired_to_{ref}"] = report.paired_ratio(raw["ortlearn"], raw.get(ref, []))
    return point


def markdown(result: dict) -> str:
    """One row per point: the median epoch times and ortlearn's ratios."""
    lines = ["| axis | value | epochs | ortlearn s | jax s | sklearn s | ortlearn / jax (paired) "
             "| ortlearn / sklearn (paired) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    fmt = report.format_number
    for axis, points in result["axes"].items():
        for p in points:
            med = p["median_s"]
            lines.append(
                f"| {axis} | {p['setting'][axis]} | {p['epochs']} | {fmt(med['ortlearn'])} | "
                f"{fmt(med.get('jax'))} | {fmt(med['sklearn'])} | {fmt(p['ortlearn_to_jax'])} "
                f"({fmt(p['paired_to_jax'])}) | {fmt(p['ortlearn_to_sklearn'])} "
                f"({fmt(p['paired_to_sklearn'])}) |")
    meta = result["meta"]
    load = ", ".join(f"{v:.2f}" for v in meta["loadavg_1min_start_end"])
    lines += ["", f"- base point {meta['base']}; {meta['threads']} threads; at least "
                  f"{meta['epochs']} epochs timed; median of {meta['reps']}; load average (1 min) "
                  "at start, end: "
                  f"{load}; {meta['machine']['cpu']}, {meta['machine']['date']}"]
    lines += [f"- {n}" for n in meta["notes"]]
    return "\n".join(lines)


def write_plot(result: dict, path) -> bool:
    """One log-log panel per axis, a line style per library (False without matplotlib)."""
    plt = report.pyplot()
    if plt is None:
        return False

    axes = result["axes"]
    fig, panels = plt.subplots(1, len(axes), figsize=(3.6 * len(axes), 3.4), squeeze=False)
    styles = {"ortlearn": ("tab:blue", "-", "o"), "jax": ("tab:purple", "--", "s"),
              "sklearn": ("tab:orange", ":", "^")}
    for ax, (axis, points) in zip(panels[0], axes.items()):
        xs = [p["setting"][axis] for p in points]
        for lib, (color, line, marker) in styles.items():
            ys = [p["median_s"].get(lib) for p in points]
            if any(v is None for v in ys):
                continue
            ax.plot(xs, ys, color=color, linestyle=line, marker=marker, label=lib)
        ax.set_xscale("log", base=2 if axis != "rows" else 10)
        ax.set_yscale("log")
        ax.set_xlabel(axis if axis != "depth" else "hidden layers")
        ax.set_title(f"epoch time against {axis}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    panels[0][0].set_ylabel("seconds per epoch")
    panels[0][0].legend(fontsize=8)
    meta = result["meta"]
    fig.suptitle(f"MLP regressor, Adam; base {meta['base']}; {meta['threads']} threads",
                 fontsize=8)
    return report.save_figure(fig, path)


def run(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    jax, optax, jax_note = xla.import_jax(args.threads)
    notes = [jax_note]
    print(jax_note, flush=True)
    import sklearn.neural_network  # noqa: F401  loaded before the thread limits

    grids = dict(FULL_GRIDS if args.full else GRIDS)
    base = dict(BASE)
    if args.scale != 1:
        base["rows"] = max(int(base["rows"] * args.scale), 64)
        grids["rows"] = [max(int(r * args.scale), 64) for r in grids["rows"]]
    result = {"axes": {}}
    with _env.thread_limits(args.threads):
        threads = _env.thread_report()
        for axis in args.axes:
            result["axes"][axis] = []
            for value in grids[axis]:
                setting = {**base, axis: value}
                point = measure_point(setting, args.reps, args.epochs, args.pause,
                                      (jax, optax), args.target_s)
                result["axes"][axis].append(point)
                med = ", ".join(f"{k} {v:.4g}" for k, v in point["median_s"].items())
                print(f"{axis}={value}: {med} s/epoch ({point['epochs']} epochs)", flush=True)
    result["meta"] = {"versions": _env.versions(), "machine": _env.machine("cpu"),
                      "threads": args.threads, "threads_in_force": threads, "reps": args.reps,
                      "epochs": args.epochs, "base": base, "full": args.full,
                      "scale": args.scale,
                      "loadavg_1min_start_end": [load_start[0], os.getloadavg()[0]],
                      "notes": notes}
    table = markdown(result)
    print("\n" + table + "\n", flush=True)
    (out / "scaling.md").write_text(table + "\n")
    plot = out / "scaling.png"
    result["meta"]["plot"] = str(plot) if write_plot(result, plot) else None
    report.write_json(result, out / "scaling.json")
    print(f"results: {out / 'scaling.json'}", flush=True)
    return result


def main(argv=None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
