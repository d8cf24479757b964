"""ortlearn.artifacts.generate_artifacts: files, contract, gradients, errors."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn import artifacts
from ortlearn.graph import np_dtype_to_onnx
from ortlearn.training.checkpoint import CheckpointState
from tests.conftest import WeightedAverageLoss, run_onnx

REQUIRES_GRAD = ["weight1", "bias1", "weight2", "bias2"]
FROZEN = ["weight3", "bias3"]
SHAPES = {"weight1": (4, 5), "bias1": (5,), "weight2": (5, 5), "bias2": (5,),
          "weight3": (5, 3), "bias3": (3,)}


def mlp(dtype=np.float32, two_outputs=False, extra_nodes=()):
    """Gemm-Relu-Gemm-Relu-Gemm on x (N, 4) -> output (N, 3); output2 (N, 5) if asked."""
    rng = np.random.default_rng(0)
    elem = np_dtype_to_onnx(dtype)
    inits = [numpy_helper.from_array((rng.normal(size=s) * 0.7).astype(dtype), n)
             for n, s in SHAPES.items()]
    first = "output1" if two_outputs else "output"
    nodes = [helper.make_node("Gemm", ["x", "weight1", "bias1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("Gemm", ["r1", "weight2", "bias2"], ["h2"]),
             helper.make_node("Relu", ["h2"], ["r2"]),
             *extra_nodes,
             helper.make_node("Gemm", ["r2", "weight3", "bias3"], [first])]
    outputs = [helper.make_tensor_value_info(first, elem, ["N", 3])]
    if two_outputs:
        nodes.append(helper.make_node("Tanh", ["h2"], ["output2"]))
        outputs.append(helper.make_tensor_value_info("output2", elem, ["N", 5]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", elem, ["N", 4])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def initial_values(model):
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def load_checked(path):
    model = onnx.load(path)
    onnx.checker.check_model(model)
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return model


def meta(model, key="ortlearn.training"):
    return json.loads({p.key: p.value for p in model.metadata_props}[key])


def test_seed_cross_entropy_adamw(tmp_path):
    out = tmp_path / "artifacts"
    artifacts.generate_artifacts(mlp(), requires_grad=REQUIRES_GRAD, frozen_params=FROZEN,
                                 loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=out)
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint", "eval_model.onnx", "optimizer_model.onnx", "training_model.onnx"]
    training = load_checked(out / "training_model.onnx")
    evaluation = load_checked(out / "eval_model.onnx")
    optimizer = load_checked(out / "optimizer_model.onnx")
    buffers = [f"{p}_grad.accumulation.buffer" for p in REQUIRES_GRAD]
    # CrossEntropyLoss's labels input is named 'labels', as in onnxruntime-training
    assert [i.name for i in training.graph.input] == [
        "x", "labels", *REQUIRES_GRAD, *FROZEN, *buffers, "lazy_reset_grad"]
    assert [o.name for o in training.graph.output] == [
        "loss", *[f"{p}_grad.accumulation.out" for p in REQUIRES_GRAD]]
    assert [i.name for i in evaluation.graph.input] == ["x", "labels", *REQUIRES_GRAD, *FROZEN]
    assert [o.name for o in evaluation.graph.output] == ["loss"]
    target = {i.name: i for i in training.graph.input}["labels"].type.tensor_type
    assert target.elem_type == TensorProto.INT64
    expected_meta = {"user_inputs": ["x", "labels"], "user_outputs": ["loss"],
                     "trainable": REQUIRES_GRAD, "frozen": FROZEN}
    assert meta(training) == meta(evaluation) == expected_meta
    assert meta(optimizer, "ortlearn.optimizer")["type"] == "AdamW"
    assert not training.graph.initializer and not evaluation.graph.initializer
    assert {n.domain for n in training.graph.node} <= {"", "ai.onnx"}

    state = CheckpointState.load_checkpoint(out / "checkpoint")
    for name, value in initial_values(mlp()).items():
        np.testing.assert_array_equal(state.parameters[name].data, value)
        assert state.parameters[name].requires_grad == (name in REQUIRES_GRAD)


def test_seed_custom_loss_in_current_directory(tmp_path, monkeypatch, rng):
    monkeypatch.chdir(tmp_path)
    artifacts.generate_artifacts(mlp(two_outputs=True), requires_grad=REQUIRES_GRAD,
                                 frozen_params=FROZEN, loss=WeightedAverageLoss(),
                                 optimizer=artifacts.OptimType.AdamW)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint", "eval_model.onnx", "optimizer_model.onnx", "training_model.onnx"]
    evaluation = load_checked(tmp_path / "eval_model.onnx")
    load_checked(tmp_path / "training_model.onnx")
    assert meta(evaluation)["user_inputs"] == ["x", "target1", "target2"]
    feeds = {"x": rng.normal(size=(6, 4)).astype(np.float32),
             "target1": rng.normal(size=(6, 3)).astype(np.float32),
             "target2": rng.normal(size=(6, 5)).astype(np.float32), **initial_values(mlp())}
    out1, out2 = run_onnx(mlp(two_outputs=True), {"x": feeds["x"]})
    expected = (0.4 * np.mean((out1 - feeds["target1"]) ** 2)
                + 0.6 * np.mean((out2 - feeds["target2"]) ** 2))
    np.testing.assert_allclose(run_onnx(evaluation, feeds)[0], expected, rtol=1e-5)


def training_feeds(model, user, params, buffers=None, reset=True):
    dtype = next(iter(params.values())).dtype
    trainable = meta(model)["trainable"]
    feeds = {**user, **params, "lazy_reset_grad": np.array(reset)}
    for p in trainable:
        buf = np.zeros(params[p].shape, dtype) if buffers is None else buffers[p]
        feeds[f"{p}_grad.accumulation.buffer"] = buf
    return feeds


def generate(tmp_path, model, **kwargs):
    artifacts.generate_artifacts(model, artifact_directory=tmp_path, **kwargs)
    return onnx.load(tmp_path / "training_model.onnx"), onnx.load(tmp_path / "eval_model.onnx")


LOSS_TARGETS = {
    artifacts.LossType.MSELoss: lambda rng: rng.normal(size=(6, 3)),
    artifacts.LossType.L1Loss: lambda rng: rng.normal(size=(6, 3)),
    artifacts.LossType.CrossEntropyLoss: lambda rng: rng.integers(0, 3, size=6),
    artifacts.LossType.BCEWithLogitsLoss: lambda rng: rng.integers(0, 2, size=(6, 3)).astype(float),
}


@pytest.mark.parametrize("loss", list(LOSS_TARGETS))
def test_gradients_match_finite_differences(tmp_path, rng, loss):
    model = mlp(np.float64)
    training, evaluation = generate(tmp_path, model, requires_grad=REQUIRES_GRAD + ["bias3"],
                                    frozen_params=["weight3"], loss=loss)
    target_name = "labels" if loss is artifacts.LossType.CrossEntropyLoss else "target"
    user = {"x": rng.normal(size=(6, 4)), target_name: LOSS_TARGETS[loss](rng)}
    params = initial_values(model)
    outputs = run_onnx(training, training_feeds(training, user, params))
    loss_value, grads = outputs[0], dict(zip(meta(training)["trainable"], outputs[1:]))
    assert "weight3" not in grads and len(outputs) == 6

    sess = ort.InferenceSession(evaluation.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {**user, **params})[0], loss_value, rtol=1e-14)
    eps = 1e-6
    for name, grad in grads.items():
        numeric = np.zeros_like(grad)
        for idx in np.ndindex(grad.shape):
            values = []
            for sign in (1, -1):
                shifted = {**params, name: params[name].copy()}
                shifted[name][idx] += sign * eps
                values.append(sess.run(None, {**user, **shifted})[0])
            numeric[idx] = (values[0] - values[1]) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8, err_msg=name)


def test_gradient_accumulation(tmp_path, rng):
    model = mlp(np.float64)
    training, _ = generate(tmp_path, model, requires_grad=REQUIRES_GRAD, frozen_params=FROZEN,
                           loss=artifacts.LossType.MSELoss)
    params = initial_values(model)
    batches = [{"x": rng.normal(size=(5, 4)), "target": rng.normal(size=(5, 3))} for _ in range(2)]
    g1 = run_onnx(training, training_feeds(training, batches[0], params))[1:]
    g2 = run_onnx(training, training_feeds(training, batches[1], params))[1:]
    buffers = dict(zip(REQUIRES_GRAD, g1))
    accumulated = run_onnx(training, training_feeds(training, batches[1], params, buffers, False))
    reset = run_onnx(training, training_feeds(training, batches[1], params, buffers, True))
    for a, r, x, y in zip(accumulated[1:], reset[1:], g1, g2):
        np.testing.assert_allclose(a, x + y, rtol=1e-13)
        np.testing.assert_allclose(r, y, rtol=1e-13)


def dropout_bn_model(batchnorm):
    """mlp with Dropout (training_mode=True) then, if asked, a training-mode BatchNormalization."""
    extra = [
        helper.make_node("Constant", [], ["ratio"], value=numpy_helper.from_array(np.array(0.5))),
        helper.make_node("Constant", [], ["train"], value=numpy_helper.from_array(np.array(True))),
        helper.make_node("Dropout", ["h2", "ratio", "train"], ["d2"]),
    ]
    if batchnorm:
        extra.append(helper.make_node(
            "BatchNormalization", ["d2", "bn_scale", "bn_bias", "bn_mean", "bn_var"],
            ["bn_out", "running_mean", "running_var"], training_mode=1))
    extra.append(helper.make_node("Relu", ["bn_out" if batchnorm else "d2"], ["r2"]))
    model = mlp(np.float64, extra_nodes=extra)
    model.graph.node.remove(next(n for n in model.graph.node
                                 if n.op_type == "Relu" and n.input[0] == "h2"))
    stats = {"bn_scale": np.full(5, 2.0), "bn_bias": np.full(5, 0.1),
             "bn_mean": np.full(5, 0.3), "bn_var": np.full(5, 4.0)}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in stats.items())
    return model


@pytest.mark.parametrize("batchnorm", [False, True])
def test_eval_model_runs_dropout_and_batchnorm_in_inference_mode(tmp_path, rng, batchnorm):
    model = dropout_bn_model(batchnorm)
    requires_grad = ["weight3"] if batchnorm else ["weight1"]
    training, evaluation = generate(tmp_path, model, requires_grad=requires_grad,
                                    frozen_params=["bias1"], loss=artifacts.LossType.MSELoss)
    params = initial_values(model)
    x, t = rng.normal(size=(4, 4)), rng.normal(size=(4, 3))
    h1 = np.maximum(x @ params["weight1"] + params["bias1"], 0)
    h2 = h1 @ params["weight2"] + params["bias2"]
    if batchnorm:
        h2 = 2.0 * (h2 - 0.3) / np.sqrt(4.0 + 1e-5) + 0.1
    out = np.maximum(h2, 0) @ params["weight3"] + params["bias3"]
    # a training-mode BatchNorm's running statistics are frozen parameters: inputs
    stats = ["bn_mean", "bn_var"] if batchnorm else []
    feeds = {"x": x, "target": t, **{k: params[k] for k in [*requires_grad, "bias1", *stats]}}
    got = run_onnx(evaluation, feeds)
    np.testing.assert_allclose(got[0], np.mean((out - t) ** 2), rtol=1e-12)
    # as onnxruntime-training's eval model: Dropout's training_mode input left out
    dropouts = [n for n in evaluation.graph.node if n.op_type == "Dropout"]
    assert dropouts and all(len(n.input) < 3 or n.input[2] == "" for n in dropouts)
    # the training model keeps the training mode: dropout changes the loss
    train_loss = run_onnx(training, training_feeds(training, {"x": x, "target": t},
                                                   {k: params[k] for k in requires_grad})
                          | {k: params[k] for k in ["bias1", *stats]})[0]
    assert not np.isclose(train_loss, got[0])


def test_options(tmp_path, rng):
    path = tmp_path / "base.onnx"
    onnx.save(mlp(np.float64, two_outputs=True), path)
    artifacts.generate_artifacts(str(path), requires_grad=["weight1", "bias1", "weight2", "bias2",
                                                          "bias3"], frozen_params=["weight3"],
                                 loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.SGD,
                                 artifact_directory=tmp_path / "a" / "b", prefix="m_",
                                 additional_output_names=["output1"], nominal_checkpoint=True,
                                 loss_input_names=["output2"])
    out = tmp_path / "a" / "b"
    assert sorted(p.name for p in out.iterdir()) == [
        "m_checkpoint", "m_eval_model.onnx", "m_nominal_checkpoint", "m_optimizer_model.onnx",
        "m_training_model.onnx"]
    training = load_checked(out / "m_training_model.onnx")
    evaluation = load_checked(out / "m_eval_model.onnx")
    m = meta(training)
    assert m["trainable"] == ["weight1", "bias1", "weight2", "bias2", "bias3"]
    assert m["user_outputs"] == ["loss", "output1"]
    user = {"x": rng.normal(size=(3, 4)), "target": rng.normal(size=(3, 5))}
    params = initial_values(mlp(np.float64))
    loss, output1 = run_onnx(evaluation, {**user, **params})
    ref1, ref2 = run_onnx(mlp(np.float64, two_outputs=True), {"x": user["x"]})
    np.testing.assert_allclose(output1, ref1)
    np.testing.assert_allclose(loss, np.mean((ref2 - user["target"]) ** 2))
    nominal = CheckpointState.load_checkpoint(out / "m_nominal_checkpoint")
    assert nominal.parameters["weight1"].nominal
    assert meta(load_checked(out / "m_optimizer_model.onnx"), "ortlearn.optimizer")["type"] == "SGD"


def test_no_loss_differentiates_first_output(tmp_path, rng):
    base = mlp(np.float64)
    base.graph.node.append(helper.make_node("ReduceSum", ["output"], ["total"], keepdims=0))
    del base.graph.output[:]
    base.graph.output.append(helper.make_tensor_value_info("total", TensorProto.DOUBLE, []))
    training, _ = generate(tmp_path, base, requires_grad=["bias3"])
    assert [o.name for o in training.graph.output] == ["total", "bias3_grad.accumulation.out"]
    params = initial_values(base)
    user = {"x": rng.normal(size=(7, 4))}
    out = run_onnx(training, training_feeds(training, user, {"bias3": params["bias3"]}))
    np.testing.assert_allclose(out[1], np.full(3, 7.0))


@pytest.mark.parametrize("kwargs,error,match", [
    ({"custom_op_library": "lib.so"}, FileNotFoundError, "custom_op_library 'lib.so'"),
    ({"custom_op_library": __file__}, ValueError, "cannot load the custom_op_library"),
    ({"optimizer": artifacts.OptimType.SGD}, ValueError, "requires_grad=None trains nothing"),
    ({"requires_grad": ["weight1", "nope"]}, ValueError, "'nope'"),
    ({"requires_grad": ["weight1", "weight1"]}, ValueError, "'weight1'"),
    ({"requires_grad": ["weight1"], "frozen_params": ["weight1"]}, ValueError, "both"),
    ({"requires_grad": ["shape"]}, TypeError, "shape \\(INT64\\)"),
    ({"loss": "mse"}, TypeError, "LossType"),
    ({"optimizer": "adam"}, TypeError, "OptimType"),
    ({"loss_input_names": ["missing"]}, ValueError, "'missing'"),
    ({"additional_output_names": ["missing"]}, ValueError, "'missing'"),
])
def test_errors(tmp_path, kwargs, error, match):
    model = mlp()
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1, 3], np.int64), "shape"))
    kwargs = {"loss": artifacts.LossType.MSELoss, **kwargs}
    with pytest.raises(error, match=match):
        artifacts.generate_artifacts(model, artifact_directory=tmp_path, **kwargs)


def test_enum_values():
    assert [(t.name, t.value) for t in artifacts.LossType] == [
        ("MSELoss", 1), ("CrossEntropyLoss", 2), ("BCEWithLogitsLoss", 3), ("L1Loss", 4)]
    assert artifacts.OptimType.AdamW.value == 1 and artifacts.OptimType.SGD.value == 2


@pytest.mark.parametrize("opset", [13, 15, 18])
def test_optimizer_model_has_the_models_opset(tmp_path, opset):
    """onnxruntime-training builds every model at the base model's opsets; the optimizer
    model was written at ortlearn's default (18) whatever the model's."""
    from ortlearn import api
    from ortlearn.graph import make_model, opset_of

    w = numpy_helper.from_array(np.ones((3, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "lin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])], [w])
    artifacts.generate_artifacts(make_model(graph, [helper.make_opsetid("", opset)]),
                                 requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=tmp_path)
    assert opset_of(onnx.load(tmp_path / "optimizer_model.onnx")) == opset
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = api.Module(str(tmp_path / "training_model.onnx"), state)
    optimizer = api.Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
    module(np.ones((4, 3), np.float32), np.ones((4, 1), np.float32))
    optimizer.step()
    assert np.isfinite(state.parameters["w"].data).all()


@pytest.mark.parametrize("function", ["build_artifacts", "generate_artifacts"])
def test_external_data_outside_the_models_directory_is_a_value_error(tmp_path, function):
    """onnx's checker refuses it; its ValidationError used to leak out of both functions."""
    w = numpy_helper.from_array(np.ones((3, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "lin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "../../outside.bin"
    kwargs = {"artifact_directory": tmp_path} if function == "generate_artifacts" else {}
    with pytest.raises(ValueError, match="outside the directory"):
        getattr(artifacts, function)(model.SerializeToString(), requires_grad=["w"],
                                     loss=artifacts.LossType.MSELoss, **kwargs)
    assert not list(tmp_path.iterdir())
