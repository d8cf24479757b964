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

import numpy as np
import onnxruntime as ort

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
    """

    training: bool

    def __init__(self, train_model_uri, state: CheckpointState, eval_model_uri=None,
                 device: str = "cpu", session_options=None):
        self._device = parse_device(device)
        self._state = state
        self._session = TrainingSession(state, train_model_uri, eval_model_uri,
                                        device=self._device, session_options=session_options)
        self.training = True

    def __call__(self, *user_inputs):
        """Run a training step (train mode) or an eval step (eval mode).

        Parameters
        ----------
        *user_inputs : numpy.ndarray or onnxruntime.OrtValue
            The inputs, in the order of :meth:`input_names`.

        Returns
        -------
        numpy.ndarray or list of numpy.ndarray
            The only output, or the list of outputs when the model has several.
        """
        step = self._session.train_step if self.training else self._session.eval_step
        outputs = step(*user_inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def train(self, mode: bool = True) -> Module:
        """Switch to train mode (``mode=True``) or eval mode; return self."""
        self.training = bool(mode)
        return self

    def eval(self) -> Module:
        """Switch to eval mode; return self."""
        return self.train(False)

    def lazy_reset_grad(self) -> None:
        """Reset the gradients at the next training step."""
        self._session.lazy_reset_grad()

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
        """
        buffer = self._session.to_buffer(trainable_only)
        return ort.OrtValue.ortvalue_from_numpy(buffer, self._device.ort_device_type,
                                                self._device.index)

    def get_parameters_size(self, trainable_only: bool = True) -> int:
        """Number of scalars in the (trainable) parameters."""
        return self._session.parameters_size(trainable_only)

    def copy_buffer_to_parameters(self, buffer, trainable_only: bool = True) -> None:
        """Load the parameters from a 1-D buffer (OrtValue or numpy array).

        Parameters
        ----------
        buffer : onnxruntime.OrtValue or numpy.ndarray
            As returned by :meth:`get_contiguous_parameters`.
        trainable_only : bool, default=True
            Whether the buffer holds the trainable parameters only.

        Raises
        ------
        ValueError
            If the buffer's size does not match the parameters.
        """
        self._session.from_buffer(buffer, only_trainable=trainable_only)

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

    def input_names(self) -> list:
        """User input names of the current mode's model."""
        return self._session.input_names(self.training)

    def output_names(self) -> list:
        """User output names of the current mode's model."""
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

    def __init__(self, optimizer_uri, module: Module):
        self._session = module._session
        self._session.attach_optimizer(optimizer_uri)

    def step(self) -> None:
        """One update of the trainable parameters with the accumulated gradients."""
        self._session.optimizer_step()

    def set_learning_rate(self, learning_rate: float) -> None:
        """Set the learning rate of the next steps."""
        self._session.set_learning_rate(learning_rate)

    def get_learning_rate(self) -> float:
        """The learning rate of the next step."""
        return self._session.get_learning_rate()


class LinearLRScheduler:
    """Linear warmup from 0 to ``initial_lr``, then linear decay to 0.

    Parameters
    ----------
    optimizer : Optimizer
        The optimizer whose learning rate it drives.
    warmup_step_count : int
        Steps of the warmup.
    total_step_count : int
        Step at which the learning rate reaches 0.
    initial_lr : float
        Peak learning rate.

    Examples
    --------
    >>> scheduler = LinearLRScheduler(optimizer, 2, 6, 1.0)  # doctest: +SKIP
    >>> optimizer.get_learning_rate()  # doctest: +SKIP
    0.0
    >>> scheduler.step(); optimizer.get_learning_rate()  # doctest: +SKIP
    0.5
    """

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, total_step_count: int,
                 initial_lr: float):
        self._session = optimizer._session
        self._session.register_linear_lr_scheduler(warmup_step_count, total_step_count,
                                                   initial_lr)

    def step(self) -> None:
        """Advance the schedule by one step (call it after each optimizer step)."""
        self._session.scheduler_step()
