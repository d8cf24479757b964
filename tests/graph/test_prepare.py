"""Graphs made ready for differentiation (ortlearn.graph.prepare), constants that are not
weights, and Dropout in training mode."""

import io
import logging
import warnings

import numpy as np
import onnx
import pytest
import torch
from gradcheck import (
    analytic_gradient,
    assert_close,
    loss_model,
    node,
    numeric_gradient,
    randn,
    session,
)
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from ortlearn import api, artifacts
from ortlearn.autodiff import append_backward, build_gradient
from ortlearn.exceptions import NoGradientRuleError
from ortlearn.graph import (
    GraphBuilder,
    constant_initializers,
    get_train_initializer,
    prepare_for_gradient,
)
from ortlearn.graph.prepare import fold_constant_ifs, inline_functions

DOMAIN = "pkg.custom"


def _ref(name, ref, kind=AttributeProto.FLOAT):
    a = AttributeProto()
    a.name, a.ref_attr_name, a.type = name, ref, kind
    return a


def _functions():
    """``Act(x) = LeakyRelu(Tanh(x), alpha=@alpha)`` (alpha defaults to 0.5) and
    ``Block(x, w) = Act(x * w + Mul(x, x))`` forwarding its ``slope`` to Act's alpha;
    ``Norm(x)`` is a mean-centring with a Constant inside."""
    act = helper.make_function(
        DOMAIN, "Act", ["x"], ["y"],
        [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("LeakyRelu", ["t"], ["y"])],
        [helper.make_opsetid("", 18)], attribute_protos=[helper.make_attribute("alpha", 0.5)])
    act.node[1].attribute.append(_ref("alpha", "alpha"))
    block = helper.make_function(
        DOMAIN, "Block", ["x", "w"], ["z"],
        [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Mul", ["x", "x"], ["xx"]),
         helper.make_node("Add", ["xw", "xx"], ["s"]),
         helper.make_node("Act", ["s"], ["z"], domain=DOMAIN)],
        [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)], attributes=["slope"])
    block.node[3].attribute.append(_ref("alpha", "slope"))
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    norm = helper.make_function(
        DOMAIN, "Norm", ["x"], ["y"],
        [helper.make_node("Constant", [], ["axes"], value=axes),
         helper.make_node("ReduceMean", ["x", "axes"], ["m"]),
         helper.make_node("Sub", ["x", "m"], ["y"])], [helper.make_opsetid("", 18)])
    return [act, block, norm]


def _function_model(dtype=np.float64):
    nodes = [node("Block", ["X", "W"], "b1", domain=DOMAIN, slope=0.2),
             node("Block", ["b1", "V"], "b2", domain=DOMAIN),  # Act's default 0.5
             node("Act", ["b2"], "a", domain=DOMAIN),
             node("Norm", ["a"], "Y", domain=DOMAIN)]
    rng = np.random.default_rng(3)
    weights = {"W": rng.standard_normal((3, 4)), "V": rng.standard_normal((4,))}
    model, feeds = _with_functions(nodes, weights, {"X": rng.standard_normal((3, 4))}, dtype)
    return model, feeds, list(weights)


def _with_functions(nodes, weights, inputs, dtype):
    """gradcheck's loss model, with the local functions and their domain."""
    plain = [node("Identity", ["X"], "Y")]  # loss_model runs the graph: placeholders first
    model, feeds = loss_model(plain, weights, inputs=inputs, dtype=dtype)
    graph = model.graph
    tail = list(graph.node)[1:]
    del graph.node[:]
    graph.node.extend(list(nodes) + tail)
    model.functions.extend(_functions())
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    model.ir_version = 10  # finalize_model knows no IR version for pkg.custom
    onnx.checker.check_model(model)
    return model, feeds


# -- local functions ----------------------------------------------------------------------

def test_inlining_keeps_values_nested_calls_attribute_references_and_defaults():
    model, feeds, _ = _function_model()
    inlined = inline_functions(model)
    assert not inlined.functions and len(model.functions) == 3
    assert all(n.domain in ("", "ai.onnx") for n in inlined.graph.node)
    # LeakyRelu alphas: 0.2 forwarded, then Act's default 0.5 twice (onnx's inliner alone
    # drops defaults and writes LeakyRelu's own 0.01)
    alphas = [a.f for n in inlined.graph.node if n.op_type == "LeakyRelu" for a in n.attribute]
    assert alphas == pytest.approx([0.2, 0.5, 0.5])
    expected = session(model).run(None, feeds)  # onnxruntime runs the functions itself
    np.testing.assert_allclose(session(inlined).run(None, feeds)[0], expected[0], rtol=1e-12)


def test_gradient_through_inlined_functions_matches_finite_differences():
    model, feeds, wrt = _function_model()
    grads, grad_model = analytic_gradient(model, feeds, wrt)
    assert not grad_model.functions
    ref = numeric_gradient(model, feeds, wrt)  # on the model with its functions
    for name in wrt:
        assert_close(grads[name], ref[name])
    model32, feeds32, _ = _function_model(np.float32)
    grads32, _ = analytic_gradient(model32, feeds32, wrt)
    for name in wrt:
        assert_close(grads32[name], grads[name], rtol=2e-3)


def test_append_backward_with_a_builder_claims_the_inlined_names():
    model, feeds, wrt = _function_model()
    expected, _ = analytic_gradient(model, feeds, wrt)
    builder = GraphBuilder.for_model(model, prefix="")
    grads = append_backward(model, "loss", wrt, builder=builder)
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(grads[w], TensorProto.DOUBLE,
                                                            expected[w].shape) for w in wrt)
    onnx.checker.check_model(model, full_check=True)
    for name, value in zip(wrt, session(model).run(None, feeds)):
        np.testing.assert_array_equal(value, expected[name])


def test_torchscript_modules_as_functions_gradient_equals_torch():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2),
                              torch.nn.Softmax(dim=-1)).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), f, dynamo=False, input_names=["x"], output_names=["y"],
                          opset_version=18, export_modules_as_functions=True,
                          do_constant_folding=False)
    model = onnx.load_from_string(f.getvalue())
    assert {fn.name for fn in model.functions} >= {"Linear", "Tanh", "Softmax"}
    r = np.random.default_rng(0).standard_normal((3, 2))
    tail = [helper.make_node("Constant", [], ["R"], value=numpy_helper.from_array(r)),
            helper.make_node("Mul", [model.graph.output[0].name, "R"], ["yr"]),
            helper.make_node("ReduceSum", ["yr"], ["loss"], keepdims=0)]
    model.graph.node.extend(tail)
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("loss", TensorProto.DOUBLE, []))
    wrt = get_train_initializer(model)
    assert sorted(wrt) == sorted(n for n, _ in net.named_parameters())
    grads = session(build_gradient(model, wrt=wrt)).run(None, {"x": x.numpy()})
    (net(x) * torch.from_numpy(r)).sum().backward()
    torch_grads = dict(net.named_parameters())
    for name, grad in zip(wrt, grads[1:]):
        assert_close(grad, torch_grads[name].grad.numpy())


def test_op_of_another_domain_without_rule_names_op_and_node():
    nodes = [node("Mul", ["X", "W"], "t"), node("Foo", ["t"], "f", domain="pkg.other", name="foo1"),
             node("ReduceSum", ["f"], "Y", keepdims=0)]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])],
                          [numpy_helper.from_array(np.ones(2, np.float32), "W")]),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("pkg.other", 1)])
    with pytest.raises(NoGradientRuleError, match=r"'pkg\.other\.Foo'.*'foo1'"):
        build_gradient(model, wrt=["W"], loss_output="Y")


# -- If nodes with a constant condition ---------------------------------------------------

def _branch(name, nodes, outputs, inits=(), elem=TensorProto.DOUBLE):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(o, elem, None)
                                               for o in outputs], list(inits))


def _check_if(make_nodes, weights, consts, inputs):
    """gradcheck's ``check_op`` for nodes whose subgraphs declare their float type."""
    wrt = list(weights)
    model, feeds = loss_model(make_nodes(TensorProto.DOUBLE), weights, consts, inputs)
    grads, _ = analytic_gradient(model, feeds, wrt)
    ref = numeric_gradient(model, feeds, wrt)
    model32, feeds32 = loss_model(make_nodes(TensorProto.FLOAT), weights, consts, inputs,
                                  np.float32)
    grads32, _ = analytic_gradient(model32, feeds32, wrt)
    for name in wrt:
        assert_close(grads[name], ref[name])
        assert_close(grads32[name], grads[name], rtol=2e-3)
    return grads


def _if_nodes(flag: bool, inner_flag: bool, elem=TensorProto.DOUBLE):
    """``If(c)``: then ``(X*W + B, W)`` with a nested ``If(d)`` and a branch initializer;
    else ``(Tanh(X) * W, Tanh(X) * W)``."""
    inner = node("If", ["d"], ["u"],
                 then_branch=_branch("t2", [node("Sin", ["xw"], "u1")], ["u1"], elem=elem),
                 else_branch=_branch("e2", [node("Mul", ["xw", "xw"], "u2")], ["u2"], elem=elem))
    dtype = np.float64 if elem == TensorProto.DOUBLE else np.float32
    scale = numpy_helper.from_array(np.array(1.5, dtype), "scale")
    then = _branch("t", [node("Mul", ["X", "W"], "xw"), inner, node("Mul", ["u", "scale"], "us"),
                         node("Add", ["us", "B"], "o1"), node("Identity", ["W"], "wo")],
                   ["o1", "wo"], [scale], elem)
    other = _branch("e", [node("Tanh", ["X"], "tx"), node("Mul", ["tx", "W"], "o1"),
                          node("Identity", ["o1"], "o2")], ["o1", "o2"], elem=elem)
    return [node("If", ["c"], ["z", "w_out"], then_branch=then, else_branch=other, name="if0"),
            node("Mul", ["z", "w_out"], "Y")], {"c": np.array(flag), "d": np.array(inner_flag)}


@pytest.mark.parametrize("flag,inner_flag", [(True, True), (True, False), (False, True)])
def test_gradient_through_folded_if_matches_finite_differences(flag, inner_flag):
    consts = _if_nodes(flag, inner_flag)[1]
    grads = _check_if(lambda elem: _if_nodes(flag, inner_flag, elem)[0],
                      {"W": randn(2, 3), "B": randn(3)}, consts, {"X": randn(2, 3)})
    if not flag:
        assert np.all(grads["B"] == 0)


def test_folding_renames_branch_values_and_keeps_outputs():
    nodes, consts = _if_nodes(True, False)
    model, feeds = loss_model(nodes, {"W": randn(2, 3), "B": randn(3)}, consts=consts,
                              inputs={"X": randn(2, 3)})
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    assert fold_constant_ifs(folded) == 2
    assert not [n for n in folded.graph.node if n.op_type == "If"]
    assert "scale" not in {i.name for i in folded.graph.initializer}  # a Constant now
    onnx.checker.check_model(folded, full_check=True)
    np.testing.assert_allclose(session(folded).run(None, feeds)[0],
                               session(model).run(None, feeds)[0], rtol=1e-12)


def test_if_on_static_shape_is_folded():
    cond = [node("Shape", ["X"], "s"), node("Gather", ["s", "zero"], "n", axis=0),
            node("Equal", ["n", "two"], "c")]

    def nodes(elem):
        then = _branch("t", [node("Mul", ["X", "W"], "o")], ["o"], elem=elem)
        other = _branch("e", [node("Add", ["X", "W"], "o")], ["o"], elem=elem)
        return cond + [node("If", ["c"], ["Y"], then_branch=then, else_branch=other)]

    consts = {"zero": np.array(0, np.int64), "two": np.array(2, np.int64)}
    x = randn(2, 3)
    grads = _check_if(nodes, {"W": randn(2, 3)}, consts, {"X": x})
    np.testing.assert_allclose(grads["W"], x * numpy_helper.to_array(
        next(n for n in loss_model(nodes(TensorProto.DOUBLE), {"W": x}, consts, {"X": x})[0]
             .graph.node if n.output[0] == "R").attribute[0].t))
    model, _ = loss_model(nodes(TensorProto.DOUBLE), {"W": randn(2, 3)}, consts=consts,
                          inputs={"X": x})
    assert prepare_for_gradient(model, ["W"])


def _dynamic_if_model(reached: bool):
    then = _branch("t", [node("Mul", ["X", "W" if reached else "X"], "o")], ["o"])
    other = _branch("e", [node("Add", ["X", "X"], "o")], ["o"])
    nodes = [node("ReduceSum", ["X"], "sx", keepdims=0), node("Greater", ["sx", "zero"], "c"),
             node("If", ["c"], ["z"], then_branch=then, else_branch=other, name="dyn_if"),
             node("Mul", ["z", "W"], "Y")]
    return loss_model(nodes, {"W": randn(2, 3)}, consts={"zero": np.array(0.0)},
                      inputs={"X": randn(2, 3)})


def test_data_dependent_if_reached_by_a_weight_is_refused():
    model, _ = _dynamic_if_model(reached=True)
    with pytest.raises(NoGradientRuleError, match=r"If node 'dyn_if'.*out of ortlearn's scope"):
        build_gradient(model, wrt=["W"])


def test_data_dependent_if_not_reached_stays_and_differentiates():
    model, feeds = _dynamic_if_model(reached=False)
    grads, grad_model = analytic_gradient(model, feeds, ["W"])
    assert [n.op_type for n in grad_model.graph.node].count("If") == 1
    assert_close(grads["W"], numeric_gradient(model, feeds, ["W"])["W"])


# -- constants are not weights ------------------------------------------------------------

def test_constant_initializers_table():
    f = np.array(0.5)
    inits = {"ratio": f, "mean": np.zeros(2), "var": np.ones(2), "scales": np.ones(4),
             "shape_f": np.array([2.0, 1.0]), "lo": np.array(-1.0), "shared": f,
             "scale": np.ones(2), "bias": np.zeros(2)}
    nodes = [node("Dropout", ["X", "ratio"], "d"),
             node("BatchNormalization", ["d", "scale", "bias", "mean", "var"], "bn"),
             node("Resize", ["bn", "", "scales"], "rs"),
             node("Cast", ["shape_f"], "shape_i", to=TensorProto.INT64),
             node("Reshape", ["rs", "shape_i"], "r"), node("Clip", ["r", "lo"], "cl"),
             node("Dropout", ["cl", "shared"], "d2"), node("Mul", ["d2", "shared"], "Y")]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [1, 2, 1, 1])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()]))
    constants = constant_initializers(model)
    assert sorted(constants) == ["mean", "ratio", "scales", "shape_f", "var"]
    assert constants["ratio"] == "Dropout input 1 ('ratio') of node ''"
    assert "'input_mean'" in constants["mean"]
    assert get_train_initializer(model) == ["lo", "shared", "scale", "bias"]


def _export(module, x, dynamo):
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if dynamo:
                return torch.onnx.export(module, (x,), dynamo=True, verbose=False).model_proto
            f = io.BytesIO()
            torch.onnx.export(module, (x,), f, dynamo=False, input_names=["x"],
                              output_names=["y"], training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False)
            return onnx.load_from_string(f.getvalue())
    finally:
        logging.disable(logging.NOTSET)


def _dropout_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(0.3)).train()


def _train(training, eval_model, optim, state, steps, x, y):
    module = api.Module(training, state, eval_model)
    optimizer = api.Optimizer(optim, module)
    losses = []
    for _ in range(steps):
        out = module(x, y)
        losses.append(np.asarray(out[0] if isinstance(out, list) else out).item())
        optimizer.step()
        module.lazy_reset_grad()
    return module, losses


def test_dropout_ratio_is_never_trained():
    x = torch.randn(8, 4)
    # TorchScript writes the ratio as a Constant node: never a weight
    script = _export(_dropout_net(), x, dynamo=False)
    assert get_train_initializer(script) == ["0.weight", "0.bias"]
    # the dynamo exporter folds it into a float initializer, which AdamW's weight decay
    # used to move from 0.3 to 0.25
    model = _export(_dropout_net(), x, dynamo=True)
    ratio = next(n.input[1] for n in model.graph.node if n.op_type == "Dropout")
    assert ratio in {i.name for i in model.graph.initializer}
    assert get_train_initializer(model) == ["0.weight", "0.bias"]
    with pytest.warns(UserWarning, match=rf"{ratio!r} is not trained.*'ratio'"):
        training, eval_model, optim, state = artifacts.build_artifacts(
            model, requires_grad=["0.weight", "0.bias", ratio],
            loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.AdamW)
    trainable = [i.name for i in training.graph.output if i.name.endswith("_grad.accumulation.out")]
    assert not any(ratio in name for name in trainable)
    before = state.parameters["0.weight"].data
    # get_train_initializer leaves the ratio out: a constant of the models (it was trained,
    # and moved from 0.3 to 0.29991 in these 30 steps, to 0.25 in longer runs)
    default_state = artifacts.build_artifacts(
        model, requires_grad=get_train_initializer(model), loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.AdamW)[3]
    assert [name for name, _ in default_state.parameters] == ["0.weight", "0.bias"]
    # requires_grad=None trains nothing, as in onnxruntime-training
    nothing = artifacts.build_artifacts(model, loss=artifacts.LossType.MSELoss)[3]
    assert [name for name, _ in nothing.parameters] == []
    api.set_seed(1)
    module, losses = _train(training, eval_model, optim, state, 30,
                            x.numpy(), np.zeros((8, 3), np.float32))
    params = state.parameters
    assert not params[ratio].requires_grad
    assert params[ratio].data == np.float32(0.3)  # frozen: exactly its value
    assert not np.allclose(params["0.weight"].data, before)
    assert all(np.isfinite(losses))


# -- Dropout in training mode -------------------------------------------------------------

def _dropout_loss(p, training_mode=True, opset=18):
    """``loss = ReduceSum(Dropout(W, ratio, training_mode) * R)``, W of 400 elements."""
    nodes = [node("Dropout", ["W", "ratio"] + (["training"] if training_mode is not None else []),
                  "Y")]
    consts = {} if training_mode is None else {"training": np.array(training_mode)}
    model, _ = loss_model(nodes, {"W": randn(20, 20), "ratio": np.array(p)}, consts=consts,
                          opset=opset)
    return model


@pytest.mark.parametrize("p", [0.3, 0.5])
def test_dropout_gradient_uses_the_forward_mask_and_torch_scaling(p):
    model = _dropout_loss(p)
    grad_model = build_gradient(model, wrt=["W", "ratio"])
    sess = session(grad_model)
    w = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "W"))
    r = numpy_helper.to_array(next(n for n in model.graph.node if n.output[0] == "R")
                              .attribute[0].t)
    masks = []
    for _ in range(3):
        loss, g_w, g_ratio = sess.run(None, {})
        kept = g_w != 0
        # kept elements scaled by torch's 1 / (1 - p), the others zero
        np.testing.assert_allclose(g_w[kept], r[kept] / (1 - p), rtol=1e-12)
        # the loss is linear in W: the same mask drew the forward and the gradient
        # (onnxruntime's forward scales by 1 / (1 - p) in float32: 1e-8 apart)
        np.testing.assert_allclose(loss, np.sum(g_w * w), rtol=1e-7)
        assert abs(kept.mean() - (1 - p)) < 0.1
        assert np.all(g_ratio == 0)  # the ratio never gets a gradient
        masks.append(kept)
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


@pytest.mark.parametrize("training_mode", [None, False])
def test_dropout_without_training_mode_is_the_identity(training_mode):
    model = _dropout_loss(0.5, training_mode)
    grads, _ = analytic_gradient(model, {}, ["W"])
    r = numpy_helper.to_array(next(n for n in model.graph.node if n.output[0] == "R")
                              .attribute[0].t)
    np.testing.assert_array_equal(grads["W"], r)


def _dropout_artifacts():
    rng = np.random.default_rng(0)
    nodes = [node("MatMul", ["x", "W"], "h"),
             node("Dropout", ["h", "ratio", "training"], ["y"], name="drop")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "W"),
         numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
         numpy_helper.from_array(np.array(True), "training")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return artifacts.build_artifacts(model, requires_grad=["W"], loss=artifacts.LossType.MSELoss,
                                     optimizer=artifacts.OptimType.SGD,
                                     additional_output_names=["y"])


def test_dropout_masks_are_fresh_every_step_and_reproducible_with_set_seed():
    training, eval_model, optim, _ = _dropout_artifacts()
    x = np.random.default_rng(1).standard_normal((16, 6)).astype(np.float32)
    target = np.zeros((16, 5), np.float32)
    runs = []
    for _ in range(2):
        api.set_seed(1234)
        state = _dropout_artifacts()[3]
        module = api.Module(training, state, eval_model)
        optimizer = api.Optimizer(optim, module)
        losses, masks = [], []
        for _ in range(5):
            loss, y = module(x, target)
            losses.append(float(loss))
            masks.append(y != 0)
            optimizer.step()
            module.lazy_reset_grad()
        runs.append((losses, masks, state.parameters["W"].data))
        module.eval()
        w = state.parameters["W"].data
        # eval: the identity, no 1 / (1 - p) scaling
        np.testing.assert_allclose(module(x, target)[1], x @ w, rtol=1e-5, atol=1e-6)
    (losses_a, masks_a, w_a), (losses_b, masks_b, w_b) = runs
    assert losses_a == losses_b
    np.testing.assert_array_equal(w_a, w_b)
    for a, b in zip(masks_a, masks_b):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(masks_a, masks_a[1:]):
        assert not np.array_equal(a, b)
    assert all(abs(m.mean() - 0.5) < 0.2 for m in masks_a)


def test_set_seed_validates():
    with pytest.raises(TypeError):
        api.set_seed(1.5)
    with pytest.raises(ValueError):
        api.set_seed(-1)


# ---------------------------------------------------------------- sequences as splits
def _split_to_sequence(split_nodes, indices):
    """``seq`` split earlier, its pieces ``indices`` read by SequenceAt and concatenated."""
    nodes = [*split_nodes]
    pieces = []
    for k, i in enumerate(indices):
        nodes.append(helper.make_node("Constant", [], [f"i{k}"],
                                      value=numpy_helper.from_array(np.array(i, np.int64))))
        nodes.append(node("SequenceAt", ["seq", f"i{k}"], f"piece{k}"))
        pieces.append(f"piece{k}")
    nodes.append(node("Concat", pieces, "Y", axis=1))
    return nodes


@pytest.mark.parametrize("case", ["size_known_at_run_time", "sizes_list", "first_pieces"])
def test_sequences_read_by_index_become_splits_with_gradients(case):
    """The dynamo exporter's ``x.split(n, dim)`` on a dimension known at run time only."""
    w = randn(2, 6)
    if case == "size_known_at_run_time":  # n = width / 3, computed from the shape
        split = [node("Shape", ["X"], "shape"),
                 helper.make_node("Constant", [], ["k"],
                                  value=numpy_helper.from_array(np.array(1, np.int64))),
                 helper.make_node("Gather", ["shape", "k"], ["width"], axis=0),
                 helper.make_node("Constant", [], ["three"],
                                  value=numpy_helper.from_array(np.array(3, np.int64))),
                 node("Div", ["width", "three"], "n"),
                 node("Mul", ["X", "W"], "XW"),
                 node("SplitToSequence", ["XW", "n"], "seq", axis=1)]
        indices = [2, 0, 1]
    elif case == "sizes_list":
        split = [helper.make_node("Constant", [], ["sizes"],
                                  value=numpy_helper.from_array(np.array([1, 2, 3], np.int64))),
                 node("Mul", ["X", "W"], "XW"),
                 node("SplitToSequence", ["XW", "sizes"], "seq", axis=1)]
        indices = [1, 2]
    else:  # pieces of 2: only the first two read
        split = [helper.make_node("Constant", [], ["n"],
                                  value=numpy_helper.from_array(np.array(2, np.int64))),
                 node("Mul", ["X", "W"], "XW"),
                 node("SplitToSequence", ["XW", "n"], "seq", axis=1)]
        indices = [1, 0]
    model, feeds = loss_model(_split_to_sequence(split, indices), {"W": w},
                              inputs={"X": randn(2, 6)}, input_dims={"X": ["N", "M"]})
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert prepare_for_gradient(rewritten)
    ops = [n.op_type for n in rewritten.graph.node]
    assert "SplitToSequence" not in ops and "SequenceAt" not in ops and "Split" in ops
    np.testing.assert_allclose(session(rewritten).run(None, feeds)[0],
                               session(model).run(None, feeds)[0], rtol=0, atol=0)
    grads, _ = analytic_gradient(model, feeds, ["W"])
    assert_close(grads["W"], numeric_gradient(model, feeds, ["W"])["W"])


def test_sequence_read_at_a_negative_index_is_left_as_it_is():
    split = [helper.make_node("Constant", [], ["n"],
                              value=numpy_helper.from_array(np.array(2, np.int64))),
             node("SplitToSequence", ["W", "n"], "seq", axis=1)]
    model, _ = loss_model(_split_to_sequence(split, [-1, 0]), {"W": randn(2, 6)})
    assert not prepare_for_gradient(model)
    with pytest.raises(NoGradientRuleError, match="SequenceAt"):
        build_gradient(model, wrt=["W"])


def test_an_unknown_condition_is_worked_out_once_per_value(monkeypatch):
    """A chain of ``h + h`` before an If's condition: each value is looked at once, not
    2**depth times (a 20-deep chain took seconds, a 60-deep one forever)."""
    from ortlearn.graph import prepare

    depth = 60
    nodes = [helper.make_node("MatMul", ["X", "coef"], ["h0"])]
    nodes += [helper.make_node("Add", [f"h{i}", f"h{i}"], [f"h{i + 1}"]) for i in range(depth)]
    nodes += [helper.make_node("ReduceSum", [f"h{depth}"], ["s"], keepdims=0),
              helper.make_node("Greater", ["s", "zero"], ["cond"])]

    def branch(name, op):
        return helper.make_graph(
            [helper.make_node(op, ["h0"], [f"{name}_out"])], name, [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)])

    nodes.append(helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", "Identity"),
                                  else_branch=branch("else", "Neg")))
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])],
        [numpy_helper.from_array(np.ones((3, 1), np.float32), "coef"),
         numpy_helper.from_array(np.array(0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    looked_at = []
    evaluate = prepare._Constants._evaluate
    monkeypatch.setattr(prepare._Constants, "_evaluate",
                        lambda self, node, name: looked_at.append(name) or evaluate(
                            self, node, name))
    assert fold_constant_ifs(model) == 0  # the condition depends on X: the If stays
    assert len(looked_at) == len(set(looked_at)) <= len(nodes)
    # a cycle (a malformed graph) leaves its values unknown rather than looping
    nodes[1:3] = [helper.make_node("Add", ["h2", "h2"], ["h1"]),
                  helper.make_node("Add", ["h1", "h1"], ["h2"])]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    looked_at.clear()
    assert fold_constant_ifs(model) == 0
    assert len(looked_at) == len(set(looked_at))
