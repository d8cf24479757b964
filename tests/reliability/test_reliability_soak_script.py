"""``python -m benchmarks.soak``, short: 40 fits in a process of its own (its RSS, fds and
threads are its own), the table of samples, the summary and the plot."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_samples_the_summary_and_the_plot(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--fits", "40", "--every", "10",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = result.stdout
    # 1: a growth (40 fits end before the caches of every structure are full: a thread
    # more at fit 31); anything else is a failure of the script
    assert result.returncode in (0, 1), result.stderr[-3000:]
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["fits", "seconds"])
    rows = [line.split() for line in lines[header + 1:header + 5]]
    assert [int(r[0]) for r in rows] == [10, 20, 30, 40]
    assert "RSS" in out and "fds" in out and "threads" in out
    report = json.loads((tmp_path / "soak.json").read_text())
    samples, summary = report["samples"], report["summary"]
    assert [s["fits"] for s in samples] == [10, 20, 30, 40]
    assert summary["fds_last"] <= summary["fds_first"], samples
    assert not any("file descriptors" in p for p in summary["problems"])
    assert (tmp_path / "soak.png").read_bytes()[:4] == b"\x89PNG"
