"""Logistic regression trained with onnxruntime: ``OrtLogisticRegression``.

The objective of scikit-learn 1.9's ``LogisticRegression``
(``_logistic_regression_path`` on ``LinearModelLoss``), with ``w`` the
sample weights multiplied by the class weights::

    sum_i w_i * loss_i / sum_i w_i
        + 1 / (C * sum_i w_i) * ((1 - l1_ratio) / 2 * ||coef||^2 + l1_ratio * ||coef||_1)

``loss_i`` is the binary log-loss of one logit (two classes) or the
multinomial cross-entropy of one logit per class. The solver is a strategy
of the one model: ``'lbfgs'`` is scipy's L-BFGS-B on the whole data with
scikit-learn's options (``gtol=tol``, ``maxls=50``, ``ftol=64 eps``) from
zero weights; the mini-batch solvers (``'sgd'``, ``'adam'``, ``'adamw'``)
train the same objective in epochs of mini-batches, through
:class:`~ortlearn.estimators.OrtLinearClassifier`: its objective, the mean
of ``w_i * loss_i`` plus ``alpha * R(coef)``, is this one times
``sum_i w_i / n_samples`` for ``alpha = 1 / (C * n_samples)``.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.class_weight import compute_class_weight

from ..loss import elementwise_loss
from ._constraints import LINEAR_CONSTRAINTS
from ._docs import fill_doc
from ._fullbatch import BaseOrtFullBatch, FullBatchClassifierMixin
from ._objective import COEF, INTERCEPT, linear_objective
from ._validation import check_sample_weight, with_defaults

__all__ = ["OrtLogisticRegression"]

#: the solvers that train in epochs of mini-batches (OrtLinearClassifier's)
MINI_BATCH_SOLVERS = ("sgd", "adam", "adamw")
#: scikit-learn's other solvers, refused with a message naming ortlearn's
_SKLEARN_ONLY = {"liblinear", "newton-cg", "newton-cholesky", "sag", "saga"}
#: the parameters of the mini-batch solvers, named and defaulted as OrtLinearClassifier's
_MINI_BATCH_PARAMS = ("batch_size", "learning_rate", "eta0", "power_t", "momentum",
                      "nesterovs_momentum", "beta_1", "beta_2", "shuffle", "early_stopping",
                      "validation_fraction", "n_iter_no_change")


@fill_doc
class OrtLogisticRegression(FullBatchClassifierMixin, BaseOrtFullBatch):
    """Logistic regression (binary and multinomial) trained with onnxruntime.

    Minimises the objective of :class:`sklearn.linear_model.LogisticRegression`,
    with the sample weights ``w`` multiplied by the class weights::

        sum_i w_i * loss_i / sum_i w_i + 1 / (C * sum_i w_i) * R(coef)
        R(coef) = (1 - l1_ratio) / 2 * ||coef||^2 + l1_ratio * ||coef||_1

    Two classes: one logit and the binary log-loss; more classes: one logit
    per class and the multinomial cross-entropy (scikit-learn's default for
    ``solver='lbfgs'``).

    The solver is how the one model is trained, as in scikit-learn:
    ``'lbfgs'`` (the default) evaluates the objective and its gradient on the
    whole data in one onnxruntime call and runs scipy's L-BFGS-B with
    scikit-learn's options; ``'sgd'``, ``'adam'`` and ``'adamw'`` train it in
    epochs of mini-batches (for data too large for full-batch steps, or to
    continue on-device from :meth:`export_artifacts`) with the parameters
    scikit-learn's ``MLPClassifier`` also ignores for ``'lbfgs'``:
    ``batch_size``, ``learning_rate``, ``eta0``, ``power_t``, ``momentum``,
    ``nesterovs_momentum``, ``beta_1``, ``beta_2``, ``shuffle``,
    ``early_stopping``, ``validation_fraction``, ``n_iter_no_change``. Those
    fits run through :class:`OrtLinearClassifier` (its parameters, ``alpha =
    1 / (C * n_samples)``), kept in ``estimator_``.

    Parameters
    ----------
    penalty : {'l2', None} or 'deprecated', default='deprecated'
        Deprecated in scikit-learn 1.8 for ``l1_ratio`` and ``C``:
        ``'deprecated'`` reads the penalty from them (``l1_ratio=0``: L2,
        ``C=np.inf``: none). ``'l1'`` is ``l1_ratio=1``, ``'elasticnet'``
        reads ``l1_ratio``: the mini-batch solvers only (a subgradient);
        L-BFGS needs a smooth objective and raises a ``ValueError``.
    C : float, default=1.0
        Inverse of the regularization strength.
    l1_ratio : float, default=0.0
        Share of the L1 term in the penalty; above 0 with the mini-batch
        solvers only.
    dual : bool, default=False
        Only False (the primal problem).
    tol : float, default=1e-4
        ``gtol`` of L-BFGS-B: stop when the largest projected gradient
        component is below it.
    fit_intercept : bool, default=True
    intercept_scaling : float, default=1
        Used by ``solver='liblinear'`` only (accepted, unused, as there).
    class_weight : dict, 'balanced' or None, default=None
        Weights of the classes, multiplied into the sample weights.
    random_state : int, RandomState instance or None, default=None
        Unused by ``solver='lbfgs'`` (accepted, as there).
    solver : {'lbfgs', 'sgd', 'adam', 'adamw'}, default='lbfgs'
        ``'lbfgs'``: full-batch L-BFGS-B. ``'sgd'`` (mini-batch SGD with
        ``momentum`` and the ``learning_rate`` schedule), ``'adam'``,
        ``'adamw'`` (the L2 part of the penalty as AdamW's decoupled weight
        decay): mini-batches. scikit-learn's other values (``'liblinear'``,
        ``'newton-cg'``, ``'newton-cholesky'``, ``'sag'``, ``'saga'``) raise
        a ``ValueError``.
    max_iter : int, default=100
        Maximum number of L-BFGS iterations, or of epochs.
    verbose : int, default=0
        > 0 prints the loss after each L-BFGS iteration or epoch.
    warm_start : bool, default=False
        Start from ``coef_`` and ``intercept_`` of the previous fit (when the
        classes and features are the same).
    n_jobs : int, default=None
        Unused (accepted, as by ``LogisticRegression`` with one ``C``).
    {device}
    batch_size : int or 'auto', default='auto'
        Rows per mini-batch (``'auto'``: ``min(200, n_samples)``).
    learning_rate : {'constant', 'optimal', 'invscaling', 'adaptive'}, \
default='optimal'
        The schedule of ``solver='sgd'``, as :class:`OrtLinearClassifier`'s.
    eta0 : float, default=0.01
        Initial learning rate (the rate of ``'adam'`` and ``'adamw'``).
    power_t : float, default=0.5
        Exponent of ``'invscaling'``.
    momentum : float, default=0.0
    nesterovs_momentum : bool, default=False
        Of ``solver='sgd'``.
    beta_1, beta_2 : float, default=0.9, 0.999
        Of ``'adam'`` and ``'adamw'``.
    shuffle : bool, default=True
        Shuffle the rows at each epoch.
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows and stop when their
        score stops improving (the weights of the best epoch are kept).
    validation_fraction : float, default=0.1
    n_iter_no_change : int, default=5
        Epochs without an improvement of more than ``tol`` before stopping.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)
    n_iter_ : ndarray of shape (1,)
        L-BFGS iterations, or epochs, run.
    loss_ : float
        Objective at the returned weights (L-BFGS), or the last epoch's mean
        loss (mini-batches).
    estimator_ : OrtLinearClassifier
        The mini-batch solvers' fitted estimator (their ``loss_curve_``,
        ``get_state``, ``export_artifacts``, ``partial_fit``); absent after
        ``'lbfgs'``.
    {fitted}

    See Also
    --------
    sklearn.linear_model.LogisticRegression : The scikit-learn estimator.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from ortlearn.estimators import OrtLogisticRegression
    >>> X, y = load_iris(return_X_y=True)
    >>> clf = OrtLogisticRegression(max_iter=200).fit(X, y)
    >>> clf.predict(X[:2])
    array([0, 0])
    >>> round(clf.score(X, y), 2)
    0.97

    The same model in mini-batches of 32 rows, with Adam:

    >>> sgd = OrtLogisticRegression(solver="adam", batch_size=32, eta0=0.05,
    ...                             random_state=0).fit(X, y)
    >>> bool(sgd.score(X, y) > 0.95)
    True
    """

    _parameter_constraints: dict = {
        "penalty": [StrOptions({"l1", "l2", "elasticnet", "deprecated"}), None],
        "C": [Interval(Real, 0, None, closed="right")],
        "l1_ratio": [Interval(Real, 0, 1, closed="both"), None],
        "dual": ["boolean"],
        "tol": [Interval(Real, 0, None, closed="left")],
        "fit_intercept": ["boolean"],
        "intercept_scaling": [Interval(Real, 0, None, closed="neither")],
        "class_weight": [dict, StrOptions({"balanced"}), None],
        "random_state": ["random_state"],
        "solver": [StrOptions({"lbfgs", *MINI_BATCH_SOLVERS, *_SKLEARN_ONLY})],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "n_jobs": [None, Integral],
        "device": [str],
        **{name: LINEAR_CONSTRAINTS[name] for name in _MINI_BATCH_PARAMS},
    }

    def __init__(self, penalty="deprecated", *, C=1.0, l1_ratio=0.0, dual=False, tol=1e-4,
                 fit_intercept=True, intercept_scaling=1, class_weight=None,
                 random_state=None, solver="lbfgs", max_iter=100, verbose=0,
                 warm_start=False, n_jobs=None, device="cpu", batch_size="auto",
                 learning_rate="optimal", eta0=0.01, power_t=0.5, momentum=0.0,
                 nesterovs_momentum=False, beta_1=0.9, beta_2=0.999, shuffle=True,
                 early_stopping=False, validation_fraction=0.1, n_iter_no_change=5):
        self.penalty = penalty
        self.C = C
        self.l1_ratio = l1_ratio
        self.dual = dual
        self.tol = tol
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.class_weight = class_weight
        self.random_state = random_state
        self.solver = solver
        self.max_iter = max_iter
        self.verbose = verbose
        self.warm_start = warm_start
        self.n_jobs = n_jobs
        self.device = device
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.shuffle = shuffle
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change

    def __setstate__(self, state):
        # a model pickled before the mini-batch solvers ('lbfgs' ignores their parameters)
        super().__setstate__(with_defaults(type(self), state, _MINI_BATCH_PARAMS))

    def _penalized(self) -> bool:
        """True for the L2 penalty, False for none; ValueError for what L-BFGS cannot do."""
        if self.solver in _SKLEARN_ONLY:
            raise ValueError(
                f"solver={self.solver!r} is not available in OrtLogisticRegression: ortlearn "
                "trains it with 'lbfgs' (full batch) or the mini-batch solvers "
                f"{', '.join(map(repr, MINI_BATCH_SOLVERS))}.")
        if self.dual:
            raise ValueError("dual=True is not available with solver='lbfgs': only the "
                             "primal problem (dual=False) is solved.")
        if self.penalty in ("l1", "elasticnet"):
            raise ValueError(f"penalty={self.penalty!r} is not available with solver='lbfgs' "
                             "(the objective must be smooth): use penalty='l2' or None.")
        if self.l1_ratio not in (None, 0):
            raise ValueError(f"l1_ratio={self.l1_ratio} adds an L1 penalty, which "
                             "solver='lbfgs' cannot minimise: only l1_ratio=0 is accepted.")
        if self.penalty is None:
            return False
        return self.C != np.inf

    def _check_params(self):
        if self.solver in MINI_BATCH_SOLVERS:
            self._mini_batch_penalty()
        else:
            self._penalized()

    def _mini_batch_penalty(self) -> tuple[str | None, float]:
        """``(penalty, l1_ratio)`` of OrtLinearClassifier for the mini-batch solvers."""
        if self.dual:
            raise ValueError(f"dual=True is not available with solver={self.solver!r}: "
                             "only the primal problem (dual=False) is solved.")
        if self.penalty is None or self.C == np.inf:
            return None, 0.0
        if self.penalty == "l1":
            return "elasticnet", 1.0
        ratio = self.l1_ratio or 0.0
        if self.penalty == "l2" and ratio:
            raise ValueError(f"l1_ratio={self.l1_ratio} asks for an L1 term that "
                             "penalty='l2' leaves out: use penalty='elasticnet' (or leave "
                             "penalty at its default).")
        return "elasticnet", ratio

    def _fit(self, X, y, sample_weight):
        """L-BFGS on the whole data, or the mini-batch solvers through OrtLinearClassifier."""
        if self.solver not in MINI_BATCH_SOLVERS:
            self.__dict__.pop("estimator_", None)
            return super()._fit(X, y, sample_weight)
        return self._fit_mini_batch(X, y, sample_weight)

    def _fit_mini_batch(self, X, y, sample_weight):
        """Train through OrtLinearClassifier, which the callbacks observe."""
        penalty, l1_ratio = self._mini_batch_penalty()
        X, y = self._validate(X, y)
        self._dtype = X.dtype
        given = check_sample_weight(sample_weight, X.shape[0], np.float64)
        weights = np.ones(X.shape[0]) if given is None else given
        classes, index = self._encode_labels(y)
        if self.class_weight is not None:
            weights = weights * compute_class_weight(
                self.class_weight, classes=classes, y=y, sample_weight=weights)[index]
        # This objective times sum(w) / n is OrtLinearClassifier's, mean_i(w_i loss_i) +
        # alpha * R: the same minimiser for alpha = 1 / (C n).
        alpha = 0.0 if penalty is None else 1.0 / (self.C * X.shape[0])
        params = {name: getattr(self, name) for name in _MINI_BATCH_PARAMS}
        params.update(penalty=penalty, alpha=alpha, l1_ratio=l1_ratio, solver=self.solver,
                      fit_intercept=self.fit_intercept, max_iter=self.max_iter, tol=self.tol,
                      verbose=self.verbose, random_state=self.random_state,
                      warm_start=self.warm_start, device=self.device)
        # here, not at import: a fit with L-BFGS needs none of the mini-batch engine
        from ._linear import OrtLinearClassifier

        inner = getattr(self, "estimator_", None)
        if not (self.warm_start and inner is not None):
            inner = OrtLinearClassifier()
        inner.set_params(**params)
        if getattr(self, "_skl_callbacks", None):
            inner.set_callbacks(*self._skl_callbacks)
        unweighted = given is None and self.class_weight is None
        inner.fit(X, y, sample_weight=None if unweighted else weights)
        self.estimator_ = inner
        self.classes_ = inner.classes_
        state = inner.get_state()
        self._weights = {COEF: state["coef"].astype(np.float64)}
        if self.fit_intercept:
            intercept = state["intercept"].astype(np.float64)
            if len(classes) > 2:
                # The softmax ignores a shift of every logit: Adam's per-coordinate steps
                # drift the intercepts together; L-BFGS from zero keeps them summing to 0.
                intercept -= intercept.mean()
            self._weights[INTERCEPT] = intercept
        self.__dict__.update(self._attributes(self._weights, state["coef"].shape[1]))
        self.n_iter_ = np.array([inner.n_iter_], dtype=np.int32)
        self.train_losses_ = list(inner.train_losses_)
        self.loss_ = self.train_losses_[-1]
        return self

    def _fit_validated(self, X, y, sample_weight):
        penalized = self._penalized()
        classes, index = self._encode_labels(y)
        if self.class_weight is not None:
            weights = compute_class_weight(self.class_weight, classes=classes, y=y,
                                           sample_weight=sample_weight)
            sample_weight = sample_weight * weights[index]
        sw_sum = float(sample_weight.sum())
        binary = len(classes) == 2
        n_features, n_outputs = X.shape[1], 1 if binary else len(classes)

        def row_loss(b, raw, label):
            if binary:
                return elementwise_loss(b, "log", raw, label, np.float64)
            # The cross-entropy of one-hot float labels, -sum_k Y_ik log softmax(raw)_ik:
            # its gradient softmax - Y runs 10 to 15 % faster in onnxruntime than that of
            # the class indices' GatherElements (a scatter through Mod/Equal/Where). The
            # indices come from LabelEncoder: always in range.
            logp = b.op("LogSoftmax", [raw], axis=1)
            picked = b.reduce("ReduceSum", b.op("Mul", [label, logp]), axes=[1], keepdims=1)
            return b.op("Neg", [picked])

        l2 = 0.5 / (self.C * sw_sum) if penalized else 0.0
        model = linear_objective(n_features, n_outputs, row_loss,
                                 fit_intercept=self.fit_intercept, data_scale=1.0 / sw_sum,
                                 l2=l2, loss_key="binomial" if binary else "multinomial")
        initial = {}
        if (self.warm_start and hasattr(self, "coef_")
                and np.array_equal(getattr(self, "classes_", None), classes)
                and self.coef_.shape == (n_outputs, n_features)):
            initial[COEF] = np.asarray(self.coef_, np.float64).T
            if self.fit_intercept:
                initial[INTERCEPT] = np.asarray(self.intercept_, np.float64)
        label = (index.astype(np.float64).reshape(-1, 1) if binary
                 else np.eye(len(classes))[index])
        self.classes_ = classes

        def attributes(weights):
            return self._attributes(weights, n_outputs)

        weights, n_iter = self._minimize(model, X, label, sample_weight, initial, attributes)
        self._weights = weights
        self.__dict__.update(attributes(weights))
        self.n_iter_ = np.array([n_iter], dtype=np.int32)
        return self

    def _attributes(self, weights: dict, n_outputs: int) -> dict:
        """``coef_`` and ``intercept_`` of the objective's weights."""
        return {"coef_": weights[COEF].T.astype(self._dtype),
                "intercept_": (weights[INTERCEPT].astype(self._dtype) if self.fit_intercept
                               else np.zeros(n_outputs, self._dtype))}

    def _inference_outputs(self, b, raw, elem):
        """``raw_scores``, ``probabilities`` and ``label`` (one of ``classes_``)."""
        n_classes = len(self.classes_)
        b.op("Identity", [raw], outputs=["raw_scores"])
        if n_classes == 2:
            positive = b.op("Sigmoid", [raw])
            negative = b.op("Sub", [b.const(1.0, np.dtype(self._dtype)), positive])
            b.op("Concat", [negative, positive], outputs=["probabilities"], axis=1)
        else:
            b.op("Softmax", [raw], outputs=["probabilities"], axis=1)
        label = self._label_output(b, raw)
        return [label,
                ("probabilities", elem, ["N", n_classes]),
                ("raw_scores", elem, ["N", 1 if n_classes == 2 else n_classes])]

    def predict_log_proba(self, X):
        """Log of :meth:`predict_proba`, from the logits.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        scores = self.decision_function(X)
        if scores.ndim == 1:
            scores = np.column_stack([np.zeros_like(scores), scores])
        shifted = scores - scores.max(axis=1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))

    def predict_proba(self, X):
        """Class probabilities: sigmoid for two classes, softmax otherwise.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        return np.exp(self.predict_log_proba(X))
