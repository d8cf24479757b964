"""The epoch's step for batches of one size: fewer nodes, the same weights bit for bit."""

import collections

import numpy as np
import pytest
import scipy.sparse
from onnx import AttributeProto

from ortlearn.estimators import OrtMLPClassifier, OrtMLPRegressor
from ortlearn.estimators._objective import input_names
from ortlearn.optim import Adam
from ortlearn.training import TrainingEngine
from ortlearn.training.fused import build_fused_epoch


def _regression(n):
    rs = np.random.RandomState(0)
    X = rs.randn(45, 4).astype(np.float32)
    y = (X @ rs.randn(4) + np.sin(X[:, 0])).astype(np.float32)
    return X[:n], y[:n]


def _bodies(model):
    """``[Counter of the op types]`` of each Loop body of the epoch graph, Constants left out."""
    loops = [n for n in model.graph.node if n.op_type == "Loop"]
    return [collections.Counter(n.op_type for n in a.g.node if n.op_type != "Constant")
            for loop in loops for a in loop.attribute if a.type == AttributeProto.GRAPH]


def _epoch_graph(est, weighted=False):
    model, trainable = est._loss_model(weighted=weighted, values=True)
    engine = TrainingEngine(model, trainable, Adam(), input_names=input_names(weighted))
    return build_fused_epoch(engine._model, trainable, input_names(weighted), Adam(), "loss",
                             engine._epoch_ordered())


@pytest.mark.parametrize("weighted", [False, True])
def test_uniform_batches_step_has_no_bookkeeping_nodes(weighted):
    """W2's model (100 hidden units; 20 features here)."""
    rs = np.random.RandomState(0)
    X = rs.randn(300, 20).astype(np.float32)
    est = OrtMLPRegressor(hidden_layer_sizes=(100,), random_state=0, max_iter=1).fit(
        X, X @ rs.randn(20))
    model, _ = _epoch_graph(est, weighted)
    uniform, rest = _bodies(model)
    # the general step (batches of other sizes) is the single Loop's step of before, plus
    # the Add of its first batch number, less the Identity of the loop condition (it
    # passes through); it has the row of ones of the bias's column sum
    assert rest["Shape"] == rest["ConstantOfShape"] == 1
    # batches of the first batch's size: no row of ones; the rows of a batch are one
    # Gather (no Gather of its bounds, no Slice of the order)
    for op in ("Size", "Shape", "ConstantOfShape"):
        assert uniform[op] == 0
    assert uniform["Identity"] == rest["Identity"] == 2  # the scores' output, the loss
    # the weights' views of the flat buffer: one Split (a kernel), not a Slice a weight
    assert uniform["Split"] == 1 and uniform["Slice"] == 0
    if weighted:  # the rows, X's, y's and the weights' rows, the learning rate
        assert uniform["Gather"] == 5
        assert (sum(rest.values()), sum(uniform.values())) == (84, 77)
        return
    # nor the batch's size, its Cast to float, 1 / n and its products with constants
    assert rest["Size"] == 2 and uniform["Gather"] == 4
    # 86 a step before; two fewer since the scores are written from the formula (skl2onnx's
    # Cast of X to its own type and the Constant of its output's Reshape), three fewer since
    # the weights' views are one Split
    assert (sum(rest.values()), sum(uniform.values())) == (81, 63)
    assert uniform["Cast"] == 2 and uniform["Div"] == 2


def test_classifier_step_loses_its_batch_size_nodes():
    rs = np.random.RandomState(0)
    X = rs.rand(60, 8).astype(np.float32)
    y = np.arange(60) % 3
    est = OrtMLPClassifier(hidden_layer_sizes=(6,), random_state=0, max_iter=1).fit(X, y)
    model, _ = _epoch_graph(est)
    uniform, rest = _bodies(model)
    assert rest["Size"] == 2 and uniform["Size"] == 0
    # no Cast of X; the weights' views one Split
    assert (sum(rest.values()), sum(uniform.values())) == (82, 68)


# The weights of an OrtMLPRegressor((3,), batch_size=8, 4 epochs) trained by the epoch graph
# of a single Loop (ortlearn before the uniform batches' step), as float32 hex values,
# recorded on one CPU (x86-64, AVX2).
OLD_WEIGHTS = {
    45: ["0x1.46cdp-4", "0x1.84e864p-2", "0x1.76ec4ap-3", "0x1.af2afap-4", "-0x1.eb92eap-4",
         "0x1.00f8bcp-2", "-0x1.adfa18p-4", "0x1.767b7ep-1", "0x1.b15ff8p-1", "-0x1.8fd8c4p-3",
         "0x1.1f4d02p-1", "0x1.47b1fap-5", "-0x1.fd7604p-1", "-0x1.2f08aap+0", "0x1.99b39ep-1",
         "0x1.e3d02ep-4", "0x1.9770ap-1", "-0x1.9d147ep-1", "0x1.5a268p-1"],
    40: ["0x1.46c8bp-4", "0x1.87e6f2p-2", "0x1.740812p-3", "0x1.9fc59ep-4", "-0x1.f979dep-4",
         "0x1.0423f6p-2", "-0x1.bdac0ep-4", "0x1.74d434p-1", "0x1.b2d63ep-1", "-0x1.93499ap-3",
         "0x1.1dd83ap-1", "0x1.4bb678p-5", "-0x1.ff53aep-1", "-0x1.2ed37p+0", "0x1.9ad59ep-1",
         "0x1.ee085cp-4", "0x1.96a624p-1", "-0x1.9b7c72p-1", "0x1.5a6acep-1"],
}


@pytest.mark.parametrize("n", [45, 40])  # a last batch of 5 rows; batches of 8 only
def test_trained_weights_are_the_single_loops_to_float32_rounding(n):
    """Bit for bit on the CPU that recorded them; on another CPU within its rounding.

    Another CPU's kernels (MLAS's GEMM and Tanh for AVX-512 or NEON, numpy's ``sin`` in the
    data) round differently: the data, the forward pass and the gradients (sums of at most
    45 terms) move by a few float32 ulps, about 45 * 2**-24 = 2.7e-6 relative. Adam's step
    does not depend on the gradient's scale, so each of the 24 steps (lr 1e-3) moves by at
    most about 2 * 2.7e-6 * lr relative, 1.3e-7 over the fit: 1e-6 (8 ulps at 1.0) bounds
    it. A batch taken in another order or a step missed moves them by 1e-4 or more. The
    bits themselves are asserted on every CPU against the general step in
    :func:`test_epoch_loops_equal_one_call_per_batch_bit_for_bit`."""
    X, y = _regression(n)
    est = OrtMLPRegressor(hidden_layer_sizes=(3,), random_state=0, max_iter=4, batch_size=8,
                          tol=0).fit(X, y)
    flat = np.concatenate([c.ravel() for c in est.coefs_ + est.intercepts_])
    assert flat.dtype == np.float32
    recorded = np.array([float.fromhex(v) for v in OLD_WEIGHTS[n]], dtype=np.float32)
    np.testing.assert_allclose(flat, recorded, rtol=0, atol=1e-6)


@pytest.mark.parametrize("sizes", [[8, 8, 8, 8, 8, 5], [5, 8, 8, 8, 8, 8], [9, 9, 9, 9, 9],
                                   [8, 3, 8, 8, 8, 10], [45]])
def test_epoch_loops_equal_one_call_per_batch_bit_for_bit(sizes):
    """Leading batches of one size, then any sizes: the Loops give the per-batch steps' bits
    (one call per batch runs the general step)."""
    rs = np.random.RandomState(0)
    X = rs.randn(45, 3)
    y = X @ rs.randn(3)
    est = OrtMLPRegressor(hidden_layer_sizes=(5,), random_state=0).partial_fit(
        X, y, sample_weight=np.ones(45))
    model, trainable = est._loss_model(weighted=True, values=True)
    arrays = [X, y.reshape(-1, 1), rs.uniform(0.5, 2, 45)]
    batches = np.split(rs.permutation(45), np.cumsum(sizes)[:-1])
    results = []
    for loop in (False, True):
        engine = TrainingEngine(model, trainable, Adam(), input_names=input_names(True),
                                epoch_loop=loop)
        engine.set_learning_rate(0.01)
        losses = [engine.train_epoch(arrays, batches) for _ in range(2)]
        results.append((losses, engine.get_state(), engine.optimizer_state()))
    (losses, weights, state), (loop_losses, loop_weights, loop_state) = results
    assert losses == loop_losses
    for name, value in weights.items():
        np.testing.assert_array_equal(loop_weights[name], value)
        for moment, m in state["states"][name].items():
            np.testing.assert_array_equal(loop_state["states"][name][moment], m)


def test_hoisting_moves_invariant_nodes_and_keeps_random_draws():
    from onnx import helper

    from ortlearn.graph import GraphBuilder
    from ortlearn.training.loop_body import hoisted

    nodes = [helper.make_node("Constant", [], ["two"], value_float=2.0),
             helper.make_node("Mul", ["outer", "two"], ["scaled"]),  # once per call
             helper.make_node("RandomUniform", [], ["noise"], shape=[1]),  # a draw a step
             helper.make_node("Add", ["scaled", "noise"], ["s"]),
             helper.make_node("Mul", ["s", "carried"], ["carried.next"])]
    outer = GraphBuilder(opset=18, prefix="outer_")
    body = hoisted(nodes, {"carried"}, outer)
    assert [n.op_type for n in outer.nodes] == ["Constant", "Mul"]
    assert list(outer.nodes[1].input) == ["outer", "two.per_epoch"]
    assert [n.op_type for n in body] == ["Constant", "RandomUniform", "Add", "Mul"]
    assert list(body[2].input) == ["scaled.per_epoch", "noise"]


@pytest.mark.parametrize("penalty", ["l2", None])
def test_a_wide_linear_step_broadcasts_no_lower_rank_value_against_its_weights(penalty):
    """A linear model's weights are a column (n_features, 1): onnxruntime broadcasts a
    single value of a lower rank against it one row at a time (20 times slower at 2 000 000
    weights), so the step (SGD's update, the L2 penalty's gradient) gives such values
    the column's rank (graph.passes.single_values_at_full_rank)."""
    from ortlearn.estimators import OrtSGDRegressor
    from ortlearn.graph import shape_of, value_info_map

    n = 500_000  # hashed features: a large model (a step a call, a tensor per weight)
    X = scipy.sparse.random(64, n, density=1e-4, format="csr", random_state=0)
    engine = OrtSGDRegressor(max_iter=1, tol=None, penalty=penalty, random_state=0
                             ).partial_fit(X, np.arange(64.0))._runtime.engine
    step, _, _, _ = engine._compiled(engine._current)
    infos = value_info_map(step)
    weight = [n for n in step.graph.input if n.name == "coef"][0]
    assert shape_of(weight) == [n, 1]
    checked = 0
    for node in step.graph.node:
        if node.op_type not in ("Add", "Sub", "Mul", "Div"):
            continue
        shapes = [shape_of(infos[v]) if v in infos else None for v in node.input]
        if [n, 1] in shapes:
            checked += 1
            assert all(s is not None and len(s) == 2 for s in shapes), (node, shapes)
    # with the L2 penalty, the weights' decay (graph.passes.scattered_updates); without,
    # the rate times the gradient and the update
    assert checked == (1 if penalty else 2)


@pytest.mark.parametrize("kind", ["sgd", "mlp"])
def test_a_sparse_step_computes_its_batch_size_once_per_epoch(kind):
    """A CSR X is read as padded rows whose width is a symbol of the graph: the mean's
    batch size is still found a multiple of the rows (batch_shapes.batch_multiples,
    probing the width too), a weight's size the same for every batch, and the gradient
    spread over a row's entries broadcasts (graph.passes.expands_as_broadcasts): no
    Size, Shape nor Expand a step. The weights are the per-sample SGD's of
    scikit-learn (SGD) or those of the dense rows (MLP)."""
    from sklearn.linear_model import SGDClassifier

    from ortlearn.estimators import OrtSGDClassifier

    X = scipy.sparse.random(200, 50, density=0.1, format="csr", random_state=0)
    y = np.arange(200) % 2
    if kind == "sgd":
        est = OrtSGDClassifier(random_state=0, shuffle=False, batch_size=1)
        reference = SGDClassifier(random_state=0, shuffle=False).partial_fit(
            X, y, classes=[0, 1])
        expected = [reference.coef_.T, reference.intercept_]
    else:
        est = OrtMLPClassifier((4,), solver="sgd", random_state=0, shuffle=False)
        dense = type(est)(**est.get_params()).partial_fit(X.toarray(), y, classes=[0, 1])
        expected = list(dense.get_state().values())
    engine = est.partial_fit(X, y, classes=[0, 1])._runtime.engine
    model, _, _, _ = engine._compiled(True)
    uniform, _ = _bodies(model)
    assert uniform["Size"] == uniform["Shape"] == uniform["Expand"] == 0
    for got, want in zip(est.get_state().values(), expected):
        np.testing.assert_allclose(got.reshape(np.shape(want)), want, rtol=1e-10, atol=1e-12)
