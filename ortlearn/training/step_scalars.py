"""What an optimizer model reads besides tensors: ``learning_rate`` and ``step``.

On the CPU a :class:`~ortlearn.training.TrainingSession` binds them as two
small values written before each step. On a GPU the scalars an update derives
from them alone (Adam's bias corrections, the step size in the parameters'
dtype) are computed on the host by onnxruntime's CPU kernels, the nodes of the
model itself (:func:`~ortlearn.optim.split_step_scalars`), and only their
results are copied to the device, when they change: the update on the device
then holds no float64 node (WebGPU has none) and no chain of one-element
kernels, and it computes what the CPU's session computes, bit for bit on the
same kernels.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from ..graph import shape_of
from ..graph.format import LEARNING_RATE, STEP
from ..optim import split_step_scalars
from ._buffers import device_value
from .device import Device, make_session, make_session_options

__all__ = ["StepScalars"]


class StepScalars:
    """The scalar inputs of an optimizer model on a device, written before each step.

    Parameters
    ----------
    model : onnx.ModelProto
        An optimizer model in the tensor layout.
    device : Device
        The device the update runs on; on any but the CPU the step's scalars
        are computed on the host.

    Attributes
    ----------
    model : onnx.ModelProto
        The model the session runs on ``device``: ``model`` itself on the
        CPU, the update of :func:`~ortlearn.optim.split_step_scalars` elsewhere.

    Examples
    --------
    >>> from onnx import TensorProto
    >>> from ortlearn.optim import Adam, build_optimizer_model, unpack_optimizer_model
    >>> from ortlearn.training import parse_device
    >>> model = unpack_optimizer_model(build_optimizer_model(
    ...     Adam(), {"w": (TensorProto.FLOAT, [3])}))
    >>> scalars = StepScalars(model, parse_device("cpu"))
    >>> scalars.write(0.001, 1)
    >>> sorted(scalars.values)
    ['learning_rate', 'step']
    """

    def __init__(self, model: onnx.ModelProto, device: Device):
        self._shapes = {i.name: tuple(shape_of(i) or ()) for i in model.graph.input
                        if i.name in (LEARNING_RATE, STEP)}
        host = None
        if device.kind != "cpu":
            host, model = split_step_scalars(model)
        self.model = model
        self._device = device
        self._host = None if host is None else make_session(host, "cpu",
                                                            make_session_options(1))
        read = {i.name for i in model.graph.input}
        #: the values bound to the update's inputs, by name
        self.values: dict[str, ort.OrtValue] = {}
        #: the value of each last written, to skip a copy that changes nothing
        self._written: dict[str, np.ndarray] = {}
        self._direct = [name for name in (LEARNING_RATE, STEP) if name in read]

    def _inputs(self, learning_rate: float, step: int) -> dict:
        return {LEARNING_RATE: np.full(self._shapes[LEARNING_RATE], learning_rate, np.float32),
                STEP: np.full(self._shapes[STEP], step, np.int64)}

    def write(self, learning_rate: float, step: int) -> None:
        """Set the inputs of the step that uses ``learning_rate`` and counts ``step``."""
        inputs = self._inputs(learning_rate, step)
        values = {name: inputs[name] for name in self._direct}
        if self._host is not None:
            names = [o.name for o in self._host.get_outputs()]
            values.update(zip(names, self._host.run(names, inputs)))
        for name, array in values.items():
            if name not in self.values:
                self.values[name] = device_value(array, self._device)
            elif not np.array_equal(self._written[name], array):
                self.values[name].update_inplace(np.ascontiguousarray(array))
            else:
                continue
            self._written[name] = array

    def bind(self, binding: ort.IOBinding) -> None:
        """Bind the values to ``binding`` (after a first :meth:`write`)."""
        for name, value in self.values.items():
            binding.bind_ortvalue_input(name, value)
