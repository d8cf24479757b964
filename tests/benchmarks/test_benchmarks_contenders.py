"""Benchmark pieces at tiny sizes: the JAX and torch.compile contenders of W2/W3,
the GEMM-bound W20 with its measured peak, the scaling script and the step profile.

JAX is optional (CI does not install it): its parts are skipped without it, the rest runs.
"""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

# benchmarks/ is not an installed package: import it from the checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import xla
from benchmarks.run import main

HAS_JAX = all(importlib.util.find_spec(m) is not None for m in ("jax", "optax"))
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_jax = pytest.mark.skipif(not HAS_JAX, reason="jax and optax are optional contenders")


def test_glorot_and_order_are_sklearns():
    """The JAX contender's initial weights are scikit-learn's MLP's for the same random_state
    (an epoch at a negligible rate leaves them), and its order a fresh permutation per epoch."""
    from sklearn.neural_network import MLPRegressor

    rng = np.random.RandomState(0)
    X = rng.randn(30, 4).astype(np.float32)
    y = X.sum(axis=1)
    est = MLPRegressor(hidden_layer_sizes=(5,), max_iter=1, batch_size=7, random_state=3,
                       learning_rate_init=1e-12, shuffle=True, tol=0.0, n_iter_no_change=100)
    est.fit(X, y)
    layers = xla.glorot_weights((4, 5, 1), np.random.RandomState(3), dtype=np.float64)
    for (coef, intercept), c, i in zip(layers, est.coefs_, est.intercepts_):
        np.testing.assert_allclose(coef, c, rtol=1e-6)
        np.testing.assert_allclose(intercept, i, rtol=1e-6)
    # the generator goes on shuffling each epoch's order (a permutation, new each epoch)
    orders = xla.epoch_orders(30, np.random.RandomState(3))
    first, second = next(orders), next(orders)
    assert sorted(first) == list(range(30)) and not np.array_equal(first, second)


@pytest.fixture(scope="module")
def w2_w3(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench24")
    status = main(["--scale", "0.02", "--reps", "1", "--epochs", "2", "--pause", "0",
                   "--workloads", "W2,W3", "--out", str(out), "--compile-backend", "aot_eager"])
    with open(out / "results.json") as f:
        return status, json.load(f)


def test_w2_w3_contenders(w2_w3):
    status, result = w2_w3
    assert status == 0
    names = {"ortlearn_adam", "sklearn_adam"} | (
        {"torch_adam", "torch_compile_adam"} if HAS_TORCH else set()) | (
        {"jax_adam"} if HAS_JAX else set())
    for key in ("W2", "W3"):
        wl = result["workloads"][key]
        assert set(wl["contenders"]) == names
        pairs = wl.get("pairs", {})
        assert ("ortlearn_adam / jax_adam" in pairs) == HAS_JAX
        assert ("ortlearn_adam / torch_compile_adam" in pairs) == HAS_TORCH
    notes = result["meta"]["notes"]
    assert any(n.startswith("JAX: ") for n in notes) == HAS_JAX
    assert any("not installed: the JAX contenders are skipped" in n for n in notes) != HAS_JAX


@needs_jax
def test_jax_trains_ortlearns_model(w2_w3):
    """Same weights, order and Adam: JAX's W2 mean squared error equals ortlearn's to float
    noise (2 epochs), and the quality check is recorded."""
    _, result = w2_w3
    wl = result["workloads"]["W2"]
    ours = wl["contenders"]["ortlearn_adam"]["median"]["train_mse"]
    theirs = wl["contenders"]["jax_adam"]["median"]["train_mse"]
    assert theirs == pytest.approx(ours, rel=1e-4)
    assert wl["contenders"]["jax_adam"]["quality_rel_diff"] < 1e-4
    pair = wl["pairs"]["ortlearn_adam / jax_adam"]
    assert pair["ratio"] == pytest.approx(wl["contenders"]["ortlearn_adam"]["median"]["time"]
                                          / wl["contenders"]["jax_adam"]["median"]["time"])


def test_a_different_quality_is_a_failure():
    """A contender meant to train the same model that reaches another quality fails the run."""
    from benchmarks._harness import Contender, Workload
    from benchmarks.run import measure

    w = Workload("WX", "t", "s/epoch", "train_mse", {})
    w.contenders = [Contender("a", "ortlearn", lambda s, w: {"time": 1.0, "train_mse": 1.0}),
                    Contender("b", "jax", lambda s, w: {"time": 1.0, "train_mse": 1.2})]
    w.same_quality = [("b", "a", 0.05)]
    result = measure(w, reps=1, pause=0)
    assert "differs from a's 1 by more than 0.05" in result["contenders"]["b"]["error"]
    assert result["contenders"]["b"]["quality_rel_diff"] == pytest.approx(0.2)
    assert "error" not in result["contenders"]["a"]


def test_gemm_shapes_and_flops():
    """A step's products are 3 per layer, and their flops are 6 * batch * sum(in * out)."""
    from benchmarks.gemm import gemm_shapes, step_flops

    sizes, batch = (200, 512, 512, 1), 512
    shapes = gemm_shapes(sizes, batch)
    assert len(shapes) == 9
    assert sum(2.0 * m * k * n for _, m, k, n, _, _ in shapes) == step_flops(sizes, batch)
    assert step_flops(sizes, batch) == 6 * 512 * (200 * 512 + 512 * 512 + 512)
    assert shapes[1][1:] == (200, 512, 512, True, False)  # X.T @ dZ of the first layer


def test_gemm_peak_is_a_real_speed():
    """The peak's products compute the right values (onnxruntime's Gemm against numpy) and
    give a finite speed."""
    from benchmarks.gemm import _ort_gemm, measure_peak

    session, a_shape, b_shape = _ort_gemm(6, 4, 5, True, True, 1)
    rng = np.random.default_rng(1)
    A = rng.standard_normal(a_shape, dtype=np.float32)
    B = rng.standard_normal(b_shape, dtype=np.float32)
    np.testing.assert_allclose(session.run(None, {"A": A, "B": B})[0], A.T @ B.T, rtol=1e-5)
    peak = measure_peak((8, 16, 1), 32, threads=1, target_s=0.001)
    assert len(peak["products"]) == 6 and peak["step_s"] > 0
    assert 0 < peak["gflops"] < 1e4
    for product in peak["products"]:
        assert product["numpy_gflops"] > 0 and product["onnxruntime_gflops"] > 0


def test_w19_reports_gflops_and_the_peak(tmp_path):
    status = main(["--scale", "0.011", "--reps", "1", "--epochs", "2", "--pause", "0",
                   "--workloads", "W20", "--out", str(tmp_path), "--compile-backend", "aot_eager"])
    assert status == 0
    with open(tmp_path / "results.json") as f:
        wl = json.load(f)["workloads"]["W20"]
    params = wl["params"]
    assert params["hidden_layer_sizes"] == [512, 512] and params["batch_size"] == 512
    epoch_gflop = params["gflop_per_epoch"]
    assert epoch_gflop == pytest.approx(6 * 512 * (200 * 512 + 512 * 512 + 512)
                                        * params["n_samples"] / 512 / 1e9)
    peak = wl["contenders"]["gemm_peak"]["median"]
    assert peak["time"] == pytest.approx(epoch_gflop / peak["gflops"])
    for name in ("ortlearn_adam", "sklearn_adam") + (("jax_adam",) if HAS_JAX else ()):
        med = wl["contenders"][name]["median"]
        assert med["gflops"] == pytest.approx(epoch_gflop / med["time"])
        assert wl["pairs"][f"gemm_peak / {name}"]["ratio"] == pytest.approx(
            peak["time"] / med["time"])
    assert any(n.startswith("GFLOP/s (medians): gemm_peak ") for n in wl["notes"])


def test_scaling_table_plot_and_json(tmp_path):
    """``python -m benchmarks.scaling`` at a tiny scale: every point has the medians of each
    library, ortlearn's ratios, and the table, the JSON and (with matplotlib) the plot."""
    from benchmarks.scaling import GRIDS
    from benchmarks.scaling import main as scaling_main

    assert scaling_main(["--scale", "0.01", "--axes", "rows,depth", "--reps", "1",
                         "--epochs", "1", "--target-s", "0.01", "--pause", "0",
                         "--out", str(tmp_path)]) == 0
    with open(tmp_path / "scaling.json") as f:
        result = json.load(f)
    assert list(result["axes"]) == ["rows", "depth"]
    assert [p["setting"]["depth"] for p in result["axes"]["depth"]] == GRIDS["depth"]
    assert [p["setting"]["rows"] for p in result["axes"]["rows"]] == [100, 300, 1000]
    libs = {"ortlearn", "sklearn"} | ({"jax"} if HAS_JAX else set())
    for points in result["axes"].values():
        for p in points:
            assert set(p["median_s"]) == libs and all(v > 0 for v in p["median_s"].values())
            assert p["ortlearn_to_sklearn"] == pytest.approx(p["median_s"]["ortlearn"]
                                                             / p["median_s"]["sklearn"])
            assert (p["ortlearn_to_jax"] is not None) == HAS_JAX
    meta = result["meta"]
    assert meta["base"]["rows"] == 200 and len(meta["loadavg_1min_start_end"]) == 2
    table = (tmp_path / "scaling.md").read_text()
    assert table.startswith("| axis | value | epochs |") and "| depth | 2 |" in table
    assert (meta["plot"] is not None) == (tmp_path / "scaling.png").exists()


def test_profile_of_an_ortlearn_step(tmp_path):
    """``python -m benchmarks.profile``: onnxruntime's profile of W3's fused epoch, per node
    and category (the matrix products, the flat Adam update), beside the GEMM floor."""
    from benchmarks.profile import main as profile_main

    # every node listed (--top): which nodes are the slowest depends on the CPU's kernels,
    # which nodes the step holds does not
    assert profile_main(["--workloads", "W3", "--scale", "0.05", "--reps", "1", "--epochs", "1",
                         "--top", "1000", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "profile.json") as f:
        (w3,) = json.load(f)["workloads"]
    prof = w3["profile"]
    assert w3["steps_per_epoch"] == -(-w3["rows"] // 64) and prof["steps"] == w3["steps_per_epoch"]
    cats = prof["categories_us_per_step"]
    assert cats["gemm"] > 0 and cats["elementwise"] > 0 and cats["optimizer"] > 0
    ops = {n["op"]: n["category"] for n in prof["nodes_us_per_step"]}
    assert ops.get("Sqrt") == "optimizer"  # Adam's sqrt(v), on the flat weights
    assert any(c == "gemm" for c in ops.values())
    # 64-100-10: three products a layer, 2 * 64 * (64*100 + 100*10) flops each
    assert len(w3["gemm_products"]) == 6 and w3["gemm_floor_us"] > 0
    # a node that computes nothing gives the executor's cost of a node
    assert prof["n_nodes"] >= 40 and prof["node_cost_us"] > 0
    assert w3["gap"]["dispatch_us"] == pytest.approx(prof["node_cost_us"] * prof["n_nodes"])
    split = w3["gap"]["split_us"]
    assert sum(split.values()) == pytest.approx(w3["step_us"]["ortlearn"])
    assert ("jax" in w3["step_us"]) == HAS_JAX
    assert (tmp_path / "profile.md").read_text().startswith("### W3: MLP")
