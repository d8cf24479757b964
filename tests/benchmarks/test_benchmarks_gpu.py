"""The GPU check script on the CPU: what a GPU machine will run, minus the GPU.

``benchmarks/gpu.py`` installs carried wheels, runs the WebGPU tests, lists the node
placements of W2's and W3's steps, times ORTModule's training step and ortlearn's epochs on
the device against the same machine's CPU. With ``--device cpu`` every part of it
runs here; one small run of W3 stands for its list of runs.
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import gpu  # noqa: E402


def test_the_gpu_check_runs_and_writes_its_eight_files(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "RUNS", [("W3", "W3", None, {})])
    assert gpu.main([str(tmp_path), "--device", "cpu", "--scale", "0.01", "--reps", "1",
                     "--threads", "1", "--timeout", "300"]) == 0
    files = {p.name for p in tmp_path.iterdir()}
    assert files == {"kernels.json", "tests.log", "placement.txt", "profile.txt",
                     "ortmodule.txt", "bench.log", "summary.json", "summary.md"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tests"] == 0, (tmp_path / "tests.log").read_text()[-2000:]
    (run,) = summary["runs"]
    assert run["status"] == 0 and run["errors"] == {}
    assert run["seconds_per_epoch"]["ortlearn_adam"] > 0
    placement = (tmp_path / "placement.txt").read_text()
    assert "W2's step" in placement and "W3's step" in placement
    assert "| W3 |" in (tmp_path / "summary.md").read_text()
    profile = (tmp_path / "profile.txt").read_text()
    assert profile.count("ms per step") == 4 and "copy to the host" in profile, profile
    # ORTModule's step: three models, each timed on the device, on the CPU and in torch
    steps = (tmp_path / "ortmodule.txt").read_text()
    lines = [line for line in steps.splitlines() if line.startswith("W")]
    assert [line.split(" ")[0] for line in lines] == ["W8", "W9", "W7"], steps
    assert all(len(line.split(": ")[1].split(", ")) == 3 for line in lines)
    assert "onnxruntime" in summary["environment"]
    # every operator on each type, and ONNX's node tests, opened on the CPU: their outputs
    # the CPU's own and the tests' own
    kernels = {r["case"]: r for r in json.loads((tmp_path / "kernels.json").read_text())}
    assert kernels["test_abs"] == {"case": "test_abs", "ops": ["Abs"], "types": ["float32"],
                                   "opset": 18, "type": "float32",
                                   "placed": "CPUExecutionProvider", "error": 0.0}
    # the type of its values, not of its condition (a constant, as the axes of an Unsqueeze)
    where = kernels["Where:int64"]
    assert (where["types"], where["type"], where["error"]) == (["int64", "int64"], "int64", 0.0)
    assert kernels["Unsqueeze:int64"]["placed"] == "CPUExecutionProvider"
    assert summary["kernels"]["placed"]["CPUExecutionProvider"] > 1500
    assert "float64" in summary["kernels"]["kernel_table"]["Mod"].split()


def test_install_refuses_an_empty_folder(tmp_path):
    with pytest.raises(SystemExit, match="no wheel"):
        gpu.install(tmp_path, tmp_path / "site")


def test_the_bench_stage_runs_the_runs_named(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "RUNS", [("W3", "W3", None, {}), ("W3 twice", "W3", None, {})])
    assert gpu.main([str(tmp_path), "--device", "cpu", "--scale", "0.01", "--reps", "1",
                     "--threads", "1", "--only", "bench", "--runs", "W3 twice"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [run["run"] for run in summary["runs"]] == ["W3 twice"]
