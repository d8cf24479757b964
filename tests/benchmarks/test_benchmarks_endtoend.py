"""``python -m benchmarks.endtoend`` run small: its three tables and its files."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.endtoend import main  # noqa: E402


def test_the_three_tables_are_measured_and_written(tmp_path, capsys):
    threads = os.environ.get("ORTLEARN_NUM_THREADS")
    assert main(["--reps", "1", "--pairs", "ridge,mlp_classifier", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "endtoend.json").read_text())
    assert [r["pair"] for r in result["fits"]] == ["ridge", "mlp_classifier"]
    for row in result["fits"] + result["searches"]:
        assert row["ortlearn_s"] > 0 and row["sklearn_s"] > 0
        assert row["ratio"] == row["ortlearn_s"] / row["sklearn_s"]
    fits = {r["pair"]: r for r in result["fits"]}
    assert abs(fits["ridge"]["ortlearn_score"] - fits["ridge"]["sklearn_score"]) < 1e-6
    # both searches pick the same point: the same model, the same folds
    assert [r["same_best_params"] for r in result["searches"]] == [True, True]
    assert [r["pair"] for r in result["cold"]] == ["ridge", "mlp_classifier"]
    # ortlearn's first fit opens its sessions; scikit-learn's, its bytecode compiled, may
    # take no longer than its second (within the noise)
    assert all(r["first_s"] > r["warm_s"] > 0 and r["sklearn_first_s"] > 0
               and r["sklearn_warm_s"] > 0 for r in result["cold"])
    assert all(r["extra_s"] == (r["first_s"] - r["warm_s"]) - (r["sklearn_first_s"]
                                                             - r["sklearn_warm_s"])
               for r in result["cold"])
    assert "largest ratio ortlearn / scikit-learn" in capsys.readouterr().out
    assert os.environ.get("ORTLEARN_NUM_THREADS") == threads  # left as it was
