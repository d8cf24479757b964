"""Gradients of the activations and elementwise functions: finite differences, and torch.

Finite differences check each rule away from its kinks; torch autograd (float64)
checks the conventions at the kinks themselves (exact 0, the bounds of Clip,
HardSigmoid, HardSwish...), which finite differences cannot decide, and the
graphs torch's exporters write for GELU, Softplus and PReLU.
"""

import io
import math
import warnings

import gradcheck
import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from gradcheck import (
    RNG,
    analytic_gradient,
    assert_close,
    check_op,
    loss_model,
    node,
    numeric_gradient,
    randn,
    random_weights_of,
    session,
)
from onnx import TensorProto, helper, numpy_helper

from ortlearn.autodiff import build_gradient

ONE_SIXTH = float(np.float32(1 / 6))  # the alpha torch exports for nn.Hardsigmoid


def uniform(lo, hi, kinks=()):
    """Sampler of uniform values in [lo, hi], at least 0.1 away from ``kinks``."""
    def sample(*shape):
        x = RNG.uniform(lo, hi, shape)
        for k in kinks:
            near = np.abs(x - k) < 0.1
            x[near] = k + np.where(x[near] >= k, 0.1, -0.1) * 1.5
        return x
    return sample


NONZERO = uniform(-2, 2, (0,))


# ---------------------------------------------------------------- finite differences
SHAPES = [(5,), (2, 3, 2)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op, data, attrs, opset", [
    ("Gelu", randn, {}, 20),
    ("Gelu", randn, {"approximate": "none"}, 20),
    ("Gelu", randn, {"approximate": "tanh"}, 22),
    ("HardSwish", uniform(-4.5, 4.5, (-3, 3)), {}, 14),
    ("HardSwish", uniform(-4.5, 4.5, (-3, 3)), {}, 22),
    ("Mish", randn, {}, 18),
    ("Mish", randn, {}, 22),
    ("ThresholdedRelu", uniform(-2, 2, (1,)), {}, 13),
    ("ThresholdedRelu", uniform(-2, 2, (0.5,)), {"alpha": 0.5}, 18),
    ("ThresholdedRelu", uniform(-2, 2, (-0.5,)), {"alpha": -0.5}, 22),
    ("HardSigmoid", uniform(-4, 4, (-2.5, 2.5)), {}, 13),
    ("HardSigmoid", uniform(-4, 4, (-3, 3)), {"alpha": ONE_SIXTH, "beta": 0.5}, 18),
    ("HardSigmoid", uniform(-4, 4, (-0.5, 1.5)), {"alpha": -0.5, "beta": 0.75}, 22),
    ("Atan", randn, {}, 13), ("Atan", randn, {}, 22),
    ("Asin", uniform(-0.8, 0.8), {}, 18), ("Acos", uniform(-0.8, 0.8), {}, 18),
    ("Sinh", randn, {}, 18), ("Cosh", randn, {}, 18), ("Tan", uniform(-1.2, 1.2), {}, 18),
    ("Asinh", randn, {}, 18), ("Acosh", uniform(1.2, 3), {}, 18),
    ("Atanh", uniform(-0.8, 0.8), {}, 18),
])
def test_unary_finite_differences(op, data, attrs, opset, shape):
    # float64 in onnx's reference evaluator: onnxruntime has no float64 kernel
    # for these (nor for Erf, Softplus, Cosh, Sinh in their gradients).
    check_op([node(op, ["X"], **attrs)], {"X": data(*shape)}, opset=opset, reference=True)


@pytest.mark.parametrize("op, opset", [("Erf", 13), ("Gelu", 20)])
def test_float64_erf_is_onnxruntime(op, opset):
    """reference_ops.Erf (also inside Gelu's function body) agrees with onnxruntime in
    float32 and is float64-exact, where onnx's own reference Erf rounds to float32."""
    x = np.linspace(-3, 3, 13)
    models = {dt: gradcheck.make_model(
        [node(op, ["X"])], [helper.make_tensor_value_info("X", elem, [13])],
        [helper.make_tensor_value_info("Y", elem, [13])], opset=opset)
        for dt, elem in ((np.float32, TensorProto.FLOAT), (np.float64, TensorProto.DOUBLE))}
    got = session(models[np.float64], reference=True).run(None, {"X": x})[0]
    expected = session(models[np.float32]).run(None, {"X": x.astype(np.float32)})[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    exact = np.array([math.erf(v) for v in x]) if op == "Erf" else np.array(
        [v * (1 + math.erf(v / math.sqrt(2))) / 2 for v in x])
    np.testing.assert_allclose(got, exact, rtol=1e-14, atol=1e-15)


PRELU_SLOPES = [
    ((2, 3, 2, 2), (3, 1, 1)),      # torch's TorchScript exporter: per channel
    ((2, 3, 2, 2), (1, 3, 1, 1)),   # torch's dynamo exporter
    ((2, 3, 2, 2), ()),             # one slope
    ((2, 3, 2, 2), (1,)),
    ((2, 3, 2, 2), (2,)),           # last axis
    ((2, 3, 2, 2), (2, 3, 2, 2)),   # full
    ((4, 3), (3,)),                 # after a Linear
]


@pytest.mark.parametrize("xshape, sshape", PRELU_SLOPES)
@pytest.mark.parametrize("opset", [13, 18])
def test_prelu_finite_differences(xshape, sshape, opset):
    slope = RNG.uniform(0.05, 0.5, sshape)
    check_op([node("PRelu", ["X", "S"])], {"X": NONZERO(*xshape), "S": slope}, opset=opset,
             reference=True)
    # a frozen slope: only x gets a gradient
    check_op([node("PRelu", ["X", "S"])], {"X": NONZERO(*xshape)}, consts={"S": slope},
             opset=opset, reference=True, float32=False)


@pytest.mark.parametrize("sshape", [(3, 1, 1), (1,)])
def test_prelu_symbolic_batch(sshape):
    # x as a graph input of shape [N, C, H, W]: the slope's axes are still known
    x, slope = NONZERO(2, 3, 2, 2), RNG.uniform(0.05, 0.5, sshape)
    model, feeds = loss_model([node("PRelu", ["X", "S"])], {"S": slope}, inputs={"X": x},
                              dtype=np.float32, input_dims={"X": ["N", "C", "H", "W"]})
    grads, _ = analytic_gradient(model, feeds, ["S", "X"])
    r = random_weights_of(model).astype(np.float64)
    s = np.broadcast_to(slope, x.shape)
    expected_s = np.where(x > 0, 0, r * x)
    axes = tuple(i for i in range(4) if i < 4 - len(sshape) or sshape[i - 4 + len(sshape)] == 1)
    expected_s = expected_s.sum(axis=axes).reshape(sshape)
    assert_close(grads["S"], expected_s, rtol=1e-5)
    assert_close(grads["X"], np.where(x > 0, r, r * s), rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("alpha, opset", [(None, 13), (0.5, 18), (2.0, 22)])
def test_celu(alpha, opset, shape):
    # Celu is defined for float32 only: its float32 gradient against the closed form
    x = randn(*shape)
    attrs = {} if alpha is None else {"alpha": alpha}
    model, feeds = loss_model([node("Celu", ["X"], **attrs)], {"X": x}, dtype=np.float32,
                              opset=opset)
    grads, _ = analytic_gradient(model, feeds, ["X"])
    xf = x.astype(np.float32).astype(np.float64)
    slope = np.where(xf > 0, 1, np.exp(xf / (alpha or 1.0)))
    assert_close(grads["X"], random_weights_of(model) * slope, rtol=1e-5)


def test_gelu_refuses_an_unknown_approximation():
    model, _ = loss_model([node("Gelu", ["X"], approximate="none")], {"X": randn(3)},
                          dtype=np.float32, opset=20)
    next(n for n in model.graph.node if n.op_type == "Gelu").attribute[0].s = b"fast"
    with pytest.raises(ValueError, match="Gelu.*approximate='fast'"):
        build_gradient(model, wrt=["X"])


# ---------------------------------------------------------------- torch, at the kinks
def kinked(*kinks, extra=(-2.5, -0.7, 0.3, 1.9)):
    """Each kink, the kink +- 1e-7 and +- 1e-3, and a few values elsewhere (float64)."""
    values = [k + d for k in kinks for d in (0, -1e-7, 1e-7, -1e-3, 1e-3)]
    return np.array(values + list(extra), dtype=np.float64)


def ort_and_torch(nodes, x, torch_fn, consts=None, opset=18, reference=False,
                  dtype=np.float64):
    """Gradient of ReduceSum(Y * R) w.r.t. X by ortlearn, and by torch autograd."""
    model, feeds = loss_model(nodes, {"X": x}, consts=consts, opset=opset, dtype=dtype,
                              reference=reference)
    grads, _ = analytic_gradient(model, feeds, ["X"], reference)
    xt = torch.tensor(x, dtype=torch.float64 if dtype == np.float64 else torch.float32,
                      requires_grad=True)
    (torch_fn(xt) * torch.tensor(random_weights_of(model))).sum().backward()
    return grads["X"], xt.grad.numpy()


def hardtanh(lo, hi):
    return lambda x: F.hardtanh(x, lo, hi)


# (op, attrs, consts, opset, torch function, points, onnxruntime has float64 kernels)
TORCH_CASES = {
    "relu": ("Relu", {}, {}, 18, F.relu, kinked(0), True),
    "relu6": ("Clip", {}, {"lo": 0.0, "hi": 6.0}, 18, F.relu6, kinked(0, 6), True),
    "hardtanh": ("Clip", {}, {"lo": -2.0, "hi": 3.0}, 13, hardtanh(-2.0, 3.0), kinked(-2, 3), True),
    "clamp_min": ("Clip", {}, {"lo": 0.5}, 18, lambda x: torch.clamp(x, min=0.5), kinked(0.5),
                  True),
    "clamp_max": ("Clip", {}, {"hi": 0.5}, 18, lambda x: torch.clamp(x, max=0.5), kinked(0.5),
                  True),
    "leaky_relu": ("LeakyRelu", {"alpha": 0.1}, {}, 18, lambda x: F.leaky_relu(x, 0.1),
                   kinked(0), True),
    "hardsigmoid": ("HardSigmoid", {"alpha": ONE_SIXTH, "beta": 0.5}, {}, 18, F.hardsigmoid,
                    kinked(-3, 0, 3), False),
    "hardswish": ("HardSwish", {}, {}, 18, F.hardswish, kinked(-3, 0, 3), False),
    "softplus": ("Softplus", {}, {}, 18, F.softplus, kinked(0, 20), False),
    "elu": ("Elu", {"alpha": 0.5}, {}, 18, lambda x: F.elu(x, 0.5), kinked(0), True),
    "selu": ("Selu", {}, {}, 18, F.selu, kinked(0), True),
    # (Celu is float32 only: float32 below)
    "celu": ("Celu", {"alpha": 2.0}, {}, 18, lambda x: F.celu(x, 2.0), kinked(0), None),
    "sigmoid": ("Sigmoid", {}, {}, 18, torch.sigmoid, kinked(0), True),
    "tanh": ("Tanh", {}, {}, 18, torch.tanh, kinked(0), True),
    "softsign": ("Softsign", {}, {}, 18, F.softsign, kinked(0), False),
    "gelu": ("Gelu", {}, {}, 20, F.gelu, kinked(0), False),
    "gelu_tanh": ("Gelu", {"approximate": "tanh"}, {}, 20,
                  lambda x: F.gelu(x, approximate="tanh"), kinked(0), False),
    "mish": ("Mish", {}, {}, 18, F.mish, kinked(0), False),
    "threshold": ("ThresholdedRelu", {"alpha": 0.5}, {}, 18, lambda x: F.threshold(x, 0.5, 0.0),
                  kinked(0, 0.5), False),
    "abs": ("Abs", {}, {}, 18, torch.abs, kinked(0), True),
    "atan": ("Atan", {}, {}, 18, torch.atan, kinked(0), False),
    "asin": ("Asin", {}, {}, 18, torch.asin, kinked(0, extra=(-0.9, 0.5)), False),
    "acos": ("Acos", {}, {}, 18, torch.acos, kinked(0, extra=(-0.9, 0.5)), False),
    "sinh": ("Sinh", {}, {}, 18, torch.sinh, kinked(0), False),
    "cosh": ("Cosh", {}, {}, 18, torch.cosh, kinked(0), False),
    "tan": ("Tan", {}, {}, 18, torch.tan, kinked(0, extra=(-1.2, 0.7)), False),
    "asinh": ("Asinh", {}, {}, 18, torch.asinh, kinked(0), False),
    "acosh": ("Acosh", {}, {}, 18, torch.acosh, kinked(2, extra=(1.1, 4.0)), False),
    "atanh": ("Atanh", {}, {}, 18, torch.atanh, kinked(0, extra=(-0.9, 0.5)), False),
}


def _case_nodes(op, attrs, consts):
    inputs = ["X"]
    if op == "Clip":
        inputs += ["lo" if "lo" in consts else "", "hi" if "hi" in consts else ""]
        while not inputs[-1]:
            inputs.pop()
    return [node(op, inputs, **attrs)], {k: np.array(v) for k, v in consts.items()}


@pytest.mark.parametrize("name", [k for k, v in TORCH_CASES.items() if v[-1] is not None])
def test_torch_float64_at_the_kinks(name):
    op, attrs, consts, opset, fn, x, has_f64 = TORCH_CASES[name]
    nodes, consts = _case_nodes(op, attrs, consts)
    grad, expected = ort_and_torch(nodes, x, fn, consts, opset, reference=not has_f64)
    assert_close(grad, expected, rtol=1e-6)


@pytest.mark.parametrize("name", ["relu6", "hardtanh", "clamp_min", "hardsigmoid", "hardswish",
                                  "threshold", "abs", "leaky_relu", "elu", "relu", "celu"])
def test_torch_float32_at_the_kinks(name):
    # float32 in onnxruntime: the same masks at the same points, and one ulp
    # around them (at 3 - 1 ulp onnxruntime's HardSigmoid rounds to 1: a mask
    # read from its output would drop the gradient torch keeps)
    op, attrs, consts, opset, fn, x, _ = TORCH_CASES[name]
    nodes, consts = _case_nodes(op, attrs, consts)
    x = x.astype(np.float32)
    ulp = [np.nextafter(x, np.float32(d)) for d in (-np.inf, np.inf)]
    x = np.concatenate([x] + ulp).astype(np.float64)
    grad, expected = ort_and_torch(nodes, x, fn, consts, opset, dtype=np.float32)
    assert_close(grad, expected, rtol=1e-5)


def test_abs_and_sign_at_zero_in_both_types():
    x = np.array([-1.5, -0.0, 0.0, 2.0])
    for dtype in (np.float32, np.float64):
        model, feeds = loss_model([node("Abs", ["X"])], {"X": x}, dtype=dtype)
        grads, grad_model = analytic_gradient(model, feeds, ["X"])
        assert "Sign" in {n.op_type for n in grad_model.graph.node}
        np.testing.assert_array_equal(grads["X"], random_weights_of(model) * np.sign(x))


def test_trained_clip_bounds_follow_clamp():
    # Trained bounds (torch.clamp with tensor bounds): x gets the gradient where
    # lo <= x <= hi, each bound where it clips strictly.
    x = np.array([-1.0, -0.5, 0.0, 0.7, 1.0])
    lo, hi = np.array(-0.5), np.array(0.7)
    model, feeds = loss_model([node("Clip", ["X", "lo", "hi"])], {"X": x, "lo": lo, "hi": hi})
    grads, _ = analytic_gradient(model, feeds, ["X", "lo", "hi"])
    ts = {k: torch.tensor(v, requires_grad=True) for k, v in (("X", x), ("lo", lo), ("hi", hi))}
    r = torch.tensor(random_weights_of(model))
    (torch.clamp(ts["X"], ts["lo"], ts["hi"]) * r).sum().backward()
    for name in ("X", "lo", "hi"):
        assert_close(grads[name], ts[name].grad.numpy())


@pytest.mark.parametrize("sshape", [(3,), (1,)])
def test_prelu_matches_torch(sshape):
    x = np.concatenate([kinked(0), randn(15)]).reshape(2, 3, 2, 2)
    weight = RNG.uniform(0.05, 0.5, sshape)
    onnx_slope = weight.reshape(-1, 1, 1)
    model, feeds = loss_model([node("PRelu", ["X", "S"])], {"X": x, "S": onnx_slope},
                              reference=True)
    grads, _ = analytic_gradient(model, feeds, ["X", "S"], reference=True)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(weight, requires_grad=True)
    (F.prelu(xt, wt) * torch.tensor(random_weights_of(model))).sum().backward()
    assert_close(grads["X"], xt.grad.numpy())
    assert_close(grads["S"].reshape(sshape), wt.grad.numpy())


# ---------------------------------------------------------------- torch's exported graphs
def _with_loss(model, out, r):
    """The exported ``model`` with ``loss = ReduceSum(out * R)`` as its only output."""
    g = model.graph
    g.node.extend([
        helper.make_node("Constant", [], ["R"], value=numpy_helper.from_array(r, "R")),
        helper.make_node("Mul", [out, "R"], ["YR"]),
        helper.make_node("ReduceSum", ["YR"], ["loss"], keepdims=0)])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("loss", TensorProto.DOUBLE, []))
    return model


def _export(module, x, dynamo, opset):
    xt = torch.from_numpy(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            return torch.onnx.export(module, (xt,), dynamo=True, opset_version=opset,
                                     input_names=["X"], output_names=["Y"],
                                     verbose=False).model_proto
        f = io.BytesIO()
        torch.onnx.export(module, (xt,), f, dynamo=False, opset_version=opset,
                          input_names=["X"], output_names=["Y"])
    return onnx.load_from_string(f.getvalue())


def exported_vs_torch(module, x, dynamo=False, opset=17, wrt=("X",)):
    """ortlearn's gradients of the exported float64 ``module`` and torch's, by name."""
    module = module.double()
    model = _export(module, x, dynamo, opset)
    y = module(torch.from_numpy(x))
    r = RNG.standard_normal(tuple(y.shape))
    model = _with_loss(model, "Y", r)
    params = dict(module.named_parameters())
    inits = {i.name for i in model.graph.initializer}
    names = [n for n in wrt if n == "X" or n in inits]
    grad_model = build_gradient(model, wrt=names)
    res = session(grad_model, reference=True).run(None, {"X": x})
    xt = torch.tensor(x, requires_grad=True)
    (module(xt) * torch.from_numpy(r)).sum().backward()
    torch_grads = {"X": xt.grad.numpy()}
    torch_grads.update({n: p.grad.numpy() for n, p in params.items()})
    return dict(zip(names, res[1:])), torch_grads, model


@pytest.mark.parametrize("approximate, ops", [
    ("none", {"Div", "Erf", "Add", "Mul"}),
    ("tanh", {"Mul", "Add", "Tanh"}),
])
def test_torchscript_gelu_decompositions(approximate, ops):
    # opset 17 has no Gelu: the TorchScript exporter writes the formula
    x = np.concatenate([kinked(0), randn(6)]).reshape(3, 5)
    grads, expected, model = exported_vs_torch(torch.nn.GELU(approximate=approximate), x)
    assert {n.op_type for n in model.graph.node} - {"Constant", "ReduceSum"} == ops
    assert_close(grads["X"], expected["X"])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_torchscript_gelu_opset20(approximate):
    x = np.concatenate([kinked(0), randn(6)]).reshape(3, 5)
    grads, expected, model = exported_vs_torch(torch.nn.GELU(approximate=approximate), x,
                                               opset=20)
    assert "Gelu" in {n.op_type for n in model.graph.node}
    assert_close(grads["X"], expected["X"])


@pytest.mark.parametrize("module", [
    torch.nn.Softplus(beta=2.0), torch.nn.Mish(), torch.nn.Hardswish(), torch.nn.Hardsigmoid(),
    torch.nn.ReLU6(), torch.nn.CELU(0.5), torch.nn.ELU(0.5),
], ids=lambda m: type(m).__name__)
def test_torchscript_activations(module):
    # Softplus(beta) exports as Softplus(x * beta) / beta, Mish as x * Tanh(Softplus(x)),
    # CELU as Cast + Celu in float32 + Cast (Celu is float32 only)
    x = np.concatenate([kinked(-3, 0, 3), randn(5)]).reshape(4, 6)
    grads, expected, _ = exported_vs_torch(module, x)
    assert_close(grads["X"], expected["X"], rtol=1e-5 if isinstance(module, torch.nn.CELU)
                 else 1e-6)


def test_dynamo_softplus_threshold():
    # the dynamo exporter writes torch's threshold as a Where: linear beyond it
    x = np.array([[-1.0, 0.0, 4.9, 5.0, 5.1, 12.0]])
    grads, expected, model = exported_vs_torch(torch.nn.Softplus(beta=2.0, threshold=10.0), x,
                                               dynamo=True, opset=18)
    assert "Where" in {n.op_type for n in model.graph.node}
    assert_close(grads["X"], expected["X"])


@pytest.mark.parametrize("dynamo", [False, True])
def test_exported_prelu_trains_its_slope(dynamo):
    # TorchScript writes the slope as [C, 1, 1], dynamo as [1, C, 1, 1]
    torch.manual_seed(0)
    module = torch.nn.PReLU(3, init=0.2)
    with torch.no_grad():
        module.weight.copy_(torch.tensor([0.1, 0.2, 0.3]))
    x = np.concatenate([kinked(0), randn(15)]).reshape(2, 3, 2, 2)
    module = module.double()
    model = _export(module, x, dynamo, 18)
    slope = next(i for i in model.graph.initializer if i.data_type == TensorProto.DOUBLE)
    assert list(slope.dims) == ([1, 3, 1, 1] if dynamo else [3, 1, 1])
    r = RNG.standard_normal(x.shape)
    grad_model = build_gradient(_with_loss(model, model.graph.output[0].name, r),
                                wrt=["X", slope.name])
    gx, gs = session(grad_model, reference=True).run(None, {"X": x})[1:]
    xt = torch.tensor(x, requires_grad=True)
    (module(xt) * torch.from_numpy(r)).sum().backward()
    assert_close(gx, xt.grad.numpy())
    assert_close(gs.reshape(-1), module.weight.grad.numpy())


def test_numeric_gradient_of_a_gelu_chain():
    # a small network: Gemm -> Gelu -> PRelu -> HardSwish, every weight trained
    nodes = [node("MatMul", ["X", "W"], "H"), node("Gelu", ["H"], "G", approximate="tanh"),
             node("PRelu", ["G", "S"], "P"), node("HardSwish", ["P"])]
    weights = {"X": randn(4, 3), "W": randn(3, 2) * 0.5, "S": np.array([0.2, 0.3])}
    model, feeds = loss_model(nodes, weights, opset=20, reference=True)
    grads, _ = analytic_gradient(model, feeds, list(weights), reference=True)
    ref = numeric_gradient(model, feeds, list(weights), reference=True)
    for name in weights:
        assert_close(grads[name], ref[name])
