"""BatchNormalization's running statistics are training state: updated each step as torch does."""

import copy
import io
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from ortlearn import api, artifacts
from ortlearn.autodiff import GRADIENT_RULES
from ortlearn.graph.format import TRAINING_METADATA_KEY, UPDATED_FROZEN_KEY, UPDATED_SUFFIX

STEPS, BATCH, LR = 4, 8, 0.1


def export_for_training(model, x):
    """TorchScript export in training mode: BatchNormalization with training_mode=1.

    The export runs the module once in train mode, which updates its running
    statistics: a copy is exported, and the initializers get back the
    module's own values.
    """
    f = io.BytesIO()
    torch.onnx.export(copy.deepcopy(model).train(), torch.from_numpy(x), f, dynamo=False,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})
    onx = onnx.load_from_string(f.getvalue())
    state = model.state_dict()
    for init in onx.graph.initializer:
        if init.name in state:
            init.CopyFrom(onnx.numpy_helper.from_array(state[init.name].numpy(), init.name))
    return onx


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(),
                               torch.nn.Linear(5, 2))


def cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3, padding=1), torch.nn.BatchNorm2d(3),
                               torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 2))


def batches(in_shape, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((BATCH, *in_shape)).astype(np.float32),
             rng.standard_normal((BATCH, 2)).astype(np.float32)) for _ in range(STEPS)]


def train_torch(model, data, frozen=()):
    model.train()
    params = [p for n, p in model.named_parameters() if n not in frozen]
    opt = torch.optim.SGD(params, lr=LR)
    for x, y in data:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
    return model


def open_artifacts(directory):
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state,
                        str(directory / "eval_model.onnx"))
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(LR)
    return state, module, optimizer


def train_ortlearn(model, data, directory, **kwargs):
    # requires_grad=None trains nothing (as in onnxruntime-training): train the module's
    # parameters unless told otherwise
    kwargs.setdefault("requires_grad", [k for k, _ in model.named_parameters()])
    artifacts.generate_artifacts(
        export_for_training(model, data[0][0]), loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.SGD, artifact_directory=directory,
        additional_output_names=["output"], **kwargs)
    state, module, optimizer = open_artifacts(directory)
    module.train()
    for x, y in data:
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
    return state, module


def assert_rel(actual, expected, rtol=1e-5):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.abs(expected).max())


def check_against_torch(model, data, directory, tmp_path, bn="1", frozen=(), **kwargs):
    ref = train_torch(mlp() if model == "mlp" else cnn(), data, frozen)
    start = mlp() if model == "mlp" else cnn()
    state, module = train_ortlearn(start, data, directory, **kwargs)
    torch_bn = ref[int(bn)]
    for stat in ("running_mean", "running_var"):
        assert_rel(state.parameters[f"{bn}.{stat}"].data, getattr(torch_bn, stat).numpy())
    for name, p in ref.named_parameters():
        assert_rel(state.parameters[name].data, p.detach().numpy(), rtol=1e-4)

    # The checkpoint saved after training holds the new statistics.
    api.CheckpointState.save_checkpoint(state, str(tmp_path / "trained"))
    saved = api.CheckpointState.load_checkpoint(str(tmp_path / "trained"))
    assert not saved.parameters[f"{bn}.running_var"].requires_grad
    assert_rel(saved.parameters[f"{bn}.running_var"].data, torch_bn.running_var.numpy())

    # Eval model and exported inference model: BatchNorm on the running statistics.
    x = data[0][0]
    expected = ref.eval()(torch.from_numpy(x)).detach().numpy()
    module.eval()
    assert_rel(module(x, data[0][1])[1], expected)
    module.export_model_for_inferencing(str(tmp_path / "inference.onnx"), ["output"])
    sess = ort.InferenceSession(str(tmp_path / "inference.onnx"),
                                providers=["CPUExecutionProvider"])
    assert_rel(sess.run(None, {"input": x})[0], expected)
    return state, module


def test_linear_batchnorm1d_running_statistics_follow_torch(tmp_path):
    data = batches((6,))
    check_against_torch("mlp", data, tmp_path / "art", tmp_path)
    training = onnx.load(str(tmp_path / "art" / "training_model.onnx"))
    meta = next(p.value for p in training.metadata_props if p.key == TRAINING_METADATA_KEY)
    assert '"1.running_mean", "1.running_var"' in meta and UPDATED_FROZEN_KEY in meta
    outputs = [o.name for o in training.graph.output]
    assert f"1.running_mean{UPDATED_SUFFIX}" in outputs
    assert f"1.running_var{UPDATED_SUFFIX}" in outputs
    ops = {n.op_type for n in onnx.load(str(tmp_path / "inference.onnx")).graph.node}
    assert "BatchNormalization" in ops


def test_conv2d_batchnorm2d_with_the_convolution_frozen(tmp_path):
    # The Conv reads only the input: it needs no gradient rule when its weights are frozen.
    data = batches((2, 4, 4))
    frozen = ["0.weight", "0.bias"]
    check_against_torch("cnn", data, tmp_path / "art", tmp_path, frozen=frozen,
                        requires_grad=["1.weight", "1.bias", "4.weight", "4.bias"],
                        frozen_params=frozen + ["1.running_mean", "1.running_var"])


def test_conv2d_batchnorm2d_all_trainable(tmp_path):
    if ("", "Conv") not in GRADIENT_RULES:
        pytest.skip("no gradient rule for Conv on this branch")
    check_against_torch("cnn", batches((2, 4, 4)), tmp_path / "art", tmp_path)


def test_running_statistics_in_requires_grad_become_state(tmp_path):
    """Never trained, whatever requires_grad says: frozen, and updated as torch does."""
    data = batches((6,))
    model = export_for_training(mlp(), data[0][0])
    with pytest.warns(UserWarning, match=r"'1\.running_var' is not trained"):
        artifacts.generate_artifacts(
            model, requires_grad=["0.weight", "1.running_var"], loss=artifacts.LossType.MSELoss,
            optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    meta = json.loads(next(p.value for p in training.metadata_props
                           if p.key == TRAINING_METADATA_KEY))
    assert meta["trainable"] == ["0.weight"] and "1.running_var" in meta["frozen"]
    assert "1.running_var" + UPDATED_SUFFIX in {o.name for o in training.graph.output}


def test_running_statistics_are_state_whatever_the_lists_say(tmp_path):
    """Left out of requires_grad and frozen_params, they are still updated, as in torch."""
    data = batches((6,))
    trainable = ["0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"]
    state, _ = train_ortlearn(mlp(), data, tmp_path, requires_grad=trainable)
    torch_bn = train_torch(mlp(), data)[1]  # the BatchNorm1d
    for stat in ("running_mean", "running_var"):
        assert_rel(state.parameters[f"1.{stat}"].data, getattr(torch_bn, stat).numpy())
    assert not np.allclose(state.parameters["1.running_var"].data, 1.0)


def test_onnxruntime_updates_batchnorm_statistics_inputs_in_place():
    """Why the training model reads the new statistics from BatchNormalization's outputs:
    onnxruntime 1.32's training-mode kernel writes them into its running-statistic inputs
    (the fed array changes), so a node reading those inputs may see them already updated
    (LeNet's running statistics were updated twice per step). When this test fails,
    onnxruntime no longer does it."""
    from onnx import TensorProto, helper

    bn = helper.make_node("BatchNormalization", ["X", "s", "b", "mean", "var"],
                          ["Y", "rm", "rv"], training_mode=1, momentum=0.9)
    graph = helper.make_graph(
        [bn], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
                    [("X", [4, 2]), ("s", [2]), ("b", [2]), ("mean", [2]), ("var", [2])]],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    mean = np.zeros(2, np.float32)
    sess.run(None, {"X": x, "s": np.ones(2, np.float32), "b": np.zeros(2, np.float32),
                    "mean": mean, "var": np.ones(2, np.float32)})
    np.testing.assert_allclose(mean, 0.1 * x.mean(0), rtol=1e-6)
