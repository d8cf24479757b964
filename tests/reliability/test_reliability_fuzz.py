"""Property-based tests (hypothesis): gradient rules, add_loss_output, and fuzzed inputs.

Malformed bytes given as a checkpoint or as an ONNX model must give a
ValueError or TypeError, never another exception, a crash or a hang.
"""

import json
import tempfile

import numpy as np
import pytest
import safetensors.numpy
from conftest import run_onnx
from gradcheck import away, check_op, node, randn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from skl2onnx import to_onnx
from sklearn.linear_model import LinearRegression
from test_loss import linear_model

from ortlearn import CheckpointState, TrainingSession, add_loss_output
from ortlearn.artifacts import LossType, generate_artifacts
from ortlearn.autodiff import build_gradient

FUZZ = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


# --------------------------------------------------------------- gradient rules

def _broadcastable(draw, shape):
    """A shape that broadcasts with ``shape``: some dims dropped on the left or set to 1."""
    cut = draw(st.integers(0, len(shape)))
    return tuple(1 if draw(st.booleans()) else d for d in shape[cut:])


@settings(max_examples=10, deadline=None)
@given(st.data())
def test_matmul_batch_broadcast_drawn(data):
    batch = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    m, k, n = (data.draw(st.integers(1, 3)) for _ in range(3))
    reduced = _broadcastable(data.draw, batch)
    batch_a, batch_b = (batch, reduced) if data.draw(st.booleans()) else (reduced, batch)
    a, b = batch_a + (m, k), batch_b + (k, n)
    check_op([node("MatMul", ["A", "B"])], {"A": randn(*a), "B": randn(*b)}, float32=False)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2"]),
       st.lists(st.integers(1, 3), min_size=1, max_size=3), st.booleans(), st.data())
def test_reductions_drawn(op, shape, keepdims, data):
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), max_size=rank,
                              unique_by=lambda a: a % rank))
    consts = {"axes": np.array(axes, dtype=np.int64)} if axes else None
    inputs = ["A", "axes"] if axes else ["A"]
    weight = away(*shape) if op == "ReduceL2" else randn(*shape)
    check_op([node(op, inputs, keepdims=int(keepdims))], {"A": weight}, consts=consts,
             float32=False)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.data())
def test_where_and_expand_broadcast_drawn(shape, data):
    shape = tuple(shape)
    sa, sb = _broadcastable(data.draw, shape), _broadcastable(data.draw, shape)
    cond = np.random.default_rng(len(shape)).random(shape) > 0.5
    check_op([node("Where", ["C", "A", "B"], out="W"), node("Expand", ["W", "S"])],
             {"A": randn(*sa), "B": randn(*sb)},
             consts={"C": cond, "S": np.array((2,) + shape, dtype=np.int64)}, float32=False)


# ------------------------------------------------------------- add_loss_output

def _reference_loss(score, params, pred, label, weight, penalty, weights):
    diff = pred - label
    if score == "squared_error":
        elem = diff ** 2
    elif score == "absolute_error":
        elem = np.abs(diff)
    elif score == "elastic":
        elem = params["l1_weight"] * np.abs(diff) + params["l2_weight"] * diff ** 2
    else:
        eps, a = params["epsilon"], np.abs(diff)
        elem = np.where(a <= eps, 0.5 * diff ** 2, eps * (a - eps / 2))
    rows = elem.reshape(len(elem), -1).mean(axis=1)
    value = rows.mean() if weight is None else (rows * weight).sum() / weight.sum()
    for name, coefs in penalty.items():
        w = weights[name]
        value += coefs["l1"] * np.abs(w).sum() + coefs["l2"] * (w ** 2).sum()
    return value


_SCORES = st.sampled_from([
    ("squared_error", {}), ("absolute_error", {}),
    ("elastic", {"l1_weight": 0.3, "l2_weight": 0.7}), ("huber", {"epsilon": 0.5}),
])


@settings(max_examples=25, deadline=None)
@given(score=_SCORES, n_outputs=st.integers(1, 3), flat=st.booleans(), weighted=st.booleans(),
       penalty=st.dictionaries(st.sampled_from(["coef", "intercept"]),
                               st.fixed_dictionaries({"l1": st.sampled_from([0.0, 0.1]),
                                                      "l2": st.sampled_from([0.0, 0.5])})),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 100))
def test_add_loss_output_matches_numpy(score, n_outputs, flat, weighted, penalty, dtype, seed):
    score, params = score
    flat = flat and n_outputs == 1
    rng = np.random.default_rng(seed)
    coef = rng.standard_normal((3, n_outputs)).astype(dtype)
    intercept = rng.standard_normal(n_outputs).astype(dtype)
    model = add_loss_output(linear_model(coef, intercept, flat=flat), score_name=score,
                            weight_name="weight" if weighted else None,
                            penalty=penalty or None, **params)
    X = rng.standard_normal((7, 3)).astype(dtype)
    pred = X @ coef + intercept
    label = rng.standard_normal(pred.shape).astype(dtype)
    weight = rng.uniform(0.1, 2.0, 7).astype(dtype) if weighted else None
    feeds = {"X": X, "label": label.ravel() if flat else label}
    if weighted:
        feeds["weight"] = weight
    got = run_onnx(model, feeds)[0]
    assert got.shape == () and got.dtype == dtype
    expected = _reference_loss(score, params, pred.astype(np.float64), label, weight, penalty,
                               {"coef": coef, "intercept": intercept})
    np.testing.assert_allclose(got, expected, rtol=1e-5 if dtype == np.float32 else 1e-12)


# ------------------------------------------------------------------- fuzzing

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    X = np.random.RandomState(0).randn(10, 3).astype(np.float32)
    onx = to_onnx(LinearRegression().fit(X, X[:, 0]), X, black_op={"LinearRegressor"})
    directory = tmp_path_factory.mktemp("fuzz")
    generate_artifacts(onx, requires_grad=["coef", "intercept"], loss=LossType.MSELoss,
                       artifact_directory=directory)
    return {"forward": onx.SerializeToString(),
            "loss": add_loss_output(onx).SerializeToString(),
            "training": (directory / "training_model.onnx").read_bytes(),
            "checkpoint": (directory / "checkpoint").read_bytes()}


@st.composite
def _damaged(draw, data: bytes) -> bytes:
    """``data`` with a few bytes changed, and sometimes truncated."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        out = out[:draw(st.integers(0, len(out)))]
    return bytes(out)


def _only_clean_errors(function, *args):
    try:
        function(*args)
    except (ValueError, TypeError):
        pass


def _fuzz(models, key, function):
    @FUZZ
    @given(st.data())
    def run(data):
        _only_clean_errors(function, data.draw(_damaged(models[key])))

    run()


def test_fuzz_add_loss_output(models):
    _fuzz(models, "forward", add_loss_output)


def test_fuzz_build_gradient(models):
    _fuzz(models, "loss", build_gradient)


def test_fuzz_generate_artifacts(models):
    with tempfile.TemporaryDirectory() as tmp:
        _fuzz(models, "forward", lambda m: generate_artifacts(
            m, requires_grad=["coef", "intercept"], loss=LossType.MSELoss,
            artifact_directory=tmp))


def test_fuzz_training_session(models):
    state = models["checkpoint"]
    _fuzz(models, "training",
          lambda m: TrainingSession(CheckpointState.load_checkpoint(state), m).close())


def test_fuzz_checkpoint_bytes(models):
    _fuzz(models, "checkpoint", CheckpointState.load_checkpoint)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=8)


@FUZZ
@given(header=st.fixed_dictionaries(
    {}, optional={"trainable": _JSON | st.just(["w"]), "frozen": _JSON | st.just([]),
                  "tensors": _JSON | st.just({"w": {"dtype": "float32", "shape": [2],
                                                    "nominal": False}}),
                  "properties": _JSON | st.just([]), "optimizer": _JSON}),
       version=st.sampled_from(["1", "2", ""]), checksum=st.text(max_size=4))
def test_fuzz_checkpoint_header(header, version, checksum):
    """A well-formed safetensors file whose ortlearn header is nonsense."""
    metadata = {"ortlearn.checkpoint": version, "ortlearn.header": json.dumps(header),
                "ortlearn.checksum": checksum}
    data = safetensors.numpy.save({"param/w": np.ones(2, np.float32)}, metadata=metadata)
    with pytest.raises(ValueError, match="not a valid ortlearn checkpoint"):
        CheckpointState.load_checkpoint(data)


def test_valid_inputs_still_work(models):
    """The fuzzed originals themselves are accepted."""
    add_loss_output(models["forward"])
    grad = build_gradient(models["loss"])
    assert [o.name for o in grad.graph.output] == ["loss", "coef_grad", "intercept_grad"]
    state = CheckpointState.load_checkpoint(models["checkpoint"])
    TrainingSession(state, models["training"]).close()
