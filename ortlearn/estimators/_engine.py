"""The training engine: one place where a loss graph becomes training steps.

:class:`TrainingEngine` takes an ONNX graph that already computes a scalar
loss (built by :func:`ortlearn.add_loss_output`, onnxblock or by hand),
builds the training, eval and optimizer models with the artifacts machinery
(:func:`ortlearn.artifacts.generate_artifacts`,
:func:`ortlearn.optim.build_optimizer_model`) and drives ONE
:class:`ortlearn.TrainingSession` on the chosen device. Estimators and
:class:`~ortlearn.estimators.OrtGradientOptimizer` own the epochs, the data
checks and the schedules; the engine owns the steps.

:func:`_batches` is the single helper that decides the mini-batches of an
epoch, so that tests (and estimators) reproduce the same batch order.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from .._onnx_helper import FLOAT_TYPES, elem_type_of, load_model, onnx_to_np_dtype, shape_of
from ..artifacts import generate_artifacts
from ..exceptions import ConvergenceError
from ..optim import build_optimizer_model
from ..optim.optimizers import _Optimizer
from ..training import CheckpointState, TrainingSession

__all__ = ["TrainingEngine"]


def _batches(n_samples: int, batch_size: int, rng=None) -> list[np.ndarray]:
    """Row indices of the mini-batches of one epoch.

    Parameters
    ----------
    n_samples : int
        Number of rows.
    batch_size : int
        Rows per batch; the last batch holds the remainder.
    rng : numpy.random.RandomState or numpy.random.Generator, default=None
        Shuffles the rows (one ``permutation`` call per epoch); None keeps
        the order.

    Returns
    -------
    list of numpy.ndarray
        One int64 index array per batch.

    Examples
    --------
    >>> [b.tolist() for b in _batches(5, 2)]
    [[0, 1], [2, 3], [4]]
    """
    if n_samples < 1:
        raise ValueError(f"Cannot make batches of {n_samples} samples.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    order = np.arange(n_samples) if rng is None else rng.permutation(n_samples)
    order = order.astype(np.int64, copy=False)
    return [order[start:start + batch_size] for start in range(0, n_samples, batch_size)]


def _check_trainable(model: onnx.ModelProto, trainable) -> list[str]:
    if isinstance(trainable, str) or not trainable:
        raise ValueError(f"trainable must be a non-empty list of initializer names, "
                         f"got {trainable!r}.")
    trainable = list(trainable)
    inits = {i.name: i for i in model.graph.initializer}
    unknown = [n for n in trainable if n not in inits]
    if unknown:
        floats = [n for n, i in inits.items() if i.data_type in FLOAT_TYPES]
        raise ValueError(f"Unknown weights {unknown}: the graph's float initializers are "
                         f"{floats}.")
    not_float = [n for n in trainable if inits[n].data_type not in FLOAT_TYPES]
    if not_float:
        raise ValueError(f"Weights {not_float} are not float32/float64 initializers and "
                         "cannot be trained.")
    duplicated = sorted({n for n in trainable if trainable.count(n) > 1})
    if duplicated:
        raise ValueError(f"Weights {duplicated} are listed more than once.")
    return trainable


def _data_inputs(model: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _check_input_names(model: onnx.ModelProto, input_names) -> list[str]:
    data = _data_inputs(model)
    if input_names is None:
        return data
    names = list(input_names)
    unknown = [n for n in names if n not in data]
    missing = [n for n in data if n not in names]
    if unknown or missing or len(set(names)) != len(names):
        raise ValueError(f"input_names {names} must list each data input of the graph "
                         f"once: unknown {unknown}, missing {missing}; the graph's data "
                         f"inputs are {data}.")
    return names


def _check_loss_output(model: onnx.ModelProto, loss_output: str) -> None:
    outputs = [o.name for o in model.graph.output]
    if loss_output not in outputs:
        raise ValueError(f"The graph has no output {loss_output!r} (its outputs are "
                         f"{outputs}); add one with ortlearn.add_loss_output.")


def _replace_initializers(model: onnx.ModelProto, weights: dict) -> None:
    """Overwrite initializer values in place (names, shapes and dtypes checked)."""
    inits = {i.name: i for i in model.graph.initializer}
    current = {n: numpy_helper.to_array(inits[n]) for n in weights if n in inits}
    clean = _conform_state(weights, current, partial=True)
    for name, value in clean.items():
        inits[name].CopyFrom(numpy_helper.from_array(value, name))


def _conform_state(state, expected: dict, partial: bool = False) -> dict:
    """``state`` cast to the dtypes of ``expected``; ValueError listing every problem."""
    if not isinstance(state, dict):
        raise TypeError(f"A state is a dict of name -> array, got {type(state).__name__}.")
    problems = []
    unknown = [n for n in state if n not in expected]
    if unknown:
        problems.append(f"unknown weights {unknown} (expected {list(expected)})")
    if not partial:
        missing = [n for n in expected if n not in state]
        if missing:
            problems.append(f"missing weights {missing}")
    clean = {}
    for name, value in state.items():
        if name not in expected:
            continue
        ref = expected[name]
        value = np.asarray(value)
        if value.shape != ref.shape:
            problems.append(f"weight {name!r} has shape {value.shape}, expected {ref.shape}")
            continue
        if not np.issubdtype(value.dtype, np.number):
            problems.append(f"weight {name!r} has non-numeric dtype {value.dtype}")
            continue
        clean[name] = np.ascontiguousarray(value, dtype=ref.dtype)
    if problems:
        raise ValueError("Invalid state: " + "; ".join(problems) + ".")
    return clean


def _build_models(model: onnx.ModelProto, trainable: list[str], optimizer,
                  loss_output: str) -> tuple:
    """Training, eval and optimizer models and the initial checkpoint.

    ``generate_artifacts`` only writes files: the artifacts go to a temporary
    directory and are read back (cheap next to opening the sessions).
    ``loss=None`` with ``loss_input_names=[loss_output]`` differentiates the
    graph's own loss and keeps it as the only user output, so that a
    training step computes nothing but the loss and the gradients.
    """
    with tempfile.TemporaryDirectory(prefix="ortlearn_") as tmp:
        generate_artifacts(model, requires_grad=trainable, loss=None, artifact_directory=tmp,
                           loss_input_names=[loss_output])
        path = Path(tmp)
        training = onnx.load(str(path / "training_model.onnx"))
        evaluation = onnx.load(str(path / "eval_model.onnx"))
        state = CheckpointState.load_checkpoint((path / "checkpoint").read_bytes())
    inits = {i.name: i for i in model.graph.initializer}
    params = {n: (inits[n].data_type, list(inits[n].dims)) for n in trainable}
    optim_model = build_optimizer_model(optimizer, params)
    return training, evaluation, optim_model, state


class TrainingEngine:
    """Mini-batch training of an ONNX loss graph in one onnxruntime training session.

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
        Options of the onnxruntime sessions.

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

    Raises
    ------
    ValueError
        Unknown or non-float trainable names, bad ``input_names``, a missing
        loss output, an invalid ``initial_weights``.
    TypeError
        ``optimizer`` is not an ortlearn optimizer.

    Notes
    -----
    A step is ``lazy_reset_grad`` → ``train_step`` → ``optimizer_step``: the
    weights, gradients and optimizer state never leave the device. The
    session reuses its output buffers from one step to the next, so the loss
    scalar of each batch is read right after its step (4 or 8 bytes;
    onnxruntime synchronises at the end of every run anyway). The weights
    are copied to the host once per epoch, to restore them if training
    diverges.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LinearRegression
    >>> from skl2onnx import to_onnx
    >>> from ortlearn import add_loss_output
    >>> from ortlearn.optim import SGD
    >>> X = np.random.RandomState(0).randn(40, 2).astype(np.float32)
    >>> y = X @ np.array([1.0, -2.0], dtype=np.float32)
    >>> onx = to_onnx(LinearRegression().fit(X, y), X, black_op={'LinearRegressor'})
    >>> engine = TrainingEngine(add_loss_output(onx), ['coef', 'intercept'], SGD(),
    ...                         initial_weights={'coef': np.zeros((2, 1))})
    >>> engine.set_learning_rate(0.05)
    >>> losses = [engine.train_epoch([X, y[:, None]], _batches(40, 8)) for _ in range(5)]
    >>> bool(losses[-1] < losses[0])
    True
    """

    def __init__(self, loss_model, trainable, optimizer, device="cpu", input_names=None,
                 loss_output="loss", initial_weights=None, session_options=None):
        if not isinstance(optimizer, _Optimizer):
            raise TypeError("optimizer must be an ortlearn.optim.SGD, Adam or AdamW instance, "
                            f"got {type(optimizer).__name__}.")
        model = load_model(loss_model)
        _check_loss_output(model, loss_output)
        self.trainable = _check_trainable(model, trainable)
        self.input_names = _check_input_names(model, input_names)
        declared = {i.name: i for i in model.graph.input}
        self.input_dtypes = {n: onnx_to_np_dtype(elem_type_of(declared[n]))
                             for n in self.input_names}
        self.input_shapes = {n: shape_of(declared[n]) for n in self.input_names}
        if initial_weights:
            _replace_initializers(model, dict(initial_weights))
        self.loss_output = loss_output
        self.optimizer = optimizer
        self.device = device
        self._session_options = session_options
        training, evaluation, optim_model, state = _build_models(
            model, self.trainable, optimizer, loss_output)
        self._models = (training, evaluation, optim_model)
        # The session's user inputs are the data inputs in graph order.
        order = _data_inputs(model)
        self._feed_order = [self.input_names.index(n) for n in order]
        self._lr = None
        self.n_steps = 0
        self._open(state)

    # ---------------------------------------------------------------- session
    def _open(self, state: CheckpointState) -> None:
        self._state = state
        self._session = TrainingSession(state, *self._models, device=self.device,
                                        session_options=self._session_options)
        if self._lr is not None:
            self._session.set_learning_rate(self._lr)
        self._last_finite = self.get_state()

    def _ordered(self, arrays) -> list:
        arrays = list(arrays)
        if len(arrays) != len(self.input_names):
            raise ValueError(f"Expected {len(self.input_names)} arrays for the inputs "
                             f"{self.input_names}, got {len(arrays)}.")
        return [arrays[i] for i in self._feed_order]

    def set_learning_rate(self, lr: float) -> None:
        """Learning rate of the next optimizer steps.

        Parameters
        ----------
        lr : float
            The learning rate, finite and > 0.
        """
        lr = float(lr)
        if not (np.isfinite(lr) and lr > 0):
            raise ValueError(f"The learning rate must be a finite number > 0, got {lr!r}.")
        self._lr = lr
        self._session.set_learning_rate(lr)

    # -------------------------------------------------------------- training
    def train_epoch(self, arrays, batch_indices, lr_for_step=None) -> float:
        """One pass over the mini-batches.

        Parameters
        ----------
        arrays : list of numpy.ndarray
            The data, aligned with :attr:`input_names`, each of the input's
            dtype, rows on the first axis.
        batch_indices : list of numpy.ndarray
            Row indices of each batch, in the order they are learned (see
            :func:`_batches`).
        lr_for_step : callable, default=None
            ``lr_for_step(step) -> float`` called before each update with its
            1-based global number (``n_steps + 1``): a per-step schedule.
            None keeps the current learning rate.

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
        ordered = self._ordered(arrays)
        session = self._session
        losses = np.empty(len(batch_indices), dtype=np.float64)
        sizes = np.empty(len(batch_indices), dtype=np.float64)
        for k, idx in enumerate(batch_indices):
            if lr_for_step is not None:
                self.set_learning_rate(lr_for_step(self.n_steps + 1))
            session.lazy_reset_grad()
            outputs = session.train_step(*[a[idx] for a in ordered], return_ortvalues=True)
            losses[k] = outputs[0].numpy()
            sizes[k] = len(idx)
            session.optimizer_step()
            self.n_steps += 1
        loss = float(losses @ sizes / sizes.sum())
        state = self.get_state()
        if not (np.isfinite(loss) and all(np.isfinite(v).all() for v in state.values())):
            self._diverged(loss)
        self._last_finite = state
        return loss

    def _diverged(self, loss: float) -> None:
        weights = self._last_finite
        # The optimizer state is as corrupted as the weights: start it again.
        fresh = CheckpointState.from_parameters(weights)
        self.n_steps = 0
        self._open(fresh)
        raise ConvergenceError(
            f"Training diverged: the epoch loss is {loss} (or a weight is not finite). "
            "The weights of the last finite epoch were restored; lower the learning rate.")

    def eval_loss(self, arrays) -> float:
        """The loss on ``arrays`` (aligned with :attr:`input_names`) with the current weights.

        Returns
        -------
        float
        """
        outputs = self._session.eval_step(*self._ordered(arrays))
        return float(outputs[0])

    # ----------------------------------------------------------------- state
    def get_state(self) -> dict:
        """Host copies of the weights, ``{name: numpy.ndarray}`` in trainable order."""
        return {n: np.array(self._session.get_parameter(n), copy=True)
                for n in self._state.parameters.keys()}

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
        clean = _conform_state(state, self._last_finite)
        for name, value in clean.items():
            self._session.set_parameter(name, value)
        self._last_finite = {n: v.copy() for n, v in clean.items()}

    def optimizer_state(self) -> dict:
        """Host copy of the optimizer state.

        Returns
        -------
        dict
            ``{"states": {param: {state_name: ndarray}}, "step": int,
            "learning_rate": float}``.
        """
        return {"states": self._state.optimizer_state, "step": self.n_steps,
                "learning_rate": float(self._lr if self._lr is not None
                                       else self._state.optimizer_learning_rate)}

    def load_optimizer_state(self, state: dict) -> None:
        """Continue from an :meth:`optimizer_state` (warm start, checkpoint resume).

        The session is reopened with the current weights and that state: the
        next steps are those the original training would have made.

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
        checkpoint = CheckpointState.from_parameters(self.get_state())
        checkpoint.set_optimizer_state(states, step, lr)
        self._lr = lr
        self.n_steps = step
        self._open(checkpoint)

    def checkpoint_state(self) -> CheckpointState:
        """The live :class:`~ortlearn.CheckpointState` bound to the session.

        ``CheckpointState.save_checkpoint(engine.checkpoint_state(), path,
        include_optimizer_state=True)`` saves the current weights and
        optimizer state.
        """
        return self._state
