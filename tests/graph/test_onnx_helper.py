"""The shared graph helpers: names, constants, opset-dependent forms, IR version."""

import numpy as np
import pytest
from conftest import run_onnx
from onnx import TensorProto, helper

from ortlearn.graph import (
    GraphBuilder,
    load_model,
    make_model,
    np_dtype_to_onnx,
    onnx_to_np_dtype,
)
from ortlearn.training.device import parse_device


def _model_with(builder, inputs, outputs, opset):
    graph = helper.make_graph(builder.nodes, "g", inputs, outputs)
    return make_model(graph, [helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [13, 17, 18])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reduce_forms_run_for_each_opset(opset, dtype):
    b = GraphBuilder(opset=opset)
    elem = np_dtype_to_onnx(dtype)
    mean = b.reduce("ReduceMean", "X", axes=[1], keepdims=0)
    total = b.reduce("ReduceSum", mean, keepdims=0, output="Y")
    two = b.const(2.0, dtype)
    b.op("Mul", [total, two], outputs=["Z"])
    model = _model_with(
        b,
        [helper.make_tensor_value_info("X", elem, ["N", 3])],
        [helper.make_tensor_value_info(n, elem, []) for n in ("Y", "Z")],
        opset,
    )
    # onnx >= 1.23 writes IR 14 by default; onnxruntime reads at most 13
    assert model.ir_version <= 10
    X = np.arange(6, dtype=dtype).reshape(2, 3)
    y, z = run_onnx(model, {"X": X})
    assert y == pytest.approx(X.mean(axis=1).sum())
    assert z == pytest.approx(2 * X.mean(axis=1).sum())
    assert y.dtype == dtype


def test_constants_are_nodes_and_cached():
    b = GraphBuilder()
    c1 = b.const(1.5, np.float32)
    c2 = b.const(1.5, np.float32)
    c3 = b.const(1.5, np.float64)
    assert c1 == c2 != c3
    assert [n.op_type for n in b.nodes] == ["Constant", "Constant"]


def test_nodes_taken_out_take_their_constants_with_them():
    """A constant among nodes taken out is not read again by the nodes built after them,
    which may come first in a graph."""
    b = GraphBuilder()
    kept = b.ints([1, 2])
    b.op("Identity", [kept])
    taken = b.take(1)
    assert [n.op_type for n in taken] == ["Identity"] and len(b.nodes) == 1
    first = len(b.nodes)
    moved = b.ints([3, 4])
    assert [n.output[0] for n in b.take(first)] == [moved]
    assert b.ints([3, 4]) != moved  # emitted again, in the builder
    assert b.ints([1, 2]) == kept  # still in the builder: still shared


def test_unique_names_avoid_model_names():
    X = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])
    Y = helper.make_tensor_value_info("Sub_out", TensorProto.FLOAT, [None, 2])
    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Sub_out"])], "g", [X], [Y])
    model = make_model(graph, [helper.make_opsetid("", 18)])
    b = GraphBuilder.for_model(model)
    assert b.op("Sub", ["X", "X"]) != "Sub_out"
    with pytest.raises(ValueError, match="already used"):
        b.reserve("X")


def test_old_opsets_are_refused():
    with pytest.raises(ValueError, match="opset >= 13"):
        GraphBuilder(opset=11)


def test_load_model_errors(tmp_path):
    with pytest.raises(TypeError, match="ModelProto, bytes or a path"):
        load_model(3)
    with pytest.raises(ValueError, match="not a serialized ONNX model"):
        load_model(b"\xff\x00garbage")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x12\x34not onnx")
    with pytest.raises(ValueError, match="not a readable ONNX model"):
        load_model(bad)


def test_dtype_maps():
    assert np_dtype_to_onnx(np.float64) == TensorProto.DOUBLE
    assert onnx_to_np_dtype(TensorProto.FLOAT) == np.float32
    with pytest.raises(TypeError, match="complex128"):
        np_dtype_to_onnx(np.complex128)
    with pytest.raises(TypeError, match="STRING"):
        onnx_to_np_dtype(TensorProto.STRING)


def test_parse_device():
    assert str(parse_device("cpu")) == "cpu"
    assert parse_device("CPU").providers() == ["CPUExecutionProvider"]
    with pytest.raises(ValueError, match="Unknown device 'tpu'"):
        parse_device("tpu")
    with pytest.raises(TypeError, match="device must be a string"):
        parse_device(0)


def test_cuda_without_provider_says_what_to_install():
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert parse_device("cuda:0").index == 0
    else:
        with pytest.raises(ValueError, match="onnxruntime-gpu"):
            parse_device("cuda:1")
