"""``python -m benchmarks.endtoend`` run small: its three tables and its files."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.endtoend import main  # noqa: E402


def test_the_three_tables_are_measured_and_written(tmp_path, capsys):
    threads = os.environ.get("ORTLEARN_NUM_THREADS")
    assert main(["--reps", "1", "--pairs", "ridge,mlp_classifier", "--sizes", "400,800",
                 "--sparse-rows", "400", "--n-jobs", "1,2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "endtoend.json").read_text())
    assert [r["pair"] for r in result["fits"]] == ["ridge", "mlp_classifier"]
    # the MLP has no sparse row
    assert [(r["pair"], r["rows"], r["sparse"]) for r in result["rows"]] == [
        ("ridge", 400, False), ("ridge", 800, False), ("ridge", 400, True),
        ("mlp_classifier", 400, False), ("mlp_classifier", 800, False)]
    # the same minimum: exact on dense data (both solve the normal equations), to the
    # tolerance of scikit-learn's iterative sparse solver (sparse_cg, tol=1e-4) on CSR
    for r in result["rows"]:
        if r["pair"] == "ridge":
            assert abs(r["ortlearn_score"] - r["sklearn_score"]) < (1e-4 if r["sparse"] else 1e-9)
    assert [r["n_jobs"] for r in result["searches"]] == [1, 2, 1, 2]
    for row in result["fits"] + result["rows"] + result["searches"]:
        assert row["ortlearn_s"] > 0 and row["sklearn_s"] > 0
        assert row["ratio"] == row["ortlearn_s"] / row["sklearn_s"]
    fits = {r["pair"]: r for r in result["fits"]}
    assert abs(fits["ridge"]["ortlearn_score"] - fits["ridge"]["sklearn_score"]) < 1e-6
    # both searches pick the same point: the same model, the same folds
    assert [r["same_best_params"] for r in result["searches"]] == [True] * 4
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
