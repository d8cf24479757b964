"""Device-resident buffers: the one implementation the engine and ``TrainingSession`` share.

A training step reads its weights (and gradients, optimizer states) and
writes their next values. Writing over what the step reads is only correct
when every node reading a value has run before the one writing it (which
:func:`~ortlearn.training.fused.in_place_safe` proves from the graph), and
allocating per step costs more than a small step, so each carried value has
two preallocated buffers, a *ping-pong pair*: a run reads the live half and
writes the spare one, then the halves swap (:class:`BufferPairs`); a value
proven safe has one buffer, bound as both (``in_place``).
:class:`StepBuffers` adds what the fused engine needs: one ``IOBinding``
per parity bound once, inputs bound once, and small per-epoch inputs copied
into buffers bound once. :class:`StepFeeds` feeds a host-fed step (one
batch a call, its row numbers and scalars written into fixed device buffers)
and replays the provider's recording of it (graph capture).

On the CPU, onnxruntime reads and writes numpy arrays in place, so pairs
created with ``shared=True`` hold numpy arrays: reading one back costs no
call into onnxruntime.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnxruntime as ort

from ..graph import elem_type_of, onnx_to_np_dtype, shape_of

__all__ = ["BufferPairs", "StepBuffers", "StepFeeds", "carried_types", "device_value",
           "host_copy", "is_state", "layout_part", "state_values", "weight_values"]


def device_value(array, device) -> ort.OrtValue:
    """A new OrtValue on ``device`` (a :class:`~ortlearn.training.Device`) holding a copy of
    ``array``.

    Examples
    --------
    >>> from ortlearn.training import parse_device
    >>> value = device_value(np.arange(3.0), parse_device("cpu"))
    >>> value.shape(), value.numpy().tolist()
    ([3], [0.0, 1.0, 2.0])
    """
    array = np.array(array, order="C")  # ascontiguousarray would make scalars 1-D
    value = ort.OrtValue.ortvalue_from_shape_and_type(
        list(array.shape), array.dtype, device.ort_device_type, device.index)
    value.update_inplace(array)
    return value


def host_copy(value: ort.OrtValue) -> np.ndarray:
    """A numpy copy of an OrtValue's tensor that later runs cannot change.

    ``OrtValue.numpy()`` copies a device tensor to the host, but on the CPU
    recent onnxruntime releases (1.32 at least) return a view of the
    OrtValue's own buffer: a buffer that the next run binding it as an output
    overwrites.

    Examples
    --------
    >>> value = ort.OrtValue.ortvalue_from_numpy(np.arange(3.0))
    >>> copy = host_copy(value)
    >>> value.update_inplace(np.zeros(3))
    >>> copy
    array([0., 1., 2.])
    """
    array = value.numpy()
    return array if array.base is None else array.copy()


class BufferPairs:
    """Two device buffers per value: a run reads the live half and writes the spare one.

    Parameters
    ----------
    values : dict of str to numpy.ndarray
        Initial value of each buffer (both halves start with it).
    device : ortlearn.training.Device
    shared : bool, default=False
        On the CPU, keep each half as a numpy array that onnxruntime reads
        and writes in place (:meth:`host` is then a view, free).
    in_place : collection of str, default=()
        Values whose two halves are one buffer: the run reads and writes it
        (the caller has proven that safe, see
        :func:`~ortlearn.training.fused.in_place_safe`); half the memory.

    Attributes
    ----------
    parity : int
        Which half is live (0 or 1); :meth:`swap` flips it.
    pairs : dict of str to list of onnxruntime.OrtValue
        ``{name: [half 0, half 1]}``.
    """

    def __init__(self, values: dict, device, shared: bool = False, in_place=()):
        self.parity = 0
        self.device = device
        self._hosts = {} if shared and device.kind == "cpu" else None
        self.pairs = {}
        for name, value in values.items():
            count = 1 if name in in_place else 2
            if self._hosts is not None:
                hosts = [np.array(value, order="C") for _ in range(count)]
                self._hosts[name] = hosts * (3 - count)
                halves = [ort.OrtValue.ortvalue_from_numpy(a) for a in hosts]
            else:
                halves = [device_value(value, device) for _ in range(count)]
            self.pairs[name] = halves * (3 - count)  # [one, one] or [half 0, half 1]

    def __contains__(self, name: str) -> bool:
        return name in self.pairs

    @property
    def shared(self) -> bool:
        """Whether the halves are numpy arrays that onnxruntime reads and writes in place."""
        return self._hosts is not None

    def live(self, name: str) -> ort.OrtValue:
        """The half holding the current value."""
        return self.pairs[name][self.parity]

    def spare(self, name: str) -> ort.OrtValue:
        """The half the next run writes."""
        return self.pairs[name][1 - self.parity]

    def swap(self) -> None:
        """The spare halves, just written, become the live ones."""
        self.parity = 1 - self.parity

    def host(self, name: str) -> np.ndarray:
        """The live value on the host: with ``shared``, a view that the next run may overwrite."""
        if self._hosts is None:
            return self.live(name).numpy()
        return self._hosts[name][self.parity]

    def host_copy(self, name: str) -> np.ndarray:
        """A host copy of the live value that later runs leave alone."""
        if self._hosts is None:
            return host_copy(self.live(name))
        return self._hosts[name][self.parity].copy()

    def write(self, name: str, array) -> None:
        """Overwrite the live value (same shape and dtype)."""
        self.live(name).update_inplace(np.array(array, order="C"))


class StepBuffers(BufferPairs):
    """The carried values of a step graph, bound once: a run costs one call and no binding.

    ``bindings[parity]`` reads the buffers of ``parity`` and writes the
    others; after the run, :meth:`swap` makes the written ones live.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        The step (or epoch) session.
    carried : dict of str to str
        ``{carried input: the output holding its next value}``.
    values : dict of str to numpy.ndarray
        Initial value of each carried input.
    device : ortlearn.training.Device
    counters : dict of str to numpy.ndarray
        Carried values that restart at the given value each epoch
        (:meth:`reset_counters`): the loss sum, the batch counter.
    in_place : collection of str, default=()
        Carried inputs the run may write their next value over (one buffer
        bound as the input and the output, see :class:`BufferPairs`).

    Attributes
    ----------
    bounds : object
        The batch bounds written last (the engine's cache key).
    """

    def __init__(self, session: ort.InferenceSession, carried: dict, values: dict, device,
                 counters: dict, in_place=()):
        super().__init__({name: values[name] for name in carried}, device, shared=True,
                         in_place=in_place)
        self.counters = counters
        self.bounds = None
        self.epoch_values = {}  # name -> (bound OrtValue, (shape, dtype))
        self._inputs = {}  # name -> the OrtValue bound
        self._shared = {}  # name -> (numpy array, the OrtValue reading it), on the CPU
        self.bindings = []
        for parity in (0, 1):
            binding = session.io_binding()
            for name, output in carried.items():
                binding.bind_ortvalue_input(name, self.pairs[name][parity])
                binding.bind_ortvalue_output(output, self.pairs[name][1 - parity])
            self.bindings.append(binding)

    def bind_inputs(self, values: dict) -> None:
        """Bind OrtValues to both bindings (those bound already are skipped)."""
        for name, value in values.items():
            if self._inputs.get(name) is not value:
                for binding in self.bindings:
                    binding.bind_ortvalue_input(name, value)
                self._inputs[name] = value

    def bind_epoch_data(self, arrays: dict) -> None:
        """Bind per-epoch data that may change in place between epochs (the row order).

        On the CPU onnxruntime reads the arrays in place: an array bound at
        the previous epoch costs nothing. On a GPU they are copied
        (:meth:`write_epoch_values`).
        """
        if self.device.kind != "cpu":
            self.write_epoch_values(arrays)
            return
        values = {}
        for name, array in arrays.items():
            shared = self._shared.get(name)
            if shared is None or shared[0] is not array:
                shared = self._shared[name] = (array, ort.OrtValue.ortvalue_from_numpy(array))
            values[name] = shared[1]
        self.bind_inputs(values)

    def write_epoch_values(self, values: dict) -> None:
        """Copy small per-epoch inputs into their bound buffers (bound again if a shape changes).

        Cheaper than a new OrtValue and two bindings per input and epoch:
        an epoch of a small model lasts about a millisecond.
        """
        fresh = {}
        for name, array in values.items():
            bound = self.epoch_values.get(name)
            if bound is not None and bound[1] == (array.shape, array.dtype):
                bound[0].update_inplace(array)
            else:
                fresh[name] = (device_value(array, self.device), (array.shape, array.dtype))
        self.bind_inputs({name: value for name, (value, _) in fresh.items()})
        self.epoch_values.update(fresh)

    def reset_counters(self) -> None:
        """The counters back to their initial values."""
        for name, zero in self.counters.items():
            self.live(name).update_inplace(zero)


class StepFeeds:
    """The per-batch inputs of a host-fed step, written before each run into fixed buffers.

    A host-fed step (:func:`~ortlearn.training.fused.build_fused_step` with
    ``host_fed=True``) reads the row numbers of its batch, the batch's size
    and the optimizer's scalars of the step. Each is a device buffer bound
    once, written in place before a run: one ``IOBinding`` per batch size and
    parity of the carried buffers, each bound to the same data. With graph
    capture, the provider records the run of the first batch size at its
    first run (graph ids 0 and 1, one per parity) and replays it afterwards;
    the other sizes (an epoch's last, smaller batch) run unrecorded.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
    buffers : StepBuffers
        The carried values.
    layout : ortlearn.training.fused.FusedLayout
        A host-fed step's layout.
    dtypes : dict of str to numpy.dtype
        The dtype of each per-step input.
    capture : bool
        Whether the session records its runs (``enableGraphCapture``).
    """

    _UNRECORDED = "-1"

    def __init__(self, session: ort.InferenceSession, buffers: StepBuffers, layout, dtypes: dict,
                 capture: bool):
        self.session, self.buffers, self.layout = session, buffers, layout
        self.dtypes = dtypes
        self.capture = capture
        self._data = {}
        self._bound = {}  # (batch size, parity) -> (IOBinding, {input: OrtValue}, RunOptions)
        self._recorded_size = None

    def bind_data(self, values: dict) -> None:
        """Bind the data (``{graph input: OrtValue}``) every run gathers its rows from."""
        if all(self._data.get(k) is v for k, v in values.items()) and len(values) == len(
                self._data):
            return
        self._release()
        self._data = dict(values)

    def _release(self) -> None:
        # a recording replays the buffers it was made with: new data needs a new one
        for (size, parity) in self._bound:
            if self.capture and size == self._recorded_size:
                self.session.release_captured_graph(parity)
        self._bound.clear()
        self._recorded_size = None

    def _binding(self, size: int, parity: int):
        key = (size, parity)
        if key not in self._bound:
            binding = self.session.io_binding()
            pairs = self.buffers.pairs
            for name, output in self.layout.carried.items():
                binding.bind_ortvalue_input(name, pairs[name][parity])
                binding.bind_ortvalue_output(output, pairs[name][1 - parity])
            for name, value in self._data.items():
                binding.bind_ortvalue_input(name, value)
            batch, *scalars = self.layout.epoch_inputs
            feeds = {batch: device_value(np.zeros(size, np.int64), self.buffers.device)}
            feeds.update((name, device_value(np.zeros((), self.dtypes[name]),
                                             self.buffers.device)) for name in scalars)
            for name, value in feeds.items():
                binding.bind_ortvalue_input(name, value)
            if self.capture and self._recorded_size in (None, size):
                self._recorded_size = size
                graph_id = str(parity)
            else:
                graph_id = self._UNRECORDED
            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", graph_id)
            self._bound[key] = (binding, feeds, options)
        return self._bound[key]

    def run_epoch(self, order: np.ndarray, starts, sizes, step_values: dict) -> None:
        """Run one step per batch: batch ``i`` is ``order[starts[i]:starts[i] + sizes[i]]``.

        ``step_values`` holds, for each per-step input but the row numbers,
        one value per batch.
        """
        for i, (start, size) in enumerate(zip(starts.tolist(), sizes.tolist())):
            rows = order[start:start + size]
            values = {name: np.asarray(v[i], self.dtypes[name]) for name, v in step_values.items()}
            try:
                self._step(rows, values)
            except Exception as exc:
                if not (self.capture and size == self._recorded_size):
                    raise
                # The provider could not record the step (a node it placed on the
                # CPU): from now on it runs unrecorded. The run wrote only spare buffers.
                warnings.warn(f"The WebGPU provider could not record the training step "
                              f"({exc}); it runs without graph capture.", RuntimeWarning)
                self.capture = False
                self._bound.clear()
                self._recorded_size = None
                self._step(rows, values)
            self.buffers.swap()

    def _step(self, rows: np.ndarray, values: dict) -> None:
        binding, feeds, options = self._binding(len(rows), self.buffers.parity)
        feeds[self.layout.epoch_inputs[0]].update_inplace(rows)
        for name, value in values.items():
            feeds[name].update_inplace(value)
        self.session.run_with_iobinding(binding, options)


# ------------------------------------------------ a layout's values in buffers
def layout_part(layout, copies: dict, buffers, carried: str, param: str) -> np.ndarray:
    """The host value of ``param``'s part of the carried buffer ``carried``.

    A view of one host copy per carried buffer (kept in ``copies``), so that
    the weights of a flat buffer cost one copy, not one each.
    """
    if carried not in copies:
        copies[carried] = buffers.host_copy(carried)
    value = copies[carried]
    if param in layout.offsets:
        offset, shape = layout.offsets[param]
        value = value[offset:offset + math.prod(shape)].reshape(shape)
    return value


def weight_values(layout, buffers: StepBuffers | None, copies: dict | None = None,
                   only=None) -> dict:
    """``{weight: host value}`` (those in ``only`` if given).

    ``copies`` gives and receives ``{carried input: host copy}``; ``buffers``
    may be None when it holds them all.
    """
    copies = {} if copies is None else copies
    return {p: layout_part(layout, copies, buffers, c, p) for p, c in layout.weights.items()
            if only is None or p in only}


def state_values(layout, buffers: StepBuffers) -> dict:
    """``{weight: {state: host value}}`` of the optimizer states."""
    copies = {}
    return {p: {s: layout_part(layout, copies, buffers, c, p) for s, c in d.items()}
            for p, d in layout.states.items()}


def is_state(layout, name: str) -> bool:
    return any(name in d.values() for d in layout.states.values())


def carried_types(model, carried) -> dict:
    """``{carried input: (numpy dtype, shape)}`` from the graph's declarations."""
    declared = {i.name: i for i in model.graph.input}
    return {n: (onnx_to_np_dtype(elem_type_of(declared[n])), tuple(shape_of(declared[n])))
            for n in carried}

