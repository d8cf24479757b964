"""Multi-layer perceptrons trained with onnxruntime: ``OrtMLPRegressor``, ``OrtMLPClassifier``."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.utils._param_validation import Interval, StrOptions

from ..convert import get_weights
from ..optim import SGD, Adam, TorchAdamW
from ..optim.schedules import Adaptive, Constant, InvScaling
from ._base import BaseOrtEstimator, OrtClassifierMixin, OrtRegressorMixin
from ._objective import mlp_objective
from ._scores import mlp_scores

__all__ = ["OrtMLPClassifier", "OrtMLPRegressor"]


class BaseOrtMLP(BaseOrtEstimator):
    """Shared parameters and hooks of the two MLPs (not for direct use)."""

    _parameter_constraints: dict = {
        "hidden_layer_sizes": ["array-like", Interval(Integral, 1, None, closed="left")],
        "activation": [StrOptions({"identity", "logistic", "tanh", "relu"})],
        "solver": [StrOptions({"sgd", "adam", "adamw", "lbfgs"})],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "batch_size": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
        "learning_rate": [StrOptions({"constant", "invscaling", "adaptive"})],
        "learning_rate_init": [Interval(Real, 0, None, closed="neither")],
        "power_t": [Interval(Real, 0, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "shuffle": ["boolean"],
        "random_state": ["random_state"],
        "tol": [Interval(Real, 0, None, closed="left")],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "momentum": [Interval(Real, 0, 1, closed="both")],
        "nesterovs_momentum": ["boolean"],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(Real, 0, 1, closed="left")],
        "beta_1": [Interval(Real, 0, 1, closed="left")],
        "beta_2": [Interval(Real, 0, 1, closed="left")],
        "epsilon": [Interval(Real, 0, None, closed="neither")],
        "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
        "max_fun": [Interval(Integral, 1, None, closed="left")],
        "device": [str],
    }

    _counterpart_class = None
    _architecture_params = ("hidden_layer_sizes",)

    def __init__(self, hidden_layer_sizes=(100,), activation="relu", *, solver="adam",
                 alpha=0.0001, batch_size="auto", learning_rate="constant",
                 learning_rate_init=0.001, power_t=0.5, max_iter=200, shuffle=True,
                 random_state=None, tol=1e-4, verbose=False, warm_start=False, momentum=0.9,
                 nesterovs_momentum=True, early_stopping=False, validation_fraction=0.1,
                 beta_1=0.9, beta_2=0.999, epsilon=1e-8, n_iter_no_change=10, max_fun=15000,
                 device="cpu"):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.warm_start = warm_start
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.n_iter_no_change = n_iter_no_change
        self.max_fun = max_fun
        self.device = device

    def _make_counterpart(self):
        params = {name: getattr(self, name) for name in self._counterpart_class().get_params()
                  if hasattr(self, name)}
        params["solver"] = "adam" if self.solver == "adamw" else self.solver
        return self._counterpart_class(**params)

    def _scores_model(self, values: bool, probabilities: bool = False):
        # no conversion: the objective reads only the scores, the predictions the
        # probabilities too (module _scores; to_onnx converts)
        return mlp_scores(get_weights(self.estimator_), self._kind(), self.activation,
                          self._dtype, values,
                          log_link=getattr(self, "loss", "squared_error") == "poisson",
                          probabilities=probabilities)

    def _prediction_model(self, values: bool = True):
        return self._scores_model(values, probabilities=True)

    def _objective(self, inference_model, kind, sum_in_float64=False, weighted=True):
        # AdamW decays the weights itself (decoupled): no L2 term in the loss.
        alpha = 0.0 if self.solver == "adamw" else self.alpha
        return mlp_objective(inference_model, kind, alpha, sum_in_float64, weighted,
                             loss=getattr(self, "loss", "squared_error"))

    def _optimizer(self):
        if self.solver == "sgd":
            return SGD(momentum=self.momentum,
                       nesterov=self.nesterovs_momentum and self.momentum > 0)
        if self.solver == "adam":
            return Adam(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)
        return TorchAdamW(betas=(self.beta_1, self.beta_2), eps=self.epsilon,
                          weight_decay=self.alpha)

    def _make_schedule(self):
        if self.solver != "sgd" or self.learning_rate == "constant":
            return Constant(self.learning_rate_init)
        if self.learning_rate == "invscaling":
            return InvScaling(self.learning_rate_init, self.power_t)
        return Adaptive(self.learning_rate_init)

    def _learning_rates(self, sizes, first_step):
        # sklearn's MLP changes the rate between epochs: invscaling uses the
        # number of samples seen so far.
        return self._schedule.learning_rate(self.t_ + 1), None

    def _predict_from_outputs(self, values):
        raise NotImplementedError

    def _fit_lbfgs(self, X, y_enc, sample_weight, device) -> None:
        # MLP*'s L-BFGS leaves t_ as it was (0 after a fresh fit): it counts
        # the samples of the stochastic solvers only. It has no epochs to
        # compare and no validation split (early_stopping is ignored), and sets
        # none of best_loss_, validation_scores_, best_validation_score_: None here.
        t = self.t_
        try:
            super()._fit_lbfgs(X, y_enc, sample_weight, device)
        finally:
            self.t_ = t
            self.best_loss_ = self.best_validation_score_ = None
            self.validation_scores_ = self.validation_losses_ = None

    def _lbfgs_options(self) -> dict:
        # MLP*'s scipy.optimize.minimize call sets maxfun, maxiter and gtol only:
        # scipy's L-BFGS-B defaults for the rest (LogisticRegression's differ).
        return {"ftol": 2.220446049250313e-09, "maxls": 20}

    # The fitted attributes of the counterpart that ``estimator_`` holds, read
    # from it (the weights trained in onnxruntime are written back there).
    @property
    def coefs_(self) -> list:
        """``coefs_[i]``: the weights of layer ``i`` (``estimator_.coefs_``)."""
        return self.estimator_.coefs_

    @property
    def intercepts_(self) -> list:
        """``intercepts_[i]``: the bias of layer ``i + 1`` (``estimator_.intercepts_``)."""
        return self.estimator_.intercepts_

    @property
    def n_layers_(self) -> int:
        """Number of layers, input and output included."""
        return self.estimator_.n_layers_

    @property
    def n_outputs_(self) -> int:
        """Number of outputs (targets, labels, or 1 for two classes)."""
        return self.estimator_.n_outputs_

    @property
    def out_activation_(self) -> str:
        """Activation of the output layer (``'identity'``, ``'exp'``, ``'logistic'``,
        ``'softmax'``)."""
        return self.estimator_.out_activation_


class OrtMLPRegressor(OrtRegressorMixin, BaseOrtMLP):
    """Multi-layer perceptron regressor trained with onnxruntime.

    The parameters, the initial weights (from ``random_state``), the
    batches and the update rules are those of
    :class:`sklearn.neural_network.MLPRegressor`; the training steps run in
    onnxruntime (on ``device``) and ``predict`` runs the trained ONNX graph.

    Objective (the one ``MLPRegressor`` descends), per mini-batch with
    sample weights ``w`` (ones by default)::

        0.5 * sum_k sum_i w_i (y_ik - p_ik)^2 / sum_i w_i
            + 0.5 * alpha * sum_layers ||W||^2 / sum_i w_i

    i.e. half the mean squared error (summed over the outputs, as
    ``MLPRegressor``'s gradient is) plus the L2 penalty divided by the
    number of rows of the batch; intercepts are not penalised. With
    ``loss='poisson'`` the data term is the half Poisson deviance
    ``sum_k sum_i w_i (p_ik - y_ik log p_ik + xlogy(y_ik, y_ik) - y_ik) / sum_i w_i``
    of ``p = exp(r)``, ``r`` the output layer before its activation.

    Parameters
    ----------
    hidden_layer_sizes : array-like of shape (n_layers - 2,), default=(100,)
        Number of units of each hidden layer.
    activation : {'identity', 'logistic', 'tanh', 'relu'}, default='relu'
        Activation of the hidden layers.
    loss : {'squared_error', 'poisson'}, default='squared_error'
        ``MLPRegressor``'s loss: ``'squared_error'`` (identity output) or
        ``'poisson'``, the half Poisson deviance of an exponential output
        activation (``out_activation_ == 'exp'``): predictions are
        ``exp(r)``, positive, and the inference graph of :meth:`to_onnx`
        ends with an ``Exp``. Targets should be non-negative (counts,
        rates); as ``MLPRegressor``, negative values are not refused (the
        gradient ``exp(r) - y`` is defined; ortlearn's ``loss_`` stays finite
        where scikit-learn's is NaN). Keyword-only here: ``MLPRegressor``
        takes it as its first positional parameter, ortlearn keeps
        ``OrtMLPRegressor((16,))`` meaning ``hidden_layer_sizes``.
    solver : {'adam', 'sgd', 'adamw', 'lbfgs'}, default='adam'
        ``'adam'`` and ``'sgd'``: scikit-learn's update rules;
        ``'adamw'``: Adam with decoupled weight decay ``alpha`` applied to
        every weight (the L2 term leaves the loss); ``'lbfgs'``: full-batch
        L-BFGS-B (scipy), the loss and gradients computed by onnxruntime.
    alpha : float, default=0.0001
        Strength of the L2 penalty.
    batch_size : int or 'auto', default='auto'
        Rows per mini-batch; ``'auto'`` is ``min(200, n_samples)``.
    learning_rate : {'constant', 'invscaling', 'adaptive'}, default='constant'
        Schedule of ``solver='sgd'``, as in scikit-learn (the rate changes
        between epochs).
    learning_rate_init : float, default=0.001
        Initial learning rate (``'sgd'``, ``'adam'``, ``'adamw'``).
    power_t : float, default=0.5
        Exponent of ``'invscaling'``.
    max_iter : int, default=200
        Maximum number of epochs (iterations for ``'lbfgs'``).
    shuffle : bool, default=True
        Shuffle the samples at each epoch.
    random_state : int, RandomState instance or None, default=None
        Initial weights, shuffling and validation split; an int gives
        identical predictions from one fit to the next (on a GPU, a
        ``random_state`` that is not None also asks onnxruntime for
        deterministic kernels).
    tol : float, default=1e-4
        Improvement below which an epoch counts as no improvement.
    verbose : bool, default=False
        Print one line per epoch: epoch, loss, validation score, elapsed time.
    warm_start : bool, default=False
        Start ``fit`` from the current weights. Those weights fix the
        architecture: a warm start after ``set_params(hidden_layer_sizes=...)``
        or on targets with another number of outputs (or, for classifiers,
        other classes) raises a ``ValueError`` rather than train the old
        shapes; set ``warm_start=False`` to fit a new model (scikit-learn's
        MLPs fail on such a warm start with ``solver='lbfgs'`` and on other
        classes; with the other solvers they keep training the old shapes).
        Data with another number of features are refused as by ``predict``.
    momentum : float, default=0.9
        Momentum of ``solver='sgd'``.
    nesterovs_momentum : bool, default=True
        Nesterov's momentum (``solver='sgd'``).
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the data, stop when its R² stops
        improving and keep the weights of the best epoch.
    validation_fraction : float, default=0.1
        Size of the validation split.
    beta_1, beta_2 : float, default=0.9, 0.999
        Adam's moment decay rates.
    epsilon : float, default=1e-8
        Adam's epsilon.
    n_iter_no_change : int, default=10
        Epochs without improvement (by ``tol``) before stopping.
    max_fun : int, default=15000
        Maximum number of loss evaluations of ``'lbfgs'``.
    device : str, default='cpu'
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'`` (needs onnxruntime-gpu).

    Attributes
    ----------
    estimator_ : MLPRegressor
        The scikit-learn MLP holding the trained weights.
    coefs_ : list of ndarray of shape (n_units[i], n_units[i + 1])
        Weights of each layer (``estimator_.coefs_``), in the training dtype.
    intercepts_ : list of ndarray of shape (n_units[i + 1],)
        Biases of each layer (``estimator_.intercepts_``).
    n_layers_ : int
        Number of layers, input and output included.
    n_outputs_ : int
        Number of targets.
    out_activation_ : {'identity', 'exp'}
        Output activation (``'exp'`` for ``loss='poisson'``).
    train_losses_, loss_curve_ : list of float
        Training loss of each epoch (``solver='lbfgs'``: the final loss;
        scikit-learn sets no ``loss_curve_`` for L-BFGS).
    loss_ : float
        Last training loss.
    validation_losses_, validation_scores_ : list of float or None
        Loss and R² on the validation split (``early_stopping=True``; None
        otherwise, as scikit-learn).
    best_validation_score_ : float or None
        Best validation R² (``early_stopping=True``; None otherwise).
    best_loss_ : float or None
        Smallest training loss (``early_stopping=False``; None otherwise).
        After ``solver='lbfgs'``, which scikit-learn fits without either,
        these three are None.
    n_iter_ : int
        Epochs run (iterations for ``solver='lbfgs'``).
    t_ : int
        Training samples seen by the stochastic solvers (0 after an L-BFGS
        fit, as scikit-learn).
    n_features_in_ : int
    feature_names_in_ : ndarray of str

    See Also
    --------
    sklearn.neural_network.MLPRegressor : The scikit-learn estimator.
    OrtMLPClassifier : The classifier.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtMLPRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(100, 3)
    >>> y = X @ [1.0, -2.0, 0.5]
    >>> reg = OrtMLPRegressor(hidden_layer_sizes=(16,), max_iter=300, random_state=0).fit(X, y)
    >>> bool(reg.score(X, y) > 0.9)
    True
    >>> counts = rng.poisson(np.exp(0.3 * X[:, 0]))
    >>> reg = OrtMLPRegressor(hidden_layer_sizes=(8,), loss='poisson', max_iter=50,
    ...                       learning_rate_init=0.01, random_state=0).fit(X, counts)
    >>> reg.out_activation_, bool((reg.predict(X) > 0).all())
    ('exp', True)
    """

    _counterpart_class = MLPRegressor
    _multi_output = True
    # the output activation (identity or exp) of the fitted weights follows loss
    _architecture_params = ("hidden_layer_sizes", "loss")

    _parameter_constraints: dict = {
        **BaseOrtMLP._parameter_constraints,
        "loss": [StrOptions({"squared_error", "poisson"})],
    }

    # ``loss`` is keyword-only: MLPRegressor takes it as its first positional
    # parameter, ortlearn keeps ``OrtMLPRegressor((16,))`` meaning the hidden layers.
    def __init__(self, hidden_layer_sizes=(100,), activation="relu", *,
                 loss="squared_error", solver="adam", alpha=0.0001, batch_size="auto",
                 learning_rate="constant", learning_rate_init=0.001, power_t=0.5,
                 max_iter=200, shuffle=True, random_state=None, tol=1e-4, verbose=False,
                 warm_start=False, momentum=0.9, nesterovs_momentum=True,
                 early_stopping=False, validation_fraction=0.1, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-8, n_iter_no_change=10, max_fun=15000, device="cpu"):
        super().__init__(
            hidden_layer_sizes=hidden_layer_sizes, activation=activation, solver=solver,
            alpha=alpha, batch_size=batch_size, learning_rate=learning_rate,
            learning_rate_init=learning_rate_init, power_t=power_t, max_iter=max_iter,
            shuffle=shuffle, random_state=random_state, tol=tol, verbose=verbose,
            warm_start=warm_start, momentum=momentum, nesterovs_momentum=nesterovs_momentum,
            early_stopping=early_stopping, validation_fraction=validation_fraction,
            beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, n_iter_no_change=n_iter_no_change,
            max_fun=max_fun, device=device)
        self.loss = loss

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        # the Poisson deviance is defined for y >= 0 (MLPRegressor does not check y)
        tags.target_tags.positive_only = self.loss == "poisson"
        return tags


class OrtMLPClassifier(OrtClassifierMixin, BaseOrtMLP):
    """Multi-layer perceptron classifier trained with onnxruntime.

    The parameters, the initial weights (from ``random_state``), the
    batches and the update rules are those of
    :class:`sklearn.neural_network.MLPClassifier`; the training steps run in
    onnxruntime and the predictions come from the trained ONNX graph.
    Binary, multiclass and multilabel targets (a 0/1 indicator matrix
    ``y`` of shape (n_samples, n_labels): one sigmoid output per label,
    ``classes_`` is ``arange(n_labels)`` and ``predict`` returns the
    indicator matrix, as ``MLPClassifier``).

    Objective (``MLPClassifier``'s), per mini-batch with sample weights
    ``w`` (ones by default), computed from the logits ``z``::

        sum_i w_i logloss(y_i, z_i) / sum_i w_i
            + 0.5 * alpha * sum_layers ||W||^2 / sum_i w_i

    with the binary log-loss of one logit for two classes, the
    multinomial cross-entropy of the softmax for more, and the sum of the
    binary log-losses of the labels for multilabel targets; intercepts are
    not penalised.

    Parameters
    ----------
    hidden_layer_sizes : array-like of shape (n_layers - 2,), default=(100,)
        Number of units of each hidden layer.
    activation : {'identity', 'logistic', 'tanh', 'relu'}, default='relu'
    solver : {'adam', 'sgd', 'adamw', 'lbfgs'}, default='adam'
        See :class:`OrtMLPRegressor`.
    alpha : float, default=0.0001
    batch_size : int or 'auto', default='auto'
        ``'auto'`` is ``min(200, n_samples)``.
    learning_rate : {'constant', 'invscaling', 'adaptive'}, default='constant'
    learning_rate_init : float, default=0.001
    power_t : float, default=0.5
    max_iter : int, default=200
    shuffle : bool, default=True
    random_state : int, RandomState instance or None, default=None
    tol : float, default=1e-4
    verbose : bool, default=False
    warm_start : bool, default=False
        As :class:`OrtMLPRegressor`: a warm start after changing
        ``hidden_layer_sizes``, or on targets with other classes, raises a
        ``ValueError``; set ``warm_start=False`` to fit a new model.
    momentum : float, default=0.9
    nesterovs_momentum : bool, default=True
    early_stopping : bool, default=False
        Stratified validation split; the weights of the best epoch (by
        accuracy) are kept.
    validation_fraction : float, default=0.1
    beta_1, beta_2 : float, default=0.9, 0.999
    epsilon : float, default=1e-8
    n_iter_no_change : int, default=10
    max_fun : int, default=15000
    device : str, default='cpu'
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'``.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels (``arange(n_labels)`` for multilabel targets).
    estimator_ : MLPClassifier
        The scikit-learn MLP holding the trained weights.
    coefs_ : list of ndarray of shape (n_units[i], n_units[i + 1])
    intercepts_ : list of ndarray of shape (n_units[i + 1],)
    n_layers_ : int
    n_outputs_ : int
        1 for two classes, the number of classes or of labels otherwise.
    out_activation_ : {'logistic', 'softmax'}
    train_losses_, loss_curve_ : list of float
    loss_ : float
    validation_losses_, validation_scores_ : list of float or None
        Loss and accuracy (subset accuracy for multilabel targets) on the
        validation split (``early_stopping=True``; None otherwise).
    best_validation_score_, best_loss_ : float or None
        As :class:`OrtMLPRegressor`.
    n_iter_ : int
    t_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of str

    See Also
    --------
    sklearn.neural_network.MLPClassifier : The scikit-learn estimator.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtMLPClassifier
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(100, 2)
    >>> y = (X[:, 0] + X[:, 1] > 0).astype(int)
    >>> clf = OrtMLPClassifier(hidden_layer_sizes=(8,), max_iter=300, random_state=0).fit(X, y)
    >>> bool(clf.score(X, y) > 0.9)
    True
    >>> Y = np.c_[y, X[:, 0] > 0]  # two labels
    >>> clf = OrtMLPClassifier(hidden_layer_sizes=(8,), max_iter=300, random_state=0).fit(X, Y)
    >>> clf.classes_, clf.predict(X[:2]).shape, clf.out_activation_
    (array([0, 1]), (2, 2), 'logistic')
    """

    _counterpart_class = MLPClassifier

    # -------------------------------------------------------------- multilabel
    # A 0/1 indicator matrix y (n_samples, n_labels) trains one logistic output
    # per label with the summed binary log-losses, as MLPClassifier does;
    # classes_ is then arange(n_labels) and predict returns the indicator matrix.
    _multilabel_targets = True

    def _is_multilabel(self) -> bool:
        return getattr(self, "_multilabel", False)

    def _kind(self) -> str:
        return "multilabel" if self._is_multilabel() else super()._kind()

    def _prepare_classes(self, y, classes, incremental: bool, first: bool) -> None:
        multilabel = y.ndim == 2
        if not first and multilabel != self._is_multilabel():
            fitted = "a multilabel indicator matrix" if self._is_multilabel() else "labels"
            raise ValueError(
                f"The model was fitted on {fitted} and y is "
                f"{'a multilabel indicator matrix' if multilabel else 'a vector of labels'}: "
                "partial_fit and warm_start=True continue the same outputs. Call fit with "
                "warm_start=False to fit a new model.")
        if not multilabel:
            if first:
                self._multilabel = False
            super()._prepare_classes(y, classes, incremental, first)
            return
        n_labels = y.shape[1]
        if first:
            if incremental and classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit.")
            self._multilabel = True
            self.classes_ = np.arange(n_labels)
        elif n_labels != len(self.classes_):
            raise ValueError(
                f"y has {n_labels} labels (columns) but the model was fitted with "
                f"{len(self.classes_)}: partial_fit and warm_start=True continue the same "
                "outputs. Call fit with warm_start=False to fit a new model.")

    def _encode_target(self, y):
        if self._is_multilabel():
            return np.asarray(y).astype(self._dtype)
        return super()._encode_target(y)

    def _predict_from_outputs(self, values):
        if self._is_multilabel():
            # sklearn thresholds the probabilities at 0.5 (int indicator matrix)
            return (values["probabilities"] > 0.5).astype(int)
        return super()._predict_from_outputs(values)

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`, from the logits (finite where exp underflows).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            For multilabel targets, ``log(sigmoid(z))`` of each label's logit.
        """
        if not self._is_multilabel():
            return super().predict_log_proba(X)
        raw = self._run_inference(X, ["raw_scores"])["raw_scores"]
        return -np.logaddexp(0, -raw)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True
        return tags
