"""Tests of ortlearn.loss: every loss value against numpy / sklearn.metrics."""

import dataclasses

import numpy as np
import onnx
import pytest
from conftest import run_onnx
from gradcheck import analytic_gradient, assert_close, numeric_gradient
from onnx import TensorProto, helper, numpy_helper
from scipy.special import expit, softmax
from skl2onnx import to_onnx
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.metrics import (
    hinge_loss,
    log_loss,
    mean_absolute_error,
    mean_gamma_deviance,
    mean_pinball_loss,
    mean_poisson_deviance,
    mean_squared_error,
    mean_tweedie_deviance,
)

import ortlearn.loss
from ortlearn import add_loss_output
from ortlearn.graph import DEFAULT_OPSET, GraphBuilder, make_model
from ortlearn.loss import (
    SCORE_NAMES,
    SCORES,
    Score,
    elementwise_loss,
    get_score,
    penalty_terms,
    reduce_rows,
)

DTYPES = [np.float32, np.float64]


def _rtol(dtype):
    return 1e-5 if dtype == np.float32 else 1e-12


def identity_model(dtype, shape=("N", 1), name="Y"):
    """A model whose output is its input: the prediction is what we feed."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], [name])], "identity",
        [helper.make_tensor_value_info("X", elem, list(shape))],
        [helper.make_tensor_value_info(name, elem, list(shape))],
    )
    return make_model(graph, [helper.make_opsetid("", DEFAULT_OPSET)])


def linear_model(coef, intercept, flat=False):
    """X @ coef + intercept with trainable initializers; output (N, k) or (N,)."""
    dtype = coef.dtype
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    k = coef.shape[1]
    nodes = [helper.make_node("MatMul", ["X", "coef"], ["mm"]),
             helper.make_node("Add", ["mm", "intercept"], ["scores" if flat else "Y"])]
    if flat:
        nodes.append(helper.make_node(
            "Constant", [], ["flat_shape"],
            value=numpy_helper.from_array(np.array([-1], dtype=np.int64))))
        nodes.append(helper.make_node("Reshape", ["scores", "flat_shape"], ["Y"]))
    graph = helper.make_graph(
        nodes, "linear",
        [helper.make_tensor_value_info("X", elem, ["N", coef.shape[0]])],
        [helper.make_tensor_value_info("Y", elem, ["N"] if flat else ["N", k])],
        [numpy_helper.from_array(coef, "coef"), numpy_helper.from_array(intercept, "intercept")],
    )
    return make_model(graph, [helper.make_opsetid("", DEFAULT_OPSET)])


def _loss(model, feeds):
    out = run_onnx(model, feeds)
    assert out[0].shape == ()
    return float(out[0])


@pytest.fixture(scope="module")
def diabetes():
    X, y = load_diabetes(return_X_y=True)
    return X, y


@pytest.fixture(scope="module")
def iris_logreg():
    X, y = load_iris(return_X_y=True)
    clf = LogisticRegression(max_iter=500).fit(X, y)
    return X, y, clf


# --------------------------------------------------------------------- seed

@pytest.mark.parametrize("dtype", DTYPES)
def test_seed_003_elastic_with_weights_and_penalty(diabetes, dtype):
    X, y = diabetes
    X = X.astype(dtype)
    reg = LinearRegression().fit(X, y)
    onx = to_onnx(reg, X, black_op={"LinearRegressor"})
    onx_loss = add_loss_output(onx, weight_name="weight", score_name="elastic",
                               l1_weight=0.1, l2_weight=0.9, penalty={"coef": {"l2": 0.01}})
    onnx.checker.check_model(onx_loss)
    assert [i.name for i in onx_loss.graph.input] == ["X", "label", "weight"]
    assert [o.name for o in onx_loss.graph.output] == ["loss", "variable"]
    # No initializer added: constants are nodes.
    assert ({i.name for i in onx_loss.graph.initializer}
            == {i.name for i in onx.graph.initializer})

    rng = np.random.default_rng(0)
    w = rng.uniform(0.5, 2, size=len(y)).astype(dtype)
    label = (y + rng.normal(size=len(y)) * 10).astype(dtype).reshape(-1, 1)
    loss, pred = run_onnx(onx_loss, {"X": X, "label": label, "weight": w})
    np.testing.assert_allclose(pred, reg.predict(X).reshape(-1, 1), rtol=1e-4)

    d = (label - pred).ravel().astype(np.float64)
    expected = (np.sum(w * (0.1 * np.abs(d) + 0.9 * d ** 2)) / np.sum(w)
                + 0.01 * np.sum(reg.coef_.astype(dtype).astype(np.float64) ** 2))
    assert loss.dtype == dtype
    np.testing.assert_allclose(loss, expected, rtol=_rtol(dtype) * 10)


# ---------------------------------------------------- regression scores

def _huber(d, eps):
    a = np.abs(d)
    return np.where(a <= eps, 0.5 * d ** 2, eps * (a - eps / 2))


def _reference(score, y, p, w, **kw):
    """Reference loss from sklearn.metrics or numpy."""
    if score in ("squared_error", "l2"):
        return mean_squared_error(y, p, sample_weight=w)
    if score in ("absolute_error", "l1"):
        return mean_absolute_error(y, p, sample_weight=w)
    d = y - p
    if score == "elastic":
        elem = kw.get("l1_weight", 0.5) * np.abs(d) + kw.get("l2_weight", 0.5) * d ** 2
    else:
        elem = _huber(d, kw.get("epsilon", 1.0))
    return np.average(elem.mean(axis=1), weights=w)


REGRESSION_CASES = [
    ("squared_error", {}), ("l2", {}), ("absolute_error", {}), ("l1", {}),
    ("elastic", {}), ("elastic", {"l1_weight": 0.3, "l2_weight": 2.0}),
    ("huber", {}), ("huber", {"epsilon": 0.25}),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("n_outputs", [1, 3])
@pytest.mark.parametrize("score,kw", REGRESSION_CASES)
def test_regression_scores(score, kw, n_outputs, weighted, dtype):
    rng = np.random.default_rng(1)
    n = 57
    p = rng.normal(size=(n, n_outputs)).astype(dtype)
    y = (p + rng.normal(scale=1.5, size=(n, n_outputs))).astype(dtype)
    w = rng.uniform(0, 3, size=n).astype(dtype) if weighted else None
    model = add_loss_output(identity_model(dtype, ("N", n_outputs)), score_name=score,
                            weight_name="w" if weighted else None, **kw)
    feeds = {"X": p, "label": y}
    if weighted:
        feeds["w"] = w
    p64, y64 = p.astype(np.float64), y.astype(np.float64)
    w64 = None if w is None else w.astype(np.float64)
    expected = _reference(score, y64, p64, w64, **kw)
    np.testing.assert_allclose(_loss(model, feeds), expected, rtol=_rtol(dtype) * 10)


def test_huber_closed_form_both_branches():
    eps = 0.5
    p = np.zeros((4, 1))
    y = np.array([[0.2], [-0.5], [2.0], [-3.0]])
    model = add_loss_output(identity_model(np.float64), score_name="huber", epsilon=eps)
    expected = np.mean([0.5 * 0.04, 0.5 * 0.25, 0.5 * (2.0 - 0.25), 0.5 * (3.0 - 0.25)])
    assert _loss(model, {"X": p, "label": y}) == pytest.approx(expected, rel=1e-14)


def test_regression_on_diabetes_matches_sklearn(diabetes):
    X, y = diabetes
    reg = LinearRegression().fit(X[:300], y[:300])
    model = add_loss_output(to_onnx(reg, X, black_op={"LinearRegressor"}))
    loss = _loss(model, {"X": X, "label": y.reshape(-1, 1)})
    assert loss == pytest.approx(mean_squared_error(y, reg.predict(X)), rel=1e-10)


# ------------------------------------------------------------ log losses

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("flat", [False, True])
def test_binary_log_loss_breast_cancer(dtype, weighted, flat):
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    clf = LogisticRegression(max_iter=200).fit(X, y)
    model = add_loss_output(
        linear_model(clf.coef_.T.astype(dtype), clf.intercept_.astype(dtype), flat=flat),
        score_name="log", weight_name="sw" if weighted else None)
    w = np.random.default_rng(2).uniform(0.1, 2, size=len(y)) if weighted else None
    label = y.astype(dtype) if flat else y.astype(dtype).reshape(-1, 1)
    feeds = {"X": X.astype(dtype), "label": label}
    if weighted:
        feeds["sw"] = w.astype(dtype)
    scores = X @ clf.coef_.ravel() + clf.intercept_[0]
    expected = log_loss(y, expit(scores), sample_weight=w)
    np.testing.assert_allclose(_loss(model, feeds), expected, rtol=1e-4 if dtype == np.float32
                               else 1e-9)


@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_log_loss_extreme_logits(dtype):
    s = np.array([[1000.0], [-1000.0], [1000.0], [-1000.0], [0.0]], dtype=dtype)
    y = np.array([[1.0], [0.0], [0.0], [1.0], [1.0]], dtype=dtype)
    model = add_loss_output(identity_model(dtype), score_name="log")
    loss = _loss(model, {"X": s, "label": y})
    assert np.isfinite(loss)
    # Right side: log(1 + e^-1000) ~ 0; wrong side: 1000; zero logit: log 2.
    assert loss == pytest.approx((0 + 0 + 1000 + 1000 + np.log(2)) / 5, rel=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_iris_raw_scores(iris_logreg, dtype, weighted):
    X, y, clf = iris_logreg
    onx = to_onnx(clf, X.astype(dtype), black_op={"LinearClassifier"},
                  options={"zipmap": False})
    # 'raw_scores' is an intermediate value (the Softmax input), selected by name;
    # the graph already has an output named 'label'.
    model = add_loss_output(onx, score_name="cross_entropy", output_index="raw_scores",
                            label_name="y", weight_name="sw" if weighted else None)
    assert [o.name for o in model.graph.output] == ["loss", "label", "probabilities"]
    w = np.random.default_rng(3).uniform(0.1, 2, size=len(y)) if weighted else None
    feeds = {"X": X.astype(dtype), "y": y}
    if weighted:
        feeds["sw"] = w.astype(dtype)
    loss, labels, proba = run_onnx(model, feeds)
    np.testing.assert_array_equal(labels, clf.predict(X))
    expected = log_loss(y, clf.predict_proba(X), sample_weight=w)
    np.testing.assert_allclose(loss, expected, rtol=1e-5 if dtype == np.float32 else 1e-9)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_extreme_logits(dtype):
    s = np.array([[1000.0, -1000.0, 0.0], [1000.0, -1000.0, 0.0], [0.0, 0.0, 0.0]], dtype=dtype)
    y = np.array([0, 1, 2], dtype=np.int64)
    model = add_loss_output(identity_model(dtype, ("N", 3)), score_name="cross_entropy")
    loss = _loss(model, {"X": s, "label": y})
    assert np.isfinite(loss)
    assert loss == pytest.approx((0.0 + 2000.0 + np.log(3)) / 3, rel=1e-6)


def test_cross_entropy_label_out_of_range_fails():
    model = add_loss_output(identity_model(np.float64, ("N", 3)), score_name="cross_entropy")
    with pytest.raises(Exception, match="GatherElements"):
        run_onnx(model, {"X": np.zeros((2, 3)), "label": np.array([0, 3])})


def test_cross_entropy_matches_sklearn_on_random_logits():
    rng = np.random.default_rng(4)
    s = rng.normal(scale=3, size=(100, 5))
    y = rng.integers(0, 5, size=100)
    w = rng.uniform(0, 1, size=100)
    model = add_loss_output(identity_model(np.float64, ("N", 5)), score_name="cross_entropy",
                            weight_name="w")
    loss = _loss(model, {"X": s, "label": y, "w": w})
    expected = log_loss(y, softmax(s, axis=1), sample_weight=w, labels=range(5))
    assert loss == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("label_shape", [("N",), ("N", 1)])
def test_reusable_pieces_cross_entropy_label_shapes(label_shape):
    """elementwise_loss + reduce_rows in another graph, labels (n,) or (n, 1)."""
    builder = GraphBuilder(opset=DEFAULT_OPSET)
    per_elem = elementwise_loss(builder, "cross_entropy", "S", "L", np.float64)
    reduce_rows(builder, per_elem, output="out")
    graph = helper.make_graph(
        builder.nodes, "pieces",
        [helper.make_tensor_value_info("S", TensorProto.DOUBLE, ["N", 4]),
         helper.make_tensor_value_info("L", TensorProto.INT64, list(label_shape))],
        [helper.make_tensor_value_info("out", TensorProto.DOUBLE, [])])
    model = make_model(graph, [helper.make_opsetid("", DEFAULT_OPSET)])
    rng = np.random.default_rng(6)
    s = rng.normal(size=(20, 4))
    y = rng.integers(0, 4, size=20)
    (loss,) = run_onnx(model, {"S": s, "L": y.reshape(-1, *label_shape[1:])})
    assert loss == pytest.approx(log_loss(y, softmax(s, axis=1), labels=range(4)), rel=1e-10)


def test_penalty_terms_cast_to_loss_dtype():
    """A float32 weight penalised in a float64 loss (e.g. a per-batch penalty graph)."""
    builder = GraphBuilder(opset=DEFAULT_OPSET)
    penalty_terms(builder, {"W": {"l1": 0.5, "l2": 0.25}}, {"W": TensorProto.FLOAT},
                  np.float64)
    builder.op("Identity", [builder.nodes[-1].output[0]], outputs=["out"])
    graph = helper.make_graph(
        builder.nodes, "pen", [helper.make_tensor_value_info("W", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("out", TensorProto.DOUBLE, [])])
    model = make_model(graph, [helper.make_opsetid("", DEFAULT_OPSET)])
    w = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    (out,) = run_onnx(model, {"W": w})
    assert out.dtype == np.float64
    assert out == pytest.approx(0.5 * 3.5 + 0.25 * 5.25, rel=1e-7)


# ------------------------------------------------------------- penalties

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("penalty,l1,l2,l1_b,l2_b", [
    ({"coef": {"l1": 0.3, "l2": 0.2}}, 0.3, 0.2, 0.0, 0.0),
    ({"coef": 0.5}, 0.0, 0.5, 0.0, 0.0),
    ({"coef": {"l1": 0.1}, "intercept": {"l2": 2.0, "l1": 0.7}}, 0.1, 0.0, 0.7, 2.0),
    ({"coef": {"l1": 0.0, "l2": 0.0}}, 0.0, 0.0, 0.0, 0.0),
])
def test_penalties(dtype, penalty, l1, l2, l1_b, l2_b):
    rng = np.random.default_rng(5)
    coef = rng.normal(size=(4, 2)).astype(dtype)
    intercept = rng.normal(size=2).astype(dtype)
    X = rng.normal(size=(30, 4)).astype(dtype)
    y = rng.normal(size=(30, 2)).astype(dtype)
    model = add_loss_output(linear_model(coef, intercept), penalty=penalty)
    assert {i.name for i in model.graph.initializer} == {"coef", "intercept"}
    pred = X.astype(np.float64) @ coef + intercept
    c, b = coef.astype(np.float64), intercept.astype(np.float64)
    expected = (mean_squared_error(y, pred) + l1 * np.abs(c).sum() + l2 * (c ** 2).sum()
                + l1_b * np.abs(b).sum() + l2_b * (b ** 2).sum())
    np.testing.assert_allclose(_loss(model, {"X": X, "label": y}), expected,
                               rtol=_rtol(dtype) * 10)


# ----------------------------------------------------------- output_index

def _two_output_model():
    """Outputs: 'cls' (int64), 'half' = X / 2 and 'double' = 2 X."""
    nodes = [
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0))),
        helper.make_node("ArgMax", ["X"], ["cls"], axis=1),
        helper.make_node("Div", ["X", "two"], ["half"]),
        helper.make_node("Mul", ["X", "two"], ["double"]),
    ]
    graph = helper.make_graph(
        nodes, "multi", [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 1])],
        [helper.make_tensor_value_info("cls", TensorProto.INT64, ["N", 1]),
         helper.make_tensor_value_info("half", TensorProto.DOUBLE, ["N", 1]),
         helper.make_tensor_value_info("double", TensorProto.DOUBLE, ["N", 1])])
    return make_model(graph, [helper.make_opsetid("", DEFAULT_OPSET)])


@pytest.mark.parametrize("output_index,factor", [(1, 0.5), ("half", 0.5), (2, 2.0),
                                                 ("double", 2.0), (-1, 2.0)])
def test_output_index(output_index, factor):
    x = np.arange(6, dtype=np.float64).reshape(-1, 1)
    y = np.ones((6, 1))
    model = add_loss_output(_two_output_model(), output_index=output_index,
                            label_name="target")
    out = run_onnx(model, {"X": x, "target": y})
    assert [o.name for o in model.graph.output] == ["loss", "cls", "half", "double"]
    assert out[0] == pytest.approx(mean_squared_error(y, factor * x), rel=1e-14)
    np.testing.assert_array_equal(out[2], x / 2)


def test_default_output_of_wrong_type_asks_for_output_index():
    with pytest.raises(TypeError, match=r"output_index.*'half'"):
        add_loss_output(_two_output_model(), label_name="target")


def test_classifier_label_output_is_rejected(iris_logreg):
    X, y, clf = iris_logreg
    onx = to_onnx(clf, X, black_op={"LinearClassifier"}, options={"zipmap": False})
    with pytest.raises(TypeError, match="INT64.*output_index.*probabilities"):
        add_loss_output(onx, score_name="cross_entropy", label_name="y")
    with pytest.raises(ValueError, match="label_name='label' is already a name"):
        add_loss_output(onx, score_name="cross_entropy", output_index="raw_scores")


# ----------------------------------------------------------------- errors

def test_unknown_score_name_lists_valid_ones():
    with pytest.raises(ValueError, match="'svm'.*squared_error.*cross_entropy.*tweedie"):
        add_loss_output(identity_model(np.float64), score_name="svm")


@pytest.mark.parametrize("score,kw,exc,match", [
    ("squared_error", {"epsilon": 1.0}, TypeError, "epsilon.*takes no keyword"),
    ("elastic", {"alpha": 1.0}, TypeError, "alpha.*l1_weight, l2_weight"),
    ("huber", {"epsilon": 0.0}, ValueError, "epsilon must be > 0"),
    ("elastic", {"l1_weight": -1.0}, ValueError, "l1_weight must be a finite number"),
])
def test_bad_score_kwargs(score, kw, exc, match):
    with pytest.raises(exc, match=match):
        add_loss_output(identity_model(np.float64), score_name=score, **kw)


# ------------------------------------------------------------ the table

def _prediction_model(score: Score, dtype=np.float64):
    """An identity model whose output suits ``score`` (logits (N, 3) for class labels)."""
    return identity_model(dtype, ("N", 3) if score.class_labels else ("N", 1))


def test_score_names_are_the_table():
    assert SCORE_NAMES == tuple(name for score in SCORES.values() for name in score.names)
    assert len(set(SCORE_NAMES)) == len(SCORE_NAMES)
    assert set(SCORES) == {"squared_error", "absolute_error", "elastic", "huber", "log",
                           "cross_entropy", "hinge", "squared_hinge", "modified_huber",
                           "perceptron", "epsilon_insensitive", "squared_epsilon_insensitive",
                           "pinball", "poisson", "gamma", "tweedie"}
    with pytest.raises(TypeError):
        SCORES["mine"] = SCORES["huber"]  # read only
    with pytest.raises(dataclasses.FrozenInstanceError):
        SCORES["huber"].name = "mine"
    with pytest.raises(TypeError):
        SCORES["huber"].params["epsilon"] = 2.0


@pytest.mark.parametrize("name", list(SCORES))
def test_table_entry_is_consistent(name):
    """Key, aliases, parameters and errors of each entry, through every public door."""
    score = SCORES[name]
    assert score.name == name and callable(score.emit)
    for alias in score.names:
        assert get_score(alias) is score
    assert score.resolve_params() == dict(score.params)
    assert set(score.positive) <= set(score.params)
    # every parameter is accepted by add_loss_output, its default gives the same graph
    model = _prediction_model(score)
    default = add_loss_output(model, score_name=name)
    for alias in score.aliases:
        assert add_loss_output(model, score_name=alias) == default
    if score.params:
        assert add_loss_output(model, score_name=name, **score.params) == default
        for key, value in score.params.items():
            changed = add_loss_output(model, score_name=name, **{key: value + 0.25})
            assert changed != default
    # the emitted loss is the one add_loss_output reduces
    builder = GraphBuilder(opset=DEFAULT_OPSET)
    elementwise_loss(builder, name, "P", "L", np.float64, **score.params)
    expected = GraphBuilder(opset=DEFAULT_OPSET)
    score.emit(expected, "P", "L", np.float64, **score.params)
    assert [n.op_type for n in builder.nodes] == [n.op_type for n in expected.nodes]
    # unknown parameters: a TypeError naming the parameter and the accepted ones
    with pytest.raises(TypeError, match=rf"\['bogus'\].*{name!r}"):
        add_loss_output(model, score_name=name, bogus=1.0)
    with pytest.raises(TypeError, match=r"\['bogus'\]"):
        elementwise_loss(GraphBuilder(), name, "P", "L", bogus=1.0)
    for key in score.params:
        with pytest.raises(ValueError, match=f"{key} must be a finite number"):
            add_loss_output(model, score_name=name, **{key: -1.0})
        with pytest.raises(ValueError, match=key):
            score.resolve_params(**{key: float("nan")})


@pytest.mark.parametrize("bad", ["hinge_loss", "L2", None, 3])
def test_unknown_score_name_raises_naming_it(bad):
    for call in (lambda: get_score(bad),
                 lambda: elementwise_loss(GraphBuilder(), bad, "P", "L"),
                 lambda: add_loss_output(identity_model(np.float64), score_name=bad)):
        with pytest.raises(ValueError, match=rf"Unknown score_name {bad!r}.*cross_entropy"):
            call()


def test_unknown_penalty_name_lists_initializers():
    model = linear_model(np.ones((2, 1)), np.zeros(1))
    with pytest.raises(ValueError, match=r"\['weights'\].*\['coef', 'intercept'\]"):
        add_loss_output(model, penalty={"weights": 0.1})


@pytest.mark.parametrize("penalty,exc,match", [
    ({"coef": {"l3": 1.0}}, ValueError, "'l3'"),
    ({"coef": -0.1}, ValueError, "l2 on 'coef' must be a finite number >= 0"),
    ({"coef": {"l1": float("nan")}}, ValueError, "l1 on 'coef'"),
    ([("coef", 0.1)], TypeError, "penalty must be a dict"),
])
def test_bad_penalty(penalty, exc, match):
    model = linear_model(np.ones((2, 1)), np.zeros(1))
    with pytest.raises(exc, match=match):
        add_loss_output(model, penalty=penalty)


def test_penalty_on_integer_initializer(diabetes):
    X, y = diabetes
    onx = to_onnx(LinearRegression().fit(X, y), X, black_op={"LinearRegressor"})
    with pytest.raises(TypeError, match="'shape_tensor'.*INT64"):
        add_loss_output(onx, penalty={"shape_tensor": 0.1})


@pytest.mark.parametrize("output_index,exc,match", [
    (3, ValueError, "out of range.*3 output"),
    ("nope", ValueError, "'nope' is neither"),
    (1.0, TypeError, "int or an output name"),
])
def test_bad_output_index(output_index, exc, match):
    with pytest.raises(exc, match=match):
        add_loss_output(_two_output_model(), output_index=output_index, label_name="t")


@pytest.mark.parametrize("kw,match", [
    ({"loss_name": "X"}, "loss_name='X'"),
    ({"label_name": "Y"}, "label_name='Y'"),
    ({"weight_name": "label"}, "both 'label'"),
])
def test_name_conflicts(kw, match):
    with pytest.raises(ValueError, match=match):
        add_loss_output(identity_model(np.float64), **kw)


def test_shape_checks_of_log_losses():
    with pytest.raises(ValueError, match=r"'log' needs scores of shape \(n,\) or \(n, 1\)"):
        add_loss_output(identity_model(np.float64, ("N", 3)), score_name="log")
    with pytest.raises(ValueError, match="cross_entropy' needs logits"):
        add_loss_output(identity_model(np.float64, ("N",)), score_name="cross_entropy")


def test_input_model_is_not_modified_and_bytes_accepted():
    model = identity_model(np.float64)
    before = model.SerializeToString()
    out = add_loss_output(before, penalty=None)
    assert model.SerializeToString() == before
    assert out.graph.output[0].name == "loss"
    assert set(SCORE_NAMES) >= {"squared_error", "log", "cross_entropy", "huber"}


def test_no_module_imports_private_loss_names():
    """Every loss user goes through the public pieces of ortlearn.loss."""
    import ast
    from pathlib import Path

    root = Path(ortlearn.loss.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path == Path(ortlearn.loss.__file__):
            continue
        package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = node.module or ""
            if node.level:  # relative: resolve against the file's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            if module == "ortlearn.loss":
                offenders += [f"{path.name}: {a.name}" for a in node.names
                              if a.name.startswith("_")]
    assert not offenders


# ------------------------------------------ the losses of scikit-learn's SGD* and GLMs
def _margin_reference(name, y01, s):
    z = (2 * y01 - 1) * s
    return {"hinge": np.maximum(0, 1 - z),
            "squared_hinge": np.maximum(0, 1 - z) ** 2,
            "perceptron": np.maximum(0, -z),
            "modified_huber": np.where(z >= -1, np.maximum(0, 1 - z) ** 2, -4 * z)}[name]


_SKLEARN_SCORES = [  # (score, kwargs, mean loss from scikit-learn's metrics or formulas)
    ("hinge", {}, lambda y, p: hinge_loss(y, p)),
    ("squared_hinge", {}, lambda y, p: _margin_reference("squared_hinge", y, p).mean()),
    ("perceptron", {}, lambda y, p: _margin_reference("perceptron", y, p).mean()),
    ("modified_huber", {}, lambda y, p: _margin_reference("modified_huber", y, p).mean()),
    ("epsilon_insensitive", {"epsilon": 0.3},
     lambda y, p: np.maximum(0, np.abs(y - p) - 0.3).mean()),
    ("squared_epsilon_insensitive", {"epsilon": 0.3},
     lambda y, p: (np.maximum(0, np.abs(y - p) - 0.3) ** 2).mean()),
    ("pinball", {"quantile": 0.8}, lambda y, p: mean_pinball_loss(y, p, alpha=0.8)),
    # GLMs: half the deviance of the mean exp(p) minus the terms of y alone.
    ("poisson", {}, lambda y, p: mean_poisson_deviance(y, np.exp(p)) / 2
     - np.mean(y * np.log(y) - y)),
    ("gamma", {}, lambda y, p: mean_gamma_deviance(y, np.exp(p)) / 2 + np.mean(np.log(y) + 1)),
    ("tweedie", {"power": 1.5}, lambda y, p: mean_tweedie_deviance(y, np.exp(p), power=1.5) / 2
     - np.mean(y ** 0.5 / (-0.5 * 0.5))),
    ("tweedie", {"power": 3.0}, lambda y, p: mean_tweedie_deviance(y, np.exp(p), power=3.0) / 2
     - np.mean(y ** -1.0 / (-2.0 * -1.0))),
    ("tweedie", {"power": 0.0}, lambda y, p: mean_tweedie_deviance(y, np.exp(p), power=0) / 2),
    ("tweedie", {"power": 1.0}, lambda y, p: mean_poisson_deviance(y, np.exp(p)) / 2
     - np.mean(y * np.log(y) - y)),
    ("tweedie", {"power": 2.0}, lambda y, p: mean_gamma_deviance(y, np.exp(p)) / 2
     + np.mean(np.log(y) + 1)),
]


def _labels_for(name, rng, n):
    if name in ("hinge", "squared_hinge", "perceptron", "modified_huber"):
        return rng.integers(0, 2, n).astype(np.float64)
    return rng.gamma(2.0, 1.0, n)  # > 0: every deviance is defined


@pytest.mark.parametrize("name, kw, reference", _SKLEARN_SCORES,
                         ids=[f"{n}-{kw}" for n, kw, _ in _SKLEARN_SCORES])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sgd_and_glm_scores_match_scikit_learn(name, kw, reference, dtype):
    rng = np.random.default_rng(0)
    n = 500
    y = _labels_for(name, rng, n)
    p = 1.5 * rng.standard_normal(n)  # scores or log-means: every branch of every loss
    model = add_loss_output(identity_model(dtype), score_name=name, **kw)
    got = _loss(model, {"X": p.reshape(-1, 1).astype(dtype),
                        "label": y.reshape(-1, 1).astype(dtype)})
    np.testing.assert_allclose(got, reference(y, p), rtol=_rtol(dtype))


@pytest.mark.parametrize("name, kw", [(n, kw) for n, kw, _ in _SKLEARN_SCORES],
                         ids=[f"{n}-{kw}" for n, kw, _ in _SKLEARN_SCORES])
def test_sgd_and_glm_scores_gradients_match_finite_differences(name, kw):
    rng = np.random.default_rng(1)
    X = 0.5 * rng.standard_normal((40, 3))
    y = _labels_for(name, rng, 40)
    model = add_loss_output(linear_model(rng.standard_normal((3, 1)), np.array([0.1])),
                            score_name=name, **kw)
    feeds = {"X": X, "label": y.reshape(-1, 1)}
    grads, _ = analytic_gradient(model, feeds, ["coef", "intercept"])
    numeric = numeric_gradient(model, feeds, ["coef", "intercept"])
    for weight in ("coef", "intercept"):
        assert_close(grads[weight], numeric[weight], rtol=1e-6)


@pytest.mark.parametrize("name, kw, match", [
    ("pinball", {"quantile": 1.0}, r"quantile must be in \(0, 1\)"),
    ("pinball", {"quantile": 0.0}, "quantile must be > 0"),
    ("tweedie", {"power": 0.5}, r"power must be 0 or >= 1.*0.5"),
])
def test_sgd_and_glm_score_parameters_out_of_their_domain(name, kw, match):
    with pytest.raises(ValueError, match=match):
        add_loss_output(identity_model(np.float64), score_name=name, **kw)


@pytest.mark.parametrize("weighted", [False, True])
def test_prediction_of_unknown_rank_is_accepted(weighted):
    """A model whose input was declared without a shape (onnxcustom's users built such
    models, ``DoubleTensorType()``): onnxruntime runs it, so add_loss_output takes it, the
    label declared without a shape too."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])], "identity",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, None)],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, None)])
    # (onnx's checker wants a shape on every graph input: helper, not ortlearn's make_model)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)])
    loss_model = add_loss_output(model, weight_name="w" if weighted else None)
    label = next(i for i in loss_model.graph.input if i.name == "label")
    assert not label.type.tensor_type.HasField("shape")
    X, y = np.array([[1.0], [2.0], [4.0]]), np.array([[0.0], [2.0], [1.0]])
    w = np.array([1.0, 2.0, 3.0])
    feeds = {"X": X, "label": y, **({"w": w} if weighted else {})}
    expected = (np.average((X - y).ravel() ** 2, weights=w) if weighted
                else np.mean((X - y) ** 2))
    np.testing.assert_allclose(run_onnx(loss_model, feeds)[0], expected, rtol=1e-12)
    # a scalar prediction has no rows: still refused
    scalar = identity_model(np.float64, shape=())
    with pytest.raises(ValueError, match="is a scalar"):
        add_loss_output(scalar)
