"""``OrtGradientOptimizer``: train any ONNX graph that holds its own loss (onnxcustom's API)."""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
import onnx
from sklearn.base import BaseEstimator, _fit_context, clone
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ..artifacts import export_training_artifacts
from ..exceptions import ConvergenceError, ConvergenceWarning
from ..graph import (
    elem_type_of,
    get_train_initializer,
    load_model,
    onnx_to_np_dtype,
    prune_model,
    shape_of,
)
from ..log import user_stacklevel, verbose_log
from ..optim import SGD, Adam, Optimizer, TorchAdamW
from ..training import Batches, TrainingEngine, parse_device
from ..training.loop import run_epochs
from ._session_cache import _SessionCache, serialized
from ._validation import as_real, check_finite, check_sample_weight

__all__ = ["OrtGradientOptimizer"]

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64}


class OrtGradientOptimizer(BaseEstimator):
    """Train the weights of an ONNX graph that computes its own loss.

    onnxcustom's ``OrtGradientOptimizer`` on the ordinary onnxruntime: the
    graph comes from :func:`ortlearn.add_loss_output` (or onnxblock) and has
    a scalar output ``loss_output_name``; its first input is ``X``, the
    label input is the other data input, ``sample_weight_name`` the
    optional sample-weight input. ``fit`` runs mini-batch gradient descent
    in onnxruntime; the trained graph without its loss is
    :meth:`get_trained_onnx`.

    Parameters
    ----------
    model_onnx : onnx.ModelProto, bytes or path
        The graph with its loss.
    weights_to_train : list of str, default=None
        Initializers to train. None: :func:`ortlearn.get_train_initializer`
        (every float initializer).
    loss_output_name : str, default='loss'
        Name of the loss output.
    max_iter : int, default=100
        Number of epochs (onnxcustom's default).
    optimizer : {'sgd', 'adam', 'adamw'} or ortlearn.optim.Optimizer, default='sgd'
        ``'sgd'``: plain SGD, with ``momentum`` if > 0; ``'adam'``:
        :class:`ortlearn.optim.Adam` (scikit-learn MLP's); ``'adamw'``:
        :class:`ortlearn.optim.TorchAdamW` (``torch.optim.AdamW``) with its
        defaults. An :class:`ortlearn.optim.Optimizer` instance (``SGD``,
        ``Adam``, ``AdamW``, ``TorchAdamW`` or a subclass) is used as is.
    learning_rate : float or {'constant', 'invscaling'}, default='invscaling'
        A float is a constant learning rate. ``'constant'`` uses ``eta0``;
        ``'invscaling'`` uses ``eta0 / t ** power_t`` where ``t`` is the
        1-based epoch (onnxcustom's default schedule, that of
        ``SGDRegressor(learning_rate='invscaling')`` with the rate changed
        once per epoch).
    eta0 : float, default=0.01
        Initial learning rate of the string schedules (onnxcustom's default).
    power_t : float, default=0.25
        Exponent of ``'invscaling'`` (onnxcustom's default).
    momentum : float, default=0.0
        Momentum of ``optimizer='sgd'`` (scikit-learn's convention).
    batch_size : int, default=10
        Rows per mini-batch (onnxcustom's default).
    device : str, default='cpu'
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'``.
    warm_start : bool, default=False
        Continue from the previous fit: weights, optimizer state, epoch
        count and random generator (two warm fits of ``k`` epochs equal one
        fit of ``2k``). The fitted weights belong to their graph: a warm
        start after ``set_params`` changed ``model_onnx`` or
        ``weights_to_train`` raises a ``ValueError`` rather than train the
        old graph; set ``warm_start=False`` to train the new one.
    verbose : int, default=0
        Print the loss of each epoch when > 0.
    validation_every : float or int, default=0.1
        With ``X_val`` given to ``fit``: compute the validation loss every
        ``validation_every`` epochs (an int >= 1) or every
        ``max(1, round(validation_every * max_iter))`` epochs (a float in
        (0, 1), onnxcustom's meaning). 0 disables it.
    sample_weight_name : str, default='weight'
        Name of the graph's sample-weight input. When the graph has it and
        ``fit`` gets no ``sample_weight``, ones are fed.
    random_state : int, RandomState instance or None, default=None
        Shuffling of the rows at each epoch. Not None also asks for
        onnxruntime's deterministic kernels on a GPU.
    shuffle : bool, default=True
        Shuffle the rows at each epoch.
    exc : bool, default=True
        What ``fit`` does when training diverges (the loss or a weight is no
        longer finite): True raises :class:`~ortlearn.exceptions.ConvergenceError`,
        False warns with a :class:`~sklearn.exceptions.ConvergenceWarning` and
        returns (onnxcustom's ``exc``). Either way training stops and the
        weights of the last finite epoch are kept.

    Attributes
    ----------
    state_ : dict of str to numpy.ndarray
        The trained weights (use :meth:`get_state`).
    train_losses_ : list of float
        Mean training loss of each epoch (penalties included), weighted by
        batch size.
    validation_losses_ : list of float
        Validation losses, one every ``validation_every`` epochs.
    n_iter_ : int
        Epochs run (summed over warm starts).
    input_names_ : list of str
        The data inputs: X, the label, then the sample weight if any.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.datasets import make_regression
    >>> from sklearn.linear_model import LinearRegression
    >>> from skl2onnx import to_onnx
    >>> from ortlearn import add_loss_output, OrtGradientOptimizer
    >>> X, y = make_regression(200, n_features=10, noise=1.0, random_state=0)
    >>> X, y = X.astype(np.float32), y.astype(np.float32)
    >>> onx = to_onnx(LinearRegression().fit(X, y), X, black_op={'LinearRegressor'})
    >>> onx_loss = add_loss_output(onx, weight_name='weight', score_name='elastic',
    ...                            l1_weight=0.1, l2_weight=0.9,
    ...                            penalty={'coef': {'l2': 0.01}})
    >>> train_session = OrtGradientOptimizer(onx_loss, ['intercept', 'coef'],
    ...                                      learning_rate=1e-3, random_state=0)
    >>> train_session.fit(X, y, np.ones(200, dtype=np.float32))  # doctest: +ELLIPSIS
    OrtGradientOptimizer(...)
    >>> state_tensors = train_session.get_state()
    >>> losses = train_session.train_losses_
    >>> bool(losses[-1] < losses[0])
    True
    """

    _parameter_constraints: dict = {
        # load_model raises the clear errors (TypeError, ValueError) on a bad model.
        "model_onnx": "no_validation",
        "weights_to_train": ["array-like", None],
        "loss_output_name": [str],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "optimizer": [StrOptions({"sgd", "adam", "adamw"}), Optimizer],
        "learning_rate": [StrOptions({"constant", "invscaling"}),
                          Interval(Real, 0, None, closed="neither")],
        "eta0": [Interval(Real, 0, None, closed="neither")],
        "power_t": [Interval(Real, 0, None, closed="left")],
        "momentum": [Interval(Real, 0, 1, closed="both")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        # parse_device (at the start of fit) checks the string and CUDA's presence.
        "device": [str],
        "warm_start": ["boolean"],
        "verbose": ["verbose"],
        "validation_every": [Interval(Real, 0, 1, closed="left"),
                             Interval(Integral, 1, None, closed="left")],
        "sample_weight_name": [str],
        "random_state": ["random_state"],
        "shuffle": ["boolean"],
        "exc": ["boolean"],
    }

    def __init__(self, model_onnx, weights_to_train=None, loss_output_name="loss", max_iter=100,
                 optimizer="sgd", learning_rate="invscaling", eta0=0.01, power_t=0.25,
                 momentum=0.0, batch_size=10, device="cpu", warm_start=False, verbose=0,
                 validation_every=0.1, sample_weight_name="weight", random_state=None,
                 shuffle=True, exc=True):
        self.model_onnx = model_onnx
        self.weights_to_train = weights_to_train
        self.loss_output_name = loss_output_name
        self.max_iter = max_iter
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.momentum = momentum
        self.batch_size = batch_size
        self.device = device
        self.warm_start = warm_start
        self.verbose = verbose
        self.validation_every = validation_every
        self.sample_weight_name = sample_weight_name
        self.random_state = random_state
        self.shuffle = shuffle
        self.exc = exc

    # ------------------------------------------------------------ parameters
    def _optimizer_spec(self) -> Optimizer:
        if isinstance(self.optimizer, Optimizer):
            return self.optimizer
        if self.optimizer == "adam":
            return Adam()
        if self.optimizer == "adamw":
            return TorchAdamW()
        return SGD(momentum=self.momentum)

    def _learning_rate_at(self, epoch: int) -> float:
        """Learning rate of the 1-based ``epoch``."""
        if self.learning_rate == "invscaling":
            return self.eta0 / epoch ** self.power_t
        if self.learning_rate == "constant":
            return self.eta0
        return float(self.learning_rate)

    def _validation_period(self) -> int:
        ve = self.validation_every
        if ve == 0:
            return 0
        return int(ve) if ve >= 1 else max(1, round(ve * self.max_iter))

    # -------------------------------------------------------------- the graph
    def _read_graph(self) -> None:
        """Loss model, trained weights and the roles of the data inputs."""
        model = load_model(self.model_onnx)
        outputs = [o.name for o in model.graph.output]
        if self.loss_output_name not in outputs:
            raise ValueError(f"The graph has no output {self.loss_output_name!r} (outputs: "
                             f"{outputs}); add a loss with ortlearn.add_loss_output.")
        weights = (get_train_initializer(model) if self.weights_to_train is None
                   else list(self.weights_to_train))
        inits = {i.name for i in model.graph.initializer}
        data = [i.name for i in model.graph.input if i.name not in inits]
        weight = self.sample_weight_name if self.sample_weight_name in data else None
        labels = [n for n in data[1:] if n != weight]
        if len(labels) != 1:
            raise ValueError(f"Expected the data inputs X, a label and optionally "
                             f"{self.sample_weight_name!r}; the graph's data inputs are {data}.")
        self._loss_model = model
        self._weights = weights
        self.input_names_ = [data[0], labels[0]] + ([weight] if weight else [])
        declared = {i.name: i for i in model.graph.input}
        self._input_info = {n: (onnx_to_np_dtype(elem_type_of(declared[n])),
                                shape_of(declared[n])) for n in self.input_names_}
        self._prediction_outputs = [o for o in outputs if o != self.loss_output_name]

    def _new_engine(self, initial_weights=None, n_rows=None) -> TrainingEngine:
        batch_rows = self.batch_size if n_rows is None else min(self.batch_size, n_rows)
        return TrainingEngine(self._loss_model, self._weights, self._optimizer_spec(),
                              device=self.device, input_names=self.input_names_,
                              loss_output=self.loss_output_name, initial_weights=initial_weights,
                              batch_size=batch_rows,
                              deterministic=self.random_state is not None)

    def _engine(self) -> TrainingEngine:
        """The engine of the running fit, else one rebuilt from ``state_``.

        A fitted estimator keeps its weights and optimizer state, not a
        training session: a warm start, ``set_state`` and ``score`` rebuild one.
        """
        if self._runtime.engine is not None:
            return self._runtime.engine
        if not hasattr(self, "_loss_model"):
            self._read_graph()
        engine = self._new_engine(self.state_)
        engine.load_optimizer_state(self._optimizer_state)
        return engine

    # ------------------------------------------------------------------ data
    def _arrays(self, X, y, sample_weight) -> list[np.ndarray]:
        """X, label (and weights) as the graph declares them; ValueError on bad data."""
        x_name, y_name = self.input_names_[:2]
        info = self._input_info
        X = as_real("X", X, info[x_name][0])
        if X.ndim != 2 or X.shape[0] == 0:
            raise ValueError(f"X must be a non-empty 2-D array, got shape {X.shape}.")
        check_finite("X", X)
        declared = info[x_name][1]
        if declared and len(declared) == 2 and isinstance(declared[1], int) \
                and declared[1] != X.shape[1]:
            raise ValueError(f"X has {X.shape[1]} features, the graph's input {x_name!r} "
                             f"expects {declared[1]}.")
        n = X.shape[0]
        y = as_real("y", y, info[y_name][0])
        if y.ndim == 0 or y.shape[0] != n:
            raise ValueError(f"X has {n} rows but y has shape {y.shape}.")
        y = self._as_label(y, info[y_name][1], y_name)
        check_finite("y", y)
        arrays = [np.ascontiguousarray(X), np.ascontiguousarray(y)]
        if len(self.input_names_) == 3:
            dtype = info[self.input_names_[2]][0]
            sample_weight = check_sample_weight(sample_weight, n, dtype)
            arrays.append(np.ones(n, dtype=dtype) if sample_weight is None else sample_weight)
        elif sample_weight is not None:
            raise ValueError(f"sample_weight was given but the graph has no input "
                             f"{self.sample_weight_name!r}: build it with "
                             f"add_loss_output(..., weight_name={self.sample_weight_name!r}).")
        return arrays

    @staticmethod
    def _as_label(y: np.ndarray, shape, name: str) -> np.ndarray:
        rank = None if shape is None else len(shape)
        if rank == 2 and y.ndim == 1:
            y = y.reshape(-1, 1)
        elif rank == 1 and y.ndim == 2 and y.shape[1] == 1:
            y = y.ravel()
        if rank is not None and y.ndim != rank:
            raise ValueError(f"y has shape {y.shape}, the graph's label {name!r} has rank "
                             f"{rank}.")
        if rank == 2 and isinstance(shape[1], int) and y.shape[1] != shape[1]:
            raise ValueError(f"y has {y.shape[1]} columns, the graph's label {name!r} "
                             f"expects {shape[1]}.")
        return y

    # ------------------------------------------------------------------- fit
    @_fit_context(prefer_skip_nested_validation=True)
    @serialized
    def fit(self, X, y, sample_weight=None, X_val=None, y_val=None):
        """Train the weights for ``max_iter`` epochs of mini-batch gradient descent.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
        sample_weight : array-like of shape (n_samples,), default=None
            Fed to the graph's ``sample_weight_name`` input (ones if None).
        X_val, y_val : array-like, default=None
            Validation data for ``validation_losses_``.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Bad parameters, NaN/inf or badly shaped data, negative or all-zero
            sample weights, unknown weights.
        TypeError
            Complex or non-numeric data.
        ConvergenceError
            Training diverged (``exc=True``); the last finite weights are kept
            and the estimator stays usable.

        Warns
        -----
        ConvergenceWarning
            Training diverged and ``exc=False``.
        UserWarning
            On KeyboardInterrupt: training stops, the weights reached so far
            are kept.
        """
        parse_device(self.device)
        continuing = self._continues()
        if continuing:
            self._check_same_graph()
        else:
            self._read_graph()
            # what a warm start must continue: the graph and weights these were fitted on
            self._fitted_graph = {"model_onnx": self.model_onnx,
                                  "weights_to_train": _as_list(self.weights_to_train)}
        arrays = self._arrays(X, y, sample_weight)
        val = None
        if X_val is not None:
            if y_val is None:
                raise ValueError("X_val was given without y_val.")
            val = self._arrays(X_val, y_val, None)
        if continuing:
            engine = self._engine()
        else:
            engine = self._new_engine(n_rows=len(arrays[0]))
            self._rng = check_random_state(self.random_state)
            self.train_losses_, self.validation_losses_, self.n_iter_ = [], [], 0
        self._runtime = _SessionCache()
        self._runtime.engine = engine
        try:
            return self._run_epochs(engine, arrays, val)
        finally:
            # The training session, its buffers and threads are not kept with the model.
            self._runtime.engine = None

    def _run_epochs(self, engine, arrays, val):
        period = self._validation_period()
        n = arrays[0].shape[0]

        def train_epoch(number: int) -> float:
            epoch = self.n_iter_ + 1
            engine.set_learning_rate(self._learning_rate_at(epoch))
            batches = Batches.for_epoch(n, self.batch_size, self._rng if self.shuffle else None)
            return engine.train_epoch(arrays, batches)

        def after_epoch(number: int, loss: float) -> bool:
            self.n_iter_ += 1
            if val is not None and period and self.n_iter_ % period == 0:
                self.validation_losses_.append(engine.eval_loss(val))
            if self.verbose:
                verbose_log(f"[OrtGradientOptimizer] epoch {self.n_iter_}: loss={loss:.6g}")
            return False

        def on_diverged(error: ConvergenceError, number: int) -> None:
            message = f"{error} (epoch {self.n_iter_ + 1})"
            if self.exc:
                self._store(engine)
                raise ConvergenceError(message) from error
            warnings.warn(message, ConvergenceWarning, stacklevel=user_stacklevel())

        run_epochs(self.max_iter, train_epoch, self.train_losses_, after_epoch=after_epoch,
                   on_diverged=on_diverged)
        self._store(engine)
        return self

    def _continues(self) -> bool:
        """Whether ``fit`` goes on from the previous fit (a subclass may mean otherwise)."""
        return self.warm_start and hasattr(self, "state_")

    def _check_same_graph(self) -> None:
        """Refuse a warm start after ``set_params(model_onnx=...)`` or ``weights_to_train``.

        The fitted weights belong to the graph they were trained on: continuing
        them would train the old graph and ignore the new parameter.
        """
        fitted = getattr(self, "_fitted_graph", None)
        if fitted is None:  # fitted by an older version: nothing to compare with
            return
        current = {"model_onnx": self.model_onnx,
                   "weights_to_train": _as_list(self.weights_to_train)}
        for name, old in fitted.items():
            new = current[name]
            if new is old or _same(new, old):
                continue
            raise ValueError(
                f"{name} was changed since the fit: warm_start=True continues the weights "
                f"trained on the previous {name} and would ignore the new one. Set "
                f"warm_start=False to train the new {name} from its initial weights, or set "
                f"{name} back to the value fitted.")

    def _store(self, engine: TrainingEngine) -> None:
        """Fitted attributes on the host (what pickling keeps)."""
        self.state_ = engine.get_state()
        self._optimizer_state = engine.optimizer_state()
        self._runtime.reset_predictions()

    # ------------------------------------------------------------ the weights
    def get_state(self) -> dict:
        """The trained weights.

        Returns
        -------
        dict of str to numpy.ndarray
            Copies, keyed by initializer name.
        """
        check_is_fitted(self, "state_")
        return {n: v.copy() for n, v in self.state_.items()}

    @serialized
    def set_state(self, state: dict) -> None:
        """Replace the trained weights (e.g. with those of :meth:`get_state`).

        Parameters
        ----------
        state : dict of str to array-like
            One value per trained weight, of its shape.

        Raises
        ------
        ValueError
            Naming unknown or missing weights, wrong shapes, or non-finite values.
        """
        check_is_fitted(self, "state_")
        for name, value in state.items():
            check_finite(f"Weight {name!r}", np.asarray(value))
        engine = self._engine()
        engine.set_state(state)
        self.state_ = engine.get_state()
        self._runtime.reset_predictions()

    def export_artifacts(self, directory, *, prefix: str = "") -> None:
        """Write the training artifacts of this training, to go on with ``ortlearn.api``.

        The files of :func:`ortlearn.artifacts.generate_artifacts`, in its
        format: the training and eval models of the loss graph (output
        ``loss_output_name``, user inputs the graph's data inputs), the
        optimizer model of ``optimizer`` and a checkpoint holding the
        current weights and optimizer state (moments, updates made, last
        learning rate). Unfitted: the graph's initial weights and a fresh
        optimizer state with the learning rate of the first epoch. A step of
        ``ortlearn.api`` on the batches and learning rate ``fit`` would use
        gives its weights, bit for bit on the CPU.

        Parameters
        ----------
        directory : str or path
            Where to write (created if missing).
        prefix : str, default=''
            Prefix of every file name.
        """
        self._validate_params()
        parse_device(self.device)
        fitted = hasattr(self, "state_")
        source = self if fitted else clone(self)
        if not fitted:
            source._read_graph()
        optimizer = source._optimizer_spec()
        state = source._optimizer_state if fitted else {
            "states": {}, "step": 0, "learning_rate": source._learning_rate_at(1)}
        if not fitted and optimizer.state_names:
            inits = {i.name: i for i in source._loss_model.graph.initializer}
            state["states"] = {n: optimizer.init_state(onnx.numpy_helper.to_array(inits[n]))
                               for n in source._weights}
        export_training_artifacts(source._loss_model, source._weights, optimizer, directory,
                                  weights=source.state_ if fitted else None,
                                  optimizer_state=state, loss_output=self.loss_output_name,
                                  prefix=prefix)

    def get_trained_onnx(self) -> onnx.ModelProto:
        """The inference graph with the trained weights.

        The original model's outputs only: the loss output, the label and
        sample-weight inputs and the nodes computing the loss are removed.

        Returns
        -------
        onnx.ModelProto
        """
        check_is_fitted(self, "state_")
        if not hasattr(self, "_loss_model"):
            self._read_graph()
        return prune_model(self._loss_model, self._prediction_outputs, self.state_)

    # --------------------------------------------------------------- predict
    def _inference(self):
        return self._runtime.inference_session(self.get_trained_onnx, self.device)

    def predict(self, X):
        """The first output of the original model, computed with the trained weights.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        numpy.ndarray

        Raises
        ------
        ValueError
            X is empty, not 2-D, has the wrong number of features, NaN or
            infinity.
        TypeError
            X is complex or not numeric.
        """
        check_is_fitted(self, "state_")
        sess = self._inference()
        info = sess.get_inputs()[0]
        X = as_real("X", X, _ORT_TYPES.get(info.type, np.float32))
        if X.ndim != 2 or X.shape[0] == 0:
            raise ValueError(f"X must be a non-empty 2-D array, got shape {X.shape}.")
        n_features = info.shape[1] if len(info.shape) == 2 else None
        if isinstance(n_features, int) and X.shape[1] != n_features:
            raise ValueError(f"X has {X.shape[1]} features, the graph's input {info.name!r} "
                             f"expects {n_features}.")
        check_finite("X", X)
        return sess.run([sess.get_outputs()[0].name], {info.name: X})[0]

    def score(self, X, y, sample_weight=None):
        """Minus the loss of the graph on ``(X, y)`` (greater is better, as sklearn wants).

        The loss is the graph's own: penalties included, weighted by
        ``sample_weight`` when the graph has a sample-weight input.

        Returns
        -------
        float
        """
        check_is_fitted(self, "state_")
        return -self._engine().eval_loss(self._arrays(X, y, sample_weight))


def _as_list(weights):
    """``weights_to_train`` as a comparable list (None stays None)."""
    return None if weights is None else [str(w) for w in weights]


def _same(new, old) -> bool:
    """Equal parameter values (a graph given again as the same path, bytes or proto)."""
    if type(new) is not type(old):
        return False
    try:
        return bool(new == old)
    except (TypeError, ValueError):  # values without a plain ==
        return False
