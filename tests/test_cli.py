"""``python -m ortlearn``: the demo trains, compares with scikit-learn and plots."""

import subprocess
import sys

import pytest

from ortlearn.__main__ import main, run_demo


def test_demo_matches_scikit_learn(tmp_path, capsys):
    rows = run_demo(max_iter=3, plot=None, verbose=True)
    out = capsys.readouterr().out
    assert [r["title"] for r in rows] == [
        "MLP classifier, digits", "MLP regressor, make_regression 200k",
        "linear regressor (SGD), make_regression 200k"]
    assert rows[1]["n_train"] == 150_000  # large enough that the time per epoch shows
    assert all(r["ortlearn_epoch_s"] > 0 and r["sklearn_epoch_s"] > 0 for r in rows)
    # the first fit of the process and the same fit again, warm: both reported
    assert all(r["ortlearn_first_fit_s"] > 0 and r["sklearn_first_fit_s"] > 0 for r in rows)
    assert "first fit s (ort/skl)" in out and "second, identical fit" in out
    assert "s/epoch" in out
    # one line per epoch, then the table
    # scikit-learn's verbose lines: the MLP's, then SGD's
    assert out.count("Iteration 3, loss = ") == 2 and out.count("-- Epoch 3") == 1
    assert "ortlearn   sklearn" in out
    for row in rows:
        assert len(row["ortlearn_losses"]) == 3
    # the MLPs start from sklearn's weights and follow sklearn's updates
    for row in rows[:2]:
        assert row["ortlearn_score"] == pytest.approx(row["sklearn_score"], abs=1e-6)
        assert row["ortlearn_losses"] == pytest.approx(row["sklearn_losses"], rel=1e-4)
    # SGD: same objective, mini-batches instead of sklearn's per-sample steps; sklearn
    # records no loss per epoch, its final objective is plotted instead
    assert abs(rows[2]["ortlearn_score"] - rows[2]["sklearn_score"]) < 0.1
    assert rows[2]["sklearn_losses"] == [] and rows[2]["sklearn_final_loss"] > 0


def test_demo_writes_the_plot_or_says_it_was_skipped(tmp_path, capsys):
    path = tmp_path / "curves.png"
    assert main(["demo", "--max-iter", "1", "--quiet", "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "plot skipped" in out and not path.exists()
    else:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --quiet: the table and the figure's path, nothing else
    lines = out.splitlines()
    assert lines[0].startswith("job ") and set(lines[1]) == {"-"}
    assert len(lines) == 2 + 3 + 1 + 1, out
    assert "==" not in out and not any(line.strip() == "" for line in lines)


def test_help_documents_every_command():
    result = subprocess.run([sys.executable, "-m", "ortlearn", "demo", "--help"],
                            capture_output=True, text=True, check=True)
    for option in ("--device", "--max-iter", "--plot", "--no-plot", "--quiet"):
        assert option in result.stdout
