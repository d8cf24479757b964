"""``build_forward_backward``: the forward and backward graphs ``ORTModule`` runs, without torch.

Each case is a small opset-18 graph. Its forward graph runs in onnxruntime,
then its backward graph on random cotangents; the gradients must equal
float64 central finite differences of ``sum_k sum(output_k * cotangent_k)``
and :func:`~ortlearn.autodiff.build_gradient` on that loss graph. The
structure contract is checked on every case: the forward returns the model's
outputs then :attr:`saved`; the backward reads the cotangents, the saved
values, then the reused inputs, and returns one gradient per ``wrt`` name.
"""

import numpy as np
import onnx
import pytest
from gradcheck import assert_close, make_model, numeric_gradient
from onnx import TensorProto, helper, numpy_helper

from ortlearn.autodiff import build_forward_backward, build_gradient
from ortlearn.training.device import make_session

D = TensorProto.DOUBLE
RNG = np.random.default_rng(18)


def _info(name, shape, elem=D):
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(value), name))


def _randn(*shape):
    return RNG.standard_normal(shape)


# --------------------------------------------------------------------------- harness


def _check_structure(model, fb, wrt):
    """The contract of :class:`~ortlearn.autodiff.ForwardBackward`."""
    graph_inputs = [i.name for i in model.graph.input]
    initializers = {i.name for i in model.graph.initializer}
    assert fb.outputs == [o.name for o in model.graph.output]
    # A saved value that is also an output (Sin reads its input Y) is returned once.
    assert [o.name for o in fb.forward.graph.output] == list(dict.fromkeys(
        fb.outputs + fb.saved))
    assert [i.name for i in fb.forward.graph.input] == graph_inputs
    assert [i.name for i in fb.backward.graph.input] == (
        list(fb.cotangents.values()) + fb.saved + fb.reused_inputs)
    assert list(fb.gradients) == list(wrt)
    assert [o.name for o in fb.backward.graph.output] == list(fb.gradients.values())
    assert len(set(fb.gradients.values())) == len(wrt)
    # Inputs are fed again, initializers travel with the backward graph: neither is saved.
    assert not set(fb.saved) & (set(graph_inputs) | initializers)
    assert len(set(fb.saved)) == len(fb.saved)
    assert set(fb.reused_inputs) <= set(graph_inputs)
    assert set(fb.cotangents) <= set(fb.outputs)
    assert not set(fb.cotangents.values()) & {v for n in model.graph.node for v in n.output}
    for m in (fb.forward, fb.backward):
        onnx.checker.check_model(m)


def _run(fb, feeds, seed=0):
    """Forward then backward in onnxruntime: (forward values, cotangents, gradients)."""
    forward = make_session(fb.forward)
    names = [o.name for o in fb.forward.graph.output]
    values = dict(zip(names, forward.run(None, feeds)))
    rng = np.random.default_rng(seed)
    cots = {out: rng.standard_normal(values[out].shape).astype(values[out].dtype)
            for out in fb.cotangents}
    back = {fb.cotangents[o]: c for o, c in cots.items()}
    back.update({name: values[name] for name in fb.saved})
    back.update({name: feeds[name] for name in fb.reused_inputs})
    grads = make_session(fb.backward).run(list(fb.gradients.values()), back)
    return values, cots, dict(zip(fb.gradients, grads))


def _loss_model(model, cots):
    """``model`` returning ``loss = sum_k sum(output_k * cot_k)`` (its only output)."""
    nodes = list(model.graph.node)
    parts = []
    for k, (out, cot) in enumerate(cots.items()):
        nodes += [_const(f"cot_{k}", cot), helper.make_node("Mul", [out, f"cot_{k}"], [f"p_{k}"]),
                  helper.make_node("ReduceSum", [f"p_{k}"], [f"s_{k}"], keepdims=0)]
        parts.append(f"s_{k}")
    nodes.append(helper.make_node("Sum", parts, ["loss"]))
    return make_model(nodes, list(model.graph.input), [_info("loss", [])],
                      list(model.graph.initializer))


def _check_gradients(fb, grads, reference_model, feeds, cots, wrt):
    """``grads`` vs finite differences and ``build_gradient`` of ``reference_model``'s loss."""
    loss = _loss_model(reference_model, cots)
    numeric = numeric_gradient(loss, feeds, wrt)
    analytic = dict(zip(wrt, make_session(build_gradient(loss, wrt=wrt)).run(
        [f"{w}_grad" for w in wrt], feeds)))
    for name in wrt:
        assert grads[name].dtype == analytic[name].dtype == np.float64
        assert grads[name].shape == analytic[name].shape
        assert_close(grads[name], numeric[name])
        np.testing.assert_allclose(grads[name], analytic[name], rtol=1e-12, atol=1e-12)


def _check(model, feeds, wrt, differentiable_outputs=None):
    """Build, check the contract, run, check the gradients; returns (fb, values, cots, grads)."""
    before = model.SerializeToString()
    fb = build_forward_backward(model, wrt, differentiable_outputs)
    assert model.SerializeToString() == before
    _check_structure(model, fb, wrt)
    values, cots, grads = _run(fb, feeds)
    _check_gradients(fb, grads, model, feeds, cots, wrt)
    return fb, values, cots, grads


# --------------------------------------------------------------------------- models


def _mlp_nodes(out="Y"):
    return [helper.make_node("MatMul", ["X", "W1"], ["h"]),
            helper.make_node("Add", ["h", "b1"], ["a"]),
            helper.make_node("Tanh", ["a"], ["t"]),
            helper.make_node("MatMul", ["t", "W2"], ["u"]),
            helper.make_node("Add", ["u", "b2"], [out])]


def _mlp_weights():
    return {"W1": _randn(3, 4), "b1": _randn(4), "W2": _randn(4, 2), "b2": _randn(2)}


def _mlp(as_inputs=(), extra_nodes=(), outputs=(("Y", ["N", 2]),), extra_weights=None):
    """X @ W1 + b1 -> Tanh -> @ W2 + b2 = Y; ``as_inputs`` weights are graph inputs;
    ``outputs``: (name, shape) pairs (onnx's checker wants a shape on each)."""
    weights = {**_mlp_weights(), **(extra_weights or {})}
    inputs = [_info("X", ["N", 3])] + [_info(n, list(weights[n].shape)) for n in as_inputs]
    inits = [_init(n, v) for n, v in weights.items() if n not in as_inputs]
    model = make_model(_mlp_nodes() + list(extra_nodes), inputs,
                       [_info(o, shape) for o, shape in outputs], inits)
    feeds = {"X": _randn(5, 3), **{n: weights[n] for n in as_inputs}}
    return model, feeds


def test_mlp_weights_as_initializers():
    model, feeds = _mlp()
    fb, values, _, _ = _check(model, feeds, ["W1", "b1", "W2", "b2"])
    assert fb.cotangents == {"Y": fb.cotangents["Y"]}
    # X is fed again (W1's gradient reads it), the weights travel as initializers.
    assert fb.reused_inputs == ["X"]
    assert {i.name for i in fb.backward.graph.initializer} <= {"W1", "b1", "W2", "b2"}
    assert "t" in fb.saved


def test_mlp_weights_as_inputs_and_gradient_of_the_data():
    model, feeds = _mlp(as_inputs=("W1", "W2"))
    fb, *_ = _check(model, feeds, ["X", "W1", "b1", "W2"])
    assert set(fb.reused_inputs) <= {"X", "W1", "W2"}
    # W2 is read by X's and W1's gradients (through t's), X by W1's: fed again, not saved.
    assert {"X", "W2"} <= set(fb.reused_inputs)


def test_symbolic_batch_runs_on_another_batch_size():
    model, feeds = _mlp()
    fb = build_forward_backward(model, ["W1", "W2"])
    for n in (1, 7):
        sized = {"X": _randn(n, 3)}
        values, cots, grads = _run(fb, sized, seed=n)
        _check_gradients(fb, grads, model, sized, cots, ["W1", "W2"])


def test_float32_keeps_its_dtype():
    model, feeds = _mlp()
    model32 = onnx.ModelProto()
    model32.CopyFrom(model)
    for init in model32.graph.initializer:
        init.CopyFrom(_init(init.name, numpy_helper.to_array(init).astype(np.float32)))
    for value in [*model32.graph.input, *model32.graph.output]:
        value.type.tensor_type.elem_type = TensorProto.FLOAT
    fb = build_forward_backward(model32, ["W1", "b2"])
    _check_structure(model32, fb, ["W1", "b2"])
    feeds32 = {"X": feeds["X"].astype(np.float32)}
    values32, cots32, grads32 = _run(fb, feeds32)
    _, _, grads64 = _run(build_forward_backward(model, ["W1", "b2"]), feeds)
    for name in ("W1", "b2"):
        assert grads32[name].dtype == np.float32
        # Same cotangents (same seed), float32 round-off only.
        np.testing.assert_allclose(grads32[name], grads64[name], rtol=1e-4, atol=1e-5)


def test_integer_output_gets_no_cotangent():
    """ArgMax of the float output: returned by the forward, no cotangent, no gradient."""
    model, feeds = _mlp(extra_nodes=[helper.make_node("ArgMax", ["Y"], ["cls"], axis=1,
                                                      keepdims=0)],
                        outputs=(("cls", ["N"]), ("Y", ["N", 2])))
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    for requested in (None, ["cls", "Y"]):
        fb = build_forward_backward(model, ["W1", "b2"], requested)
        _check_structure(model, fb, ["W1", "b2"])
        assert list(fb.cotangents) == ["Y"]
    fb, values, _, _ = _check(model, feeds, ["W1", "b2"])
    assert values["cls"].dtype == np.int64
    np.testing.assert_array_equal(values["cls"], np.argmax(values["Y"], axis=1))


def test_output_independent_of_wrt_gets_no_cotangent():
    """U depends on X only (not in wrt); V on W2 only; Y on both."""
    extra = [helper.make_node("Relu", ["X"], ["U"]),
             helper.make_node("Sin", ["W2"], ["V"])]
    model, feeds = _mlp(extra_nodes=extra,
                        outputs=(("U", ["N", 3]), ("Y", ["N", 2]), ("V", [4, 2])))
    fb, values, _, grads = _check(model, feeds, ["W1", "W2"])
    assert list(fb.cotangents) == ["Y", "V"]
    np.testing.assert_array_equal(values["U"], np.maximum(feeds["X"], 0))
    # With W1 alone, V does not depend on wrt either.
    fb = build_forward_backward(model, ["W1"])
    assert list(fb.cotangents) == ["Y"]


def test_differentiable_outputs_selects_the_cotangents():
    extra = [helper.make_node("Sin", ["Y"], ["S"])]
    model, feeds = _mlp(extra_nodes=extra, outputs=(("Y", ["N", 2]), ("S", ["N", 2])))
    fb = build_forward_backward(model, ["W1"], differentiable_outputs=["S"])
    _check_structure(model, fb, ["W1"])
    assert list(fb.cotangents) == ["S"]
    assert "Y" in fb.saved  # Sin's gradient reads Y, an output too
    values, cots, grads = _run(fb, feeds)
    # S alone carries a cotangent: Y's output only feeds S.
    reference = make_model(list(model.graph.node), list(model.graph.input),
                           [_info("S", ["N", 2])],
                           list(model.graph.initializer))
    _check_gradients(fb, grads, reference, feeds, cots, ["W1"])
    # No differentiable output at all: every gradient is zero.
    fb = build_forward_backward(model, ["W1", "b2"], differentiable_outputs=[])
    _check_structure(model, fb, ["W1", "b2"])
    assert fb.cotangents == {}
    _, _, grads = _run(fb, feeds)
    assert not np.any(grads["W1"]) and grads["W1"].shape == (3, 4)
    assert not np.any(grads["b2"]) and grads["b2"].shape == (2,)


def test_gradient_equal_to_a_cotangent():
    """Z = W + V and P = Identity(W): W's and V's gradients are the cotangents themselves;
    each backward output is a value of its own (an Identity), not a backward input."""
    nodes = [helper.make_node("Add", ["W", "V"], ["Z"]),
             helper.make_node("Identity", ["V"], ["P"])]
    model = make_model(nodes, [_info("V", [2, 3])], [_info("Z", [2, 3]), _info("P", [2, 3])],
                       [_init("W", _randn(2, 3))])
    feeds = {"V": _randn(2, 3)}
    fb, values, cots, grads = _check(model, feeds, ["W", "V"])
    assert not set(fb.gradients.values()) & {i.name for i in fb.backward.graph.input}
    np.testing.assert_array_equal(grads["W"], cots["Z"])
    np.testing.assert_array_equal(grads["V"], cots["Z"] + cots["P"])
    # Two wrt names whose gradient is the same cotangent: two distinct outputs.
    fb, values, cots, grads = _check(model, feeds, ["W", "V"], differentiable_outputs=["Z"])
    np.testing.assert_array_equal(grads["W"], cots["Z"])
    np.testing.assert_array_equal(grads["V"], cots["Z"])
    assert fb.saved == [] and fb.reused_inputs == []
    # One backward value that is the gradient of both: still one output each.
    model = make_model([helper.make_node("Add", ["W", "V"], ["s"]),
                        helper.make_node("Tanh", ["s"], ["Z"])],
                       [_info("V", [2, 3])], [_info("Z", [2, 3])], [_init("W", _randn(2, 3))])
    fb, values, cots, grads = _check(model, feeds, ["W", "V"])
    np.testing.assert_array_equal(grads["W"], grads["V"])


def test_weight_the_outputs_do_not_depend_on_has_a_zero_gradient():
    model, feeds = _mlp(extra_weights={"unused": _randn(3, 2)})
    fb, _, _, grads = _check(model, feeds, ["W1", "unused"])
    assert grads["unused"].shape == (3, 2)
    assert not np.any(grads["unused"])
    assert np.any(grads["W1"])


def test_dropout_training_mode_saves_its_mask():
    """The mask the forward drew goes to the backward as a saved value: the gradient is
    ``cot * mask / (1 - ratio)`` with that mask (a second forward draws another one)."""
    ratio = 0.5
    nodes = [helper.make_node("MatMul", ["X", "W"], ["h"]),
             helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Dropout", ["t", "ratio", "training"], ["Y"], seed=7)]
    inits = [_init("W", _randn(3, 16)), _init("ratio", np.array(ratio)),
             _init("training", np.array(True))]
    model = make_model(nodes, [_info("X", ["N", 3])], [_info("Y", ["N", 16])], inits)
    feeds = {"X": _randn(6, 3)}
    fb = build_forward_backward(model, ["W"])
    _check_structure(model, fb, ["W"])
    values, cots, grads = _run(fb, feeds)
    masks = [n for n in fb.saved if values[n].dtype == np.bool_]
    assert len(masks) == 1
    mask = values[masks[0]]
    assert mask.shape == (6, 16) and 0 < mask.sum() < mask.size
    np.testing.assert_allclose(values["Y"], np.where(mask, values["t"] / (1 - ratio), 0))
    # The same function with this mask fixed: finite differences and build_gradient.
    fixed = make_model(nodes[:2] + [_const("scale", mask / (1 - ratio)),
                                    helper.make_node("Mul", ["t", "scale"], ["Y"])],
                       [_info("X", ["N", 3])], [_info("Y", ["N", 16])], inits[:1])
    _check_gradients(fb, grads, fixed, feeds, cots, ["W"])


def test_batchnorm_training_mode():
    """Training-mode BatchNormalization: normalised by the batch statistics, which depend
    on the weights before it; its updated running mean is an output without cotangent."""
    nodes = [helper.make_node("MatMul", ["X", "W"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "scale", "bias", "mean", "var"],
                              ["Y", "new_mean", "new_var"], training_mode=1, momentum=0.9),
             helper.make_node("Tanh", ["Y"], ["Z"])]
    inits = [_init("W", _randn(3, 4)), _init("scale", _randn(4)), _init("bias", _randn(4)),
             _init("mean", _randn(4)), _init("var", RNG.uniform(0.5, 2, 4))]
    model = make_model(nodes, [_info("X", ["N", 3])],
                       [_info("Z", ["N", 4]), _info("new_mean", [4])], inits)
    feeds = {"X": _randn(8, 3)}
    # By default every float output depending on wrt gets a cotangent, and no gradient
    # flows through the statistics: the updated mean must be left out by name.
    with pytest.raises(NotImplementedError, match="new_mean"):
        build_forward_backward(model, ["W"])
    fb, values, _, grads = _check(model, feeds, ["W", "scale", "bias"],
                                  differentiable_outputs=["Z"])
    assert list(fb.cotangents) == ["Z"]
    h = feeds["X"] @ numpy_helper.to_array(inits[0])
    np.testing.assert_allclose(values["new_mean"],
                               0.9 * numpy_helper.to_array(inits[3]) + 0.1 * h.mean(0))
    # Batch statistics: the gradient w.r.t. W is not zero although the mean is removed.
    assert np.abs(grads["W"]).max() > 1e-3


def test_constant_read_by_the_backward_is_copied_not_saved():
    nodes = _mlp_nodes("u0") + [_const("c", np.array([2.0, -3.0])),
                                helper.make_node("Mul", ["u0", "c"], ["m"]),
                                helper.make_node("Sin", ["m"], ["Y"])]
    model = make_model(nodes, [_info("X", ["N", 3])], [_info("Y", ["N", 2])],
                       [_init(n, v) for n, v in _mlp_weights().items()])
    fb, *_ = _check(model, {"X": _randn(4, 3)}, ["W1", "b2"])
    assert "c" not in fb.saved
    made = [n for n in fb.backward.graph.node if "c" in n.output]
    assert [n.op_type for n in made] == ["Constant"]


# --------------------------------------------------------------------------- errors


def test_unknown_differentiable_output_raises():
    model, _ = _mlp()
    with pytest.raises(ValueError, match=r"differentiable_outputs \['nope'\]"):
        build_forward_backward(model, ["W1"], differentiable_outputs=["Y", "nope"])


def test_integer_wrt_raises():
    model = make_model([helper.make_node("Cast", ["K"], ["k"], to=D),
                        helper.make_node("Mul", ["k", "W"], ["Y"])],
                       [_info("K", [3], TensorProto.INT64)], [_info("Y", [3])],
                       [_init("W", _randn(3))])
    with pytest.raises(TypeError, match="'K'.*INT64"):
        build_forward_backward(model, ["W", "K"])
    with pytest.raises(ValueError, match="'missing'"):
        build_forward_backward(model, ["missing"])
