"""Linear models trained with onnxruntime: ``OrtLinearRegressor``, ``OrtLinearClassifier``."""

from __future__ import annotations

from numbers import Real

from sklearn.linear_model import LogisticRegression, SGDRegressor
from sklearn.utils._param_validation import Interval, StrOptions

from ._base import OrtClassifierMixin
from ._docs import fill_doc
from ._linear_base import BaseOrtLinear
from ._objective import sgd_objective
from ._sgd import OrtSGDRegressor

__all__ = ["OrtLinearClassifier", "OrtLinearRegressor"]

_COMMON_PARAMS_DOC = """
    penalty : {'l2', 'l1', 'elasticnet'} or None, default='l2'
        Regularization term ``R``.
    alpha : float, default=0.0001
        Strength of the penalty (and scale of ``learning_rate='optimal'``).
    l1_ratio : float, default=0.15
        Elastic-net mixing (``penalty='elasticnet'`` only).
    fit_intercept : bool, default=True
        Learn an intercept (never penalised).
    max_iter : int, default=1000
        Maximum number of epochs (iterations for ``solver='lbfgs'``).
    tol : float or None, default=1e-3
        An epoch improves when the loss drops by more than ``tol`` (or the
        validation score rises by more than ``tol``); None never stops
        early. ``gtol`` of ``solver='lbfgs'``.
    shuffle : bool, default=True
        Shuffle the samples at each epoch.
    verbose : int, default=0
        Print one line per epoch: epoch, loss, validation score, elapsed time.
    random_state : int, RandomState instance or None, default=None
        Shuffling and validation split; an int gives identical predictions
        (on a GPU with onnxruntime's deterministic kernels, asked for
        whenever ``random_state`` is not None).
    learning_rate : {'constant', 'optimal', 'invscaling', 'adaptive'}
        Schedule of ``solver='sgd'``: ``eta0``; ``1 / (alpha * (t0 + t - 1))``;
        ``eta0 / t ** power_t``; ``eta0`` divided by 5 whenever
        ``n_iter_no_change`` epochs do not improve. ``t`` counts the
        optimizer steps (mini-batches), as SGD* count their per-sample steps.
    eta0 : float, default=0.01
        Initial learning rate (the rate of ``'adam'`` and ``'adamw'``).
    power_t : float
        Exponent of ``'invscaling'``.
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the data, stop when its score
        stops improving and keep the weights of the best epoch (as MLPs do;
        SGD* keep the last ones).
    validation_fraction : float, default=0.1
    n_iter_no_change : int, default=5
        Epochs without improvement before stopping (or lowering the
        ``'adaptive'`` rate).
    warm_start : bool, default=False
        Start ``fit`` from the current weights. A warm start (or
        ``partial_fit``) after changing ``fit_intercept``, or on targets with
        another number of outputs (or, for classifiers, other classes),
        raises a ``ValueError`` rather than train the fitted weights of the
        old form; set ``warm_start=False`` to fit a new model. Data with
        another number of features are refused as by ``predict``.
    solver : {'sgd', 'adam', 'adamw', 'lbfgs'}, default='sgd'
        ``'sgd'``: mini-batch SGD (``momentum``); ``'adam'``; ``'adamw'``:
        the L2 part of the penalty becomes AdamW's decoupled weight decay
        ``alpha * (1 - l1_ratio)``; ``'lbfgs'``: full-batch L-BFGS-B
        (smooth penalties only).
    batch_size : int or 'auto', default='auto'
        Rows per mini-batch: ``'auto'`` is ``min(16, n_samples)`` for
        :class:`OrtLinearRegressor` (its default ``'invscaling'`` rate, made
        for one sample per step, needs many steps per epoch) and
        ``min(200, n_samples)`` for :class:`OrtLinearClassifier`.
        scikit-learn's SGD* update the weights after every sample
        (``batch_size=1`` with ``shuffle=False`` reproduces them to 1e-9 for
        ``penalty='l2'`` or None with ``'constant'``/``'invscaling'`` rates;
        not the L1 truncation nor, to 1e-6, ``'optimal'``, whose large rates
        go through float32: :class:`OrtSGDRegressor` and
        :class:`OrtSGDClassifier` reproduce every case); mini-batches average
        the gradients of their rows, so the two reach the same minimum along
        different paths.
    momentum : float, default=0.0
        Momentum of ``solver='sgd'`` (scikit-learn's MLP convention).
    nesterovs_momentum : bool, default=False
    beta_1, beta_2 : float, default=0.9, 0.999
        Moment decay rates of ``'adam'`` and ``'adamw'``.
    device : str, default='cpu'
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'``."""


class OrtLinearRegressor(OrtSGDRegressor):
    """:class:`OrtSGDRegressor` trained with MLP-style mini-batch rules.

    The model and objective of :class:`OrtSGDRegressor` (whose ``solver``
    chooses between scikit-learn's per-sample updates, Adam, AdamW and
    L-BFGS); this class keeps its own parameters and defaults, and trains
    with the rules of scikit-learn's MLPs: ``solver='sgd'`` is mini-batch SGD
    with ``momentum``, a ``learning_rate`` schedule counting mini-batches and
    the L1 part of the penalty as a subgradient; ``early_stopping`` keeps the
    best epoch's weights; ``t_`` counts the samples from 0.

    Objective (the one of :class:`sklearn.linear_model.SGDRegressor`), with
    sample weights ``w`` (ones by default)::

        mean_i (w_i * L(y_i, x_i . coef + intercept)) + alpha * R(coef)
        R(coef) = (1 - l1_ratio) / 2 * ||coef||^2 + l1_ratio * ||coef||_1

    with ``L = 0.5 * (y - p)^2`` (``'squared_error'``) or the Huber loss of
    threshold ``epsilon``; ``penalty='l2'`` is ``l1_ratio=0``, ``'l1'`` is
    ``l1_ratio=1``. The optimizer differs from ``SGDRegressor``: mini-batches
    (``batch_size``) instead of one sample at a time, and the L1 part is a
    subgradient (no truncation to exact zeros); converged fits agree.

    Parameters
    ----------
    loss : {'squared_error', 'huber'}, default='squared_error'
        Data loss.
    epsilon : float, default=0.1
        Threshold of the Huber loss.
    learning_rate : {'constant', 'optimal', 'invscaling', 'adaptive'}, \
default='invscaling'
    power_t : float, default=0.25
    {common}

    Attributes
    ----------
    estimator_ : SGDRegressor
        The scikit-learn model holding the trained ``coef_`` and ``intercept_``.
    coef_ : ndarray of shape (n_features,)
    intercept_ : ndarray of shape (1,)
    train_losses_, loss_curve_ : list of float
        Objective of each epoch.
    validation_losses_, validation_scores_ : list of float or None
    n_iter_ : int
    t_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of str

    See Also
    --------
    OrtSGDRegressor : The same model with scikit-learn's updates, Adam or L-BFGS.
    sklearn.linear_model.SGDRegressor : The scikit-learn estimator.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtLinearRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(200, 3)
    >>> y = X @ [1.0, -2.0, 0.5] + 1.0
    >>> reg = OrtLinearRegressor(random_state=0).fit(X, y)
    >>> bool(reg.score(X, y) > 0.99)
    True
    """

    _parameter_constraints: dict = {
        **BaseOrtLinear._parameter_constraints,
        "loss": [StrOptions({"squared_error", "huber"})],
        "epsilon": [Interval(Real, 0, None, closed="left")],
    }

    _auto_batch_size = 16
    _ADDED_PARAMS = ()
    #: MLP's rules have no averaging
    average = False
    # BaseOrtLinear's rules and bookkeeping in place of scikit-learn SGD's
    _keep_best_epoch = True
    _max_iter_warning = BaseOrtLinear._max_iter_warning
    _optimizer = BaseOrtLinear._optimizer
    _learning_rates = BaseOrtLinear._learning_rates
    _initialize = BaseOrtLinear._initialize
    _fit_epochs = BaseOrtLinear._fit_epochs
    _finish_epochs = BaseOrtLinear._finish_epochs

    def __init__(self, loss="squared_error", *, penalty="l2", alpha=0.0001, l1_ratio=0.15,
                 fit_intercept=True, max_iter=1000, tol=1e-3, shuffle=True, verbose=0,
                 epsilon=0.1, random_state=None, learning_rate="invscaling", eta0=0.01,
                 power_t=0.25, early_stopping=False, validation_fraction=0.1,
                 n_iter_no_change=5, warm_start=False, solver="sgd", batch_size="auto",
                 momentum=0.0, nesterovs_momentum=False, beta_1=0.9, beta_2=0.999,
                 device="cpu"):
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.shuffle = shuffle
        self.verbose = verbose
        self.epsilon = epsilon
        self.random_state = random_state
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.warm_start = warm_start
        self.solver = solver
        self.batch_size = batch_size
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.device = device

    def _make_counterpart(self):
        self._check_solver()
        return SGDRegressor(
            loss=self.loss, penalty=self.penalty, alpha=self.alpha, l1_ratio=self.l1_ratio,
            fit_intercept=self.fit_intercept, max_iter=self.max_iter, tol=self.tol,
            epsilon=self.epsilon, random_state=self.random_state,
            learning_rate=self.learning_rate, eta0=self.eta0, power_t=self.power_t)

    def _objective(self, inference_model, kind, sum_in_float64=False, weighted=True):
        return sgd_objective(inference_model, kind, loss=self.loss, epsilon=self.epsilon,
                             sum_in_float64=sum_in_float64, weighted=weighted,
                             **self._penalty_args())


class OrtLinearClassifier(OrtClassifierMixin, BaseOrtLinear):
    """Logistic regression trained with onnxruntime, with ``SGDClassifier``'s log-loss objective.

    Objective, with sample weights ``w`` (ones by default) and the logits
    ``z = x . coef + intercept``::

        mean_i (w_i * logloss(y_i, z_i)) + alpha * R(coef)
        R(coef) = (1 - l1_ratio) / 2 * ||coef||^2 + l1_ratio * ||coef||_1

    Two classes: one logit and the binary log-loss (as ``SGDClassifier``).
    More classes: a multinomial model, one logit per class and the
    cross-entropy of their softmax (``SGDClassifier`` trains one-vs-rest
    binary models instead; ``predict_proba`` is the softmax, not normalised
    one-vs-rest probabilities).

    With ``penalty='l2'`` the objective is ``mean logloss + alpha / 2
    ||coef||^2``, which has the same minimiser as ``LogisticRegression(C=C)``
    (``C * sum logloss + 1/2 ||coef||^2``) when ``alpha = 1 / (C * n_samples)``:
    this class is the mini-batch strategy of :class:`OrtLogisticRegression`
    under ``SGDClassifier``'s parameter names, and
    ``OrtLogisticRegression(C=C, solver='adam')`` fits one with that
    ``alpha`` (its ``estimator_``).

    Parameters
    ----------
    loss : {'log_loss'}, default='log_loss'
        The only loss with probabilities.
    learning_rate : {'constant', 'optimal', 'invscaling', 'adaptive'}, \
default='optimal'
    power_t : float, default=0.5
    {common}

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    estimator_ : LogisticRegression
        A scikit-learn model holding the trained ``coef_``, ``intercept_``
        and ``classes_`` (its ``predict_proba`` is this model's: sigmoid or
        softmax); only its weights come from this fit, not its ``C``.
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)
    train_losses_, loss_curve_ : list of float
    validation_losses_, validation_scores_ : list of float or None
    n_iter_ : int
    t_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of str

    See Also
    --------
    OrtLogisticRegression : The same model under ``LogisticRegression``'s
        parameters, with this class's solvers and L-BFGS.
    sklearn.linear_model.SGDClassifier : One-vs-rest SGD.
    sklearn.linear_model.LogisticRegression : The same model, other solvers.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtLinearClassifier
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(200, 2)
    >>> y = (X[:, 0] - X[:, 1] > 0).astype(int)
    >>> clf = OrtLinearClassifier(random_state=0).fit(X, y)
    >>> clf.decision_function(X[:3]).shape
    (3,)
    """

    _parameter_constraints: dict = {
        **BaseOrtLinear._parameter_constraints,
        "loss": [StrOptions({"log_loss"})],
    }

    def __init__(self, loss="log_loss", *, penalty="l2", alpha=0.0001, l1_ratio=0.15,
                 fit_intercept=True, max_iter=1000, tol=1e-3, shuffle=True, verbose=0,
                 random_state=None, learning_rate="optimal", eta0=0.01, power_t=0.5,
                 early_stopping=False, validation_fraction=0.1, n_iter_no_change=5,
                 warm_start=False, solver="sgd", batch_size="auto", momentum=0.0,
                 nesterovs_momentum=False, beta_1=0.9, beta_2=0.999, device="cpu"):
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.shuffle = shuffle
        self.verbose = verbose
        self.random_state = random_state
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.warm_start = warm_start
        self.solver = solver
        self.batch_size = batch_size
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.device = device

    def _make_counterpart(self):
        self._check_solver()
        return LogisticRegression(fit_intercept=self.fit_intercept)

    def _objective(self, inference_model, kind, sum_in_float64=False, weighted=True):
        return sgd_objective(inference_model, kind, loss="log_loss",
                             sum_in_float64=sum_in_float64, weighted=weighted,
                             **self._penalty_args())

    def decision_function(self, X):
        """Logits: shape (n_samples,) for two classes, (n_samples, n_classes) otherwise.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray
        """
        raw = self._run_inference(X, ["raw_scores"])["raw_scores"]
        return raw[:, 0] if raw.shape[1] == 1 else raw


for _cls in (OrtLinearRegressor, OrtLinearClassifier):
    fill_doc(_cls, common=_COMMON_PARAMS_DOC.strip())
