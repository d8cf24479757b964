"""Bad input at every public entry point gives a ValueError/TypeError naming the problem."""

import functools
import os

import numpy as np
import pytest
from families import CLASSES
from onnx import TensorProto, helper, numpy_helper

from ortlearn import (
    CheckpointState,
    OrtGradientOptimizer,
    TrainingSession,
    add_loss_output,
)
from ortlearn.__main__ import main
from ortlearn.artifacts import LossType, OptimType, generate_artifacts
from ortlearn.autodiff import build_gradient
from ortlearn.exceptions import NoGradientRuleError

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

# small and short: each case checks the input, not the training
ESTIMATORS = {name: functools.partial(cls, max_iter=2, random_state=0,
                                      **({"hidden_layer_sizes": (3,)} if "mlp" in name else {}))
              for name, cls in CLASSES.items()}
CLASSIFIERS = ("mlp_classifier", "linear_classifier")


def _data(name):
    rng = np.random.RandomState(0)
    X = rng.randn(20, 3)
    y = np.arange(20) % 2 if name in CLASSIFIERS else X @ [1.0, -2.0, 0.5]
    return X, y


def _with(array, index, value):
    array = np.array(array, dtype=np.float64)
    array[index] = value
    return array


# Each case: (data -> fit arguments, exception, message pattern).
FIT_CASES = {
    "nan_X": (lambda X, y: (_with(X, (0, 0), np.nan), y), ValueError, "NaN"),
    "inf_X": (lambda X, y: (_with(X, (1, 2), np.inf), y), ValueError, "infinity"),
    "nan_y": (lambda X, y: (X, _with(y, 3, np.nan)), ValueError, "NaN"),
    "inf_y": (lambda X, y: (X, _with(y, 3, -np.inf)), ValueError, "infinity"),
    "nan_weight": (lambda X, y: (X, y, _with(np.ones(20), 4, np.nan)), ValueError, "NaN"),
    "negative_weight": (lambda X, y: (X, y, _with(np.ones(20), 4, -1)), ValueError, "[Nn]egative"),
    "zero_weights": (lambda X, y: (X, y, np.zeros(20)), ValueError, "all zeros|non-zero"),
    "weight_length": (lambda X, y: (X, y, np.ones(19)), ValueError, "sample_weight"),
    "string_X": (lambda X, y: (np.full(X.shape, "a"), y), ValueError, "convert"),
    "complex_X": (lambda X, y: (X + 1j, y), ValueError, "[Cc]omplex"),
    "empty": (lambda X, y: (X[:0], y[:0]), ValueError, "0 sample"),
    "no_feature": (lambda X, y: (X[:, :0], y), ValueError, "0 feature"),
    "rows_mismatch": (lambda X, y: (X, y[:-1]), ValueError, "inconsistent numbers of samples"),
}


@pytest.mark.parametrize("case", sorted(FIT_CASES))
@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_estimator_fit_rejects_bad_data(name, case):
    make_args, error, match = FIT_CASES[case]
    args = make_args(*_data(name))
    with pytest.raises(error, match=match):
        ESTIMATORS[name]().fit(*args)


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_classifier_rejects_one_class(name):
    X, _ = _data(name)
    with pytest.raises(ValueError, match="only one class"):
        ESTIMATORS[name]().fit(X, np.zeros(20))
    with pytest.raises(ValueError, match="only one class"):
        ESTIMATORS[name]().fit(X[:1], [1])


@pytest.mark.parametrize("name", ["mlp_regressor", "linear_regressor"])
def test_regressor_fits_one_sample(name):
    X, y = _data(name)
    reg = ESTIMATORS[name]().fit(X[:1], y[:1])
    assert np.isfinite(reg.predict(X)).all()


@pytest.fixture(scope="module")
def fitted():
    out = {}
    for name, make in ESTIMATORS.items():
        out[name] = make().fit(*_data(name))
    return out


PREDICT_CASES = {
    "n_features": (lambda X: X[:, :2], ValueError, "3 features"),
    "nan": (lambda X: _with(X, (0, 1), np.nan), ValueError, "NaN"),
    "complex": (lambda X: X + 1j, ValueError, "[Cc]omplex"),
    "empty": (lambda X: X[:0], ValueError, "0 sample"),
    "one_dimensional": (lambda X: X[0], ValueError, "2D array"),
    "strings": (lambda X: np.full(X.shape, "a"), ValueError, "convert"),
}


@pytest.mark.parametrize("case", sorted(PREDICT_CASES))
@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_estimator_predict_rejects_bad_data(fitted, name, case):
    make_X, error, match = PREDICT_CASES[case]
    X, _ = _data(name)
    with pytest.raises(error, match=match):
        fitted[name].predict(make_X(X))


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_partial_fit_rejects_unseen_labels(fitted, name):
    X, y = _data(name)
    est = ESTIMATORS[name]().partial_fit(X, y, classes=[0, 1])
    with pytest.raises(ValueError, match=r"labels \[7\] not in classes_"):
        est.partial_fit(X, np.where(y == 0, 7, y))


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_set_state_rejects_bad_weights(fitted, name):
    est = fitted[name]
    state = est.get_state()
    first = next(iter(state))
    with pytest.raises(ValueError, match=r"unknown weights \['nope'\]"):
        est.set_state({**state, "nope": np.ones(1)})
    with pytest.raises(ValueError, match=rf"weights \['{first}'\] contain NaN"):
        est.set_state({**state, first: state[first] * np.nan})
    with pytest.raises(ValueError, match="non-numeric"):
        est.set_state({**state, first: np.full(state[first].shape, "a")})
    # nothing was changed by the refused calls
    for key, value in est.get_state().items():
        np.testing.assert_array_equal(value, state[key])


# ----------------------------------------------------------- OrtGradientOptimizer

@pytest.fixture(scope="module")
def loss_onnx(linear_onnx):
    return add_loss_output(linear_onnx, weight_name="weight")


def _ogo(loss_onnx, **kwargs):
    return OrtGradientOptimizer(loss_onnx, ["coef", "intercept"], max_iter=2, **kwargs)


OGO_FIT_CASES = {
    "nan_X": (lambda X, y: (_with(X, (0, 0), np.nan), y), ValueError, "X contains NaN"),
    "inf_y": (lambda X, y: (X, _with(y, 2, np.inf)), ValueError, "y contains NaN or inf"),
    "nan_weight": (lambda X, y: (X, y, _with(np.ones(20), 1, np.nan)), ValueError,
                   "sample_weight contains NaN"),
    "negative_weight": (lambda X, y: (X, y, -np.ones(20)), ValueError, "[Nn]egative"),
    "zero_weights": (lambda X, y: (X, y, np.zeros(20)), ValueError, "all zeros|non-zero"),
    "weight_length": (lambda X, y: (X, y, np.ones(19)), ValueError, r"shape \(20,\)"),
    "string_X": (lambda X, y: (np.full(X.shape, "a"), y), TypeError, "cannot be converted"),
    "complex_X": (lambda X, y: (X + 1j, y), TypeError, "complex"),
    "complex_y": (lambda X, y: (X, y + 1j), TypeError, "complex"),
    "empty": (lambda X, y: (X[:0], y[:0]), ValueError, "non-empty"),
    "n_features": (lambda X, y: (X[:, :2], y), ValueError, "expects 3"),
    "rows_mismatch": (lambda X, y: (X, y[:5]), ValueError, "20 rows"),
}


@pytest.mark.parametrize("case", sorted(OGO_FIT_CASES))
def test_gradient_optimizer_fit_rejects_bad_data(loss_onnx, case):
    make_args, error, match = OGO_FIT_CASES[case]
    X = np.random.RandomState(0).randn(20, 3)
    with pytest.raises(error, match=match):
        _ogo(loss_onnx).fit(*make_args(X, X[:, 0]))


def test_gradient_optimizer_rejects_bad_weights_and_models(loss_onnx, linear_onnx):
    X = np.random.RandomState(0).randn(20, 3)
    y = X[:, 0]
    with pytest.raises(ValueError, match=r"Unknown weights \['nope'\]"):
        OrtGradientOptimizer(loss_onnx, ["nope"], max_iter=1).fit(X, y)
    with pytest.raises(ValueError, match="non-empty list"):
        OrtGradientOptimizer(loss_onnx, [], max_iter=1).fit(X, y)
    with pytest.raises(ValueError, match="not a serialized ONNX model"):
        OrtGradientOptimizer(b"garbage", max_iter=1).fit(X, y)
    with pytest.raises(TypeError, match="ModelProto, bytes or a path"):
        OrtGradientOptimizer(None, max_iter=1).fit(X, y)
    with pytest.raises(ValueError, match="no output 'loss'"):
        OrtGradientOptimizer(linear_onnx, max_iter=1).fit(X, y)
    with pytest.raises(ValueError, match="'exc' parameter of OrtGradientOptimizer"):
        _ogo(loss_onnx, exc="no").fit(X, y)


def test_gradient_optimizer_predict_and_state_reject_bad_input(loss_onnx):
    X = np.random.RandomState(0).randn(20, 3)
    ogo = _ogo(loss_onnx).fit(X, X[:, 0])
    with pytest.raises(ValueError, match="2 features, the graph's input 'X' expects 3"):
        ogo.predict(X[:, :2])
    with pytest.raises(ValueError, match="non-empty 2-D"):
        ogo.predict(X[:0])
    with pytest.raises(ValueError, match="non-empty 2-D"):
        ogo.predict(X[0])
    with pytest.raises(TypeError, match="complex"):
        ogo.predict(X + 1j)
    with pytest.raises(ValueError, match="X contains NaN"):
        ogo.predict(_with(X, (0, 0), np.nan))
    state = ogo.get_state()
    with pytest.raises(ValueError, match=r"unknown weights \['nope'\]"):
        ogo.set_state({**state, "nope": 1.0})
    with pytest.raises(ValueError, match="Weight 'coef' contains NaN"):
        ogo.set_state({**state, "coef": state["coef"] * np.nan})
    with pytest.raises(ValueError, match=r"'coef' has shape \(7,\)"):
        ogo.set_state({**state, "coef": np.ones(7)})


# --------------------------------------------------------------- graph functions

def _graph(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.fixture(scope="module")
def no_weight_model():
    """A graph without any initializer: nothing to train."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 1])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])
    return _graph([helper.make_node("Identity", ["X"], ["Y"])], [x], [y])


@pytest.fixture(scope="module")
def no_rule_model():
    """A loss reached through Shrink, an operator with no gradient rule."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])
    loss = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
    w = numpy_helper.from_array(np.ones((2, 1), np.float32), "W")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["Y"]),
             helper.make_node("Shrink", ["Y"], ["Z"], name="the_shrink", lambd=0.5),
             helper.make_node("ReduceSum", ["Z"], ["loss"], keepdims=0)]
    return _graph(nodes, [x], [loss], [w])


def test_add_loss_output_rejects_bad_input(linear_onnx, loss_onnx):
    with pytest.raises(ValueError, match="not a serialized ONNX model"):
        add_loss_output(b"\x00garbage")
    with pytest.raises(TypeError, match="ModelProto, bytes or a path"):
        add_loss_output(None)
    with pytest.raises(ValueError, match="nope"):
        add_loss_output(linear_onnx, score_name="nope")
    with pytest.raises(ValueError, match="nope"):
        add_loss_output(linear_onnx, penalty={"nope": 1.0})
    with pytest.raises(ValueError, match="finite number >= 0"):
        add_loss_output(linear_onnx, penalty={"coef": -1.0})
    with pytest.raises(ValueError, match="finite number >= 0"):
        add_loss_output(linear_onnx, penalty={"coef": np.nan})
    with pytest.raises(ValueError, match="5"):
        add_loss_output(linear_onnx, output_index=5)
    with pytest.raises(ValueError, match="loss"):
        add_loss_output(loss_onnx)
    with pytest.raises(TypeError, match="foo"):
        add_loss_output(linear_onnx, foo=1)
    with pytest.raises(ValueError, match="both 'label'"):
        add_loss_output(linear_onnx, weight_name="label")


def test_build_gradient_rejects_bad_input(loss_onnx, linear_onnx, no_weight_model,
                                          no_rule_model):
    with pytest.raises(ValueError, match="'nope' in wrt"):
        build_gradient(loss_onnx, wrt=["nope"])
    with pytest.raises(TypeError, match="string 'coef'"):
        build_gradient(loss_onnx, wrt="coef")
    with pytest.raises(ValueError, match="Nothing to differentiate"):
        build_gradient(loss_onnx, wrt=[])
    with pytest.raises(ValueError, match="Nothing to differentiate"):
        build_gradient(add_loss_output(no_weight_model))
    with pytest.raises(ValueError, match="no value named 'loss'"):
        build_gradient(linear_onnx, wrt=["coef"])
    with pytest.raises(TypeError, match="shape_tensor"):
        build_gradient(loss_onnx, wrt=["shape_tensor"])
    with pytest.raises(NoGradientRuleError, match="Shrink.*the_shrink|the_shrink.*Shrink"):
        build_gradient(no_rule_model)
    with pytest.raises(ValueError, match="not a serialized ONNX model"):
        build_gradient(b"\x01\x02garbage")


def _artifacts(model, directory, **kwargs):
    kwargs.setdefault("loss", LossType.MSELoss)
    generate_artifacts(model, artifact_directory=directory, **kwargs)


def test_generate_artifacts_rejects_bad_parameters(linear_onnx, no_weight_model,
                                                   no_rule_model, tmp_path):
    with pytest.raises(ValueError, match=r"both in requires_grad and frozen_params: \['coef'\]"):
        _artifacts(linear_onnx, tmp_path, requires_grad=["coef"], frozen_params=["coef"])
    with pytest.raises(ValueError, match="nope"):
        _artifacts(linear_onnx, tmp_path, requires_grad=["nope"])
    with pytest.raises(ValueError, match="nope"):
        _artifacts(linear_onnx, tmp_path, requires_grad=["coef"], frozen_params=["nope"])
    with pytest.raises(TypeError, match="string 'coef'"):
        _artifacts(linear_onnx, tmp_path, requires_grad="coef")
    with pytest.raises(TypeError, match="shape_tensor"):
        _artifacts(linear_onnx, tmp_path, requires_grad=["shape_tensor"])
    # nothing to train is a valid training/eval pair (onnxruntime-training's requires_grad=None),
    # but not with an optimizer: it would update nothing
    with pytest.raises(ValueError, match="requires_grad=None trains nothing"):
        _artifacts(no_weight_model, tmp_path, optimizer=OptimType.SGD)
    with pytest.raises(NoGradientRuleError, match="Shrink"):
        _artifacts(no_rule_model, tmp_path, loss=None, requires_grad=["W"])
    with pytest.raises(ValueError, match="not a serialized ONNX model"):
        _artifacts(b"garbage", tmp_path)
    assert os.listdir(tmp_path) == []


def test_generate_artifacts_rejects_bad_destination(linear_onnx, tmp_path, monkeypatch):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        _artifacts(linear_onnx, a_file)
    with pytest.raises(ValueError, match="is a file, not a directory"):
        _artifacts(linear_onnx, a_file / "sub")
    with pytest.raises(ValueError, match="path separator"):
        _artifacts(linear_onnx, tmp_path, prefix="a/b_")
    with pytest.raises(TypeError, match="artifact_directory must be a path"):
        _artifacts(linear_onnx, 3)
    # root ignores permissions: simulate a read-only directory
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ValueError, match="is not writable"):
        _artifacts(linear_onnx, tmp_path / "new")
    assert sorted(os.listdir(tmp_path)) == ["a_file"]


# ------------------------------------------------------------ session, checkpoint

@pytest.fixture(scope="module")
def artifact_dir(linear_onnx, tmp_path_factory):
    directory = tmp_path_factory.mktemp("artifacts")
    _artifacts(linear_onnx, directory, requires_grad=["coef", "intercept"],
               optimizer=OptimType.SGD)
    return directory


def _session(directory, state=None, **kwargs):
    state = state or CheckpointState.load_checkpoint(directory / "checkpoint")
    return TrainingSession(state, directory / "training_model.onnx",
                           directory / "eval_model.onnx", directory / "optimizer_model.onnx",
                           **kwargs)


def test_training_session_rejects_bad_models_and_states(artifact_dir, linear_onnx):
    state = CheckpointState.load_checkpoint(artifact_dir / "checkpoint")
    with pytest.raises(ValueError, match="not a serialized ONNX model"):
        TrainingSession(state, b"garbage")
    with pytest.raises(ValueError, match="no input 'lazy_reset_grad': it is not a training"):
        TrainingSession(state, linear_onnx)
    with pytest.raises(TypeError, match="must be a CheckpointState"):
        TrainingSession({"coef": 1}, artifact_dir / "training_model.onnx")
    other = CheckpointState.from_parameters({"W": np.ones((3, 1), np.float32)})
    with pytest.raises(ValueError, match="does not match the model"):
        _session(artifact_dir, other)
    wrong_dtype = CheckpointState.from_parameters(
        {"coef": np.ones((3, 1)), "intercept": np.ones(1)})
    with pytest.raises(ValueError, match="float64"):
        _session(artifact_dir, wrong_dtype)
    with pytest.raises(ValueError, match="Unknown device 'tpu'"):
        _session(artifact_dir, device="tpu")


def test_training_session_methods_reject_bad_input(artifact_dir):
    session = _session(artifact_dir)
    X = np.ones((4, 3), np.float32)
    target = np.ones((4, 1), np.float32)
    with pytest.raises(ValueError, match="expects 2 input"):
        session.train_step(X)
    with pytest.raises(TypeError, match="must be float32, got float64"):
        session.train_step(X.astype(np.float64), target)
    for bad in (np.nan, np.inf, -0.1):
        with pytest.raises(ValueError, match="finite number >= 0"):
            session.set_learning_rate(bad)
    with pytest.raises(TypeError, match="real number"):
        session.set_learning_rate("0.1")
    with pytest.raises(ValueError, match="buffer"):
        session.from_buffer(np.ones(2, np.float32))
    with pytest.raises(KeyError, match="nope"):
        session.get_parameter("nope")


def test_checkpoint_loader_rejects_foreign_content(artifact_dir, linear_onnx):
    import safetensors.numpy

    data = (artifact_dir / "checkpoint").read_bytes()
    bad = {
        "truncated": data[:len(data) // 2],
        "empty": b"",
        "corrupt": data[:-8] + b"\xff" * 8,
        "onnx": linear_onnx.SerializeToString(),
        "foreign_safetensors": safetensors.numpy.save({"a": np.ones(2)}),
    }
    for content in bad.values():
        with pytest.raises(ValueError, match="not a valid ortlearn checkpoint"):
            CheckpointState.load_checkpoint(content)
    with pytest.raises(TypeError, match="path or bytes"):
        CheckpointState.load_checkpoint(3)


# ------------------------------------------------------------------- command line

@pytest.mark.parametrize("args, message", [
    (["demo", "--device", "tpu"], "Unknown device 'tpu'"),
    (["demo", "--plot", "/no/such/directory/x.png"], "does not exist"),
    (["demo", "--plot", "."], "is a directory"),
])
def test_command_line_rejects_bad_arguments_before_training(args, message, capsys):
    assert main(args) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args", [["demo", "--max-iter", "0"], ["bogus"],
                                  ["demo", "--max-iter", "x"]])
def test_command_line_usage_errors(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2


def test_gradient_optimizer_refuses_fractional_class_indices():
    """A cross-entropy graph reads int64 class indices: labels 0.9, 1.9, 2.9 used to be
    truncated to 0, 1, 2 and trained on silently."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    X, y = load_iris(return_X_y=True)
    onx = to_onnx(LogisticRegression(max_iter=200).fit(X, y), X.astype(np.float32),
                  black_op={"LinearClassifier"}, options={"zipmap": False})
    model = add_loss_output(onx, score_name="cross_entropy", output_index="raw_scores",
                            label_name="y")
    est = OrtGradientOptimizer(model, ["coef", "intercept"], max_iter=2)
    X = X.astype(np.float32)
    with pytest.raises(ValueError, match=r"not integers \(0\.9.*class indices"):
        est.fit(X, y + 0.9)
    est.fit(X, y.astype(np.float64))  # integral floats are class indices
    assert len(est.train_losses_) == 2


def test_a_loss_with_one_value_per_row_is_refused(loss_onnx):
    """skl2onnx declares the prediction (N, 1) with N unnamed: static checks cannot tell it
    from a scalar, and training used to descend the sum of its rows silently."""
    from ortlearn.autodiff import LOSS_ELEMENT_CHECK, build_gradient

    X = np.random.RandomState(0).randn(20, 3)
    with pytest.raises(ValueError, match=r"'variable' has 2 values for 2 rows"):
        OrtGradientOptimizer(loss_onnx, ["coef", "intercept"], max_iter=2,
                             loss_output_name="variable").fit(X, X[:, 0])
    # the gradient graph itself stops at run time rather than seed every row with 1
    grad = build_gradient(loss_onnx, wrt=["coef"], loss_output="variable")
    assert any(LOSS_ELEMENT_CHECK in n.name for n in grad.graph.node)
    import onnxruntime as ort
    session = ort.InferenceSession(grad.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"X": X.astype(np.float32), "label": X[:, :1].astype(np.float32),
             "weight": np.ones(20, np.float32)}
    feeds = {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}
    with pytest.raises(Exception, match=LOSS_ELEMENT_CHECK):
        session.run(None, feeds)
