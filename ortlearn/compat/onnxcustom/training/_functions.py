"""Small standard-ONNX functions that onnxcustom's training objects run on OrtValues.

onnxcustom computed every weight update, loss and penalty with a tiny ONNX
graph run by onnxruntime next to the data (``axpy``, ``axpyw``, ...), so that
weights never leave the device. The same graphs are built here with ortlearn's
:class:`~ortlearn.graph.GraphBuilder` and run in one session per device.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import helper

from ....graph import DEFAULT_OPSET, GraphBuilder, finalize_model, np_dtype_to_onnx
from ....training import device_value, host_copy, make_session
from ..utils.onnxruntime_helper import as_device

__all__ = ["OrtFunction", "as_ort_value", "as_device", "to_numpy"]


def as_ort_value(value, device) -> ort.OrtValue:
    """``value`` (numpy array, OrtValue or C OrtValue) as an OrtValue on ``device``."""
    if isinstance(value, ort.OrtValue):
        return value
    if isinstance(value, ort.capi.onnxruntime_pybind11_state.OrtValue):
        return ort.OrtValue(value)
    if isinstance(value, np.ndarray):
        return device_value(value, as_device(device))
    raise TypeError(f"Expected a numpy array or an OrtValue, got {type(value)!r}.")


def to_numpy(value) -> np.ndarray:
    """A host copy of an OrtValue (a numpy array is returned as is)."""
    if isinstance(value, np.ndarray):
        return value
    return host_copy(as_ort_value(value, None))


class OrtFunction:
    """A function given as an ONNX model, run on OrtValues in one session.

    Parameters
    ----------
    model : onnx.ModelProto
    device : str or ortlearn.training.Device

    Examples
    --------
    >>> f = OrtFunction(axpy_model(np.float32), "cpu")
    >>> x = np.array([1.0, 2.0], dtype=np.float32)
    >>> to_numpy(f(x, x, np.array([0.5], dtype=np.float32))[0])
    array([1.5, 3. ], dtype=float32)
    """

    def __init__(self, model, device):
        self.onnx_model = model
        self.device = as_device(device)
        self.session = make_session(model, self.device)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, *values) -> list:
        if len(values) != len(self.input_names):
            raise ValueError(f"Expected {len(self.input_names)} inputs {self.input_names}, "
                             f"got {len(values)}.")
        feeds = {name: as_ort_value(v, self.device) for name, v in zip(self.input_names, values)}
        return run_ort_values(self.session, self.output_names, feeds, self.device)


def run_ort_values(session, output_names, feeds, device) -> list:
    """Run ``session`` on OrtValues; its outputs are allocated on ``device``.

    Through an IOBinding: ``InferenceSession.run_with_ort_values`` costs three
    times more per call (onnxruntime 1.31, CPU), and these functions run
    several times per batch.
    """
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, value)
    for name in output_names:
        binding.bind_output(name, device.ort_device_type, device.index)
    session.run_with_iobinding(binding)
    return binding.get_outputs()


def function_model(build, inputs, outputs, opset=DEFAULT_OPSET, scalars=None) -> object:
    """A model from ``build(builder)`` (which adds nodes producing ``outputs``).

    ``inputs`` and ``outputs`` are lists of ``(name, dtype, shape or None)``;
    ``scalars`` ``{name: (value, dtype)}`` become initializers of that name holding
    the value in ``float_data`` (``double_data``), as onnxcustom's graphs held their
    hyper-parameters.
    """
    scalars = scalars or {}
    b = GraphBuilder(opset=opset, prefix="f_",
                     used_names=[n for n, _, _ in inputs + outputs] + list(scalars))
    build(b)
    graph = helper.make_graph(
        b.nodes, "function",
        [helper.make_tensor_value_info(n, np_dtype_to_onnx(t), s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, np_dtype_to_onnx(t), s) for n, t, s in outputs],
        [helper.make_tensor(n, np_dtype_to_onnx(t), [], [float(v)])
         for n, (v, t) in scalars.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="ortlearn")
    # The inputs have no shape (a function applies to weights of any rank),
    # which onnx's checker refuses and onnxruntime accepts.
    return finalize_model(model, check=False)


def axpy_model(dtype):
    """``Y = alpha * X1 + X2`` (onnxcustom's ``axpy``)."""
    def build(b):
        b.op("Add", [b.op("Mul", ["X1", "alpha"]), "X2"], outputs=["Y"])
    return function_model(build, [("X1", dtype, None), ("X2", dtype, None), ("alpha", dtype, [1])],
                          [("Y", dtype, None)])


def axpyw_model(dtype, nesterov):
    """``Z = alpha * X1 + beta * G``; ``Y = Z + X2``, or ``Y = beta * Z + alpha * X1 + X2``
    with Nesterov's momentum (onnxcustom's ``axpyw`` and ``axpyw2``)."""
    def build(b):
        s1 = b.op("Mul", ["X1", "alpha"])
        b.op("Add", [s1, b.op("Mul", ["G", "beta"])], outputs=["Z"])
        if nesterov:
            b.op("Add", [b.op("Add", [s1, b.op("Mul", ["Z", "beta"])]), "X2"], outputs=["Y"])
        else:
            b.op("Add", ["Z", "X2"], outputs=["Y"])
    return function_model(
        build, [("X1", dtype, None), ("X2", dtype, None), ("G", dtype, None),
                ("alpha", dtype, [1]), ("beta", dtype, [1])],
        [("Y", dtype, None), ("Z", dtype, None)])


def zero_model(dtype):
    """``Y = X * 0`` (onnxcustom's ``zero``)."""
    def build(b):
        b.op("Mul", ["X", b.const(np.zeros(1, dtype=dtype))], outputs=["Y"])
    return function_model(build, [("X", dtype, None)], [("Y", dtype, None)])
