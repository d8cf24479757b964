"""Gradients of the normalisations against finite differences and torch autograd (float64)."""

import gradcheck as gc
import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from gradcheck import analytic_gradient, assert_close, check_op, node, randn, random_weights_of
from onnx import TensorProto, helper

from ortlearn import api, artifacts
from ortlearn.autodiff import build_gradient
from ortlearn.graph import check_model, value_info_map


def torch_grads(fn, values, wrt, r):
    """Gradients of ``sum(fn(**tensors) * r)`` w.r.t. ``wrt``, float64 torch autograd."""
    tensors = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k in wrt)
               for k, v in values.items()}
    loss = (fn(**tensors) * torch.tensor(r, dtype=torch.float64)).sum()
    loss.backward()
    return {k: tensors[k].grad.numpy() for k in wrt}


def check_torch(nodes, weights, inputs, fn, opset=18, reference=False, wrt=None, model=None):
    """Analytic float64 gradients of ``nodes`` equal torch's for the same function."""
    if model is None:
        model, _ = gc.loss_model(nodes, weights, inputs=inputs, opset=opset, reference=reference)
    feeds = dict(inputs)
    wrt = list(weights) + list(inputs) if wrt is None else wrt
    grads, _ = analytic_gradient(model, feeds, wrt, reference=reference)
    ref = torch_grads(fn, {**weights, **inputs}, wrt, random_weights_of(model))
    for name in wrt:
        assert_close(grads[name], ref[name])


# ----------------------------------------------------------------- LayerNormalization
LN_CASES = [((3, 4), -1), ((2, 3, 4), -1), ((2, 3, 4), 1), ((2, 3, 2, 2), 2), ((4, 3), 0)]


@pytest.mark.parametrize("shape,axis", LN_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_normalization(shape, axis, with_bias):
    normalized = shape[axis % len(shape):]
    weights = {"S": randn(*normalized)}
    if with_bias:
        weights["B"] = randn(*normalized)
    inputs = ["X", "S", "B"] if with_bias else ["X", "S"]
    ln = node("LayerNormalization", inputs, axis=axis, epsilon=1e-3)
    check_op([ln], {"X": randn(*shape), **weights}, opset=17)

    def fn(X, S, B=None):
        return F.layer_norm(X, normalized, S, B, eps=1e-3)

    check_torch([ln], weights, {"X": randn(*shape)}, fn, opset=17)


def test_layer_normalization_statistics_outputs_declared():
    # Mean and InvStdDev declared but unused: float32 reuses them, float64 recomputes them.
    ln = node("LayerNormalization", ["X", "S", "B"], ["Y", "M", "I"], axis=-1)
    check_op([ln], {"X": randn(3, 5), "S": randn(5), "B": randn(5)}, opset=18)


def test_layer_normalization_statistics_outputs_reaching_the_loss():
    # Y = LN(X) * InvStdDev + Mean: gradients flow through all three outputs.
    nodes = [node("LayerNormalization", ["X", "S"], ["Y0", "M", "I"], axis=1),
             node("Mul", ["Y0", "I"], "Y1"), node("Add", ["Y1", "M"])]
    x, s = randn(2, 3, 4), randn(3, 4)
    model, feeds = gc.loss_model(nodes, {"X": x, "S": s}, dtype=np.float32, opset=18)
    grads, grad_model = analytic_gradient(model, feeds, ["X", "S"])

    def fn(X, S):
        mean = X.mean(dim=(1, 2), keepdim=True)
        inv = 1 / torch.sqrt(X.var(dim=(1, 2), unbiased=False, keepdim=True) + 1e-5)
        return (X - mean) * inv * S * inv + mean

    ref = torch_grads(fn, {"X": x, "S": s}, ["X", "S"], random_weights_of(model))
    for name in ("X", "S"):
        assert_close(grads[name], ref[name], rtol=1e-4)
    # The forward's statistics are reused, not recomputed.
    assert sum(n.op_type == "LayerNormalization" for n in grad_model.graph.node) == 1


def test_layer_normalization_dynamic_batch():
    ln = node("LayerNormalization", ["X", "S", "B"], axis=-1)
    model, feeds = gc.loss_model([ln], {"S": randn(4), "B": randn(4)}, inputs={"X": randn(3, 4)},
                              input_dims={"X": ["N", 4]}, opset=17)
    grads, _ = analytic_gradient(model, feeds, ["S", "B", "X"])
    ref = gc.numeric_gradient(model, feeds, ["S", "B", "X"])
    for name in ("S", "B", "X"):
        assert_close(grads[name], ref[name])


def test_layer_normalization_float32_reuses_the_forward_statistics():
    ln = node("LayerNormalization", ["X", "S", "B"], axis=-1)
    model, _ = gc.loss_model([ln], {"X": randn(3, 4), "S": randn(4), "B": randn(4)},
                          dtype=np.float32, opset=17)
    grad_model = build_gradient(model, wrt=["X", "S"])
    ops = [n.op_type for n in grad_model.graph.node]
    assert "Sqrt" not in ops and ops.count("ReduceMean") == 2


# ----------------------------------------------------------------- GroupNormalization
GN_CASES = [((2, 4, 3), 2), ((2, 6, 2, 2), 3), ((1, 4, 5), 4), ((2, 3, 4), 1)]


@pytest.mark.parametrize("shape,groups", GN_CASES)
@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization(shape, groups, opset):
    channels = shape[1]
    n_affine = groups if opset < 21 else channels
    weights = {"S": randn(n_affine), "B": randn(n_affine)}
    inputs = {"X": randn(*shape)}
    wrt = ["S", "B", "X"]

    def gn(stash_type):
        # onnxruntime's float64 kernel computes the statistics in float32 unless stash_type=11
        extra = {"stash_type": stash_type} if opset >= 21 else {}
        return node("GroupNormalization", ["X", "S", "B"], num_groups=groups, epsilon=1e-3,
                    **extra)

    # onnx's checker and shape inference are short of GroupNormalization (deprecated
    # version 18, no output type): ortlearn.graph's check_model and value_info_map make up.
    model, feeds = gc.loss_model([gn(11)], weights, inputs=inputs, opset=opset)
    model32, feeds32 = gc.loss_model([gn(1)], weights, inputs=inputs, opset=opset,
                                     dtype=np.float32)
    grads, _ = analytic_gradient(model, feeds, wrt)
    grads32, _ = analytic_gradient(model32, feeds32, wrt)
    ref = gc.numeric_gradient(model, feeds, wrt)

    def fn(X, S, B):
        if opset < 21:  # one scale and bias per group
            S, B = (t.repeat_interleave(channels // groups) for t in (S, B))
        return F.group_norm(X, groups, S, B, eps=1e-3)

    torch_ref = torch_grads(fn, {**weights, **inputs}, wrt, random_weights_of(model))
    for name in wrt:
        assert_close(grads[name], ref[name])
        assert_close(grads[name], torch_ref[name])
        assert_close(grads32[name], grads[name], rtol=2e-3)


# -------------------------------------------------------------- InstanceNormalization
@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 2, 3, 3), (2, 2, 2, 1, 3)])
def test_instance_normalization(shape):
    channels = shape[1]
    weights = {"S": randn(channels), "B": randn(channels)}
    inorm = node("InstanceNormalization", ["X", "S", "B"], epsilon=1e-3)
    check_op([inorm], {"X": randn(*shape), **weights}, reference=True)

    def fn(X, S, B):
        return F.instance_norm(X, weight=S, bias=B, eps=1e-3)

    check_torch([inorm], weights, {"X": randn(*shape)}, fn, reference=True)


# ----------------------------------------------------------------- BatchNormalization
BN_SHAPES = [(4, 3), (3, 2, 4), (2, 3, 2, 2)]


@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("opset,attrs", [(15, {}), (15, {"training_mode": 0}), (13, {})])
def test_batch_normalization_inference(shape, opset, attrs):
    c = shape[1]
    weights = {"S": randn(c), "B": randn(c), "mean": randn(c), "var": gc.positive(c)}
    bn = node("BatchNormalization", ["X", "S", "B", "mean", "var"], epsilon=1e-2, **attrs)
    # Running statistics in inference mode are plain parameters of an affine map.
    check_op([bn], {"X": randn(*shape), **weights}, opset=opset)

    def fn(X, S, B, mean, var):
        return F.batch_norm(X, mean, var, S, B, training=False, eps=1e-2)

    # torch refuses gradients w.r.t. the running statistics
    check_torch([bn], weights, {"X": randn(*shape)}, fn, opset=opset, wrt=["S", "B", "X"])


@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("opset,outputs,attrs", [
    (15, ["Y", "rm", "rv"], {"training_mode": 1, "momentum": 0.8}),
    (14, ["Y", "rm", "rv"], {"training_mode": 1}),
    (13, ["Y", "rm", "rv", "sm", "sv"], {"momentum": 0.8}),  # before 14: outputs say training
])
def test_batch_normalization_training(shape, opset, outputs, attrs):
    c = shape[1]
    stats = {"mean": randn(c), "var": gc.positive(c)}
    weights = {"S": randn(c), "B": randn(c)}
    bn = node("BatchNormalization", ["X", "S", "B", "mean", "var"], outputs, epsilon=1e-2,
              **attrs)
    check_op([bn], {"X": randn(*shape), **weights}, consts=stats, opset=opset)

    def fn(X, S, B):
        running = [torch.tensor(v) for v in stats.values()]
        return F.batch_norm(X, *running, S, B, training=True, eps=1e-2)

    nodes = [helper.make_node("Constant", [], [k], value=helper.make_tensor(
        k, TensorProto.DOUBLE, v.shape, v.ravel())) for k, v in stats.items()] + [bn]
    check_torch(nodes, weights, {"X": randn(*shape)}, fn, opset=opset)


def test_batch_normalization_training_running_statistics_get_no_gradient():
    bn = node("BatchNormalization", ["X", "S", "B", "mean", "var"], ["Y", "rm", "rv"],
              training_mode=1)
    c = 3
    model, feeds = gc.loss_model([bn], {"S": randn(c), "B": randn(c), "mean": randn(c),
                                     "var": gc.positive(c)}, inputs={"X": randn(4, c)}, opset=15)
    grads, _ = analytic_gradient(model, feeds, ["S", "mean", "var"])
    assert not grads["mean"].any() and not grads["var"].any()


def test_batch_normalization_statistics_output_reaching_the_loss_is_refused():
    nodes = [node("BatchNormalization", ["X", "S", "B", "mean", "var"], ["Y0", "rm", "rv"],
                  training_mode=1),
             node("Add", ["Y0", "rm"])]
    c = 3
    model, _ = gc.loss_model(nodes, {"S": randn(c), "B": randn(c), "mean": randn(c),
                                  "var": gc.positive(c)}, inputs={"X": randn(4, c)}, opset=15)
    with pytest.raises(NotImplementedError, match="BatchNormalization.*only its output Y"):
        build_gradient(model, wrt=["S"])


def test_batch_normalization_training_dynamic_batch():
    bn = node("BatchNormalization", ["X", "S", "B", "mean", "var"], ["Y", "rm", "rv"],
              training_mode=1)
    c = 2
    weights = {"S": randn(c), "B": randn(c), "mean": randn(c), "var": gc.positive(c)}
    inputs = {"X": randn(5, c, 3)}
    model, feeds = gc.loss_model([bn], weights, inputs=inputs, input_dims={"X": ["N", c, "L"]},
                              opset=15)
    grads, _ = analytic_gradient(model, feeds, ["S", "B", "X"])
    ref = gc.numeric_gradient(model, feeds, ["S", "B", "X"])
    for name in ("S", "B", "X"):
        assert_close(grads[name], ref[name])


def _group_norm18_model(seed=0):
    """X (N, 4, 3) -> GroupNormalization-18 (2 groups) -> Relu -> Y, float32."""
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [node("GroupNormalization", ["X", "S", "B"], "G", num_groups=2, epsilon=1e-3),
         node("Relu", ["G"], "Y")], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4, 3])],
        [onnx.numpy_helper.from_array(rng.uniform(0.5, 1.5, 2).astype(np.float32), "S"),
         onnx.numpy_helper.from_array(rng.uniform(0.5, 1.5, 2).astype(np.float32), "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_group_normalization18_passes_the_checker_through_build_gradient():
    """onnx's checker refuses the deprecated GroupNormalization-18 that onnxruntime runs:
    finalize_model tolerates that deprecation only, and GroupNormalization's output gets
    X's type (onnx infers none) for the rules downstream (Relu's needs it)."""
    model = _group_norm18_model()
    with pytest.raises(onnx.checker.ValidationError, match="deprecated"):
        onnx.checker.check_model(model)
    model.graph.node.extend([node("ReduceSumSquare", ["Y"], "loss", keepdims=0)])
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    infos = value_info_map(model)
    assert infos["G"].type.tensor_type.elem_type == TensorProto.FLOAT
    grad_model = build_gradient(model, wrt=["S", "B"])
    x = randn(2, 4, 3)
    loss, ds, db = gc.session(grad_model).run(None, {"X": x.astype(np.float32)})
    s, b = (torch.tensor(onnx.numpy_helper.to_array(i).astype(np.float64), requires_grad=True)
            for i in model.graph.initializer)
    y = F.relu(F.group_norm(torch.tensor(x), 2, s.repeat_interleave(2), b.repeat_interleave(2),
                            eps=1e-3))
    (y * y).sum().backward()
    assert_close(loss, (y * y).sum().item(), rtol=1e-5)
    assert_close(ds, s.grad.numpy(), rtol=1e-4)
    assert_close(db, b.grad.numpy(), rtol=1e-4)


@pytest.mark.parametrize("seed", [0, 1])
def test_group_normalization18_generate_artifacts(tmp_path, seed):
    """The artifacts of a GroupNormalization-18 model train: Relu(GN(X)) pulled to 0."""
    model = _group_norm18_model(seed)
    artifacts.generate_artifacts(model, requires_grad=["S", "B"],
                                 loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = api.Module(str(tmp_path / "training_model.onnx"), state,
                        str(tmp_path / "eval_model.onnx"))
    optimizer = api.Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(0.05)
    x = np.random.default_rng(seed).standard_normal((3, 4, 3)).astype(np.float32)
    target = np.zeros((3, 4, 3), np.float32)
    losses = []
    for _ in range(5):
        losses.append(float(np.asarray(module(x, target))))
        optimizer.step()
        module.lazy_reset_grad()
    assert all(later < before for before, later in zip(losses, losses[1:])), losses


def test_check_model_tolerates_only_that_deprecation():
    """A deprecated operator not listed in TOLERATED_DEPRECATED_OPS still fails the check,
    and so does any other error of a model with a GroupNormalization-18."""
    up = helper.make_graph(
        [node("Upsample", ["X", "s"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 3]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2, 3])])
    with pytest.raises(onnx.checker.ValidationError, match="Upsample is deprecated"):
        check_model(helper.make_model(up, opset_imports=[helper.make_opsetid("", 13)],
                                      ir_version=8))
    model = _group_norm18_model()
    model.ir_version = 8
    check_model(model)
    model.graph.node[1].input[0] = "missing"
    with pytest.raises(onnx.checker.ValidationError, match="missing"):
        check_model(model)
