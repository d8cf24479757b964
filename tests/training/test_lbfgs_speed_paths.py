"""The speed paths of full-batch L-BFGS give the numbers of the plain ones.

W4 (``doc/performance_notes.rst``, the section on W4's full-batch L-BFGS): the
full-batch objective of one column works on (N,) vectors, and scipy's
L-BFGS-B runs with one BLAS thread. No timing here: the loss, the gradient,
the iterations and the weights are those of the (N, 1) objective and of
float64 re-computations.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from sklearn.datasets import make_classification, make_regression
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_info, threadpool_limits

from ortlearn.estimators import OrtLinearClassifier, OrtLinearRegressor
from ortlearn.estimators._objective import sgd_objective
from ortlearn.training import lbfgs, loss_and_gradient, minimize_lbfgs
from ortlearn.training.device import single_thread_blas
from ortlearn.training.lbfgs import _data_read_transposed

# the fits that only give an inference graph, and the callback test, stop early on purpose
pytestmark = pytest.mark.filterwarnings("ignore::ortlearn.exceptions.ConvergenceWarning")

ELEMENTWISE = {"Abs", "Add", "Sub", "Mul", "Div", "Neg", "Exp", "Log", "Sign", "Sum", "Min"}


@pytest.fixture(scope="module")
def binary():
    X, y = make_classification(n_samples=3000, n_features=12, n_informative=6, random_state=0)
    X = X.astype(np.float32)
    est = OrtLinearClassifier(solver="lbfgs", max_iter=2, tol=1e-4).fit(X, y)
    return X, y, est._inference_model()


def _objective(inference, flat, kind="binary", **kwargs):
    return sgd_objective(inference, kind, loss=kwargs.pop("loss", "log_loss"),
                         alpha=kwargs.pop("alpha", 1e-3), sum_in_float64=True,
                         weighted=kwargs.pop("weighted", False), flat=flat, **kwargs)


def _ranks(model):
    inferred = onnx.shape_inference.infer_shapes(model)
    return {v.name: len(v.type.tensor_type.shape.dim) for v in inferred.graph.value_info
            if v.type.tensor_type.HasField("shape")}


def test_full_batch_objective_is_elementwise_on_vectors(binary):
    X, y, inference = binary
    flat = _objective(inference, None)
    ranks = _ranks(flat)
    after_product = [n for n in flat.graph.node if n.op_type in ELEMENTWISE
                     and not n.output[0].startswith(("multiplied", "decision"))]
    assert after_product and all(ranks[n.output[0]] <= 1 for n in after_product)
    # the (N, 1) form is what the mini-batch step graphs keep
    plain = sgd_objective(inference, "binary", loss="log_loss", alpha=1e-3)
    assert max(_ranks(plain)[n.output[0]] for n in plain.graph.node
               if n.op_type in ELEMENTWISE and n.output[0] in _ranks(plain)) == 2


@pytest.mark.parametrize("weighted", [False, True])
def test_vector_objective_gives_the_loss_and_gradient_of_the_column_one(binary, weighted):
    X, y, inference = binary
    rng = np.random.default_rng(0)
    sw = rng.uniform(0.5, 2.0, len(X)).astype(np.float32)
    arrays = [X, y.astype(np.float32).reshape(-1, 1)] + ([sw] if weighted else [])
    names = ["X", "y"] + (["sample_weight"] if weighted else [])
    x = rng.normal(size=X.shape[1] + 1) * 0.3
    values = {}
    for flat in (False, True):
        fun, _ = loss_and_gradient(_objective(inference, flat, weighted=weighted),
                                   ["coef", "intercept"], None, arrays, names)
        values[flat] = fun(x)
    assert values[True][0] == values[False][0]
    np.testing.assert_array_equal(values[True][1], values[False][1])
    # and they are the float64 objective's, to float32 precision
    w, b = x[:-1], x[-1]
    z = X.astype(np.float64) @ w + b
    s = sw if weighted else np.ones(len(X))
    loss = np.mean(s * (np.logaddexp(0, z) - y * z)) + 0.5e-3 * w @ w
    d = s * (1 / (1 + np.exp(-z)) - y) / len(X)
    np.testing.assert_allclose(values[True][0], loss, rtol=1e-6)
    np.testing.assert_allclose(values[True][1], np.r_[X.T @ d + 1e-3 * w, d.sum()],
                               rtol=1e-4, atol=1e-6)


def test_vector_objective_takes_the_iterations_of_the_column_one(binary):
    X, y, inference = binary
    arrays = [X, y.astype(np.float32).reshape(-1, 1)]
    runs = {flat: minimize_lbfgs(_objective(inference, flat, alpha=1 / len(X)),
                                 ["coef", "intercept"], None, arrays, ["X", "y"],
                                 max_iter=200, tol=1e-4)
            for flat in (False, True)}
    assert runs[True].n_iter == runs[False].n_iter > 3
    assert runs[True].loss == runs[False].loss
    for name in ("coef", "intercept"):
        np.testing.assert_array_equal(runs[True].weights[name], runs[False].weights[name])
    # LogisticRegression's objective (mean log-loss + ||w||^2 / (2 C n)) within its tol
    ref = LogisticRegression(C=1.0, tol=1e-4).fit(X, y)
    w = ref.coef_.ravel()
    z = X.astype(np.float64) @ w + ref.intercept_[0]
    expected = np.mean(np.logaddexp(0, z) - y * z) + 0.5 / len(X) * w @ w
    np.testing.assert_allclose(runs[True].loss, expected, rtol=1e-6)
    assert abs(runs[True].n_iter - ref.n_iter_[0]) <= 3


def test_regressor_vector_objective_gives_the_numbers_of_the_column_one():
    X, y = make_regression(n_samples=2000, n_features=8, noise=5.0, random_state=0)
    X, y = X.astype(np.float32), (y / y.std()).astype(np.float32)
    inference = OrtLinearRegressor(solver="lbfgs", max_iter=2).fit(X, y)._inference_model()
    arrays = [X, y.reshape(-1, 1)]
    runs = {flat: minimize_lbfgs(_objective(inference, flat, kind="regressor",
                                            loss="squared_error"),
                                 ["coef", "intercept"], None, arrays, ["X", "y"],
                                 max_iter=100, tol=1e-6)
            for flat in (False, True)}
    assert runs[True].n_iter == runs[False].n_iter and runs[True].loss == runs[False].loss
    np.testing.assert_array_equal(runs[True].weights["coef"], runs[False].weights["coef"])


def _blas_threads():
    return {info["filepath"]: info["num_threads"] for info in threadpool_info()
            if info["user_api"] == "blas"}


def test_lbfgs_runs_scipy_with_one_blas_thread_and_restores_the_setting(binary):
    X, y, inference = binary
    seen = []

    def callback(weights):
        seen.append(_blas_threads())
        return False

    with threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        if not before:
            pytest.skip("no BLAS library that threadpoolctl controls")
        minimize_lbfgs(_objective(inference, None), ["coef", "intercept"], None,
                       [X, y.astype(np.float32).reshape(-1, 1)], ["X", "y"], max_iter=3,
                       callback=callback)
        assert _blas_threads() == before
    assert seen and all(set(threads.values()) == {1} for threads in seen)
    with threadpool_limits(limits=2, user_api="blas"), single_thread_blas():
        assert set(_blas_threads().values()) == {1}


def test_data_read_transposed_gives_the_numbers_of_the_plain_products(binary, monkeypatch):
    X, y, inference = binary
    arrays = [X, y.astype(np.float32).reshape(-1, 1)]
    model = _objective(inference, None, alpha=1 / len(X))
    fast, _ = loss_and_gradient(model, ["coef", "intercept"], None, arrays, ["X", "y"])
    # the session reads X^T (F, N): the input renamed, its shape transposed
    inputs = {i.name: i.shape for i in fast._session.get_inputs()}
    assert "X" not in inputs and inputs["X_transposed"] == [X.shape[1], "N"]
    runs = {True: minimize_lbfgs(model, ["coef", "intercept"], None, arrays, ["X", "y"],
                                 max_iter=200, tol=1e-4)}
    monkeypatch.setattr(lbfgs, "_TRANSPOSED_COPY_MAX_BYTES", 0)
    plain, _ = loss_and_gradient(model, ["coef", "intercept"], None, arrays, ["X", "y"])
    assert "X" in {i.name for i in plain._session.get_inputs()}
    runs[False] = minimize_lbfgs(model, ["coef", "intercept"], None, arrays, ["X", "y"],
                                 max_iter=200, tol=1e-4)
    x = np.random.default_rng(1).normal(size=X.shape[1] + 1) * 0.3
    (loss_fast, grad_fast), (loss_plain, grad_plain) = fast(x), plain(x)
    # float32 products in another order, summed in float64
    np.testing.assert_allclose(loss_fast, loss_plain, rtol=1e-7)
    np.testing.assert_allclose(grad_fast, grad_plain, rtol=1e-5, atol=1e-7)
    # a product of another summation order: the objective within LogisticRegression's tol
    assert abs(runs[True].n_iter - runs[False].n_iter) <= 1
    np.testing.assert_allclose(runs[True].loss, runs[False].loss, rtol=1e-7)
    np.testing.assert_allclose(runs[True].weights["coef"], runs[False].weights["coef"],
                               atol=1e-4)


def test_data_read_transposed_leaves_wider_weights_and_other_readers_alone():
    def grad_model(width, extra_reader):
        nodes = [onnx.helper.make_node("MatMul", ["X", "w"], ["p"]),
                 onnx.helper.make_node("Transpose", ["X"], ["xt"], perm=[1, 0]),
                 onnx.helper.make_node("MatMul", ["xt", "p"], ["g"])]
        outputs = ["g"]
        if extra_reader:
            nodes.append(onnx.helper.make_node("ReduceSum", ["X"], ["s"]))
            outputs.append("s")
        graph = onnx.helper.make_graph(
            nodes, "g", [onnx.helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT,
                                                            ["N", 3]),
                         onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT,
                                                            [3, width])],
            [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None)
             for o in outputs])
        return onnx.helper.make_model(graph)

    for width, extra in ((2, False), (1, True)):
        model = grad_model(width, extra)
        assert _data_read_transposed(model, ["X"], {"w": (3, width)}) == {}
        assert [n.op_type for n in model.graph.node][:3] == ["MatMul", "Transpose", "MatMul"]
    model = grad_model(1, False)
    assert _data_read_transposed(model, ["X"], {"w": (3, 1)}) == {"X": "X_transposed"}
    assert "Transpose" not in [n.op_type for n in model.graph.node]
    rng = np.random.default_rng(0)
    X, w = rng.normal(size=(7, 3)).astype(np.float32), rng.normal(size=(3, 1)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (g,) = session.run(None, {"X_transposed": np.ascontiguousarray(X.T), "w": w})
    np.testing.assert_allclose(g, X.T @ (X @ w), rtol=1e-5)
