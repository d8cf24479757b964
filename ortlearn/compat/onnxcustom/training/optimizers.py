"""onnxcustom's ``OrtGradientOptimizer`` (``onnxcustom.training.optimizers``) on ortlearn's engine.

The native :class:`ortlearn.OrtGradientOptimizer` underneath, with
onnxcustom's parameters and semantics:

- ``learning_rate`` is a learning-rate object
  (:mod:`~ortlearn.compat.onnxcustom.training.sgd_learning_rate`), a float
  (``LearningRateSGD(eta0=float)``, the 'invscaling' schedule) or a name;
  its value is updated after each epoch, ``update_learning_rate(it)`` with
  the 0-based epoch ``it``, so the first two epochs both run at ``eta0``;
- each step does ``w -= (lr / batch_size) * grad(loss)``: the loss of
  onnxcustom's :func:`~ortlearn.compat.onnxcustom.utils.orttraining_helper.add_loss_output`
  is a sum over the batch, so this is ``lr`` times the gradient of the mean;
- an epoch is ``ceil(n / batch_size)`` batches of ``batch_size``
  consecutive rows starting at ``numpy.random.randint(0, n - batch_size)``
  (numpy's global generator; one batch of every row when
  ``n <= batch_size``); ``train_losses_`` holds, per epoch, the mean of the
  batch losses divided by the batch size;
- every ``fit`` starts again: from the graph's initializers with
  ``warm_start=True``, from weights redrawn with ``numpy.random.randn``
  (numpy's global generator, in the order of the graph's initializers) with
  ``warm_start=False``, the default.
"""

from __future__ import annotations

import copy
import os
from numbers import Integral, Real

import numpy as np
import onnx
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from ....autodiff import build_gradient
from ....estimators.gradient_optimizer import OrtGradientOptimizer as _NativeOptimizer
from ....log import verbose_log
from ....optim import SGD
from ....training import TrainingEngine
from ....training.fused import build_fused_step
from ....training.loop import run_epochs
from ..utils.onnx_helper import replace_initializers_into_onnx
from ._base_onnx_function import constructor_repr
from .excs import ConvergenceError, EvaluationError
from .sgd_learning_rate import BaseLearningRate

__all__ = ["OrtGradientOptimizer"]


class OrtGradientOptimizer(_NativeOptimizer):
    """Stochastic gradient descent on a graph holding its loss, as onnxcustom's class did.

    Parameters
    ----------
    model_onnx : onnx.ModelProto
        The graph with its loss (from
        :func:`~ortlearn.compat.onnxcustom.utils.orttraining_helper.add_loss_output`):
        inputs X, the label, optionally ``sample_weight_name``.
    weights_to_train : list of str
        The initializers to train.
    loss_output_name : str, default='loss'
    max_iter : int, default=100
        Epochs.
    training_optimizer_name : str, default='SGDOptimizer'
        The only value onnxcustom took; another raises ``NotImplementedError``
        in ``fit``.
    batch_size : int, default=10
    learning_rate : str, float or BaseLearningRate, default='SGD'
        See :meth:`BaseLearningRate.select
        <ortlearn.compat.onnxcustom.training.sgd_learning_rate.BaseLearningRate.select>`;
        stored as the selected object. A rate keeping past gradients
        (``'Nesterov'``) raises ``NotImplementedError`` here, as in
        onnxcustom: use ``OrtGradientForwardBackwardOptimizer``.
    device : str, default='cpu'
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'``.
    warm_start : bool, default=False
        False: training starts from weights drawn with ``numpy.random.randn``;
        True: from the graph's initializers. Either way each ``fit`` starts
        again (use ``set_params(model_onnx=self.get_trained_onnx())`` to go on).
    verbose : int, default=0
        Print the loss of each epoch when > 0.
    validation_every : float or int, default=0.1
        With ``X_val``: a validation loss every ``int(max_iter * validation_every)``
        epochs (a float < 1) or every ``validation_every`` epochs.
    saved_gradient : str, default=None
        A file name: ``fit`` writes there the gradient graph (outputs the
        loss then ``<weight>_grad`` of each weight), and to
        ``saved_gradient + '.training.onnx'`` the training step ortlearn
        runs (forward, backward and update in one standard-ONNX graph).
    sample_weight_name : str, default='weight'
        The graph's sample-weight input.

    Attributes
    ----------
    train_losses_ : list of float
        One loss per finished epoch (kept when training diverges).
    validation_losses_ : list of float
        Mean validation loss per row.
    trained_coef_ : dict of str to numpy.ndarray
        The trained weights (as :meth:`get_state`).
    input_names_ : list of str
        The data inputs of the graph.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.datasets import make_regression
    >>> from sklearn.linear_model import LinearRegression
    >>> from skl2onnx import to_onnx
    >>> from ortlearn.compat.onnxcustom.utils.orttraining_helper import add_loss_output
    >>> from ortlearn.compat.onnxcustom.training.optimizers import OrtGradientOptimizer
    >>> X, y = make_regression(100, n_features=2, bias=2, random_state=0)
    >>> X, y = X.astype(np.float32), y.astype(np.float32)
    >>> onx = to_onnx(LinearRegression().fit(X, y), X[:1], black_op={'LinearRegressor'})
    >>> np.random.seed(0)
    >>> train_session = OrtGradientOptimizer(add_loss_output(onx), ['coef', 'intercept'],
    ...                                      learning_rate=1e-2, max_iter=20)
    >>> train_session.fit(X, y)  # doctest: +ELLIPSIS
    OrtGradientOptimizer(...)
    >>> losses = train_session.train_losses_
    >>> len(losses), bool(losses[-1] < losses[0] / 100)
    (20, True)
    """

    _parameter_constraints: dict = {
        "model_onnx": "no_validation",
        "weights_to_train": ["array-like"],
        "loss_output_name": [str],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "training_optimizer_name": [str],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        # BaseLearningRate.select checked it in __init__, as onnxcustom did.
        "learning_rate": [BaseLearningRate],
        "device": [str],
        "warm_start": ["boolean"],
        "verbose": ["verbose"],
        "validation_every": [Interval(Real, 0, 1, closed="left"),
                             Interval(Integral, 1, None, closed="left")],
        "saved_gradient": [str, os.PathLike, None],
        "sample_weight_name": [str],
    }

    # What the native fit reads and onnxcustom had no parameter for: its randomness
    # (batches, redrawn weights) is numpy's global generator, which
    # check_random_state(None) returns.
    random_state = None

    def __init__(self, model_onnx, weights_to_train, loss_output_name="loss", max_iter=100,
                 training_optimizer_name="SGDOptimizer", batch_size=10, learning_rate="SGD",
                 device="cpu", warm_start=False, verbose=0, validation_every=0.1,
                 saved_gradient=None, sample_weight_name="weight"):
        self.model_onnx = model_onnx
        self.weights_to_train = weights_to_train
        self.loss_output_name = loss_output_name
        self.max_iter = max_iter
        self.training_optimizer_name = training_optimizer_name
        self.batch_size = batch_size
        self.learning_rate = BaseLearningRate.select(learning_rate)
        self.device = device
        self.warm_start = warm_start
        self.verbose = verbose
        self.validation_every = validation_every
        self.saved_gradient = saved_gradient
        self.sample_weight_name = sample_weight_name
        if self.learning_rate.needs_grad:
            raise NotImplementedError(
                f"Any weight update involving past gradient is not implemented (class "
                f"{type(self.learning_rate).__name__!r}); OrtGradientForwardBackwardOptimizer "
                "implements it.")

    # ------------------------------------------------------------------ fit

    def __repr__(self, N_CHAR_MAX=700):
        # onnxcustom's form (every constructor argument, in order), not scikit-learn's
        return constructor_repr(self)
    def fit(self, X, y, sample_weight=None, X_val=None, y_val=None, use_numpy=False):
        """Train the weights for ``max_iter`` epochs.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, 1)
        sample_weight : array-like of shape (n_samples,) or (n_samples, 1), default=None
            Required when the graph has a sample-weight input, refused otherwise.
        X_val, y_val : array-like, default=None
            Validation data for ``validation_losses_``.
        use_numpy : bool, default=False
            onnxcustom's choice between two ways of feeding the batches;
            ortlearn has one, both values give the same numbers.

        Returns
        -------
        self

        Raises
        ------
        NotImplementedError
            ``training_optimizer_name`` is not ``'SGDOptimizer'``.
        RuntimeError
            ``sample_weight`` given to a graph without a sample-weight input,
            or missing for a graph with one.
        ConvergenceError
            A loss became NaN or infinite; ``train_losses_`` keeps the
            losses of the finished epochs and the weights are those of the
            last finite epoch.
        EvaluationError
            The validation loss is NaN or infinite.
        """
        if self.training_optimizer_name != "SGDOptimizer":
            raise NotImplementedError(f"Only the SGDOptimizer is implemented not "
                                      f"{self.training_optimizer_name!r}.")
        self._read_graph()
        n_inputs = len(self.input_names_)
        if (n_inputs == 2) != (sample_weight is None):
            raise RuntimeError(f"Number of inputs should be 2 if sample_weight is None or 3 if "
                               f"not None but it is {n_inputs} ({self.input_names_}).")
        if sample_weight is not None:
            sample_weight = np.asarray(sample_weight)
            if sample_weight.ndim == 2 and sample_weight.shape[1] == 1:
                sample_weight = sample_weight.ravel()
        return super().fit(X, y, sample_weight, X_val, y_val)

    def _continues(self) -> bool:
        # onnxcustom's warm_start chose the initial weights, each fit started again.
        return False

    def _optimizer_spec(self) -> SGD:
        return SGD()

    def _new_engine(self, initial_weights=None, n_rows=None) -> TrainingEngine:
        if initial_weights is None and not self.warm_start:
            initial_weights = self._redrawn_weights()
        return super()._new_engine(initial_weights, n_rows)

    def _redrawn_weights(self) -> dict:
        """``numpy.random.randn`` values of each trained weight's shape and dtype."""
        inits = {i.name: i for i in self._loss_model.graph.initializer}
        redrawn = {}
        for init in self._loss_model.graph.initializer:
            if init.name in self._weights:
                value = onnx.numpy_helper.to_array(inits[init.name])
                draw = np.random.randn(*value.shape) if value.ndim else np.random.randn(1)
                redrawn[init.name] = draw.astype(value.dtype).reshape(value.shape)
        return redrawn

    def _learning_rate_at(self, epoch: int) -> float:
        """The rate of the 1-based ``epoch`` as the step applies it (divided by the batch size)."""
        schedule = copy.deepcopy(self.learning_rate).init_learning_rate()
        for it in range(epoch - 1):
            schedule.update_learning_rate(it)
        return schedule.value / self.batch_size

    def _validation_period(self) -> int:
        ve = self.validation_every
        return int(self.max_iter * ve) if ve < 1 else int(ve)

    def _run_epochs(self, engine, arrays, val):
        if self.saved_gradient is not None:
            self._save_gradient_graphs()
        schedule = self.learning_rate.init_learning_rate()
        lr = schedule.value
        period = self._validation_period()
        n = arrays[0].shape[0]
        rows = n if n <= self.batch_size else self.batch_size

        def train_epoch(number: int) -> float:
            engine.set_learning_rate(lr / self.batch_size)
            batches = _onnxcustom_batches(n, self.batch_size, self._rng)
            return engine.train_epoch(arrays, batches) / rows

        def after_epoch(number: int, loss: float) -> bool:
            nonlocal lr
            lr = schedule.update_learning_rate(number - 1).value
            self.n_iter_ = number
            if val is not None and period and number % period == 0:
                val_loss = engine.eval_loss(val) / val[0].shape[0]
                if not np.isfinite(val_loss):
                    self._store(engine)
                    raise EvaluationError(f"Loss is nan or infinite ({val_loss!r}), evaluation "
                                          "has failed.")
                self.validation_losses_.append(val_loss)
            if self.verbose:
                verbose_log(f"[OrtGradientOptimizer] epoch {number}: loss={loss:.6g} "
                            f"lr={lr:.6g}")
            return False

        def on_diverged(error, number: int) -> None:
            self._store(engine)
            raise ConvergenceError(
                f"Loss is nan or infinite, learning_rate={lr!r}, the gradient descent has "
                f"failed (past losses={self.train_losses_[-5:]!r}). The weights of the last "
                f"finite epoch are kept.") from error

        # onnxcustom lets Ctrl-C through
        run_epochs(self.max_iter, train_epoch, self.train_losses_, after_epoch=after_epoch,
                   on_diverged=on_diverged, interruptible=False)
        self._store(engine)
        return self

    def _save_gradient_graphs(self) -> None:
        name = os.fspath(self.saved_gradient)
        onnx.save(build_gradient(self._loss_model, wrt=self._weights,
                                 loss_output=self.loss_output_name), name)
        step, _ = build_fused_step(self._loss_model, self._weights, self.input_names_, SGD(),
                                   loss_output=self.loss_output_name)
        onnx.save(step, name + ".training.onnx")

    # ---------------------------------------------------------- the weights
    @property
    def trained_coef_(self) -> dict:
        """The trained weights, as :meth:`get_state` returns them."""
        return self.get_state()

    def get_trained_onnx(self, model=None):
        """A graph with its initializers replaced by the trained weights.

        Parameters
        ----------
        model : onnx.ModelProto, default=None
            The graph to receive the weights; None: ``model_onnx``, the
            training graph (it outputs the loss). Give the graph before
            :func:`add_loss_output` to get the predictions.

        Returns
        -------
        onnx.ModelProto
            A copy; ``model`` is not modified.

        Raises
        ------
        ValueError
            A trained weight is not an initializer of ``model``.
        """
        check_is_fitted(self, "state_")
        # As onnxcustom: the values replace the initializers of that name whatever their
        # shape (a hand-made inference graph may hold the intercept as a scalar).
        return replace_initializers_into_onnx(self.model_onnx if model is None else model,
                                              self.state_)

    def _inference(self):
        # predict runs the graph without its loss (the native get_trained_onnx).
        return self._runtime.inference_session(super().get_trained_onnx, self.device)


def _onnxcustom_batches(n: int, batch_size: int, rng) -> list[np.ndarray]:
    """Row indices of an epoch as onnxcustom's ``OrtDataLoader`` drew them.

    ``ceil(n / batch_size)`` windows of ``batch_size`` consecutive rows,
    each starting at ``rng.randint(0, n - batch_size)`` (drawn one at a
    time, as there); one batch of every row when ``n <= batch_size``.
    """
    if n <= batch_size:
        return [np.arange(n, dtype=np.int64)]
    high = n - batch_size
    return [np.arange(start, start + batch_size, dtype=np.int64)
            for start in (rng.randint(0, high) for _ in range(-(-n // batch_size)))]
