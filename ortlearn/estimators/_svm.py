"""Linear SVMs trained with onnxruntime: ``OrtLinearSVC``, ``OrtLinearSVR``.

The objectives of liblinear (:class:`sklearn.svm.LinearSVC`,
:class:`sklearn.svm.LinearSVR`), where the intercept is one more,
penalised, coefficient on a constant feature ``intercept_scaling``::

    1/2 * ||w~||^2 + sum_i C_i * loss_i(x~_i . w~)
    x~ = [x, intercept_scaling],  intercept_ = intercept_scaling * w~[-1]

``C_i`` is ``C`` times the sample weight (times the class weight: the
weight of the row's class for two classes; for more, one-vs-rest problem
``k`` weighs its positive rows by class ``k``'s weight and its negative rows
not at all, as liblinear does).

The squared losses (``'squared_hinge'``, ``'squared_epsilon_insensitive'``)
are smooth and piecewise quadratic: Newton's method on the primal for dense data
of up to :data:`NEWTON_MAX_FEATURES` features
(:func:`~ortlearn.training.minimize_squared_margin`: onnxruntime forms
``X~^T W X~`` over the rows inside the margin at each iteration; liblinear's
primal solver is a Newton method too); ``'squared_hinge'`` with fewer rows
than columns (sparse or wider, scikit-learn's ``dual='auto'`` rule) in its
dual, read through a factor of the rows' Gram matrix, its support then solved
exactly (:func:`~ortlearn.training.svm_dual.polish_squared_hinge`); L-BFGS on
the primal otherwise (sparse, wider). The others (``'hinge'``,
``'epsilon_insensitive'``) are not smooth. On dense data of up to
:data:`NEWTON_MAX_FEATURES` features their primal is smoothed (the loss
quadratic over a width that shrinks tenfold a stage) and solved by Newton's
method, each stage's minimum giving the partition of the rows that
liblinear's dual polish solves exactly, until a duality gap certifies the
minimum (:func:`~ortlearn.training.newton.minimize_l1_margin`). Otherwise, and
for the problems no stage certified, their liblinear dual, a bounded quadratic
program, smooth, is solved by L-BFGS-B with the gradient from onnxruntime:

- hinge: ``min 1/2 ||X~^T (a y)||^2 - sum a``, ``0 <= a_i <= C_i``, ``w~ = X~^T (a y)``
  (``y`` in {-1, 1});
- epsilon-insensitive: ``b = p - m``, ``0 <= p_i, m_i <= C_i``,
  ``min 1/2 ||X~^T b||^2 - y . b + epsilon sum (p + m)``, ``w~ = X~^T b``.
"""

from __future__ import annotations

import dataclasses
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.sparse
from sklearn.base import RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.class_weight import compute_class_weight

from ..exceptions import ConvergenceWarning
from ..log import user_stacklevel
from ..training import minimize_lbfgs, minimize_squared_margin
from ..training.newton import minimize_l1_margin
from ..training.result import CALLBACK, MAX_ITER
from ..training.sparse import is_sparse
from ..training.svm_dual import (
    is_primal_minimum,
    polish_dual,
    polish_squared_hinge,
    primal_value,
    solve_svm_dual,
)
from ._callbacks import iteration_hook
from ._docs import fill_doc
from ._fullbatch import BaseOrtFullBatch, FullBatchClassifierMixin
from ._objective import (
    COEF,
    DUAL,
    DUAL_DIAG,
    DUAL_NEG,
    LABEL,
    LOSS,
    SAMPLE_WEIGHT,
    svm_dual_objective,
    svm_primal_objective,
)

__all__ = ["OrtLinearSVC", "OrtLinearSVR"]

#: L-BFGS-B's ftol: the counterparts' minimum to float64 precision.
_FTOL = 64 * np.finfo(float).eps
#: The dual's projected-gradient tolerance is ``tol`` times this: the primal
#: objective at ``w~ = X~^T (a y)`` needs a more accurate dual than liblinear's
#: coordinate descent stops at (its ``tol`` is on another quantity).
_DUAL_GTOL_FACTOR = 1e-4

#: Rounds of the active-set polish from a smoothed primal's partition: near the minimum's
#: it needs one or two; a try that fails costs little before the next, narrower stage.
_SMOOTHED_ROUNDS = 3

#: Up to this many features (with the intercept's column) a dense primal is solved by
#: Newton's method, whose iterations solve a (p, p) system; above, by L-BFGS.
NEWTON_MAX_FEATURES = 512


class _BaseOrtLinearSVM(BaseOrtFullBatch):
    """The liblinear objectives on ``x~ = [x, intercept_scaling]`` (not for direct use)."""

    #: (loss name, dual loss name, the score of the primal)
    _smooth_loss: str
    _dual_loss: str

    def _augment(self, X):
        if not self.fit_intercept:
            return X
        column = np.full((X.shape[0], 1), float(self.intercept_scaling))
        if is_sparse(X):
            return scipy.sparse.hstack([X, column], format="csr")
        return np.hstack([X, column])

    def _check_params(self):
        if self.loss == self._dual_loss and self.dual is False:
            raise ValueError(
                f"loss={self._dual_loss!r} with dual=False is not supported (as in "
                f"scikit-learn's liblinear): use dual=True or 'auto'.")

    def _accepts_sparse(self) -> bool:
        return self.loss != self._dual_loss

    def _solve(self, X, Y, cost, **score_params):
        """Fit ``w~`` of shape (n_features + fit_intercept, n_outputs); set the attributes."""
        if is_sparse(X) and not self._accepts_sparse():
            # The dual reads X^T (and its polish dense rows): not the MatMul(X, coef)
            # that minimize_lbfgs multiplies sparsely.
            raise ValueError(
                f"loss={self.loss!r} (solved in the dual) does not accept sparse X in "
                f"{type(self).__name__}: use loss={self._smooth_loss!r} (primal, "
                "sparse products) or pass X.toarray().")
        X = self._augment(X)
        n_samples, n_features = X.shape
        n_outputs = Y.shape[1]
        options = {"max_iter": self.max_iter, "ftol": _FTOL, "maxls": 50,
                   "device": str(self.device), "verbose": int(self.verbose),
                   "remedy": "Scale the data or decrease C."}
        if self.loss == self._dual_loss:
            result = self._solve_l1_loss(X, Y, cost, score_params.get("epsilon"), options)
            coef = result.weights
        elif self._gram_dual(X, score_params):
            result = self._solve_gram_dual(X, Y, cost, options)
            coef = result.weights
        elif not is_sparse(X) and n_features <= NEWTON_MAX_FEATURES:
            epsilon = score_params.get("epsilon")
            result = minimize_squared_margin(
                X, Y if epsilon is not None else 2.0 * Y - 1.0, cost, epsilon=epsilon,
                tol=self.tol, max_iter=self.max_iter, device=str(self.device),
                verbose=int(self.verbose), callback=iteration_hook(self, self._attributes))
            if result.status == MAX_ITER:
                warnings.warn("Liblinear failed to converge, increase the number of "
                              f"iterations (max_iter={self.max_iter}).", ConvergenceWarning,
                              stacklevel=user_stacklevel())
            coef = result.weights
        else:
            model = svm_primal_objective(n_features, n_outputs, cost, self._smooth_loss,
                                      **score_params)
            result = minimize_lbfgs(
                model, [COEF], None, [X, Y, np.ones(n_samples)], ["X", LABEL, SAMPLE_WEIGHT],
                loss_output=LOSS, tol=self.tol,
                callback=iteration_hook(self, lambda w: self._attributes(w[COEF])), **options)
            coef = result.weights[COEF]
        self._weights = {COEF: coef}
        # (the dual losses: their primal at the weights, whichever problem was solved)
        self.loss_ = (float(primal_value(X, Y, cost, coef, score_params.get("epsilon")).sum())
                      if self.loss == self._dual_loss else float(result.loss))
        self.train_losses_ = [self.loss_]
        self.n_iter_ = int(np.max(result.n_iter))
        self.__dict__.update(self._attributes(coef))

    def _solve_l1_loss(self, X, Y, cost, epsilon, options):
        """The hinge or epsilon-insensitive loss: on dense data of up to
        :data:`NEWTON_MAX_FEATURES` columns the smoothed primal first
        (:meth:`_solve_smoothed`), then liblinear's dual for the problems it did not
        certify (all of them otherwise)."""
        n_samples, n_features = X.shape
        left = np.arange(Y.shape[1])
        smoothed = None
        if not is_sparse(X) and n_features <= NEWTON_MAX_FEATURES:
            smoothed = self._solve_smoothed(X, Y, cost, epsilon)
            if smoothed.status == CALLBACK or smoothed.converged.all():
                return smoothed
            left = np.flatnonzero(~smoothed.converged)
        coef = np.zeros((n_features, Y.shape[1])) if smoothed is None else smoothed.weights
        Y_left, cost_left = Y[:, left], cost[:, left]
        trainable = [DUAL] if epsilon is None else [DUAL, DUAL_NEG]

        def primal(weights, k):  # w~ of problem left[k] from its dual variables
            signed = (weights[DUAL][:, 0] * Y_left[:, k] if epsilon is None
                      else weights[DUAL][:, 0] - weights[DUAL_NEG][:, 0])
            return X.T @ signed

        hook = iteration_hook(self, self._attributes)

        def callback(weights, k, solved):  # the problems solved so far, k at this iteration
            current = coef.copy()
            current[:, left] = solved
            current[:, left[k]] = primal(weights, k)
            return hook(current)

        result = solve_svm_dual(
            svm_dual_objective(n_features, n_samples, 1, epsilon), trainable, X, Y_left,
            cost_left, epsilon, primal=primal, tol=self.tol * _DUAL_GTOL_FACTOR,
            callback=hook and callback, label=LABEL, loss_output=LOSS, **options)
        if smoothed is None:
            return result
        coef[:, left] = result.weights
        return dataclasses.replace(result, weights=coef, n_iter=max(
            int(np.max(smoothed.n_iter)), int(np.max(result.n_iter))))

    def _solve_smoothed(self, X, Y, cost, epsilon):
        """The primal of the hinge or epsilon-insensitive loss by smoothing and Newton's
        method, each smooth minimum's partition of the rows solved exactly as the dual's
        polish does (:func:`~ortlearn.training.minimize_l1_margin`); ``converged`` says
        which problems it certified."""
        def certify(dual, smooth, k):
            y, c = Y[:, k], cost[:, k]
            w = polish_dual(X, y, c, dual, epsilon, rounds=_SMOOTHED_ROUNDS)
            for candidate in (w, smooth):
                if candidate is not None and is_primal_minimum(X, y, c, candidate, epsilon):
                    return candidate
            return None

        return minimize_l1_margin(
            X, Y, cost, epsilon=epsilon,
            max_iter=self.max_iter, device=str(self.device), certify=certify,
            verbose=int(self.verbose), callback=iteration_hook(self, self._attributes))

    def _gram_dual(self, X, score_params) -> bool:
        """Whether the squared hinge is solved in its dual through the rows' Gram matrix
        (:meth:`_solve_gram_dual`): fewer rows than columns, sparse or too wide for
        Newton's method, and ``dual`` not False (scikit-learn's ``dual='auto'`` rule)."""
        n_samples, n_features = X.shape
        return (score_params.get("epsilon") is None and self.dual is not False
                and n_samples < n_features
                and (is_sparse(X) or n_features > NEWTON_MAX_FEATURES))

    def _solve_gram_dual(self, X, Y, cost, options):
        """liblinear's dual of the squared hinge (``a >= 0``, the diagonal ``1 / (4 C)``) of
        each problem, read through a factor ``Z`` of the rows' Gram matrix
        (``Z Z^T = X~ X~^T``, n_samples x n_samples): the dual reads only inner products
        of rows, and ``w~ = X~^T (a s)`` is one product at the end. Its memory is that of
        the rows, not L-BFGS's history of the n_features weights (a wide sparse ``X``:
        300 rows of 2 000 000 hashed features)."""
        signs = 2.0 * Y - 1.0
        gram = X @ X.T
        gram = gram.toarray() if is_sparse(gram) else np.asarray(gram)
        values, vectors = np.linalg.eigh(gram)
        factor = np.ascontiguousarray(vectors * np.sqrt(np.clip(values, 0.0, None)))
        n_samples = X.shape[0]

        def primal(weights, k):  # w~ of problem k from its dual variables
            return np.asarray(X.T @ (weights[DUAL][:, 0] * signs[:, k])).ravel()

        hook = iteration_hook(self, self._attributes)

        def callback(weights, k, solved):  # the problems solved so far, k at this iteration
            current = solved.copy()
            current[:, k] = primal(weights, k)
            return hook(current)

        diagonal = np.divide(0.25, cost, out=np.zeros_like(cost), where=cost > 0)
        result = solve_svm_dual(
            svm_dual_objective(n_samples, n_samples, 1, squared=True), [DUAL], factor, signs,
            cost, primal=primal, tol=self.tol * _DUAL_GTOL_FACTOR,
            callback=hook and callback, label=LABEL, loss_output=LOSS,
            diagonal=(DUAL_DIAG, diagonal), n_features=X.shape[1], **options)
        if result.status != CALLBACK:
            # the exact dual on the support L-BFGS-B found (a_i = 2 C_i max(0, 1 - margin_i))
            excess = np.maximum(0.0, 1.0 - signs * np.asarray(X @ result.weights))
            dual = polish_squared_hinge(gram, signs, cost, 2.0 * cost * excess)
            result = dataclasses.replace(result, weights=np.asarray(X.T @ (dual * signs)))
        # the primal objective at w~, as the primal solvers report it
        excess = np.maximum(0.0, 1.0 - signs * np.asarray(X @ result.weights))
        return dataclasses.replace(result, loss=0.5 * float((result.weights ** 2).sum())
                                   + float((cost * excess ** 2).sum()))

    def _attributes(self, coef):
        """``coef_`` and ``intercept_`` of ``w~`` (n_features + fit_intercept, n_outputs)."""
        if self.fit_intercept:
            return self._fitted(coef[:-1].T, float(self.intercept_scaling) * coef[-1])
        return self._fitted(coef.T, 0.0)  # scikit-learn's intercept_ without fit_intercept


@fill_doc
class OrtLinearSVC(FullBatchClassifierMixin, _BaseOrtLinearSVM):
    """Linear support vector classification (one-vs-rest) trained with onnxruntime.

    Minimises liblinear's objective of :class:`sklearn.svm.LinearSVC`, one
    binary problem per class (one for two classes)::

        1/2 * (||coef_k||^2 + (intercept_k / intercept_scaling)^2)
        + sum_i C_ik * loss(s_ik * (x_i . coef_k + intercept_k))

    with ``s_ik = +1`` for the rows of class ``k``, ``-1`` otherwise. The
    intercept is penalised, as there. ``'squared_hinge'`` (smooth): Newton's
    method on this objective, one problem after the other; with fewer rows
    than columns (sparse or wide data), L-BFGS-B on liblinear's dual through
    the rows' Gram matrix and an exact solve on its support; L-BFGS, all
    problems in one graph, for the other sparse or wide data. ``'hinge'``:
    on dense data, its primal smoothed and solved by Newton's method stage by
    stage, each stage's partition of the rows solved exactly until a duality
    gap certifies the minimum; otherwise L-BFGS-B on liblinear's dual (a
    bounded quadratic program), the gradient from onnxruntime.

    Parameters
    ----------
    penalty : {'l2'}, default='l2'
        ``'l1'`` raises a ``ValueError`` (non-smooth primal).
    loss : {'squared_hinge', 'hinge'}, default='squared_hinge'
    dual : 'auto' or bool, default='auto'
        ``'squared_hinge'``: ``'auto'`` and True solve the dual when there are
        fewer rows than columns and Newton's method does not apply (sparse, or
        more than 512 columns), False the primal (the same minimum);
        ``'hinge'`` as above, the same minimum (``dual=False`` raises, as there).
    tol : float, default=1e-4
        The primal's largest gradient component at the end (``gtol`` of
        L-BFGS-B on sparse or wide data); the dual's is ``tol * 1e-4``.
    C : float, default=1.0
        Weight of the losses.
    multi_class : {'ovr'}, default='ovr'
        ``'crammer_singer'`` raises a ``ValueError``.
    fit_intercept : bool, default=True
    intercept_scaling : float, default=1
        Value of the constant feature whose (penalised) coefficient gives the
        intercept.
    class_weight : dict, 'balanced' or None, default=None
        Multiplies ``C`` for the rows of a class (positive rows only in a
        one-vs-rest problem, as liblinear).
    verbose : int, default=0
        > 0 prints the loss after each Newton or L-BFGS iteration.
    random_state : int, RandomState instance or None, default=None
        Unused (accepted, as there: the order of liblinear's coordinate descent).
    max_iter : int, default=1000
        Maximum number of iterations (Newton's: of each problem).
    {device}

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)
    n_iter_ : int
        Iterations run (all classes together).
    loss_ : float
        liblinear's primal objective at the returned weights.
    {fitted}

    See Also
    --------
    sklearn.svm.LinearSVC : The scikit-learn estimator.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from ortlearn.estimators import OrtLinearSVC
    >>> X, y = load_iris(return_X_y=True)
    >>> clf = OrtLinearSVC().fit(X, y)
    >>> clf.predict(X[:2])
    array([0, 0])
    >>> round(clf.score(X, y), 2)
    0.97
    """

    _parameter_constraints: dict = {
        "penalty": [StrOptions({"l1", "l2"})],
        "loss": [StrOptions({"hinge", "squared_hinge"})],
        "dual": ["boolean", StrOptions({"auto"})],
        "tol": [Interval(Real, 0.0, None, closed="neither")],
        "C": [Interval(Real, 0.0, None, closed="neither")],
        "multi_class": [StrOptions({"ovr", "crammer_singer"})],
        "fit_intercept": ["boolean"],
        "intercept_scaling": [Interval(Real, 0, None, closed="neither")],
        "class_weight": [None, dict, StrOptions({"balanced"})],
        "verbose": ["verbose"],
        "random_state": ["random_state"],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "device": [str],
    }
    _smooth_loss, _dual_loss = "squared_hinge", "hinge"

    def __init__(self, penalty="l2", loss="squared_hinge", *, dual="auto", tol=1e-4, C=1.0,
                 multi_class="ovr", fit_intercept=True, intercept_scaling=1,
                 class_weight=None, verbose=0, random_state=None, max_iter=1000,
                 device="cpu"):
        self.penalty = penalty
        self.loss = loss
        self.dual = dual
        self.tol = tol
        self.C = C
        self.multi_class = multi_class
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.class_weight = class_weight
        self.verbose = verbose
        self.random_state = random_state
        self.max_iter = max_iter
        self.device = device

    def _check_params(self):
        if self.penalty != "l2":
            raise ValueError(f"penalty={self.penalty!r} is not available in OrtLinearSVC: "
                             "only penalty='l2' (a smooth primal or a bounded dual).")
        if self.multi_class != "ovr":
            raise ValueError(f"multi_class={self.multi_class!r} is not available in "
                             "OrtLinearSVC: only 'ovr'.")
        super()._check_params()

    def _fit_validated(self, X, y, sample_weight):
        # One one-vs-rest problem per class, solved together.
        classes, index = self._encode_labels(y)
        class_weight = compute_class_weight(self.class_weight, classes=classes, y=y,
                                            sample_weight=sample_weight)
        base = float(self.C) * sample_weight
        if len(classes) == 2:
            positive = (index == 1)[:, None]
            cost = (base * class_weight[index])[:, None]
        else:
            positive = index[:, None] == np.arange(len(classes))
            # liblinear's one-vs-rest: the positive rows weighted by their class, the rest not.
            cost = base[:, None] * np.where(positive, class_weight[None, :], 1.0)
        self.classes_ = classes
        if self.loss == "hinge":
            Y = np.where(positive, 1.0, -1.0)
        else:
            Y = positive.astype(np.float64)  # the score's labels: 1 positive, 0 negative
        self._solve(X, Y, cost)
        return self

    def _fitted(self, coef, intercept):
        return {"coef_": np.ascontiguousarray(coef).astype(self._dtype),
                "intercept_": (np.asarray(intercept, dtype=self._dtype) if self.fit_intercept
                               else 0.0)}

    def _inference_outputs(self, b, raw, elem):
        """``raw_scores`` and ``label`` (one of ``classes_``)."""
        b.op("Identity", [raw], outputs=["raw_scores"])
        return [self._label_output(b, raw), ("raw_scores", elem, ["N", self.coef_.shape[0]])]


@fill_doc
class OrtLinearSVR(RegressorMixin, _BaseOrtLinearSVM):
    """Linear support vector regression trained with onnxruntime.

    Minimises liblinear's objective of :class:`sklearn.svm.LinearSVR`::

        1/2 * (||coef||^2 + (intercept / intercept_scaling)^2)
        + C * sum_i w_i * loss(y_i - x_i . coef - intercept)

    ``'squared_epsilon_insensitive'`` (smooth): Newton's method on this
    objective (L-BFGS for sparse or wide data); ``'epsilon_insensitive'``:
    its primal smoothed and solved by Newton's method stage by stage, each
    stage's partition of the rows solved exactly until a duality gap certifies
    the minimum (dense data of up to 512 columns); otherwise, or where no stage
    is certified, L-BFGS-B on liblinear's dual (a bounded quadratic program),
    the gradient from onnxruntime, stopped once the exact solution on the
    partition of rows it reached is certified the minimum.

    Parameters
    ----------
    epsilon : float, default=0.0
        Half-width of the insensitive band.
    tol : float, default=1e-4
        The primal's largest gradient component at the end; the dual's
        projected gradient's is ``tol * 1e-4``.
    C : float, default=1.0
    loss : {'epsilon_insensitive', 'squared_epsilon_insensitive'}, \
default='epsilon_insensitive'
    fit_intercept : bool, default=True
    intercept_scaling : float, default=1.0
        Value of the constant feature whose (penalised) coefficient gives the
        intercept.
    dual : 'auto' or bool, default='auto'
        ``'squared_epsilon_insensitive'`` is solved in the primal whatever
        its value; ``'epsilon_insensitive'`` as above, the same minimum
        (``dual=False`` raises, as there).
    verbose : int, default=0
    random_state : int, RandomState instance or None, default=None
        Unused (accepted, as there).
    max_iter : int, default=1000
        Maximum number of iterations.
    {device}
    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : ndarray of shape (1,)
    n_iter_ : int
    loss_ : float
        liblinear's primal objective at the returned weights.
    {fitted}

    See Also
    --------
    sklearn.svm.LinearSVR : The scikit-learn estimator.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtLinearSVR
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(50, 2)
    >>> y = X @ [2.0, -1.0] + 0.5
    >>> reg = OrtLinearSVR(C=10.0).fit(X, y)
    >>> reg.coef_.round(2)
    array([ 2., -1.])
    """

    _parameter_constraints: dict = {
        "epsilon": [Real],
        "tol": [Interval(Real, 0.0, None, closed="neither")],
        "C": [Interval(Real, 0.0, None, closed="neither")],
        "loss": [StrOptions({"epsilon_insensitive", "squared_epsilon_insensitive"})],
        "fit_intercept": ["boolean"],
        "intercept_scaling": [Interval(Real, 0, None, closed="neither")],
        "dual": ["boolean", StrOptions({"auto"})],
        "verbose": ["verbose"],
        "random_state": ["random_state"],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "device": [str],
    }
    _smooth_loss, _dual_loss = "squared_epsilon_insensitive", "epsilon_insensitive"

    def __init__(self, *, epsilon=0.0, tol=1e-4, C=1.0, loss="epsilon_insensitive",
                 fit_intercept=True, intercept_scaling=1.0, dual="auto", verbose=0,
                 random_state=None, max_iter=1000, device="cpu"):
        self.epsilon = epsilon
        self.tol = tol
        self.C = C
        self.loss = loss
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.dual = dual
        self.verbose = verbose
        self.random_state = random_state
        self.max_iter = max_iter
        self.device = device

    def _fit_validated(self, X, y, sample_weight):
        Y = np.asarray(y, dtype=np.float64).reshape(-1, 1)
        cost = (float(self.C) * sample_weight)[:, None]
        self._solve(X, Y, cost, epsilon=float(self.epsilon))
        return self

    def _fitted(self, coef, intercept):
        return {"coef_": coef[0].astype(self._dtype),
                "intercept_": (np.asarray(intercept, dtype=self._dtype) if self.fit_intercept
                               else 0.0)}
