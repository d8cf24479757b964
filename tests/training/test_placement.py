"""cpu_fallbacks: the nodes a provider would leave to the CPU, from its kernel table.

The table itself is checked against the provider on a GPU (``test_webgpu.py``,
``test_cpu_fallbacks_agree_with_the_provider``; ``benchmarks/gpu.py``); here, what the
report says of graphs whose placement is known: ortlearn's WebGPU steps (recorded on a GPU,
no node on the CPU) and the CPU's steps, with the operators and types the GPU passes rewrite.
"""

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from sklearn.datasets import load_digits

from ortlearn import OrtMLPClassifier, OrtMLPRegressor, OrtSGDClassifier
from ortlearn.estimators import _base
from ortlearn.graph.passes import CHEAPER_NODES, GPU_NODES
from ortlearn.training import Fallback, cpu_fallbacks
from ortlearn.training import engine as _engine
from ortlearn.training.placement import WEBGPU_KERNELS, primary_input


def _model(nodes, inputs, outputs, opset=18):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _binary(op, dtype, name="n"):
    return _model([helper.make_node(op, ["a", "b"], ["c"], name=name)],
                  [("a", dtype, [4]), ("b", dtype, [4])], [("c", dtype, [4])])


def test_a_node_without_a_kernel_or_of_another_type_falls_back_and_says_why():
    assert cpu_fallbacks(_binary("Add", TensorProto.FLOAT)) == []
    assert cpu_fallbacks(_binary("Add", TensorProto.INT64)) == []  # enableInt64
    (mod,) = cpu_fallbacks(_binary("Mod", TensorProto.FLOAT, "wrap"))
    assert mod == Fallback("wrap", "Mod", None, "WebGPU has no Mod kernel")
    (wide,) = cpu_fallbacks(_binary("Add", TensorProto.DOUBLE))
    assert (wide.dtype, wide.reason) == ("float64", "WebGPU computes no float64")
    (narrow,) = cpu_fallbacks(_binary("Add", TensorProto.INT8))
    assert narrow.dtype == "int8"
    assert narrow.reason == ("WebGPU's Add kernels take float16, float32, int32, int64, "
                             "uint32, not int8")
    assert str(narrow) == f"Add node 'n': {narrow.reason}"


def test_the_type_is_read_at_the_input_that_picks_the_kernel():
    """Where's kernel is picked by its values, not by its boolean condition; the types come
    from shape inference where the graph does not declare them."""
    assert primary_input(onnx.defs.get_schema("Where", 18)) == 1
    where = _model(
        [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.DOUBLE),
         helper.make_node("Where", ["c", "f", "f"], ["y"])],
        [("c", TensorProto.BOOL, [3]), ("x", TensorProto.FLOAT, [3])],
        [("y", TensorProto.DOUBLE, [3])])
    found = cpu_fallbacks(where)
    assert [(f.node, f.op_type, f.dtype) for f in found] == [("#0", "Cast", "float64"),
                                                             ("#1", "Where", "float64")]


def test_subgraphs_and_other_domains_are_read_too():
    then = helper.make_graph([helper.make_node("Mod", ["a", "a"], ["t"], name="inner")],
                             "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT,
                                                                        [2])])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
                    helper.make_node("Gelu", ["y"], ["z"], domain="com.microsoft")],
                   [("c", TensorProto.BOOL, []), ("a", TensorProto.FLOAT, [2])],
                   [("z", TensorProto.FLOAT, [2])])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    assert [(f.node, f.reason) for f in cpu_fallbacks(model)] == [
        ("inner", "WebGPU has no Mod kernel"),
        ("#1", "no WebGPU kernel of the domain 'com.microsoft' is known")]


def test_a_graph_onnx_cannot_infer_is_read_with_the_types_it_declares(monkeypatch):
    def refuse(model):
        raise onnx.shape_inference.InferenceError("too large")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", refuse)
    model = _model([helper.make_node("Neg", ["a"], ["b"], name="first"),
                    helper.make_node("Neg", ["b"], ["c"], name="second")],
                   [("a", TensorProto.FLOAT, [2])], [("c", TensorProto.FLOAT, [2])])
    assert [(f.node, f.reason) for f in cpu_fallbacks(model)] == [
        ("second", "the element type of its input 0 is unknown")]


def test_the_cpu_runs_everything_and_other_providers_are_refused():
    assert cpu_fallbacks(_binary("Mod", TensorProto.DOUBLE), "cpu") == []
    assert cpu_fallbacks(_binary("Mod", TensorProto.DOUBLE), "webgpu:1")
    with pytest.raises(ValueError, match="cuda.*log_severity_level"):
        cpu_fallbacks(_binary("Add", TensorProto.FLOAT), "cuda")


def test_the_table_names_types_numpy_knows():
    for op, types in WEBGPU_KERNELS.items():
        assert onnx.defs.has(op), op
        for dtype in types.split():
            assert np.dtype(dtype).name == dtype


def _steps_of(estimator, X, y, table_fed):
    """The step graphs ``estimator`` builds, on the WebGPU path (table-fed, GPU passes) or the
    CPU's (one call a batch, CPU passes)."""
    steps, build = [], _engine.build_fused_step
    make_engine = _base.TrainingEngine

    def kept(*args, **kwargs):
        model, layout = build(*args, **{**kwargs, "passes": GPU_NODES if table_fed
                                        else CHEAPER_NODES})
        steps.append(model)
        return model, layout

    def engine(*args, **kwargs):
        return make_engine(*args, **{**kwargs, "batch_table": table_fed,
                                     "epoch_loop": False})

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch.setattr(_engine, "build_fused_step", kept)
        patch.setattr(_base, "TrainingEngine", engine)
        estimator.fit(X, y)
    return steps


@pytest.mark.parametrize("estimator", [
    OrtMLPClassifier((16,), max_iter=1, batch_size=64),
    OrtMLPRegressor((16, 8), max_iter=1, batch_size=64),
    OrtSGDClassifier(max_iter=1, loss="log_loss"),
], ids=lambda e: type(e).__name__)
def test_ortlearns_webgpu_steps_hold_no_fallback_and_its_cpu_steps_do(estimator):
    """On an H200 the WebGPU steps of the MLPs were recorded with no node on the CPU; the
    CPU's steps hold what GPU_NODES rewrites (Mod, Sum, LogSoftmax, Size, computed Slice
    bounds) and a float64 loss sum."""
    X, y = load_digits(return_X_y=True)
    X = (X[:200] / 16.0).astype(np.float32)
    y = y[:200] if not isinstance(estimator, OrtMLPRegressor) else X[:200, :4].sum(axis=1)
    (gpu,) = _steps_of(estimator, X, y, True)
    assert cpu_fallbacks(gpu) == []
    (cpu,) = _steps_of(estimator, X, y, False)
    reasons = {f.reason for f in cpu_fallbacks(cpu)}
    assert "WebGPU computes no float64" in reasons, reasons
