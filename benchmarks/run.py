"""Benchmark ortlearn against scikit-learn and PyTorch in one process run.

Usage::

    python -m benchmarks [--workloads W1,W3] [--reps 3] [--threads 2] [--device cpu]
                         [--scale 1.0] [--epochs N] [--batch N] [--out DIR] [--pause 0.5]
                         [--memory [W6,W7]] [--exporter auto] [--compile-backend inductor]
    python benchmarks/run.py ...        # same

Workloads (see :mod:`benchmarks.workloads` for what exactly is timed):

* W1 linear regression, make_regression(100k, 100), SGD, batch 256, 10 epochs;
* W2 MLP regressor 100-100(relu)-1, same data, Adam, batch 256, 10 epochs;
* W3 MLP classifier 64-100-10 on digits, Adam, batch 64, 50 epochs;
* W4 logistic regression, make_classification(100k, 100), L-BFGS to tol 1e-4;
* W5 tiny linear model (10 features, batch 32): microseconds per training step;
* W6 LeNet-style CNN on digits 8x8, W7 transformer encoder layer: torch modules
  trained through ``ortlearn.artifacts``/``ortlearn.api`` against torch eager,
  milliseconds per AdamW step (:mod:`benchmarks.networks`);
* W8 (W2's MLP, Adam, batch 256) and W9 (W6's CNN, AdamW, batch 64): a torch
  training step with the module wrapped in ``ortlearn.torch.ORTModule``, against
  torch eager and ``torch.compile``, milliseconds per step
  (:mod:`benchmarks.ortmodule`; ``--exporter`` is ORTModule's exporter,
  ``--compile-backend`` torch.compile's backend).
* W10-W18, scikit-learn estimator families (:mod:`benchmarks.families`): W10
  multinomial logistic regression, W11 Poisson GLM, W12 Huber, W13 Ridge (whole L-BFGS
  fits, with the objective's relative gap to scikit-learn's and the time per evaluation),
  W14 linear SVM by SGD (per sample and mini-batch), W15 Poisson MLP and W16 multilabel
  MLP (Adam, s/epoch), W17 Lasso and W18 LinearSVC (whole fits).
* W21, W7's transformer layer wrapped in ``ortlearn.torch.ORTModule`` (AdamW, batch 32),
  as W8 and W9.
* W20, a GEMM-bound MLP (W19, the Dask scale-out, runs in :mod:`benchmarks.scaleout`): MLP
  regressor 200-512-512-1 on make_regression(200k, 200), Adam, batch 512, 2 epochs:
  each contender's GFLOP/s
  (``6 * batch * sum(in * out)`` flops a step) against the float32 GEMM peak of the
  machine at the step's shapes, measured in the same run (``gemm_peak``,
  :mod:`benchmarks.gemm`).

W2, W3 and W20 also run JAX (a jitted ``lax.scan`` per epoch with ``optax.adam``,
:mod:`benchmarks.xla`; optional and detected, as torch is) from the same initial
weights and batch order as ortlearn, whose quality it must match (else it is
reported failed), and ``torch.compile`` of torch's module (``--compile-backend``);
``ortlearn_adam / jax_adam`` and ``ortlearn_adam / torch_compile_adam`` are printed
under the table.

Method: the contenders of a workload run interleaved, their order rotated every
repetition, each after a pause (so the worker threads of the previous library go
idle), after one unrecorded short warm-up run of each; the medians over ``--reps``
repetitions are reported, with the ratio of medians to the scikit-learn and the
PyTorch contender (``time / reference time``: below 1 is faster) and the median of
the ratios within each repetition ("paired", steadier when the speed of a shared
machine drifts during the run); W8, W9 and W21 also print the ratio of ORTModule to
torch.compile under the table. A contender that cannot run on the machine
(torch.compile without a C++ compiler) is reported unavailable, with the
reason, and does not fail the run. numpy/scipy
(OpenBLAS, through threadpoolctl), torch and onnxruntime all get ``--threads``
threads. Results: ``results.json``, ``results.md`` and, with matplotlib,
``results.png`` in ``--out``. PyTorch is optional: without it its contenders are
skipped with a printed note. ``--memory`` adds the peak resident memory of a W2
fit (:mod:`benchmarks.memory`, in a child process) to the results, and for W6/W7
the peak memory of training steps, ortlearn's over torch's (``step_memory``): of
every W6/W7 run, or of those listed (``--memory W6``; two fresh processes each).

On a GPU (``--device cuda``), W2 and W3 also train ortlearn's MLP on the CPU in
the same run (``ortlearn_adam_cpu``) and report the GPU's time per epoch over
the CPU's (``device_to_cpu``, printed under the table). The GPU target (W2 with batches
of 1024 at least 10 times faster per epoch on a GPU than on the CPU) is measured by
``python -m benchmarks --workloads W2 --device cuda --batch 1024 --reps 5``.
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

from benchmarks import _env, memory, networks, report, xla
from benchmarks._harness import Options, Unavailable
from benchmarks.workloads import BUILDERS


def _summary(build) -> str:
    """The first line of a workload builder's docstring, less its ``Wn:`` prefix."""
    doc = (build.__doc__ or "").strip().splitlines()
    return doc[0].split(": ", 1)[-1] if doc else ""


def parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line (``argv`` None: ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="ortlearn against scikit-learn and PyTorch, in one process run.",
        epilog="workloads:\n" + "\n".join(
            f"  {name}  {_summary(build)}" for name, build in BUILDERS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(BUILDERS),
                        help="comma-separated subset of %(default)s")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions (median)")
    parser.add_argument("--contenders", default=None,
                        help="comma-separated contender names to run (default: all of each "
                             "workload's); e.g. ortlearn_adam,ortlearn_adam_cpu")
    parser.add_argument("--device", default="cpu",
                        help="ortlearn device: cpu, cuda[:N], webgpu[:N]")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads of OpenBLAS, torch and onnxruntime")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of the data sizes (0.01 for a smoke run)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs of every epoch workload (default: W1 10, W2 10, W3 50, W5 5, "
                             "W14 3, W15 5, W16 5)")
    parser.add_argument("--batch", type=int, default=None,
                        help="rows per mini-batch of W1-W3, W14 (mini-batch run), W15, W16 "
                             "(default: W1 256, W2 256, W3 64, W14 256, W15 200, W16 200)")
    parser.add_argument("--out", default="benchmark_results", help="directory of the results")
    parser.add_argument("--pause", type=float, default=0.5,
                        help="seconds of pause before each timed run")
    parser.add_argument("--memory", nargs="?", const="all", default=None, metavar="W6,W7",
                        help="also measure the peak memory of a W2 fit (benchmarks.memory) "
                             "and of the training steps of W6/W7, of those run or of those "
                             "listed")
    parser.add_argument("--exporter", default="auto", choices=("auto", "dynamo", "torchscript"),
                        help="ORTModule's exporter in W8, W9 (default: %(default)s)")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile's backend in W8, W9 (default: %(default)s; "
                             "aot_eager compiles no C++)")
    args = parser.parse_args(argv)
    keys = [k.strip().upper() for k in args.workloads.split(",") if k.strip()]
    unknown = [k for k in keys if k not in BUILDERS]
    if unknown or not keys:
        parser.error(f"unknown workload(s) {unknown}; choose among {list(BUILDERS)}")
    args.workloads = keys
    if args.memory not in (None, "all"):
        listed = [k.strip().upper() for k in args.memory.split(",") if k.strip()]
        wrong = [k for k in listed if k not in networks.NETWORKS or k not in keys]
        if wrong or not listed:
            parser.error(f"--memory takes workloads that run among {list(networks.NETWORKS)}, "
                         f"got {args.memory!r}")
        args.memory = listed
    for name, low in (("reps", 1), ("threads", 1), ("epochs", 1), ("batch", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            parser.error(f"--{name} must be >= {low}, got {value}")
    if not 0 < args.scale <= 1:
        parser.error(f"--scale must be in (0, 1], got {args.scale}")
    if args.device != "cpu" and not args.device.startswith(("cuda", "webgpu")):
        parser.error(f"--device must be cpu, cuda[:N] or webgpu[:N], got {args.device!r}")
    return args


def _rotate(items: list, k: int) -> list:
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]


def _call(contender, seed: int, warmup: bool) -> dict:
    with warnings.catch_warnings():
        # max_iter is fixed on purpose: silence "did not converge" and the like
        warnings.simplefilter("ignore")
        return contender.run(seed, warmup)


def measure(workload, reps: int, pause: float) -> dict:
    """Warm up, then time every contender ``reps`` times, interleaved.

    A contender that raises is reported with its error and left out of the
    remaining repetitions; the others go on.
    """
    entries, alive = {}, []
    for c in workload.contenders:
        entries[c.name] = {"library": c.library, "note": c.note,
                           "unit": c.unit or workload.unit, "raw": []}
        try:
            _call(c, seed=1000, warmup=True)
            alive.append(c)
        except Unavailable as exc:
            entries[c.name]["unavailable"] = str(exc)
            print(f"  {workload.key} {c.name} unavailable: {exc}", flush=True)
        except Exception as exc:  # noqa: BLE001  a benchmark reports failures and goes on
            entries[c.name]["error"] = f"{type(exc).__name__}: {exc}"
            print(f"  {workload.key} {c.name} failed in warm-up: {entries[c.name]['error']}",
                  flush=True)
    for rep in range(reps):
        for c in _rotate(list(alive), rep):
            if "error" in entries[c.name]:
                continue
            time.sleep(pause)  # let the previous library's spinning threads go idle
            try:
                m = _call(c, seed=rep, warmup=False)
            except Exception as exc:  # noqa: BLE001
                entries[c.name]["error"] = f"{type(exc).__name__}: {exc}"
                print(f"  {workload.key} {c.name} failed: {entries[c.name]['error']}", flush=True)
                continue
            entries[c.name]["raw"].append({"rep": rep, **m})
            print(f"  {workload.key} rep {rep} {c.name:<24} {m['time']:.4g} "
                  f"{entries[c.name]['unit']}",
                  flush=True)
    for entry in entries.values():
        entry["median"] = report.summarize(entry["raw"]) if "error" not in entry else {}
    refs = {lib: entries.get(name, {}) for lib, name in (("sklearn", workload.sklearn_ref),
                                                         ("torch", workload.torch_ref))}
    for entry in entries.values():
        # a contender timed in another unit (a whole closed-form fit) gets no ratio
        same_unit = entry["unit"] == workload.unit
        time_ = entry["median"].get("time") if same_unit else None
        for lib, ref in refs.items():
            entry[f"ratio_to_{lib}"] = report.ratio(time_, ref.get("median", {}).get("time"))
            entry[f"paired_to_{lib}"] = report.paired_ratio(
                entry["raw"], ref.get("raw", [])) if same_unit and ref else None
    result = {"title": workload.title, "unit": workload.unit, "quality": workload.quality,
              "params": workload.params, "sklearn_ref": workload.sklearn_ref,
              "torch_ref": workload.torch_ref, "notes": list(workload.notes),
              "contenders": entries}
    if workload.gap and workload.sklearn_ref in entries:
        _quality_gaps(workload, entries, result)
    if workload.device_pair:
        on_device, on_cpu = (entries.get(name, {}) for name in workload.device_pair)
        result["device_to_cpu"] = {
            "ratio": report.ratio(on_device.get("median", {}).get("time"),
                                  on_cpu.get("median", {}).get("time")),
            "paired": report.paired_ratio(on_device.get("raw", []), on_cpu.get("raw", []))}
        result["notes"].append(
            f"{workload.device_pair[0]} / {workload.device_pair[1]} (time per epoch on the "
            f"device over the CPU's): {report.format_number(result['device_to_cpu']['ratio'])}"
            f" (paired {report.format_number(result['device_to_cpu']['paired'])})")
    rates = [f"{name} {entry['median']['gflops']:.3g}" for name, entry in entries.items()
             if entry.get("median", {}).get("gflops") is not None]
    if rates:
        result["notes"].append("GFLOP/s (medians): " + ", ".join(rates))
    for name, ref, rtol in workload.same_quality:
        _check_same_quality(workload, entries, result, name, ref, rtol)
    if workload.pairs:
        result["pairs"] = {}
        for name, ref in workload.pairs:
            a, b = entries.get(name, {}), entries.get(ref, {})
            pair = {"ratio": report.ratio(a.get("median", {}).get("time"),
                                          b.get("median", {}).get("time")),
                    "paired": report.paired_ratio(a.get("raw", []), b.get("raw", []))
                    if "error" not in a and "error" not in b else None}
            result["pairs"][f"{name} / {ref}"] = pair
            missing = [n for n, e in ((name, a), (ref, b))
                       if not e or "unavailable" in e or "error" in e]
            why = f" ({' and '.join(missing)} did not run to the end)" if missing else ""
            result["notes"].append(
                f"{name} / {ref}: {report.format_number(pair['ratio'])} "
                f"(paired {report.format_number(pair['paired'])}){why}")
    return result


def _check_same_quality(workload, entries: dict, result: dict, name: str, ref: str,
                        rtol: float) -> None:
    """``name`` trains the same model as ``ref`` (same weights, batches, optimizer): their
    median qualities agree within ``rtol``, else ``name`` is reported failed."""
    key = workload.quality
    ours = entries.get(name, {}).get("median", {}).get(key)
    theirs = entries.get(ref, {}).get("median", {}).get(key)
    if ours is None or theirs is None:
        return
    diff = abs(ours - theirs) / max(abs(theirs), 1e-12)
    entries[name]["quality_rel_diff"] = diff
    result["notes"].append(f"{name} {key} {ours:.5g} against {ref}'s {theirs:.5g}: relative "
                           f"difference {diff:.2g} (tolerance {rtol:g})")
    if diff > rtol:
        entries[name]["error"] = (f"{key} {ours:.5g} differs from {ref}'s {theirs:.5g} by more "
                                  f"than {rtol:g} (relative): not the same training")


def _quality_gaps(workload, entries: dict, result: dict) -> None:
    """Each contender's quality against the scikit-learn reference's (medians), as a note.

    An objective (lower is better, both minimise the same one) gets its relative gap
    ``(ours - theirs) / |theirs|``; a score its difference ``ours - theirs``.
    """
    key = workload.gap
    ref = entries[workload.sklearn_ref].get("median", {}).get(key)
    relative = key == "objective"
    for name, entry in entries.items():
        value = entry.get("median", {}).get(key)
        if name == workload.sklearn_ref or value is None or ref is None:
            continue
        diff = (value - ref) / abs(ref) if relative and ref else value - ref
        entry["objective_gap" if relative else "quality_diff"] = diff
        what = "objective relative gap" if relative else f"{key} difference"
        result["notes"].append(f"{name} {what} to {workload.sklearn_ref}: {diff:.3g}")


def _step_memory(key: str, threads: int) -> dict:
    """Peak memory of W6/W7 training steps, ortlearn's and torch's, and their ratio."""
    ours = networks.step_memory(key, "ortlearn", threads)
    theirs = networks.step_memory(key, "torch", threads)
    result = {"ortlearn_bytes": ours, "torch_bytes": theirs,
              "ratio": ours / theirs if theirs else float("nan")}
    print(f"{key} step memory: ortlearn {ours / 1e6:.1f} MB, torch {theirs / 1e6:.1f} MB",
          flush=True)
    return result


def run(args: argparse.Namespace) -> dict:
    """Run the selected workloads; write and return the result dictionary."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    notes = []
    load_start = os.getloadavg()
    torch = _env.import_torch()
    if torch is None:
        notes.append("torch is not installed: the PyTorch contenders are skipped")
        print(notes[-1], flush=True)
    jax, optax, jax_note = xla.import_jax(args.threads)
    notes.append(jax_note)
    print(notes[-1], flush=True)
    # loaded before the thread limits are applied
    import sklearn.linear_model
    import sklearn.neural_network  # noqa: F401

    with _env.thread_limits(args.threads, torch):
        threads = _env.thread_report(torch)
        print(f"threads: {args.threads} requested; in force: {threads}", flush=True)
        opts = Options(scale=args.scale, epochs=args.epochs, batch=args.batch,
                       device=args.device, torch=torch, exporter=args.exporter,
                       compile_backend=args.compile_backend, jax=jax, optax=optax,
                       torch_device=_env.torch_device(torch, args.device) if torch else "cpu")
        workloads = {}
        for key in args.workloads:
            workload = BUILDERS[key](opts)
            if args.contenders:
                wanted = set(args.contenders.split(","))
                workload.contenders = [c for c in workload.contenders if c.name in wanted]
            print(f"{key}: {workload.title} {workload.params}", flush=True)
            workloads[key] = measure(workload, args.reps, args.pause)
    if args.memory:
        measured = args.workloads if args.memory == "all" else args.memory
        for key in set(measured) & set(networks.NETWORKS):
            if torch is not None:
                workloads[key]["step_memory"] = _step_memory(key, args.threads)
        rows = max(int(round(100_000 * args.scale)), 512)
        memory_result = memory.measure(rows=rows)
        print(f"memory: a W2 fit of {rows} rows adds "
              f"{memory_result['overhead_bytes'] / 1e6:.1f} MB", flush=True)
    result = {
        "meta": {"versions": _env.versions(), "machine": _env.machine(args.device),
                 "threads": args.threads, "threads_in_force": threads, "reps": args.reps,
                 "scale": args.scale, "epochs": args.epochs, "batch": args.batch,
                 "pause_s": args.pause,
                 "torch_device": opts.torch_device if torch else None,
                 # other processes on the machine skew the timings: say how busy it was
                 "loadavg_1min_start_end": [load_start[0], os.getloadavg()[0]],
                 "argv": vars(args) | {"workloads": ",".join(args.workloads)}, "notes": notes},
        "workloads": workloads,
    }
    if args.memory:
        result["memory"] = memory_result
    table = report.markdown_table(result)
    print("\n" + table + "\n", flush=True)
    chart = out / "results.png"
    if report.write_chart(result, chart):
        result["meta"]["chart"] = str(chart)
        print(f"chart: {chart}", flush=True)
    else:
        result["meta"]["chart"] = None
        notes.append("matplotlib is not installed: the chart was skipped")
        print(notes[-1], flush=True)
    (out / "results.md").write_text(table + "\n")
    report.write_json(result, out / "results.json")
    print(f"results: {out / 'results.json'}", flush=True)
    return result


def main(argv=None) -> int:
    """Entry point of ``python -m benchmarks``; returns the exit status."""
    result = run(parse_args(argv))
    failed = [f"{k} {n}" for k, w in result["workloads"].items()
              for n, c in w["contenders"].items() if "error" in c]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
