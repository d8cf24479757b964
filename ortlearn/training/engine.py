"""The training engine: one place where a loss graph becomes training steps.

:class:`TrainingEngine` takes an ONNX graph that already computes a scalar
loss (built by :func:`ortlearn.add_loss_output`, onnxblock or by hand) and
fuses it with its gradients and the optimizer update into ONE graph
(:mod:`ortlearn.training.fused`), run once per mini-batch, or once per epoch
as an ONNX ``Loop``. The estimators own the epochs, the data checks and the
schedules; the engine owns the steps. An epoch's mini-batches are a
:class:`~ortlearn.training.Batches`, whose row order the engine feeds
without a copy.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import NamedTuple

import numpy as np
import onnxruntime as ort

from ..exceptions import ConvergenceError
from ..graph import (
    class_label_marks,
    elem_type_of,
    load_model,
    onnx_to_np_dtype,
    shape_of,
)
from ..graph.cache import model_digest
from ..graph.format import DEFAULT_LEARNING_RATE
from ..graph.passes import CHEAPER_NODES, GPU_NODES
from ..optim import Optimizer
from . import webgpu
from ._buffers import (
    StepBuffers,
    StepFeeds,
    carried_types,
    device_value,
    is_state,
    layout_part,
    state_values,
    weight_values,
)
from .cache import COMPILED_MAX_WEIGHT_BYTES, COMPILED_STEPS
from .checkpoint import CheckpointState
from .checks import (
    check_class_labels,
    check_input_names,
    check_learning_rate,
    check_learning_rates,
    check_loss_output,
    check_trainable,
    conform_state,
    initial_values,
    memory_errors,
    replace_initializers,
)
from .device import PROFILE_ENV, make_session, parse_device
from .fused import (
    ROWS,
    FusedLayout,
    build_fused_epoch,
    build_fused_step,
    eval_graph,
    hyper_inputs,
    strip_weights,
)
from .placement import warn_cpu_fallbacks
from .policy import LARGE_MODEL_BYTES, LOOP_MIN_STEP_MACS, default_session_options
from .scattered import ScatterRun

__all__ = ["TrainingEngine"]


#: Data inputs of at most this many bytes per row (labels, sample weights) are
#: reordered once per epoch on the host (``array[order]``) and sliced per step:
#: a ``Gather`` of a batch of random rows of such an input waits on one cache
#: miss per row, while a wide input gets several values per miss.
EPOCH_ORDERED_ROW_BYTES = 16
#: With a constant learning rate, the optimizer's per-step scalars (Adam's
#: bias-corrected rate) are computed for whole epochs of about this many steps
#: at once (at least one epoch): numpy calls between two onnxruntime calls are
#: slow (cold caches), and a larger block would only add float64 temporaries
#: to the peak memory of a fit.
SCALAR_BLOCK_STEPS = 512
#: Rows per batch assumed when the engine is not told (scikit-learn's 'auto').
DEFAULT_BATCH_ROWS = 200


class TrainingEngine:
    """Mini-batch training of an ONNX loss graph, one onnxruntime call per batch or epoch.

    Parameters
    ----------
    loss_model : onnx.ModelProto, bytes or path
        A graph with a scalar output ``loss_output`` (the loss, penalties
        included), e.g. from :func:`ortlearn.add_loss_output`.
    trainable : list of str
        Float initializers to train; the others stay constant.
    optimizer : ortlearn.optim.SGD, Adam or AdamW
        The update rule.
    device : str, default='cpu'
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'``.
    input_names : list of str, default=None
        The data inputs fed at every step, in the order of the ``arrays``
        given to :meth:`train_epoch` and :meth:`eval_loss`; they must be
        exactly the graph inputs that are not initializers (in any order).
        None: those inputs in graph order.
    loss_output : str, default='loss'
        Name of the loss output.
    initial_weights : dict, default=None
        Values replacing some initializers before training (name -> array of
        the initializer's shape; cast to its dtype).
    session_options : onnxruntime.SessionOptions, default=None
        Options of the onnxruntime sessions. None: those of
        :func:`~ortlearn.training.make_session_options`; on the CPU,
        a step of fewer than ``PARALLEL_MIN_STEP_MACS`` multiply-adds
        (``batch_size`` times the number of weights) runs on one thread
        (thread hand-offs cost more than such a step), a larger one on
        ``ORTLEARN_NUM_THREADS`` threads or onnxruntime's default, with
        spinning workers unless ``ORTLEARN_ALLOW_SPINNING=0`` (spinning
        takes the cores of other processes: turn it off on a shared machine).
        From ``policy.LARGE_MODEL_BYTES`` of weights, without onnxruntime's
        memory pattern.
    epoch_loop : bool or 'auto', default='auto'
        True runs a whole epoch as one onnxruntime call (an ONNX ``Loop``
        over the mini-batches), False one call per mini-batch; 'auto'
        chooses (see Notes).
    batch_size : int, default=None
        Rows of a typical mini-batch, for the default ``session_options``
        (None: ``DEFAULT_BATCH_ROWS``).
    deterministic : bool, default=False
        Reproducible training asked for (the estimators: a ``random_state``
        given): on a GPU the default ``session_options`` ask onnxruntime for
        deterministic kernels. The CPU kernels are deterministic for a given
        number of threads already (the option only slows them down, with
        the same weights bit for bit), so the CPU ignores it.
    batch_table : bool, default=None
        Read each step's batch from a table of row numbers written once per
        epoch (one call per batch, no float64 value, int32 indices;
        ``build_fused_step(batch_table=True)``). None: on WebGPU only, whose
        provider would run the other step's ``Slice`` bounds and float64
        loss sum on the CPU; there the step is recorded once and replayed
        (``ORTLEARN_WEBGPU_GRAPH_CAPTURE``).

    Attributes
    ----------
    input_names : list of str
        The data inputs, in the order :meth:`train_epoch` expects.
    input_dtypes : dict of str to numpy.dtype
        Element type of each data input.
    input_shapes : dict of str to list
        Declared shape of each data input (ints, symbolic names or None).
    trainable : list of str
        The trained weights.
    n_steps : int
        Optimizer updates made so far (restored by :meth:`load_optimizer_state`).
    epoch_loop : bool
        Whether an epoch is one onnxruntime call.

    Raises
    ------
    ValueError
        Unknown or non-float trainable names, bad ``input_names``, a missing
        loss output, an invalid ``initial_weights``.
    TypeError
        ``optimizer`` is not an ortlearn optimizer.

    Notes
    -----
    A step is one graph (:func:`~ortlearn.training.fused.build_fused_step`):
    it gathers its rows from the training data, which are put on the device
    once (on the CPU, onnxruntime reads the numpy arrays in place), computes
    the loss, the gradients and the update, and adds ``loss * rows`` to a
    running sum. The weights, the optimizer state, the batch counter and the
    loss sum are carried from step to step in two preallocated sets of
    OrtValues bound once through IOBinding (ping-pong): a step binds and
    allocates nothing from Python and reads nothing back. Per epoch, the
    engine feeds the row order (read in place on the CPU: an order shuffled
    in place, as the estimators do, is bound once), the bounds and sizes of
    the batches (copied again only when they change) and the optimizer's
    scalars of each step (the learning rate: per-step schedules stay exact;
    with a constant rate they are computed for the epochs of about
    ``SCALAR_BLOCK_STEPS`` steps at a time), then reads the loss sum and
    checks the weights finite. What a divergence restores, the weights at the
    epoch's start, is read from the buffers the epoch's run did not write
    when it was one run; an epoch of several runs copies them first.

    With ``epoch_loop='auto'`` an epoch is one ``Loop`` call on the CPU
    below ``LARGE_MODEL_BYTES`` of weights (the Loop keeps a copy of
    the carried weights and moments; a step over more weights outlasts the
    call it saves; a larger model's step keeps a tensor per weight and
    writes the weights and the optimizer's state in place); on a GPU when a
    step computes at least ``LOOP_MIN_STEP_MACS`` multiply-adds (batch rows
    times weights), else one call per batch: on the CPU the Loop is faster
    for every small model measured (``doc/performance_notes.rst``). With the Loop,
    a Ctrl-C stops training at the end of the epoch.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LinearRegression
    >>> from skl2onnx import to_onnx
    >>> from ortlearn import add_loss_output
    >>> from ortlearn.optim import SGD
    >>> from ortlearn.training import Batches
    >>> X = np.random.RandomState(0).randn(40, 2).astype(np.float32)
    >>> y = X @ np.array([1.0, -2.0], dtype=np.float32)
    >>> onx = to_onnx(LinearRegression().fit(X, y), X, black_op={'LinearRegressor'})
    >>> engine = TrainingEngine(add_loss_output(onx), ['coef', 'intercept'], SGD(),
    ...                         initial_weights={'coef': np.zeros((2, 1))})
    >>> engine.set_learning_rate(0.05)
    >>> batches = Batches(np.arange(40), 8)
    >>> losses = [engine.train_epoch([X, y[:, None]], batches) for _ in range(5)]
    >>> bool(losses[-1] < losses[0])
    True
    """

    #: Learning rate until :meth:`set_learning_rate` is called.
    default_learning_rate = DEFAULT_LEARNING_RATE

    def __init__(self, loss_model, trainable, optimizer, device="cpu", input_names=None,
                 loss_output="loss", initial_weights=None, session_options=None,
                 epoch_loop="auto", batch_size=None, deterministic=False, batch_table=None):
        if not isinstance(optimizer, Optimizer):
            raise TypeError("optimizer must be an ortlearn.optim.SGD, Adam or AdamW instance, "
                            f"got {type(optimizer).__name__}.")
        if epoch_loop not in (True, False, "auto"):
            raise ValueError(f"epoch_loop must be True, False or 'auto', got {epoch_loop!r}.")
        model = load_model(loss_model)
        # False: shape inference could not tell whether the loss has one value per row;
        # the first epoch checks it on two rows (_check_one_loss_value)
        self._loss_is_scalar = check_loss_output(model, loss_output)
        self.trainable = check_trainable(model, trainable)
        self.input_names = check_input_names(model, input_names)
        declared = {i.name: i for i in model.graph.input}
        self.input_dtypes = {n: onnx_to_np_dtype(elem_type_of(declared[n]))
                             for n in self.input_names}
        self.input_shapes = {n: shape_of(declared[n]) for n in self.input_names}
        # Inputs holding class indices of a cross-entropy loss: checked as data enters.
        self._label_marks = class_label_marks(model)
        initial_weights = dict(initial_weights or {})
        # the trained weights' starting values go to the session, not into the graph
        starts = {n: initial_weights.pop(n) for n in self.trainable if n in initial_weights}
        if initial_weights:
            replace_initializers(model, initial_weights)
        self.loss_output = loss_output
        self.optimizer = optimizer
        self.device = device
        self._device = parse_device(device)
        self._batch_table = (self._device.kind == "webgpu" if batch_table is None
                             else bool(batch_table))
        if self._batch_table and epoch_loop is True:
            raise ValueError("A table-fed step runs one batch a call: epoch_loop=True is not "
                             "possible with batch_table=True or on WebGPU.")
        self._initial = initial_values(model, self.trainable, starts)
        # inputs bound once: fits differing only in them share one compiled step
        self._hyper = {name: device_value(value, self._device)
                       for name, value in hyper_inputs(model).items()}
        if self._device.ort_device_type == "webgpu":
            webgpu.check_float32({**self.input_dtypes,
                                  **{n: v.dtype for n, v in self._initial.items()}})
        # The graphs built from the model need only the weights' names, shapes and
        # types: a copy of their values would stay alive for the whole training.
        self._model = model = strip_weights(model, self.trainable)
        self._own_options = session_options is not None
        self._weight_bytes = sum(w.nbytes for w in self._initial.values())
        self._session_options = session_options or default_session_options(
            self._device, (batch_size or DEFAULT_BATCH_ROWS) * sum(
                w.size for w in self._initial.values()), deterministic,
            self._weight_bytes)
        self._epoch_loop = epoch_loop
        self._steps = {}  # epoch_loop -> (session, layout, ping-pong buffers)
        self._eval_session = None
        self._data = (None, None)  # (the arrays, their OrtValues and reordering buffers)
        self._bounds = None  # the batch bounds of the last epoch (_epoch_bounds)
        self._scalar_block = None  # the optimizer's scalars of the next steps (_step_scalars)
        self._lr = self.default_learning_rate
        self.n_steps = 0
        self._open(self._choose_loop(0))

    # ---------------------------------------------------------------- session
    def _open(self, loop: bool) -> None:
        """Build (once) the step or epoch graph; move the live values to it."""
        current = self._steps.get(self._current) if hasattr(self, "_current") else None
        if loop not in self._steps:
            model, layout, session, capture = self._compiled(loop)
            # read-only zeros that hold no memory: the buffers are the copies
            zeros = {name: np.broadcast_to(np.zeros((), dtype), shape) for name, (dtype, shape)
                     in carried_types(model, layout.carried).items()}
            counters = {name: np.zeros_like(zeros[name]) for name in layout.carried
                        if name not in layout.weights.values() and not is_state(layout, name)}
            # One buffer, read and written by the step, for the values the graph
            # provably reads before it overwrites them (tested bit for bit on the CPU).
            in_place = layout.in_place if self._device.kind == "cpu" else ()
            buffers = StepBuffers(session, layout.carried, zeros, self._device, counters,
                                  in_place)
            buffers.bind_inputs(self._hyper)
            feeds = StepFeeds(session, buffers, layout, {
                ROWS: zeros[layout.loss_sum].dtype,
                **dict.fromkeys(layout.scalars.values(), layout.scalar_dtype)},
                capture) if layout.batch_table else None
            scatter = (ScatterRun(layout.scatters, buffers, self._session_options)
                       if layout.scatters else None)
            self._steps[loop] = _Step(session, layout, buffers, feeds, scatter)
        if current is None:
            self._current = loop
            self.set_state(self._initial)
            # From now on only their shapes and dtypes are read (conform_state).
            self._initial = {n: np.broadcast_to(np.zeros((), v.dtype), v.shape)
                             for n, v in self._initial.items()}
            return
        weights = weight_values(current.layout, current.buffers)
        states = state_values(current.layout, current.buffers)
        self._current = loop
        self._write_carried(weights, states)

    def _compiled(self, loop: bool) -> tuple:
        """``(graph, layout, session, recorded)`` of the epoch (``loop``) or step graph.

        Another fit's (:data:`~ortlearn.training.cache.COMPILED_STEPS`) when it
        compiled the same: the same loss graph less its weights' values, the
        same optimizer, device and session settings.
        """
        key = self._compiled_key(loop)
        cached = None if key is None else COMPILED_STEPS.get(key)
        if cached is not None:
            return cached
        if loop:
            model, layout = build_fused_epoch(
                self._model, self.trainable, self.input_names, self.optimizer,
                self.loss_output, self._epoch_ordered())
        else:
            # A large model on the CPU: a tensor per weight, written in place.
            model, layout = build_fused_step(
                self._model, self.trainable, self.input_names, self.optimizer,
                self.loss_output, self._epoch_ordered(), flat=not self._large(),
                batch_table=self._batch_table, passes=GPU_NODES
                if self._device.ort_device_type == "webgpu" else CHEAPER_NODES)
        session, capture = self._step_session(model)
        # a recording replays one fit's buffers: its session is that fit's alone
        if key is not None and not capture:
            COMPILED_STEPS.put(key, (model, layout, session, capture))
        return model, layout, session, capture

    def _compiled_key(self, loop: bool) -> tuple | None:
        """Everything the graph and the session depend on; None: not to be shared (a
        large model, the caller's own session options, a profiled session)."""
        options = self._session_options
        if (self._own_options or os.environ.get(PROFILE_ENV, "").strip()
                or self._weight_bytes > COMPILED_MAX_WEIGHT_BYTES):
            return None
        return (model_digest(self._model), tuple(self.trainable), tuple(self.input_names),
                self.loss_output, self.optimizer.type, repr(sorted(self.optimizer.hyper.items())),
                loop, self._large(), self._batch_table, str(self._device),
                options.enable_mem_pattern, options.intra_op_num_threads,
                options.use_deterministic_compute,
                options.get_session_config_entry("session.intra_op.allow_spinning"))

    def _step_session(self, model) -> tuple:
        """The session of a step graph, and whether the provider records it (WebGPU)."""
        if self._device.ort_device_type == "webgpu":
            # (and the provider cannot record a step that crosses)
            warn_cpu_fallbacks(model, "the training step")
        if self._batch_table and webgpu.default_graph_capture():
            try:
                return make_session(model, self._device, self._session_options, True), True
            except Exception as exc:  # a node the provider left to the CPU
                warnings.warn(f"The training step runs without graph capture: {exc}",
                              RuntimeWarning)
        return make_session(model, self._device, self._session_options), False

    def _epoch_ordered(self) -> list[str]:
        """Data inputs of at most ``EPOCH_ORDERED_ROW_BYTES`` per row (labels, weights)."""
        names = []
        if self._batch_table:
            return names
        for name in self.input_names:
            shape = self.input_shapes[name]
            if shape is None or not all(isinstance(d, int) for d in shape[1:]):
                continue
            row = int(np.prod(shape[1:], dtype=np.int64)) * self.input_dtypes[name].itemsize
            if row <= EPOCH_ORDERED_ROW_BYTES:
                names.append(name)
        return names

    def _write_carried(self, weights: dict, states: dict | None = None) -> None:
        """Write ``{weight: value}`` and ``{weight: {state: value}}`` into the live buffers."""
        _, layout, buffers, *_ = self._steps[self._current]
        self._checked_copy = None  # no longer the live weights
        items = [(layout.weights[p], p, v) for p, v in weights.items()]
        items += [(layout.states[p][s], p, v) for p, d in (states or {}).items()
                  for s, v in d.items()]
        flat = {}  # flat buffer -> its host copy, written once
        for name, p, value in items:
            if p not in layout.offsets:
                buffers.write(name, value)
                continue
            if name not in flat:
                flat[name] = buffers.host_copy(name)
            offset, shape = layout.offsets[p]
            flat[name][offset:offset + math.prod(shape)] = np.ravel(value)
        for name, value in flat.items():
            buffers.live(name).update_inplace(value)

    def _large(self) -> bool:
        """Whether the model has ``LARGE_MODEL_BYTES`` of weights and runs on the CPU."""
        return (self._device.kind == "cpu"
                and self._weight_bytes >= LARGE_MODEL_BYTES)

    def _choose_loop(self, batch_rows: int) -> bool:
        if self._epoch_loop != "auto":
            return self._epoch_loop
        if self._batch_table:
            # one batch a call (on WebGPU, a Loop would run on the CPU and copy every
            # carried value to and from the GPU at each iteration)
            return False
        if self._device.kind == "cpu":
            # A Loop holds its carried weights and moments once more (the body's
            # outputs); a step over that many weights outlasts the call saved.
            return not self._large()
        return batch_rows * sum(w.size for w in self._initial.values()) >= LOOP_MIN_STEP_MACS

    def set_learning_rate(self, lr: float) -> None:
        """Learning rate of the next optimizer steps.

        Parameters
        ----------
        lr : float
            The learning rate, finite and > 0.
        """
        self._lr = check_learning_rate(lr)

    # -------------------------------------------------------------- training
    def _device_data(self, arrays) -> tuple[dict, dict]:
        """The data of :meth:`train_epoch`, checked once per set of arrays.

        Returns ``({name: OrtValue}, {name: [array, buffer, rows]})``: the
        inputs the step gathers its rows from, on the device (in place on the
        CPU, uploaded once on a GPU), and the narrow inputs reordered on the
        host at each epoch, with the buffer they are reordered into
        (allocated once: an epoch allocates nothing the size of the data) and
        its first rows, the epoch's (the same view while the length is).
        """
        arrays = list(arrays)
        if len(arrays) != len(self.input_names):
            raise ValueError(f"Expected {len(self.input_names)} arrays for the inputs "
                             f"{self.input_names}, got {len(arrays)}.")
        cached, values = self._data
        if cached is not None and len(cached) == len(arrays) and all(
                a is b for a, b in zip(cached, arrays)):
            return values
        values, reordered = {}, {}
        check_class_labels(self._label_marks, dict(zip(self.input_names, arrays)),
                           "the training data")
        epoch_ordered = self._epoch_ordered()
        for name, array in zip(self.input_names, arrays):
            array = np.asarray(array)
            if array.dtype != self.input_dtypes[name]:
                raise TypeError(f"Input {name!r} must be {self.input_dtypes[name]}, got "
                                f"{array.dtype}.")
            if name in epoch_ordered:
                buffer = np.empty(array.shape, array.dtype)
                reordered[name] = [array, buffer, buffer]
            else:
                values[name] = ort.OrtValue.ortvalue_from_numpy(
                    np.ascontiguousarray(array), self._device.ort_device_type,
                    self._device.index)
        self._data = (arrays, (values, reordered))
        return values, reordered

    def release_data(self) -> None:
        """Forget the training data put on the device by :meth:`train_epoch`.

        Call it when the arrays may change in place or to free the device
        memory (the estimators do at the end of ``fit``).
        """
        self._data = (None, None)

    def _epoch_bounds(self, batch_indices) -> tuple[np.ndarray, dict]:
        """The row order and the batch bounds of an epoch.

        Returns ``(order, bounds)``, ``bounds`` with the ``sizes``, ``starts``,
        ``ends`` (column vectors) and ``rows`` (float64) of the batches: the
        previous epoch's object when the sizes are the same, so that the
        buffers it was written to need no new copy.
        """
        if not len(batch_indices):
            raise ValueError("An epoch needs at least one batch.")
        sizes = getattr(batch_indices, "sizes", None)
        if sizes is None:
            sizes = np.array([len(b) for b in batch_indices], dtype=np.int64)
        order = getattr(batch_indices, "order", None)
        if order is None or order.dtype != np.int64:
            order = np.concatenate([np.asarray(b, dtype=np.int64) for b in batch_indices])
        bounds = self._bounds
        if bounds is not None and (bounds["sizes"] is sizes or np.array_equal(bounds["sizes"],
                                                                               sizes)):
            return order, bounds
        if (sizes < 1).any():
            raise ValueError("Every batch needs at least one row.")
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        self._bounds = {"sizes": sizes, "starts": offsets[:-1, None], "ends": offsets[1:, None],
                        "rows": sizes.astype(np.float64), "n_rows": int(offsets[-1])}
        return order, self._bounds

    def _step_scalars(self, n_batches: int, lr_for_step, dtype) -> dict:
        """The optimizer's scalars of the next ``n_batches`` steps, ``{name: dtype array}``.

        With a constant learning rate they are computed for the epochs of
        about ``SCALAR_BLOCK_STEPS`` steps at once and sliced.
        """
        first = self.n_steps + 1
        if lr_for_step is not None:
            rates = check_learning_rates([lr_for_step(step)
                                          for step in range(first, first + n_batches)])
            self._lr = float(rates[-1])
            return self._host_scalars(rates, first, dtype)
        block = self._scalar_block
        if (block is None or block["key"] != (self._lr, dtype) or first < block["first"]
                or first + n_batches > block["end"]):
            count = n_batches * max(1, SCALAR_BLOCK_STEPS // n_batches)
            block = self._scalar_block = {
                "key": (self._lr, dtype), "first": first, "end": first + count,
                "values": self._host_scalars([self._lr] * count, first, dtype)}
        offset = first - block["first"]
        return {name: value[offset:offset + n_batches]
                for name, value in block["values"].items()}

    def _host_scalars(self, rates, first: int, dtype) -> dict:
        # The learning rate goes through float32, as the optimizer model's
        # learning_rate input does, so fused and unfused training agree; an
        # optimizer that reproduces a float64 reference (PlainSGD) keeps it exact.
        lrs = np.array(rates, dtype=np.float64)
        if not getattr(self.optimizer, "exact_learning_rate", False):
            lrs = lrs.astype(np.float32).astype(np.float64)
        steps = np.arange(first, first + len(lrs))
        return {name: np.ascontiguousarray(value, dtype)
                for name, value in self.optimizer.host_scalars(lrs, steps).items()}

    def train_epoch(self, arrays, batch_indices, lr_for_step=None) -> float:
        """One pass over the mini-batches.

        Parameters
        ----------
        arrays : list of numpy.ndarray
            The data, aligned with :attr:`input_names`, each of the input's
            dtype, rows on the first axis. Put on the device at the first
            call and reused while the same array objects are passed (see
            :meth:`release_data`).
        batch_indices : list of numpy.ndarray
            Row indices of each batch, in the order they are learned (see
            :class:`~ortlearn.training.Batches`).
        lr_for_step : callable, default=None
            ``lr_for_step(step) -> float`` with the 1-based global number of
            each update (``n_steps + 1``, ...), all called before the epoch
            runs: a per-step schedule. None keeps the current learning rate.

        Returns
        -------
        float
            The mean of the batch losses weighted by the batch sizes.

        Raises
        ------
        ConvergenceError
            If the epoch's loss or the weights are not finite. The weights of
            the end of the previous epoch are restored and the optimizer
            state is reset.
        """
        if not self._loss_is_scalar:
            self._check_one_loss_value(arrays, batch_indices)
        data, reordered = self._device_data(arrays)
        order, bounds = self._epoch_bounds(batch_indices)
        n_rows, n_batches = bounds["n_rows"], len(bounds["sizes"])
        loop = self._choose_loop(n_rows // n_batches)
        if loop != self._current:
            self._open(loop)
        session, layout, buffers, feeds, scatter = self._steps[loop]
        n_data = len(arrays[0])
        if order.min() < 0 or order.max() >= n_data:
            raise ValueError(f"Row indices must be in [0, {n_data}), got {order.min()} to "
                             f"{order.max()}.")
        self._hold_finite(layout, buffers, one_run=feeds is None and (loop or n_batches == 1))
        if feeds is not None:
            feeds.bind_data({**{layout.data[name]: value for name, value in data.items()},
                             **self._hyper})
            buffers.reset_counters()
            step_values = {layout.scalars[name]: value for name, value in self._step_scalars(
                n_batches, lr_for_step, layout.scalar_dtype).items()}
            step_values[ROWS] = bounds["rows"]
            with memory_errors("a training epoch", _MEMORY_REMEDY):
                feeds.run_epoch(order, bounds["starts"][:, 0], bounds["sizes"], step_values)
            self.n_steps += n_batches
            return self._epoch_end(float(buffers.host(layout.loss_sum)) / n_rows)
        buffers.bind_inputs({layout.data[name]: value for name, value in data.items()})
        epoch_data = {layout.epoch_inputs[0]: order}
        for name, entry in reordered.items():
            array, buffer, rows = entry
            if len(rows) != len(order):  # another length: a subset, repeated rows
                if len(buffer) < len(order):
                    buffer = np.empty((len(order),) + array.shape[1:], array.dtype)
                entry[1:] = buffer, buffer[:len(order)]
                rows = entry[2]
            # mode='clip' (the bounds are checked): take with mode='raise' copies through
            # a temporary the size of the output.
            np.take(array, order, axis=0, out=rows, mode="clip")
            epoch_data[layout.data[name]] = rows
        # the row order and the reordered rows are read in place on the CPU
        buffers.bind_epoch_data(epoch_data)
        epoch_values = {layout.scalars[name]: value for name, value in self._step_scalars(
            n_batches, lr_for_step, layout.scalar_dtype).items()}
        if buffers.bounds is not bounds:
            epoch_values.update(zip(layout.epoch_inputs[1:4], (bounds[k] for k in (
                "starts", "ends", "rows"))))
            buffers.bounds = bounds
        buffers.write_epoch_values(epoch_values)
        buffers.reset_counters()
        # The pybind session object: the public wrapper adds checks per call.
        run = session._sess.run_with_iobinding
        bindings = [b._iobinding for b in buffers.bindings]
        with memory_errors("a training epoch", _MEMORY_REMEDY):
            if loop:
                run(bindings[buffers.parity], None)
                buffers.swap()
                self.n_steps += n_batches
            else:
                for _ in range(n_batches):
                    parity = buffers.parity
                    run(bindings[parity], None)
                    buffers.swap()
                    if scatter is not None:
                        scatter.run(bindings[parity], buffers.parity)
                    self.n_steps += 1
        return self._epoch_end(float(buffers.host(layout.loss_sum)) / n_rows)

    def _epoch_end(self, loss: float) -> float:
        """``loss``, once it and the weights are checked finite (else :meth:`_diverged`)."""
        _, layout, buffers, *_ = self._steps[self._current]
        live = {c: buffers.host(c) for c in set(layout.weights.values())}
        if not (np.isfinite(loss) and all(np.isfinite(v).all() for v in live.values())):
            self._diverged(loss, (layout, live))
        # Off the CPU, what was read is a copy (no view of onnxruntime's buffer): the next
        # epoch's restore point, read again only if something writes the weights first
        # (each read waits for the GPU).
        copies = self._device.kind != "cpu" and all(v.base is None for v in live.values())
        self._checked_copy = (layout, live) if copies else None
        return loss

    def _hold_finite(self, layout, buffers, one_run: bool) -> None:
        """Keep what a divergence of the coming epoch restores: the live weights, finite (the
        last epoch's, checked, or those :meth:`set_state` wrote). One run reads them from
        buffers it does not write, the spare halves once it has run: nothing to copy (a
        large model's weights are not held three times). Several runs, or one buffer
        written in place, would write over them: copy them, into the arrays of the previous
        copy when the layout is the same."""
        carried = set(layout.weights.values())
        if one_run and not any(buffers.in_place(c) for c in carried):
            self._last_finite = layout, None
            return
        checked = getattr(self, "_checked_copy", None)
        if checked is not None and checked[0] is layout:
            self._last_finite = checked
            return
        kept = getattr(self, "_last_finite", None)
        if kept is not None and kept[0] is layout and kept[1] is not None:
            for name in carried:
                np.copyto(kept[1][name], buffers.host(name))
            return
        self._last_finite = layout, {c: buffers.host_copy(c) for c in carried}

    def _diverged(self, loss: float, reached: tuple) -> None:
        # Name what is not finite (the data were checked finite before training, so
        # the steps themselves overflowed): the loss, and which weights.
        layout_now, copies_now = reached
        bad = sorted(name for name, value in weight_values(layout_now, None, copies_now).items()
                     if not np.isfinite(value).all())
        what = (f"the epoch loss is {loss}" if not np.isfinite(loss)
                else f"the epoch loss is finite ({loss:.6g})")
        what += (f" and weight(s) {bad} hold NaN or infinity" if bad
                 else " and every weight is finite")
        layout, copies = self._last_finite
        if copies is None:  # the epoch's one run left them in the halves it read
            buffers = self._steps[self._current].buffers
            copies = {c: buffers.host(c, spare=True) for c in set(layout.weights.values())}
        # The optimizer state is as corrupted as the weights: start it again.
        self.set_state(weight_values(layout, None, copies))
        self._reset_optimizer()
        raise ConvergenceError(
            f"Training diverged: {what} after an epoch at learning rate {self._lr:.6g}. "
            "The weights of the last finite epoch were restored; lower the learning rate "
            "or scale the data.")

    def _reset_optimizer(self) -> None:
        _, layout, buffers, *_ = self._steps[self._current]
        for name in {name for d in layout.states.values() for name in d.values()}:
            value = buffers.live(name)
            value.update_inplace(np.zeros(value.shape(), value.numpy().dtype))
        self.n_steps = 0

    def _check_one_loss_value(self, arrays, batch_indices) -> None:
        """ValueError unless the loss of two rows is one value (the seed of the gradient would
        otherwise train the sum of a per-row loss)."""
        rows = np.concatenate([np.asarray(b) for b in batch_indices])[:2]
        value = self._loss_value([np.asarray(a)[rows] for a in arrays])
        if value.size != 1:
            raise ValueError(
                f"The loss {self.loss_output!r} has {value.size} values for {len(rows)} rows "
                f"(shape {value.shape}): it must be a scalar. Reduce it first (a ReduceMean "
                "node, or ortlearn.add_loss_output), or name a scalar output as the loss.")
        self._loss_is_scalar = True

    def eval_loss(self, arrays) -> float:
        """The loss on ``arrays`` (aligned with :attr:`input_names`) with the current weights.

        Returns
        -------
        float
        """
        return float(self._loss_value(arrays).ravel()[0])

    def _loss_value(self, arrays) -> np.ndarray:
        """The loss output, as the graph computes it, on ``arrays``."""
        arrays = list(arrays)
        if len(arrays) != len(self.input_names):
            raise ValueError(f"Expected {len(self.input_names)} arrays for the inputs "
                             f"{self.input_names}, got {len(arrays)}.")
        check_class_labels(self._label_marks, dict(zip(self.input_names, arrays)),
                           "the evaluated data")
        if self._eval_session is None:
            self._eval_session = make_session(
                eval_graph(self._model, self.trainable, self.loss_output), self._device,
                self._session_options)
        session = self._eval_session
        binding = session.io_binding()
        _, layout, buffers, *_ = self._steps[self._current]
        views = weight_values(layout, buffers, only=layout.offsets)
        read = {i.name for i in session.get_inputs()}  # a loss may not read every input
        for name, carried in layout.weights.items():
            if name not in read:
                continue
            if name in views:  # a view of the flat weights
                binding.bind_cpu_input(name, np.ascontiguousarray(views[name]))
            else:
                binding.bind_ortvalue_input(name, buffers.live(carried))
        for name, array in zip(self.input_names, arrays):
            if name in read:
                binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name, value in self._hyper.items():
            if name in read:
                binding.bind_ortvalue_input(name, value)
        binding.bind_output(self.loss_output, "cpu")
        session.run_with_iobinding(binding)
        return np.asarray(binding.copy_outputs_to_cpu()[0])

    # ----------------------------------------------------------------- state
    def get_state(self) -> dict:
        """Host copies of the weights, ``{name: numpy.ndarray}`` in trainable order."""
        _, layout, buffers, *_ = self._steps[self._current]
        values = weight_values(layout, buffers)
        return {n: np.array(values[n], copy=True) for n in self.trainable}

    def set_state(self, state: dict) -> None:
        """Overwrite every weight on the device.

        Parameters
        ----------
        state : dict of str to array-like
            One value per weight of :meth:`get_state`, of the same shape
            (cast to the weight's dtype).

        Raises
        ------
        ValueError
            Listing unknown or missing names and wrong shapes.
        """
        self._write_carried(conform_state(state, self._initial))

    def optimizer_state(self) -> dict:
        """Host copy of the optimizer state.

        Returns
        -------
        dict
            ``{"states": {param: {state_name: ndarray}}, "step": int,
            "learning_rate": float}``.
        """
        _, layout, buffers, *_ = self._steps[self._current]
        states = {p: {s: np.array(v, copy=True) for s, v in d.items()}
                  for p, d in state_values(layout, buffers).items()}
        return {"states": states, "step": self.n_steps, "learning_rate": float(self._lr)}

    def take_state(self) -> tuple[dict, dict]:
        """:meth:`get_state` and :meth:`optimizer_state`, then the engine closed.

        On the CPU the values are views of the live buffers, not copies: the
        sessions and the other buffers are released instead, so that the end
        of a fit adds no copy of the weights and moments to its peak memory.
        The engine cannot train or evaluate afterwards.

        Returns
        -------
        tuple of dict
            ``(weights, optimizer_state)``, as :meth:`get_state` and
            :meth:`optimizer_state` return them.
        """
        _, layout, buffers, *_ = self._steps[self._current]
        copies = {}
        if buffers.shared:
            # The live halves themselves: nothing else refers to them once closed.
            carried = set(layout.weights.values())
            carried |= {c for d in layout.states.values() for c in d.values()}
            copies = {c: buffers.host(c) for c in carried}
        values = weight_values(layout, buffers, copies)
        weights = {n: values[n] for n in self.trainable}
        states = {p: {s: layout_part(layout, copies, buffers, c, p) for s, c in d.items()}
                  for p, d in layout.states.items()}
        state = {"states": states, "step": self.n_steps, "learning_rate": float(self._lr)}
        self._steps.clear()
        self._eval_session = self._last_finite = self._checked_copy = None
        self._data = (None, None)
        return weights, state

    def load_optimizer_state(self, state: dict) -> None:
        """Continue from an :meth:`optimizer_state` (warm start, checkpoint resume).

        The next steps are those the original training would have made.

        Parameters
        ----------
        state : dict
            As returned by :meth:`optimizer_state`.

        Raises
        ------
        ValueError
            If the state does not match the optimizer (missing tensors).
        """
        try:
            states, step, lr = state["states"], int(state["step"]), float(state["learning_rate"])
        except (KeyError, TypeError) as exc:
            raise ValueError("An optimizer state is a dict with keys 'states', 'step' and "
                             f"'learning_rate', got {state!r}.") from exc
        values = {}
        for p in self.trainable:
            values[p] = {}
            for s in self.optimizer.state_names:
                value = states.get(p, {}).get(s) if isinstance(states, dict) else None
                if value is None:
                    raise ValueError(f"The optimizer state lacks {p}.{s}.")
                values[p][s] = conform_state({p: value}, {p: self._initial[p]})[p]
        self._write_carried({}, values)
        self._lr = check_learning_rate(lr)
        self.n_steps = step

    def checkpoint_state(self) -> CheckpointState:
        """A :class:`~ortlearn.CheckpointState` of the current weights and optimizer state.

        ``CheckpointState.save_checkpoint(engine.checkpoint_state(), path,
        include_optimizer_state=True)`` saves them.
        """
        state = CheckpointState.from_parameters(self.get_state())
        opt = self.optimizer_state()
        state.set_optimizer_state(opt["states"], opt["step"], opt["learning_rate"])
        return state


#: What a step that ran out of memory can do without: a step holds one batch's intermediates.
_MEMORY_REMEDY = ("train on smaller batches (batch_size), in float32, or with a wide sparse X "
                  "as a scipy.sparse matrix (its rows are read sparse).")


class _Step(NamedTuple):
    """The session of a step (or epoch) graph, its layout and its carried buffers."""

    session: ort.InferenceSession
    layout: FusedLayout
    buffers: StepBuffers
    feeds: StepFeeds | None = None
    #: the second run of a step whose updates are scattered (``layout.scatters``)
    scatter: ScatterRun | None = None


