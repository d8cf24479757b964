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

_SESSION_FINDINGS = {
    # a model input of elem_type 0 (UNDEFINED): onnx's KeyError escapes the constructor
    "exception: KeyError in helper.py:tensor_dtype_to_np_dtype from layout.py:_input_dtype",
    # metadata_props names a parameter the graph has no input for
    "exception: KeyError in session.py:_check_state.<dictcomp>",
    # the graph lost an input the layout binds (coef_grad.accumulation.buffer): raw onnxruntime
    "exception: RuntimeError in onnxruntime_inference_collection.py:bind_ortvalue_input "
    "from session.py:_bind_io",
    # a graph onnxruntime opens but fails to run (a wrong rank, an output name)
    "exception: RuntimeError in onnxruntime_inference_collection.py:run_with_iobinding "
    "from session.py:train_step",
}

#: Findings of this seeded run, reported to the lead engineer and not fixed yet:
#: target -> their signatures (benchmarks/fuzz.py's). A target whose findings are all
#: known is an xfail; another finding fails.
KNOWN_FINDINGS = {
    "training_session": _SESSION_FINDINGS,
    "module_training": _SESSION_FINDINGS,
    "module_eval": {
        # the eval model's layout names a parameter it has no input for
        "exception: KeyError in session.py:_check_state",
        # the training model given as eval model: onnxruntime's RuntimeError at eval_step
        "exception: RuntimeError in onnxruntime_inference_collection.py:run_with_iobinding "
        "from session.py:eval_step",
    },
}


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
    if findings and set(findings) <= KNOWN_FINDINGS.get(target, set()):
        pytest.xfail(f"known findings of {target} (reported, not fixed): {findings}")
    assert findings == [], [f["input"] for f in stats["findings"]]
