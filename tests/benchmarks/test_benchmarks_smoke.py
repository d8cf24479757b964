"""Smoke run of the benchmark runner (tiny sizes): it runs and its JSON is complete.

Passes with or without torch and matplotlib: their contenders and the chart are
optional, and the runner says when it skipped them.
"""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

# benchmarks/ is not an installed package: import it from the checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.run import main, parse_args

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_MPL = importlib.util.find_spec("matplotlib") is not None
TIMED = {"W1": "s/epoch", "W3": "s/epoch", "W5": "us/step", "W6": "ms/step", "W7": "ms/step",
         "W8": "ms/step", "W9": "ms/step", "W21": "ms/step"}
#: W8, W9 and W21 in the smoke run: the TorchScript exporter (<1 s against 3-10 s for the dynamo
#: one) and torch.compile's aot_eager backend (no C++ compilation, ~30 s a module for inductor)
ORTMODULE_SMOKE = ["--exporter", "torchscript", "--compile-backend", "aot_eager"]


def _finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    status = main(["--scale", "0.01", "--reps", "1", "--epochs", "2", "--pause", "0",
                   "--workloads", "W1,W3,W5,W6,W7,W8,W9,W21", "--out", str(out), "--memory", "W6",
                   *ORTMODULE_SMOKE])
    with open(out / "results.json") as f:
        return status, json.load(f), out


def test_runs_every_contender(smoke):
    status, result, _ = smoke
    errors = {f"{k} {n}": c["error"] for k, w in result["workloads"].items()
              for n, c in w["contenders"].items() if "error" in c}
    assert errors == {}
    assert status == 0


def test_meta(smoke):
    _, result, out = smoke
    meta = result["meta"]
    assert meta["threads"] == 2 and meta["reps"] == 1 and meta["scale"] == 0.01
    assert meta["threads_in_force"]["onnxruntime_intra_op"] == 2
    assert meta["machine"]["device"] == "cpu" and meta["machine"]["date"]
    for name in ("ortlearn", "numpy", "scikit-learn", "onnxruntime"):
        assert meta["versions"][name]
    assert (meta["chart"] is not None) == HAS_MPL == (out / "results.png").exists()
    if not HAS_MPL:
        assert any("chart was skipped" in n for n in meta["notes"])
    if not HAS_TORCH:
        assert any("torch is not installed" in n for n in meta["notes"])
    assert (out / "results.md").read_text().startswith("| workload |")


def test_workloads_numbers(smoke):
    _, result, _ = smoke
    assert list(result["workloads"]) == ["W1", "W3", "W5", "W6", "W7", "W8", "W9", "W21"]
    for key, wl in result["workloads"].items():
        assert wl["unit"] == TIMED[key]
        names = set(wl["contenders"])
        assert {n for n in names if n.startswith(("ortlearn_", "ortmodule_"))} or (
            key in ("W8", "W9", "W21") and not HAS_TORCH), key
        assert any(n.startswith("torch_") for n in names) == HAS_TORCH
        for name, c in wl["contenders"].items():
            assert len(c["raw"]) == 1
            assert _finite(c["median"]["time"]) and c["median"]["time"] > 0, (key, name)
            if c["library"] != "onnxruntime":
                assert _finite(c["median"][wl["quality"]]), (key, name)
            ref = c["ratio_to_sklearn"] if wl["sklearn_ref"] else c["ratio_to_torch"]
            assert ref is None or _finite(ref)
        if HAS_TORCH:
            assert wl["contenders"][wl["torch_ref"]]["ratio_to_torch"] == pytest.approx(1.0)
            assert wl["contenders"][wl["torch_ref"]]["paired_to_torch"] == pytest.approx(1.0)
        if wl["sklearn_ref"]:
            assert wl["contenders"][wl["sklearn_ref"]]["ratio_to_sklearn"] == pytest.approx(1.0)
            assert wl["contenders"][wl["sklearn_ref"]]["paired_to_sklearn"] == pytest.approx(1.0)


@pytest.mark.skipif(not HAS_TORCH, reason="W8, W9 and W21 train torch modules")
def test_ortmodule_workloads(smoke):
    """W8, W9 and W21 time ORTModule, torch eager and torch.compile on the same batches from the
    same weights, and report ORTModule over torch.compile."""
    _, result, out = smoke
    table = (out / "results.md").read_text()
    for key, optimizer in (("W8", "adam"), ("W9", "adamw"), ("W21", "adamw")):
        wl = result["workloads"][key]
        ours, eager, compiled = (f"{p}_{optimizer}" for p in
                                 ("ortmodule", "torch", "torch_compile"))
        assert set(wl["contenders"]) == {ours, eager, compiled}
        assert wl["torch_ref"] == eager and wl["sklearn_ref"] is None
        assert wl["params"]["exporter"] == "torchscript"
        assert wl["params"]["compile_backend"] == "aot_eager"
        raw = wl["contenders"][ours]["raw"][0]
        # exported once, in the warm-up repetition, whose first step it timed
        assert raw["export_count"] == 1 and raw["setup_s"] > 0
        assert raw["steps"] == wl["params"]["steps"] >= 20
        assert wl["contenders"][compiled]["raw"][0]["setup_s"] > 0
        # same weights, batches and optimizer: the three train alike (W9's and W21's dropout
        # masks differ: onnxruntime draws its own)
        losses = [wl["contenders"][n]["median"]["final_loss"] for n in (ours, eager, compiled)]
        rel = 1e-3 if key == "W8" else 0.1
        assert losses[0] == pytest.approx(losses[1], rel=rel)
        assert losses[2] == pytest.approx(losses[1], rel=rel)
        pair = wl["pairs"][f"{ours} / {compiled}"]
        assert pair["ratio"] == pytest.approx(wl["contenders"][ours]["median"]["time"]
                                              / wl["contenders"][compiled]["median"]["time"])
        assert pair["paired"] == pytest.approx(pair["ratio"])  # one repetition
        assert f"{key}: {ours} / {compiled}: " in table


@pytest.mark.skipif(not HAS_TORCH, reason="W8 trains a torch module")
def test_a_contender_that_cannot_compile_is_unavailable_not_failed():
    """torch.compile that cannot compile (here: an unknown backend; on a machine without a
    C++ compiler: inductor) is reported unavailable with the reason, and the run goes on."""
    import torch

    from benchmarks._harness import Options
    from benchmarks.report import markdown_table
    from benchmarks.run import measure
    from benchmarks.workloads import BUILDERS

    workload = BUILDERS["W8"](Options(scale=0.01, torch=torch, compile_backend="no_such_backend"))
    workload.contenders = [c for c in workload.contenders
                           if c.name in ("torch_adam", "torch_compile_adam")]
    result = measure(workload, reps=1, pause=0)
    entry = result["contenders"]["torch_compile_adam"]
    assert "error" not in entry and entry["raw"] == [] and entry["median"] == {}
    assert "no_such_backend" in entry["unavailable"]
    assert entry["ratio_to_torch"] is None
    assert result["pairs"] == {"ortmodule_adam / torch_compile_adam": {"ratio": None,
                                                                       "paired": None}}
    assert result["notes"][-1] == ("ortmodule_adam / torch_compile_adam: - (paired -) "
                                   "(ortmodule_adam and torch_compile_adam did not run to the end)")
    assert result["contenders"]["torch_adam"]["median"]["time"] > 0
    table = markdown_table({"workloads": {"W8": result}})
    assert "| W8 | torch_compile_adam | unavailable |" in table
    assert "W8 torch_compile_adam unavailable: torch.compile(backend='no_such_backend')" in table


@pytest.mark.skipif(not HAS_TORCH, reason="W8 trains a torch module")
def test_profile_of_an_ortmodule_step():
    """``python -m benchmarks.ortmodule`` cuts ORTModule's and torch's steps at the same calls,
    and the onnxruntime sessions run inside ORTModule's step (no fallback to torch)."""
    import os

    import torch

    from benchmarks.ortmodule import PIECES, format_profile, profile_step
    from ortlearn.training.device import NUM_THREADS_ENV

    threads, env = torch.get_num_threads(), os.environ.get(NUM_THREADS_ENV)
    result = profile_step("W8", steps=8, blocks=2, threads=1, exporter="torchscript", top=10)
    assert (torch.get_num_threads(), os.environ.get(NUM_THREADS_ENV)) == (threads, env)
    for name in ("torch_eager", "ortmodule"):
        assert len(result["blocks_us"][name]) == 2 and result["step_us"][name] > 0
        assert list(result["pieces_us"][name]) == list(PIECES)
        assert all(v > 0 for v in result["pieces_us"][name].values())
    assert "onnxruntime_pybind11_state" in result["cprofile"]
    text = format_profile(result)
    assert text.startswith("W8 (W2's MLP through ORTModule), 1 thread(s), thread clock")
    assert "/ torch eager" in text and "optimizer step" in text


def test_network_step_memory(smoke):
    """--memory W6 measures the peak memory of W6's training steps for both libraries (two
    fresh processes), and of no other workload."""
    _, result, _ = smoke
    memory = result["workloads"]["W6"]["step_memory"]
    assert memory["ortlearn_bytes"] >= 0 and memory["torch_bytes"] > 0
    assert _finite(memory["ratio"])
    assert "step_memory" not in result["workloads"]["W7"]


def test_paired_ratio_is_the_median_of_the_ratios_of_each_repetition():
    from benchmarks.report import paired_ratio

    a = [{"rep": 0, "time": 1.0}, {"rep": 1, "time": 3.0}, {"rep": 2, "time": 2.0}]
    b = [{"rep": 0, "time": 4.0}, {"rep": 1, "time": 4.0}, {"rep": 3, "time": 1.0}]
    # reps 0 and 1 pair up (0.25 and 0.75); rep 2 and rep 3 have no partner
    assert paired_ratio(a, b) == pytest.approx(0.5)
    assert paired_ratio(a, []) is None
    assert paired_ratio(a, [{"rep": 0, "time": 0.0}]) is None


def test_a_gpu_run_reports_the_device_over_the_cpu():
    """With --device cuda, W2 and W3 train ortlearn on the CPU too, in the same run."""
    from benchmarks._harness import Contender, Options, Workload
    from benchmarks.run import measure
    from benchmarks.workloads import build_w2, build_w3

    for build in (build_w2, build_w3):
        workload = build(Options(scale=0.01, batch=1024, device="cuda"))
        assert workload.params["batch_size"] == 1024
        assert workload.device_pair == ("ortlearn_adam", "ortlearn_adam_cpu")
        assert set(workload.device_pair) <= {c.name for c in workload.contenders}
        assert build(Options(scale=0.01)).device_pair is None
    times = {"ortlearn_adam": [0.01, 0.03], "ortlearn_adam_cpu": [0.2, 0.1]}
    workload = Workload(
        "W2", "fake", "s/epoch", "q", {}, device_pair=("ortlearn_adam", "ortlearn_adam_cpu"),
        contenders=[Contender(name, "ortlearn", lambda seed, warmup, t=t: {
            "time": 1.0 if warmup else t[seed]}) for name, t in times.items()])
    result = measure(workload, reps=2, pause=0)
    # medians 0.02 and 0.15; ratios within each repetition 0.05 and 0.3
    assert result["device_to_cpu"]["ratio"] == pytest.approx(0.02 / 0.15)
    assert result["device_to_cpu"]["paired"] == pytest.approx(0.175)
    assert result["notes"] == ["ortlearn_adam / ortlearn_adam_cpu (time per epoch on the "
                               "device over the CPU's): 0.133 (paired 0.175)"]
    assert workload.notes == []


def test_ortlearn_ran_the_epochs_asked(smoke):
    _, result, _ = smoke
    for key in ("W1", "W3", "W5"):
        raw = result["workloads"][key]["contenders"][
            "ortlearn_sgd" if key != "W3" else "ortlearn_adam"]["raw"][0]
        assert raw["epochs"] == 2
        assert _finite(raw["setup_s"]) and _finite(raw["fit_1_epoch_s"])


def test_options_are_checked():
    args = parse_args(["--workloads", "w1,W4", "--threads", "3", "--batch", "1024"])
    assert args.workloads == ["W1", "W4"] and args.threads == 3 and args.reps == 3
    assert args.batch == 1024 and parse_args([]).batch is None
    args = parse_args(["--workloads", "w8,W9", "--exporter", "dynamo"])
    assert args.workloads == ["W8", "W9"] and args.exporter == "dynamo"
    assert args.compile_backend == "inductor" and parse_args([]).exporter == "auto"
    assert parse_args(["--memory"]).memory == "all" and parse_args([]).memory is None
    assert parse_args(["--workloads", "W6,W7", "--memory", "w7"]).memory == ["W7"]
    for bad in (["--workloads", "W99"], ["--scale", "0"], ["--reps", "0"],
                ["--device", "tpu"], ["--batch", "0"], ["--exporter", "jit"],
                ["--workloads", "W1,W6", "--memory", "W1"],
                ["--workloads", "W6", "--memory", "W7"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_memory_of_a_fit(smoke):
    _, result, out = smoke
    memory = result["memory"]
    assert memory["rows"] == 1000 and memory["warm"]
    assert memory["data_bytes"] == 1000 * 101 * 4
    # after the warm-up fit, only the fit's own allocations remain (a few MB at most); the
    # kernel updates the high-water mark lazily, so a fit that frees more than it takes can
    # read a little below the baseline
    assert -1e6 <= memory["overhead_bytes"] < 30e6
    assert memory["peak_rss_during_fit"] >= memory["rss_before_fit"]
    assert "memory: a W2 fit of 1000 rows" in (out / "results.md").read_text()


# ---------------------------------------------------- the scikit-learn families, W10-W18
FAMILIES = {"W10": "s/fit", "W11": "s/fit", "W12": "s/fit", "W13": "s/fit", "W14": "s/epoch",
            "W15": "s/epoch", "W16": "s/epoch", "W17": "s/fit", "W18": "s/fit"}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    out = tmp_path_factory.mktemp("families")
    status = main(["--scale", "0.01", "--reps", "1", "--epochs", "2", "--pause", "0",
                   "--workloads", ",".join(FAMILIES), "--out", str(out)])
    with open(out / "results.json") as f:
        return status, json.load(f), (out / "results.md").read_text()


def test_family_workloads_run_against_their_counterpart(families):
    status, result, table = families
    errors = {f"{k} {n}": c["error"] for k, w in result["workloads"].items()
              for n, c in w["contenders"].items() if "error" in c}
    assert errors == {} and status == 0
    assert list(result["workloads"]) == list(FAMILIES)
    for key, wl in result["workloads"].items():
        assert wl["unit"] == FAMILIES[key]
        libraries = {c["library"] for c in wl["contenders"].values()}
        assert libraries == {"ortlearn", "sklearn"}, key
        ref = wl["contenders"][wl["sklearn_ref"]]
        assert ref["library"] == "sklearn" and ref["ratio_to_sklearn"] == pytest.approx(1.0)
        for name, c in wl["contenders"].items():
            assert _finite(c["median"]["time"]) and c["median"]["time"] > 0, (key, name)
            assert _finite(c["median"][wl["quality"]]), (key, name)
            assert _finite(c["ratio_to_sklearn"]) and _finite(c["paired_to_sklearn"])
        assert f"| {key} | {wl['sklearn_ref']} |" in table


def test_full_batch_families_reach_the_counterparts_objective(families):
    """W10-W13: same objective to 1e-6 relative, and the evaluations are counted for both."""
    _, result, table = families
    for key in ("W10", "W11", "W12", "W13"):
        wl = result["workloads"][key]
        ours = wl["contenders"]["ortlearn_lbfgs"]
        assert abs(ours["objective_gap"]) < 1e-6, key
        assert f"{key}: ortlearn_lbfgs objective relative gap to {wl['sklearn_ref']}: " in table
        for name, c in wl["contenders"].items():
            med = c["median"]
            parts = med["setup_s"] + med["scipy_s"] + med["n_evals"] * med.get("eval_ms", 0) / 1e3
            assert parts == pytest.approx(med["time"], rel=1e-6), (key, name)
            if name != "sklearn_auto":  # Ridge's Cholesky makes no evaluation
                assert med["n_evals"] >= med["n_iter"] >= 1 and med["eval_ms"] > 0, (key, name)
    assert result["workloads"]["W13"]["contenders"]["sklearn_auto"]["median"]["n_evals"] == 0
    # W17 (FISTA against coordinate descent) and W18 (L-BFGS against liblinear): the same
    # objective, each stopping on its own criterion
    assert abs(result["workloads"]["W17"]["contenders"]["ortlearn_fista"]["objective_gap"]) < 1e-4
    assert abs(result["workloads"]["W18"]["contenders"]["ortlearn_lbfgs"]["objective_gap"]) < 1e-4


def test_stochastic_families_report_epochs_and_scores(families):
    """W14-W16: time per epoch over the same epochs, the score's difference under the table."""
    _, result, table = families
    w14 = result["workloads"]["W14"]["contenders"]
    assert set(w14) == {"ortlearn_sgd_per_sample", "ortlearn_sgd_batch256",
                        "sklearn_sgd_per_sample"}
    for key in ("W14", "W15", "W16"):
        wl = result["workloads"][key]
        for name, c in wl["contenders"].items():
            assert c["raw"][0]["epochs"] == 2, (key, name)
            if c["library"] == "ortlearn":
                assert _finite(c["quality_diff"])
                assert f"{key}: {name} {wl['quality']} difference to {wl['sklearn_ref']}: " \
                    in table
    # the MLPs: same initialisation and batches as scikit-learn, the same score
    assert abs(result["workloads"]["W15"]["contenders"]["ortlearn_adam"]["quality_diff"]) < 1e-3
    assert abs(result["workloads"]["W16"]["contenders"]["ortlearn_adam"]["quality_diff"]) < 0.01


def test_evaluation_counter_restores_scipy():
    import scipy.optimize

    from benchmarks.families import _count_evaluations

    original = scipy.optimize.minimize
    with _count_evaluations() as stats:
        result = scipy.optimize.minimize(lambda x: ((x - 1.0) ** 2).sum(), [0.0, 0.0],
                                         method="L-BFGS-B")
    assert scipy.optimize.minimize is original
    assert stats["n_evals"] == result.nfev and stats["minimize_s"] >= stats["eval_s"] > 0


def test_family_workloads_are_listed_and_selectable():
    from benchmarks.workloads import BUILDERS

    assert parse_args(["--workloads", "w10,W16"]).workloads == ["W10", "W16"]
    assert {"W10", "W11", "W12", "W13", "W14", "W15", "W16", "W17", "W18"} <= set(BUILDERS)
    assert BUILDERS["W13"].__doc__.startswith("W13: Ridge")
