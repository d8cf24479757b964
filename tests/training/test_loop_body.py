"""Row-wise work on a batch's rows done on every row once per epoch: fewer nodes a step,
the same weights bit for bit."""

import collections

import numpy as np
import pytest
from onnx import AttributeProto, helper, numpy_helper

import ortlearn.training.fused as fused
from ortlearn.estimators import OrtSGDClassifier
from ortlearn.training.cache import COMPILED_STEPS
from ortlearn.training.loop_body import ROW_WISE_MAX_ELEMENTS, row_wise_once_per_epoch


def _constant(name, value):
    return helper.make_node("Constant", [], [name], name=name,
                            value=numpy_helper.from_array(np.asarray(value)))


def _body(constant, index_rank):
    """``Sub(Mul(c, Gather(D, i)), 1)``: the labels' ``2 y - 1``, y of shape (B, 1)."""
    index = "k" if index_rank == 0 else "rows"
    return [_constant("two", constant), _constant("one", np.ones((1, 1))),
            helper.make_node("Gather", ["D", index], ["y"]),
            helper.make_node("Mul", ["two", "y"], ["twice"]),
            helper.make_node("Sub", ["twice", "one"], ["label"]),
            helper.make_node("Mul", ["label", "scores"], ["margin"])]


@pytest.mark.parametrize("constant, index_rank, rewritten", [
    (np.full((1, 1), 2.0), 0, 2),   # rows of the (batches, rows, 1) table: both nodes
    (np.full((1, 1), 2.0), 1, 2),   # rows of the data: a leading 1 broadcasts alike
    (np.full((4, 1), 2.0), 1, 0),   # 4 values along the rows: not row-wise, nor what follows
    (2.0, 1, 2),
])
def test_row_wise_nodes_move_before_the_gather(constant, index_rank, rewritten):
    shapes = {"y": [4, 1], "twice": [4, 1], "label": [4, 1], "margin": [4, 1],
              "k": [], "rows": [4]}
    nodes = row_wise_once_per_epoch(_body(constant, index_rank), {"D"}, shapes)
    every_row = [n for n in nodes if n.output[0].endswith(".every_row")]
    assert len(every_row) == rewritten
    # the batch's labels are one Gather of the rewritten value; the first Gather went
    gathers = [n for n in nodes if n.op_type == "Gather"]
    assert len(gathers) == 1
    assert [n.output[0] for n in nodes if n.op_type == "Mul"][-1] == "margin"


def test_rows_of_many_elements_stay_in_the_step():
    shapes = {"y": [4, ROW_WISE_MAX_ELEMENTS + 1], "twice": [4, ROW_WISE_MAX_ELEMENTS + 1],
              "label": [4, ROW_WISE_MAX_ELEMENTS + 1], "margin": [4, 1], "k": []}
    nodes = _body(np.full((1, 1), 2.0), 0)
    assert row_wise_once_per_epoch(list(nodes), {"D"}, shapes) == nodes


def _uniform_body_ops(model):
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = next(a.g for a in loop.attribute if a.type == AttributeProto.GRAPH)
    return collections.Counter(n.op_type for n in body.node if n.op_type != "Constant")


@pytest.mark.parametrize("classes", [2, 3])
def test_sgd_steps_compute_their_labels_once_per_epoch(monkeypatch, classes):
    """The hinge's ``2 y - 1`` (``Mul``, ``Sub``), after the multiclass one-hot columns
    (``Unsqueeze``, ``Equal``, ``Cast``): computed for the epoch's rows at once, each
    batch's one ``Gather``; the weights are those of the step computing them, bit for
    bit."""
    rs = np.random.RandomState(0)
    X = rs.randn(96, 5)
    y = np.arange(96) % classes

    def fit():
        COMPILED_STEPS.clear()  # the engine builds its graphs
        est = OrtSGDClassifier(random_state=0, max_iter=3, tol=None)
        engine = est.partial_fit(X, y, classes=np.arange(classes))._runtime.engine
        est.partial_fit(X, y)
        return _uniform_body_ops(engine._compiled(True)[0]), est.coef_, est.intercept_

    ops, coef, intercept = fit()
    monkeypatch.setattr(fused, "row_wise_once_per_epoch", lambda nodes, outer, shapes: nodes)
    before, coef_before, intercept_before = fit()
    saved = 2 if classes == 2 else 5
    assert sum(before.values()) - sum(ops.values()) == saved
    np.testing.assert_array_equal(coef, coef_before)
    np.testing.assert_array_equal(intercept, intercept_before)
