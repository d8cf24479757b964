"""Huber regression trained with ortlearn's L-BFGS: ``OrtHuberRegressor``.

The objective of :class:`sklearn.linear_model.HuberRegressor` (Owen's
concomitant scale estimate), over ``coef``, ``intercept`` and the scale
``sigma`` jointly, with sample weights ``w``::

    sum_i w_i * (sigma + sigma * H(r_i / sigma)) + alpha * ||coef||^2
    r_i = y_i - x_i . coef - intercept
    H(z) = z^2 if |z| <= epsilon else 2 * epsilon * |z| - epsilon^2

written ``sigma + m^2 / sigma + 2 epsilon (|r| - m)`` with
``m = min(|r|, epsilon sigma)`` (exact gradients near ``sigma = 0``); ``sigma`` is
bounded below by ``10 * eps`` (L-BFGS-B bounds), scipy's other options are
scikit-learn's (its defaults: ``maxls=20``, ``ftol=2.2e-9``).
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.utils._param_validation import Interval

from ._docs import fill_doc
from ._fullbatch import BaseOrtFullBatch
from ._objective import COEF, INTERCEPT, linear_objective

__all__ = ["OrtHuberRegressor"]

SCALE = "scale"
#: scipy's defaults, which HuberRegressor keeps (its other L-BFGS paths change them).
_SCIPY_FTOL, _SCIPY_MAXLS = 1e7 * np.finfo(float).eps, 20


@fill_doc
class OrtHuberRegressor(RegressorMixin, BaseOrtFullBatch):
    """Huber regression (robust to outliers) trained with onnxruntime and L-BFGS.

    Minimises the objective of :class:`sklearn.linear_model.HuberRegressor`
    over the coefficients, the intercept and the scale ``sigma`` together::

        sum_i w_i * (sigma + sigma * H(r_i / sigma)) + alpha * ||coef||^2

    with ``r`` the residuals and ``H(z) = z^2`` for ``|z| <= epsilon``,
    ``2 * epsilon * |z| - epsilon^2`` beyond; ``sigma >= 10 * eps`` is a
    bound of L-BFGS-B, as there.

    Parameters
    ----------
    epsilon : float, default=1.35
        Threshold (>= 1) between the squared and the absolute loss, in units
        of ``sigma``.
    max_iter : int, default=100
        Maximum number of L-BFGS iterations.
    alpha : float, default=0.0001
        Strength of the squared L2 penalty.
    warm_start : bool, default=False
        Start from ``coef_``, ``intercept_`` and ``scale_`` of the previous fit.
    fit_intercept : bool, default=True
    tol : float, default=1e-05
        ``gtol`` of L-BFGS-B: stop when the largest projected gradient
        component is below it.
    {device}

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : float
    scale_ : float
        The fitted ``sigma``.
    outliers_ : ndarray of bool of shape (n_samples,)
        Training samples with ``|r| > scale_ * epsilon``.
    n_iter_ : int
        L-BFGS iterations run.
    loss_ : float
        Objective at the returned weights.
    {fitted}

    See Also
    --------
    sklearn.linear_model.HuberRegressor : The scikit-learn estimator.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtHuberRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(50, 2)
    >>> y = X @ [2.0, -1.0] + 0.1 * rng.randn(50)
    >>> y[:4] += 20  # outliers
    >>> reg = OrtHuberRegressor().fit(X, y)
    >>> reg.coef_.round(1)
    array([ 2., -1.])
    >>> reg.outliers_[:4]
    array([ True,  True,  True,  True])
    """

    _parameter_constraints: dict = {
        "epsilon": [Interval(Real, 1.0, None, closed="left")],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "warm_start": ["boolean"],
        "fit_intercept": ["boolean"],
        "tol": [Interval(Real, 0.0, None, closed="left")],
        "device": [str],
    }

    def __init__(self, *, epsilon=1.35, max_iter=100, alpha=0.0001, warm_start=False,
                 fit_intercept=True, tol=1e-05, device="cpu"):
        self.epsilon = epsilon
        self.max_iter = max_iter
        self.alpha = alpha
        self.warm_start = warm_start
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.device = device

    def _lbfgs_options(self) -> dict:
        return {"max_iter": self.max_iter, "tol": self.tol, "ftol": _SCIPY_FTOL,
                "maxls": _SCIPY_MAXLS}

    def _bounds(self, n_features: int, n_outputs: int):
        return {SCALE: (10 * np.finfo(np.float64).eps, None)}

    def _fit_validated(self, X, y, sample_weight):
        # The coefficients, intercept and scale together, with L-BFGS-B.
        y = np.asarray(y, dtype=np.float64)
        n_features = X.shape[1]
        epsilon = float(self.epsilon)

        def row_loss(b, raw, label):
            # sigma * (1 + H(r / sigma)) = sigma + m^2 / sigma + 2 eps (|r| - m), with
            # m = min(|r|, eps sigma). Not the 'huber' score of r / sigma: near the bound
            # sigma = 10 eps (where L-BFGS-B steps on the way) its gradient in sigma is
            # the difference of two terms of size |r| / sigma and loses every digit; here
            # m / sigma <= eps keeps it exact, as scikit-learn's analytic gradient.
            f64 = np.float64
            absolute = b.op("Abs", [b.op("Sub", [label, raw])])
            threshold = b.op("Mul", [b.const(epsilon, f64), SCALE])
            m = b.op("Min", [absolute, threshold])
            quadratic = b.op("Div", [b.op("Mul", [m, m]), SCALE])
            linear = b.op("Mul", [b.const(2 * epsilon, f64), b.op("Sub", [absolute, m])])
            return b.op("Add", [SCALE, b.op("Add", [quadratic, linear])])

        initial = {}
        if self.warm_start and hasattr(self, "coef_") and len(self.coef_) == n_features:
            initial = {COEF: np.asarray(self.coef_, np.float64).reshape(-1, 1),
                       SCALE: np.array([self.scale_], np.float64)}
            if self.fit_intercept:
                initial[INTERCEPT] = np.array([self.intercept_], np.float64)
        model = linear_objective(n_features, 1, row_loss, fit_intercept=self.fit_intercept,
                                 data_scale=1.0, l2=self.alpha,
                                 extra_weights={SCALE: np.ones(1)},
                                 loss_key=("huber", epsilon))

        def attributes(weights):
            return {"coef_": weights[COEF][:, 0].astype(self._dtype),
                    "intercept_": (float(weights[INTERCEPT][0]) if self.fit_intercept
                                   else 0.0),
                    "scale_": float(weights[SCALE][0])}

        weights, n_iter = self._minimize(model, X, y.reshape(-1, 1), sample_weight, initial,
                                         attributes)
        self._weights = weights
        self.__dict__.update(attributes(weights))
        self.n_iter_ = n_iter
        residual = np.abs(y - X @ weights[COEF][:, 0] - self.intercept_)
        self.outliers_ = residual > self.scale_ * epsilon
        return self
