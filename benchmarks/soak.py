"""A soak run: 1 000 fits of varying structure in one process, its resources flat.

Usage::

    python -m benchmarks.soak [--fits 1000] [--every 50] [--rows 300]
                              [--max-growth-mb 50] [--out benchmark_results]

One process runs ``--fits`` fits, cycling through :data:`STEPS`: ``OrtMLPRegressor`` and
``OrtMLPClassifier`` of varying hidden layers, ``OrtSGDRegressor``, ``OrtSGDClassifier``,
``OrtLogisticRegression``, ``OrtRidge``, two ``partial_fit`` calls, ``export_artifacts``
to a temporary directory loaded with ``ortlearn.api`` for one training and optimizer
step then closed, and ``to_onnx()`` run by an onnxruntime ``InferenceSession``; on
``--rows`` rows of 3 to 7 features (the feature count varies too), a few epochs. The
fitted estimators are dropped as a user's loop drops them.

Every ``--every`` fits (after ``gc.collect()``) it records the resident memory
(``VmRSS`` of ``/proc/self/status``), the open file descriptors
(``/proc/self/fd``) and the threads (``Threads``). The first sample is the warm-up
(every structure fitted once: lazy imports, onnxruntime's kernels, the bounded caches
of converted graphs and sessions filled); the comparison is from the second sample to
the last. Prints the samples and a summary (RSS first and last, growth in MB and per
fit, fds and threads first and last), writes ``soak.png`` (RSS and fds against fits)
and ``soak.json`` into ``--out``. Exits with 1 when the fds or the threads grow, or
the RSS grows by more than ``--max-growth-mb`` after the warm-up. Linux only.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks.report import pyplot, save_figure

#: The fits of the cycle: (kind, parameter). A cycle holds every structure once, so
#: that the first sample (``--every`` >= its length) follows a complete warm-up.
STEPS = [
    ("mlp_regressor", (8,)), ("sgd_regressor", None), ("mlp_classifier", (6,)),
    ("sgd_classifier", None), ("logistic", None), ("ridge", None),
    ("partial_fit", None), ("export_api", None), ("to_onnx", None),
    ("mlp_regressor", (16, 4)), ("mlp_classifier", (12,)), ("mlp_regressor", (4,)),
    ("mlp_classifier", (8, 8)),
]

#: Feature counts cycled (one per cycle of :data:`STEPS`: 3 cycles see them all).
FEATURES = (3, 5, 7)


def status(key: str) -> int:
    """A number of ``/proc/self/status`` (``VmRSS`` in bytes, ``Threads`` as is)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                value = int(line.split()[1])
                return value * 1024 if line.rstrip().endswith("kB") else value
    raise KeyError(key)


def sample(fits: int, seconds: float) -> dict:
    gc.collect()
    return {"fits": fits, "seconds": round(seconds, 2), "rss_mb": status("VmRSS") / 2**20,
            "fds": len(os.listdir("/proc/self/fd")), "threads": status("Threads")}


def make_data(rows: int, features: int, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, features)).astype(np.float32)
    w = rng.standard_normal(features).astype(np.float32)
    y = X @ w + 0.1 * rng.standard_normal(rows).astype(np.float32)
    labels = (y > np.median(y)).astype(np.int64) + (y > np.quantile(y, 0.8))
    return X, y, labels


def fit_one(kind: str, param, X, y, labels, seed: int) -> None:
    """One fit of the soak (its estimator and sessions are dropped on return)."""
    import ortlearn

    common = {"max_iter": 3, "tol": None, "random_state": seed}
    mlp = {"max_iter": 3, "tol": 0.0, "n_iter_no_change": 4, "batch_size": 64,
           "random_state": seed, "hidden_layer_sizes": param}
    if kind == "mlp_regressor":
        ortlearn.OrtMLPRegressor(**mlp).fit(X, y)
    elif kind == "mlp_classifier":
        ortlearn.OrtMLPClassifier(**mlp).fit(X, labels)
    elif kind == "sgd_regressor":
        ortlearn.OrtSGDRegressor(**common).fit(X, y)
    elif kind == "sgd_classifier":
        ortlearn.OrtSGDClassifier(**common).fit(X, labels)
    elif kind == "logistic":
        ortlearn.OrtLogisticRegression(max_iter=20).fit(X, labels)
    elif kind == "ridge":
        ortlearn.OrtRidge(alpha=1.0).fit(X, y)
    elif kind == "partial_fit":
        est = ortlearn.OrtSGDClassifier(random_state=seed)
        half = len(X) // 2
        est.partial_fit(X[:half], labels[:half], classes=np.unique(labels))
        est.partial_fit(X[half:], labels[half:])
    elif kind == "export_api":
        export_and_step(X, y, seed)
    elif kind == "to_onnx":
        import onnxruntime as ort

        est = ortlearn.OrtSGDRegressor(**common).fit(X, y)
        session = ort.InferenceSession(est.to_onnx().SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        session.run(None, {session.get_inputs()[0].name: X[:16]})
    else:
        raise ValueError(kind)


def export_and_step(X, y, seed: int) -> None:
    """``export_artifacts``, then ``ortlearn.api``: one step, released."""
    import ortlearn
    from ortlearn import api

    est = ortlearn.OrtMLPRegressor(hidden_layer_sizes=(8,), max_iter=1, batch_size=64,
                                   random_state=seed).fit(X, y)
    with tempfile.TemporaryDirectory() as tmp:
        est.export_artifacts(tmp)
        state = api.CheckpointState.load_checkpoint(os.path.join(tmp, "checkpoint"))
        module = api.Module(os.path.join(tmp, "training_model.onnx"), state,
                            os.path.join(tmp, "eval_model.onnx"))
        optimizer = api.Optimizer(os.path.join(tmp, "optimizer_model.onnx"), module)
        module.lazy_reset_grad()
        module(X[:32], y[:32, None])
        optimizer.step()
        module.close()


def soak(fits: int = 1000, every: int = 50, rows: int = 300, progress=None) -> list:
    """Run the fits; return the samples (a dict each, :func:`sample`)."""
    samples = []
    start = time.perf_counter()
    data = {n: make_data(rows, n, n) for n in FEATURES}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 epochs do not converge
        for index in range(fits):
            kind, param = STEPS[index % len(STEPS)]
            features = FEATURES[(index // len(STEPS)) % len(FEATURES)]
            X, y, labels = data[features]
            fit_one(kind, param, X, y, labels, seed=index)
            if (index + 1) % every == 0 or index + 1 == fits:
                samples.append(sample(index + 1, time.perf_counter() - start))
                if progress:
                    progress(samples[-1])
    return samples


def summary(samples: list, max_growth_mb: float) -> dict:
    """RSS, fds and threads at the first sample after the warm-up and at the last."""
    first = samples[1] if len(samples) > 1 else samples[0]
    last = samples[-1]
    growth = last["rss_mb"] - first["rss_mb"]
    fits = max(last["fits"] - first["fits"], 1)
    result = {"first_fits": first["fits"], "last_fits": last["fits"],
              "rss_first_mb": first["rss_mb"], "rss_last_mb": last["rss_mb"],
              "rss_growth_mb": growth, "rss_growth_kb_per_fit": growth * 1024 / fits,
              "fds_first": first["fds"], "fds_last": last["fds"],
              "threads_first": first["threads"], "threads_last": last["threads"],
              "max_growth_mb": max_growth_mb}
    problems = []
    if last["fds"] > first["fds"]:
        problems.append(f"file descriptors grew {first['fds']} -> {last['fds']}")
    if last["threads"] > first["threads"]:
        problems.append(f"threads grew {first['threads']} -> {last['threads']}")
    if growth > max_growth_mb:
        problems.append(f"RSS grew {growth:.1f} MB > {max_growth_mb:g} MB")
    result["problems"] = problems
    return result


HEADER = f"{'fits':>6}{'seconds':>9}{'RSS MB':>9}{'fds':>6}{'threads':>9}"


def row(s: dict) -> str:
    return f"{s['fits']:>6}{s['seconds']:>9.1f}{s['rss_mb']:>9.1f}{s['fds']:>6}{s['threads']:>9}"


def summary_text(result: dict) -> str:
    r = result
    lines = [f"RSS      {r['rss_first_mb']:.1f} MB at fit {r['first_fits']} (after the warm-up) "
             f"-> {r['rss_last_mb']:.1f} MB at fit {r['last_fits']}: "
             f"{r['rss_growth_mb']:+.1f} MB, {r['rss_growth_kb_per_fit']:+.2f} kB per fit "
             f"(limit {r['max_growth_mb']:g} MB)",
             f"fds      {r['fds_first']} -> {r['fds_last']}",
             f"threads  {r['threads_first']} -> {r['threads_last']}"]
    lines.append("FAIL: " + "; ".join(r["problems"]) if r["problems"] else "OK: flat")
    return "\n".join(lines)


def plot(samples: list, path: Path, max_growth_mb: float = 50) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fits = [s["fits"] for s in samples]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot(fits, [s["rss_mb"] for s in samples], "o-", color="tab:blue", label="RSS")
    ax.set_xlabel("fits")
    ax.set_ylabel("RSS (MB)", color="tab:blue")
    base = samples[1] if len(samples) > 1 else samples[0]
    ax.axvline(base["fits"], color="0.7", linestyle=":", label="after warm-up")
    # the axis spans the growth allowed: noise of a few MB looks like what it is
    rss = [s["rss_mb"] for s in samples]
    ax.set_ylim(min(rss + [base["rss_mb"] - max_growth_mb / 2]) - 1,
                max(rss + [base["rss_mb"] + max_growth_mb]) + 1)
    ax.axhline(base["rss_mb"] + max_growth_mb, color="tab:red", linewidth=0.8,
               linestyle="--", label=f"limit (+{max_growth_mb:g} MB)")
    other = ax.twinx()
    other.plot(fits, [s["fds"] for s in samples], "s--", color="tab:orange", label="fds")
    other.set_ylabel("open file descriptors", color="tab:orange")
    low = min(s["fds"] for s in samples)
    other.set_ylim(0, max(s["fds"] for s in samples) + max(5, low // 2))
    ax.set_title(f"Soak: {fits[-1]} fits in one process", fontsize=9)
    handles = ax.get_legend_handles_labels()
    more = other.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], loc="lower right", fontsize=8)
    return save_figure(fig, path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fits", type=int, default=1000)
    parser.add_argument("--every", type=int, default=50, help="fits between two samples")
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--max-growth-mb", type=float, default=50)
    parser.add_argument("--out", default="benchmark_results")
    args = parser.parse_args(argv)
    print(f"{args.fits} fits, a sample every {args.every} ({len(STEPS)} kinds of fit, "
          f"{args.rows} rows)", flush=True)
    print(HEADER, flush=True)
    samples = soak(args.fits, args.every, args.rows,
                   progress=lambda s: print(row(s), flush=True))
    result = summary(samples, args.max_growth_mb)
    print()
    print(summary_text(result))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps({"samples": samples, "summary": result},
                                              indent=1))
    if plot(samples, out / "soak.png", args.max_growth_mb):
        print(f"plot written to {out / 'soak.png'}")
    else:
        print("matplotlib is not installed: no plot")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
