"""``python -m benchmarks.fuzz``'s targets, each fuzzed in this process with the built-in
mutator for 150 seeded inputs: no finding, and every refusal of a documented class.

The script's long runs (atheris, crash and hang protection) are ``python -m
benchmarks.fuzz``; this is the short, reproducible one.
"""

import pytest

from benchmarks import fuzz
from ortlearn import exceptions

INPUTS, SEED = 150, 0

#: The classes a target may raise on bad bytes (ortlearn's own derive from them or are
#: listed): the fuzz script's definition, restated here.
DOCUMENTED = (ValueError, TypeError, exceptions.TrainingApiError,
              exceptions.NoGradientRuleError, exceptions.NominalCheckpointError,
              exceptions.ConvergenceError)

@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz_fixtures")
    fuzz.build_fixtures(directory)
    return directory


@pytest.mark.parametrize("target", list(fuzz.TARGETS))
def test_seeded_fuzz_run(target, fixtures, tmp_path):
    stats = fuzz.fuzz_in_process(target, fixtures, tmp_path, inputs=INPUTS, seed=SEED)
    assert stats["inputs"] == INPUTS
    assert stats["outcomes"].get("ok", 0) >= 1  # the valid seed is accepted
    refusals = {label for label in stats["outcomes"]
                if label != "ok" and not label.startswith("FINDING")}
    assert refusals == set(stats["types"])
    for label, cls in stats["types"].items():
        assert issubclass(cls, DOCUMENTED), label
        assert cls.__module__.split(".")[0] not in ("onnx", "onnxruntime", "google"), label
    findings = sorted(f"{f['kind']}: {f['signature']}" for f in stats["findings"])
    assert findings == [], [f["input"] for f in stats["findings"]]
