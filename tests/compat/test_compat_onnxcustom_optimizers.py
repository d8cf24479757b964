"""onnxcustom's first training API on ortlearn: ``add_loss_output`` and ``OrtGradientOptimizer``.

The reference is onnxcustom 0.4's semantics (``onnxcustom/utils/orttraining_helper.py``,
``onnxcustom/training/optimizers.py``), re-computed here in numpy step by step:
summed losses, ``w -= lr / batch_size * grad``, the 'invscaling' rate updated after
each epoch (``eta0 / (it + 1) ** power_t`` after the 0-based epoch ``it``), batches
of consecutive rows starting at ``numpy.random.randint(0, n - batch_size)``.
"""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from skl2onnx import to_onnx
from sklearn.datasets import make_classification, make_regression
from sklearn.linear_model import LinearRegression, SGDClassifier

import ortlearn
from ortlearn.compat.onnxcustom.training import excs
from ortlearn.compat.onnxcustom.training.optimizers import OrtGradientOptimizer
from ortlearn.compat.onnxcustom.training.sgd_learning_rate import (
    LearningRateSGD,
    LearningRateSGDNesterov,
)
from ortlearn.compat.onnxcustom.utils.orttraining_helper import (
    add_loss_output,
    get_train_initializer,
    penalty_loss_onnx,
)
from ortlearn.exceptions import ConvergenceError as NativeConvergenceError
from ortlearn.training.device import cuda_available

RTOL = 1e-5


@pytest.fixture(scope="module")
def regression():
    X, y = make_regression(100, n_features=3, bias=2, noise=1.0, random_state=0)
    X, y = X.astype(np.float32), (y / 50).astype(np.float32)
    onx = to_onnx(LinearRegression().fit(X, y), X[:1], black_op={"LinearRegressor"},
                  target_opset=15)
    w = np.random.RandomState(1).uniform(0.5, 1.5, size=100).astype(np.float32)
    return X, y, w, onx


def _run(model, feeds, name="loss"):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run([name], feeds)[0]


# ------------------------------------------------------------- add_loss_output
@pytest.mark.parametrize("score,kwargs", [
    ("squared_error", {}), ("l2", {}), ("absolute_error", {}), ("l1", {}),
    ("elastic", {}), ("elastic", {"l1_weight": 0.1, "l2_weight": 0.9})])
@pytest.mark.parametrize("weighted", [False, True])
def test_summed_scores_match_numpy(regression, score, kwargs, weighted):
    X, y, w, onx = regression
    loss_model = add_loss_output(onx, score_name=score,
                                 weight_name="weight" if weighted else None, **kwargs)
    assert [i.name for i in loss_model.graph.input] == (
        ["X", "label", "weight"] if weighted else ["X", "label"])
    assert [o.name for o in loss_model.graph.output] == ["loss", "variable"]
    dims = [d.dim_value for d in loss_model.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [1, 1]
    feeds = {"X": X, "label": y[:, None] + 0.5}
    if weighted:
        feeds["weight"] = w
    got = _run(loss_model, feeds)
    d = (X.astype(np.float64) @ onnx.numpy_helper.to_array(onx.graph.initializer[0])
         + onnx.numpy_helper.to_array(onx.graph.initializer[1])).ravel() - (y + 0.5)
    per_row = {"squared_error": d ** 2, "l2": d ** 2, "absolute_error": np.abs(d),
               "l1": np.abs(d)}.get(score)
    if per_row is None:
        per_row = kwargs.get("l1_weight", 0.5) * np.abs(d) + kwargs.get("l2_weight", 0.5) * d ** 2
    expected = (per_row * (w if weighted else 1)).sum()  # a sum, not a mean
    assert got.shape == (1, 1)
    np.testing.assert_allclose(got[0, 0], expected, rtol=RTOL)


def test_penalty_forms_match_numpy(regression):
    X, y, _, onx = regression
    coef = onnx.numpy_helper.to_array(onx.graph.initializer[0]).astype(np.float64)
    intercept = onnx.numpy_helper.to_array(onx.graph.initializer[1]).astype(np.float64)
    loss_model = add_loss_output(onx, penalty={"coef": {"l1": 0.5, "l2": 0.25},
                                               "intercept": 0.125})
    got = _run(loss_model, {"X": X, "label": y[:, None]})
    data = (((X @ coef + intercept).ravel() - y) ** 2).sum()
    expected = data + 0.5 * np.abs(coef).sum() + 0.25 * (coef ** 2).sum() + 0.125 * (
        intercept ** 2).sum()
    np.testing.assert_allclose(got[0, 0], expected, rtol=RTOL)
    with pytest.raises(ValueError, match="cannot be null"):
        add_loss_output(onx, penalty={"coef": {"l1": 0, "l2": None}})


@pytest.mark.parametrize("weighted", [False, True])
def test_log_loss_on_probabilities(weighted):
    X, y = make_classification(100, n_features=10, random_state=0)
    X, y = X.astype(np.float32), y.astype(np.int64)
    onx = to_onnx(SGDClassifier(loss="log_loss", random_state=0).fit(X, y), X[:1],
                  target_opset=15, black_op={"LinearClassifier"}, options={"zipmap": False})
    loss_model = add_loss_output(onx, "log", output_index=1, eps=1e-3,
                                 weight_name="weight" if weighted else None)
    label = loss_model.graph.input[1]
    assert label.type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert [o.name for o in loss_model.graph.output] == ["loss", "probabilities"]
    w = np.linspace(0.5, 2, 100, dtype=np.float32)
    feeds = {"X": X, "label": y[:, None]}
    if weighted:
        feeds["weight"] = w
    got = _run(loss_model, feeds)
    proba = _run(onx, {"X": X}, "probabilities").astype(np.float64)
    p = np.clip(proba, 1e-3, 1 - 1e-3)
    p /= p.sum(axis=1, keepdims=True)
    like = (1 - y) * np.log(p[:, 0]) + y * np.log(p[:, 1])
    expected = -(like * (w if weighted else 1)).mean()  # onnxcustom's log loss is a mean
    np.testing.assert_allclose(got[0, 0], expected, rtol=RTOL)


def test_add_loss_output_errors_as_onnxcustom(regression):
    _, _, _, onx = regression
    with pytest.raises(NotImplementedError, match="score_name"):
        add_loss_output(onx, score_name="huber")
    with pytest.raises(TypeError, match="output_index"):
        add_loss_output(onx, output_index=0.5)
    with pytest.raises(ValueError, match="Unable to find output"):
        add_loss_output(onx, output_index="nope")
    X, y = make_classification(50, n_features=4, random_state=0)
    clf = to_onnx(SGDClassifier(loss="log_loss").fit(X.astype(np.float32), y), X[:1].astype(
        np.float32), target_opset=15, options={"zipmap": False})
    with pytest.raises(ValueError, match="Unable to guess the output"):
        add_loss_output(clf, "log")
    with pytest.raises(TypeError, match="eps"):
        add_loss_output(clf, "log", output_index=1, l1_weight=0.5)
    with pytest.warns(UserWarning, match="ignored"):
        add_loss_output(onx, "squared_error", l1_weight=0.5)


def test_get_train_initializer_and_penalty_loss_onnx(regression):
    _, _, _, onx = regression
    inits = get_train_initializer(onx)
    assert list(inits) == ["coef", "intercept"]  # shape_tensor is int64
    value, proto = inits["coef"]
    np.testing.assert_array_equal(value, onnx.numpy_helper.to_array(proto))
    names = {"coef"}
    kept, nodes = penalty_loss_onnx("coef", np.float32, l1=0.5, l2=0.25, existing_names=names)
    assert kept == [] and nodes[-1].op_type == "Add"
    assert nodes[-1].output[0] in names
    with pytest.raises(ValueError, match="cannot be null"):
        penalty_loss_onnx("coef", np.float32)


def test_native_add_loss_output_keeps_its_mean(regression):
    X, y, _, onx = regression
    native = _run(ortlearn.add_loss_output(onx), {"X": X, "label": y[:, None]})
    compat = _run(add_loss_output(onx), {"X": X, "label": y[:, None]})
    np.testing.assert_allclose(float(np.ravel(native)[0]) * len(X), compat[0, 0], rtol=RTOL)


# ------------------------------------------------------ the numpy reference
def _reference(X, y, coef, intercept, eta0, max_iter, batch_size, seed, sample_weight=None,
               power_t=0.25, penalty=None, score="l2", l1_weight=0.5, l2_weight=0.5,
               redraw=True):
    """onnxcustom's OrtGradientOptimizer.fit on y = X coef + b, in float32, step by step."""
    rng = np.random.RandomState(seed)
    coef, intercept = coef.astype(np.float32), intercept.astype(np.float32)
    if redraw:  # the graph's initializer order: coef, intercept
        coef = rng.randn(*coef.shape).astype(np.float32)
        intercept = rng.randn(*intercept.shape).astype(np.float32)
    n = X.shape[0]
    y = y.reshape(-1, 1)
    w = np.ones(n, dtype=np.float32) if sample_weight is None else sample_weight
    penalty = penalty or {}
    lr, losses = eta0, []
    for it in range(max_iter):
        step = np.float32(lr / batch_size)
        batch_losses = []
        for _ in range(-(-n // batch_size)):
            i = rng.randint(0, n - batch_size)
            xb, yb, wb = X[i:i + batch_size], y[i:i + batch_size], w[i:i + batch_size, None]
            d = xb @ coef + intercept - yb
            if score == "l2":
                loss, dloss = (d * d * wb).sum(), 2 * d * wb
            elif score == "l1":
                loss, dloss = (np.abs(d) * wb).sum(), np.sign(d) * wb
            else:
                loss = ((l1_weight * np.abs(d) + l2_weight * d * d) * wb).sum()
                dloss = (l1_weight * np.sign(d) + 2 * l2_weight * d) * wb
            g_coef, g_int = xb.T @ dloss, dloss.sum(axis=0)
            for name, value, grad in (("coef", coef, g_coef), ("intercept", intercept, g_int)):
                pen = penalty.get(name, {})
                loss += pen.get("l1", 0) * np.abs(value).sum() + pen.get("l2", 0) * (
                    value * value).sum()
                grad += (pen.get("l1", 0) * np.sign(value) + 2 * pen.get("l2", 0) * value
                         ).astype(np.float32)
            coef = (coef - step * g_coef).astype(np.float32)
            intercept = (intercept - step * g_int).astype(np.float32)
            batch_losses.append(loss / batch_size)
        losses.append(float(np.mean(batch_losses)))
        lr = eta0 / (it + 1) ** power_t
    return losses, coef, intercept


def _initial(onx):
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in onx.graph.initializer}
    return inits["coef"], inits["intercept"]


@pytest.mark.parametrize("case", [
    dict(),
    dict(sample_weight="1d"),
    dict(sample_weight="2d", score="elastic", l1_weight=0.1, l2_weight=0.9),
    dict(score="l1"),
    dict(penalty={"coef": {"l1": 0.01, "l2": 0.02}, "intercept": {"l2": 0.01}}),
    dict(warm_start=True, batch_size=7),
])
def test_losses_and_weights_match_onnxcustom_update_rule(regression, case):
    X, y, w, onx = regression
    case = dict(case)
    weighted = case.pop("sample_weight", None)
    warm_start = case.pop("warm_start", False)
    batch_size = case.pop("batch_size", 10)
    score = case.get("score", "l2")
    loss_kwargs = {k: case[k] for k in ("l1_weight", "l2_weight") if k in case}
    onx_loss = add_loss_output(onx, score_name={"l2": "squared_error", "l1": "l1",
                                                "elastic": "elastic"}[score],
                               weight_name="weight" if weighted else None,
                               penalty=case.get("penalty"), **loss_kwargs)
    sw = None if weighted is None else (w if weighted == "1d" else w[:, None])
    np.random.seed(7)
    train_session = OrtGradientOptimizer(onx_loss, ["coef", "intercept"], learning_rate=0.02,
                                         max_iter=6, batch_size=batch_size,
                                         warm_start=warm_start)
    train_session.fit(X, y, sample_weight=sw)
    losses, coef, intercept = _reference(
        X, y, *_initial(onx), eta0=0.02, max_iter=6, batch_size=batch_size, seed=7,
        sample_weight=None if weighted is None else w, redraw=not warm_start, **case)
    np.testing.assert_allclose(train_session.train_losses_, losses, rtol=RTOL)
    state = train_session.get_state()
    np.testing.assert_allclose(state["coef"], coef, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(state["intercept"], intercept, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(train_session.trained_coef_["coef"], coef, rtol=RTOL, atol=1e-6)
    assert train_session.learning_rate.value == pytest.approx(0.02 / 6 ** 0.25)


def test_learning_rate_forms(regression):
    _, _, _, onx = regression
    onx_loss = add_loss_output(onx)
    selected = OrtGradientOptimizer(onx_loss, ["coef"], learning_rate=0.5).learning_rate
    assert isinstance(selected, LearningRateSGD) and selected.eta0 == 0.5
    assert selected.learning_rate == "invscaling"
    default = OrtGradientOptimizer(onx_loss, ["coef"]).learning_rate
    assert isinstance(default, LearningRateSGD) and default.eta0 == 0.01
    given = LearningRateSGD(eta0=0.1, learning_rate="constant")
    assert OrtGradientOptimizer(onx_loss, ["coef"], learning_rate=given).learning_rate is given
    for nesterov in ("Nesterov", "SGDNesterov", LearningRateSGDNesterov()):
        with pytest.raises(NotImplementedError, match="past gradient"):
            OrtGradientOptimizer(onx_loss, ["coef"], learning_rate=nesterov)
    with pytest.raises(ValueError, match="Unexpected"):
        OrtGradientOptimizer(onx_loss, ["coef"], learning_rate="Adam")


def test_constant_schedule_and_small_data(regression):
    """n <= batch_size: one batch of every row, its loss divided by n (onnxcustom's loader)."""
    X, y, _, onx = regression
    X, y = X[:8], y[:8]
    coef, intercept = _initial(onx)
    train_session = OrtGradientOptimizer(
        add_loss_output(onx), ["coef", "intercept"], warm_start=True, max_iter=3,
        learning_rate=LearningRateSGD(eta0=0.05, learning_rate="constant"), batch_size=10)
    train_session.fit(X, y)
    step = np.float32(0.05 / 10)
    c, b = coef.astype(np.float32), intercept.astype(np.float32)
    losses = []
    for _ in range(3):
        d = X @ c + b - y[:, None]
        losses.append(float((d * d).sum() / 8))
        c, b = c - step * (X.T @ (2 * d)), b - step * (2 * d).sum(axis=0)
    np.testing.assert_allclose(train_session.train_losses_, losses, rtol=RTOL)
    np.testing.assert_allclose(train_session.get_state()["coef"], c, rtol=RTOL)


def test_sample_weight_and_optimizer_errors(regression):
    X, y, w, onx = regression
    plain = OrtGradientOptimizer(add_loss_output(onx), ["coef", "intercept"], max_iter=1)
    with pytest.raises(RuntimeError, match="Number of inputs"):
        plain.fit(X, y, sample_weight=w)
    weighted = OrtGradientOptimizer(add_loss_output(onx, weight_name="weight"),
                                    ["coef", "intercept"], max_iter=1)
    with pytest.raises(RuntimeError, match="Number of inputs"):
        weighted.fit(X, y)
    with pytest.raises(AttributeError):
        weighted.get_state()  # "fit must be called before"
    other = OrtGradientOptimizer(add_loss_output(onx), ["coef"],
                                 training_optimizer_name="AdamOptimizer")
    with pytest.raises(NotImplementedError, match="SGDOptimizer"):
        other.fit(X, y)


def test_divergence_keeps_finished_epochs(regression):
    X, y, _, onx = regression
    np.random.seed(0)
    train_session = OrtGradientOptimizer(
        add_loss_output(onx), ["coef", "intercept"], max_iter=200,
        learning_rate=LearningRateSGD(eta0=1.5, learning_rate="constant"))
    with pytest.raises(excs.ConvergenceError, match="nan or infinite") as info:
        train_session.fit(X, y)
    assert isinstance(info.value, NativeConvergenceError)
    assert isinstance(info.value, RuntimeError)
    losses = train_session.train_losses_
    assert 1 <= len(losses) < 200 and np.isfinite(losses).all()
    expected, _, _ = _reference(X, y, *_initial(onx), eta0=1.5, power_t=0.0,
                                max_iter=len(losses), batch_size=10, seed=0)
    np.testing.assert_allclose(losses, expected, rtol=RTOL)
    assert train_session.n_iter_ == len(losses)
    assert all(np.isfinite(v).all() for v in train_session.get_state().values())
    # the exception classes of onnxcustom, also ortlearn's
    assert issubclass(excs.ConvergenceWarning, UserWarning)
    assert issubclass(excs.ConvergenceWarning, ortlearn.exceptions.ConvergenceWarning)
    assert issubclass(excs.EvaluationError, RuntimeError)
    assert issubclass(excs.ProviderError, RuntimeError)


def test_validation_losses(regression):
    X, y, _, onx = regression
    np.random.seed(3)
    train_session = OrtGradientOptimizer(add_loss_output(onx), ["coef", "intercept"],
                                         max_iter=10, validation_every=0.2)
    train_session.fit(X[:80], y[:80], X_val=X[80:], y_val=y[80:])
    assert len(train_session.validation_losses_) == 5  # every int(10 * 0.2) epochs
    state = train_session.get_state()
    d = X[80:] @ state["coef"] + state["intercept"] - y[80:, None]
    np.testing.assert_allclose(train_session.validation_losses_[-1], (d * d).sum() / 20,
                               rtol=RTOL)


def test_trained_onnx_and_saved_gradient(regression, tmp_path):
    X, y, _, onx = regression
    onx_loss = add_loss_output(onx)
    saved = str(tmp_path / "saved_gradient.onnx")
    np.random.seed(5)
    train_session = OrtGradientOptimizer(onx_loss, ["coef", "intercept"], max_iter=2,
                                         saved_gradient=saved)
    train_session.fit(X, y)
    state = train_session.get_state()
    trained = train_session.get_trained_onnx()  # the training graph: it outputs the loss
    assert [o.name for o in trained.graph.output] == ["loss", "variable"]
    got = _run(trained, {"X": X, "label": y[:, None]})
    d = X @ state["coef"] + state["intercept"] - y[:, None]
    np.testing.assert_allclose(got[0, 0], (d * d).sum(), rtol=RTOL)
    pred = _run(train_session.get_trained_onnx(model=onx), {"X": X}, "variable")
    np.testing.assert_allclose(pred, X @ state["coef"] + state["intercept"], rtol=RTOL)
    np.testing.assert_allclose(train_session.predict(X), pred, rtol=RTOL)
    # the gradient graph: loss then one gradient per weight, at the graph's weights
    grad_model = onnx.load(saved)
    assert [o.name for o in grad_model.graph.output][:3] == ["loss", "coef_grad",
                                                              "intercept_grad"]
    sess = ort.InferenceSession(grad_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    # (away from the optimum the graph was converted at, where the gradient cancels)
    _, g_coef, _ = sess.run(None, {"X": X, "label": y[:, None] + 1})[:3]
    coef0, b0 = _initial(onx)
    np.testing.assert_allclose(g_coef, X.T @ (2 * (X @ coef0 + b0 - y[:, None] - 1)),
                               rtol=RTOL)
    assert os.path.exists(saved + ".training.onnx")
    onnx.checker.check_model(onnx.load(saved + ".training.onnx"))


def test_native_optimizer_defaults_unchanged():
    params = ortlearn.OrtGradientOptimizer(None).get_params()
    assert params["learning_rate"] == "invscaling" and params["optimizer"] == "sgd"
    assert params["warm_start"] is False and "random_state" in params


@pytest.mark.skipif(not cuda_available(), reason="needs CUDA")
def test_cuda_matches_cpu(regression):
    X, y, _, onx = regression
    results = []
    for device in ("cpu", "cuda"):
        np.random.seed(11)
        train_session = OrtGradientOptimizer(add_loss_output(onx), ["coef", "intercept"],
                                             max_iter=3, device=device)
        results.append(train_session.fit(X, y).train_losses_)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-4)


def test_log_loss_training_matches_numpy():
    """onnxcustom's binary classification test: 'log' on probabilities, weights (n, 1)."""
    X, y = make_classification(100, n_features=10, random_state=0)
    X, y = X.astype(np.float32), y.astype(np.int64)
    w = np.linspace(0.5, 1.5, 100, dtype=np.float32)
    onx = to_onnx(SGDClassifier(loss="log_loss", random_state=0).fit(X, y), X[:1],
                  target_opset=15, black_op={"LinearClassifier"}, options={"zipmap": False})
    onx_loss = add_loss_output(onx, "log", output_index=1, weight_name="weight")
    np.random.seed(4)
    train_session = OrtGradientOptimizer(onx_loss, ["intercept", "coef"], learning_rate=1e-1,
                                         max_iter=4)
    train_session.fit(X, y.reshape((-1, 1)), w.reshape((-1, 1)), use_numpy=False)

    rng = np.random.RandomState(4)  # redrawn in the graph's order: coef, then intercept
    coef = rng.randn(10, 1).astype(np.float32)
    intercept = rng.randn(1).astype(np.float32)
    eta0, losses = 0.1, []
    lr = eta0
    for it in range(4):
        step, batch_losses = np.float32(lr / 10), []
        for _ in range(10):
            i = rng.randint(0, 90)
            xb, yb, wb = X[i:i + 10], y[i:i + 10], w[i:i + 10]
            p1 = 1 / (1 + np.exp(-(xb @ coef + intercept).ravel().astype(np.float64)))
            ll = np.where(yb == 1, np.log(p1), np.log(1 - p1))
            batch_losses.append(-(wb * ll).mean() / 10)
            dz = (-(wb * (yb - p1)) / 10)[:, None]  # d loss / d score
            coef = (coef - step * (xb.T @ dz)).astype(np.float32)
            intercept = (intercept - step * dz.sum(axis=0)).astype(np.float32)
        losses.append(np.mean(batch_losses))
        lr = eta0 / (it + 1) ** 0.25
    np.testing.assert_allclose(train_session.train_losses_, losses, rtol=RTOL)
    state = train_session.get_state()
    np.testing.assert_allclose(state["coef"], coef, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(state["intercept"], intercept, rtol=RTOL, atol=1e-6)
    # the trained weights in the graph without its loss: onnxcustom's get_trained_onnx(model=)
    proba = _run(train_session.get_trained_onnx(model=onx), {"X": X}, "probabilities")
    p1 = 1 / (1 + np.exp(-(X @ coef + intercept).ravel()))
    np.testing.assert_allclose(proba[:, 1], p1, rtol=1e-5)


def test_pickle_and_clone(regression):
    import pickle

    from sklearn.base import clone

    X, y, _, onx = regression
    np.random.seed(9)
    train_session = OrtGradientOptimizer(add_loss_output(onx), ["coef", "intercept"],
                                         max_iter=2).fit(X, y)
    restored = pickle.loads(pickle.dumps(train_session))
    np.testing.assert_array_equal(restored.get_state()["coef"],
                                  train_session.get_state()["coef"])
    np.testing.assert_array_equal(restored.predict(X[:5]), train_session.predict(X[:5]))
    copy = clone(train_session)
    assert isinstance(copy.learning_rate, LearningRateSGD)
    assert copy.learning_rate is not train_session.learning_rate
    assert copy.learning_rate.eta0 == train_session.learning_rate.eta0


def test_reprs_are_onnxcustoms():
    """onnxcustom's repr lists every constructor argument in the signature's order, defaults
    included (its tests compare the strings); scikit-learn's lists the changed ones, sorted."""
    from ortlearn.compat.onnxcustom.training.optimizers_partial import (
        OrtGradientForwardBackwardOptimizer,
    )
    from ortlearn.compat.onnxcustom.training.sgd_learning_penalty import ElasticLearningPenalty

    assert repr(LearningRateSGD()) == (
        "LearningRateSGD(eta0=0.01, alpha=0.0001, power_t=0.25, learning_rate='invscaling')")
    assert repr(ElasticLearningPenalty()).startswith("ElasticLearningPenalty(l1=")
    X = np.random.RandomState(0).randn(20, 3).astype(np.float32)
    onx = to_onnx(LinearRegression().fit(X, X[:, 0]), X, black_op={"LinearRegressor"})
    text = repr(OrtGradientOptimizer(add_loss_output(onx), ["coef", "intercept"]))
    assert text.startswith("OrtGradientOptimizer(model_onnx=")
    assert "learning_rate=LearningRateSGD(eta0=0.01" in text
    assert "learning_rate='invscaling'" in text and "max_iter=100" in text
    text = repr(OrtGradientForwardBackwardOptimizer(onx, device="cpu"))
    assert text.startswith("OrtGradientForwardBackwardOptimizer(model_onnx=")
    assert "device='cpu'" in text and "learning_loss=SquareLearningLoss()" in text
