"""``onnxruntime.training.api`` on the ordinary onnxruntime.

``Module``, ``Optimizer``, ``LinearLRScheduler`` and ``CheckpointState`` with the
methods and behaviour of onnxruntime-training's Python API, as thin wrappers
over one :class:`~ortlearn.training.TrainingSession`. Code written for
onnxruntime-training runs after changing its import::

    from ortlearn.api import CheckpointState, Module, Optimizer

    state = CheckpointState.load_checkpoint("artifacts/checkpoint")
    model = Module("artifacts/training_model.onnx", state, "artifacts/eval_model.onnx")
    optimizer = Optimizer("artifacts/optimizer_model.onnx", model)
    model.train()
    for X, y in batches:
        loss = model(X, y)
        optimizer.step()
        model.lazy_reset_grad()
"""

from __future__ import annotations

import functools
import weakref

import numpy as np
import onnxruntime as ort

from .exceptions import as_training_api_error
from .training.checkpoint import CheckpointState
from .training.device import parse_device
from .training.session import TrainingSession

__all__ = ["CheckpointState", "LinearLRScheduler", "Module", "Optimizer", "set_seed"]


def set_seed(seed: int) -> None:
    """Seed the random numbers of training: the masks of Dropout, reproducibly.

    onnxruntime-training's ``Ort::SetSeed`` (C++) and
    ``TrainingUtils.SetSeed`` (C#); its Python users called
    ``onnxruntime.set_seed``, which this calls. A Dropout node without a
    ``seed`` attribute draws its masks from onnxruntime's process-wide
    generator, which this resets: sessions created and run after the same
    seed draw the same masks, a fresh one at every training step. (A node
    with a ``seed`` attribute draws from its own generator, seeded by it
    when the session is created.)

    Parameters
    ----------
    seed : int
        Non-negative.

    Raises
    ------
    TypeError, ValueError
        For a seed that is not a non-negative integer.

    Examples
    --------
    >>> from ortlearn import api
    >>> api.set_seed(0)
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}.")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}.")
    ort.set_seed(int(seed))


def _ort_errors(method):
    """Raise ``method``'s ValueError, TypeError and OSError as RuntimeErrors too.

    onnxruntime-training reports every failure of its C++ core (a wrong input
    count, shape or type, a missing file, a mismatched model) as a
    ``RuntimeError``: a migrated script catches that. The error keeps its own
    class and message (:func:`~ortlearn.exceptions.as_training_api_error`).
    """
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except (ValueError, TypeError, OSError) as exc:
            converted = as_training_api_error(exc)
            if converted is exc:
                raise
            raise converted from exc.__cause__
    return wrapper


def _require_open(obj, what: str) -> None:
    """Raise if the module ``obj`` works on (``obj._module``) is closed."""
    if obj._module._closed:
        raise RuntimeError(
            f"{what} was called after Module.close(): the module gave its parameters back "
            "to its CheckpointState and released its sessions. Build a new Module (and "
            "Optimizer) on the state to go on training.")


def _open_module(method):
    """Refuse ``method`` once the module it works on is closed (or collected)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        _require_open(self, f"{type(self).__name__}.{method.__name__}")
        return method(self, *args, **kwargs)
    return wrapper


class Module:
    """A trainable ONNX model: forward and backward through the training model.

    Parameters
    ----------
    train_model_uri : str, path-like, bytes or onnx.ModelProto
        The training model.
    state : CheckpointState
        The parameters to start from (bound: they follow the training).
    eval_model_uri : str, path-like, bytes or onnx.ModelProto, optional
        The eval model, used in eval mode.
    device : str, default='cpu'
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'``.
    session_options : onnxruntime.SessionOptions, optional
        Options of the underlying onnxruntime sessions.

    Attributes
    ----------
    training : bool
        True in train mode (the default), False in eval mode.

    Raises
    ------
    ValueError
        For an unknown device or a checkpoint that does not match the model.
    RuntimeError
        If ``state`` is bound to another live Module or TrainingSession
        (close that one first: two would train diverging copies).

    Notes
    -----
    The module binds ``state`` until :meth:`close` (or the end of a ``with``
    block, or the module's collection) gives the trained values back to it;
    a closed module, and its Optimizer and LinearLRScheduler, raise
    ``RuntimeError`` from every method.

    Where onnxruntime-training raises ``RuntimeError`` (a wrong input, a
    missing file, a mismatched checkpoint, a nominal checkpoint without
    values), the errors raised here are ``RuntimeError`` too, and also the
    ``ValueError``, ``TypeError`` or ``OSError`` that names the problem
    (:class:`~ortlearn.exceptions.TrainingApiError`).

    A module built on a nominal checkpoint (``generate_artifacts(...,
    nominal_checkpoint=True)``: names and shapes, no values) refuses to
    train, evaluate, step the optimizer, export or give its parameters
    (:class:`~ortlearn.exceptions.NominalCheckpointError`) until
    :meth:`copy_buffer_to_parameters` loads all the values
    (``trainable_only=False``).
    """

    training: bool

    @_ort_errors
    def __init__(self, train_model_uri, state: CheckpointState, eval_model_uri=None,
                 device: str = "cpu", session_options=None):
        self._closed = False
        self._device = parse_device(device)
        self._state = state
        self._session = TrainingSession(state, train_model_uri, eval_model_uri,
                                        device=self._device, session_options=session_options)
        self.training = True
        # A module dropped without close() releases its state when collected, so
        # that a new Module can bind it (the finalizer holds the session, not self).
        self._finalizer = weakref.finalize(self, self._session.close)
        # At interpreter exit there is nothing left to bind the state to.
        self._finalizer.atexit = False

    @property
    def _module(self) -> Module:
        return self

    def close(self) -> None:
        """Release the CheckpointState: the trained values go back into it, unbound.

        The state can then be bound by a new Module. Every other method of
        this module, and of its Optimizer and LinearLRScheduler, raises a
        ``RuntimeError`` afterwards. Closing twice does nothing. A module used
        as a context manager (``with Module(...) as model:``) is closed on
        leaving the block; one that is garbage-collected is closed too.
        """
        self._finalizer()
        self._closed = True

    def __enter__(self) -> Module:
        if self._closed:
            raise RuntimeError("A closed Module cannot be reopened: build a new Module on "
                               "the CheckpointState.")
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @_ort_errors
    @_open_module
    def __call__(self, *user_inputs):
        """Run a training step (train mode) or an eval step (eval mode).

        Parameters
        ----------
        *user_inputs : numpy.ndarray or onnxruntime.OrtValue
            The inputs, in the order of :meth:`input_names`, of any element
            type the model declares (float, int64, bool, string, ...).

        Returns
        -------
        numpy.ndarray, onnxruntime.OrtValue or tuple of them
            The only output, or the tuple of outputs when the model has
            several. As in onnxruntime-training, they are numpy arrays when
            any input is a numpy array, and OrtValues (left on the module's
            device, no host copy) when every input is an OrtValue.

        Raises
        ------
        ValueError
            For a wrong number of inputs or a shape the model does not accept.
        TypeError
            For an element type the model does not declare.
        ortlearn.exceptions.NominalCheckpointError
            While the checkpoint is nominal.

        Notes
        -----
        The three errors are also ``RuntimeError``, as onnxruntime-training's.
        """
        step = self._session.train_step if self.training else self._session.eval_step
        # onnxruntime-training takes its OrtValue path when no input is a numpy array.
        as_ortvalues = all(isinstance(value, ort.OrtValue) for value in user_inputs)
        outputs = step(*user_inputs, return_ortvalues=as_ortvalues)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @_open_module
    def train(self, mode: bool = True) -> Module:
        """Switch to train mode (``mode=True``) or eval mode; return self."""
        self.training = bool(mode)
        return self

    @_open_module
    def eval(self) -> Module:
        """Switch to eval mode; return self."""
        return self.train(False)

    @_open_module
    def lazy_reset_grad(self) -> None:
        """Reset the gradients at the next training step."""
        self._session.lazy_reset_grad()

    @_ort_errors
    @_open_module
    def get_contiguous_parameters(self, trainable_only: bool = False) -> ort.OrtValue:
        """The parameters, flattened and concatenated, as an OrtValue on the module's device.

        Parameters
        ----------
        trainable_only : bool, default=False
            Only the trainable parameters.

        Returns
        -------
        onnxruntime.OrtValue
            A 1-D copy of the parameters.

        Raises
        ------
        ortlearn.exceptions.NominalCheckpointError
            While the checkpoint is nominal (no values to give).
        """
        buffer = self._session.to_buffer(trainable_only)
        return ort.OrtValue.ortvalue_from_numpy(buffer, self._device.ort_device_type,
                                                self._device.index)

    @_open_module
    def get_parameters_size(self, trainable_only: bool = True) -> int:
        """Number of scalars in the (trainable) parameters."""
        return self._session.parameters_size(trainable_only)

    @_ort_errors
    @_open_module
    def copy_buffer_to_parameters(self, buffer, trainable_only: bool = True) -> None:
        """Load the parameters from a buffer (OrtValue or numpy array).

        On a module built on a nominal checkpoint, this is how the parameters
        get their values: all at once (``trainable_only=False``), as in
        onnxruntime-training; the checkpoint is complete afterwards.

        Parameters
        ----------
        buffer : onnxruntime.OrtValue or numpy.ndarray
            As returned by :meth:`get_contiguous_parameters`; read flat (only
            its size counts, as in onnxruntime-training).
        trainable_only : bool, default=True
            Whether the buffer holds the trainable parameters only.

        Raises
        ------
        ValueError
            If the buffer's size does not match the parameters.
        TypeError
            If its element type is not the parameters'.
        ortlearn.exceptions.NominalCheckpointError
            With ``trainable_only=True`` on a nominal checkpoint.

        Notes
        -----
        The errors are also ``RuntimeError``, as onnxruntime-training's.
        """
        self._session.from_buffer(buffer, only_trainable=trainable_only)

    @_ort_errors
    @_open_module
    def export_model_for_inferencing(self, inference_model_uri, graph_output_names) -> None:
        """Write an inference model: the eval model with the current parameters baked in.

        Parameters
        ----------
        inference_model_uri : str or path-like
            Where to write it.
        graph_output_names : list of str
            Outputs to keep (the loss and what only it needs are removed).

        Raises
        ------
        ValueError
            Without an eval model, or for a name that is not a value of it.
        """
        self._session.export_model_for_inferencing(inference_model_uri, graph_output_names)

    @_open_module
    def input_names(self) -> list:
        """User input names of the current mode's model ([] in eval mode without eval model)."""
        if not self.training and self._session._eval_sess is None:
            return []  # what onnxruntime-training answers
        return self._session.input_names(self.training)

    @_open_module
    def output_names(self) -> list:
        """User output names of the current mode's model ([] in eval mode without eval model)."""
        if not self.training and self._session._eval_sess is None:
            return []
        return self._session.output_names(self.training)


class Optimizer:
    """Updates a :class:`Module`'s parameters with an optimizer model.

    Parameters
    ----------
    optimizer_uri : str, path-like, bytes or onnx.ModelProto
        The optimizer model.
    module : Module
        The module whose trainable parameters it updates.

    Raises
    ------
    ValueError
        If the optimizer model does not match the module, or the module already
        has an optimizer.
    """

    @_ort_errors
    def __init__(self, optimizer_uri, module: Module):
        # The module, kept alive with its session, tells whether it was closed.
        self._module = module
        _require_open(self, "Optimizer()")
        self._session = module._session
        self._session.attach_optimizer(optimizer_uri)

    @_ort_errors
    @_open_module
    def step(self) -> None:
        """One update of the trainable parameters with the accumulated gradients.

        Raises
        ------
        ortlearn.exceptions.NominalCheckpointError
            While the module's checkpoint is nominal (a ``RuntimeError``, as
            onnxruntime-training's).
        """
        self._session.optimizer_step()

    @_ort_errors
    @_open_module
    def set_learning_rate(self, learning_rate: float) -> None:
        """Set the learning rate of the next steps."""
        self._session.set_learning_rate(learning_rate)

    @_open_module
    def get_learning_rate(self) -> float:
        """The learning rate of the next step."""
        return self._session.get_learning_rate()


class LinearLRScheduler:
    """onnxruntime-training's linear schedule, with the numbers it gives.

    onnxruntime-training 1.19 documents a linear warmup over
    ``warmup_step_count`` steps then a linear decay to 0 at
    ``total_step_count``, but passes the two counts to its C++ scheduler in
    swapped order (measured with onnxruntime-training 1.19.2): the rate
    rises as ``initial_lr * t / total_step_count`` while ``t <
    total_step_count`` optimizer steps have been made, then is
    ``initial_lr * max(0, warmup_step_count - t)`` (0 for ``t >=
    warmup_step_count + 1``). A migrated script gets those rates here too;
    :meth:`ortlearn.TrainingSession.register_linear_lr_scheduler` gives the
    documented schedule.

    Parameters
    ----------
    optimizer : Optimizer
        The optimizer whose learning rate it drives.
    warmup_step_count : int
    total_step_count : int
    initial_lr : float
        Peak learning rate.

    Examples
    --------
    >>> scheduler = LinearLRScheduler(optimizer, 2, 6, 1.0)  # doctest: +SKIP
    >>> optimizer.get_learning_rate()  # doctest: +SKIP
    0.0
    >>> scheduler.step(); optimizer.get_learning_rate()  # doctest: +SKIP
    0.16666667
    """

    @_ort_errors
    def __init__(self, optimizer: Optimizer, warmup_step_count: int, total_step_count: int,
                 initial_lr: float):
        self._module = optimizer._module
        _require_open(self, "LinearLRScheduler()")
        self._session = optimizer._session
        # onnxruntime-training's order (the counts swapped): the same rates as there.
        self._session.register_linear_lr_scheduler(total_step_count, warmup_step_count,
                                                   initial_lr)

    @_open_module
    def step(self) -> None:
        """Advance the schedule by one step (call it after each optimizer step)."""
        self._session.scheduler_step()
