"""``split_step_scalars``: an optimizer model cut into its step's scalars and its update.

Run one after the other, the two parts run the nodes of the whole model on the
same inputs: the same kernels on the same values, so the same bits.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortlearn.optim import (
    SGD,
    Adam,
    AdamW,
    TorchAdamW,
    build_optimizer_model,
    split_step_scalars,
    unpack_optimizer_model,
)
from ortlearn.training import cpu_fallbacks

PARAMS = {"coef": (TensorProto.FLOAT, [4, 3]), "intercept": (TensorProto.FLOAT, [3])}


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    return dict(zip(outputs, session.run(None, {n: feeds[n] for n in names})))


def _feeds(model, rng, step):
    feeds = {}
    for info in model.graph.input:
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        if info.name == "learning_rate":
            feeds[info.name] = np.full(shape, 0.0125, np.float32)
        elif info.name == "step":
            feeds[info.name] = np.full(shape, step, np.int64)
        else:  # positive: a second moment is a sum of squares
            dtype = np.float32 if info.type.tensor_type.elem_type == TensorProto.FLOAT \
                else np.float64
            feeds[info.name] = rng.uniform(0.1, 1.0, shape).astype(dtype)
    return feeds


@pytest.mark.parametrize("optimizer", [
    SGD(), SGD(momentum=0.9, nesterov=True, weight_decay=1e-3), Adam(), AdamW(),
    AdamW(clip_grad=1.0), TorchAdamW(), TorchAdamW(bias_correction=False)],
    ids=lambda o: repr(o)[:40])
@pytest.mark.parametrize("layout", ["sequence", "tensors"])
def test_the_two_parts_compute_the_whole_update(optimizer, layout, rng):
    model = unpack_optimizer_model(build_optimizer_model(optimizer, PARAMS, layout=layout))
    scalars, update = split_step_scalars(model)
    onnx.checker.check_model(scalars, full_check=True)
    onnx.checker.check_model(update, full_check=True)
    assert [i.name for i in scalars.graph.input] == ["learning_rate", "step"]
    assert [o.name for o in update.graph.output] == [o.name for o in model.graph.output]
    for step in (1, 2, 1000):
        feeds = _feeds(model, rng, step)
        expected = _run(model, feeds)
        actual = _run(update, {**feeds, **_run(scalars, feeds)})
        assert actual.keys() == expected.keys()
        for name, value in expected.items():
            np.testing.assert_array_equal(actual[name], value, err_msg=name)


@pytest.mark.parametrize("optimizer", [SGD(), Adam(), AdamW(), TorchAdamW()],
                         ids=lambda o: type(o).__name__)
def test_the_update_of_float32_parameters_computes_in_float32(optimizer):
    """The float64 step scalars (bias corrections) go to the host part: the update WebGPU
    runs has no float64 node, nor the int64 Squeeze of the step; it reads one to three
    float32 numbers (the step size; TorchAdamW's decay factor and bias corrections)."""
    model = unpack_optimizer_model(build_optimizer_model(optimizer, PARAMS))
    assert cpu_fallbacks(model)  # before the split: float64 arithmetic, an int64 Squeeze
    scalars, update = split_step_scalars(model)
    assert cpu_fallbacks(update) == []
    assert 1 <= len(scalars.graph.output) <= 3
    for value in scalars.graph.output:
        assert value.type.tensor_type.elem_type == TensorProto.FLOAT
        assert len(value.type.tensor_type.shape.dim) == 0
    names = {i.name for i in update.graph.input}
    assert "learning_rate" not in names and "step" not in names


def test_gradient_clipping_stays_in_the_update():
    """A global norm reads the gradients: it is the update's, whatever its dtype."""
    model = unpack_optimizer_model(build_optimizer_model(AdamW(clip_grad=1.0), PARAMS))
    scalars, update = split_step_scalars(model)
    ops = {n.op_type for n in update.graph.node}
    assert "ReduceSumSquare" in ops
    assert "ReduceSumSquare" not in {n.op_type for n in scalars.graph.node}


def test_an_update_reading_only_the_learning_rate_has_nothing_to_split():
    lr = helper.make_tensor_value_info("learning_rate", TensorProto.FLOAT, [])
    step = helper.make_tensor_value_info("step", TensorProto.INT64, [])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])
    g = helper.make_tensor_value_info("w.gradient", TensorProto.FLOAT, [2])
    out = helper.make_tensor_value_info("w.updated", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Mul", ["learning_rate", "w.gradient"], ["d"]),
             helper.make_node("Sub", ["w", "d"], ["w.updated"])]
    model = helper.make_model(helper.make_graph(nodes, "sgd", [lr, step, w, g], [out]),
                              opset_imports=[helper.make_opsetid("", 18)])
    scalars, update = split_step_scalars(model)
    assert scalars is None and update is model
