"""Where an epoch of W2/W3/W20 goes in ortlearn: onnxruntime's profiler against JAX.

Usage::

    python -m benchmarks.profile [--workloads W2,W3] [--threads 2] [--epochs 3] [--scale 1]
                                 [--reps 5] [--out DIR] [--top 15]

For each workload, ortlearn's estimator is fitted with onnxruntime's profiler on
(``SessionOptions.enable_profiling``) on the sessions it opens (ortlearn's
``ORTLEARN_PROFILE`` set for the duration of the fit, nothing else changes); the
profile's node events (the body of the epoch's ``Loop`` included) are summed per
operator and per node, divided by the steps made, and sorted into:

* ``gemm``: ``Gemm``, ``MatMul``, ``FusedGemm``, ``FusedMatMul`` (the matrix
  products of the forward and backward passes);
* ``optimizer``: the nodes of the update (the nodes whose output holds every
  weight: the fused step flattens the gradients into one buffer (that ``Concat``
  included) and updates it with a few elementwise nodes);
* ``elementwise``: every other node of a step (activations and their
  derivatives, the loss, bias sums, the row gather, reshapes);
* ``loop/call``: the rest of the unprofiled step (the ``Loop`` operator's own
  work between body iterations, the executor, onnxruntime's run overhead, the
  engine's Python side of a call and what other processes took).

A node's cost is the median of its events times their number (a sum would charge
a descheduled thread's wait to whatever node it was in). The executor's cost of a
node is estimated by the nodes that compute nothing (``Reshape``, ``Shape``,
``Size``, ``Identity``): ``dispatch_us`` is that times the nodes of a step.

Beside it, measured in the same process with profiling off: ortlearn's and
JAX's time per step (medians of ``--reps`` interleaved runs, :mod:`benchmarks.xla`),
and the GEMM floor of a step, its products at the machine's measured float32
peak (:func:`benchmarks.gemm.measure_peak`). ``gap`` holds the split of ortlearn's
unprofiled step and its difference to JAX's. Writes ``profile.json`` and
``profile.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import glob
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from benchmarks import _env, gemm, report, xla

GEMM_OPS = {"Gemm", "MatMul", "FusedGemm", "FusedMatMul"}
#: nodes that compute nothing (a view, a shape): their time is the executor's cost of a node
NO_WORK_OPS = {"Reshape", "Shape", "Size", "Identity", "Squeeze", "Unsqueeze"}
#: workload -> (hidden, batch, classifier)
MODELS = {"W2": ((100,), 256, False), "W3": ((100,), 64, True), "W20": ((512, 512), 512, False)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="W2,W3")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5,
                        help="interleaved unprofiled runs of ortlearn and JAX (median)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of W2's and W20's rows (W3 keeps all of the digits "
                             "from 0.1 up)")
    parser.add_argument("--top", type=int, default=15, help="nodes listed per workload")
    parser.add_argument("--out", default="benchmark_results")
    args = parser.parse_args(argv)
    args.workloads = [k.strip().upper() for k in args.workloads.split(",") if k.strip()]
    unknown = sorted(set(args.workloads) - set(MODELS))
    if unknown or not args.workloads:
        parser.error(f"unknown workloads {unknown}; choose among {list(MODELS)}")
    return args


def _data(key: str, scale: float):
    """The training rows of W2/W3/W20, as :mod:`benchmarks.workloads` makes them."""
    from benchmarks._harness import Options
    from benchmarks.workloads import build_w2, build_w3

    if key == "W20":
        from sklearn.datasets import make_regression

        n = max(int(round(gemm.ROWS * scale)), 4 * gemm.BATCH)
        X, y = make_regression(n_samples=n, n_features=gemm.FEATURES, noise=1.0,
                               random_state=0)
        return X.astype(np.float32), y.astype(np.float32)
    opts = Options(scale=scale)
    if key == "W2":
        from benchmarks._harness import regression_data

        return regression_data(opts)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    del build_w2, build_w3
    digits = load_digits()
    X_all = (digits.data / 16.0).astype(np.float32)
    y_all = digits.target.astype(np.int64)
    # W3 is small: --scale shrinks it only below 0.1 (the tests' tiny runs)
    n = len(X_all) if scale >= 0.1 else max(int(round(len(X_all) * scale * 10)), 200)
    X, _, y, _ = train_test_split(X_all[:n], y_all[:n], test_size=0.25, stratify=y_all[:n],
                                  random_state=0)
    return np.ascontiguousarray(X), y


def _estimator(key: str, epochs: int, seed: int):
    from benchmarks._harness import ADAM_LR, ortlearn_estimator

    hidden, batch, classifier = MODELS[key]
    return ortlearn_estimator("OrtMLPClassifier" if classifier else "OrtMLPRegressor",
                     {"hidden_layer_sizes": hidden, "activation": "relu", "solver": "adam",
                      "batch_size": batch, "learning_rate_init": ADAM_LR, "alpha": 0.0,
                      "max_iter": epochs, "random_state": seed},
                     {"tol": 0.0, "early_stopping": False, "shuffle": True,
                      "n_iter_no_change": epochs + 1})


@contextlib.contextmanager
def profiled_sessions(prefix: str):
    """onnxruntime's profiler on for the sessions ortlearn opens in the block
    (``ORTLEARN_PROFILE``); yields a list that holds, after the block, the profiles of
    those released by then (a session writes its profile when it is released)."""
    from ortlearn.training.device import PROFILE_ENV

    paths, before = [], os.environ.get(PROFILE_ENV)
    os.environ[PROFILE_ENV] = prefix
    try:
        yield paths
    finally:
        if before is None:
            del os.environ[PROFILE_ENV]
        else:
            os.environ[PROFILE_ENV] = before
        gc.collect()
        paths.extend(p for p in sorted(glob.glob(f"{glob.escape(prefix)}_*.json"))
                     if os.path.getsize(p))


def _category(op: str, output_elements: int, n_weights: int) -> str:
    if op in GEMM_OPS:
        return "gemm"
    # the update runs on the weights flattened into one buffer (the gradients' Concat
    # included): its nodes are the ones whose output holds every weight
    if output_elements == n_weights:
        return "optimizer"
    return "elementwise"


def _elements(event) -> int:
    shapes = event.get("args", {}).get("output_type_shape") or []
    if not shapes:
        return 0
    (dims,) = shapes[0].values()
    return int(np.prod(dims)) if dims else 1


def read_profile(path: str, steps: int, n_weights: int) -> dict:
    """Per-step microseconds by operator, node and category of an onnxruntime profile.

    A node's cost per step is the *median* of its events times its events per step:
    on a shared machine a thread descheduled inside a kernel makes one event hundreds
    of times longer, which a sum would charge to that node. ``sum_us_per_step`` keeps
    the plain sums; ``run_us_per_step`` is the wall time of the session's runs.
    """
    with open(path) as f:
        events = json.load(f)
    durations, ops, cats = collections.defaultdict(list), {}, {}
    run_us = 0.0
    for e in events:
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            run_us += e["dur"]
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        op = e.get("args", {}).get("op_name", "?")
        if op in ("Loop", "If"):
            continue  # their bodies' nodes are counted themselves
        node = e["name"][:-len("_kernel_time")]
        durations[node].append(e["dur"])
        ops[node] = op
        cats[node] = _category(op, _elements(e), n_weights)
    per_node = {n: statistics.median(d) * len(d) / steps for n, d in durations.items()}
    by_op, categories = collections.Counter(), collections.Counter()
    for node, us in per_node.items():
        by_op[ops[node]] += us
        categories[cats[node]] += us
    no_work = [statistics.median(d) for n, d in durations.items()
               if ops[n] in NO_WORK_OPS and len(d) >= steps]
    return {"steps": steps, "run_us_per_step": run_us / steps,
            "n_nodes": sum(1 for d in durations.values() if len(d) >= steps),
            "node_cost_us": statistics.median(no_work) if no_work else None,
            "sum_us_per_step": sum(sum(d) for d in durations.values()) / steps,
            "median_nodes_us_per_step": sum(per_node.values()),
            "categories_us_per_step": dict(categories),
            "ops_us_per_step": dict(by_op.most_common()),
            "nodes_us_per_step": [{"node": n, "op": ops[n], "category": cats[n], "us": us}
                                  for n, us in sorted(per_node.items(), key=lambda kv: -kv[1])]}


def profile_workload(key: str, epochs: int, reps: int, threads: int, scale: float,
                     jax_modules, top: int, workdir: str) -> dict:
    """Profile ortlearn's fit of ``key``; time it against JAX (unprofiled) and the GEMM floor."""
    X, y = _data(key, scale)
    hidden, batch, classifier = MODELS[key]
    steps_per_epoch = -(-len(X) // batch)
    sizes = (X.shape[1], *hidden, int(y.max()) + 1 if classifier else 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _estimator(key, 1, 0).fit(X, y)  # warm-up
        with profiled_sessions(os.path.join(workdir, f"ort_{key}")) as paths:
            _estimator(key, epochs, 0).fit(X, y)
        # the training session is the one that ran the epochs (the others: eval)
        n_weights = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
        profiles = [read_profile(p, steps_per_epoch * epochs, n_weights) for p in paths]
        prof = max(profiles, key=lambda p: p["run_us_per_step"])
        # unprofiled: ortlearn's epoch (difference of fits) and JAX's, interleaved
        from benchmarks._harness import ortlearn_epochs

        times = {"ortlearn": [], "jax": []}
        model = None
        if jax_modules[0] is not None:
            from benchmarks._harness import ADAM_LR

            model = xla.JaxMLP(*jax_modules, X, y, hidden, batch, classifier, ADAM_LR)
            model.fit(0, 1)
        for rep in range(reps):
            out, _ = ortlearn_epochs(lambda e, rep=rep: _estimator(key, e, rep), X, y,
                                      epochs + 1, False)
            times["ortlearn"].append(out["time"] / steps_per_epoch * 1e6)
            if model is not None:
                times["jax"].append(model.fit(rep, epochs)["time"] / steps_per_epoch * 1e6)
    peak = gemm.measure_peak(sizes, batch, threads)
    step_us = {k: statistics.median(v) for k, v in times.items() if v}
    paired = [a / b for a, b in zip(times["ortlearn"], times["jax"])]
    result = {"workload": key, "rows": len(X), "batch": batch, "hidden": hidden,
              "steps_per_epoch": steps_per_epoch, "profiled_epochs": epochs,
              "step_us": step_us, "step_us_raw": times,
              "ortlearn_to_jax": statistics.median(paired) if paired else None,
              "gemm_floor_us": peak["step_s"] * 1e6, "gemm_peak_gflops": peak["gflops"],
              "gemm_products": peak["products"], "profile": {**prof, "nodes_us_per_step":
                                                             prof["nodes_us_per_step"][:top]},
              "profile_files": paths}
    result["gap"] = _gap(result)
    return result


def _gap(result: dict) -> dict | None:
    """ortlearn's unprofiled step: the nodes' (median) costs, and the rest of the step
    (``loop/call``: the Loop's iteration, the executor, onnxruntime's and the engine's call
    overhead, and what the machine's other processes took), beside JAX's step."""
    prof = result["profile"]
    ours = result["step_us"].get("ortlearn")
    if ours is None:
        return None
    split = dict(prof["categories_us_per_step"])
    split["loop/call"] = ours - sum(split.values())
    gap = {"ortlearn_step_us": ours, "split_us": split,
           # every node of a step pays the executor's cost of a node (that of a Reshape)
           "dispatch_us": (prof["node_cost_us"] or 0.0) * prof["n_nodes"],
           "gemm_over_floor_us": split.get("gemm", 0.0) - result["gemm_floor_us"]}
    if "jax" in result["step_us"]:
        gap["jax_step_us"] = result["step_us"]["jax"]
        gap["gap_us"] = ours - result["step_us"]["jax"]
        gap["jax_over_floor_us"] = result["step_us"]["jax"] - result["gemm_floor_us"]
    return gap


def markdown(results: list, meta: dict) -> str:
    fmt = report.format_number
    lines = []
    for r in results:
        gap, prof = r["gap"] or {}, r["profile"]
        lines += [f"### {r['workload']}: MLP {r['hidden']}, batch {r['batch']}, "
                  f"{r['rows']} rows ({r['steps_per_epoch']} steps an epoch)", "",
                  "| per step (µs) | ortlearn | JAX | GEMM floor |", "|---|---:|---:|---:|",
                  f"| wall, unprofiled (median of {meta['reps']}) | "
                  f"{fmt(r['step_us'].get('ortlearn'))} | {fmt(r['step_us'].get('jax'))} | "
                  f"{fmt(r['gemm_floor_us'])} |", "",
                  f"ortlearn / JAX (paired): {fmt(r['ortlearn_to_jax'])}; GEMM peak at these "
                  f"shapes {fmt(r['gemm_peak_gflops'])} GFLOP/s", "",
                  "| ortlearn's step | µs/step | share |", "|---|---:|---:|"]
        ours = gap.get("ortlearn_step_us")
        for cat in ("gemm", "elementwise", "optimizer", "loop/call"):
            us = gap.get("split_us", {}).get(cat)
            lines.append(f"| {cat} | {fmt(us)} | "
                         f"{fmt(us / ours if us is not None and ours else None, 2)} |")
        lines += ["", f"{prof['n_nodes']} nodes a step; a node that computes nothing (Reshape, "
                      f"Shape, Size, Identity) takes {fmt(prof['node_cost_us'])} µs, "
                      f"{fmt(gap.get('dispatch_us'))} µs for all the step's nodes (included "
                      "in the categories above)"]
        lines += ["", f"GEMM above the floor: {fmt(gap.get('gemm_over_floor_us'))} µs; "
                      f"ortlearn - JAX: {fmt(gap.get('gap_us'))} µs; JAX above the floor: "
                      f"{fmt(gap.get('jax_over_floor_us'))} µs; profiled run (sum of node "
                      f"events, wall of the runs): {fmt(prof['sum_us_per_step'])}, "
                      f"{fmt(prof['run_us_per_step'])} µs/step"]
        lines += ["", "| operator | µs/step |", "|---|---:|"]
        lines += [f"| {op} | {fmt(us)} |" for op, us in prof["ops_us_per_step"].items()]
        lines += ["", "| node | op | category | µs/step |", "|---|---|---|---:|"]
        lines += [f"| {n['node']} | {n['op']} | {n['category']} | {fmt(n['us'])} |"
                  for n in prof["nodes_us_per_step"]]
        lines.append("")
    load = ", ".join(f"{v:.2f}" for v in meta["loadavg_1min_start_end"])
    lines.append(f"- {meta['threads']} threads, {meta['machine']['cpu']}, "
                 f"{meta['machine']['date']}, load average (1 min) at start, end: {load}; "
                 f"{meta['jax_note']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    jax, optax, jax_note = xla.import_jax(args.threads)
    import sklearn.neural_network  # noqa: F401  loaded before the thread limits

    results = []
    workdir = tempfile.mkdtemp(prefix="ortlearn-profile-")
    with _env.thread_limits(args.threads):
        for key in args.workloads:
            start = time.perf_counter()
            results.append(profile_workload(key, args.epochs, args.reps, args.threads,
                                            args.scale, (jax, optax), args.top, workdir))
            print(f"{key} profiled in {time.perf_counter() - start:.1f} s", flush=True)
    meta = {"versions": _env.versions(), "machine": _env.machine("cpu"),
            "threads": args.threads, "reps": args.reps, "epochs": args.epochs,
            "scale": args.scale, "jax_note": jax_note,
            "loadavg_1min_start_end": [load_start[0], os.getloadavg()[0]]}
    text = markdown(results, meta)
    print("\n" + text, flush=True)
    (out / "profile.md").write_text(text + "\n")
    report.write_json({"meta": meta, "workloads": results}, out / "profile.json")
    print(f"results: {out / 'profile.json'}", flush=True)
    return {"meta": meta, "workloads": results}


def main(argv=None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
