"""Logistic regression trained with ortlearn's L-BFGS: ``OrtLogisticRegression``.

The objective of scikit-learn 1.9's ``LogisticRegression(solver='lbfgs')``
(``_logistic_regression_path`` on ``LinearModelLoss``), with ``w`` the
sample weights multiplied by the class weights::

    sum_i w_i * loss_i / sum_i w_i + 1 / (2 * C * sum_i w_i) * ||coef||^2

``loss_i`` is the binary log-loss of one logit (two classes) or the
multinomial cross-entropy of one logit per class; scipy's L-BFGS-B runs
with scikit-learn's options (``gtol=tol``, ``maxls=50``, ``ftol=64 eps``)
from zero weights.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.class_weight import compute_class_weight

from ..loss import elementwise_loss
from ._docs import fill_doc
from ._fullbatch import BaseOrtFullBatch, FullBatchClassifierMixin
from ._objective import COEF, INTERCEPT, linear_objective

__all__ = ["OrtLogisticRegression"]

_SOLVERS = {"lbfgs", "liblinear", "newton-cg", "newton-cholesky", "sag", "saga"}


@fill_doc
class OrtLogisticRegression(FullBatchClassifierMixin, BaseOrtFullBatch):
    """Logistic regression (binary and multinomial) trained with onnxruntime and L-BFGS.

    Minimises the objective of :class:`sklearn.linear_model.LogisticRegression`
    with ``solver='lbfgs'``, with the sample weights ``w`` multiplied by the
    class weights::

        sum_i w_i * loss_i / sum_i w_i + 1 / (2 * C * sum_i w_i) * ||coef||^2

    Two classes: one logit and the binary log-loss; more classes: one logit
    per class and the multinomial cross-entropy (scikit-learn's default for
    ``solver='lbfgs'``). The objective and its gradient are one onnxruntime
    call; scipy's L-BFGS-B uses scikit-learn's options.

    Parameters
    ----------
    penalty : {'l2', None} or 'deprecated', default='deprecated'
        Deprecated in scikit-learn 1.8 for ``l1_ratio`` and ``C``:
        ``'deprecated'`` reads the penalty from them (``l1_ratio=0``: L2,
        ``C=np.inf``: none). ``'l1'`` and ``'elasticnet'`` (or an
        ``l1_ratio > 0``) raise a ``ValueError``: L-BFGS needs a smooth
        objective.
    C : float, default=1.0
        Inverse of the regularization strength.
    l1_ratio : float, default=0.0
        Only 0 (or None) is accepted: the one value ``solver='lbfgs'`` takes.
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
    solver : {'lbfgs'}, default='lbfgs'
        Any other value of scikit-learn's (``'liblinear'``, ``'newton-cg'``,
        ``'newton-cholesky'``, ``'sag'``, ``'saga'``) raises a ``ValueError``.
    max_iter : int, default=100
        Maximum number of L-BFGS iterations.
    verbose : int, default=0
        > 0 prints the loss after each L-BFGS iteration.
    warm_start : bool, default=False
        Start from ``coef_`` and ``intercept_`` of the previous fit (when the
        classes and features are the same).
    n_jobs : int, default=None
        Unused (accepted, as by ``LogisticRegression`` with one ``C``).
    {device}

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)
    n_iter_ : ndarray of shape (1,)
        L-BFGS iterations run.
    loss_ : float
        Objective at the returned weights.
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
        "solver": [StrOptions(_SOLVERS)],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "n_jobs": [None, Integral],
        "device": [str],
    }

    def __init__(self, penalty="deprecated", *, C=1.0, l1_ratio=0.0, dual=False, tol=1e-4,
                 fit_intercept=True, intercept_scaling=1, class_weight=None,
                 random_state=None, solver="lbfgs", max_iter=100, verbose=0,
                 warm_start=False, n_jobs=None, device="cpu"):
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

    def _penalized(self) -> bool:
        """True for the L2 penalty, False for none; ValueError for what L-BFGS cannot do."""
        if self.solver != "lbfgs":
            raise ValueError(
                f"solver={self.solver!r} is not available in OrtLogisticRegression: ortlearn "
                "trains it with L-BFGS only; use solver='lbfgs'.")
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
        self._penalized()

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
                                 l2=l2)
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
            return {"coef_": weights[COEF].T.astype(self._dtype),
                    "intercept_": (weights[INTERCEPT].astype(self._dtype) if self.fit_intercept
                                   else np.zeros(n_outputs, self._dtype))}

        weights, n_iter = self._minimize(model, X, label, sample_weight, initial, attributes)
        self._weights = weights
        self.__dict__.update(attributes(weights))
        self.n_iter_ = np.array([n_iter], dtype=np.int32)
        return self

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
