"""Lasso and elastic net, by coordinate descent or a proximal gradient: ``OrtLasso``,
``OrtElasticNet``.

The objective of :class:`sklearn.linear_model.ElasticNet` (``Lasso`` is
``l1_ratio=1``), with the sample weights ``w`` rescaled to sum to
``n_samples`` as scikit-learn does::

    1 / (2 n) * sum_i w_i (y_i - x_i . coef - intercept)^2
    + alpha * l1_ratio * ||coef||_1 + alpha * (1 - l1_ratio) / 2 * ||coef||^2

scikit-learn runs coordinate descent over the columns of ``X``. Here, when
``X`` is dense with fewer features than rows, onnxruntime forms the data's
products ``X^T W X``, ``X^T W y`` and ``y^T W y`` in one pass
(:func:`~ortlearn.training.normal_equations.weighted_products`) and
scikit-learn's ``enet_path`` sweeps them
(:func:`~ortlearn.training.minimize_coordinate_descent`): the same sweeps,
each ``p^2`` flops instead of ``2 n p``, so the same coefficients, duality
gap and ``n_iter_`` as scikit-learn's, and ``selection``, ``random_state``,
``positive`` and ``warm_start`` act as there. On sparse or wide data FISTA
with adaptive restart (O'Donoghue & Candes, 2015) runs on the smooth part
(the squared error and the L2 term), onnxruntime evaluating it and its
gradient in one call per iteration
(:func:`ortlearn.training.loss_and_gradient`, on the float64 graph of
:func:`~ortlearn.estimators._objective.linear_objective`), the host applying
the soft-thresholding prox of the L1 term, which gives exact zeros. The
step is ``1 / L`` with ``L`` the largest eigenvalue of ``X^T W X / n`` plus
the L2 factor: exact up to 64 features; above, estimated from below by a few
power iterations and raised by a backtracking test (exact for a quadratic:
the curvature along the step, from the two gradients) that rejects a step
too long. The smooth part is quadratic, so its gradient is affine: the
gradient at the extrapolated point is the same combination of the
gradients at the last two iterates, and each iteration needs ONE evaluation,
at the iterate, from which scikit-learn's duality gap is computed. Both
stop when that gap is below ``tol * ||y||^2 / n`` (``tol`` of
scikit-learn's coordinate descent) or after ``max_iter`` iterations.
"""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import MultiOutputMixin, RegressorMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions

from ..exceptions import ConvergenceWarning
from ..log import user_stacklevel
from ..loss import elementwise_loss
from ..training import (
    largest_eigenvalue,
    loss_and_gradient,
    minimize_coordinate_descent,
    minimize_fista,
)
from ..training.normal_equations import GRAM_MAX_FEATURES, weighted_products
from ..training.result import CALLBACK, MAX_ITER
from ..training.sparse import is_sparse
from ._callbacks import iteration_hook
from ._docs import fill_doc
from ._fullbatch import BaseOrtFullBatch, center_data, weighted_mean
from ._objective import COEF, LABEL, SAMPLE_WEIGHT, linear_objective

__all__ = ["OrtElasticNet", "OrtLasso"]

def _duality_gap(coef, XtR, yy, Xty, alpha, beta, positive):
    """scikit-learn's duality gap of each target (``_cd_fast.gap_enet``), in its units.

    ``coef`` (n_features, k) on the centred, weighted problem; ``XtR`` the
    columns of ``X^T W (y - X coef)``; ``yy`` and ``Xty`` of ``y^T W y`` and
    ``X^T W y``; ``alpha = n alpha l1_ratio`` and ``beta = n alpha (1 -
    l1_ratio)`` (the objective multiplied by ``n``).
    """
    Ry = yy - np.einsum("jk,jk->k", coef, Xty)
    R_norm2 = Ry - np.einsum("jk,jk->k", coef, XtR)
    w_l2 = np.einsum("jk,jk->k", coef, coef)
    if alpha == 0:
        xtr_norm2 = np.einsum("jk,jk->k", XtR, XtR)
        if beta == 0:  # least squares: the first-order condition, as scikit-learn
            return xtr_norm2
        return R_norm2 + 0.5 * beta * w_l2 - Ry + xtr_norm2 / (2 * beta)
    XtA = XtR - beta * coef
    dual_norm = XtA.max(axis=0) if positive else np.abs(XtA).max(axis=0)
    primal = 0.5 * (R_norm2 + beta * w_l2) + alpha * np.abs(coef).sum(axis=0)
    scale = np.where(dual_norm > alpha, alpha / np.maximum(dual_norm, np.finfo(float).tiny),
                     1.0)
    dual = -0.5 * scale ** 2 * (R_norm2 + beta * w_l2) + scale * Ry
    return primal - dual


def _warn_not_converged(max_iter, gap, tol, n_samples):
    """scikit-learn's warning where the duality gap missed its tolerance (both given in
    its units, multiplied by ``n_samples``)."""
    warnings.warn(
        f"Objective did not converge. You might want to increase the number of "
        f"iterations (max_iter={max_iter}). Duality gap: {np.max(gap) / n_samples:.3e}, "
        f"tolerance: {np.max(tol) / n_samples:.3e}",
        ConvergenceWarning, stacklevel=user_stacklevel())


@fill_doc
class OrtElasticNet(MultiOutputMixin, RegressorMixin, BaseOrtFullBatch):
    """Linear regression with L1 and L2 penalties, by coordinate descent or a proximal gradient.

    Minimises the objective of :class:`sklearn.linear_model.ElasticNet`::

        1 / (2 n_samples) * ||y - X coef - intercept||^2_w
        + alpha * l1_ratio * ||coef||_1 + alpha * (1 - l1_ratio) / 2 * ||coef||^2

    On dense data with fewer features than rows, onnxruntime forms ``X^T W X``
    and ``X^T W y`` once and scikit-learn's coordinate descent sweeps them (the
    sweeps it makes on ``X``, each ``p^2`` flops instead of ``2 n p``: the same
    coefficients, ``dual_gap_`` and ``n_iter_``); otherwise FISTA with adaptive
    restart: onnxruntime computes the smooth part's gradient (one call per
    iteration), the host soft-thresholds (exact zeros). The fit ends on
    scikit-learn's duality gap, so ``tol`` and ``dual_gap_`` mean what they mean
    there; ``max_iter`` counts sweeps or FISTA iterations. Several targets are
    independent problems.

    Parameters
    ----------
    alpha : float, default=1.0
        Strength of the penalty.
    l1_ratio : float, default=0.5
        Share of the L1 penalty (1: the Lasso, 0: ridge).
    fit_intercept : bool, default=True
        Learn an intercept (X and y are centred with their weighted means,
        as scikit-learn does).
    precompute : bool or array-like, default=False
        Accepted, unused (onnxruntime forms the Gram matrix where it pays).
    max_iter : int, default=1000
        Maximum number of coordinate-descent sweeps or FISTA iterations.
    copy_X : bool, default=True
        X is never modified (accepted, as there).
    tol : float, default=1e-4
        Stop when the duality gap is below ``tol * ||y||^2 / n_samples``.
    warm_start : bool, default=False
        Start from ``coef_`` of the previous fit.
    positive : bool, default=False
        Constrain the coefficients to be >= 0.
    random_state : int, RandomState instance or None, default=None
        The order of ``selection='random'``, as there.
    selection : {'cyclic', 'random'}, default='cyclic'
        The order of the coordinates in a sweep, as there (FISTA, on sparse or
        wide data, updates every coefficient at once).
    {device}

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
    intercept_ : float or ndarray of shape (n_targets,)
    dual_gap_ : float or ndarray of shape (n_targets,)
        Duality gap at the end of the fit (divided by ``n_samples``, as there).
    n_iter_ : int or list of int
        Sweeps or FISTA iterations each target needed.
    loss_ : float
        Smooth part of the objective (squared error and L2 term, all targets).
    {fitted}

    See Also
    --------
    sklearn.linear_model.ElasticNet : The scikit-learn estimator.
    OrtLasso : ``l1_ratio=1``.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtElasticNet
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(50, 4)
    >>> y = X @ [2.0, 0.0, -1.0, 0.0] + 0.1 * rng.randn(50)
    >>> reg = OrtElasticNet(alpha=0.1, l1_ratio=0.9).fit(X, y)
    >>> reg.coef_.round(2)
    array([ 1.91, -0.  , -0.86,  0.  ])
    """

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="left")],
        "l1_ratio": [Interval(Real, 0, 1, closed="both")],
        "fit_intercept": ["boolean"],
        "precompute": ["boolean", "array-like"],
        "max_iter": [Interval(Integral, 1, None, closed="left"), None],
        "copy_X": ["boolean"],
        "tol": [Interval(Real, 0, None, closed="left")],
        "warm_start": ["boolean"],
        "positive": ["boolean"],
        "random_state": ["random_state"],
        "selection": [StrOptions({"cyclic", "random"})],
        "device": [str],
    }
    _multi_output = True

    def __init__(self, alpha=1.0, *, l1_ratio=0.5, fit_intercept=True, precompute=False,
                 max_iter=1000, copy_X=True, tol=1e-4, warm_start=False, positive=False,
                 random_state=None, selection="cyclic", device="cpu"):
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.precompute = precompute
        self.max_iter = max_iter
        self.copy_X = copy_X
        self.tol = tol
        self.warm_start = warm_start
        self.positive = positive
        self.random_state = random_state
        self.selection = selection
        self.device = device

    def _l1_ratio(self) -> float:
        return float(self.l1_ratio)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None, check_input=True):
        """Fit the model on the whole data set (coordinate descent, or FISTA).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : float or array-like of shape (n_samples,), default=None
            Rescaled to sum to ``n_samples``, as scikit-learn does.
        check_input : bool, default=True
            Accepted (the input is always checked).

        Returns
        -------
        self : object
        """
        if np.isscalar(sample_weight):
            sample_weight = None
        if self.alpha == 0:  # scikit-learn's warning: coordinate descent without a penalty
            warnings.warn("With alpha=0, this algorithm does not converge well. You are "
                          "advised to use the LinearRegression estimator",
                          stacklevel=user_stacklevel())
        return self._fit(X, y, sample_weight)

    def _fit_validated(self, X, y, sample_weight):
        n_samples, n_features = X.shape
        sample_weight = sample_weight * (n_samples / sample_weight.sum())
        y = np.asarray(y, dtype=np.float64)
        Y = y.reshape(n_samples, -1)
        n_targets = Y.shape[1]
        x_offset = None
        if self.fit_intercept:
            x_mean, X, x_offset = center_data(X, sample_weight)
            y_mean = weighted_mean(Y, sample_weight)
            Y = Y - y_mean
        Y = np.ascontiguousarray(Y)
        l1_ratio = self._l1_ratio()
        alpha = float(self.alpha)
        l1, l2 = alpha * l1_ratio, alpha * (1 - l1_ratio)

        coef = np.zeros((n_features, n_targets))
        if self.warm_start and hasattr(self, "coef_"):
            previous = np.atleast_2d(np.asarray(self.coef_, np.float64))
            if previous.shape == (n_targets, n_features):
                coef = np.ascontiguousarray(previous.T)

        def attributes(weights):
            coef = weights[COEF]
            intercept = y_mean - x_mean @ coef if self.fit_intercept else np.zeros(n_targets)
            if y.ndim == 1:
                return {"coef_": coef[:, 0].astype(self._dtype),
                        "intercept_": float(intercept[0]) if self.fit_intercept else 0.0}
            return {"coef_": np.ascontiguousarray(coef.T).astype(self._dtype),
                    "intercept_": intercept.astype(self._dtype)}

        max_iter = 1000 if self.max_iter is None else self.max_iter
        hook = iteration_hook(self, attributes)
        if self._on_gram(X):
            smooth, (yy, Xty, gram) = self._gram_objective(X, Y, sample_weight, l2)
            # the targets as the products weighted them: their norms scale the tolerance
            rows = Y if np.all(sample_weight == 1.0) else np.sqrt(sample_weight)[:, None] * Y
            result = minimize_coordinate_descent(
                X, rows, gram, Xty, alpha, l1_ratio, coef=coef, max_iter=max_iter,
                tol=self.tol, positive=self.positive, selection=self.selection,
                random_state=self.random_state,
                callback=None if hook is None else (lambda w: hook({COEF: w})))
            coef, gap, n_iter = result.weights, result.info["gap"], result.n_iter
            loss = smooth(coef)
            if result.status == MAX_ITER:
                _warn_not_converged(max_iter, gap, self.tol * yy, n_samples)
        else:
            smooth, products = self._graph_objective(X, Y, sample_weight, l2, x_offset, coef)
            coef, gap, n_iter, loss = self._fista(smooth, coef, n_samples, products, l1, l2,
                                                  hook)
        self._weights = {COEF: coef}
        self.loss_ = float(loss)
        self.train_losses_ = [self.loss_]
        self.__dict__.update(attributes(self._weights))
        gap = gap / n_samples
        if y.ndim == 1:
            self.dual_gap_ = float(gap[0])
            self.n_iter_ = int(n_iter[0])
        else:
            self.dual_gap_ = gap
            self.n_iter_ = [int(i) for i in n_iter]
        return self

    def _on_gram(self, X) -> bool:
        """Whether the iterations run on the Gram matrix: a dense ``X`` with fewer
        features than rows (an iteration then costs ``p^2`` flops instead of ``2 n p``),
        of at most ``GRAM_MAX_FEATURES``."""
        n_samples, n_features = X.shape
        return not is_sparse(X) and n_features <= min(n_samples, GRAM_MAX_FEATURES)

    def _gram_objective(self, X, Y, sample_weight, l2):
        """The smooth part's value from ``X^T W X``, ``X^T W Y`` and ``y^T W y``
        (onnxruntime forms them in one pass; ``X`` and ``Y`` are centred), and those
        products."""
        n_samples = X.shape[0]
        gram, Xty, yy = weighted_products(X, Y, sample_weight, device=str(self.device))

        def smooth(w):
            # 1/(2n) ||y - X w||_W^2 + l2/2 ||w||^2, in p^2 flops
            data = yy.sum() - 2 * np.sum(w * Xty) + np.sum(w * (gram @ w))
            return 0.5 * data / n_samples + 0.5 * l2 * np.sum(w * w)

        return smooth, (yy, Xty, gram)

    def _graph_objective(self, X, Y, sample_weight, l2, x_offset, coef):
        """The smooth part evaluated by onnxruntime on the data (sparse or wide ``X``),
        and the products the duality gap and the step read."""
        n_samples, n_features = X.shape

        def row_loss(b, raw, label):
            return elementwise_loss(b, "squared_error", raw, label, np.float64)

        # The smooth part: 1/(2n) sum_i w_i r_i^2 + l2/2 ||coef||^2.
        model = linear_objective(n_features, Y.shape[1], row_loss, fit_intercept=False,
                                 data_scale=0.5 / n_samples, l2=0.5 * l2, x_offset=x_offset,
                                 loss_key="squared_error")
        fun, _ = loss_and_gradient(model, [COEF], {COEF: coef}, [X, Y, sample_weight],
                                   ["X", LABEL, SAMPLE_WEIGHT], device=str(self.device))

        def smooth(w):
            loss, grad = fun(w.ravel())
            return loss, grad.reshape(w.shape)

        weighted_Y = sample_weight[:, None] * Y
        yy = np.einsum("ik,ik->k", Y, weighted_Y)
        # Y is centred with the weights: Xc^T W Y = X^T W Y (x_offset drops out)
        Xty = np.asarray(X.T @ weighted_Y)
        return smooth, (yy, Xty, *largest_eigenvalue(X, sample_weight, x_offset))

    def _fista(self, smooth, coef, n_samples, products, l1, l2, hook=None):
        """:func:`~ortlearn.training.minimize_fista` on this objective, one column per target.

        ``smooth(coef) -> (loss, gradient)`` is the smooth part; ``products`` are
        ``(y^T W y, X^T W y, L, exact)``, ``L`` the top eigenvalue of ``X^T W X``.
        Returns ``(coef, gap, n_iter, loss)``, the gap in scikit-learn's units
        (multiplied by ``n_samples``). ``hook({'coef': coef}) -> stop`` after
        each accepted iteration (scikit-learn's callbacks).
        """
        yy, Xty, top, exact = products
        tol = self.tol * yy
        max_iter = 1000 if self.max_iter is None else self.max_iter
        positive = self.positive

        def prox(v, step):
            threshold = step * l1
            if positive:
                return np.maximum(v - threshold, 0.0)
            return np.sign(v) * np.maximum(np.abs(v) - threshold, 0.0)

        def gap(w, grad):
            # grad = -X^T W R / n + l2 coef: scikit-learn's X^T R in its units.
            XtR = -n_samples * (grad - l2 * w)
            return _duality_gap(w, XtR, yy, Xty, n_samples * l1, n_samples * l2, positive)

        # A zero Lipschitz constant (X constant, no L2): the smooth part is flat, any step.
        result = minimize_fista(
            smooth, coef, prox, top / n_samples + l2 or 1.0, gap=gap, tol=tol,
            max_iter=max_iter, exact_lipschitz=exact,
            callback=None if hook is None else (lambda w: hook({COEF: w})))
        if not result.converged.all() and result.status != CALLBACK:
            _warn_not_converged(max_iter, result.info["gap"], tol, n_samples)
        return result.weights, result.info["gap"], result.n_iter, result.loss


@fill_doc
class OrtLasso(OrtElasticNet):
    """Linear regression with an L1 penalty, by coordinate descent or a proximal gradient.

    :class:`OrtElasticNet` with ``l1_ratio=1``: the objective of
    :class:`sklearn.linear_model.Lasso`::

        1 / (2 n_samples) * ||y - X coef - intercept||^2_w + alpha * ||coef||_1

    Parameters
    ----------
    alpha : float, default=1.0
        Strength of the L1 penalty.
    fit_intercept : bool, default=True
    precompute : bool or array-like, default=False
        Accepted, unused.
    copy_X : bool, default=True
        Accepted (X is never modified).
    max_iter : int, default=1000
        Maximum number of coordinate-descent sweeps or FISTA iterations.
    tol : float, default=1e-4
        Stop when the duality gap is below ``tol * ||y||^2 / n_samples``.
    warm_start : bool, default=False
    positive : bool, default=False
    random_state : int, RandomState instance or None, default=None
        The order of ``selection='random'``.
    selection : {'cyclic', 'random'}, default='cyclic'
        The order of the coordinates in a sweep.
    {device}
    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
    intercept_ : float or ndarray of shape (n_targets,)
    dual_gap_ : float or ndarray of shape (n_targets,)
    n_iter_ : int or list of int
    loss_ : float
    {fitted}

    See Also
    --------
    sklearn.linear_model.Lasso : The scikit-learn estimator.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtLasso
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(50, 4)
    >>> y = X @ [2.0, 0.0, -1.0, 0.0] + 0.1 * rng.randn(50)
    >>> reg = OrtLasso(alpha=0.1).fit(X, y)
    >>> reg.coef_.round(2)
    array([ 1.92, -0.  , -0.86,  0.  ])
    """

    _parameter_constraints: dict = {
        k: v for k, v in OrtElasticNet._parameter_constraints.items() if k != "l1_ratio"}

    def __init__(self, alpha=1.0, *, fit_intercept=True, precompute=False, copy_X=True,
                 max_iter=1000, tol=1e-4, warm_start=False, positive=False,
                 random_state=None, selection="cyclic", device="cpu"):
        super().__init__(alpha=alpha, l1_ratio=1.0, fit_intercept=fit_intercept,
                         precompute=precompute, max_iter=max_iter, copy_X=copy_X, tol=tol,
                         warm_start=warm_start, positive=positive,
                         random_state=random_state, selection=selection, device=device)

    def _l1_ratio(self) -> float:
        return 1.0
