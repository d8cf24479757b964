"""``python -m benchmarks.edge``: the Node and Python step times, a table and a plot."""

from __future__ import annotations

from benchmarks import edge


def test_the_table_and_the_plot(node, js_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ORTLEARN_NUM_THREADS", "1")  # main sets it: undone after the test
    assert edge.main(["--reps", "1", "--steps", "10", "--hidden", "8",
                      "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {line[:32].strip(): float(line[32:]) for line in out.splitlines()[2:5]}
    assert set(rows) == {"Python TrainingSession", "Node (onnxruntime-node)",
                         "ratio Node / Python"}
    assert rows["Python TrainingSession"] > 0 and rows["Node (onnxruntime-node)"] > 0
    assert (tmp_path / "edge.png").read_bytes()[:4] == b"\x89PNG"
