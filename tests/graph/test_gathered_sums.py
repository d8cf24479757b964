"""``graph.gathered_sums``: a sum of scalar-index Gathers covering a full grid becomes one
reduction with the same value; anything else is left as it is."""

import itertools

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlearn.graph.gathered_sums import gathered_sums_as_reductions


def _sum_model(points, shape=(2, 3, 4, 5), axes=(1, 2)):
    """``sum over points (i, j) of Gather(Gather(X, i, axes[0]), j, axes[1])``, the way the
    dynamo exporter writes an uneven adaptive pooling's windows."""
    nodes, inits, leaves = [], [], []
    for k, (i, j) in enumerate(points):
        inits += [numpy_helper.from_array(np.array(i, np.int64), f"i{k}"),
                  numpy_helper.from_array(np.array(j, np.int64), f"j{k}")]
        nodes += [helper.make_node("Gather", ["X", f"i{k}"], [f"row{k}"], axis=axes[0]),
                  helper.make_node("Gather", [f"row{k}", f"j{k}"], [f"leaf{k}"],
                                   axis=axes[1])]
        leaves.append(f"leaf{k}")
    total = leaves[0]
    for k, leaf in enumerate(leaves[1:]):
        nodes.append(helper.make_node("Add", [total, leaf], [f"sum{k}"]))
        total = f"sum{k}"
    nodes.append(helper.make_node("Identity", [total], ["Y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "X", TensorProto.FLOAT, list(shape))], [helper.make_tensor_value_info(
            "Y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(model, X):
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, {"X": X})[0]


@pytest.mark.parametrize("axes", [(1, 2), (2, 1), (3, 0)])
def test_a_full_grid_becomes_one_reduction(axes):
    X = np.random.RandomState(0).randn(2, 3, 4, 5).astype(np.float32)
    # the second Gather's axis counts in the tensor the first one left
    rows = X.shape[axes[0]]
    cols = np.delete(np.array(X.shape), axes[0])[axes[1]]
    points = list(itertools.product(range(rows), range(cols)))
    model = _sum_model(points, axes=axes)
    expected = _run(model, X)
    assert gathered_sums_as_reductions(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Gather") == 2 and "Add" not in ops and ops.count("ReduceSum") == 1
    np.testing.assert_allclose(_run(model, X), expected, rtol=1e-6, atol=1e-6)


def test_a_part_of_the_grid_is_left_alone():
    points = [(0, 0), (0, 1), (1, 0), (2, 3), (1, 1)]  # not a grid
    model = _sum_model(points)
    before = [n.op_type for n in model.graph.node]
    assert gathered_sums_as_reductions(model) == 0
    assert [n.op_type for n in model.graph.node] == before


def test_a_sub_grid_gathers_its_indices():
    """Rows 1 and 2, columns 0, 2 and 4: a Gather of each index vector, then the sum."""
    X = np.random.RandomState(1).randn(2, 3, 4, 5).astype(np.float32)
    model = _sum_model(list(itertools.product([1, 2], [0, 2, 4])))
    expected = _run(model, X)
    assert gathered_sums_as_reductions(model) == 1
    np.testing.assert_allclose(_run(model, X), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(expected, X[:, [1, 2]][:, :, :, [0, 2, 4]].sum(axis=(1, 3)),
                               rtol=1e-5)
