"""Reliability (issue 22): non-scalar losses and out-of-range class labels are refused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn import OrtGradientOptimizer, artifacts


def _linear(n_out: int, loss_shape=None):
    """X (N, 2) @ W (2, n_out); with ``loss_shape``, a per-row squared error output 'loss'."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])
    w = numpy_helper.from_array(np.ones((2, n_out), np.float32), "W")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["out"])]
    inputs = [x]
    if loss_shape is None:
        outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", n_out])]
    else:
        inputs.append(helper.make_tensor_value_info("label", TensorProto.FLOAT, ["N", n_out]))
        nodes += [helper.make_node("Sub", ["out", "label"], ["d"]),
                  helper.make_node("Mul", ["d", "d"], ["loss"])]
        outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, loss_shape)]
    graph = helper.make_graph(nodes, "g", inputs, outputs, [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# ----------------------------------------------------------- item 6: non-scalar losses
@pytest.mark.parametrize("loss_shape", [["N", 1], ["N"], [4, 1]])
def test_gradient_optimizer_refuses_non_scalar_loss(loss_shape):
    rng = np.random.default_rng(0)
    X = rng.random((4, 2), dtype=np.float32)
    y = rng.random((4, 1), dtype=np.float32)
    est = OrtGradientOptimizer(_linear(1, loss_shape), max_iter=2)
    with pytest.raises(ValueError, match=r"'loss' must be a scalar.*ReduceMean"):
        est.fit(X, y)


def test_gradient_optimizer_accepts_one_element_loss():
    model = _linear(1, ["N", 1])
    mean = helper.make_node("ReduceMean", ["loss_rows"], ["loss"], keepdims=1)
    model.graph.node[-1].output[0] = "loss_rows"
    model.graph.node.append(mean)
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1
    rng = np.random.default_rng(0)
    X = rng.random((4, 2), dtype=np.float32)
    y = rng.random((4, 1), dtype=np.float32)
    OrtGradientOptimizer(model, max_iter=2).fit(X, y)


def test_generate_artifacts_refuses_non_scalar_first_output(tmp_path):
    with pytest.raises(ValueError, match=r"'out' must be a scalar.*\['N', 3\]"):
        artifacts.generate_artifacts(_linear(3), requires_grad=["W"], loss=None,
                                     optimizer=artifacts.OptimType.AdamW,
                                     artifact_directory=tmp_path)
    assert not any(tmp_path.iterdir())
