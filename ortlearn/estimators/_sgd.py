"""``OrtSGDRegressor`` and ``OrtSGDClassifier``: scikit-learn's SGD estimators.

Same parameters, defaults and objective as ``SGDRegressor`` / ``SGDClassifier``
(every loss, one-vs-all for more than two classes, ``class_weight``,
``average``, L1 and elastic-net penalties by truncated gradient), plus
``batch_size`` and ``device``. With ``batch_size=1`` and ``shuffle=False`` a
fit makes scikit-learn's per-sample updates: the objective's gradient (loss
and L2 part, :func:`ova_sgd_objective`) and :class:`~ortlearn.optim.PlainSGD`
(the step, the average and the cumulative L1 penalty) give its coefficients
to rounding.

The default, ``batch_size='auto'``, updates the weights once per 32 rows
(a regressor's, per more rows in later epochs as the schedule's rate
decays: up to 256, keeping 64 updates an epoch): one onnxruntime step costs tens of
microseconds whatever its rows, where scikit-learn's Cython loop spends well
under one per sample, so one row per step is tens of times slower. Each
update steps its rows as the per-sample loop would
(:func:`~ortlearn.optim.per_sample_rates`: the mean gradient at ``n`` times
the rate of the first row's sample count), so the schedules, ``t_``,
``average`` and the cumulative L1 penalty keep counting samples and a fit
follows scikit-learn's path, taken a batch at a time.

``solver`` picks the training of the same objective: ``'sgd'`` (the default) is
scikit-learn's rule above; ``'adam'``, ``'adamw'`` and ``'lbfgs'`` are
:class:`~ortlearn.estimators._linear_base.BaseOrtLinear`'s (the penalty in the objective,
its L1 part a subgradient), with the stopping rules of scikit-learn's SGD.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np
from sklearn.base import _fit_context, is_classifier
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.metaestimators import available_if

from ..optim import PlainSGD, per_sample_rates
from ..training.sparse import is_sparse
from ._base import OrtClassifierMixin, OrtRegressorMixin
from ._docs import fill_doc
from ._linear_base import BaseOrtLinear
from ._objective import ova_sgd_objective
from ._validation import with_defaults

__all__ = ["OrtSGDClassifier", "OrtSGDRegressor"]

_REGRESSION_LOSSES = {"squared_error", "huber", "epsilon_insensitive",
                      "squared_epsilon_insensitive"}
_CLASSIFICATION_LOSSES = {"hinge", "log_loss", "modified_huber", "squared_hinge",
                          "perceptron"} | _REGRESSION_LOSSES
#: ``batch_size='auto'``: the most rows an update, the fewest updates an epoch, and the
#: schedules whose rate decays with the samples learned (the batches grow with them)
_MAX_AUTO_ROWS, _MIN_UPDATES = 256, 64
_DECAYING = ("invscaling", "optimal")
#: losses whose derivative jumps: L-BFGS's curvature pairs mean nothing across the kinks
_NOT_SMOOTH = {"hinge", "perceptron", "epsilon_insensitive"}
#: scikit-learn's factor of the intercept's step on sparse data (its
#: ``SPARSE_INTERCEPT_DECAY``): a row touches few weights but always the intercept
SPARSE_INTERCEPT_DECAY = 0.01


class BaseOrtSGD(BaseOrtLinear):
    """Shared parameters and hooks of the SGD estimators (not for direct use)."""

    # BaseOrtLinear's, with scikit-learn SGD's ranges, losses' epsilon and average, and
    # without the MLP rules' momentum
    _parameter_constraints: dict = {
        **{name: constraint for name, constraint in BaseOrtLinear._parameter_constraints.items()
           if name not in ("momentum", "nesterovs_momentum")},
        "l1_ratio": [Interval(Real, 0, 1, closed="both"), None],
        "tol": [Interval(Real, 0, None, closed="left"), None],
        "epsilon": [Interval(Real, 0, None, closed="left")],
        "learning_rate": [StrOptions({"constant", "optimal", "invscaling", "adaptive",
                                      "pa1", "pa2"})],
        "average": [Interval(Integral, 0, None, closed="neither"), "boolean"],
    }

    #: the parameters added to scikit-learn's: a model pickled before they existed
    #: loads with their defaults (see __setstate__)
    _ADDED_PARAMS = ("solver", "beta_1", "beta_2")
    #: scikit-learn's SGD keeps the last epoch's weights, not those of the best one
    _keep_best_epoch = False
    _max_iter_warning = ("Maximum number of iteration reached before convergence. Consider "
                         "increasing max_iter to improve the fit.")
    _counterpart = SGDRegressor

    def __setstate__(self, state):
        super().__setstate__(with_defaults(type(self), state, self._ADDED_PARAMS))

    def _prediction_model(self, values: bool = True):
        # the predictions read only the scores: no conversion (to_onnx converts)
        return self._scores_model(values)

    def _per_sample_rule(self) -> bool:
        """Whether the updates are scikit-learn's per-sample SGD (else BaseOrtLinear's)."""
        return self.solver == "sgd"

    def _check_solver(self) -> None:
        super()._check_solver()
        if self.solver == "sgd":
            return
        if self.average:
            raise ValueError(f"average={self.average!r} averages scikit-learn's SGD updates: "
                             f"it needs solver='sgd', not {self.solver!r}.")
        if self.solver == "lbfgs" and self.loss in _NOT_SMOOTH:
            raise ValueError(f"solver='lbfgs' needs a smooth objective: loss={self.loss!r} "
                             "has kinks; use solver='sgd' or 'adam', or a smooth loss.")

    def _l1_ratio(self) -> float:
        if self.penalty == "elasticnet" and self.l1_ratio is None:
            raise ValueError("l1_ratio must be set when penalty is 'elasticnet'")
        return super()._l1_ratio()

    #: rows per update of ``batch_size='auto'`` at the start of a fit: per-sample rates
    #: (per_sample_rates) keep scikit-learn's path and scores
    _auto_batch_size = 32

    def _epoch_rows(self, n_samples: int, batch_size: int) -> int:
        """``'auto'``: more rows an update as the schedule's rate decays.

        An update of ``n`` rows steps ``n`` times the rate of its first row: with ``n``
        grown by the rate's decay since the first sample, no update steps further than
        the first 32-row ones, while a step's fixed cost is paid fewer times. At most
        ``_MAX_AUTO_ROWS`` rows and at least ``_MIN_UPDATES`` updates an epoch: with
        fewer, an epoch's loss drops less than the ``tol`` rule expects. Regressors only:
        the classifiers' margin losses change their epochs' losses with the batch size,
        and the ``tol`` rule then runs more epochs to lower held-out scores.
        """
        if (self.batch_size != "auto" or not self._per_sample_rule() or self.average
                or is_classifier(self) or self.learning_rate not in _DECAYING):
            return batch_size
        schedule = self._schedule
        growth = schedule.learning_rate(1) / schedule.learning_rate(max(int(self.t_), 1))
        rows = min(batch_size * growth, _MAX_AUTO_ROWS, n_samples // _MIN_UPDATES)
        return max(batch_size, int(rows) // batch_size * batch_size)

    def _average_start(self) -> int:
        """The first averaged update: the one that learns sample ``average`` (True is 1,
        False 0: none)."""
        return math.ceil(int(self.average) / self._update_rows)

    def _learning_rates(self, sizes, first_step):
        if not self._per_sample_rule():
            return super()._learning_rates(sizes, first_step)
        # scikit-learn's schedules count samples: t_ is 1 + the samples learned so far
        rates = per_sample_rates(self._schedule, sizes, int(self.t_))
        return None, lambda step: rates[step - first_step]

    def _optimizer(self):
        if not self._per_sample_rule():
            return super()._optimizer()
        ratio = self._l1_ratio() if self.penalty is not None else 0.0
        # an estimator pickled before the factor existed stepped it as on dense data
        return PlainSGD(l1=self.alpha * ratio, average=self._average_start(),
                        intercept_decay=getattr(self, "_intercept_decay", 1.0))

    def _make_schedule(self):
        if self.learning_rate in ("pa1", "pa2"):
            raise ValueError(
                f"learning_rate={self.learning_rate!r} (passive-aggressive) is not supported "
                f"by {type(self).__name__}: its step depends on each sample's loss and norm. "
                "Use sklearn.linear_model.PassiveAggressive* or another learning_rate.")
        return super()._make_schedule()

    def _sgd_params(self) -> dict:
        return {name: getattr(self, name) for name in self._counterpart().get_params()}

    def _objective(self, inference_model, kind, sum_in_float64=False, weighted=True):
        ratio = self._l1_ratio() if self.penalty is not None else 0.0
        strength = 0.0 if self.penalty is None else self.alpha
        # PlainSGD truncates the L1 part; the other solvers descend it in the objective,
        # and AdamW decays the L2 part itself.
        alpha_l1 = 0.0 if self._per_sample_rule() else strength * ratio
        alpha_l2 = 0.0 if self.solver == "adamw" else strength * (1 - ratio)
        return ova_sgd_objective(inference_model, kind, loss=self.loss, alpha_l2=alpha_l2,
                                 alpha_l1=alpha_l1, epsilon=self.epsilon,
                                 class_weight=self._column_weights(kind),
                                 sum_in_float64=sum_in_float64, weighted=weighted)

    def _column_weights(self, kind):
        return None

    # ------------------------------------------------ scikit-learn's bookkeeping
    def _initialize(self, X, y) -> None:
        super()._initialize(X, y)
        self.t_ = 1.0  # scikit-learn counts from 1: t_ - 1 samples were learned
        self._standard_weights = None
        self._intercept_decay = self._intercept_decay_of(X)

    @staticmethod
    def _intercept_decay_of(X) -> float:
        """The factor of the intercept's step on ``X``, scikit-learn's."""
        return SPARSE_INTERCEPT_DECAY if is_sparse(X) else 1.0

    def _fit_solver(self, X, y, y_enc, sample_weight, incremental: bool, device) -> None:
        # As scikit-learn, each call steps the intercept by its data's factor: a partial_fit
        # on sparse rows after dense ones gets an engine of that factor (from the weights
        # and optimizer state so far).
        decay = self._intercept_decay_of(X)
        engine = self._runtime.engine
        if engine is not None and getattr(engine.optimizer, "intercept_decay", decay) != decay:
            self._runtime.engine = None
        self._intercept_decay = decay
        super()._fit_solver(X, y, y_enc, sample_weight, incremental, device)

    def _fit_epochs(self, engine, X, y, y_enc, sample_weight, incremental: bool) -> None:
        if not incremental:
            self.t_ = 1.0  # each fit restarts the count (and the schedule), as scikit-learn
        super()._fit_epochs(engine, X, y, y_enc, sample_weight, incremental)

    def _update_no_improvement(self, engine, loss, validation) -> None:
        super()._update_no_improvement(engine, loss, validation)
        if not self._keep_best_epoch:
            self._best_state = None

    def _build_engine(self, X, device, weighted):
        engine = super()._build_engine(X, device, weighted)
        if (self._optimizer_state is not None
                and getattr(self, "_standard_weights", None) is not None):
            # estimator_ holds the averaged weights: the updates go on from the others
            engine.set_state(self._standard_weights)
        return engine

    def _finish_epochs(self, engine, last: bool = False) -> None:
        start = self._average_start()
        if not start:
            super()._finish_epochs(engine, last)
            return
        # The engine keeps its buffers: the weights not averaged are read from it below.
        super()._finish_epochs(engine, last=False)
        self._standard_weights = engine.get_state()
        if self._optimizer_state["step"] >= start:
            # As scikit-learn: coef_ and intercept_ are the averages once averaging began.
            self._store_weights({p: d["average"] for p, d in
                                 self._optimizer_state["states"].items()})


_COMMON_DOC = """
    penalty : {'l2', 'l1', 'elasticnet'} or None, default='l2'
        Regularization term. The L1 part is applied by the truncated
        gradient with cumulative penalty (Tsuruoka et al. 2009) as
        scikit-learn does, which gives exact zeros.
    alpha : float, default=0.0001
        Strength of the penalty; also the scale of ``learning_rate='optimal'``.
    l1_ratio : float or None, default=0.15
        Elastic-net mixing (``penalty='elasticnet'``).
    fit_intercept : bool, default=True
    max_iter : int, default=1000
        Maximum number of epochs.
    tol : float or None, default=1e-3
        Stop once the epoch's objective does not drop by more than ``tol``
        for ``n_iter_no_change`` epochs (the validation score rise, with
        ``early_stopping``); None never stops early. The objective is the
        mean of the per-update losses with their sample and class weights
        and the L2 term (scikit-learn sums the unweighted losses and adds
        the L1 term). With more than two classes the objective sums the
        one-vs-all columns' and must drop by ``tol`` times their number
        (scikit-learn stops each column when its own loss stops dropping by
        ``tol``).
    shuffle : bool, default=True
    verbose : int, default=0
    epsilon : float, default=0.1
        Of the ``'huber'``, ``'epsilon_insensitive'`` and
        ``'squared_epsilon_insensitive'`` losses.
    random_state : int, RandomState instance or None, default=None
        Shuffling and validation split (draws that differ from
        scikit-learn's: the same seed gives other orders).
    learning_rate : {'constant', 'optimal', 'invscaling', 'adaptive'}
        As scikit-learn's, ``t`` counting the samples; ``'pa1'`` and
        ``'pa2'`` raise a ValueError at fit.
    eta0 : float, default=0.01
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the data and stop when its score
        stops improving; the last weights are kept, as scikit-learn does.
    validation_fraction : float, default=0.1
    n_iter_no_change : int, default=5
    warm_start : bool, default=False
    average : bool or int, default=False
        Averaged SGD: ``coef_`` and ``intercept_`` are the averages of the
        weights after every update from the one that learns sample
        ``average`` on (True: 1);
        an optimizer state of :class:`~ortlearn.optim.PlainSGD`, updated in
        the training graph.
    batch_size : int or 'auto', default='auto'
        ortlearn's addition. Rows per update (``'auto'``: 32; a regressor's
        grow up to 256 in later epochs as a decaying schedule's rate falls). 1 is
        scikit-learn's per-sample SGD, to rounding. An update of ``n`` rows
        descends their mean gradient at ``n`` times the rate of its first
        row's sample count: the per-sample path, with each row's gradient
        taken at the weights of the update's start (see the module's
        docstring).
    solver : {'sgd', 'adam', 'adamw', 'lbfgs'}, default='sgd'
        ortlearn's addition: how the objective is trained. ``'sgd'``:
        scikit-learn's updates (above). ``'adam'`` and ``'adamw'`` (the L2
        part of the penalty as AdamW's decoupled weight decay ``alpha * (1 -
        l1_ratio)``) at the constant rate ``eta0``, the L1 part a subgradient
        of the objective (no exact zeros), no ``average``; ``'lbfgs'``:
        full-batch L-BFGS-B (``max_iter`` iterations), for smooth losses and
        penalties. The stopping rules stay scikit-learn's.
    beta_1, beta_2 : float, default=0.9, 0.999
        ortlearn's addition: the moment decay rates of ``'adam'`` and
        ``'adamw'``.
    device : str, default='cpu'
        ortlearn's addition: ``'cpu'``, ``'cuda'`` or ``'cuda:N'``."""


class OrtSGDRegressor(OrtRegressorMixin, BaseOrtSGD):
    """``SGDRegressor`` trained with onnxruntime.

    Minimises, with sample weights ``w`` (ones by default)::

        mean_i w_i L(y_i, x_i . coef + intercept) + alpha * R(coef)
        R(coef) = (1 - l1_ratio) / 2 * ||coef||^2 + l1_ratio * ||coef||_1

    with scikit-learn's losses and updates (see the module's docstring).

    Parameters
    ----------
    loss : {'squared_error', 'huber', 'epsilon_insensitive', \
'squared_epsilon_insensitive'}, default='squared_error'
    learning_rate : str, default='invscaling'
    power_t : float, default=0.25
    {common}

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : ndarray of shape (1,)
    n_iter_ : int
        Epochs run.
    t_ : float
        ``1 +`` the number of samples learned (scikit-learn's count), what
        the schedules read.
    estimator_ : SGDRegressor
        A scikit-learn model holding the trained weights.
    train_losses_, loss_curve_ : list of float
        The objective of each epoch.
    n_features_in_ : int
    feature_names_in_ : ndarray of str

    See Also
    --------
    sklearn.linear_model.SGDRegressor : The scikit-learn estimator.
    OrtLinearRegressor : This model with MLP-style mini-batch SGD.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtSGDRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(100, 3)
    >>> y = X @ [1.0, -2.0, 0.5] + 1.0
    >>> reg = OrtSGDRegressor(random_state=0).fit(X, y)
    >>> bool(reg.score(X, y) > 0.99)
    True
    """

    _parameter_constraints: dict = {
        **BaseOrtSGD._parameter_constraints,
        "loss": [StrOptions(_REGRESSION_LOSSES)],
    }

    def __init__(self, loss="squared_error", *, penalty="l2", alpha=0.0001, l1_ratio=0.15,
                 fit_intercept=True, max_iter=1000, tol=1e-3, shuffle=True, verbose=0,
                 epsilon=0.1, random_state=None, learning_rate="invscaling", eta0=0.01,
                 power_t=0.25, early_stopping=False, validation_fraction=0.1,
                 n_iter_no_change=5, warm_start=False, average=False,
                 batch_size="auto", solver="sgd", beta_1=0.9, beta_2=0.999, device="cpu"):
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
        self.average = average
        self.batch_size = batch_size
        self.solver = solver
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.device = device

    def _make_counterpart(self):
        self._check_solver()
        return SGDRegressor(**self._sgd_params())


class OrtSGDClassifier(OrtClassifierMixin, BaseOrtSGD):
    """``SGDClassifier`` trained with onnxruntime.

    Two classes: one score ``z = x . coef + intercept`` and the binary loss.
    More classes: one-vs-all as scikit-learn, one column of scores per
    class and, for each, the binary loss of "this class or not"; the
    objective is their sum (the columns are trained together, on one
    shuffled order, and stop together: when the sum stops dropping by ``tol``
    per column, see ``tol``). With sample weights ``w`` and the
    class weights ``c`` of each column (of the positive class on its rows,
    1 elsewhere; for two classes those of each class)::

        mean_i w_i sum_k c_ik L(Y_ik, z_ik) + alpha * R(coef)

    The margin losses read ``Y`` in {0, 1} (sign ``2 Y - 1``), the
    regression losses the target ``2 Y - 1`` (scikit-learn's -1 / +1).

    Parameters
    ----------
    loss : {'hinge', 'log_loss', 'modified_huber', 'squared_hinge', \
'perceptron', 'squared_error', 'huber', 'epsilon_insensitive', \
'squared_epsilon_insensitive'}, default='hinge'
    n_jobs : int or None, default=None
        Accepted for compatibility; the columns are trained in one graph.
    class_weight : dict, 'balanced' or None, default=None
        Multiplies the weights of the rows of each class, as scikit-learn
        does (``'balanced'``: ``n_samples / (n_classes * count)``).
    learning_rate : str, default='optimal'
    power_t : float, default=0.5
    {common}

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)
    n_iter_ : int
    t_ : float
    estimator_ : SGDClassifier
        A scikit-learn model holding the trained weights (its ``loss`` is
        ``'log_loss'``, what the exported graph computes probabilities with;
        :meth:`predict_proba` here follows ``loss``).
    train_losses_, loss_curve_ : list of float
    n_features_in_ : int
    feature_names_in_ : ndarray of str

    See Also
    --------
    sklearn.linear_model.SGDClassifier : The scikit-learn estimator.
    OrtLinearClassifier : Multinomial logistic regression with other solvers.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from sklearn.preprocessing import StandardScaler
    >>> from ortlearn.estimators import OrtSGDClassifier
    >>> X, y = load_iris(return_X_y=True)
    >>> X = StandardScaler().fit_transform(X)
    >>> clf = OrtSGDClassifier(random_state=0).fit(X, y)
    >>> clf.coef_.shape
    (3, 4)
    >>> bool(clf.score(X, y) > 0.8)
    True
    """

    _parameter_constraints: dict = {
        **BaseOrtSGD._parameter_constraints,
        "loss": [StrOptions(_CLASSIFICATION_LOSSES)],
        "n_jobs": [Integral, None],
        "class_weight": [StrOptions({"balanced"}), dict, None],
    }
    _counterpart = SGDClassifier

    def __init__(self, loss="hinge", *, penalty="l2", alpha=0.0001, l1_ratio=0.15,
                 fit_intercept=True, max_iter=1000, tol=1e-3, shuffle=True, verbose=0,
                 epsilon=0.1, n_jobs=None, random_state=None, learning_rate="optimal",
                 eta0=0.01, power_t=0.5, early_stopping=False, validation_fraction=0.1,
                 n_iter_no_change=5, class_weight=None, warm_start=False, average=False,
                 batch_size="auto", solver="sgd", beta_1=0.9, beta_2=0.999, device="cpu"):
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
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.class_weight = class_weight
        self.warm_start = warm_start
        self.average = average
        self.batch_size = batch_size
        self.solver = solver
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.device = device

    def _make_counterpart(self):
        # the graph is the log-loss one (scores, then probabilities): the training
        # objective is built from the scores, whatever the loss
        self._check_solver()
        return SGDClassifier(**{**self._sgd_params(), "loss": "log_loss"})

    def _output_names(self):
        return ["raw_scores"]  # its probabilities are its own (predict_proba)

    def _prepare_classes(self, y, classes, incremental, first) -> None:
        if incremental and self.class_weight == "balanced":
            raise ValueError(
                "class_weight 'balanced' is not supported for partial_fit. Pass "
                "compute_class_weight('balanced', classes=classes, y=y) as class_weight.")
        super()._prepare_classes(y, classes, incremental, first)
        if first or not incremental:
            self._expanded_class_weight = compute_class_weight(
                self.class_weight, classes=self.classes_, y=y)

    def _loss_tol(self) -> float:
        # scikit-learn stops each one-vs-all column when its own loss stops dropping by
        # tol; the columns here stop together, when their summed loss stops dropping by
        # tol per column: tol on the sum would wait for the last column's noise to settle
        n_columns = len(self.classes_) if self._kind() == "multiclass" else 1
        return n_columns * super()._loss_tol()

    def _column_weights(self, kind):
        cw = self._expanded_class_weight
        if kind == "binary":
            return cw[:1], cw[1:]
        return np.ones_like(cw), cw

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch over X and y (``SGDClassifier.partial_fit``'s argument order).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        classes : array-like of shape (n_classes,), default=None
            Every class; required on the first call.
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        return self._partial_fit(X, y, sample_weight, classes=classes)

    def decision_function(self, X):
        """Scores of each class (of ``classes_[1]`` for two classes).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_classes)
        """
        raw = self._run_inference(X, ["raw_scores"])["raw_scores"]
        return raw[:, 0] if raw.shape[1] == 1 else raw

    def _check_proba(self):
        if self.loss not in ("log_loss", "modified_huber"):
            raise AttributeError(f"probability estimates are not available for "
                                 f"loss={self.loss!r}")
        return True

    @available_if(_check_proba)
    def predict_proba(self, X):
        """Probability estimates, as scikit-learn's (``loss`` 'log_loss' or 'modified_huber').

        The sigmoid of the score (log-loss) or ``(clip(score, -1, 1) + 1) / 2``
        (modified Huber) per column, normalised over the classes for more
        than two (one-vs-all).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        scores = self.decision_function(X)
        binary = scores.ndim == 1
        if self.loss == "log_loss":
            prob = 1.0 / (1.0 + np.exp(-np.clip(scores, -500, 500)))
        else:
            prob = (np.clip(scores, -1, 1) + 1) / 2
        if binary:
            return np.column_stack([1 - prob, prob])
        total = prob.sum(axis=1, keepdims=True)
        empty = total[:, 0] == 0
        prob = np.divide(prob, total, out=np.zeros_like(prob), where=total != 0)
        prob[empty] = 1.0 / prob.shape[1]  # no class claims the row: uniform, as sklearn
        return prob

    @available_if(_check_proba)
    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        with np.errstate(divide="ignore"):  # a probability of 0 is a log of -inf
            return np.log(self.predict_proba(X))


for _cls in (OrtSGDRegressor, OrtSGDClassifier):
    fill_doc(_cls, common=_COMMON_DOC.strip())
