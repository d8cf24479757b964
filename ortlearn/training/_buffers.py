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
into buffers bound once. :class:`StepFeeds` feeds a table-fed step (the
epoch's batches and scalars written once per epoch into fixed device
buffers, read at the step's batch number) and replays the provider's
recording of it (graph capture).

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
from .fused import STEP_IN_EPOCH

__all__ = ["BufferPairs", "StepBuffers", "StepFeeds", "carried_types", "device_value",
           "graph_run_options", "host_copy", "is_state", "layout_part", "run_recorded",
           "state_values", "weight_values"]


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

    def in_place(self, name: str) -> bool:
        """Whether the two halves of ``name`` are one buffer (``in_place``)."""
        first, second = self.pairs[name]
        return first is second

    def host(self, name: str, spare: bool = False) -> np.ndarray:
        """The live value (or the ``spare`` one) on the host: with ``shared``, a view that the
        next run may overwrite."""
        half = 1 - self.parity if spare else self.parity
        if self._hosts is None:
            return self.pairs[name][half].numpy()
        return self._hosts[name][half]

    def half(self, name: str, parity: int) -> np.ndarray:
        """The numpy array onnxruntime reads and writes as the half ``parity`` (``shared``)."""
        if self._hosts is None:
            raise ValueError("The halves are numpy arrays only with shared=True on the CPU.")
        return self._hosts[name][parity]

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
    """The batches of a table-fed step, written once per epoch into fixed device buffers.

    A table-fed step (:func:`~ortlearn.training.fused.build_fused_step` with
    ``batch_table=True``) reads row ``k`` of three tables, ``k`` being its
    carried batch number: the row numbers of the batches (int32, one row per
    batch), their sizes and the optimizer's scalars of each step. The epoch's
    full batches, all of one size, are one table written before the first
    step, so that a step is one call and no copy to the device (each copy
    waits for the GPU); each batch of another size (the epoch's last,
    smaller one) is a table of its own, ``k`` set back to 0. Each table is a
    device buffer bound once: one ``IOBinding`` per table shape and parity of
    the carried buffers. With graph capture, the provider records the run of
    the first table shape at its first run (graph ids 0 and 1, one per
    parity) and replays it afterwards; the other shapes run unrecorded.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
    buffers : StepBuffers
        The carried values.
    layout : ortlearn.training.fused.FusedLayout
        A table-fed step's layout.
    dtypes : dict of str to numpy.dtype
        The dtype of each table but the row numbers'.
    capture : bool
        Whether the session records its runs (``enableGraphCapture``).
    """

    def __init__(self, session: ort.InferenceSession, buffers: StepBuffers, layout, dtypes: dict,
                 capture: bool):
        self.session, self.buffers, self.layout = session, buffers, layout
        self.dtypes = dtypes
        self.capture = capture
        self._data = {}
        self._tables = {}  # (batches, batch size) -> {input: OrtValue}
        self._written = {}  # ((batches, batch size), input) -> the values last written
        self._bound = {}  # (batches, batch size, parity) -> (IOBinding, RunOptions)
        self._recorded = None  # the table shape recorded
        self._first_batch = np.zeros((), buffers.counters[STEP_IN_EPOCH].dtype)

    def bind_data(self, values: dict) -> None:
        """Bind the data (``{graph input: OrtValue}``) every run gathers its rows from."""
        if all(self._data.get(k) is v for k, v in values.items()) and len(values) == len(
                self._data):
            return
        self._release()
        self._data = dict(values)

    def _release(self) -> None:
        # a recording replays the buffers it was made with: new data needs a new one
        if self.capture and self._recorded is not None:
            for parity in (0, 1):
                if (*self._recorded, parity) in self._bound:
                    self.session.release_captured_graph(parity)
        self._bound.clear()
        self._recorded = None

    def _binding(self, shape: tuple, parity: int):
        key = (*shape, parity)
        if key not in self._bound:
            if shape not in self._tables:
                batch, *others = self.layout.epoch_inputs
                tables = {batch: np.zeros(shape, np.int32)}
                tables.update((name, np.zeros(shape[0], self.dtypes[name])) for name in others)
                self._tables[shape] = {name: device_value(value, self.buffers.device)
                                       for name, value in tables.items()}
            binding = self.session.io_binding()
            pairs = self.buffers.pairs
            for name, output in self.layout.carried.items():
                binding.bind_ortvalue_input(name, pairs[name][parity])
                binding.bind_ortvalue_output(output, pairs[name][1 - parity])
            for name, value in {**self._data, **self._tables[shape]}.items():
                binding.bind_ortvalue_input(name, value)
            if self.capture and self._recorded in (None, shape):
                self._recorded = shape
                graph_id = parity
            else:
                graph_id = None
            self._bound[key] = (binding, graph_run_options(graph_id))
        return self._bound[key]

    def run_epoch(self, order: np.ndarray, starts, sizes, step_values: dict) -> None:
        """Run one step per batch: batch ``i`` is ``order[starts[i]:starts[i] + sizes[i]]``.

        ``step_values`` holds, for each table but the row numbers, one value
        per batch. The carried batch number must be 0 (``reset_counters``).
        """
        starts, sizes = starts.tolist(), sizes.tolist()
        full = next((i for i, s in enumerate(sizes) if s != sizes[0]), len(sizes))
        groups = [(0, full)] + [(i, i + 1) for i in range(full, len(sizes))]
        for first, end in groups:
            shape = (end - first, sizes[first])
            batch, *others = self.layout.epoch_inputs
            tables = {batch: order[starts[first]:starts[first] + shape[0] * shape[1]]}
            tables.update((name, step_values[name][first:end]) for name in others)
            if first:
                self.buffers.live(STEP_IN_EPOCH).update_inplace(self._first_batch)
            self._run_group(shape, tables)

    def _run_group(self, shape: tuple, tables: dict) -> None:
        self._binding(shape, self.buffers.parity)
        for name, value in self._tables[shape].items():
            array = np.ascontiguousarray(
                tables[name], self.dtypes.get(name, np.int32)).reshape(value.shape())
            # a table that holds these values already is not written again (the batch
            # sizes, a constant rate): each copy to the device waits for it
            written = self._written.get((shape, name))
            if written is None or not np.array_equal(written, array):
                value.update_inplace(array)
                self._written[(shape, name)] = array.copy()
        for _ in range(shape[0]):
            binding, options = self._binding(shape, self.buffers.parity)
            if not (self.capture and shape == self._recorded):
                self.session.run_with_iobinding(binding, options)
            elif not run_recorded(self.session, binding, options, "the training step"):
                # from now on the step runs unrecorded; the run wrote only spare buffers
                self.capture = False
                self._bound.clear()
                self._recorded = None
                binding, options = self._binding(shape, self.buffers.parity)
                self.session.run_with_iobinding(binding, options)
            self.buffers.swap()


def graph_run_options(graph_id: int | None) -> ort.RunOptions:
    """Run options that record a run as GPU graph ``graph_id`` (graph capture), or replay
    it once recorded; None runs unrecorded."""
    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", "-1" if graph_id is None else str(graph_id))
    return options


def run_recorded(session: ort.InferenceSession, binding: ort.IOBinding,
                 options: ort.RunOptions, what: str) -> bool:
    """Run ``binding`` as the recorded graph of ``options``; False, with a ``RuntimeWarning``
    naming ``what``, where the provider cannot record it (a node it placed on the CPU): the
    caller runs it unrecorded from then on."""
    try:
        session.run_with_iobinding(binding, options)
    except Exception as exc:
        warnings.warn(f"The WebGPU provider could not record {what} ({exc}); it runs without "
                      "graph capture.", RuntimeWarning, stacklevel=3)
        return False
    return True


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

