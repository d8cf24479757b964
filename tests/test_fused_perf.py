"""The cheaper forms of the fused step (performance round 2) give the same numbers."""

import numpy as np
import onnx
import pytest
from conftest import run_onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import make_classification

from ortlearn._onnx_helper import value_info_map
from ortlearn.estimators import OrtLinearClassifier, OrtMLPRegressor
from ortlearn.estimators._engine import TrainingEngine, _batches, default_session_options
from ortlearn.estimators._fused_step import (
    _column_sums_as_products,
    _common_factors,
    _masks_as_products,
    _negations_folded,
    build_fused_step,
)
from ortlearn.estimators._objective import sgd_objective
from ortlearn.optim import SGD, Adam
from ortlearn.training.device import Device


def _where_graph(dtype):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    zero = numpy_helper.from_array(np.array(0, dtype=dtype), "zero")
    nodes = [helper.make_node("Constant", [], ["z"], value=zero),
             helper.make_node("Greater", ["x", "z"], ["c"]),
             helper.make_node("Where", ["c", "g", "z"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, [None, 3]),
                                           helper.make_tensor_value_info("g", elem, [None, 3])],
                              [helper.make_tensor_value_info("out", elem, [None, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_where_masks_become_products_of_the_same_value(dtype):
    model = _where_graph(dtype)
    rs = np.random.RandomState(0)
    feeds = {"x": rs.randn(7, 3).astype(dtype), "g": rs.randn(7, 3).astype(dtype)}
    expected = run_onnx(model, feeds)[0]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    nodes = _masks_as_products(list(model.graph.node))
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    onnx.checker.check_model(rewritten)
    assert [n.op_type for n in nodes] == ["Constant", "Greater", "Cast", "Mul"]
    got = run_onnx(rewritten, feeds)[0]
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.where(feeds["x"] > 0, feeds["g"], 0))
    np.testing.assert_array_equal(got, expected)


def test_a_where_with_a_nonzero_branch_is_kept():
    model = _where_graph(np.float32)
    model.graph.node[0].attribute[0].t.CopyFrom(
        numpy_helper.from_array(np.array(1, dtype=np.float32), "one"))
    assert [n.op_type for n in _masks_as_products(list(model.graph.node))][-1] == "Where"


def _float_graph(nodes, inputs: dict, outputs: dict, opset=18, initializers=()):
    """A float64 model of ``nodes``; ``inputs`` and ``outputs`` map names to shapes."""
    f = TensorProto.DOUBLE
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info(n, f, s) for n, s in inputs.items()],
                              [helper.make_tensor_value_info(n, f, s) for n, s in outputs.items()],
                              list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _with_nodes(model, nodes):
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    onnx.checker.check_model(rewritten)
    return rewritten


def test_a_negated_product_or_quotient_of_a_constant_negates_the_constant():
    c = numpy_helper.from_array(np.array([0.5, -2.0, 3.0]), "c")
    nodes = [helper.make_node("Constant", [], ["c"], value=c),
             helper.make_node("Div", ["c", "x"], ["q"]),
             helper.make_node("Neg", ["q"], ["nq"]),
             helper.make_node("Mul", ["x", "c"], ["p"]),
             helper.make_node("Neg", ["p"], ["np"]),
             helper.make_node("Mul", ["x", "x"], ["xx"]),   # no constant: kept
             helper.make_node("Neg", ["xx"], ["nxx"]),
             helper.make_node("Div", ["c", "x"], ["q2"]),   # read twice: kept
             helper.make_node("Neg", ["q2"], ["nq2"]),
             helper.make_node("Add", ["q2", "nq2"], ["zero"])]
    outputs = {"nq": [2, 3], "np": [2, 3], "nxx": [2, 3], "zero": [2, 3]}
    model = _float_graph(nodes, {"x": [2, 3]}, outputs)
    constants = {"c": numpy_helper.to_array(c)}
    folded = _negations_folded(nodes, constants, list(outputs))
    assert [n.op_type for n in folded].count("Neg") == 2  # of x * x and of the shared c / x
    feeds = {"x": np.random.RandomState(0).randn(2, 3)}
    expected = run_onnx(model, feeds)
    for got, want in zip(run_onnx(_with_nodes(model, folded), feeds), expected):
        np.testing.assert_array_equal(got, want)  # negation is exact


@pytest.mark.parametrize("op", ["Sub", "Add"])
def test_a_factor_shared_by_two_products_is_taken_out(op):
    nodes = [helper.make_node("Mul", ["a", "s"], ["as"]),
             helper.make_node("Mul", ["s", "b"], ["bs"]),
             helper.make_node(op, ["as", "bs"], ["out"]),
             helper.make_node("Mul", ["a", "b"], ["ab"]),     # read twice: kept
             helper.make_node("Mul", ["a", "s"], ["as2"]),
             helper.make_node(op, ["ab", "as2"], ["out2"]),
             helper.make_node(op, ["ab", "ab"], ["out3"])]
    inputs = {"a": [3, 4], "b": [1, 4], "s": [3, 1]}
    outputs = {"out": [3, 4], "out2": [3, 4], "out3": [3, 4]}
    model = _float_graph(nodes, inputs, outputs)
    factored = _common_factors(nodes, list(outputs))
    assert [n.op_type for n in factored] == [op, "Mul"] + [n.op_type for n in nodes[3:]]
    rs = np.random.RandomState(0)
    feeds = {k: rs.randn(*shape) for k, shape in inputs.items()}
    a, b, s = feeds["a"], feeds["b"], feeds["s"]
    got = run_onnx(_with_nodes(model, factored), feeds)
    combine = np.subtract if op == "Sub" else np.add
    np.testing.assert_array_equal(got[0], combine(a, b) * s)
    np.testing.assert_allclose(got[0], combine(a * s, b * s), rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(got[1], combine(a * b, a * s))


@pytest.mark.parametrize("opset, gathers", [(13, 1), (18, 0)])
def test_column_sums_become_products_at_every_opset(opset, gathers):
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [helper.make_node("Constant", [], ["axes"], value=axes),
             helper.make_node("ReduceSum", ["x", "axes"], ["sums"], keepdims=1),
             helper.make_node("ReduceSum", ["x", "axes"], ["flat"], keepdims=0)]
    model = _float_graph(nodes, {"x": ["n", 40]}, {"sums": [1, 40], "flat": [40]}, opset)
    rewritten = _column_sums_as_products(nodes, value_info_map(model), opset)
    ops = [n.op_type for n in rewritten]
    assert "ReduceSum" not in ops and ops.count("MatMul") == 2
    assert ops.count("Gather") == 2 * gathers
    x = np.random.RandomState(0).randn(7, 40)
    sums, flat = run_onnx(_with_nodes(model, rewritten), {"x": x})
    np.testing.assert_allclose(sums, x.sum(axis=0, keepdims=True), rtol=1e-13)
    np.testing.assert_allclose(flat, x.sum(axis=0), rtol=1e-13)


def _mlp_engine(optimizer, loop):
    rs = np.random.RandomState(0)
    X = rs.randn(60, 4)
    y = X @ rs.randn(4) + 0.1 * rs.randn(60)
    est = OrtMLPRegressor(hidden_layer_sizes=(5,), max_iter=1, random_state=0).fit(
        X, y, sample_weight=np.ones(60))
    engine = est._runtime.engine
    model, trainable = engine._model, engine.trainable
    arrays = [X, y.reshape(-1, 1), np.ones(60)]
    return TrainingEngine(model, trainable, optimizer, input_names=engine.input_names,
                          epoch_loop=loop), arrays


def test_stateful_optimizers_keep_weights_and_state_in_flat_buffers():
    engine, _ = _mlp_engine(Adam(), False)
    model, layout = build_fused_step(engine._model, engine.trainable, engine.input_names,
                                     Adam())
    # one buffer for the 4 weights of the MLP, one per moment; no weight is an input
    assert len({layout.weights[p] for p in engine.trainable}) == 1
    assert len({layout.states[p]["exp_avg"] for p in engine.trainable}) == 1
    assert not {i.name for i in model.graph.input} & set(engine.trainable)
    sizes = {p: int(np.prod(s)) for p, (_, s) in layout.offsets.items()}
    offsets = [layout.offsets[p][0] for p in engine.trainable]
    assert offsets == list(np.cumsum([0] + [sizes[p] for p in engine.trainable])[:-1])
    # SGD without momentum has no state: nothing to flatten
    _, plain = build_fused_step(engine._model, engine.trainable, engine.input_names, SGD())
    assert plain.offsets == {}


@pytest.mark.parametrize("loop", [False, True])
def test_flat_optimizer_state_reads_and_writes_per_weight(loop):
    engine, arrays = _mlp_engine(Adam(), loop)
    engine.set_learning_rate(0.01)
    engine.train_epoch(arrays, _batches(60, 16, np.random.RandomState(0)))
    state = engine.optimizer_state()
    for p, w in engine.get_state().items():
        assert state["states"][p]["exp_avg"].shape == w.shape
        assert np.abs(state["states"][p]["exp_avg_sq"]).sum() > 0
    # a fresh engine loaded with the state continues exactly as the first one
    other, _ = _mlp_engine(Adam(), not loop)
    other.set_state(engine.get_state())
    other.load_optimizer_state(state)
    batches = _batches(60, 16, np.random.RandomState(1))
    engine.train_epoch(arrays, batches)
    other.train_epoch(arrays, batches)
    for p, w in engine.get_state().items():
        np.testing.assert_allclose(other.get_state()[p], w, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(other.optimizer_state()["states"][p]["exp_avg"],
                               engine.optimizer_state()["states"][p]["exp_avg"],
                               rtol=1e-12, atol=1e-15)
    # the loss of the flat weights is the one of the same weights held one by one
    plain, _ = _mlp_engine(SGD(), loop)
    plain.set_state(engine.get_state())
    assert plain._steps[plain._current][1].offsets == {}
    assert engine.eval_loss(arrays) == plain.eval_loss(arrays)


def test_float64_loss_sums_a_float32_objective_in_float64():
    X, y = make_classification(n_samples=300, n_features=5, random_state=0)
    X = X.astype(np.float32)
    est = OrtLinearClassifier(solver="lbfgs", loss="log_loss", max_iter=3).fit(X, y)
    inference = est._inference_model()
    plain = sgd_objective(inference, "binary", loss="log_loss", alpha=0.01)
    precise = sgd_objective(inference, "binary", loss="log_loss", alpha=0.01,
                            sum_in_float64=True)
    assert plain.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert precise.graph.output[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    feeds = {"X": X, "y": y.astype(np.float32).reshape(-1, 1),
             "sample_weight": np.ones(len(X), np.float32)}
    w = est.coef_.astype(np.float64).ravel()
    z = X.astype(np.float64) @ w + float(np.ravel(est.intercept_)[0])
    expected = np.mean(np.logaddexp(0, z) - y * z) + 0.01 * 0.5 * w @ w
    loss64 = run_onnx(precise, feeds)[0]
    assert loss64.dtype == np.float64
    np.testing.assert_allclose(loss64, expected, rtol=1e-6)
    np.testing.assert_allclose(run_onnx(plain, feeds)[0], loss64, rtol=1e-6)


def test_float32_lbfgs_reaches_the_float64_objective():
    X, y = make_classification(n_samples=2000, n_features=20, random_state=0)
    fits = {dtype: OrtLinearClassifier(solver="lbfgs", loss="log_loss", alpha=1e-3,
                                       tol=1e-6, max_iter=200).fit(X.astype(dtype), y)
            for dtype in (np.float32, np.float64)}
    np.testing.assert_allclose(fits[np.float32].loss_, fits[np.float64].loss_, rtol=1e-6)
    # a float64 loss keeps scipy's line search from stalling on float32 noise
    assert fits[np.float32].n_iter_ <= fits[np.float64].n_iter_ + 3


SPIN = "session.intra_op.allow_spinning"


@pytest.mark.parametrize("batch_size, threads, spinning", [
    (8, 1, "0"),             # 8 x 31 weights: one thread, nothing to spin
    (None, 1, "0"),          # 200 rows assumed
    (40_000, 0, "1"),        # 1.24 M multiply-adds: onnxruntime's threads, spinning
])
def test_threads_follow_the_work_of_a_step(monkeypatch, batch_size, threads, spinning):
    monkeypatch.delenv("ORTLEARN_ALLOW_SPINNING", raising=False)
    monkeypatch.delenv("ORTLEARN_NUM_THREADS", raising=False)
    base, _ = _mlp_engine(SGD(), False)
    engine = TrainingEngine(base._model, base.trainable, SGD(), input_names=base.input_names,
                            batch_size=batch_size)
    options = engine._session_options
    assert options.intra_op_num_threads == threads
    assert options.get_session_config_entry(SPIN) == spinning


def test_spinning_can_be_turned_off_and_is_checked(monkeypatch):
    base, _ = _mlp_engine(SGD(), False)

    def options():
        return TrainingEngine(base._model, base.trainable, SGD(), input_names=base.input_names,
                              batch_size=40_000)._session_options

    monkeypatch.setenv("ORTLEARN_ALLOW_SPINNING", "0")
    monkeypatch.setenv("ORTLEARN_NUM_THREADS", "2")
    assert options().get_session_config_entry(SPIN) == "0"
    assert options().intra_op_num_threads == 2
    monkeypatch.setenv("ORTLEARN_ALLOW_SPINNING", "yes")
    with pytest.raises(ValueError, match="ORTLEARN_ALLOW_SPINNING must be 0 or 1"):
        options()


def test_deterministic_kernels_are_asked_on_a_gpu_only():
    cuda, cpu = Device("cuda"), Device("cpu")
    assert default_session_options(cuda, 10, deterministic=True).use_deterministic_compute
    assert not default_session_options(cuda, 10).use_deterministic_compute
    # the CPU kernels are deterministic for a thread count; the option only slows them
    for macs in (10, 10**7):
        assert not default_session_options(cpu, macs, True).use_deterministic_compute


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("random_state, expected", [(0, True), (None, False)])
def test_a_random_state_asks_for_reproducible_training(monkeypatch, random_state, expected):
    import ortlearn.estimators._base as base_module
    import ortlearn.estimators._engine as engine_module

    asked = []
    options = engine_module.default_session_options
    monkeypatch.setattr(engine_module, "default_session_options",
                        lambda device, macs, det=False: asked.append(det) or options(device, macs))
    lbfgs = base_module.minimize_lbfgs
    monkeypatch.setattr(base_module, "minimize_lbfgs",
                        lambda *a, **k: asked.append(k["deterministic"]) or lbfgs(*a, **k))
    X, y = make_classification(n_samples=60, n_features=4, random_state=0)
    OrtMLPRegressor(hidden_layer_sizes=(3,), max_iter=1, random_state=random_state).fit(X, y)
    OrtLinearClassifier(solver="lbfgs", max_iter=2, random_state=random_state).fit(X, y)
    assert asked == [expected, expected]


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_estimators_tell_the_engine_their_batch_size(monkeypatch):
    monkeypatch.delenv("ORTLEARN_ALLOW_SPINNING", raising=False)
    rs = np.random.RandomState(0)
    X = rs.randn(300, 4)
    y = X @ rs.randn(4)

    def options(batch_size):
        est = OrtMLPRegressor(hidden_layer_sizes=(2000,), max_iter=1, batch_size=batch_size,
                              random_state=0).fit(X, y)
        return est._runtime.engine._session_options

    # 12 001 weights: 16 rows make 0.19 M multiply-adds, 'auto' (200 rows) 2.4 M
    assert options(16).intra_op_num_threads == 1
    assert options("auto").get_session_config_entry(SPIN) == "1"


@pytest.mark.parametrize("batch_size, n_rows, threads", [(10, 400, 1), (400, 20, 1),
                                                        (400, 400, 0)])
def test_gradient_optimizer_tells_the_engine_its_batch_size(monkeypatch, batch_size, n_rows,
                                                             threads):
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    from ortlearn import add_loss_output
    from ortlearn.estimators import OrtGradientOptimizer

    monkeypatch.delenv("ORTLEARN_NUM_THREADS", raising=False)
    rs = np.random.RandomState(0)
    X = rs.randn(n_rows, 3000).astype(np.float32)  # 3 001 weights
    y = X[:, 0].astype(np.float32)
    onx = add_loss_output(to_onnx(LinearRegression().fit(X, y), X, black_op={"LinearRegressor"}))
    opt = OrtGradientOptimizer(onx, ["coef", "intercept"], max_iter=1, batch_size=batch_size,
                               learning_rate=1e-4)
    opt.fit(X, y)
    # batches of 10 or 20 rows: 30 k or 60 k multiply-adds; of 400 rows: 1.2 M
    assert opt._engine()._session_options.intra_op_num_threads == threads
