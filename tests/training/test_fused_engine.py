"""The fused training step against the unfused artifacts (TrainingSession, 2 calls per batch)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from skl2onnx import to_onnx
from sklearn.linear_model import LinearRegression

from ortlearn import TrainingSession, add_loss_output
from ortlearn.artifacts import build_artifacts
from ortlearn.optim import SGD, Adam, AdamW, build_optimizer_model
from ortlearn.training import Batches, TrainingEngine
from ortlearn.training.engine import SCALAR_BLOCK_STEPS
from ortlearn.training.fused import build_fused_epoch, build_fused_step

N, N_FEATURES, BATCH = 45, 3, 8  # 45 rows: a final partial batch of 5

OPTIMIZERS = {
    "sgd": lambda: SGD(),
    "momentum": lambda: SGD(momentum=0.9),
    "nesterov": lambda: SGD(momentum=0.9, nesterov=True),
    "adam": lambda: Adam(),
    "adamw": lambda: AdamW(weight_decay=0.1),
}


def _data(dtype, weighted):
    rs = np.random.RandomState(0)
    X = rs.randn(N, N_FEATURES).astype(dtype)
    y = (X @ rs.randn(N_FEATURES) + 0.3 * rs.randn(N)).astype(dtype).reshape(-1, 1)
    w = rs.uniform(0.5, 2, N).astype(dtype)
    onx = to_onnx(LinearRegression().fit(X, y.ravel()), X, black_op={"LinearRegressor"})
    start = {"coef": rs.randn(N_FEATURES, 1).astype(dtype), "intercept": np.array([0.1], dtype)}
    for init in onx.graph.initializer:  # the weights (and the graph) in dtype
        if init.name in start:
            init.CopyFrom(numpy_helper.from_array(start[init.name], init.name))
    if weighted:
        return add_loss_output(onx, weight_name="weight"), [X, y, w]
    return add_loss_output(onx), [X, y]


def _unfused(loss_model, arrays, optimizer, batches, lrs):
    """The reference: training model + optimizer model, 2 onnxruntime calls per batch."""
    training, evaluation, _, state = build_artifacts(
        loss_model, requires_grad=["coef", "intercept"], loss_input_names=["loss"])
    params = {p.name: (p.data_type, list(p.dims)) for p in loss_model.graph.initializer
              if p.name in ("coef", "intercept")}
    session = TrainingSession(state, training, evaluation,
                              build_optimizer_model(optimizer, params))
    losses = []
    for idx, lr in zip(batches, lrs):
        session.set_learning_rate(lr)
        session.lazy_reset_grad()
        losses.append(float(session.train_step(*[a[idx] for a in arrays])[0]) * len(idx))
        session.optimizer_step()
    weights = {n: session.get_parameter(n) for n in ("coef", "intercept")}
    return weights, sum(losses) / sum(len(b) for b in batches)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_step_equals_unfused_artifacts(name, dtype, weighted):
    loss_model, arrays = _data(dtype, weighted)
    batches = Batches.for_epoch(N, BATCH, np.random.RandomState(1))
    lrs = [0.05 / k for k in range(1, len(batches) + 1)]  # a per-step schedule
    expected, expected_loss = _unfused(loss_model, arrays, OPTIMIZERS[name](), batches, lrs)
    tol = {"rtol": 1e-12, "atol": 1e-14} if dtype == np.float64 else {"rtol": 1e-6,
                                                                       "atol": 1e-7}
    for loop in (False, True):
        engine = TrainingEngine(loss_model, ["coef", "intercept"], OPTIMIZERS[name](),
                                epoch_loop=loop)
        loss = engine.train_epoch(arrays, batches, lr_for_step=lambda step: 0.05 / step)
        assert engine.n_steps == len(batches)
        for key, value in engine.get_state().items():
            np.testing.assert_allclose(value, expected[key], **tol)
        # the loss read once per epoch is the size-weighted mean of the batch losses
        assert loss == pytest.approx(expected_loss, rel=1e-12 if dtype == np.float64 else 1e-6)


def test_loop_mode_equals_step_mode_over_epochs():
    loss_model, arrays = _data(np.float64, True)
    rs = np.random.RandomState(3)
    epochs = [Batches.for_epoch(N, BATCH, rs) for _ in range(3)]
    results = []
    for loop in (False, True):
        engine = TrainingEngine(loss_model, ["coef", "intercept"], Adam(), epoch_loop=loop)
        engine.set_learning_rate(0.02)
        losses = [engine.train_epoch(arrays, b) for b in epochs]
        results.append((losses, engine.get_state(), engine.optimizer_state()))
    (l0, s0, o0), (l1, s1, o1) = results
    np.testing.assert_allclose(l0, l1, rtol=1e-13)
    for key in s0:
        np.testing.assert_allclose(s0[key], s1[key], rtol=1e-12, atol=1e-15)
        for state in o0["states"][key]:
            np.testing.assert_allclose(o0["states"][key][state], o1["states"][key][state],
                                       rtol=1e-12, atol=1e-15)
    assert o0["step"] == o1["step"] == 3 * len(epochs[0])


def test_switching_modes_keeps_weights_and_state():
    loss_model, arrays = _data(np.float64, False)
    batches = [Batches.for_epoch(N, BATCH, np.random.RandomState(s)) for s in (0, 1)]
    reference = TrainingEngine(loss_model, ["coef", "intercept"], Adam(), epoch_loop=False)
    for b in batches:
        reference.train_epoch(arrays, b)
    engine = TrainingEngine(loss_model, ["coef", "intercept"], Adam(), epoch_loop=False)
    engine.train_epoch(arrays, batches[0])
    engine._epoch_loop = True  # as 'auto' does when the batches get larger
    engine.train_epoch(arrays, batches[1])
    for key, value in reference.get_state().items():
        np.testing.assert_allclose(engine.get_state()[key], value, rtol=1e-12)


def test_fused_graphs_read_the_data_through_gather():
    loss_model, _ = _data(np.float32, False)
    step, layout = build_fused_step(loss_model, ["coef", "intercept"], ["X", "label"], Adam())
    inputs = [i.name for i in step.graph.input]
    assert inputs[:2] == ["X.all", "label.all"]
    gathers = {n.output[0]: n.input[0] for n in step.graph.node if n.op_type == "Gather"}
    assert gathers["X"] == "X.all" and gathers["label"] == "label.all"
    # every carried input has its output: the step's outputs feed the next step
    assert set(layout.carried) <= set(inputs)
    assert set(layout.carried.values()) == {o.name for o in step.graph.output}
    epoch, epoch_layout = build_fused_epoch(loss_model, ["coef", "intercept"], ["X", "label"],
                                            Adam())
    assert [n.op_type for n in epoch.graph.node][-1] == "Loop"
    assert len(epoch_layout.carried) == len(layout.carried) - 1  # no batch counter


def test_a_step_binds_no_host_array(monkeypatch):
    """During the batches of an epoch no OrtValue is created and nothing is bound."""
    loss_model, arrays = _data(np.float32, False)
    engine = TrainingEngine(loss_model, ["coef", "intercept"], SGD(momentum=0.9),
                            epoch_loop=False)
    batches = Batches.for_epoch(N, BATCH)
    engine.train_epoch(arrays, batches)
    created = []
    original = ort.OrtValue.ortvalue_from_numpy.__func__

    def counting(cls, *args, **kwargs):
        created.append(1)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy", classmethod(counting))
    engine.train_epoch(arrays, batches)
    # the same arrays stay on the device, the inputs of a few bytes per row (X: 12,
    # label: 4) are reordered into the buffers of the first epoch, which onnxruntime
    # reads in place as it does the row order, and the bounds, rows and learning rates
    # are copied into the buffers bound at the first epoch: nothing new
    assert engine._epoch_ordered() == ["X", "label"]
    assert created == []
    engine.release_data()
    engine.train_epoch(arrays, batches)
    # new arrays: the inputs gathered by the step would be uploaded; the reordered
    # ones get new buffers; the row order is the same array
    assert len(created) == 2
    # an epoch of another number of batches binds new buffers of its size
    buffers = engine._steps[engine._current][2]
    assert {v.shape()[0] for v, _ in buffers.epoch_values.values()} == {len(batches)}
    engine.train_epoch(arrays, batches[:2])
    assert {v.shape()[0] for v, _ in buffers.epoch_values.values()} == {2}


def test_an_epoch_copies_no_row_order_and_no_data():
    """The order of ``Batches`` is fed as it is and the narrow inputs are reordered into
    buffers of the first epoch: a later epoch allocates a few bytes per batch only."""
    import tracemalloc

    rs = np.random.RandomState(0)
    n_rows, batch = 20_000, 200
    X = rs.randn(n_rows, 3).astype(np.float32)
    y = X @ rs.randn(3, 1).astype(np.float32)
    onx = to_onnx(LinearRegression().fit(X, y.ravel()), X, black_op={"LinearRegressor"})
    engine = TrainingEngine(add_loss_output(onx), ["coef", "intercept"], Adam())
    assert engine._epoch_ordered() == ["X", "label"]
    engine.train_epoch([X, y], Batches.for_epoch(n_rows, batch, rs))
    batches = Batches.for_epoch(n_rows, batch, rs)
    tracemalloc.start()
    try:
        engine.train_epoch([X, y], batches)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < batches.order.nbytes / 4  # 160 kB of int64 rows, 320 kB of data


def test_batches_of_any_form_give_the_same_epoch():
    """``Batches``, a list of index arrays, a subset of the rows, rows drawn twice."""
    loss_model, arrays = _data(np.float64, True)
    rs = np.random.RandomState(3)
    for order in (rs.permutation(N), rs.permutation(N)[:20], rs.randint(0, N, 2 * N)):
        results = []
        for batches in (Batches(order, BATCH), [order[i:i + BATCH]
                                                for i in range(0, len(order), BATCH)]):
            engine = TrainingEngine(loss_model, ["coef", "intercept"], Adam())
            results.append((engine.train_epoch(arrays, batches), engine.get_state()))
        assert results[0][0] == results[1][0]
        for name, value in results[0][1].items():
            np.testing.assert_array_equal(results[1][1][name], value)
    expected, _ = _unfused(loss_model, arrays, Adam(), list(Batches(order, BATCH)),
                           [engine.default_learning_rate] * len(Batches(order, BATCH)))
    for name, value in expected.items():
        np.testing.assert_allclose(results[0][1][name], value, rtol=1e-10)


@pytest.mark.parametrize("loop", [True, False])
def test_epochs_reuse_their_batches_bounds_and_scalars_exactly(loop):
    """One ``Batches`` shuffled in place, bounds and scalars cached across epochs (beyond a
    block of ``SCALAR_BLOCK_STEPS``, through a learning-rate change and a rewound step
    count) train as fresh batch lists and scalars computed per step do, bit for bit."""
    loss_model, arrays = _data(np.float64, False)  # X gathered by the step, by the row order
    n_epochs = 12 + SCALAR_BLOCK_STEPS // 6 + 4  # 6 batches an epoch: a block ends
    rates = [1e-2 if epoch < 7 else 3e-3 for epoch in range(n_epochs)]
    runs = []
    for cached in (True, False):
        rs = np.random.RandomState(0)
        engine = TrainingEngine(loss_model, ["coef", "intercept"], Adam(), epoch_loop=loop)
        order = np.arange(N)
        batches = Batches(order, BATCH)
        losses = []
        for epoch, rate in enumerate(rates):
            rs.shuffle(order)
            if epoch == 12:  # the step count goes back: the scalars of those steps again
                engine.load_optimizer_state({**engine.optimizer_state(), "step": 30})
            if cached:
                engine.set_learning_rate(rate)
                losses.append(engine.train_epoch(arrays, batches))
            else:
                fresh = [order[i:i + BATCH].copy() for i in range(0, N, BATCH)]
                losses.append(engine.train_epoch(arrays, fresh, lr_for_step=lambda _, r=rate: r))
        runs.append((losses, engine.get_state(), engine.optimizer_state()))
    (losses, state, opt), (expected_losses, expected_state, expected_opt) = runs
    assert losses == expected_losses
    for name in state:
        np.testing.assert_array_equal(state[name], expected_state[name])
        for s in Adam().state_names:
            np.testing.assert_array_equal(opt["states"][name][s],
                                          expected_opt["states"][name][s])
    assert opt["step"] == expected_opt["step"] == 30 + (n_epochs - 12) * len(batches)


def test_checkpoint_state_holds_the_optimizer_state():
    loss_model, arrays = _data(np.float64, False)
    engine = TrainingEngine(loss_model, ["coef", "intercept"], Adam())
    engine.train_epoch(arrays, Batches.for_epoch(N, BATCH))
    state = engine.checkpoint_state()
    assert state.optimizer_step == engine.n_steps
    np.testing.assert_array_equal(state.parameters["coef"].data, engine.get_state()["coef"])
    np.testing.assert_array_equal(state.optimizer_state["coef"]["exp_avg"],
                                  engine.optimizer_state()["states"]["coef"]["exp_avg"])


def test_bad_epoch_inputs():
    loss_model, arrays = _data(np.float64, False)
    engine = TrainingEngine(loss_model, ["coef", "intercept"], SGD())
    with pytest.raises(TypeError, match="'X' must be float64, got float32"):
        engine.train_epoch([arrays[0].astype(np.float32), arrays[1]], Batches.for_epoch(N, BATCH))
    with pytest.raises(ValueError, match="at least one batch"):
        engine.train_epoch(arrays, [])
    for rows in ([0, N], [-1, 2]):
        with pytest.raises(ValueError, match=rf"Row indices must be in \[0, {N}\)"):
            engine.train_epoch(arrays, [np.array(rows)])
    with pytest.raises(ValueError, match="learning rate"):
        engine.train_epoch(arrays, Batches.for_epoch(N, BATCH), lr_for_step=lambda step: -1.0)
    with pytest.raises(ValueError, match="epoch_loop"):
        TrainingEngine(loss_model, ["coef"], SGD(), epoch_loop="yes")


def test_squared_error_gradient_is_one_value_broadcast():
    """The W2 step: the mean's ``1 / n`` and the half reach ``x + x`` as one value."""
    from sklearn.neural_network import MLPRegressor

    from ortlearn.convert import to_train_onnx
    from ortlearn.estimators._objective import LOSS, input_names, mlp_objective

    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 10)).astype(np.float32)
    mlp = MLPRegressor(hidden_layer_sizes=(8,), max_iter=1).fit(X, X[:, 0])
    loss = mlp_objective(to_train_onnx(mlp, X), "regressor", alpha=0.0, weighted=False)
    trainable = [i.name for i in loss.graph.initializer if i.name.startswith(("coef", "inter"))]
    model, _ = build_fused_step(loss, trainable, input_names(False), Adam(), LOSS)
    ops = [n.op_type for n in model.graph.node]
    assert "Expand" not in ops and "Sum" not in ops


def test_cross_entropy_gradient_is_one_value_broadcast():
    """The W3 step without sample weights: the mean's gradient reaches the one-hot rows as
    one value (no Expand to the batch, no Unsqueeze back to a column)."""
    from sklearn.neural_network import MLPClassifier

    from ortlearn.convert import to_train_onnx
    from ortlearn.estimators._objective import LOSS, input_names, mlp_objective

    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 64)).astype(np.float32)
    y = np.arange(64) % 10
    mlp = MLPClassifier((100,), max_iter=1).fit(X, y)
    loss = mlp_objective(to_train_onnx(mlp, X), "multiclass", alpha=0.0, weighted=False)
    assert [n.op_type for n in loss.graph.node].count("ReduceSum") == 0
    trainable = [i.name for i in loss.graph.initializer if i.name.startswith(("coef", "inter"))]
    model, _ = build_fused_step(loss, trainable, input_names(False), Adam(), LOSS)
    ops = [n.op_type for n in model.graph.node]
    assert "Expand" not in ops and "Unsqueeze" not in ops
    # 104 before (Shape, Expand, Unsqueeze, the rows' ReduceSum...), 98 before the mean's
    # gradient took its Neg and the one-hot and softmax terms their common factor
    assert len(ops) <= 94
    assert ops.count("Neg") == 1  # the loss's own


def test_l2_penalty_gradient_needs_no_expand():
    """The W3 step (64-100-10, alpha > 0, Adam): the penalty's gradient broadcasts."""
    from sklearn.neural_network import MLPClassifier

    from ortlearn.convert import to_train_onnx
    from ortlearn.estimators._objective import LOSS, input_names, mlp_objective

    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 64)).astype(np.float32)
    y = np.arange(64) % 10
    mlp = MLPClassifier((100,), max_iter=1).fit(X, y)
    loss = mlp_objective(to_train_onnx(mlp, X), "multiclass", alpha=1e-4)
    trainable = [i.name for i in loss.graph.initializer if i.name.startswith(("coef", "inter"))]
    model, _ = build_fused_step(loss, trainable, input_names(), Adam(), LOSS)
    # The data loss's Expand to the batch shape goes too: the refined shapes give the
    # batch one symbol, so the sample weights it multiplies are known to have that shape.
    assert sum(n.op_type == "Expand" for n in model.graph.node) == 0
    # the one Shape left sizes the row of ones that sums the hidden bias's gradient
    assert sum(n.op_type == "Shape" for n in model.graph.node) == 1
    assert len(model.graph.node) <= 120  # 150 before the rewrite, 148 with one Expand left
