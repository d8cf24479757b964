"""``python -m benchmarks.first_call`` run small: one model, its table and its files."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.first_call import main  # noqa: E402


def test_one_model_is_measured_against_its_exports(tmp_path, capsys):
    assert main(["--models", "bert", "--reps", "1", "--out", str(tmp_path)]) == 0
    bert = json.loads((tmp_path / "first_call.json").read_text())["bert"]
    # ORTModule exported for the first call's shapes, then with symbolic dimensions at the
    # other shape, with the dynamo exporter (tried first), whose times are known
    assert bert["export_count"] == 2 and bert["exporter"] == "dynamo"
    for key in ("ortmodule", "other_shape", "dynamo", "dynamic", "torchscript"):
        assert bert[key] > 0, key
    assert bert["ratio"] == bert["ortmodule"] / bert["dynamo"]
    assert bert["ratio_dynamic"] == bert["other_shape"] / bert["dynamic"]
    # the second step runs the built sessions: far below the first
    assert bert["second_step"] < bert["ortmodule"] / 10
    assert "bert" in capsys.readouterr().out
    # the plot where matplotlib is installed (an extra)
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    assert (tmp_path / "first_call.png").is_file() == has_matplotlib


def test_an_unknown_model_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        main(["--models", "bert,t5", "--out", str(tmp_path)])
