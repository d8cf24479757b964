"""Which operators, on which element types, an execution provider runs itself.

``python -m benchmarks.kernels DEVICE SECONDS`` opens one-operator models on
``DEVICE`` (``'webgpu'``, ``'cuda'``, ``'cpu'``) with onnxruntime's CPU fallback
disabled: a session that opens holds a kernel for that operator and those
types on the device. Two sets of models, at ortlearn's opset
(:data:`ortlearn.graph.model.DEFAULT_OPSET`):

* ONNX's node tests (``onnx.backend.test.case.node``), moved to that opset
  where they are valid there; their outputs are compared with the tests' own;
* every operator of the default domain on each of :data:`TYPES` (its first
  input's type constraint), with small valid values for the inputs of other
  constraints; their outputs are compared with the CPU provider's.

It prints one JSON record a model: ``case``, ``ops``, ``types`` (the inputs'),
``opset``, ``placed`` (the provider, ``'cpu'`` when onnxruntime refused to run
the model without the CPU, ``'error'`` otherwise, with ``message``) and
``error``, the outputs' largest relative difference (or ``run_error``).
:data:`ortlearn.training.placement.WEBGPU_KERNELS` is read off such a run
(:func:`kernel_table`).
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from ortlearn.graph.model import DEFAULT_OPSET
from ortlearn.training import parse_device, webgpu
from ortlearn.training.placement import primary_input

#: The element types each operator is tried on.
TYPES = ("float32", "float16", "float64", "int32", "int64", "uint32", "int8", "uint8", "bool")

#: Values of the inputs that are not of the tried type, by operator and input name.
_OTHER_INPUTS = {
    ("Reshape", "shape"): np.array([3, 2]),
    ("Expand", "shape"): np.array([2, 3]),
    ("Slice", "starts"): np.array([0]),
    ("Slice", "ends"): np.array([1]),
    ("Unsqueeze", "axes"): np.array([0]),
    ("Tile", "repeats"): np.array([1, 2]),
    ("Pad", "pads"): np.zeros(4, np.int64),
    ("CumSum", "axis"): np.array(0),
    ("TopK", "K"): np.array([1]),
    ("Gather", "indices"): np.array([1, 0]),
    ("GatherElements", "indices"): np.array([[0, 1, 0], [1, 0, 1]]),
    ("ScatterElements", "indices"): np.array([[0, 1, 0], [1, 0, 1]]),
    ("Where", "condition"): np.array([[True, False, True], [False, True, False]]),
}
_ATTRIBUTES = {"Concat": {"axis": 0}, "Split": {"num_outputs": 2}}


def _value(dtype: str, shape=(2, 3)) -> np.ndarray:
    """Small values of ``dtype``, none zero (a divisor), not all equal."""
    if dtype == "bool":
        return (np.arange(np.prod(shape)) % 2 == 0).reshape(shape)
    return (np.arange(np.prod(shape)) % 3 + 1).reshape(shape).astype(dtype)


def _type_str(dtype: str) -> str:
    """ONNX's name of a numpy dtype's tensor type: ``tensor(float)`` for float32."""
    name = helper.tensor_dtype_to_string(_onnx_type(dtype)).partition(".")[2]
    return f"tensor({name.lower()})"


def _onnx_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def typed_models():
    """``(case, model, inputs)`` for each operator of the default domain and each of
    :data:`TYPES` its first input takes, where such a model is valid."""
    for schema in sorted(onnx.defs.get_all_schemas(), key=lambda s: s.name):
        if schema.domain not in ("", "ai.onnx") or not schema.inputs or schema.deprecated:
            continue
        try:
            schema = onnx.defs.get_schema(schema.name, DEFAULT_OPSET)
        except onnx.defs.SchemaError:  # newer than the opset
            continue
        constraints = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
        primary = schema.inputs[primary_input(schema)].type_str
        for dtype in TYPES:
            if _type_str(dtype) not in constraints.get(primary, [primary]):
                continue
            built = _typed_model(schema, constraints, dtype, primary)
            if built is not None:
                yield (f"{schema.name}:{dtype}", *built)


def _typed_model(schema, constraints: dict, dtype: str, primary: str):
    inputs, feeds, constants = [], [], []
    for formal in schema.inputs:
        if formal.option == onnx.defs.OpSchema.FormalParameterOption.Optional:
            break
        count = 2 if formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic else 1
        for i in range(count):
            name = f"{formal.name}{i}" if count > 1 else formal.name
            if formal.type_str == primary:
                value = _value(dtype)
            elif (schema.name, formal.name) in _OTHER_INPUTS:
                # an initializer, as in a real graph: the output's shape is then known
                constants.append(onnx.numpy_helper.from_array(
                    _OTHER_INPUTS[(schema.name, formal.name)], name))
                inputs.append(name)
                continue
            else:
                allowed = constraints.get(formal.type_str, [formal.type_str])
                other = next((t for t in ("float32", "int64", "bool")
                              if _type_str(t) in allowed), None)
                if other is None:
                    return None
                value = _value(other)
            inputs.append(name)
            feeds.append(value)
    attributes = dict(_ATTRIBUTES.get(schema.name, {}))
    if schema.name == "Cast":
        attributes["to"] = onnx.TensorProto.INT64 if dtype == "float32" else onnx.TensorProto.FLOAT
    elif any(a.required for n, a in schema.attributes.items() if n not in attributes):
        return None
    options = [o.option for o in schema.outputs]
    if options and options[0] == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        outputs = ["out0", "out1"]
    else:
        outputs = [f"out{i}" for i, option in enumerate(options) if i == 0
                   or option != onnx.defs.OpSchema.FormalParameterOption.Optional]
    node = helper.make_node(schema.name, inputs, outputs, **attributes)
    fed = [n for n in inputs if n not in {c.name for c in constants}]
    graph = helper.make_graph(
        [node], "probe",
        [helper.make_tensor_value_info(n, _onnx_type(v.dtype.name), v.shape)
         for n, v in zip(fed, feeds)],
        [onnx.ValueInfoProto(name=n) for n in outputs], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)])
    try:
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                  data_prop=True)
        onnx.checker.check_model(model, full_check=True)
    except Exception:
        return None
    return model, feeds, None


def node_test_models():
    """``(case, model, inputs, expected outputs)`` of ONNX's node tests, each at
    ortlearn's opset where it is valid there."""
    from onnx.backend.test.case import node

    for case in sorted(node.collect_testcases(None), key=lambda c: c.name):
        if "_expanded" in case.name or not case.data_sets:
            continue
        inputs, outputs = case.data_sets[0]
        if not all(isinstance(a, np.ndarray) for a in [*inputs, *outputs]):
            continue
        yield case.name, _at_default_opset(case.model), list(inputs), list(outputs)


def _at_default_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    if any(n.domain not in ("", "ai.onnx") for n in model.graph.node):
        return model
    older = onnx.ModelProto.FromString(model.SerializeToString())
    for opset in older.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = DEFAULT_OPSET
    try:
        onnx.checker.check_model(older, full_check=True)
    except Exception:
        return model
    return older


def _options(device) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if device.kind != "cpu":
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if device.kind == "webgpu":
        options.add_provider_for_devices([webgpu.ep_device()], webgpu.provider_options())
    return options


def _largest_error(got, expected) -> float:
    worst = 0.0
    for a, b in zip(got, expected):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            raise ValueError(f"shape {a.shape} against {b.shape}")
        if a.dtype.kind == "f":
            scale = np.maximum(np.abs(b.astype(np.float64)), 1.0)
            err = np.abs(a.astype(np.float64) - b) / scale
            worst = max(worst, float(np.nanmax(err, initial=0.0)),
                        float((np.isnan(a) != np.isnan(b)).any()))
        else:
            worst = max(worst, float((a != b).any()))
    return worst


def probe(device, case: str, model: onnx.ModelProto, inputs, expected=None) -> dict:
    """The record of one model (see the module's description); ``expected`` None: the
    CPU provider's outputs."""
    default = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    record = {"case": case, "ops": sorted({n.op_type for n in model.graph.node}),
              "types": [str(a.dtype) for a in inputs], "opset": default[0] if default else None}
    if len(model.graph.node) == 1 and record["opset"] and not model.graph.node[0].domain:
        node = model.graph.node[0]
        position = primary_input(onnx.defs.get_schema(node.op_type, record["opset"]))
        fed = [i.name for i in model.graph.input]
        if position < len(node.input) and node.input[position] in fed:
            record["type"] = record["types"][fed.index(node.input[position])]
    data = model.SerializeToString()
    try:
        session = ort.InferenceSession(data, _options(device),
                                       providers=device.providers() or None)
        record["placed"] = session.get_providers()[0]
    except Exception as exc:
        text = str(exc)
        record["placed"] = "cpu" if "fallback to CPU EP has been explicitly" in text else "error"
        record["message"] = text[:300]
        return record
    try:
        feeds = dict(zip([i.name for i in session.get_inputs()], inputs))
        if expected is None:
            expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
                None, feeds)
        record["error"] = _largest_error(session.run(None, feeds), expected)
    except Exception as exc:
        record["run_error"] = str(exc)[:300]
    return record


def run(device: str, seconds: float) -> list:
    """The records of the typed models, then of the node tests, for at most ``seconds``."""
    where, deadline = parse_device(device), time.perf_counter() + seconds
    records = []
    for case, model, inputs, expected in [*typed_models(), *node_test_models()]:
        if time.perf_counter() > deadline:
            break
        records.append(probe(where, case, model, inputs, expected))
    return records


def kernel_table(records: list) -> dict:
    """``{operator: sorted element types}`` that opened on the device, from the records of
    one-operator models at ortlearn's opset (the type of the operator's
    :func:`~ortlearn.training.placement.primary_input`)."""
    table: dict = {}
    for record in records:
        if (record["opset"] == DEFAULT_OPSET and "type" in record
                and record["placed"] not in ("cpu", "error")):
            table.setdefault(record["ops"][0], set()).add(record["type"])
    return {op: sorted(types) for op, types in sorted(table.items())}


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    json.dump(run(sys.argv[1], float(sys.argv[2])), sys.stdout)
