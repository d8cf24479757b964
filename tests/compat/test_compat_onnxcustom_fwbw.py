"""onnxcustom's forward-backward API (``OrtGradientForwardBackwardOptimizer`` and its parts).

The examples of onnxcustom's documentation run after the import rename of
``ortlearn.compat.onnxcustom``'s docstring (plots and mlprodict calls
replaced by skl2onnx, fewer epochs); their losses and weights are checked
against a numpy re-computation of onnxcustom's update rule, step by step.
"""

import re
import subprocess
import warnings

import numpy as np
import pytest
from onnx import numpy_helper
from sklearn.datasets import make_regression

import ortlearn.compat.onnxcustom as compat_pkg
from ortlearn.compat.onnxcustom.training.data_loader import OrtDataLoader
from ortlearn.compat.onnxcustom.training.excs import ConvergenceError, ConvergenceWarning
from ortlearn.compat.onnxcustom.training.optimizers_partial import (
    OrtGradientForwardBackwardOptimizer,
)
from ortlearn.compat.onnxcustom.training.ortgradient import OrtGradientForwardBackward
from ortlearn.compat.onnxcustom.training.sgd_learning_loss import (
    AbsoluteLearningLoss,
    BaseLearningLoss,
    ElasticLearningLoss,
    NegLogLearningLoss,
    SquareLearningLoss,
)
from ortlearn.compat.onnxcustom.training.sgd_learning_penalty import (
    BaseLearningPenalty,
    ElasticLearningPenalty,
    NoLearningPenalty,
)
from ortlearn.compat.onnxcustom.training.sgd_learning_rate import (
    BaseLearningRate,
    LearningRateSGD,
    LearningRateSGDNesterov,
)
from ortlearn.compat.onnxcustom.utils.onnx_helper import (
    get_onnx_opset,
    onnx_rename_weights,
    proto_type_to_dtype,
    replace_initializers_into_onnx,
)
from ortlearn.compat.onnxcustom.utils.onnxruntime_helper import (
    device_to_providers,
    get_ort_device,
    numpy_to_ort_value,
    ort_device_to_string,
    provider_to_device,
)

RTOL = 1e-5


def assert_close(got, expected, rtol=RTOL):
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    scale = max(np.abs(expected).max(), 1e-30)
    assert np.abs(got - expected).max() <= rtol * scale, (got, expected)


# ---------------------------------------------------------------- learning rates

def _invscaling(eta0, power_t, n):
    # loop() yields eta0, then the rate after iteration t is eta0 / (t + 1) ** power_t
    return [eta0] + [eta0 / (t + 1) ** power_t for t in range(1, n)]


def _optimal(eta0, alpha, n):
    typw = np.sqrt(1.0 / np.sqrt(alpha))
    eta_b = typw / max(1.0, (1 + typw) * 2)
    t0 = 1.0 / (eta_b * alpha)
    fact = eta0 * alpha * t0
    return [eta0] + [fact / (alpha * (t0 + t)) for t in range(1, n)]


def test_learning_rate_loops_follow_onnxcustom_formulas():
    assert_close(list(LearningRateSGD(eta0=0.1, power_t=0.3).loop(8)), _invscaling(0.1, 0.3, 8),
                 rtol=1e-14)
    assert_close(list(LearningRateSGD(eta0=0.05, alpha=0.01, learning_rate="optimal").loop(8)),
                 _optimal(0.05, 0.01, 8), rtol=1e-14)
    assert list(LearningRateSGD(eta0=0.2, learning_rate="constant").loop(4)) == [0.2] * 4
    assert_close(list(LearningRateSGDNesterov(eta0=0.3).loop(5)), _invscaling(0.3, 0.25, 5),
                 rtol=1e-14)


def test_learning_rate_defaults_and_select():
    lr = LearningRateSGD()
    assert (lr.eta0, lr.alpha, lr.power_t, lr.learning_rate) == (0.01, 0.0001, 0.25, "invscaling")
    nest = LearningRateSGDNesterov()
    assert (nest.eta0, nest.momentum, nest.nesterov, nest.needs_grad) == (0.01, 0.9, True, True)
    assert not lr.needs_grad
    sel = BaseLearningRate.select(0.5)
    assert type(sel) is LearningRateSGD and sel.eta0 == 0.5
    assert type(BaseLearningRate.select("SGD")) is LearningRateSGD
    assert type(BaseLearningRate.select("LearningRateSGD")) is LearningRateSGD
    assert type(BaseLearningRate.select("Nesterov")) is LearningRateSGDNesterov
    assert BaseLearningRate.select("SGDNesterov", momentum=0.5).momentum == 0.5
    assert BaseLearningRate.select(nest) is nest
    with pytest.raises(ValueError, match="Unexpected learning rate"):
        BaseLearningRate.select("Adam")
    with pytest.raises(ValueError, match="learning_rate"):
        LearningRateSGD(learning_rate="adaptive")
    with pytest.raises(RuntimeError, match="init_learning_rate"):
        LearningRateSGD().value  # noqa: B018


@pytest.mark.parametrize("nesterov", [True, False])
def test_update_weights_against_numpy(nesterov):
    rng = np.random.RandomState(0)
    w, g, v = (rng.randn(3, 2).astype(np.float32) for _ in range(3))
    sgd = LearningRateSGD(eta0=0.1).init_learning_rate()
    assert_close(sgd.update_weights(0, "cpu", w, g, 5).numpy(), w - np.float32(0.1 / 5) * g)
    lr = LearningRateSGDNesterov(eta0=0.1, momentum=0.7, nesterov=nesterov).init_learning_rate()
    new_w, new_v = lr.update_weights(0, "cpu", w, g, 5, v)
    exp_v = 0.7 * v - 0.1 / 5 * g
    exp_w = w + 0.7 * exp_v - 0.1 / 5 * g if nesterov else w + exp_v
    assert_close(new_v.numpy(), exp_v)
    assert_close(new_w.numpy(), exp_w)


# ---------------------------------------------------------------- losses, penalties

def _loss_numpy(loss, y, p, w):
    w = np.ones(len(y)) if w is None else w
    w = w.reshape(-1, 1).astype(np.float64)
    p32 = p.astype(np.float32)
    y, p = y.astype(np.float64), p.astype(np.float64)
    d = p - y
    if isinstance(loss, SquareLearningLoss):
        return 0.5 * (w * d ** 2).sum(), w * d, w * d ** 2
    if isinstance(loss, AbsoluteLearningLoss):
        return (w * np.abs(d)).sum(), w * np.sign(d), w * np.abs(d)
    if isinstance(loss, ElasticLearningLoss):
        terms = loss.l1_weight * np.abs(d) + loss.l2_weight * d ** 2
        grad = loss.l1_weight * np.sign(d) + 2 * loss.l2_weight * d
        return (w * terms).sum(), w * grad, w * terms
    # Clipped in float32 as onnxruntime does: 1 - float32(1 - eps) is not eps.
    q32 = np.clip(np.float32(1) / (np.float32(1) + np.exp(-p32)), np.float32(loss.eps),
                  np.float32(1 - loss.eps))
    q = q32.astype(np.float64)
    terms = -(y * np.log(q) + (1 - y) * np.log((np.float32(1) - q32).astype(np.float64)))
    return (w * terms).sum(), w * (q - y), w * terms


@pytest.mark.parametrize("loss", [SquareLearningLoss(), AbsoluteLearningLoss(),
                                  ElasticLearningLoss(l1_weight=0.3, l2_weight=0.6),
                                  NegLogLearningLoss(eps=1e-3)])
@pytest.mark.parametrize("weighted", [False, True])
def test_losses_against_numpy(loss, weighted):
    rng = np.random.RandomState(1)
    p = rng.randn(7, 1).astype(np.float32) * 3
    y = ((rng.rand(7, 1) > 0.5).astype(np.int64) if isinstance(loss, NegLogLearningLoss)
         else rng.randn(7, 1).astype(np.float32))
    w = rng.rand(7).astype(np.float32) if weighted else None
    value, grad = loss.loss_gradient("cpu", y, p, weight=w)
    exp_value, exp_grad, exp_scores = _loss_numpy(loss, y, p, w)
    assert value.shape() == [1]
    assert_close(value.numpy(), [exp_value])
    assert_close(grad.numpy(), exp_grad)
    assert_close(loss.loss_scores("cpu", y, p, w).numpy(), exp_scores)


def test_loss_select():
    assert type(BaseLearningLoss.select("square_error")) is SquareLearningLoss
    assert type(BaseLearningLoss.select("absolute")) is AbsoluteLearningLoss
    assert BaseLearningLoss.select("elastic", l1_weight=0.2).l1_weight == 0.2
    assert type(BaseLearningLoss.select("log")) is NegLogLearningLoss
    assert type(BaseLearningLoss.select("NegLogLearningLoss")) is NegLogLearningLoss
    with pytest.raises(ValueError, match="Unexpected loss"):
        BaseLearningLoss.select("hinge")
    assert type(BaseLearningPenalty.select(None)) is NoLearningPenalty
    assert BaseLearningPenalty.select("l1l2", l1=0.3).l1 == 0.3


def test_penalty_against_numpy():
    rng = np.random.RandomState(2)
    ws = [rng.randn(3, 2).astype(np.float32), rng.randn(1, 2).astype(np.float32)]
    pen = ElasticLearningPenalty(l1=0.01, l2=0.02)
    loss = np.array([1.5], dtype=np.float32)
    expected = 1.5 + sum(0.01 * np.abs(w).sum() + 0.02 * (w.astype(np.float64) ** 2).sum()
                         for w in ws)
    assert_close(pen.penalty_loss("cpu", loss, *ws).numpy(), [expected])
    assert_close(pen.update_weights(0, "cpu", ws[0]).numpy(),
                 (1 - 2 * 0.02) * ws[0] - 0.01 * np.sign(ws[0]))
    none = NoLearningPenalty()
    assert none.penalty_loss("cpu", loss, *ws) is loss and none.update_weights(0, "cpu", ws[0]) \
        is ws[0]


# ---------------------------------------------------------------- numpy re-computation

def _dense_forward(weights, X, activations):
    """MLP as skl2onnx writes it: pairs (coefficient, intercepts), relu between layers."""
    hs, zs, h = [X], [], X
    n_layers = len(weights) // 2
    for k in range(n_layers):
        z = h @ weights[2 * k] + weights[2 * k + 1]
        zs.append(z)
        h = np.maximum(z, 0) if k < n_layers - 1 and activations == "relu" else z
        hs.append(h)
    return h, hs, zs


def _dense_backward(weights, hs, zs, g, activations):
    grads = [None] * len(weights)
    n_layers = len(weights) // 2
    for k in reversed(range(n_layers)):
        grads[2 * k] = hs[k].T @ g
        grads[2 * k + 1] = g.sum(axis=0).reshape(weights[2 * k + 1].shape)
        if k > 0:
            g = g @ weights[2 * k].T
            if activations == "relu":
                g = g * (zs[k - 1] > 0)
    return grads


def _epoch_rate(lr, k):
    """The rate of epoch k (0-based) in onnxcustom's fit: eta0, then the value
    update_learning_rate(k - 1) sets."""
    if k == 0 or lr.learning_rate == "constant":
        return lr.eta0
    if lr.learning_rate == "invscaling":
        return lr.eta0 / k ** lr.power_t
    return _optimal(lr.eta0, lr.alpha, k)[k - 1]


def reference_fit(shapes, X, y, *, max_iter, batch_size, lr, loss, penalty=None,
                  sample_weight=None, activations="relu", order=None, weights=None,
                  rng_state=None):
    """onnxcustom's fit in numpy float32: weights drawn by numpy.random.randn, batches
    drawn by numpy.random.randint, penalty update then learning-rate update per weight.

    ``order`` maps the position in the model's state to the (coefficient, intercepts)
    layout of _dense_forward."""
    if rng_state is not None:
        np.random.set_state(rng_state)
    if weights is None:
        weights = [np.random.randn(*s).astype(np.float32) for s in shapes]
    order = order or list(range(len(weights)))
    velocity = [np.zeros_like(w) for w in weights]
    y = y.reshape((len(y), -1))
    n, bs = X.shape[0], batch_size
    losses = []
    for it in range(max_iter):
        eta = np.float32(_epoch_rate(lr, it))
        batch_losses = []
        seen = 0
        while seen < n:
            i = np.random.randint(0, n - bs)
            seen += bs
            xb, yb = X[i:i + bs], y[i:i + bs]
            wb = None if sample_weight is None else sample_weight[i:i + bs]
            layer = [weights[order.index(j)] for j in range(len(weights))]
            pred, hs, zs = _dense_forward(layer, xb, activations)
            value, g, _ = _loss_numpy(loss, yb, pred, wb)
            g = g.astype(np.float32)
            if penalty is not None:
                value += sum(penalty[0] * np.abs(w).sum() + penalty[1] * (w.astype(np.float64)
                                                                          ** 2).sum()
                             for w in weights)
            layer_grads = _dense_backward(layer, hs, zs, g, activations)
            grads = [layer_grads[order[j]] for j in range(len(weights))]
            for j in range(len(weights)):
                if penalty is not None:
                    weights[j] = (np.float32(1 - 2 * penalty[1]) * weights[j]
                                  - np.float32(penalty[0]) * np.sign(weights[j]))
                step = -(eta / np.float32(bs)) * grads[j]
                if isinstance(lr, LearningRateSGDNesterov):
                    velocity[j] = np.float32(lr.momentum) * velocity[j] + step
                    if lr.nesterov:
                        weights[j] = weights[j] + np.float32(lr.momentum) * velocity[j] + step
                    else:
                        weights[j] = weights[j] + velocity[j]
                else:
                    weights[j] = weights[j] + step
            batch_losses.append(value / bs)
        losses.append(np.mean(batch_losses))
    return losses, weights


def _check_against_reference(opt, X, y, *, order=None, activations="relu", sample_weight=None,
                             penalty=None, rtol=RTOL):
    """Refit ``opt`` from a known numpy random state and compare with reference_fit."""
    np.random.seed(7)
    state = np.random.get_state()
    opt.fit(X, y, sample_weight=sample_weight)
    shapes = [tuple(w.shape()) for w in opt.get_state()]
    ref_lr = type(opt.learning_rate)(**{k: getattr(opt.learning_rate, k) for k, _ in
                                        opt.learning_rate._get_param_names()})
    losses, weights = reference_fit(
        shapes, X, y, max_iter=opt.max_iter, batch_size=opt.batch_size, lr=ref_lr,
        loss=opt.learning_loss, penalty=penalty, sample_weight=sample_weight,
        activations=activations, order=order, rng_state=state)
    assert_close(opt.train_losses_, losses, rtol=rtol)
    for got, exp in zip(opt.get_state(), weights):
        assert_close(got.numpy(), exp, rtol=rtol)
    return losses


# ---------------------------------------------------------------- documented examples

def _sed_line():
    doc = compat_pkg.__doc__
    match = re.search(r"(sed -i '.*' )script\.py", doc)
    assert match, doc
    return match.group(1)


def run_example(tmp_path, source, **values):
    """Rename the imports with the documented sed line, then run the script."""
    path = tmp_path / "example.py"
    path.write_text(source)
    subprocess.run(f"{_sed_line()}{path}", shell=True, check=True)
    text = path.read_text()
    assert "from onnxcustom" not in text and "ortlearn.compat.onnxcustom" in text
    namespace = dict(values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(text, str(path), "exec"), namespace)
    return namespace


LINREG_FWBW = '''
from pprint import pprint
import numpy
from onnxruntime import get_device
from sklearn.datasets import make_regression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from skl2onnx import to_onnx
from onnxcustom.utils.orttraining_helper import get_train_initializer
from onnxcustom.training.optimizers_partial import (
    OrtGradientForwardBackwardOptimizer)

X, y = make_regression(n_features=2, bias=2, random_state=0)
X = X.astype(numpy.float32)
y = y.astype(numpy.float32)
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)

lr = MLPRegressor(hidden_layer_sizes=tuple(),
                  activation='identity', max_iter=MAX_ITER,
                  batch_size=10, solver='sgd',
                  alpha=0, learning_rate_init=1e-2,
                  n_iter_no_change=200,
                  momentum=0, nesterovs_momentum=False)
lr.fit(X, y)

onx = to_onnx(lr, X_train[:1].astype(numpy.float32), target_opset=15)
inits = get_train_initializer(onx)
weights = {k: v for k, v in inits.items() if k != "shape_tensor"}
pprint(list((k, v[0].shape) for k, v in weights.items()))

device = "cuda" if get_device().upper() == 'GPU' else 'cpu'
train_session = OrtGradientForwardBackwardOptimizer(
    onx, list(weights), device=device, verbose=0, learning_rate=1e-2,
    warm_start=False, max_iter=MAX_ITER, batch_size=10)
train_session.fit(X, y)
state_tensors = train_session.get_state()
print("last_losses:", train_session.train_losses_[-5:])
onx_loss = train_session.train_session_.cls_type_._optimized_pre_grad_model
onx_gradient = train_session.train_session_.cls_type_._trained_onnx
loss_graphs = (train_session.learning_loss.loss_grad_onnx_,
               train_session.learning_rate.axpy_onnx_)
'''


def test_example_linear_regression_fwbw(tmp_path):
    ns = run_example(tmp_path, LINREG_FWBW, MAX_ITER=5)
    opt, X, y = ns["train_session"], ns["X"], ns["y"]
    assert len(opt.train_losses_) == 5 and np.isfinite(opt.train_losses_).all()
    assert [tuple(s.shape()) for s in ns["state_tensors"]] == [(2, 1), (1, 1)]
    losses = _check_against_reference(opt, X, y, activations="identity")
    assert losses[-1] < losses[0]
    # The trained graph predicts with the trained weights.
    from onnxruntime import InferenceSession

    trained = opt.get_trained_onnx()
    sess = InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"])
    coef, intercept = (w.numpy() for w in opt.get_state())
    assert_close(sess.run(None, {"X": X})[0], X @ coef + intercept)


NN_FWBW = '''
import warnings
import numpy
from onnxruntime import get_device
from sklearn.datasets import make_regression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.metrics import mean_squared_error
from skl2onnx import to_onnx
from onnxcustom.utils.orttraining_helper import get_train_initializer
from onnxcustom.utils.onnx_helper import onnx_rename_weights
from onnxcustom.training.optimizers_partial import (
    OrtGradientForwardBackwardOptimizer)

X, y = make_regression(N_ROWS, n_features=10, bias=2, random_state=0)
X = X.astype(numpy.float32)
y = y.astype(numpy.float32)
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)

nn = MLPRegressor(hidden_layer_sizes=(10, 10), max_iter=MAX_ITER,
                  solver='sgd', learning_rate_init=5e-5,
                  n_iter_no_change=1000, batch_size=10, alpha=0,
                  momentum=0, nesterovs_momentum=False)
with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    nn.fit(X_train, y_train)

onx = to_onnx(nn, X_train[:1].astype(numpy.float32), target_opset=15)
weights = list(sorted(get_train_initializer(onx)))
device = "cuda" if get_device().upper() == 'GPU' else 'cpu'

failed = None
try:
    train_session = OrtGradientForwardBackwardOptimizer(
        onx, device=device, verbose=0,
        warm_start=False, max_iter=MAX_ITER, batch_size=10)
    train_session.fit(X, y)
except ValueError as e:
    failed = e

onx = onnx_rename_weights(onx)
train_session = OrtGradientForwardBackwardOptimizer(
    onx, device=device, verbose=0,
    learning_rate=5e-5, warm_start=False, max_iter=MAX_ITER, batch_size=10)
train_session.fit(X, y)
state_tensors = train_session.get_state()
'''


def test_example_nn_fwbw(tmp_path):
    ns = run_example(tmp_path, NN_FWBW, MAX_ITER=3, N_ROWS=200)
    # Weights not in the initializers' order: onnxcustom's ValueError, as in the example.
    assert isinstance(ns["failed"], ValueError) and "onnx_rename_weights" in str(ns["failed"])
    opt = ns["train_session"]
    assert opt.weights_to_train == ["I0_coefficient", "I1_intercepts", "I2_coefficient1",
                                    "I3_intercepts1", "I4_coefficient2", "I5_intercepts2"]
    _check_against_reference(opt, ns["X"], ns["y"])


NN_NESTEROV = '''
import numpy
from sklearn.datasets import make_regression
from sklearn.neural_network import MLPRegressor
from skl2onnx import to_onnx
from onnxcustom.utils.onnx_helper import onnx_rename_weights
from onnxcustom.training.optimizers_partial import (
    OrtGradientForwardBackwardOptimizer)
from onnxcustom.training.sgd_learning_rate import LearningRateSGDNesterov
from onnxcustom.training.sgd_learning_penalty import ElasticLearningPenalty

X, y = make_regression(N_ROWS, n_features=10, bias=2, random_state=1)
X = X.astype(numpy.float32)
y = y.astype(numpy.float32)
nn = MLPRegressor(hidden_layer_sizes=(10, 10), max_iter=2, solver='sgd')
nn.fit(X, y)
onx = onnx_rename_weights(to_onnx(nn, X[:1], target_opset=15))

train_session = OrtGradientForwardBackwardOptimizer(
    onx, device='cpu', verbose=0,
    learning_rate=LearningRateSGDNesterov(1e-4, nesterov=True, momentum=0.9),
    warm_start=False, max_iter=MAX_ITER, batch_size=10)
train_session.fit(X, y)

train_session2 = OrtGradientForwardBackwardOptimizer(
    onx, device='cpu', verbose=0,
    learning_rate=LearningRateSGDNesterov(1e-4, nesterov=True, momentum=0.9),
    learning_penalty=ElasticLearningPenalty(l1=0, l2=1e-4),
    warm_start=False, max_iter=MAX_ITER, batch_size=10)
train_session2.fit(X, y)
'''


def test_example_nn_fwbw_nesterov(tmp_path):
    ns = run_example(tmp_path, NN_NESTEROV, MAX_ITER=3, N_ROWS=200)
    X, y = ns["X"], ns["y"]
    _check_against_reference(ns["train_session"], X, y)
    _check_against_reference(ns["train_session2"], X, y, penalty=(0, 1e-4))


def test_nesterov_l1_penalty_and_classical_momentum():
    X, y = make_regression(60, n_features=3, bias=2, random_state=3)
    X, y = X.astype(np.float32), (y / 50).astype(np.float32)
    from skl2onnx import to_onnx
    from sklearn.neural_network import MLPRegressor

    nn = MLPRegressor(hidden_layer_sizes=(4,), max_iter=1).fit(X, y)
    onx = onnx_rename_weights(to_onnx(nn, X[:1], target_opset=15))
    opt = OrtGradientForwardBackwardOptimizer(
        onx, max_iter=4, batch_size=7,
        learning_rate=LearningRateSGDNesterov(1e-2, nesterov=False, momentum=0.5),
        learning_penalty=ElasticLearningPenalty(l1=1e-3, l2=1e-3))
    _check_against_reference(opt, X, y, penalty=(1e-3, 1e-3))


REG_BENCH = '''
import time
import warnings
import numpy
from sklearn.datasets import make_regression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from skl2onnx import to_onnx
from onnxcustom.utils.onnx_helper import onnx_rename_weights
from onnxcustom.training.optimizers_partial import (
    OrtGradientForwardBackwardOptimizer)

X, y = make_regression(N_ROWS, n_features=100, bias=2, random_state=0)
X = X.astype(numpy.float32)
y = y.astype(numpy.float32)
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)


def benchmark(X, y, skl_model, train_session, name, verbose=True):
    begin = time.perf_counter()
    skl_model.fit(X, y)
    duration_skl = time.perf_counter() - begin
    begin = time.perf_counter()
    train_session.fit(X, y)
    duration_ort = time.perf_counter() - begin
    return dict(skl=duration_skl, ort=duration_ort, name=name,
                iter_skl=len(skl_model.loss_curve_),
                iter_ort=len(train_session.train_losses_),
                losses_skl=skl_model.loss_curve_,
                losses_ort=train_session.train_losses_)


benches = []
batch_size = 15
max_iter = MAX_ITER
nn = MLPRegressor(hidden_layer_sizes=(50, 10), max_iter=max_iter,
                  solver='sgd', learning_rate_init=5e-4, alpha=0,
                  n_iter_no_change=max_iter * 3, batch_size=batch_size,
                  nesterovs_momentum=False, momentum=0,
                  learning_rate="invscaling")
with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    nn.fit(X_train, y_train)
onx = to_onnx(nn, X_train[:1].astype(numpy.float32), target_opset=15)
onx = onnx_rename_weights(onx)
train_session = OrtGradientForwardBackwardOptimizer(
    onx, device='cpu', learning_rate=1e-5,
    warm_start=False, max_iter=max_iter, batch_size=batch_size)
benches.append(benchmark(X_train, y_train, nn, train_session, name='NN-CPU'))

lr = MLPRegressor(hidden_layer_sizes=tuple(), max_iter=max_iter,
                  solver='sgd', learning_rate_init=5e-2, alpha=0,
                  n_iter_no_change=max_iter * 3, batch_size=batch_size,
                  nesterovs_momentum=False, momentum=0,
                  learning_rate="invscaling")
with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    lr.fit(X, y)
onx = to_onnx(lr, X_train[:1].astype(numpy.float32), target_opset=15)
lr_session = OrtGradientForwardBackwardOptimizer(
    onx, device='cpu', learning_rate=5e-4,
    warm_start=False, max_iter=max_iter, batch_size=batch_size)
benches.append(benchmark(X_train, y_train, lr, lr_session, name='LR-CPU'))
'''


def test_example_benchmark_fwbw_regression(tmp_path):
    ns = run_example(tmp_path, REG_BENCH, MAX_ITER=3, N_ROWS=300)
    assert [b["iter_ort"] for b in ns["benches"]] == [3, 3]
    X, y = ns["X_train"], ns["y_train"]
    _check_against_reference(ns["train_session"], X, y)
    _check_against_reference(ns["lr_session"], X, y, activations="identity")


CLS_FWBW = '''
import numpy
import onnx
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from skl2onnx import to_onnx
from onnxcustom.utils.onnx_helper import onnx_rename_weights
from onnxcustom.training.optimizers_partial import (
    OrtGradientForwardBackwardOptimizer)
from onnxcustom.training.sgd_learning_rate import LearningRateSGDNesterov
from onnxcustom.training.sgd_learning_loss import NegLogLearningLoss
from onnxcustom.training.sgd_learning_penalty import ElasticLearningPenalty


def select_model_inputs_outputs(onx, outputs, infer_shapes=True):
    # mlprodict's function: the graph cut at the raw scores.
    needed, nodes = set(outputs), []
    for node in reversed(onx.graph.node):
        if needed & set(node.output):
            nodes.insert(0, node)
            needed |= set(node.input)
    graph = onnx.helper.make_graph(
        nodes, "cut", list(onx.graph.input),
        [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, [None, 1])
         for o in outputs],
        [i for i in onx.graph.initializer if i.name in needed])
    return onnx.helper.make_model(graph, opset_imports=list(onx.opset_import),
                                  ir_version=onx.ir_version)


X, y = make_classification(N_ROWS, n_features=N_FEATURES, n_classes=2, random_state=0)
X = X.astype(numpy.float32)
y = y.astype(numpy.int64)
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
batch_size = 15
max_iter = MAX_ITER

nn = MLPClassifier(hidden_layer_sizes=(50, 10), max_iter=max_iter,
                   solver='sgd', learning_rate_init=1e-1, alpha=1e-4,
                   n_iter_no_change=max_iter * 3, batch_size=batch_size,
                   nesterovs_momentum=True, momentum=0.9,
                   learning_rate="invscaling")
nn.fit(X_train, y_train)
onx = to_onnx(nn, X_train[:1].astype(numpy.float32), target_opset=15,
              options={'zipmap': False})
onx = select_model_inputs_outputs(onx, outputs=["add_result2"], infer_shapes=True)
onx = onnx_rename_weights(onx)
train_session = OrtGradientForwardBackwardOptimizer(
    onx, device='cpu', warm_start=False,
    max_iter=max_iter, batch_size=batch_size,
    learning_loss=NegLogLearningLoss(),
    learning_rate=LearningRateSGDNesterov(1e-5, nesterov=True, momentum=0.9),
    learning_penalty=ElasticLearningPenalty(l1=0, l2=1e-4))
train_session.fit(X_train, y_train)

nn = MLPClassifier(hidden_layer_sizes=tuple(), max_iter=max_iter,
                   solver='sgd', learning_rate_init=1e-1, alpha=1e-4,
                   n_iter_no_change=max_iter * 3, batch_size=batch_size,
                   nesterovs_momentum=True, momentum=0.9,
                   learning_rate="invscaling", activation='identity')
nn.fit(X_train, y_train)
onx = to_onnx(nn, X_train[:1].astype(numpy.float32), target_opset=15,
              options={'zipmap': False, 'nocl': True})
onx = select_model_inputs_outputs(onx, outputs=["add_result"], infer_shapes=True)
onx = onnx_rename_weights(onx)
lr_session = OrtGradientForwardBackwardOptimizer(
    onx, device='cpu', warm_start=False,
    max_iter=max_iter, batch_size=batch_size,
    learning_loss=NegLogLearningLoss(),
    learning_rate=LearningRateSGDNesterov(1e-5, nesterov=True, momentum=0.9),
    learning_penalty=ElasticLearningPenalty(l1=0, l2=1e-4))
lr_session.fit(X_train, y_train)
'''


def test_example_benchmark_fwbw_cls(tmp_path):
    ns = run_example(tmp_path, CLS_FWBW, MAX_ITER=3, N_ROWS=300, N_FEATURES=20)
    X, y = ns["X_train"], ns["y_train"]
    assert np.isfinite(ns["train_session"].train_losses_).all()
    _check_against_reference(ns["train_session"], X, y, penalty=(0, 1e-4))
    losses = _check_against_reference(ns["lr_session"], X, y, penalty=(0, 1e-4),
                                      activations="identity")
    # A log loss of raw scores drawn from a standard normal: around log(2) and above.
    assert losses[0] > 0.3


# ---------------------------------------------------------------- fit semantics

def _linear_model(n_features=3):
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    X, y = make_regression(80, n_features=n_features, bias=2, random_state=4)
    X, y = X.astype(np.float32), (y / 30).astype(np.float32)
    onx = to_onnx(LinearRegression().fit(X, y), X, black_op={"LinearRegressor"})
    return onx, X, y


@pytest.mark.parametrize("loss", ["square_error", "absolute_error",
                                  ElasticLearningLoss(l1_weight=0.2, l2_weight=0.8)])
def test_sample_weights_and_losses_against_reference(loss):
    onx, X, y = _linear_model()
    w = np.random.RandomState(5).rand(X.shape[0]).astype(np.float32)
    opt = OrtGradientForwardBackwardOptimizer(
        onx, max_iter=4, batch_size=8, learning_loss=loss, weight_name="weight",
        learning_rate=LearningRateSGD(eta0=0.05, learning_rate="optimal", alpha=0.01))
    _check_against_reference(opt, X, y, activations="identity", sample_weight=w)


def test_warm_start_starts_from_the_graph_weights():
    onx, X, y = _linear_model()
    # Start away from the least-squares solution the graph holds.
    onx = replace_initializers_into_onnx(onx, {
        i.name: numpy_helper.to_array(i) + 1 for i in onx.graph.initializer
        if i.name != "shape_tensor"})
    graph = [numpy_helper.to_array(i) for i in onx.graph.initializer if i.name != "shape_tensor"]
    opt = OrtGradientForwardBackwardOptimizer(onx, max_iter=2, batch_size=8, learning_rate=0.02,
                                              warm_start=True)
    for seed in (0, 1):   # onnxcustom restarted from the graph at every fit
        np.random.seed(seed)
        state = np.random.get_state()
        opt.fit(X, y)
        losses, weights = reference_fit(None, X, y, max_iter=2, batch_size=8,
                                        lr=LearningRateSGD(0.02), loss=SquareLearningLoss(),
                                        activations="identity",
                                        weights=[w.copy() for w in graph], rng_state=state)
        assert_close(opt.train_losses_, losses)
        for got, exp in zip(opt.get_state(), weights):
            assert_close(got.numpy(), exp)
    # Continuing means training the trained graph.
    opt2 = OrtGradientForwardBackwardOptimizer(opt.get_trained_onnx(), max_iter=1,
                                               batch_size=8, learning_rate=0.02,
                                               warm_start=True)
    np.random.seed(2)
    opt2.fit(X, y)
    assert opt2.train_losses_[0] < opt.train_losses_[0]


def test_divergence_raises_and_keeps_losses():
    onx, X, y = _linear_model()
    y = y * 1e3
    opt = OrtGradientForwardBackwardOptimizer(onx, max_iter=50, batch_size=8, learning_rate=5.0)
    np.random.seed(0)
    with pytest.raises(ConvergenceError, match="nan or infinite"):
        opt.fit(X, y)
    assert 0 < len(opt.train_losses_) < 50 and np.isfinite(opt.train_losses_).all()
    opt = OrtGradientForwardBackwardOptimizer(onx, max_iter=50, batch_size=8, learning_rate=5.0,
                                              exc=False)
    with pytest.warns(ConvergenceWarning):
        opt.fit(X, y)
    assert len(opt.train_losses_) == 50


def test_forward_backward_optimizer_in_a_grid_search():
    """scikit-learn >= 1.6 asks an estimator for its tags, and clone checks the constructor
    stored its arguments (they were copied: list(weights_to_train), a new device string)."""
    from sklearn.base import clone
    from sklearn.model_selection import GridSearchCV

    onx, X, y = _linear_model()
    opt = OrtGradientForwardBackwardOptimizer(onx, ["coef", "intercept"], max_iter=5,
                                              batch_size=8, device="cpu")
    twin = clone(opt)  # raised: the constructor "modified" weights_to_train and device
    assert twin.get_params()["weights_to_train"] == ["coef", "intercept"]
    assert twin.get_params()["device"] == "cpu"
    search = GridSearchCV(opt, {"batch_size": [8, 16]}, cv=2).fit(X, y)
    assert search.best_params_["batch_size"] in (8, 16)
    assert len(search.best_estimator_.train_losses_) == 5


def test_validation_losses_score_and_errors():
    onx, X, y = _linear_model()
    opt = OrtGradientForwardBackwardOptimizer(onx, max_iter=10, batch_size=8, learning_rate=0.05,
                                              validation_every=0.5)
    assert opt.validation_every == 5
    opt.fit(X[:60], y[:60], X_val=X[60:], y_val=y[60:])
    coef, intercept = (w.numpy() for w in opt.get_state())
    err = (X[60:] @ coef + intercept).ravel() - y[60:]
    assert len(opt.validation_losses_) == 2
    assert_close(opt.validation_losses_[-1], 0.5 * (err.astype(np.float64) ** 2).sum() / 20)
    assert_close(opt.losses(X[60:], y[60:]), err ** 2)
    assert_close(opt.score(X[60:], y[60:]), -(err.astype(np.float64) ** 2).mean())
    assert set(opt.trained_coef_) == {"coef", "intercept"}
    with pytest.raises(NotImplementedError, match="SGDOptimizer"):
        OrtGradientForwardBackwardOptimizer(onx, training_optimizer_name="Adam").fit(X, y)
    params = opt.get_params()
    assert params["device"] == "cpu" and params["max_iter"] == 10


def test_forward_backward_of_a_graph_without_loss():
    onx, X, _ = _linear_model()
    fb = OrtGradientForwardBackward(onx)
    assert fb.weights_to_train == ["coef", "intercept"]
    fn = fb.new_instance()
    coef, intercept = fb.get_initializer("coef"), fb.get_initializer("intercept")
    (pred,) = fn.forward([X, coef, intercept], training=True)
    assert_close(pred.numpy(), X @ coef + intercept)
    g = np.random.RandomState(0).randn(*pred.shape()).astype(np.float32)
    gx, gcoef, gint = fn.backward([g])
    assert_close(gx.numpy(), g @ coef.T)
    assert_close(gcoef.numpy(), X.T @ g)
    assert_close(gint.numpy(), g.sum(axis=0))
    with pytest.raises(ValueError, match="onnx_rename_weights"):
        OrtGradientForwardBackward(onx, weights_to_train=["intercept", "coef"])
    with pytest.raises(RuntimeError, match="forward"):
        fn.backward([g])


def test_forward_backward_whose_backward_reads_a_graph_output():
    """A classifier's last activation (a Sigmoid) is an output the backward reads: it was
    bound twice, and the backward lost a saved value (KeyError)."""
    from onnx import TensorProto, helper

    from ortlearn.graph import make_model

    rng = np.random.RandomState(0)
    X = rng.randn(8, 3).astype(np.float32)
    coef, intercept = rng.randn(3, 1).astype(np.float32), np.array([0.1], np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "coef"], ["z0"]),
         helper.make_node("Add", ["z0", "intercept"], ["z"]),
         helper.make_node("Sigmoid", ["z"], ["probabilities"])], "clf",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(coef, "coef"), numpy_helper.from_array(intercept, "intercept")])
    fb = OrtGradientForwardBackward(make_model(graph, [helper.make_opsetid("", 18)]))
    fn = fb.new_instance()
    (proba,) = fn.forward([X, fb.get_initializer("coef"), fb.get_initializer("intercept")],
                          training=True)
    p = 1 / (1 + np.exp(-(X @ coef + intercept)))
    assert_close(proba.numpy(), p)
    g = rng.randn(8, 1).astype(np.float32)
    gx, gcoef, gint = fn.backward([g])
    dz = g * p * (1 - p)
    assert_close(gcoef.numpy(), X.T @ dz)
    assert_close(gint.numpy(), dz.sum(axis=0))
    assert_close(gx.numpy(), dz @ coef.T)


# ---------------------------------------------------------------- data loader, helpers

def test_data_loader_batches():
    X = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.arange(20, dtype=np.float32)
    w = np.ones(20, dtype=np.float32)
    np.random.seed(3)
    starts = [np.random.randint(0, 20 - 6) for _ in range(4)]
    np.random.seed(3)
    batches = list(OrtDataLoader(X, y, w, batch_size=6).iter_ortvalue())
    assert len(batches) == 4 and all(len(b) == 3 for b in batches)
    for (xb, yb, _), i in zip(batches, starts):
        assert_close(xb.numpy(), X[i:i + 6])
        assert_close(yb.numpy(), y[i:i + 6].reshape(-1, 1))
    a = [x[0, 0] for x, _ in OrtDataLoader(X, y, batch_size=6, random_state=0).iter_numpy()]
    b = [x[0, 0] for x, _ in OrtDataLoader(X, y, batch_size=6, random_state=0).iter_numpy()]
    assert a == b
    seq = OrtDataLoader(X, y, batch_size=6, random_iter=False)
    assert [x[0, 1] for x, _ in seq.iter_numpy()] == [1.0, 13.0, 25.0, 29.0]
    assert len(seq) == 20 and len(list(OrtDataLoader(X, y, batch_size=30).iter_numpy())) == 1

    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "Y"], ["Z"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2]),
         helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [None, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    bind = sess.io_binding()
    bind.bind_output("Z")
    sizes = []
    for n in seq.iter_bind(bind, ["X", "Y", "lr"]):
        sess.run_with_iobinding(bind)
        sizes.append(n)
    assert sizes == [6, 6, 6, 6]
    assert_close(bind.copy_outputs_to_cpu()[0], X[14:20] + y[14:20, None])


def test_onnxruntime_and_onnx_helpers():
    assert provider_to_device("CUDAExecutionProvider") == "cuda"
    assert device_to_providers("cpu") == ["CPUExecutionProvider"]
    assert ort_device_to_string(get_ort_device("cpu")) == "cpu"
    assert_close(numpy_to_ort_value(np.arange(3.0)).numpy(), np.arange(3.0))
    with pytest.raises(ValueError):
        provider_to_device("TensorrtExecutionProvider")
    from onnx import TensorProto, helper

    inits = [numpy_helper.from_array(np.full((1,), i, np.float32), f"w{i}") for i in range(12)]
    nodes = [helper.make_node("Add", ["X" if i == 0 else f"y{i - 1}", f"w{i}"], [f"y{i}"])
             for i in range(12)]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y11", TensorProto.FLOAT, [None])],
                              inits)
    onx = onnx_rename_weights(helper.make_model(graph))
    names = [i.name for i in onx.graph.initializer]
    assert names[:2] == ["I00_w0", "I01_w1"] and names[-1] == "I11_w11"
    assert names == sorted(names) and onx.graph.node[3].input[1] == "I03_w3"
    assert get_onnx_opset(onx) == onx.opset_import[0].version
    assert proto_type_to_dtype(TensorProto.FLOAT) is np.float32
    new = replace_initializers_into_onnx(onx, {"I05_w5": np.array([7.0], np.float32)})
    assert numpy_helper.to_array(new.graph.initializer[5])[0] == 7.0
    assert numpy_helper.to_array(onx.graph.initializer[5])[0] == 5.0


def test_save_onnx_graph(tmp_path):
    import onnx

    onx, X, y = _linear_model()
    opt = OrtGradientForwardBackwardOptimizer(
        onx, max_iter=1, learning_rate=LearningRateSGDNesterov(1e-3),
        learning_penalty=ElasticLearningPenalty(l1=1e-3, l2=1e-3))
    opt.fit(X, y)
    graphs = opt.save_onnx_graph(bytes)
    axpyw = onnx.load_from_string(graphs["learning_rate"]["axpyw_onnx_"])
    assert [o.name for o in axpyw.graph.output] == ["Y", "Z"]
    backward = onnx.load_from_string(graphs["train_session_"]["cls_type_"]["_trained_onnx"])
    assert [o.name for o in backward.graph.output] == ["X_grad", "coef_grad", "intercept_grad"]
    files = opt.save_onnx_graph(str(tmp_path))
    assert files["model_onnx"].endswith("GradFBOptimizer.model_onnx.onnx")
    assert onnx.load(files["learning_penalty"]["penalty_onnx_"]).graph.input[0].name == "loss"


def test_logging_writes_onnxcustoms_lines(caplog):
    """With enable_logging, the 'onnxcustom' logger gets onnxcustom's lines: the weights to
    train when the gradient class is built, and at DEBUG each iteration and batch."""
    import logging

    onx, X, y = _linear_model()
    opt = OrtGradientForwardBackwardOptimizer(onx, max_iter=2, batch_size=40,
                                              enable_logging=True)
    with caplog.at_level(logging.DEBUG, logger="onnxcustom"):
        opt.fit(X, y)
    text = caplog.text
    assert "[OrtGradientForwardBackward] weights_to_train=" in text
    assert text.count("[OrtGradientForwardBackwardOptimizer._iteration] iteration begin") == 2
    assert text.count("[OrtGradientForwardBackwardOptimizer._iteration] batch ") == 4
    assert all(r.name == "onnxcustom" for r in caplog.records)


def test_saved_penalty_graphs_hold_their_hyper_parameters_as_initializers():
    """As onnxcustom's: l1 and l2 are initializers with ``float_data`` (a test of onnxcustom
    finds l1 = 0 in both saved penalty graphs), not values of Constant nodes."""
    import onnx

    onx, X, y = _linear_model()
    opt = OrtGradientForwardBackwardOptimizer(
        onx, max_iter=1, learning_rate=LearningRateSGDNesterov(1e-3),
        learning_penalty=ElasticLearningPenalty(l1=0.0, l2=1e-3))
    opt.fit(X, y)
    graphs = opt.save_onnx_graph(bytes)["learning_penalty"]
    for name in ("penalty_onnx_", "penalty_grad_onnx_"):
        model = onnx.load_from_string(graphs[name])
        values = {i.name: list(i.float_data) for i in model.graph.initializer}
        assert values["l1"] == [0.0], name
    assert values["shrink"] == [np.float32(1 - 2e-3)]


def test_pickle_round_trip():
    import pickle

    onx, X, y = _linear_model()
    opt = OrtGradientForwardBackwardOptimizer(
        onx, max_iter=2, batch_size=8, learning_rate=LearningRateSGDNesterov(1e-3),
        learning_penalty=ElasticLearningPenalty(l1=1e-3, l2=1e-3))
    np.random.seed(0)
    opt.fit(X, y)
    copy = pickle.loads(pickle.dumps(opt))
    for a, b in zip(opt.get_state(), copy.get_state()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert copy.train_losses_ == opt.train_losses_
    np.random.seed(1)
    opt.fit(X, y)
    np.random.seed(1)
    copy.fit(X, y)
    assert copy.train_losses_ == opt.train_losses_


def test_values_and_devices_are_onnxcustoms_pybind_objects():
    """onnxcustom handed out onnxruntime's pybind ``OrtValue``/``OrtDevice`` (its
    "C_OrtValue"): code that tests for them, or builds values on ``opt.device``, runs."""
    from onnxruntime.capi._pybind_state import OrtDevice as C_OrtDevice
    from onnxruntime.capi._pybind_state import OrtValue as C_OrtValue
    from sklearn.base import clone

    onx, X, y = _linear_model()
    loader = OrtDataLoader(X, y, batch_size=8)
    assert all(isinstance(v, C_OrtValue) for batch in loader.iter_ortvalue() for v in batch)
    assert all(isinstance(v, C_OrtValue) for v in loader.data_ort)
    assert isinstance(loader.device, C_OrtDevice)
    assert isinstance(numpy_to_ort_value(X), C_OrtValue)
    opt = OrtGradientForwardBackwardOptimizer(onx, max_iter=2, batch_size=8, learning_rate=0.02,
                                              device=get_ort_device("cpu"))
    value = C_OrtValue.ortvalue_from_numpy(X, opt.device)  # as onnxcustom's examples did
    np.testing.assert_array_equal(value.numpy(), X)
    np.random.seed(0)
    opt.fit(X, y)
    state = opt.get_state()
    assert all(isinstance(v, C_OrtValue) for v in state)
    assert all(isinstance(v, C_OrtValue) for v in opt.trained_coef_.values())
    full = opt.get_full_state()
    assert full[0] is None and all(isinstance(v, C_OrtValue) for v in full[1:])
    # what get_state handed out is taken back: the same weights, then the same training
    opt.set_state(full)
    for a, b in zip(opt.get_state(), state):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    twin = clone(opt)
    assert isinstance(twin.device, C_OrtDevice) and twin.get_params()["device"] == "cpu"
