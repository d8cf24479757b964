"""A large step's scattered update as a second run (ortlearn.training.scattered)."""

import numpy as np
import pytest
import scipy.sparse
from onnx import TensorProto, helper

from ortlearn.estimators import OrtSGDClassifier, OrtSGDRegressor
from ortlearn.training import fused
from ortlearn.training.scattered import split_scattered_updates


def _hashed(n_features: int, dtype) -> scipy.sparse.csr_matrix:
    """300 rows of hashed features, 10 values a row, each column twice in a row (the
    scatter adds at a repeated position in the order of its positions)."""
    rng = np.random.default_rng(0)
    columns = rng.integers(0, n_features, (300, 5), dtype=np.int32).repeat(2, axis=1)
    return scipy.sparse.csr_matrix(
        (rng.standard_normal(3000).astype(dtype), columns.ravel(),
         np.arange(0, 3001, 10, dtype=np.int32)), shape=(300, n_features))


@pytest.mark.parametrize("make,classes,dtype", [
    (OrtSGDClassifier, 2, np.float64),   # a column (n, 1)
    (OrtSGDClassifier, 3, np.float64),   # a flat view of (n, 3)
    (OrtSGDClassifier, 2, np.float32),
    (OrtSGDRegressor, None, np.float64),
])
def test_a_large_step_scatters_in_a_second_run_to_the_weights_of_one_run(
        make, classes, dtype, monkeypatch):
    """Weights of 500 000 features (a large model: a step a call): the step writes the
    decayed weights over themselves and the scatter adds the rows' updates in place, the
    weights of the step that did both bit for bit, over three epochs."""
    n = 1_000_000 if dtype == np.float32 else 500_000
    X = _hashed(n, dtype)
    y = np.arange(300) % classes if classes else np.sin(np.arange(300.0))

    def fit():
        est = make(random_state=0)
        for _ in range(3):
            est.partial_fit(X, y, **({"classes": np.arange(classes)} if classes else {}))
        return est

    split = fit()
    engine = split._runtime.engine
    step, layout = engine._compiled(engine._current)[:2]
    assert set(layout.scatters) == {"coef"} and "coef" in layout.in_place
    assert "ScatterElements" not in {node.op_type for node in step.graph.node}
    monkeypatch.setattr(fused, "split_scattered_updates", lambda nodes, *_: (nodes, {}, []))
    one = fit()
    engine = one._runtime.engine
    step, layout = engine._compiled(engine._current)[:2]
    assert not layout.scatters and "ScatterElements" in {n.op_type for n in step.graph.node}
    np.testing.assert_array_equal(split.coef_, one.coef_)
    np.testing.assert_array_equal(split.intercept_, one.intercept_)


def _column_update(reader: bool) -> list:
    """``w.next = ScatterElements(w * d, Unsqueeze(i), Unsqueeze(u))`` of a column ``w``,
    ``w.next`` read by an average with ``reader``."""
    nodes = [helper.make_node("Mul", ["w", "d"], ["decayed"]),
             helper.make_node("Unsqueeze", ["i", "axes"], ["rows"]),
             helper.make_node("Unsqueeze", ["u", "axes"], ["row_updates"]),
             helper.make_node("ScatterElements", ["decayed", "rows", "row_updates"],
                              ["w.next"], axis=0, reduction="add")]
    if reader:
        nodes.append(helper.make_node("Add", ["w.next", "a"], ["a.next"]))
    return nodes


def test_the_split_leaves_the_product_as_the_weights_next_value():
    nodes, scatters, outputs = split_scattered_updates(
        _column_update(False), {"w": "w.next"}, {"w": TensorProto.DOUBLE})
    assert scatters == {"w": ("w.next.positions", "w.next.updates")}
    assert [(n.op_type, list(n.input), list(n.output)) for n in nodes] == [
        ("Mul", ["w", "d"], ["w.next"]),
        ("Unsqueeze", ["i", "axes"], ["rows"]),
        ("Unsqueeze", ["u", "axes"], ["row_updates"]),
        ("Cast", ["i"], ["w.next.positions"]),
        ("Identity", ["u"], ["w.next.updates"])]
    assert [(o.name, o.type.tensor_type.elem_type) for o in outputs] == [
        ("w.next.positions", TensorProto.INT64), ("w.next.updates", TensorProto.DOUBLE)]


@pytest.mark.parametrize("nodes", [
    _column_update(True),  # an average reads the scattered value within the step
    [n for n in _column_update(False)][:3] + [  # another reduction
        helper.make_node("ScatterElements", ["decayed", "rows", "row_updates"], ["w.next"],
                         axis=0, reduction="mul")],
    [helper.make_node("Mul", ["v", "d"], ["decayed"])] + _column_update(False)[1:],  # not w
])
def test_the_split_keeps_what_one_run_must_compute(nodes):
    kept, scatters, outputs = split_scattered_updates(
        nodes, {"w": "w.next"}, {"w": TensorProto.DOUBLE})
    assert kept == nodes and scatters == {} and outputs == []
