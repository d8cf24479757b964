"""Shared fit logic of the scikit-learn-native estimators.

:class:`BaseOrtEstimator` is to ortlearn's estimators what
``BaseMultilayerPerceptron`` is to scikit-learn's MLPs: it validates the
data, builds the counterpart estimator (``estimator_``) whose weights are
initialised as scikit-learn does, turns it into an ONNX loss graph, trains
it with a :class:`~ortlearn.training.TrainingEngine` (or
:func:`~ortlearn.training.minimize_lbfgs`) and writes the trained
weights back.

Subclasses must provide the counterpart (``_make_counterpart``), the
objective (``_objective``), the optimizer (``_optimizer``), the
learning-rate schedule (``_make_schedule``, ``_learning_rates``) and the
predictions (``_predict_from_outputs``, given by the regressor and
classifier mixins); these are abstract methods. The steps of the epoch loop
(``_build_engine``, ``_run_epoch``, ``_update_no_improvement``,
``_log_epoch``) may be overridden, as in skorch; their contracts are in
:class:`BaseOrtEstimator`'s docstring.
"""

from __future__ import annotations

import copy
import time
import warnings
from abc import ABC, abstractmethod

import numpy as np
import onnx
from sklearn.base import (
    BaseEstimator,
    ClassifierMixin,
    RegressorMixin,
    _fit_context,
    is_classifier,
)
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import (
    check_is_fitted,
    column_or_1d,
    validate_data,
)

from ..convert import get_weights, init_template, set_weights, to_train_onnx
from ..exceptions import ConvergenceError, ConvergenceWarning
from ..graph import weights_to_inputs
from ..log import user_stacklevel, verbose_log
from ..training import (
    Batches,
    TrainingEngine,
    conform_state,
    make_session,
    minimize_lbfgs,
    parse_device,
)
from ..training.engine import DEFAULT_BATCH_ROWS
from ..training.loop import run_epochs
from ..training.sparse import (
    dense_blocks,
    is_sparse,
    paddable,
    padded_rows,
    rows_as_gathers,
    sparse_epoch,
)
from ._callbacks import CallbackSupportMixin, current_task, fit_task
from ._objective import LOSS, SAMPLE_WEIGHT, input_names, label_dtype
from ._session_cache import _SessionCache, serialized
from ._validation import check_in_range, check_sample_weight

__all__ = ["BaseOrtEstimator"]

_FLOAT_DTYPES = (np.float64, np.float32)


#: the inputs of a graph that reads X's rows as padded indices and values (rows_as_gathers)
X_ROWS = ("X.indices", "X.values")


def _graph_inputs(names, X, y_enc, sample_weight) -> list:
    """The arrays of the objective inputs ``names``, ones for weights the user did not give.

    A fit without weights has a graph without the ``sample_weight`` input;
    the weighted graph of a ``partial_fit`` that got weights earlier reads
    ones. A graph reading X's rows sparse gets them padded (dense X too: the
    validation rows).
    """
    dtype = X.dtype
    data = list(padded_rows(X)) if names[0] == X_ROWS[0] else [X]
    if SAMPLE_WEIGHT not in names:
        return [*data, y_enc]
    if sample_weight is None:
        sample_weight = np.ones(X.shape[0], dtype)
    return [*data, y_enc, sample_weight]


class BaseOrtEstimator(CallbackSupportMixin, BaseEstimator, ABC):
    """Base class of ortlearn's scikit-learn-native estimators (not for direct use).

    Subclasses define the parameters (``__init__`` and
    ``_parameter_constraints``) and implement the abstract hooks:

    - ``_make_counterpart()``: an unfitted scikit-learn estimator with this
      one's hyper-parameters (its weights are initialised as scikit-learn
      does, then trained);
    - ``_objective(inference_model, kind, sum_in_float64, weighted)``: the
      loss graph;
    - ``_optimizer()``: the :mod:`ortlearn.optim` update rule;
    - ``_make_schedule()`` and ``_learning_rates()``: the learning-rate
      schedule and the rates it gives;
    - ``_predict_from_outputs(values)``: predictions from the inference
      graph's outputs (:class:`OrtRegressorMixin` and
      :class:`OrtClassifierMixin` provide it).

    A subclass may also override the steps of the epoch loop of the
    mini-batch solvers (``solver='lbfgs'`` uses none of them), calling
    ``super()`` to keep the default behaviour around its own:

    ``_build_engine(X, device, weighted) -> TrainingEngine``
        Called when ``fit`` starts (and when a ``partial_fit`` first gets
        sample weights). Returns the engine that trains the weights of
        ``estimator_``: the graph of ``_loss_model(weighted=weighted)``, data
        inputs ``input_names(weighted)``, loss output ``'loss'``, the update
        rule of ``_optimizer()``, and ``self._optimizer_state`` loaded when it
        is not None (``partial_fit`` continues the optimizer).
    ``_epoch_rows(n_samples, batch_size) -> int``
        Before each epoch: the rows of its mini-batches (``batch_size``, the
        fit's, unless the subclass changes it from epoch to epoch).
    ``_run_epoch(engine, train, batches) -> float``
        One pass over the data. ``train`` is the list of arrays fed to the
        graph (X, encoded y, and the sample weights when the graph reads
        them), ``batches`` the row indices of each mini-batch, already
        shuffled for this epoch. Sets the learning rate (from
        ``_learning_rates(batches.sizes, engine.n_steps + 1)``), runs the
        batches and returns the epoch's training loss. A
        :class:`~ortlearn.exceptions.ConvergenceError` stops the fit with the
        last finite weights kept.
    ``_update_no_improvement(engine, loss, validation)``
        After each epoch, once ``train_losses_``, ``loss_``, ``n_iter_`` and
        ``t_`` are updated. ``validation`` is None, or ``(X_val, y_val,
        y_val_encoded, sample_weight_val)`` with ``early_stopping=True``.
        Updates ``self._no_improvement_count``: once it exceeds
        ``n_iter_no_change`` (reaches it when ``_stop_after_exceeding`` is
        False) the loop asks the schedule's ``on_plateau()``, which stops the
        fit or lowers the rate (``'adaptive'``). Also updates ``best_loss_``
        (no validation) or ``validation_scores_``, ``validation_losses_``,
        ``best_validation_score_`` and ``self._best_state``, the weights put
        back at the end of the fit when not None.
    ``_log_epoch(elapsed)``
        After the bookkeeping of each epoch; ``elapsed`` is the time in
        seconds since the loop started. Output only (the default prints one
        line when ``verbose``); it changes no state.

    Attributes
    ----------
    estimator_ : estimator
        The scikit-learn counterpart holding the trained weights; it predicts
        without ortlearn.
    train_losses_ : list of float
        Training objective of each epoch (mean of the batch losses, weighted
        by the batch sizes); the final loss for ``solver='lbfgs'``.
    loss_curve_ : list of float
        Same list as ``train_losses_`` (scikit-learn's name).
    loss_ : float
        Last value of ``train_losses_``.
    validation_losses_ : list of float or None
        Objective on the validation split after each epoch
        (``early_stopping=True`` only).
    validation_scores_ : list of float or None
        Score (R² or accuracy) on the validation split after each epoch
        (``early_stopping=True`` only).
    best_validation_score_ : float or None
        Best validation score (``early_stopping=True`` only).
    best_loss_ : float or None
        Smallest training loss (``early_stopping=False`` only).
    n_iter_ : int
        Epochs run by the last call to ``fit`` or ``partial_fit`` (L-BFGS
        iterations for ``solver='lbfgs'``).
    t_ : int
        Number of training samples seen.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when X has feature names that are all strings.

    Notes
    -----
    ``fit``, ``partial_fit`` and ``set_state`` of one estimator called from
    several threads run one after another. After ``fit`` the estimator keeps
    the weights and the optimizer state, not the training session (its
    buffers and threads are returned): a kept fitted model costs its
    weights, the optimizer's moments and, once it predicts, one inference
    session. ``partial_fit`` builds the training session on its first call
    and keeps it for the calls that follow.
    """

    #: True: a classifier that takes multilabel indicator matrices y (MLP).
    _multilabel_targets = False

    #: True: stop once the count of epochs without improvement exceeds
    #: ``n_iter_no_change`` (MLP); False: once it reaches it (SGD).
    _stop_after_exceeding = True

    # ------------------------------------------------------------------ hooks
    @abstractmethod
    def _make_counterpart(self):
        """An unfitted scikit-learn estimator with this one's hyper-parameters."""

    @abstractmethod
    def _objective(self, inference_model: onnx.ModelProto, kind: str,
                   sum_in_float64: bool = False, weighted: bool = True) -> onnx.ModelProto:
        """The loss graph (inputs ``X``, ``y``, ``sample_weight``; output ``loss``).

        ``sum_in_float64``: a float32 graph sums its row losses in float64
        (full-batch L-BFGS). ``weighted=False``: no ``sample_weight`` input.
        """

    @abstractmethod
    def _optimizer(self):
        """The ortlearn.optim update rule of ``solver``."""

    @abstractmethod
    def _make_schedule(self):
        """The learning-rate schedule (``ortlearn.optim.schedules``)."""

    @abstractmethod
    def _learning_rates(self, sizes, first_step: int):
        """``(rate for the next epoch or None, per-step callable or None)``.

        For an epoch of updates of ``sizes`` rows each, the first of which is
        the optimizer's step ``first_step`` (1-based, counted over the fit).
        """

    #: Rows per mini-batch of ``batch_size='auto'`` (at most n_samples).
    _auto_batch_size = DEFAULT_BATCH_ROWS

    #: Rows of an update of the engine last built (``_batch_size`` of its data).
    _update_rows = 1

    def _batch_size(self, n_samples: int, warn: bool = True) -> int:
        if self.batch_size == "auto":
            return min(self._auto_batch_size, n_samples)
        if self.batch_size > n_samples and warn:
            warnings.warn(f"Got batch_size={self.batch_size} larger than the {n_samples} "
                          "samples; it is clipped.", stacklevel=user_stacklevel())
        return int(np.clip(self.batch_size, 1, n_samples))

    def _epoch_rows(self, n_samples: int, batch_size: int) -> int:
        return batch_size

    # ------------------------------------------------------------------- data
    def _kind(self) -> str:
        if not is_classifier(self):
            return "regressor"
        return "binary" if len(self.classes_) == 2 else "multiclass"

    def _validate_xy(self, X, y, reset: bool):
        """X (float64 or float32, kept), y as scikit-learn takes it."""
        # X keeps its float dtype here: the cast to the model's dtype (_as_model_dtype)
        # names the columns that overflow it rather than sklearn's "infinity" message.
        dtype = _FLOAT_DTYPES
        # Sparse X stays sparse (CSR: rows are sliced per block, training/sparse.py).
        sparse = {"accept_sparse": "csr"}
        if is_classifier(self):
            X, y = validate_data(self, X, y, reset=reset, dtype=dtype, multi_output=True,
                                 **sparse)
            if y.ndim == 2 and y.shape[1] > 1:
                if not self._multilabel_targets:
                    raise ValueError(
                        f"{type(self).__name__} does not support multilabel or multi-output "
                        f"targets: y has {y.shape[1]} columns. Fit one estimator per column.")
                if type_of_target(y) != "multilabel-indicator":
                    raise ValueError(
                        f"{type(self).__name__} takes a multilabel indicator matrix (0/1) "
                        f"but not multi-output targets of other values: y has {y.shape[1]} "
                        "columns. Fit one estimator per column.")
                return X, y
            y = column_or_1d(y, warn=True)
            check_classification_targets(y)
        else:
            X, y = validate_data(self, X, y, reset=reset, dtype=dtype, y_numeric=True,
                                 multi_output=self._multi_output, **sparse)
            if not self._multi_output:
                y = column_or_1d(y, warn=True)
        return X, y

    def _as_model_dtype(self, X) -> np.ndarray:
        """X in the model's dtype; ValueError naming the columns that overflow it."""
        check_in_range("X", X.data if is_sparse(X) else X, self._dtype)
        return X.astype(self._dtype, copy=False)

    def _encode_target(self, y) -> np.ndarray:
        """y as the graph's ``y`` input: floats (n, k), 0/1 column, or class indices."""
        kind = self._kind()
        if kind == "regressor":
            y = np.asarray(y)
            check_in_range("y", y, self._dtype)
            y = y.astype(self._dtype, copy=False)
            return y.reshape(len(y), -1)
        unknown = np.setdiff1d(y, self.classes_)
        if unknown.size:
            raise ValueError(f"y contains labels {unknown.tolist()} not in classes_ "
                             f"{self.classes_.tolist()}.")
        index = np.searchsorted(self.classes_, y)
        if kind == "binary":
            return index.astype(self._dtype).reshape(-1, 1)
        return index.astype(label_dtype(kind, self._dtype))

    def _set_classes(self, y, classes) -> None:
        if classes is not None:
            self.classes_ = np.unique(np.asarray(classes))
        else:
            self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise ValueError(
                f"{type(self).__name__} needs samples of at least 2 classes in the data, "
                f"but the data contains only one class: {self.classes_[0]!r}.")

    # ------------------------------------------------------------------- fit
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the model to X and y.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data (float32 data trains in float32, anything else in
            float64).
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Target values (class labels for classifiers).
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights, not all zero.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        return self._fit(X, y, sample_weight, incremental=False)

    def _partial_fit(self, X, y, sample_weight=None, classes=None):
        if self.solver == "lbfgs":
            raise ValueError("partial_fit is not available for solver='lbfgs'; use "
                             "'sgd', 'adam' or 'adamw'.")
        if self.early_stopping:
            raise ValueError("partial_fit does not support early_stopping=True.")
        return self._fit(X, y, sample_weight, incremental=True, classes=classes)

    @serialized
    def _fit(self, X, y, sample_weight, incremental: bool, classes=None):
        first = not hasattr(self, "estimator_") or (not self.warm_start and not incremental)
        device = parse_device(self.device)
        X, y = self._validate_xy(X, y, reset=first)
        if not first:
            # before anything changes: a failed call leaves n_iter_, weights and curves as
            # they were. A warm start or partial_fit continues the fitted weights, so it
            # must not be asked for other shapes (sklearn's MLP fails on them too).
            self._check_architecture(incremental)
            if not is_classifier(self):
                self._check_n_outputs(y, incremental)
        if first:
            self._dtype = np.dtype(X.dtype)
        X = self._as_model_dtype(X)
        sample_weight = check_sample_weight(sample_weight, X.shape[0], X.dtype)
        if is_classifier(self):
            self._prepare_classes(y, classes, incremental, first)
        y_enc = self._encode_target(y)
        if first:
            self._initialize(X, y)
        else:
            # As scikit-learn: each call draws from a fresh generator.
            self._random_state = check_random_state(self.random_state)
        runtime = self._runtime
        if first or not incremental:
            # fit (warm start included) starts a new optimizer and schedule, as sklearn does.
            runtime.engine, self._optimizer_state = None, None
            self._schedule = self._make_schedule()
        # a fit is a task of scikit-learn's callbacks, each epoch a subtask (_fit_epochs)
        n_epochs = 0 if self.solver == "lbfgs" else 1 if incremental else self.max_iter
        with fit_task(self, X, y, sample_weight, n_epochs):
            self._fit_solver(X, y, y_enc, sample_weight, incremental, device)
        return self

    def _fit_solver(self, X, y, y_enc, sample_weight, incremental: bool, device) -> None:
        """L-BFGS, or the epochs of a mini-batch solver on the training engine."""
        runtime = self._runtime
        if self.solver == "lbfgs":
            self._fit_lbfgs(X, y_enc, sample_weight, device)
        else:
            engine = runtime.engine
            if engine is None or (sample_weight is not None
                                  and SAMPLE_WEIGHT not in engine.input_names) or (
                    (engine.input_names[0] == X_ROWS[0]) != self._reads_rows(X)):
                # A partial_fit with weights after calls without them gets the weighted
                # graph (sparse data after dense, the graph reading rows sparse), which
                # starts from the weights and optimizer state saved so far.
                runtime.engine = self._build_engine(X, device, sample_weight is not None)
            kept = self._bookkeeping() if incremental else None
            try:
                self._fit_epochs(runtime.engine, X, y, y_enc, sample_weight, incremental)
            except BaseException:
                if incremental:
                    # a failed partial_fit (a callback that raised, Ctrl-C) leaves the model
                    # as before the call: its weights and optimizer state are those of
                    # estimator_ and _optimizer_state, which the next call's engine reads
                    runtime.engine = None
                    self._restore_bookkeeping(kept)
                raise
            finally:
                if not incremental:
                    # A kept fitted model holds its weights (and the optimizer state that
                    # partial_fit continues from), not the training session, its buffers
                    # and threads; partial_fit rebuilds the engine from them, then keeps it
                    # for the calls that follow.
                    runtime.engine = None

    #: Counters an epoch advances (each, or its length for a list).
    _BOOKKEEPING = ("t_", "n_iter_", "loss_", "best_loss_", "best_validation_score_",
                    "_no_improvement_count", "train_losses_", "validation_losses_",
                    "validation_scores_")

    def _bookkeeping(self) -> dict:
        """The counters and curves an epoch advances, to restore after a failed call."""
        saved = {}
        for name in self._BOOKKEEPING:
            value = getattr(self, name, None)
            saved[name] = len(value) if isinstance(value, list) else value
        return saved

    def _restore_bookkeeping(self, saved: dict) -> None:
        for name, value in saved.items():
            current = getattr(self, name, None)
            if isinstance(current, list):
                del current[value:]  # in place: loss_curve_ is the same list
            else:
                setattr(self, name, value)

    def _fitted_now(self, engine) -> dict:
        """What a callback's ``fitted_estimator`` predicts with: the epoch's weights in a
        copy of the counterpart, and its own onnxruntime sessions."""
        estimator = copy.deepcopy(self.estimator_)
        set_weights(estimator, engine.get_state())
        return {"estimator_": estimator, "_runtime": _SessionCache()}

    def _check_n_outputs(self, y, incremental: bool = True) -> None:
        """Refuse a partial_fit or warm-start target with another number of outputs."""
        expected = getattr(self.estimator_, "n_outputs_", 1)
        n_outputs = 1 if y.ndim == 1 else y.shape[1]
        if n_outputs != expected:
            if incremental:
                how, remedy = "partial_fit continues", "or call fit to start a new model"
            else:
                how, remedy = ("warm_start=True continues",
                               "or set warm_start=False to fit a new model")
            raise ValueError(
                f"y has {n_outputs} output(s) (columns) but {type(self).__name__} was fitted "
                f"with {expected}: {how} the same model. Pass targets of "
                f"shape (n_samples, {expected}), {remedy}.")

    #: parameters that set the shapes of the weights (an MLP's hidden_layer_sizes)
    _architecture_params: tuple = ()

    def _architecture(self) -> dict:
        """``{parameter: value}`` of :attr:`_architecture_params`, comparable values."""
        return {name: tuple(np.atleast_1d(getattr(self, name)).tolist())
                for name in self._architecture_params}

    def _check_architecture(self, incremental: bool) -> None:
        """Refuse to continue fitted weights whose shapes the parameters changed.

        A warm start (or partial_fit) would otherwise train the old shapes and
        ignore the new value without a word.
        """
        fitted = getattr(self, "_fitted_architecture", None)
        if fitted is None:
            return
        for name, new in self._architecture().items():
            old = fitted.get(name, new)
            if new != old:
                shown_old, shown_new = self._fitted_values[name], getattr(self, name)
                how = ("partial_fit continues" if incremental
                       else "warm_start=True continues")
                raise ValueError(
                    f"{name}={shown_new!r} is not the value the model was fitted with "
                    f"({shown_old!r}): {how} the fitted weights, whose shapes it sets. Set "
                    f"warm_start=False to fit a new model with {name}={shown_new!r}, or set "
                    f"{name} back to {shown_old!r}.")

    def _prepare_classes(self, y, classes, incremental: bool, first: bool) -> None:
        if incremental and not hasattr(self, "classes_"):
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit.")
            self._set_classes(y, classes)
        elif incremental and classes is not None and not np.array_equal(
                np.unique(classes), self.classes_):
            raise ValueError(f"classes={np.unique(classes).tolist()} is not the same as on "
                             f"the first call to partial_fit: {self.classes_.tolist()}.")
        elif first and not incremental:
            self._set_classes(y, None)
        elif not incremental:
            # A warm start continues the fitted outputs, one per class: new labels would
            # need other shapes (scikit-learn's MLPClassifier refuses them too).
            new = np.setdiff1d(np.unique(y), self.classes_)
            if new.size:
                raise ValueError(
                    f"y contains the labels {new.tolist()} the model was not fitted with "
                    f"(classes_={self.classes_.tolist()}): warm_start=True continues the "
                    "fitted outputs, one per class. Set warm_start=False to fit a new model "
                    "on these classes.")

    def _initialize(self, X, y) -> None:
        """Fresh counterpart (sklearn's initial weights), curves and counters."""
        if is_classifier(self):
            # A row per class: init_template learns the classes from y.
            X0 = np.zeros((len(self.classes_), X.shape[1]), dtype=self._dtype)
            # multilabel (y an indicator matrix): a row per label, one label each
            y0 = np.eye(len(self.classes_), dtype=np.int64) if y.ndim == 2 else self.classes_
            template = init_template(self._make_counterpart(), X0, y0, check_input=False)
        else:
            # The initial weights depend on the shapes only: one dense row stands for X
            # (validated already).
            row = X[:1].toarray() if is_sparse(X) else X[:1]
            template = init_template(self._make_counterpart(), row, y[:1], check_input=False)
        self.estimator_ = template
        # what _check_architecture compares a warm start or partial_fit with
        self._fitted_architecture = self._architecture()
        self._fitted_values = {n: getattr(self, n) for n in self._architecture_params}
        # MLPs keep drawing from the generator that initialised the weights, as sklearn does.
        self._random_state = getattr(template, "_random_state", None) or check_random_state(
            self.random_state)
        self._runtime = _SessionCache()
        self._optimizer_state = None
        self._update_rows = self._batch_size(X.shape[0], warn=False)
        self.train_losses_ = []
        self.loss_curve_ = self.train_losses_
        self.validation_losses_ = [] if self.early_stopping else None
        self.validation_scores_ = [] if self.early_stopping else None
        self.best_validation_score_ = -np.inf if self.early_stopping else None
        self.best_loss_ = None if self.early_stopping else np.inf
        self._no_improvement_count = 0
        self.n_iter_ = 0
        self.t_ = 0

    def _inference_model(self, values: bool = True) -> onnx.ModelProto:
        """``to_train_onnx`` of ``estimator_`` (the trained inference graph); without
        ``values``, the weights' initializers are stubs."""
        sample = np.zeros((1, self.n_features_in_), dtype=self._dtype)
        return to_train_onnx(self.estimator_, sample, dtype=self._dtype, values=values)

    def _loss_model(self, sum_in_float64: bool = False, weighted: bool = True,
                    values: bool = False):
        """The objective's graph and its trained weights' names. Without ``values`` the
        weights are stubs: the training session takes ``get_weights(estimator_)`` as its
        ``initial_weights``, and no graph holds a copy of them."""
        model = self._objective(self._scores_model(values), self._kind(), sum_in_float64,
                                weighted)
        return model, list(get_weights(self.estimator_))

    def _scores_model(self, values: bool) -> onnx.ModelProto:
        """The graph :meth:`_objective` reads: the inference graph (its prediction output)."""
        return self._inference_model(values)

    def _prediction_model(self, values: bool = True) -> onnx.ModelProto:
        """The graph predictions run (outputs :meth:`_output_names` at least): the inference
        graph."""
        return self._inference_model(values)

    def _reads_rows(self, X) -> bool:
        """Whether the training graph reads X's rows sparse (training/sparse.py): a CSR X
        whose padded rows stay near its non-zeros, read only by products with weights."""
        return is_sparse(X) and paddable(X) and self._sparse_rows_supported

    #: whether the objective reads X only through products with weights (its first layer)
    _sparse_rows_supported = True

    def _build_engine(self, X, device, weighted: bool) -> TrainingEngine:
        """Loss graph → training session, from the weights of ``estimator_``."""
        model, trainable = self._loss_model(weighted=weighted)
        names = input_names(weighted)
        if self._reads_rows(X):
            model = rows_as_gathers(model, names[0], trainable)
            names = [*X_ROWS, *names[1:]]
        self._update_rows = self._batch_size(X.shape[0], warn=False)
        engine = TrainingEngine(model, trainable, self._optimizer(), device=str(device),
                                initial_weights=get_weights(self.estimator_),
                                input_names=names, loss_output=LOSS,
                                batch_size=self._update_rows,
                                deterministic=self.random_state is not None)
        if self._optimizer_state is not None:
            engine.load_optimizer_state(self._optimizer_state)
        return engine

    def _fit_lbfgs(self, X, y_enc, sample_weight, device) -> None:
        weighted = sample_weight is not None
        model, trainable = self._loss_model(sum_in_float64=True, weighted=weighted)
        names = input_names(weighted)
        try:
            result = minimize_lbfgs(
                model, trainable, get_weights(self.estimator_),
                _graph_inputs(names, X, y_enc, sample_weight), names,
                device=str(device), max_iter=self.max_iter, tol=self._lbfgs_tol(),
                verbose=int(self.verbose), loss_output=LOSS, max_fun=self._max_fun(),
                deterministic=self.random_state is not None,
                remedy="The last finite weights are kept; scale the data or increase alpha.",
                **self._lbfgs_options())
        except ConvergenceError as error:
            self.n_iter_ = error.n_iter
            self.t_ += X.shape[0] * max(error.n_iter, 1)
            # Keep the weights L-BFGS ended on where they are finite (the loss is not).
            if all(np.isfinite(w).all() for w in error.weights.values()):
                self._store_weights(error.weights)
            raise
        self.n_iter_ = result.n_iter
        self.t_ += X.shape[0] * max(result.n_iter, 1)
        self.train_losses_.append(result.loss)
        self.loss_ = result.loss
        self._store_weights(result.weights)

    def _lbfgs_tol(self) -> float:
        return self.tol if self.tol is not None else 0.0

    def _lbfgs_options(self) -> dict:
        """Other options of :func:`minimize_lbfgs` (``ftol``, ``maxls``): its defaults."""
        return {}

    def _max_fun(self) -> int:
        return getattr(self, "max_fun", 15000)

    # ---------------------------------------------------------------- epochs
    def _split(self, X, y, y_enc, sample_weight):
        """Training and validation parts (stratified for classifiers), as sklearn's MLP."""
        if not self.early_stopping:
            return (X, y_enc, sample_weight), None
        # as sklearn's MLP: no stratification of multilabel targets
        stratify = y if is_classifier(self) and y.ndim == 1 else None
        weights = [] if sample_weight is None else [sample_weight]
        X_tr, X_val, yenc_tr, yenc_val, _, y_val, *sw = train_test_split(
            X, y_enc, y, *weights, random_state=self._random_state,
            test_size=self.validation_fraction, stratify=stratify)
        sw_tr, sw_val = sw or (None, None)
        if is_sparse(X_val):
            # scored after every epoch by whole-data graphs: the validation rows densified
            X_val = X_val.toarray()
        if X_val.shape[0] < 2:
            raise ValueError("The validation set is too small. Increase "
                             "'validation_fraction' or the size of your dataset.")
        return (X_tr, yenc_tr, sw_tr), (X_val, y_val, yenc_val, sw_val)

    def _fit_epochs(self, engine, X, y, y_enc, sample_weight, incremental: bool) -> None:
        """The epoch loop: shuffle, batches, one epoch, bookkeeping, stopping."""
        train, validation = self._split(X, y, y_enc, sample_weight)
        train = _graph_inputs(engine.input_names, *train)
        n_samples = train[0].shape[0]
        batch_size = self._batch_size(n_samples)
        order = np.arange(n_samples)
        batches = Batches(order, batch_size)  # views of order: they follow its shuffles
        self.n_iter_ = 0
        self._best_state = None
        start = time.perf_counter()
        task = current_task(self)

        def train_epoch(number: int) -> float:
            nonlocal batches
            if task is not None:
                task.begin_subtask("epoch")
            if self.shuffle:
                # In place: the rows and draws of sklearn's order[permutation(n)], no copy.
                self._random_state.shuffle(order)
            rows = self._epoch_rows(n_samples, batch_size)
            if rows != len(batches[0]):
                batches = Batches(order, rows)
            return self._run_epoch(engine, train, batches)

        def after_epoch(number: int, loss: float) -> bool:
            self.n_iter_ += 1
            self.t_ += n_samples
            self.loss_ = loss
            self._update_no_improvement(engine, loss, validation)
            self._log_epoch(time.perf_counter() - start)
            if task is not None and task.end_subtask(lambda: self._fitted_now(engine)):
                return True
            if self._plateau() and self._schedule.on_plateau():
                if self.verbose:
                    verbose_log(self._stop_message())
                return True
            if self._plateau():
                self._no_improvement_count = 0
            if not incremental and self.n_iter_ == self.max_iter:
                self._warn_max_iter()
            return False

        def on_diverged(error: ConvergenceError, number: int) -> None:
            self._finish_epochs(engine, last=not incremental)
            raise error

        run_epochs(1 if incremental else self.max_iter, train_epoch, self.train_losses_,
                   after_epoch=after_epoch, on_diverged=on_diverged)
        self._finish_epochs(engine, last=not incremental)

    def _run_epoch(self, engine, train, batches) -> float:
        """One pass over ``batches``; returns the epoch's training loss."""
        lr_epoch, lr_for_step = self._learning_rates(batches.sizes, engine.n_steps + 1)
        if lr_epoch is not None:
            engine.set_learning_rate(lr_epoch)
        if is_sparse(train[0]):
            return sparse_epoch(engine, train, batches, lr_for_step=lr_for_step)
        return engine.train_epoch(train, batches, lr_for_step=lr_for_step)

    def _plateau(self) -> bool:
        count, limit = self._no_improvement_count, self.n_iter_no_change
        return count > limit if self._stop_after_exceeding else count >= limit

    def _tol(self) -> float:
        return -np.inf if self.tol is None else self.tol

    def _loss_tol(self) -> float:
        """The drop of the epoch's training loss that counts as an improvement."""
        return self._tol()

    def _update_no_improvement(self, engine, loss: float, validation) -> None:
        """Count epochs without improvement; keep the best weights when early stopping."""
        if validation is None:
            if loss > self.best_loss_ - self._loss_tol():
                self._no_improvement_count += 1
            else:
                self._no_improvement_count = 0
            self.best_loss_ = min(self.best_loss_, loss)
            return
        X_val, y_val, yenc_val, sw_val = validation
        state = engine.get_state()
        score = self._validation_score(state, X_val, y_val, sw_val)
        self.validation_scores_.append(score)
        self.validation_losses_.append(engine.eval_loss(
            _graph_inputs(engine.input_names, X_val, yenc_val, sw_val)))
        if score < self.best_validation_score_ + self._tol():
            self._no_improvement_count += 1
        else:
            self._no_improvement_count = 0
        if score > self.best_validation_score_:
            self.best_validation_score_ = score
            self._best_state = state

    def _validation_score(self, state, X_val, y_val, sw_val) -> float:
        """R² or accuracy of the weights ``state`` on the validation split."""
        session = self._runtime.validation_session
        if session is None:
            model = self._prediction_model(values=False)
            weights_to_inputs(model, list(state))
            session = make_session(model, "cpu")
            self._runtime.validation_session = session
        outputs = self._output_names()
        values = dict(zip(outputs, session.run(outputs, {"X": X_val, **state})))
        y_pred = self._predict_from_outputs(values)
        metric = accuracy_score if is_classifier(self) else r2_score
        return float(metric(y_val, y_pred, sample_weight=sw_val))

    def _stop_message(self) -> str:
        what = "Validation score" if self.early_stopping else "Training loss"
        return (f"{what} did not improve more than tol={self.tol} for "
                f"{self.n_iter_no_change} consecutive epochs. Stopping.")

    #: the counterpart's words when max_iter epochs end the fit: a user's warning filter
    #: written for scikit-learn's message catches ortlearn's
    _max_iter_warning = ("Stochastic Optimizer: Maximum iterations ({max_iter}) reached and "
                         "the optimization hasn't converged yet.")

    def _warn_max_iter(self) -> None:
        warnings.warn(self._max_iter_warning.format(max_iter=self.max_iter), ConvergenceWarning,
                      stacklevel=user_stacklevel())

    def _log_epoch(self, elapsed: float) -> None:
        """With ``verbose``: the counterpart's lines for the epoch, on the ``ortlearn`` logger.

        MLPs: ``Iteration %d, loss = %.8f`` (and ``Validation score: %f``);
        SGD's linear models: ``-- Epoch %d``, ``Norm: ..., NNZs: ..., Bias:
        ..., T: ..., Avg. loss: ..., Objective: ...`` and ``Total training
        time: %.2f seconds.`` (see :mod:`ortlearn.log`).
        """
        if not self.verbose:
            return
        if isinstance(self.estimator_, (SGDClassifier, SGDRegressor)):
            for line in self._sgd_epoch_lines(elapsed):
                verbose_log(line)
            return
        verbose_log(f"Iteration {self.n_iter_}, loss = {self.loss_:.8f}")
        if self.early_stopping:
            verbose_log(f"Validation score: {self.validation_scores_[-1]:f}")

    def _sgd_epoch_lines(self, elapsed: float) -> list[str]:
        """SGD's verbose lines (``sklearn/linear_model/_sgd_fast.pyx.tp``)."""
        engine = self._runtime.engine
        state = engine.get_state() if engine is not None else get_weights(self.estimator_)
        coef = np.ravel(state["coef"])
        bias = float(np.ravel(state["intercept"])[0]) if state["intercept"].size else 0.0
        # Avg. loss: the objective less the penalty of the epoch's last weights.
        ratio = {"l2": 0.0, "l1": 1.0, None: 0.0}.get(self.penalty, self.l1_ratio)
        alpha = 0.0 if self.penalty is None else self.alpha
        penalty = alpha * (ratio * np.abs(coef).sum() + (1 - ratio) * 0.5 * coef @ coef)
        line = (f"Norm: {np.linalg.norm(coef):.2f}, NNZs: {np.count_nonzero(coef)}, "
                f"Bias: {bias:.6f}, T: {self.t_}, Avg. loss: {self.loss_ - penalty:f}, "
                f"Objective: {self.loss_:f}")
        if self.early_stopping:
            line += f", Validation score: {self.validation_scores_[-1]:f}"
        return [f"-- Epoch {self.n_iter_}", line,
                f"Total training time: {elapsed:.2f} seconds."]

    def _finish_epochs(self, engine, last: bool = False) -> None:
        """Best weights back on the device (early stopping), weights into ``estimator_``.

        ``last``: the engine is not used again (a fit drops it), and gives its
        buffers away rather than copies of them (``TrainingEngine.take_state``).
        """
        if self._best_state is not None:
            engine.set_state(self._best_state)
        self._best_state = None
        self._runtime.validation_session = None
        engine.release_data()  # the device copy of X lives for one fit
        if last:
            weights, self._optimizer_state = engine.take_state()
        else:
            self._optimizer_state = engine.optimizer_state()
            weights = engine.get_state()
        # the engine's copies (or buffers it gave away) are stored as they are
        self._store_weights(weights, copy=False)

    def _store_weights(self, weights: dict, copy: bool = True) -> None:
        set_weights(self.estimator_, weights, copy=copy)
        self._runtime.reset_predictions()

    # ------------------------------------------------------------- state I/O
    def get_state(self) -> dict:
        """The trained weights, named as in the ONNX graph.

        Returns
        -------
        dict of str to ndarray
            Copies of the weights (``coef``/``intercept`` for linear models,
            ``coefficient``, ``intercepts``, ``coefficient1``, ... for MLPs).
        """
        check_is_fitted(self)
        return {k: np.array(v, copy=True) for k, v in get_weights(self.estimator_).items()}

    @serialized
    def set_state(self, state: dict) -> None:
        """Replace the weights (every name of :meth:`get_state`, same shapes).

        Parameters
        ----------
        state : dict of str to array-like

        Raises
        ------
        ValueError
            Unknown or missing names, wrong shapes, NaN or infinite values.
        """
        check_is_fitted(self)
        clean = conform_state(state, get_weights(self.estimator_))
        not_finite = [n for n, v in clean.items() if not np.isfinite(v).all()]
        if not_finite:
            raise ValueError(f"Invalid state: weights {not_finite} contain NaN or infinite "
                             "values.")
        if self._runtime.engine is not None:
            self._runtime.engine.set_state(clean)
        self._store_weights(clean)

    def export_artifacts(self, directory, X=None, y=None, *, weighted=None, prefix=""):
        """Write the training artifacts of this estimator, to go on with ``ortlearn.api``.

        The files of :func:`ortlearn.artifacts.generate_artifacts`, in its
        format (``doc/artifacts_format.md``): ``training_model.onnx`` and
        ``eval_model.onnx`` (the estimator's objective, penalties included,
        with the output ``loss``), ``optimizer_model.onnx`` (its ``solver``
        with its hyper-parameters) and ``checkpoint`` (the current weights
        and the optimizer state: moments, number of updates made, learning
        rate of the last update). The user inputs are ``X``, ``y`` (as the
        objective reads it: a float column ``(n, k)`` for regressors and
        binary classifiers (0/1, the index in ``classes_``), int64 class
        indices for more classes, the 0/1 floats ``(n, n_labels)`` of a
        multilabel classifier) and, with ``weighted``, ``sample_weight``.

        A training step of ``ortlearn.api`` on a batch (``lazy_reset_grad``,
        ``Module(X, y)``, ``Optimizer.step()``), with the learning rate the
        estimator would use (``set_learning_rate``: the schedule is the
        caller's), gives the weights ``partial_fit`` gives on the same
        batches, bit for bit on the CPU.

        Parameters
        ----------
        directory : str or path
            Where to write (created if missing); existing files are replaced.
        X, y : array-like, default=None
            Only for an unfitted estimator: the data ``fit`` would get, to
            write the initial weights ``fit(X, y)`` starts from (classes,
            ``random_state``) with a fresh optimizer state. The estimator
            itself is left unfitted.
        weighted : bool, default=None
            Give the training and eval models a ``sample_weight`` input.
            None: as the graph the estimator trains now (weighted when its
            last ``fit``/``partial_fit`` got sample weights).
        prefix : str, default=''
            Prefix of every file name.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            If the estimator is not fitted and no ``X`` is given.
        ValueError
            For ``solver='lbfgs'`` (no optimizer model), ``X`` given to a
            fitted estimator, a ``directory`` that cannot be written.
        """
        from ._export import export_estimator_artifacts

        export_estimator_artifacts(self, directory, X, y, weighted=weighted, prefix=prefix)

    def export_web(self, directory, X, y, X_test=None, y_test=None, *, epochs=5, js_dir=None):
        """Write the artifacts and a page that goes on training them in a web browser.

        The files of :meth:`export_artifacts` (the optimizer model in its tensor layout:
        onnxruntime's JavaScript API feeds no tensor sequences), then a static page that
        trains them with onnxruntime-web (WebGPU where the browser has it, WebAssembly
        otherwise) on ``X``, ``y``: ``index.html``, its script, ortlearn's JavaScript
        ``TrainingSession`` and onnxruntime-web's files, copied from the repository's ``js/``
        folder, ``data.safetensors`` (the data as the training model reads it) and
        ``task.json``. Serve the directory (``python -m http.server -d DIRECTORY``) and open
        it: the page shows the loss curve and the score on ``X_test``, ``y_test`` after each
        epoch, and offers the trained inference model and checkpoint for download
        (``doc/edge_training.rst``).

        Parameters
        ----------
        directory : str or path
            Where to write (created if missing); existing files are replaced.
        X, y : array-like
            The data the page trains on (dense). For an unfitted estimator, also the data
            of the initial weights, as :meth:`export_artifacts`.
        X_test, y_test : array-like, default=None
            Data the page scores the model on after each epoch.
        epochs : int, default=5
            Epochs the page trains, in batches of the estimator's ``batch_size``.
        js_dir : str or path, default=None
            The ``js/`` folder to copy from (its ``npm ci`` done); None: ``ORTLEARN_JS_DIR`` or
            the one of this checkout.

        Returns
        -------
        pathlib.Path
            What :func:`ortlearn.web.write_page` writes: ``directory/index.html``.

        Raises
        ------
        ValueError
            As :meth:`export_artifacts`; for sparse data, only one of ``X_test`` and
            ``y_test``, or a ``js/`` folder without its npm dependencies.
        """
        from ._export import export_estimator_web

        return export_estimator_web(self, directory, X, y, X_test, y_test, epochs=epochs,
                                    js_dir=js_dir)

    # ------------------------------------------------------------ prediction
    def to_onnx(self) -> onnx.ModelProto:
        """The trained inference model (``to_train_onnx`` of ``estimator_``).

        Returns
        -------
        onnx.ModelProto
            Input ``X``; outputs ``variable`` (regressors) or ``label``,
            ``probabilities``, ``raw_scores`` (classifiers).
        """
        check_is_fitted(self)
        return self._inference_model()

    def _output_names(self) -> list[str]:
        return ["variable"]

    def _run_inference(self, X, outputs) -> dict:
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=_FLOAT_DTYPES, accept_sparse="csr")
        X = self._as_model_dtype(X)
        session = self._runtime.inference_session(self._prediction_model, self.device)
        if not is_sparse(X):
            return dict(zip(outputs, session.run(outputs, {"X": X})))
        # A block of rows at a time: the memory of the non-zeros plus one dense block.
        parts = [session.run(outputs, {"X": block}) for block in dense_blocks(X)]
        return {name: np.concatenate([p[i] for p in parts]) for i, name in enumerate(outputs)}

    @abstractmethod
    def _predict_from_outputs(self, values: dict):
        """Predictions from the inference graph's outputs ``{name: array}``."""

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "estimator_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        tags.input_tags.sparse = True
        return tags


class OrtRegressorMixin(RegressorMixin):
    """``predict`` and ``partial_fit`` of ortlearn's regressors."""

    def predict(self, X):
        """Predict with the trained ONNX graph.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_outputs)
        """
        return self._predict_from_outputs(self._run_inference(X, self._output_names()))

    def _predict_from_outputs(self, values):
        pred = values["variable"]
        return pred.ravel() if pred.shape[1] == 1 else pred

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, sample_weight=None):
        """One epoch over X and y (starting from the current weights).

        One pass over the rows given, shuffled when ``shuffle``, in
        mini-batches, as one epoch of ``fit``: a data set larger than memory
        trains by a call per chunk (``dask_ml.wrappers.Incremental``,
        ``doc/scaling_out.rst``). The optimizer state carries over from call to
        call, through pickles and copies too.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        return self._partial_fit(X, y, sample_weight)


class OrtClassifierMixin(ClassifierMixin):
    """Predictions from the logits (``raw_scores``) and ``partial_fit`` of the classifiers."""

    def _output_names(self):
        return ["probabilities", "raw_scores"]

    def _predict_from_outputs(self, values):
        raw = values["raw_scores"]
        index = (raw[:, 0] > 0).astype(np.intp) if raw.shape[1] == 1 else raw.argmax(axis=1)
        return self.classes_[index]

    def predict(self, X):
        """Predict class labels.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_labels)
            The 0/1 indicator matrix for a classifier fitted on multilabel targets.
        """
        return self._predict_from_outputs(self._run_inference(X, self._output_names()))

    def predict_proba(self, X):
        """Class probabilities (sigmoid for two classes, softmax for more, a sigmoid per label).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        return self._run_inference(X, ["probabilities"])["probabilities"]

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`, from the logits (finite where exp underflows).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        raw = self._run_inference(X, ["raw_scores"])["raw_scores"]
        if raw.shape[1] == 1:
            raw = np.hstack([np.zeros_like(raw), raw])
        shifted = raw - raw.max(axis=1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, sample_weight=None, classes=None):
        """One epoch over X and y (starting from the current weights).

        One pass over the rows given, shuffled when ``shuffle``, in
        mini-batches, as one epoch of ``fit``: a data set larger than memory
        trains by a call per chunk (``dask_ml.wrappers.Incremental``,
        ``doc/scaling_out.rst``). The optimizer state carries over from call to
        call, through pickles and copies too.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_labels)
            Labels, or a multilabel indicator matrix (classifiers that take one).
        sample_weight : array-like of shape (n_samples,), default=None
        classes : array-like of shape (n_classes,), default=None
            Every class; required on the first call.

        Returns
        -------
        self : object
        """
        return self._partial_fit(X, y, sample_weight, classes=classes)
