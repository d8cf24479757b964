"""Generalized linear models trained with ortlearn's L-BFGS.

``OrtPoissonRegressor``, ``OrtGammaRegressor`` and ``OrtTweedieRegressor``:
the objective of scikit-learn's ``_GeneralizedLinearRegressor`` with
``solver='lbfgs'``::

    sum_i w_i * half_deviance(y_i, link^-1(x_i . coef + intercept)) / sum_i w_i
        + alpha / 2 * ||coef||^2

with the half deviances of :mod:`ortlearn.loss` (``'poisson'``, ``'gamma'``,
``'tweedie'``, which leave out the terms of ``y`` alone: same gradient,
same minimiser), scipy's L-BFGS-B with scikit-learn's options and its
starting point (zero ``coef``, ``intercept = link(average(y))``).
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.metrics import d2_tweedie_score
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ..loss import elementwise_loss
from ._docs import fill_doc
from ._fullbatch import BaseOrtFullBatch
from ._objective import COEF, INTERCEPT, linear_objective

__all__ = ["OrtGammaRegressor", "OrtPoissonRegressor", "OrtTweedieRegressor"]


class _BaseOrtGLM(RegressorMixin, BaseOrtFullBatch):
    """Fit, predict and score of the GLMs (not for direct use)."""

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0.0, None, closed="left")],
        "fit_intercept": ["boolean"],
        "solver": [StrOptions({"lbfgs", "newton-cholesky"})],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0.0, None, closed="neither")],
        "warm_start": ["boolean"],
        "verbose": ["verbose"],
        "device": [str],
    }

    def __init__(self, *, alpha=1.0, fit_intercept=True, solver="lbfgs", max_iter=100,
                 tol=1e-4, warm_start=False, verbose=0, device="cpu"):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.max_iter = max_iter
        self.tol = tol
        self.warm_start = warm_start
        self.verbose = verbose
        self.device = device

    # ---------------------------------------------------------------- family
    def _family(self) -> tuple[str, float]:
        """``(link, power)``: 'log' or 'identity', the Tweedie power of the deviance."""
        raise NotImplementedError

    def _row_loss(self, link: str, power: float):
        if link == "identity":
            # power 0 with the identity link: half the squared error.
            def squared(b, raw, label):
                return b.op("Mul", [b.const(0.5, np.float64),
                                    elementwise_loss(b, "squared_error", raw, label,
                                                     np.float64)])
            return squared

        def deviance(b, raw, label):
            return elementwise_loss(b, "tweedie", raw, label, np.float64, power=power)
        return deviance

    @property
    def _inverse_link_op(self):
        return "Exp" if self._family()[0] == "log" else None

    def _check_y(self, y, power: float) -> None:
        # the ranges of scikit-learn's losses: y >= 0 for 0 < power < 2, y > 0 from 2 on.
        if power <= 0:
            return
        bad = (y < 0) if power < 2 else (y <= 0)
        if bad.any():
            raise ValueError(
                f"Some value(s) of y are out of the valid range of the loss of "
                f"{type(self).__name__} (power={power}): y must be "
                f"{'>= 0' if power < 2 else '> 0'}.")

    # ------------------------------------------------------------------- fit
    def _check_params(self):
        if self.solver != "lbfgs":
            raise ValueError(
                f"solver={self.solver!r} is not available in {type(self).__name__}: ortlearn "
                "trains GLMs with L-BFGS only; use solver='lbfgs' (same minimiser).")
        self._family()

    def _fit_validated(self, X, y, sample_weight):
        # The penalised deviance, minimised with L-BFGS.
        link, power = self._family()
        y = np.asarray(y, dtype=np.float64)
        self._check_y(y, power)
        sw_sum = float(sample_weight.sum())
        n_features = X.shape[1]
        model = linear_objective(n_features, 1, self._row_loss(link, power),
                                 fit_intercept=self.fit_intercept, data_scale=1.0 / sw_sum,
                                 l2=0.5 * self.alpha, loss_key=("deviance", link, power))
        initial = {COEF: np.zeros((n_features, 1))}
        if self.fit_intercept:
            mean = np.average(y, weights=sample_weight)
            initial[INTERCEPT] = np.array([np.log(mean) if link == "log" else mean])
        if self.warm_start and hasattr(self, "coef_") and len(self.coef_) == n_features:
            initial[COEF] = np.asarray(self.coef_, np.float64).reshape(-1, 1)
            if self.fit_intercept:
                initial[INTERCEPT] = np.array([self.intercept_], np.float64)

        def attributes(weights):
            return {"coef_": weights[COEF][:, 0].astype(self._dtype),
                    "intercept_": (float(weights[INTERCEPT][0]) if self.fit_intercept
                                   else 0.0)}

        weights, n_iter = self._minimize(model, X, y.reshape(-1, 1), sample_weight, initial,
                                         attributes)
        self._weights = weights
        self.__dict__.update(attributes(weights))
        self.n_iter_ = n_iter
        return self

    def _linear_predictor(self, X):
        """``X @ coef_ + intercept_``, the raw prediction before the inverse link.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        return self._decision(X)

    def predict(self, X):
        """Predicted mean ``link^-1(X @ coef_ + intercept_)``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        link, _ = self._family()
        raw = self._decision(X)
        return np.exp(raw) if link == "log" else raw

    def score(self, X, y, sample_weight=None):
        """D^2, the fraction of the deviance explained (as scikit-learn's GLMs).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        float
        """
        check_is_fitted(self)
        _, power = self._family()
        return float(d2_tweedie_score(y, self.predict(X), sample_weight=sample_weight,
                                      power=power))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        try:
            tags.target_tags.positive_only = self._family()[1] > 0
        except ValueError:  # an invalid link or power: fit says which
            pass
        return tags


_GLM_PARAMS_DOC = """alpha : float, default=1.0
        Strength of the L2 penalty ``alpha / 2 * ||coef||^2`` (the intercept
        is not penalised).
    fit_intercept : bool, default=True
    solver : {'lbfgs', 'newton-cholesky'}, default='lbfgs'
        Only ``'lbfgs'`` trains (ortlearn's L-BFGS with scikit-learn's
        options); ``'newton-cholesky'`` raises a ``ValueError`` at fit.
    max_iter : int, default=100
        Maximum number of L-BFGS iterations.
    tol : float, default=1e-4
        ``gtol`` of L-BFGS-B: stop when the largest projected gradient
        component is below it.
    warm_start : bool, default=False
        Start from ``coef_`` and ``intercept_`` of the previous fit.
    verbose : int, default=0
        > 0 prints the loss after each L-BFGS iteration.
    {device}"""

_GLM_ATTRIBUTES_DOC = """coef_ : ndarray of shape (n_features,)
    intercept_ : float
    n_iter_ : int
        L-BFGS iterations run.
    loss_ : float
        Objective at the returned weights (without the terms of y alone).
    {fitted}"""

# Poisson and Gamma have no parameter of their own: both sections whole.
_GLM_COMMON_DOC = f"""Parameters
    ----------
    {_GLM_PARAMS_DOC}

    Attributes
    ----------
    {_GLM_ATTRIBUTES_DOC}"""


class OrtPoissonRegressor(_BaseOrtGLM):
    """Poisson regression (log link) trained with onnxruntime and L-BFGS.

    The objective of :class:`sklearn.linear_model.PoissonRegressor`::

        1 / sum(w) * sum_i w_i * half_poisson_deviance(y_i, exp(x_i . coef + b))
            + alpha / 2 * ||coef||^2

    {common}

    See Also
    --------
    sklearn.linear_model.PoissonRegressor : The scikit-learn estimator.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtPoissonRegressor
    >>> X = np.array([[1, 2], [2, 3], [3, 4], [4, 3]])
    >>> y = np.array([12, 17, 22, 21])
    >>> reg = OrtPoissonRegressor().fit(X, y)
    >>> reg.predict([[1, 1], [3, 4]]).round(1)
    array([10.7, 21.9])
    """

    def _family(self):
        return "log", 1.0


class OrtGammaRegressor(_BaseOrtGLM):
    """Gamma regression (log link) trained with onnxruntime and L-BFGS.

    The objective of :class:`sklearn.linear_model.GammaRegressor`::

        1 / sum(w) * sum_i w_i * half_gamma_deviance(y_i, exp(x_i . coef + b))
            + alpha / 2 * ||coef||^2

    {common}

    See Also
    --------
    sklearn.linear_model.GammaRegressor : The scikit-learn estimator.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtGammaRegressor
    >>> X = np.array([[1, 2], [2, 3], [3, 4], [4, 3]])
    >>> y = np.array([19, 26, 33, 30])
    >>> reg = OrtGammaRegressor().fit(X, y)
    >>> reg.predict([[1, 0], [2, 8]]).round(1)
    array([19.5, 35.8])
    """

    def _family(self):
        return "log", 2.0


class OrtTweedieRegressor(_BaseOrtGLM):
    """Tweedie regression trained with onnxruntime and L-BFGS.

    The objective of :class:`sklearn.linear_model.TweedieRegressor`::

        1 / sum(w) * sum_i w_i * half_tweedie_deviance(y_i, mu_i; power)
            + alpha / 2 * ||coef||^2,   mu_i = link^-1(x_i . coef + b)

    ``power=0`` is the normal distribution, 1 Poisson, ``1 < power < 2``
    compound Poisson-Gamma, 2 Gamma, 3 inverse Gaussian; ``0 < power < 1``
    has no distribution (``ValueError``).

    Parameters
    ----------
    power : float, default=0.0
        Tweedie power of the deviance.
    link : {'auto', 'identity', 'log'}, default='auto'
        ``'auto'`` is ``'identity'`` for ``power <= 0`` and ``'log'``
        otherwise. The identity link is implemented for ``power=0`` (half
        the squared error); with another power it raises a ``ValueError``
        (use ``link='log'``).
    {params}

    Attributes
    ----------
    {attributes}

    See Also
    --------
    sklearn.linear_model.TweedieRegressor : The scikit-learn estimator.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtTweedieRegressor
    >>> X = np.array([[1, 2], [2, 3], [3, 4], [4, 3]])
    >>> y = np.array([2, 3.5, 5, 5.5])
    >>> reg = OrtTweedieRegressor(power=1.5, link='log').fit(X, y)
    >>> reg.predict([[1, 1], [3, 4]]).round(2)
    array([2.25, 4.71])
    """

    _parameter_constraints: dict = {
        **_BaseOrtGLM._parameter_constraints,
        "power": [Interval(Real, None, None, closed="neither")],
        "link": [StrOptions({"auto", "identity", "log"})],
    }

    def __init__(self, *, power=0.0, alpha=1.0, fit_intercept=True, link="auto",
                 solver="lbfgs", max_iter=100, tol=1e-4, warm_start=False, verbose=0,
                 device="cpu"):
        super().__init__(alpha=alpha, fit_intercept=fit_intercept, solver=solver,
                         max_iter=max_iter, tol=tol, warm_start=warm_start, verbose=verbose,
                         device=device)
        self.power = power
        self.link = link

    def _family(self):
        power = float(self.power)
        if 0 < power < 1:
            raise ValueError(f"power must be <= 0 or >= 1 for the Tweedie deviance (no "
                             f"distribution exists for 0 < power < 1), got {power}.")
        link = self.link if self.link != "auto" else ("identity" if power <= 0 else "log")
        if link == "identity" and power != 0:
            raise ValueError(
                f"link='identity' is implemented for power=0 only (half the squared error), "
                f"got power={power}: use link='log' (or 'auto').")
        if link == "log" and power < 0:
            raise ValueError(f"power={power} < 0 is not available with link='log': the "
                             "Tweedie deviance of ortlearn.loss needs power 0 or >= 1.")
        return link, power


for _cls in (OrtPoissonRegressor, OrtGammaRegressor, OrtTweedieRegressor):
    fill_doc(_cls, common=_GLM_COMMON_DOC, params=_GLM_PARAMS_DOC,
             attributes=_GLM_ATTRIBUTES_DOC)
