"""``TrainingSession``: the onnxruntime-training C++ ``TrainingSession`` on plain onnxruntime.

The session runs the three artifacts described in ``doc/artifacts_format.md``
(training, eval and optimizer models) in ordinary ``onnxruntime.InferenceSession``
objects. Parameters, gradient accumulation buffers and optimizer state live on
the device as ``onnxruntime.OrtValue`` objects and are bound through
``IOBinding``:

* every value a step writes (gradients, updated parameters, updated optimizer
  state) goes to the spare half of a *ping-pong* pair of preallocated
  OrtValues, and the pair is swapped after the call: no allocation and no copy
  of them per step, never a host round trip of the weights;
* one ``IOBinding`` is built per (model, parity) combination the first time it
  is needed and reused afterwards, so a step only binds the user inputs and
  outputs;
* the learning rate, the optimizer step counter and the ``lazy_reset_grad``
  flag are scalar OrtValues updated in place (``update_inplace``).

The session binds its :class:`~ortlearn.training.CheckpointState`: reading
``state.parameters[name].data`` copies the live value to the host, writing it
updates the device value, and saving the state writes the trained values and
the optimizer state.
"""

from __future__ import annotations

import functools
import math
import numbers
import os

import numpy as np
import onnx
import onnxruntime as ort

from ..exceptions import NominalCheckpointError
from ..fileio import save_model
from ..graph import (
    class_label_marks,
    guard_class_labels,
    invalid_model_errors,
    prune_model,
    shape_matches,
)
from ..graph.format import (
    DEFAULT_LEARNING_RATE,
    GRAD_BUFFER_SUFFIX,
    GRAD_OUTPUT_SUFFIX,
    GRADIENT_SUFFIX,
    LAZY_RESET_GRAD,
    LEARNING_RATE,
    STEP,
    UPDATED_SUFFIX,
)
from ..optim import LinearLR, unpack_optimizer_model
from . import webgpu
from ._buffers import BufferPairs, device_value, graph_run_options, host_copy, run_recorded
from .checkpoint import CheckpointState
from .checks import FLOAT32_MAX as _FLOAT32_MAX
from .checks import check_class_labels, run_errors
from .device import make_session, make_session_options, parse_device
from .layout import (
    Layout,
    OptimizerLayout,
    as_model,
    input_types,
    is_ort_format,
    is_string_array,
    linked_dims,
    ort_elem_type,
    read_layout,
    read_optimizer_layout,
    skeleton,
)
from .placement import for_webgpu
from .step_scalars import StepScalars

__all__ = ["TrainingSession"]

#: The last optimizer step an int64 step input counts (a checkpoint's step is at most this).
_LAST_STEP = 2**63 - 1


def _open_only(method):
    """Refuse ``method`` once the session is closed, with an error saying so.

    A closed session has given its values back to the CheckpointState and
    released its onnxruntime sessions: a step would train nothing the state
    sees (or fail on a released buffer), so it raises instead.
    """
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self._closed:
            raise RuntimeError(
                f"TrainingSession.{method.__name__} was called after close(): the session "
                "gave its parameters back to its CheckpointState and released its "
                "onnxruntime sessions. Create a new TrainingSession (or api.Module) on the "
                "state to go on training.")
        return method(self, *args, **kwargs)
    return wrapper


class TrainingSession:
    """Train an ONNX model from ortlearn training artifacts, on the CPU or a GPU.

    The Python counterpart of onnxruntime-training's C++ ``Ort::TrainingSession``,
    running on the ordinary ``onnxruntime`` package.

    Parameters
    ----------
    state : CheckpointState
        Parameters (and optionally optimizer state) to start or resume from. The
        session binds it: its parameters then read and write the live values.
    train_model : str, path-like, bytes or onnx.ModelProto
        The training model (``training_model.onnx``).
    eval_model : str, path-like, bytes or onnx.ModelProto, optional
        The eval model (``eval_model.onnx``); needed by :meth:`eval_step` and
        :meth:`export_model_for_inferencing`.
    optimizer_model : str, path-like, bytes or onnx.ModelProto, optional
        The optimizer model (``optimizer_model.onnx``); needed by
        :meth:`optimizer_step`. It can be attached later with
        :meth:`attach_optimizer`. Each of the three models may also be in
        onnxruntime's ORT format (``generate_artifacts(ort_format=True)``
        writes ``training_model.ort``, ...), given as a path or bytes.
    device : str, default='cpu'
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'``.
    session_options : onnxruntime.SessionOptions, optional
        Options of the sessions running the three models (register a custom
        operator library in them). One default set
        (:func:`ortlearn.training.device.make_session_options`) otherwise.

    Raises
    ------
    TypeError
        If ``state`` is not a CheckpointState.
    ValueError
        For an unknown device, a device onnxruntime cannot use, or a checkpoint
        whose parameters do not match the models (every mismatch is listed).
    RuntimeError
        If ``state`` is bound to another live session (release it with that
        session's :meth:`close`): two sessions would train diverging copies.

    Notes
    -----
    Besides the methods of the C++ API, the session offers
    :meth:`attach_optimizer` (what ``api.Optimizer`` uses), :meth:`close`
    (unbind the state; every method raises ``RuntimeError`` afterwards),
    :meth:`parameters_size`, and the methods a bound
    CheckpointState calls: :meth:`get_parameter`, :meth:`set_parameter`,
    :meth:`get_gradient`, :meth:`export_optimizer_state`.

    Examples
    --------
    >>> from ortlearn import CheckpointState, TrainingSession
    >>> state = CheckpointState.load_checkpoint("artifacts/checkpoint")  # doctest: +SKIP
    >>> session = TrainingSession(state, "artifacts/training_model.onnx",
    ...                           "artifacts/eval_model.onnx",
    ...                           "artifacts/optimizer_model.onnx")  # doctest: +SKIP
    >>> for X, y in batches:  # doctest: +SKIP
    ...     loss = session.train_step(X, y)[0]
    ...     session.optimizer_step()
    ...     session.lazy_reset_grad()
    """

    def __init__(self, state, train_model, eval_model=None, optimizer_model=None,
                 device="cpu", session_options=None):
        if not isinstance(state, CheckpointState):
            raise TypeError(f"state must be a CheckpointState, got {type(state).__name__}.")
        self._closed = False
        self._device = parse_device(device)
        self._session_options = session_options or make_session_options()
        self._state = state
        self._train_model, train_sess = self._load(train_model, "training")
        self._train_layout = read_layout(self._train_model, "training")
        self._train_types = input_types(self._train_model)
        self._train_links = linked_dims(self._train_model, self._train_layout.user_inputs)
        # Inputs holding class indices of a cross-entropy loss, checked at each step.
        self._label_marks = class_label_marks(self._train_model)
        self._eval_model, eval_sess = (None, None) if eval_model is None else self._load(
            eval_model, "eval")
        # an ORT-format eval model has no graph to export an inference model from
        self._eval_is_ort = eval_sess is not None
        if self._eval_model is not None:
            self._eval_layout = read_layout(self._eval_model, "eval")
            self._eval_types = input_types(self._eval_model)
            self._eval_links = linked_dims(self._eval_model, self._eval_layout.user_inputs)
            self._label_marks = {**self._label_marks, **class_label_marks(self._eval_model)}
        self._check_state()
        if self._device.kind == "webgpu":
            types = {**self._train_types, **(self._eval_types if eval_model is not None else {})}
            webgpu.check_float32(
                {name: dtype for name, (dtype, _) in types.items()},
                "Build the artifacts from a float32 model (in torch, model.float() before the "
                "export) and train from its float32 checkpoint.")
        # Refused before the sessions are built (state._bind checks again at the end).
        state._require_unbound()

        # Labels fed as OrtValues are not read back to the host: the graphs check them.
        self._train_sess = train_sess or self._open(guard_class_labels(self._train_model),
                                                    "training model")
        self._eval_sess = None if self._eval_model is None else (
            eval_sess or self._open(guard_class_labels(self._eval_model), "eval model"))
        self._input_grads: dict = {}
        self._bindings: dict = {}
        self._init_parameters()
        self._init_gradients()

        self._optimizer = None
        self._lr_scheduler = None
        if optimizer_model is not None:
            self.attach_optimizer(optimizer_model)
        state._bind(self)

    # ------------------------------------------------------------------ setup
    def _open(self, model: onnx.ModelProto, what: str,
              graph_capture: bool = False) -> ort.InferenceSession:
        if self._device.kind == "webgpu":  # the operators WebGPU lacks, in ones it has
            model = for_webgpu(model, f"the {what}")
        # A damaged model is a ValueError, not an onnxruntime error; so is one onnx's
        # checker accepts and onnxruntime cannot load (an opset it does not know).
        with invalid_model_errors(model, "A model given to TrainingSession"):
            try:
                return make_session(model, self._device, self._session_options,
                                    graph_capture)
            except (ValueError, TypeError, MemoryError):
                raise
            except Exception as exc:
                raise ValueError(f"onnxruntime cannot load a model given to TrainingSession: "
                                 f"{str(exc).strip().splitlines()[0]}") from exc

    def _load(self, model, what: str) -> tuple:
        """``(ModelProto, None)``, or for an ORT-format model ``(its skeleton, its session)``."""
        if model is not None and is_ort_format(model):
            source = os.fspath(model) if isinstance(model, os.PathLike) else model
            try:
                session = make_session(source, self._device, self._session_options)
            except Exception as exc:
                raise ValueError(f"onnxruntime cannot load the ORT-format {what} model: "
                                 f"{exc}") from exc
            return skeleton(session), session
        return as_model(model, what), None

    def _ortvalue(self, array: np.ndarray) -> ort.OrtValue:
        """A new OrtValue on the session's device holding a copy of ``array``."""
        return device_value(array, self._device)

    def _zeros(self, name: str) -> np.ndarray:
        dtype, shape = self._param_types[name]
        return np.zeros(shape, dtype=dtype)

    def _check_state(self) -> None:
        """Compare the checkpoint's parameters with the models' parameter inputs."""
        layout = self._train_layout
        expected = {n: self._train_types[n] for n in layout.trainable + layout.frozen}
        if self._eval_model is not None:
            for name in self._eval_layout.trainable + self._eval_layout.frozen:
                expected.setdefault(name, self._eval_types[name])
        self._state.check_matches(expected, trainable=layout.trainable)
        params = self._state.parameters
        self._param_types = {n: (params[n].dtype, tuple(params[n].shape)) for n in expected}
        # a checkpoint saved from a diverged run: training would resume from NaN
        broken = [n for n in layout.trainable if not params[n].nominal
                  and np.issubdtype(params[n].dtype, np.floating)
                  and not np.isfinite(params[n].data).all()]
        if broken:
            raise ValueError(
                f"The trained parameters {broken} hold NaN or infinite values (a checkpoint "
                "saved from a run that diverged?): training would go on from them. Load a "
                "checkpoint saved before the divergence, or set finite values "
                "(state.parameters[name].data = ...).")

    def _init_parameters(self) -> None:
        params = self._state.parameters
        # A nominal parameter has no value yet: zeros hold its place, and every
        # step refuses to run (_require_values) until the values are loaded.
        values = {name: self._zeros(name) if params[name].nominal else params[name].data
                  for name in self._param_types}
        self._nominal = self._state.is_nominal
        trainable = self._train_layout.trainable
        # An optimizer step reads the live parameters and writes the spare ones.
        self._params = BufferPairs({n: v for n, v in values.items() if n in trainable},
                                   self._device)
        # Training state (running statistics): a training step reads the live
        # half and writes the spare one, as an optimizer step does the parameters.
        updated = self._train_layout.updated
        self._state_pairs = BufferPairs({n: values[n] for n in updated}, self._device)
        self._frozen = {n: self._ortvalue(v) for n, v in values.items()
                        if n not in trainable and n not in updated}
        # Read before binding: once bound, the state asks the session for it.
        step = self._state.optimizer_step
        self._saved_optimizer = None if step is None else (
            self._state.optimizer_state, step, self._state.optimizer_learning_rate)

    def _init_gradients(self) -> None:
        # A training step reads the accumulated gradients and writes the spare ones.
        self._grads = BufferPairs({n: self._zeros(n) for n in self._train_layout.trainable},
                                  self._device)
        # A new session starts with a reset, as onnxruntime-training's does.
        self._reset_pending = True
        self._reset_value = self._ortvalue(np.array(True))
        self._reset_bound = True

    @_open_only
    def attach_optimizer(self, optimizer_model) -> None:
        """Load the optimizer model into this session (what ``api.Optimizer`` does).

        The optimizer state (step, learning rate, moments) is taken from the
        checkpoint when it holds one, otherwise it starts at zero with the
        learning rate of the optimizer's hyper-parameters (``lr``), or 1e-3.
        A model in onnxruntime-training's layout (tensor sequences, what
        ``generate_artifacts`` writes) runs unpacked to its tensors
        (:func:`ortlearn.optim.unpack_optimizer_model`): the same update, on
        the parameters bound in place.

        Parameters
        ----------
        optimizer_model : str, path-like, bytes or onnx.ModelProto
            The optimizer model (``optimizer_model.onnx``).

        Raises
        ------
        ValueError
            If the optimizer model does not update exactly the trainable
            parameters of the training model.

        Notes
        -----
        A second optimizer model replaces the first and goes on from the
        optimizer state reached (step, learning rate, moments), as a second
        ``onnxruntime.training.api.Optimizer`` on one module shares the
        state's optimizer state; both ``api.Optimizer`` objects then step
        with the last model attached.
        """
        model, session = self._load(optimizer_model, "optimizer")
        if session is not None:
            raise ValueError(
                "An ORT-format optimizer model cannot be attached: its update passes tensor "
                "sequences, which the session runs unpacked to tensors bound in place, and an "
                "ORT-format file has no ONNX graph to unpack. Pass optimizer_model.onnx (the "
                "same update; the training and eval models may stay in the ORT format).")
        layout = read_optimizer_layout(model)
        if self._optimizer is not None:  # the state reached goes on with the new model
            self._saved_optimizer = self.export_optimizer_state()
            self._bindings = {k: b for k, b in self._bindings.items() if k[0] != "optim"}
        trainable = self._train_layout.trainable
        if sorted(layout.params) != sorted(trainable):
            raise ValueError(
                "The optimizer model does not update the trainable parameters of the training "
                f"model: optimizer parameters {layout.params}, trainable parameters {trainable}."
            )
        # The file passes tensor sequences (onnxruntime-training's layout); the session
        # runs the same update on the tensors, each bound in place on the device.
        model = unpack_optimizer_model(model)
        inputs = {i.name: i for i in model.graph.input}
        wanted = [LEARNING_RATE, STEP] + [
            f"{p}{suffix}" for p in trainable
            for suffix in ["", GRADIENT_SUFFIX] + [f".{s}" for s in layout.states]]
        missing = [n for n in wanted if n not in inputs]
        if missing:
            raise ValueError(f"The optimizer model lacks the inputs {missing}.")
        saved = self._saved_optimizer_state(layout)
        # Read and written with the parameters: they share the parameters' parity.
        self._opt_states = BufferPairs(
            {(p, s): saved[0][p][s] if saved else self._zeros(p)
             for p in trainable for s in layout.states}, self._device)
        self._step = saved[1] if saved else 0
        lr = saved[2] if saved else layout.hyper.get("lr", DEFAULT_LEARNING_RATE)
        self._lr = float(lr)
        self._optimizer_layout = layout
        # learning_rate and step, or on a GPU the scalars the host derives from them
        self._step_scalars = StepScalars(model, self._device)
        # On WebGPU the update, whose inputs and outputs are all fixed device buffers, is
        # recorded at its first run with each binding and replayed afterwards (graph
        # capture); the training and eval models read new inputs from the host each call.
        capture = self._device.kind == "webgpu" and webgpu.default_graph_capture()
        self._optimizer = self._open(self._step_scalars.model, "optimizer model", capture)
        self._optimizer_graphs = {} if capture else None  # binding key -> its run options
        self._optimizer_options = None  # of an unrecorded run

    def _saved_optimizer_state(self, layout: OptimizerLayout) -> tuple | None:
        """The checkpoint's ``(states, step, learning_rate)``, checked against the model."""
        if self._saved_optimizer is None:
            return None
        states = self._saved_optimizer[0]
        problems = []
        for p in layout.params:
            for s in layout.states:
                value = states.get(p, {}).get(s)
                if value is None:
                    problems.append(f"it lacks {p}.{s}")
                elif (value.dtype, value.shape) != self._param_types[p]:
                    problems.append(f"{p}.{s} is {value.dtype} {value.shape}, "
                                    f"the parameter {self._param_types[p][0]} "
                                    f"{self._param_types[p][1]}")
        if problems:
            raise ValueError("The checkpoint's optimizer state does not match the optimizer "
                             f"model: {'; '.join(problems)}.")
        return self._saved_optimizer

    # ---------------------------------------------------------------- binding
    def _binding(self, model: str) -> ort.IOBinding:
        """The IOBinding of ``model`` ('train', 'eval' or 'optim') for the live buffers.

        Built once per combination of the parities of the parameters and the
        gradients, and reused whenever the buffers are in that state again.
        """
        key = self._binding_key(model)
        binding = self._bindings.get(key)
        if binding is None:
            build = {"train": self._bind_train, "eval": self._bind_eval,
                     "optim": self._bind_optimizer}[model]
            binding = self._bindings[key] = build()
        return binding

    def _binding_key(self, model: str) -> tuple:
        return model, self._params.parity, self._grads.parity, self._state_pairs.parity

    def _bind_outputs(self, binding, names) -> None:
        # Rebound per call (in place): a bound output keeps the value of the
        # previous run, which onnxruntime would reuse and refuse for another
        # batch size.
        for name in names:
            binding.bind_output(name, self._device.ort_device_type, self._device.index)

    def _train_io(self) -> tuple[dict, dict]:
        """The training model's inputs and outputs besides the user's: ``{name: OrtValue}``.

        Inputs are the live halves, outputs the spare halves they are written to.
        """
        layout = self._train_layout
        inputs = {name: self._live(name) for name in layout.trainable + layout.frozen}
        for name in layout.trainable:
            inputs[f"{name}{GRAD_BUFFER_SUFFIX}"] = self._grads.live(name)
        inputs[LAZY_RESET_GRAD] = self._reset_value
        outputs = {f"{name}{GRAD_OUTPUT_SUFFIX}": self._grads.spare(name)
                   for name in layout.trainable}
        for name in layout.updated:
            outputs[f"{name}{UPDATED_SUFFIX}"] = self._state_pairs.spare(name)
        return inputs, outputs

    def _eval_io(self) -> tuple[dict, dict]:
        layout = self._eval_layout
        return {name: self._live(name) for name in layout.trainable + layout.frozen}, {}

    def _bind_io(self, sess, io, user_outputs) -> ort.IOBinding:
        inputs, outputs = io
        binding = sess.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        # User outputs first: get_outputs() follows the binding order.
        self._bind_outputs(binding, user_outputs)
        for name, value in outputs.items():
            binding.bind_ortvalue_output(name, value)
        return binding

    def _bind_train(self) -> ort.IOBinding:
        # The inputs' gradients right after the user outputs (get_outputs() order).
        return self._bind_io(self._train_sess, self._train_io(),
                             self._train_layout.user_outputs + self._input_grad_outputs())

    def _bind_eval(self) -> ort.IOBinding:
        return self._bind_io(self._eval_sess, self._eval_io(), [])

    def _bind_optimizer(self) -> ort.IOBinding:
        binding = self._optimizer.io_binding()
        self._step_scalars.bind(binding)
        params, states = self._params, self._opt_states
        for p in self._optimizer_layout.params:
            binding.bind_ortvalue_input(p, params.live(p))
            binding.bind_ortvalue_input(f"{p}{GRADIENT_SUFFIX}", self._grads.live(p))
            binding.bind_ortvalue_output(f"{p}{UPDATED_SUFFIX}", params.spare(p))
            for s in self._optimizer_layout.states:
                binding.bind_ortvalue_input(f"{p}.{s}", states.live((p, s)))
                binding.bind_ortvalue_output(f"{p}.{s}{UPDATED_SUFFIX}", states.spare((p, s)))
        return binding

    @staticmethod
    def _user_feeds(inputs, layout: Layout, types: dict, what: str, links=()) -> dict:
        """The user inputs checked against the model: ``{name: ndarray or OrtValue}``.

        Checked here rather than by onnxruntime, whose errors name a node and
        not the inputs: the number of inputs, their declared shapes (inputs
        sharing a symbol, the batch ``N``, agree), the dimensions ``links``
        (from :func:`linked_dims`) ties, and their dtypes, OrtValues included.
        """
        names = layout.user_inputs
        if len(inputs) != len(names):
            raise ValueError(f"{what} expects {len(names)} input(s) {names}, "
                             f"got {len(inputs)}.")
        symbols = {}  # a symbolic dimension (the batch 'N') has one size per call
        feeds = {}
        for name, value in zip(names, inputs):
            dtype, declared = types[name]
            shape = value.shape() if isinstance(value, ort.OrtValue) else np.shape(value)
            if not shape_matches(declared, shape, symbols):
                raise ValueError(f"Input {name!r} of {what} has shape {tuple(shape)}; the model "
                                 f"declares {declared} (symbols: {symbols}).")
            if not isinstance(value, (np.ndarray, ort.OrtValue)):
                value = np.asarray(value, dtype=dtype)
            elif isinstance(value, np.ndarray) and dtype.kind == "O":
                # a string input: numpy str, bytes or object arrays, as onnxruntime reads them
                if not is_string_array(value):
                    raise TypeError(f"Input {name!r} of {what} is a string tensor, got an "
                                    f"array of {value.dtype}.")
            elif isinstance(value, np.ndarray) and value.dtype != dtype:
                raise TypeError(f"Input {name!r} of {what} must be {dtype}, got {value.dtype}.")
            elif isinstance(value, ort.OrtValue) and dtype.kind != "O":
                elem = ort_elem_type(value.data_type())
                if elem != onnx.helper.np_dtype_to_tensor_dtype(dtype):
                    raise TypeError(
                        f"Input {name!r} of {what} must be an OrtValue of {dtype}, got "
                        f"{value.data_type()}; make it from an array of {dtype}.")
            feeds[name] = value
        shapes = {name: tuple(v.shape() if isinstance(v, ort.OrtValue) else np.shape(v))
                  for name, v in feeds.items()}
        for group in links:
            # broadcasting lets a size of 1 meet any other, as onnxruntime does
            sizes = {shapes[name][axis] for name, axis in group} - {1}
            if len(sizes) > 1:
                named = ", ".join(f"{name!r} {shapes[name]} (axis {axis})"
                                  for name, axis in group)
                raise ValueError(
                    f"The inputs of {what} disagree on a dimension the model combines: "
                    f"{named}. Give them the same size (the same number of rows "
                    "for a batch).")
        return feeds

    @staticmethod
    def _bind_user_inputs(binding, feeds: dict) -> None:
        for name, value in feeds.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))

    @staticmethod
    def _fetch(binding, n_outputs: int, return_ortvalues: bool) -> list:
        outputs = binding.get_outputs()[:n_outputs]
        return list(outputs) if return_ortvalues else [o.numpy() for o in outputs]

    def _run_unbound(self, sess, io, feeds: dict, user_outputs: list,
                     return_ortvalues: bool) -> list:
        """One run through ``InferenceSession.run``: for string inputs, which IOBinding
        and OrtValue cannot hold (onnxruntime refuses them). The other outputs are
        copied into their spare buffers, as a bound run writes them."""
        inputs, outputs = io
        results = sess.run(user_outputs + list(outputs), {**inputs, **feeds})
        for target, value in zip(outputs.values(), results[len(user_outputs):]):
            target.update_inplace(np.ascontiguousarray(value))
        user = results[:len(user_outputs)]
        if return_ortvalues:
            return [self._ortvalue(value) for value in user]
        return user
    # ------------------------------------------------------------ training loop
    @_open_only
    def train_step(self, *inputs, return_ortvalues=False) -> list:
        """Run the training model: user outputs, and gradients accumulated on the device.

        Frozen parameters the training model updates (the running mean and
        variance of BatchNormalization in training mode, listed in its
        metadata) take their new values, as torch's ``model.train()`` does.

        Parameters
        ----------
        *inputs : numpy.ndarray or onnxruntime.OrtValue
            The user inputs, in the order of ``input_names(training=True)``.
        return_ortvalues : bool, default=False
            Return the outputs as OrtValues left on the device (no host copy).

        Returns
        -------
        list of numpy.ndarray or onnxruntime.OrtValue
            The user outputs (the loss first), in the order of
            ``output_names(training=True)``.

        Raises
        ------
        ValueError
            If the number of inputs is not the number of user inputs, if inputs
            disagree on a dimension the model combines (their batch sizes), or if
            the class labels of a cross-entropy loss (the inputs its metadata
            marks) lie outside ``[0, n_classes)`` and are not its ``ignore_index``.
            Labels given as OrtValues are checked by the graph (they may live on
            a device and are not copied back to the host).
        TypeError
            If an input array or OrtValue does not have the dtype the model declares.
        """
        self._require_values("train_step")
        layout = self._train_layout
        feeds = self._user_feeds(inputs, layout, self._train_types, "train_step",
                                self._train_links)
        check_class_labels(self._label_marks, feeds, "train_step")
        if self._reset_pending != self._reset_bound:
            self._reset_value.update_inplace(np.array(self._reset_pending))
            self._reset_bound = self._reset_pending
        n_user = len(layout.user_outputs)
        names = layout.user_outputs + self._input_grad_outputs()
        zeros = self._input_grad_zeros(feeds)
        with run_errors(self._label_marks, "train_step"):
            if any(is_string_array(value) for value in feeds.values()):
                values = self._run_unbound(self._train_sess, self._train_io(),
                                           {**feeds, **zeros}, names, True)
            else:
                binding = self._binding("train")
                self._bind_user_inputs(binding, {**feeds, **zeros})
                self._bind_outputs(binding, names)
                self._train_sess.run_with_iobinding(binding)
                values = self._fetch(binding, len(names), True)
        self._grads.swap()
        self._state_pairs.swap()
        self._reset_pending = False
        self._input_grads = dict(zip(layout.input_grads, values[n_user:]))
        return values[:n_user] if return_ortvalues else [v.numpy() for v in values[:n_user]]

    def _input_grad_outputs(self) -> list:
        return [f"{n}{GRAD_OUTPUT_SUFFIX}" for n in self._train_layout.input_grads]

    def _input_grad_zeros(self, feeds: dict) -> dict:
        """Zeros for the buffers of the inputs' gradients: a step gives its own gradient."""
        zeros = {}
        for name in self._train_layout.input_grads:
            value = feeds[name]
            shape = value.shape() if isinstance(value, ort.OrtValue) else np.shape(value)
            zeros[f"{name}{GRAD_BUFFER_SUFFIX}"] = np.zeros(shape, self._train_types[name][0])
        return zeros

    @_open_only
    def get_input_gradient(self, name: str) -> np.ndarray:
        """The gradient of the loss w.r.t. a user input, computed by the last training step.

        For the graph inputs ``TrainingBlock.requires_grad`` (or
        ``generate_artifacts(requires_grad=...)``) named: the training model
        outputs them as ``<name>_grad.accumulation.out``. Unlike a
        parameter's, an input's gradient is not accumulated across steps.

        Parameters
        ----------
        name : str
            A user input listed in the training model's ``input_gradients`` metadata.

        Raises
        ------
        KeyError
            If the training model does not output that input's gradient.
        RuntimeError
            Before the first training step.
        """
        if name not in self._train_layout.input_grads:
            raise KeyError(f"The training model outputs no gradient for {name!r}; it does "
                           f"for {self._train_layout.input_grads}.")
        if name not in self._input_grads:
            raise RuntimeError(f"No gradient of {name!r} yet: run train_step first.")
        return host_copy(self._input_grads[name])

    @_open_only
    def eval_step(self, *inputs, return_ortvalues=False) -> list:
        """Run the eval model with the current parameters.

        Parameters
        ----------
        *inputs : numpy.ndarray or onnxruntime.OrtValue
            The user inputs, in the order of ``input_names(training=False)``.
        return_ortvalues : bool, default=False
            Return the outputs as OrtValues left on the device (no host copy).

        Returns
        -------
        list of numpy.ndarray or onnxruntime.OrtValue
            The user outputs, in the order of ``output_names(training=False)``.

        Raises
        ------
        ValueError
            If the session has no eval model, the number of inputs is wrong, or
            inputs disagree on a dimension the model combines (their batch sizes).
        TypeError
            If an input array or OrtValue does not have the dtype the model declares.
        """
        self._require_eval("eval_step")
        self._require_values("eval_step")
        layout = self._eval_layout
        feeds = self._user_feeds(inputs, layout, self._eval_types, "eval_step",
                                self._eval_links)
        check_class_labels(self._label_marks, feeds, "eval_step")
        with run_errors(self._label_marks, "eval_step"):
            if any(is_string_array(value) for value in feeds.values()):
                return self._run_unbound(self._eval_sess, self._eval_io(), feeds,
                                         layout.user_outputs, return_ortvalues)
            binding = self._binding("eval")
            self._bind_user_inputs(binding, feeds)
            self._bind_outputs(binding, layout.user_outputs)
            self._eval_sess.run_with_iobinding(binding)
            return self._fetch(binding, len(layout.user_outputs), return_ortvalues)

    @_open_only
    def lazy_reset_grad(self) -> None:
        """Reset the accumulated gradients at the next :meth:`train_step`.

        Nothing is written now: the next training step ignores the
        accumulation buffers (its ``lazy_reset_grad`` input is true).
        """
        self._reset_pending = True

    @_open_only
    def optimizer_step(self) -> None:
        """Update the trainable parameters with the accumulated gradients.

        Raises
        ------
        ValueError
            If the session has no optimizer model.
        """
        self._require_optimizer("optimizer_step")
        self._require_values("optimizer_step")
        if self._step >= _LAST_STEP:
            raise ValueError(
                f"The optimizer has made {self._step} steps, the most its int64 step count "
                "holds: a checkpoint's step beyond what training reaches. Reset the "
                "optimizer state (CheckpointState.set_optimizer_state with step=0) or load "
                "another checkpoint.")
        self._step_scalars.write(self._lr, self._step + 1)
        binding = self._binding("optim")
        with run_errors({}, "optimizer_step"):
            self._run_optimizer(binding)
        self._params.swap()
        self._opt_states.swap()
        self._step += 1

    def _run_optimizer(self, binding: ort.IOBinding) -> None:
        graphs = self._optimizer_graphs
        if graphs is None:
            self._optimizer.run_with_iobinding(binding, self._optimizer_options)
            return
        key = self._binding_key("optim")
        if key not in graphs:  # a new binding: a new recording
            graphs[key] = graph_run_options(len(graphs))
        if not run_recorded(self._optimizer, binding, graphs[key], "the optimizer step"):
            # unrecorded from now on (graph id -1: the session was opened to record); the
            # failed run wrote only spare buffers
            self._optimizer_graphs, self._optimizer_options = None, graph_run_options(None)
            self._optimizer.run_with_iobinding(binding, self._optimizer_options)

    @_open_only
    def set_learning_rate(self, learning_rate: float) -> None:
        """Set the learning rate the next optimizer steps use.

        Parameters
        ----------
        learning_rate : float
            The new learning rate.

        Raises
        ------
        ValueError
            If the session has no optimizer model, or ``learning_rate`` is
            negative, NaN, infinite or beyond float32's range.
        TypeError
            If ``learning_rate`` is not a real number.
        """
        self._require_optimizer("set_learning_rate")
        if not isinstance(learning_rate, numbers.Real):
            raise TypeError(f"learning_rate must be a real number, got "
                            f"{type(learning_rate).__name__}.")
        if not (math.isfinite(learning_rate) and learning_rate >= 0):
            raise ValueError(f"learning_rate must be a finite number >= 0, got "
                             f"{learning_rate!r}.")
        if learning_rate > _FLOAT32_MAX:
            # the optimizer model takes it as float32: it would become infinity
            raise ValueError(f"learning_rate {learning_rate!r} overflows float32 (at most "
                             f"{_FLOAT32_MAX:.4g}), the optimizer model's learning-rate type.")
        self._set_lr(float(learning_rate))

    def _set_lr(self, learning_rate: float) -> None:
        self._lr = learning_rate  # written to the device by the next optimizer_step

    @_open_only
    def get_learning_rate(self) -> float:
        """The learning rate the next optimizer step uses.

        Raises
        ------
        ValueError
            If the session has no optimizer model.
        """
        self._require_optimizer("get_learning_rate")
        return float(np.float32(self._lr))

    @_open_only
    def register_linear_lr_scheduler(self, warmup_step_count: int, total_step_count: int,
                                     initial_lr: float) -> None:
        """Drive the learning rate with a linear warmup then linear decay to 0.

        As onnxruntime-training's ``LinearLRScheduler``: the learning rate is
        ``initial_lr * f(t)`` where ``t`` is the number of optimizer steps
        made so far (the optimizer's step count, so a session resumed from a
        checkpoint continues its schedule), set now and at each
        :meth:`scheduler_step`; ``f(t) = t / max(1, warmup)`` while
        ``t < warmup``, then ``max(0, (total - t) / max(1, total - warmup))``,
        computed in float32 as onnxruntime does.

        Parameters
        ----------
        warmup_step_count : int
            Number of steps of the linear increase from 0 to ``initial_lr``.
        total_step_count : int
            Step at which the learning rate reaches 0.
        initial_lr : float
            Peak learning rate.

        Raises
        ------
        ValueError
            If the session has no optimizer model, a step count is negative or
            ``initial_lr <= 0``.
        """
        self._require_optimizer("register_linear_lr_scheduler")
        self._lr_scheduler = LinearLR(warmup_step_count, total_step_count, initial_lr)
        self._set_lr(self._scheduled_lr())

    @_open_only
    def scheduler_step(self) -> None:
        """Set the learning rate the registered scheduler gives for the steps made so far.

        Call it after each :meth:`optimizer_step` (calling it twice changes nothing).

        Raises
        ------
        ValueError
            If no scheduler is registered.
        """
        if self._lr_scheduler is None:
            raise ValueError("scheduler_step needs a learning rate scheduler: "
                             "call register_linear_lr_scheduler first.")
        self._set_lr(self._scheduled_lr())

    def _scheduled_lr(self) -> float:
        # float32 as onnxruntime's scheduler (float64 then rounded gives the same
        # correctly rounded float32 factor)
        sched = self._lr_scheduler
        return float(np.float32(sched.initial_lr) * np.float32(sched.factor(self._step)))

    def _require_optimizer(self, method: str) -> None:
        if self._optimizer is None:
            raise ValueError(f"{method} needs an optimizer model: pass optimizer_model to "
                             "TrainingSession or call attach_optimizer.")

    def _require_values(self, method: str) -> None:
        """Refuse ``method`` while a parameter has no value (a nominal checkpoint)."""
        if self._nominal:
            # Parameters may have been filled since: look again (only while nominal).
            self._nominal = self._state.is_nominal
        if self._nominal:
            missing = [n for n, p in self._state.parameters.items() if p.nominal]
            # onnxruntime-training's sentence first, then the remedy
            raise NominalCheckpointError(
                f"Please load the model parameters first. {method} needs the parameters' "
                f"values, and the checkpoint is nominal (names and shapes only; no value for "
                f"{missing}). Load them: "
                "copy_buffer_to_parameters(buffer, trainable_only=False) (from_buffer here) "
                "with a buffer of all the parameters, or open a complete checkpoint.")

    def _require_eval(self, method: str) -> None:
        if self._eval_sess is None:
            raise ValueError(f"{method} needs an eval model: pass eval_model to TrainingSession.")

    # ------------------------------------------------------------------ model IO
    @_open_only
    def input_names(self, training: bool) -> list:
        """Names of the user inputs of the training (or eval) model.

        Raises
        ------
        ValueError
            If ``training`` is false and the session has no eval model.
        """
        if not training:
            self._require_eval("input_names(training=False)")
        return list((self._train_layout if training else self._eval_layout).user_inputs)

    @_open_only
    def output_names(self, training: bool) -> list:
        """Names of the user outputs of the training (or eval) model.

        Raises
        ------
        ValueError
            If ``training`` is false and the session has no eval model.
        """
        if not training:
            self._require_eval("output_names(training=False)")
        return list((self._train_layout if training else self._eval_layout).user_outputs)

    # -------------------------------------------------------------- parameters
    def _param_names(self, only_trainable: bool) -> list:
        layout = self._train_layout
        return list(layout.trainable) if only_trainable else layout.trainable + [
            n for n in self._param_types if n not in layout.trainable]

    def _live(self, name: str) -> ort.OrtValue:
        if name in self._params:
            return self._params.live(name)
        if name in self._state_pairs:
            return self._state_pairs.live(name)
        return self._frozen[name]

    def _buffer_dtype(self, names: list) -> np.dtype:
        dtypes = {self._param_types[n][0] for n in names}
        if len(dtypes) > 1:
            raise TypeError("The parameters do not share one dtype "
                            f"({sorted(map(str, dtypes))}): they cannot share a buffer.")
        return dtypes.pop() if dtypes else np.dtype(np.float32)

    @_open_only
    def parameters_size(self, only_trainable: bool = True) -> int:
        """Number of scalars in the (trainable) parameters."""
        return sum(int(np.prod(self._param_types[n][1], dtype=np.int64))
                   for n in self._param_names(only_trainable))

    @_open_only
    def to_buffer(self, only_trainable: bool) -> np.ndarray:
        """Copy the parameters into one contiguous 1-D array.

        Parameters
        ----------
        only_trainable : bool
            Copy only the trainable parameters, else all of them (trainable
            first, then frozen, in the training model's order).

        Returns
        -------
        numpy.ndarray
            The flattened parameters, concatenated.
        """
        self._require_values("get_contiguous_parameters")
        names = self._param_names(only_trainable)
        dtype = self._buffer_dtype(names)
        if not names:
            return np.zeros(0, dtype=dtype)
        return np.concatenate([self._live(n).numpy().ravel() for n in names])

    @_open_only
    def from_buffer(self, buffer, only_trainable: bool | None = None) -> None:
        """Load the parameters from one contiguous 1-D buffer (the inverse of :meth:`to_buffer`).

        With a nominal checkpoint, this is how the parameters get their values
        (all of them at once, as in onnxruntime-training): the checkpoint is
        complete afterwards.

        Parameters
        ----------
        buffer : numpy.ndarray or onnxruntime.OrtValue
            As many elements as the trainable parameters or all parameters,
            in the order of :meth:`to_buffer`; its shape does not matter (it
            is read flat, as onnxruntime-training reads it).
        only_trainable : bool, optional
            Which parameters the buffer holds; by default deduced from its size.

        Raises
        ------
        ValueError
            If the buffer's size matches neither choice.
        TypeError
            If its dtype is not the parameters' dtype.
        ortlearn.exceptions.NominalCheckpointError
            If the buffer holds the trainable parameters only and a frozen
            parameter has no value (a nominal checkpoint).
        """
        if isinstance(buffer, ort.OrtValue):
            buffer = buffer.numpy()
        buffer = np.asarray(buffer).reshape(-1)
        if only_trainable is None:
            only_trainable = buffer.size != self.parameters_size(False)
        params = self._state.parameters
        left = [n for n in self._param_names(False)[len(self._train_layout.trainable):]
                if params[n].nominal] if only_trainable else []
        if left:
            raise NominalCheckpointError(
                f"The checkpoint is nominal and the frozen parameters {left} would stay "
                "without values: load all the parameters at once, "
                "copy_buffer_to_parameters(buffer, trainable_only=False) with a buffer of "
                f"{self.parameters_size(False)} elements (trainable then frozen, as "
                "get_contiguous_parameters(trainable_only=False) orders them).")
        names = self._param_names(only_trainable)
        expected = self.parameters_size(only_trainable)
        if buffer.size != expected:
            raise ValueError(
                f"The buffer has {buffer.size} elements, the {'trainable ' * only_trainable}"
                f"parameters have {expected}.")
        dtype = self._buffer_dtype(names)
        if buffer.dtype != dtype:
            raise TypeError(f"The buffer must be {dtype}, got {buffer.dtype}.")
        offset = 0
        for name in names:
            shape = self._param_types[name][1]
            size = int(np.prod(shape, dtype=np.int64))
            # Through the bound state, which marks nominal parameters as filled.
            self._state.parameters[name].data = buffer[offset:offset + size].reshape(shape)
            offset += size

    # ------------------------------------------------------- state provider
    # The bound CheckpointState calls these to read and write the live values.
    @_open_only
    def get_parameter(self, name: str) -> np.ndarray:
        """A host copy of the current value of parameter ``name``."""
        return host_copy(self._live(self._known(name)))

    @_open_only
    def set_parameter(self, name: str, value) -> None:
        """Overwrite parameter ``name`` on the device.

        Raises
        ------
        ValueError
            If the value's shape is not the parameter's.
        TypeError
            If the value's dtype is not the parameter's.
        """
        dtype, shape = self._param_types[self._known(name)]
        value = np.asarray(value)
        if value.dtype != dtype:
            raise TypeError(f"Parameter {name!r} is {dtype}, got a value of dtype {value.dtype}.")
        if value.shape != tuple(shape):
            raise ValueError(f"Parameter {name!r} has shape {tuple(shape)}, "
                             f"got a value of shape {value.shape}.")
        self._live(name).update_inplace(np.ascontiguousarray(value))

    @_open_only
    def get_gradient(self, name: str) -> np.ndarray | None:
        """The accumulated gradient of parameter ``name``: zeros before the first
        training step (as in onnxruntime-training), None for a frozen parameter."""
        if self._known(name) not in self._grads:
            return None
        return self._grads.host_copy(name)

    @_open_only
    def export_optimizer_state(self) -> tuple | None:
        """The optimizer state on the host, as a bound CheckpointState saves it.

        Returns
        -------
        tuple or None
            ``(states, step, learning_rate)`` with ``states`` =
            ``{param: {state_name: numpy.ndarray}}`` and ``step`` the number of
            updates made. Without an optimizer model: the checkpoint's optimizer
            state, unchanged, or None if it had none.
        """
        if self._optimizer is None:
            return self._saved_optimizer
        states = {p: {} for p in self._optimizer_layout.params}
        for p, s in self._opt_states.pairs:
            states[p][s] = self._opt_states.host_copy((p, s))
        return states, self._step, self._lr

    def close(self) -> None:
        """Release the CheckpointState: copy the live values back into it, then unbind it.

        The state can then be bound by another session. The onnxruntime
        sessions and device buffers are released too; every other method of
        this session raises a ``RuntimeError`` afterwards. Closing twice does
        nothing.
        """
        if self._closed:
            return
        self._state._unbind()
        self._closed = True
        # Release the sessions and buffers now (device memory above all), not
        # whenever the object is collected.
        self._bindings = {}
        self._input_grads = {}
        self._train_sess = self._eval_sess = self._optimizer = None
        self._params = self._grads = self._state_pairs = self._frozen = None
        self._opt_states = self._step_scalars = None

    def _known(self, name: str) -> str:
        if name not in self._param_types:
            raise KeyError(f"{name!r} is not a parameter of this session; parameters: "
                           f"{list(self._param_types)}.")
        return name

    # ------------------------------------------------------------- inference
    @_open_only
    def export_model_for_inferencing(self, inference_model_path, graph_output_names) -> None:
        """Write the eval model pruned to ``graph_output_names``, parameters baked in.

        The parameters become initializers holding their current values; nodes,
        inputs (labels) and outputs (the loss) not needed to compute
        ``graph_output_names`` are removed.

        Parameters
        ----------
        inference_model_path : str or path-like
            Where to write the inference model.
        graph_output_names : list of str
            Outputs of the inference model (values of the eval model).

        Raises
        ------
        ValueError
            If the session has no eval model or a name is not a value of it.
        """
        self._require_eval("export_model_for_inferencing")
        self._require_values("export_model_for_inferencing")
        if self._eval_is_ort:
            raise ValueError("export_model_for_inferencing needs the eval model in ONNX format "
                             "(eval_model.onnx): an ORT-format model has no ONNX graph to export.")
        names = list(graph_output_names)
        known = {v for n in self._eval_model.graph.node for v in n.output} | {
            o.name for o in self._eval_model.graph.output}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(
                f"{unknown} are not values of the eval model. Its outputs are "
                f"{[o.name for o in self._eval_model.graph.output]}; the values it computes "
                f"from {self._eval_layout.user_inputs[:1]} alone (no labels), which an "
                "inference model can output, are (the last ones) "
                f"{_exportable_values(self._eval_model, self._eval_layout.user_inputs)}.")
        model = prune_model(self._eval_model, names,
                            {n: self.get_parameter(n) for n in self._param_types})
        save_model(model, inference_model_path, what="the inference model")


def _exportable_values(model: onnx.ModelProto, user_inputs: list, last: int = 12) -> list:
    """The last ``last`` values of ``model`` (graph order) computed from its first user input
    and the parameters only: what an inference model exported from it can output."""
    if not user_inputs:
        return []
    tainted = set(user_inputs[1:])  # values that read a label (or another later input)
    from_x = {user_inputs[0]}  # values computed from X (the penalties are not)
    values = []
    for node in model.graph.node:
        if any(i in tainted for i in node.input):
            tainted.update(node.output)
        elif any(i in from_x for i in node.input):
            from_x.update(node.output)
            values.extend(o for o in node.output if o)
    return values[-last:]
