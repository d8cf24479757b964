"""Optimizer graphs against scikit-learn and numpy references; learning-rate schedules."""

import json
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDRegressor
from sklearn.neural_network._stochastic_optimizers import AdamOptimizer, SGDOptimizer

from ortlearn.graph import DEFAULT_OPSET, GraphBuilder, finalize_model
from ortlearn.optim import (
    SGD,
    Adam,
    AdamW,
    Adaptive,
    Constant,
    InvScaling,
    LinearLR,
    Optimal,
    PlainSGD,
    TorchAdamW,
    build_optimizer_model,
    clip_grad_norm,
    unpack_optimizer_model,
)

N_STEPS = 20
SHAPES = {"W": (4, 3), "b": (3,)}
ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


class OptimizerRunner:
    """Run the optimizer model's tensor layout step after step, carrying params and states."""

    def __init__(self, optimizer, params):
        self.optimizer = optimizer
        spec = {p: (ONNX_TYPE[a.dtype.type], list(a.shape)) for p, a in params.items()}
        self.model = build_optimizer_model(optimizer, spec, layout="tensors")
        self.sess = ort.InferenceSession(self.model.SerializeToString(),
                                         providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.model.graph.output]
        self.params = {p: a.copy() for p, a in params.items()}
        self.states = {p: optimizer.init_state(a) for p, a in params.items()}
        self.t = 0

    def step(self, grads, lr):
        self.t += 1
        feeds = {"learning_rate": np.array(lr, dtype=np.float32),
                 "step": np.array(self.t, dtype=np.int64)}
        for p, a in self.params.items():
            feeds[p] = a
            feeds[f"{p}.gradient"] = grads[p]
            for s, v in self.states[p].items():
                feeds[f"{p}.{s}"] = v
        res = dict(zip(self.outputs, self.sess.run(None, feeds)))
        for p in self.params:
            self.params[p] = res[f"{p}.updated"]
            self.states[p] = {s: res[f"{p}.{s}.updated"] for s in self.states[p]}


def random_params(rng, dtype, shapes=SHAPES):
    return {p: rng.standard_normal(s).astype(dtype) for p, s in shapes.items()}


def random_grads(rng, params, n_steps=N_STEPS):
    return [{p: rng.standard_normal(a.shape).astype(a.dtype) for p, a in params.items()}
            for _ in range(n_steps)]


def assert_params(actual, expected, dtype):
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-6)
    for p in expected:
        assert actual[p].dtype == dtype
        np.testing.assert_allclose(actual[p], expected[p], **tol, err_msg=p)


# ---------------------------------------------------------------- scikit-learn references

# Learning rates exactly representable in float32: the model's input is float32.
LR = 2.0 ** -4


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_matches_sklearn(rng, dtype, nesterov):
    params = random_params(rng, dtype)
    grads = random_grads(rng, params)
    runner = OptimizerRunner(SGD(momentum=0.9, nesterov=nesterov), params)
    ref_params = [a.astype(np.float64) for a in params.values()]
    ref = SGDOptimizer(ref_params, learning_rate_init=LR, momentum=0.9, nesterov=nesterov)
    for t, g in enumerate(grads):
        # a learning rate that changes over time shows where lr enters the velocity
        lr = LR / 2 ** (t % 3)
        ref.learning_rate = lr
        ref.update_params(ref_params, [x.astype(np.float64) for x in g.values()])
        runner.step(g, lr)
    assert_params(runner.params, dict(zip(params, ref_params)), dtype)
    expected_v = dict(zip(params, ref.velocities))
    assert_params({p: s["momentum"] for p, s in runner.states.items()}, expected_v, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_adam_matches_sklearn(rng, dtype):
    params = random_params(rng, dtype)
    grads = random_grads(rng, params)
    runner = OptimizerRunner(Adam(beta_1=0.8, beta_2=0.99, epsilon=1e-6), params)
    ref_params = [a.astype(np.float64) for a in params.values()]
    ref = AdamOptimizer(ref_params, learning_rate_init=LR, beta_1=0.8, beta_2=0.99, epsilon=1e-6)
    for g in grads:
        ref.update_params(ref_params, [x.astype(np.float64) for x in g.values()])
        runner.step(g, LR)
    assert_params(runner.params, dict(zip(params, ref_params)), dtype)
    assert_params({p: s["exp_avg"] for p, s in runner.states.items()},
                  dict(zip(params, ref.ms)), dtype)
    assert_params({p: s["exp_avg_sq"] for p, s in runner.states.items()},
                  dict(zip(params, ref.vs)), dtype)


# ---------------------------------------------------------------- numpy references

def numpy_adamw(params, grads, lr, betas, eps, weight_decay, bias_correction=True,
                max_norm=None):
    """torch.optim.AdamW's documented algorithm (amsgrad=False, maximize=False)."""
    b1, b2 = betas
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, g in enumerate(grads, start=1):
        g = {k: x.astype(np.float64) for k, x in g.items()}
        if max_norm is not None:
            g = numpy_clip(g, max_norm)
        for k in p:
            p[k] = p[k] * (1 - lr * weight_decay)
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            if bias_correction:
                step_size = lr / (1 - b1 ** t)
                denom = np.sqrt(v[k]) / np.sqrt(1 - b2 ** t) + eps
            else:
                step_size, denom = lr, np.sqrt(v[k]) + eps
            p[k] = p[k] - step_size * m[k] / denom
    return p


def numpy_clip(grads, max_norm):
    """torch.nn.utils.clip_grad_norm_ on a dict of arrays."""
    total = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values()))
    coef = min(max_norm / (total + 1e-6), 1.0)
    return {k: g * coef for k, g in grads.items()}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_torch_adamw_matches_torch_algorithm(rng, dtype, bias_correction):
    params = random_params(rng, dtype)
    grads = random_grads(rng, params)
    opt = TorchAdamW(betas=(0.85, 0.995), eps=1e-7, weight_decay=0.1,
                     bias_correction=bias_correction)
    runner = OptimizerRunner(opt, params)
    for g in grads:
        runner.step(g, LR)
    expected = numpy_adamw(params, grads, LR, (0.85, 0.995), 1e-7, 0.1, bias_correction)
    assert_params(runner.params, expected, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.5, False), (0.5, True)])
def test_sgd_weight_decay_is_l2_in_gradient(rng, dtype, momentum, nesterov):
    params = random_params(rng, dtype)
    grads = random_grads(rng, params)
    runner = OptimizerRunner(SGD(momentum, nesterov, weight_decay=0.3), params)
    p = {k: a.astype(np.float64) for k, a in params.items()}
    vel = {k: np.zeros_like(a) for k, a in p.items()}
    for g in grads:
        runner.step(g, LR)
        for k in p:
            d = g[k] + 0.3 * p[k]
            vel[k] = momentum * vel[k] - LR * d
            p[k] += momentum * vel[k] - LR * d if nesterov else vel[k]
    assert_params(runner.params, p, dtype)
    assert runner.optimizer.state_names == (("momentum",) if momentum else ())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_adam_weight_decay_is_l2_in_gradient(rng, dtype):
    params = random_params(rng, dtype)
    grads = random_grads(rng, params)
    runner = OptimizerRunner(Adam(weight_decay=0.2), params)
    ref_params = [a.astype(np.float64) for a in params.values()]
    ref = AdamOptimizer(ref_params, learning_rate_init=LR)
    for g in grads:
        g64 = [x.astype(np.float64) for x in g.values()]
        ref.update_params(ref_params, [x + 0.2 * p for x, p in zip(g64, ref_params)])
        runner.step(g, LR)
    assert_params(runner.params, dict(zip(params, ref_params)), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_global_norm(rng, dtype, max_norm):
    params = random_params(rng, dtype)
    grads = random_grads(rng, params, n_steps=1)
    runner = OptimizerRunner(SGD(clip_grad=max_norm), params)
    runner.step(grads[0], LR)
    clipped = numpy_clip(grads[0], max_norm)
    expected = {k: params[k].astype(np.float64) - LR * clipped[k] for k in params}
    assert_params(runner.params, expected, dtype)
    if max_norm > 1:  # below the bound: the gradient is untouched
        expected = {k: params[k] - np.asarray(LR, dtype) * grads[0][k] for k in params}
        assert_params(runner.params, expected, dtype)


def test_torch_adamw_clip_grad_mixed_dtypes(rng):
    params = {"W": rng.standard_normal((4, 3)).astype(np.float32),
              "b": rng.standard_normal(3)}
    grads = random_grads(rng, params, n_steps=5)
    runner = OptimizerRunner(TorchAdamW(clip_grad=0.3), params)
    for g in grads:
        runner.step(g, LR)
    expected = numpy_adamw(params, grads, LR, (0.9, 0.999), 1e-8, 1e-2, max_norm=0.3)
    assert runner.params["W"].dtype == np.float32
    np.testing.assert_allclose(runner.params["W"], expected["W"], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(runner.params["b"], expected["b"], rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- the artifact contract

CONTRACT_OPTIMIZERS = [
    (SGD(), []),
    (SGD(momentum=0.9, nesterov=True), ["momentum"]),
    (Adam(), ["exp_avg", "exp_avg_sq"]),
    (AdamW(clip_grad=1.0), ["exp_avg", "exp_avg_sq"]),
    (TorchAdamW(), ["exp_avg", "exp_avg_sq"]),
]


@pytest.mark.parametrize("optimizer, states", CONTRACT_OPTIMIZERS)
def test_optimizer_model_tensor_layout(optimizer, states):
    """The tensor layout (what the session runs): per-parameter inputs, mixed dtypes."""
    spec = {"coef": (TensorProto.DOUBLE, ["n_features", 2]),
            "intercept": (TensorProto.FLOAT, [2])}
    model = build_optimizer_model(optimizer, spec, layout="tensors")
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", DEFAULT_OPSET)]
    assert model.ir_version <= 10
    g = model.graph
    expected_inputs = ["learning_rate", "step"]
    expected_outputs = []
    for p in spec:
        expected_inputs += [p, f"{p}.gradient"] + [f"{p}.{s}" for s in states]
        expected_outputs += [f"{p}.updated"] + [f"{p}.{s}.updated" for s in states]
    assert [i.name for i in g.input] == expected_inputs
    assert [o.name for o in g.output] == expected_outputs
    assert not g.initializer
    types = {v.name: v.type.tensor_type for v in list(g.input) + list(g.output)}
    assert types["learning_rate"].elem_type == TensorProto.FLOAT
    assert types["step"].elem_type == TensorProto.INT64
    assert len(types["learning_rate"].shape.dim) == len(types["step"].shape.dim) == 0
    for name, tt in types.items():
        if name.startswith("coef"):
            assert tt.elem_type == TensorProto.DOUBLE
            assert [d.dim_param or d.dim_value for d in tt.shape.dim] == ["n_features", 2]
        elif name.startswith("intercept"):
            assert tt.elem_type == TensorProto.FLOAT
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["ortlearn.optimizer"]) == {
        "type": type(optimizer).__name__, "params": ["coef", "intercept"],
        "states": states, "hyper": optimizer.hyper, "layout": "tensors"}


@pytest.mark.parametrize("optimizer, states", CONTRACT_OPTIMIZERS)
def test_optimizer_model_sequence_layout(optimizer, states):
    """onnxruntime-training's layout: lr and step of shape [1], then tensor sequences."""
    spec = {"coef": (TensorProto.DOUBLE, ["n_features", 2]), "intercept": (TensorProto.DOUBLE, [2])}
    model = build_optimizer_model(optimizer, spec)
    onnx.checker.check_model(model, full_check=True)
    g = model.graph
    sequences = ["first_order_moments", "second_order_moments"][:len(states)]
    declared = sequences or ["first_order_moments"]  # SGD declares it unused, as there
    assert [i.name for i in g.input] == ["learning_rate", "step", "params", "gradients", *declared]
    assert [o.name for o in g.output] == ["updated_flag", "params.updated",
                                          *[f"{s}.updated" for s in sequences]]
    for info in g.input[:2]:
        assert [d.dim_value for d in info.type.tensor_type.shape.dim] == [1]
    for info in [*g.input[2:], *g.output[1:]]:
        assert info.type.sequence_type.elem_type.tensor_type.elem_type == TensorProto.DOUBLE
    assert g.output[0].type.tensor_type.elem_type == TensorProto.BOOL
    meta = json.loads({p.key: p.value for p in model.metadata_props}["ortlearn.optimizer"])
    assert meta["layout"] == "sequence" and meta["states"] == states
    assert meta["sequences"] == dict(zip(states, sequences))
    # unpacked, it is the tensor layout's update (same names), lr and step kept at [1]
    unpacked = unpack_optimizer_model(model)
    onnx.checker.check_model(unpacked, full_check=True)
    expected = ["learning_rate", "step"] + [
        n for p in spec for n in (p, f"{p}.gradient", *[f"{p}.{s}" for s in states])]
    assert [i.name for i in unpacked.graph.input] == expected
    assert not any(n.op_type.startswith("Sequence") for n in unpacked.graph.node)
    # its metadata says so: a reader without sequences (onnxruntime's JavaScript API) checks it
    unpacked_meta = json.loads(
        {p.key: p.value for p in unpacked.metadata_props}["ortlearn.optimizer"])
    assert unpacked_meta == {**{k: v for k, v in meta.items() if k != "sequences"},
                             "layout": "tensors"}


def test_unpack_refuses_what_it_cannot_unpack():
    """A sequence read other than by SequenceAt at a constant position is refused by name."""
    model = build_optimizer_model(SGD(), {"w": (TensorProto.FLOAT, [2])})
    model.graph.node.append(helper.make_node("SequenceLength", ["params"], ["n"], name="count"))
    with pytest.raises(ValueError, match=r"'count' \(SequenceLength\) reads the sequence 'params'"):
        unpack_optimizer_model(model)
    tensors = build_optimizer_model(SGD(), {"w": (TensorProto.FLOAT, [2])}, layout="tensors")
    assert unpack_optimizer_model(tensors) is tensors  # already tensors


def test_sequence_layout_needs_one_element_type():
    spec = {"coef": (TensorProto.DOUBLE, [3]), "intercept": (TensorProto.FLOAT, [1])}
    with pytest.raises(ValueError, match="one element type.*layout='tensors'"):
        build_optimizer_model(AdamW(), spec)
    with pytest.raises(ValueError, match="layout must be one of"):
        build_optimizer_model(AdamW(), spec, layout="seq")


#: A matrix, a vector, a scalar, a parameter without elements and one named as the vector
FLAT_SPEC = {"W": (TensorProto.FLOAT, [4, 3]), "b": (TensorProto.FLOAT, [3]),
             "scale": (TensorProto.FLOAT, []), "empty": (TensorProto.FLOAT, [2, 0]),
             "params": (TensorProto.FLOAT, [2])}


@pytest.mark.parametrize("optimizer", [SGD(), SGD(momentum=0.9, nesterov=True, weight_decay=0.01),
                                       Adam(), AdamW(weight_decay=0.1), TorchAdamW()],
                         ids=["sgd", "nesterov", "adam", "adamw", "torch_adamw"])
def test_flat_layout_updates_as_the_tensor_layout(rng, optimizer):
    """Every parameter in one vector (three tensors cross, whatever the parameters); unpacked
    as TrainingSession runs it, each step's parameters and states are the tensor layout's,
    bit for bit."""
    flat = build_optimizer_model(optimizer, FLAT_SPEC, layout="flat")
    onnx.checker.check_model(flat, full_check=True)
    states = list(optimizer.state_names)
    vectors = ["params", "params.gradient", *[f"params.{s}" for s in states]]
    assert [i.name for i in flat.graph.input] == ["learning_rate", "step", *vectors]
    assert [o.name for o in flat.graph.output] == [
        "params.updated", *[f"params.{s}.updated" for s in states]]
    assert [d.dim_value for d in flat.graph.input[2].type.tensor_type.shape.dim] == [18]
    meta = json.loads({p.key: p.value for p in flat.metadata_props}["ortlearn.optimizer"])
    assert meta["layout"] == "flat" and meta["params"] == list(FLAT_SPEC)
    assert meta["shapes"] == [[4, 3], [3], [], [2, 0], [2]]
    wrapped = unpack_optimizer_model(flat)
    onnx.checker.check_model(wrapped, full_check=True)
    tensors = build_optimizer_model(optimizer, FLAT_SPEC, layout="tensors")
    for io in ("input", "output"):
        assert ([v.name for v in getattr(wrapped.graph, io)]
                == [v.name for v in getattr(tensors.graph, io)])
    sessions = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                for m in (wrapped, tensors)]
    names = [o.name for o in tensors.graph.output]
    start = {p: np.asarray(rng.standard_normal(shape), np.float32)
             for p, (_, shape) in FLAT_SPEC.items()}
    start.update({f"{p}.{s}": np.zeros_like(v) for p, v in list(start.items()) for s in states})
    carried = [dict(start), dict(start)]
    for step in range(1, 6):
        grads = {f"{p}.gradient": np.asarray(rng.standard_normal(shape), np.float32)
                 for p, (_, shape) in FLAT_SPEC.items()}
        for sess, values in zip(sessions, carried):
            feeds = {"learning_rate": np.array(0.05, np.float32),
                     "step": np.array(step, np.int64), **values, **grads}
            for name, value in zip(names, sess.run(names, feeds)):
                values[name.removesuffix(".updated")] = value
        for name in start:
            np.testing.assert_array_equal(carried[0][name], carried[1][name])
    assert not np.array_equal(carried[0]["W"], start["W"])


def test_flat_layout_refusals():
    one = {"w": (TensorProto.FLOAT, [3])}
    with pytest.raises(ValueError, match="PlainSGD does not declare its update element by"):
        build_optimizer_model(PlainSGD(l1=0.1), one, layout="flat")
    with pytest.raises(ValueError, match="clip_grad's global norm.*layout='tensors'"):
        build_optimizer_model(AdamW(clip_grad=1.0), one, layout="flat")
    with pytest.raises(ValueError, match="flat layout .* one element type.*'b': 'DOUBLE'"):
        build_optimizer_model(Adam(), {**one, "b": (TensorProto.DOUBLE, [1])}, layout="flat")
    with pytest.raises(ValueError, match=r"static parameter shapes.*\{'w': \['n', 3\]\}"):
        build_optimizer_model(Adam(), {"w": (TensorProto.FLOAT, ["n", 3])}, layout="flat")
    with pytest.raises(ValueError, match="allowzero, which needs opset 14"):
        build_optimizer_model(Adam(), {"w": (TensorProto.FLOAT, [0, 3])}, layout="flat",
                              opset=13)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_build_into_graph_with_castlike_and_exact_names(rng, dtype):
    """``build`` without elem_types (CastLike) gives the artifact's results."""
    params = random_params(rng, dtype)
    grads = random_grads(rng, params, n_steps=1)[0]
    opt = Adam()
    ref = OptimizerRunner(opt, params)
    ref.step(grads, LR)

    b = GraphBuilder(prefix="fused_")
    names = list(params)
    states = {p: {s: f"{p}_{s}" for s in opt.state_names} for p in names}
    new_params, new_states = opt.build(
        b, names, [f"{p}_grad" for p in names], states, "lr", "t",
        updated_names={"W": "W_new", "W_exp_avg": "W_m_new"})
    assert new_params[0] == "W_new" and new_states["W"]["exp_avg"] == "W_m_new"
    assert "CastLike" in {n.op_type for n in b.nodes}
    vi = helper.make_tensor_value_info
    inputs = [vi("lr", TensorProto.DOUBLE, []), vi("t", TensorProto.INT64, [])]
    for p in names:
        inputs += [vi(n, ONNX_TYPE[dtype], SHAPES[p])
                   for n in (p, f"{p}_grad", *states[p].values())]
    outputs = [vi(n, ONNX_TYPE[dtype], SHAPES[p]) for n, p in zip(new_params, names)]
    graph = helper.make_graph(b.nodes, "fused", inputs, outputs)
    model = finalize_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)]))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"lr": np.array(LR), "t": np.array(1, dtype=np.int64)}
    for p in names:
        feeds.update({p: params[p], f"{p}_grad": grads[p]})
        feeds.update({n: np.zeros_like(params[p]) for n in states[p].values()})
    got = dict(zip(names, sess.run(None, feeds)))
    assert_params(got, ref.params, dtype)


def test_clip_grad_norm_function_validates():
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm(GraphBuilder(), ["g"], 0.0)


def test_errors():
    with pytest.raises(TypeError, match="'k'.*INT64"):
        build_optimizer_model(SGD(), {"k": (TensorProto.INT64, [2])})
    with pytest.raises(ValueError, match="clash.*'step'"):
        build_optimizer_model(SGD(), {"step": (TensorProto.FLOAT, [2])})
    with pytest.raises(ValueError, match="at least one"):
        build_optimizer_model(SGD(), {})
    with pytest.raises(TypeError, match="SGD, Adam, AdamW or TorchAdamW"):
        build_optimizer_model("adamw", {"w": (TensorProto.FLOAT, [2])})
    with pytest.raises(ValueError, match="momentum"):
        SGD(momentum=1.5)
    with pytest.raises(ValueError, match="beta_2"):
        AdamW(betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="betas must be a pair"):
        AdamW(betas=(0.9,))
    with pytest.raises(ValueError, match="clip_grad"):
        Adam(clip_grad=-1)
    with pytest.raises(ValueError, match="'w' lacks state"):
        Adam().build(GraphBuilder(), ["w"], ["g"], {"w": {"exp_avg": "m"}}, "lr", "t")
    with pytest.raises(ValueError, match="2 gradients for 1"):
        SGD().build(GraphBuilder(), ["w"], ["g", "h"], {}, "lr", "t")


def test_init_state():
    p = np.ones((2, 3), dtype=np.float32)
    state = AdamW().init_state(p)
    assert list(state) == ["exp_avg", "exp_avg_sq"]
    assert all(s.dtype == np.float32 and s.shape == (2, 3) and not s.any()
               for s in state.values())
    assert SGD().init_state(p) == {}


# ---------------------------------------------------------------- schedules

def sgd_regressor_path(X, y, etas):
    """One epoch of SGDRegressor (squared error, no penalty, no shuffle) with given etas."""
    w, b = np.zeros(X.shape[1]), 0.0
    for x, target, eta in zip(X, y, etas):
        update = -eta * (x @ w + b - target)
        w, b = w + update * x, b + update
    return w, b


@pytest.mark.parametrize("learning_rate, schedule", [
    ("invscaling", InvScaling(0.05, power_t=0.3)),
    ("optimal", Optimal(alpha=2.0)),
    ("constant", Constant(0.05)),
])
def test_schedules_match_sgd_regressor(rng, learning_rate, schedule):
    X = 0.3 * rng.standard_normal((30, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.1
    est = SGDRegressor(learning_rate=learning_rate, eta0=0.05, power_t=0.3, alpha=2.0,
                       penalty=None, max_iter=1, tol=None, shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
    w, b = sgd_regressor_path(X, y, [schedule.learning_rate(t) for t in range(1, 31)])
    np.testing.assert_allclose(est.coef_, w, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(est.intercept_, [b], rtol=1e-12, atol=1e-14)


def test_optimal_closed_form():
    alpha = 1e-4
    typw = np.sqrt(1 / np.sqrt(alpha))
    t0 = 1 / (typw * alpha)
    sched = Optimal(alpha)
    assert sched.t0 == pytest.approx(t0, rel=1e-15)
    assert [sched.learning_rate(t) for t in (1, 10)] == pytest.approx(
        [1 / (alpha * t0), 1 / (alpha * (t0 + 9))], rel=1e-15)
    # a loss whose derivative exceeds 1 there shrinks the first rate
    assert Optimal(alpha, loss_gradient=lambda y, p: 4.0).learning_rate(1) == pytest.approx(
        typw / 4, rel=1e-14)


def test_invscaling_matches_mlp_sgd_optimizer():
    ref = SGDOptimizer([np.zeros(1)], learning_rate_init=0.1, lr_schedule="invscaling",
                       power_t=0.4)
    sched = InvScaling(0.1, power_t=0.4)
    for samples_seen in (32, 64, 1000):
        ref.iteration_ends(samples_seen)
        assert sched.learning_rate(samples_seen + 1) == ref.learning_rate


def test_adaptive_matches_mlp_trigger_stopping():
    ref = SGDOptimizer([np.zeros(1)], learning_rate_init=0.01, lr_schedule="adaptive")
    sched = Adaptive(0.01)
    for _ in range(12):
        assert sched.on_plateau() == ref.trigger_stopping("", verbose=False)
        assert sched.learning_rate() == ref.learning_rate
    assert sched.on_plateau() is True
    assert Constant(0.1).on_plateau() is True


@pytest.mark.parametrize("warmup, total", [(5, 20), (0, 10), (4, 4)])
def test_linear_lr_closed_form(warmup, total):
    sched = LinearLR(warmup, total, initial_lr=0.3)
    for step in range(total + 3):
        if step < warmup:
            expected = 0.3 * step / warmup
        elif total > warmup:
            expected = 0.3 * max(0.0, (total - step) / (total - warmup))
        else:
            expected = 0.3 * max(0.0, total - step)
        assert sched.learning_rate(step) == pytest.approx(expected, rel=1e-15, abs=1e-16)
    assert sched.learning_rate(warmup) == pytest.approx(0.3 if total > warmup else 0.0)
    assert sched.learning_rate(total) == 0.0


def test_schedule_errors():
    with pytest.raises(ValueError, match="total_step_count"):
        LinearLR(10, -5, 0.1)
    # total before the end of the warmup (onnxruntime-training's API swaps the counts):
    # the rate falls to 0 once the warmup ends, as onnxruntime's formula gives
    assert [LinearLR(4, 2, 1.0).learning_rate(s) for s in range(6)] == [
        0.0, 0.25, 0.5, 0.75, 0.0, 0.0]
    with pytest.raises(ValueError, match="eta0"):
        InvScaling(-1.0)
    with pytest.raises(ValueError, match="step must be >= 1"):
        InvScaling(0.1).learning_rate(0)
    with pytest.raises(ValueError, match="alpha"):
        Optimal(0.0)
