"""Quantile regression trained with ortlearn's L-BFGS: ``OrtQuantileRegressor``.

The objective of :class:`sklearn.linear_model.QuantileRegressor`, with
sample weights ``w``::

    sum_i w_i * pinball_q(y_i - x_i . coef - intercept) / sum_i w_i + alpha * ||coef||_1

scikit-learn solves it as a linear program (HiGHS). Here: ``coef = pos -
neg`` with ``pos, neg >= 0`` (L-BFGS-B bounds), so the L1 term is linear;
the pinball loss ``q r + relu(-r)`` has its kink smoothed over a width
``mu`` (``relu`` becomes quadratic on ``[0, mu]``) and L-BFGS-B minimises
the smooth objective on onnxruntime's gradient for decreasing ``mu``, each
stage from the last one's weights. The linear program's minimum lies at a
vertex: the rows where the residual is zero determine the non-zero
coefficients and the intercept. A final polish reads that vertex off the
last stage (rows within a band of zero residual, coefficients above a
threshold), solves its linear system and keeps it when it lowers the exact
objective.
"""

from __future__ import annotations

import warnings
from numbers import Real

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions

from ..exceptions import ConvergenceWarning
from ..log import user_stacklevel
from ..training.quantile import (
    QuantileProblem,
    minimize_smoothed_pinball,
    objective,
)
from ..training.result import MAX_ITER
from ..training.sparse import is_sparse
from ._callbacks import iteration_hook
from ._docs import fill_doc
from ._fullbatch import BaseOrtFullBatch
from ._objective import INTERCEPT, LABEL, LOSS, NEG, POS, SAMPLE_WEIGHT, pinball_objective

__all__ = ["OrtQuantileRegressor"]

_SOLVERS = {"highs-ds", "highs-ipm", "highs", "interior-point", "revised simplex"}


@fill_doc
class OrtQuantileRegressor(RegressorMixin, BaseOrtFullBatch):
    """Linear quantile regression with an L1 penalty, trained with onnxruntime and L-BFGS-B.

    Minimises the objective of :class:`sklearn.linear_model.QuantileRegressor`::

        sum_i w_i * pinball_q(y_i - x_i . coef - intercept) / sum_i w_i
        + alpha * ||coef||_1

    (a linear program there) by smoothing continuation: ``coef = pos - neg``
    with ``pos, neg >= 0``, the pinball loss's kink smoothed over a width
    that decreases stage by stage (L-BFGS-B on onnxruntime's gradient, each
    stage warm-started), then a polish that solves the linear system of the
    vertex the last stage identifies (the rows of zero residual).

    Parameters
    ----------
    quantile : float, default=0.5
        The quantile in (0, 1) the model predicts.
    alpha : float, default=1.0
        Strength of the L1 penalty.
    fit_intercept : bool, default=True
    solver : {'highs', 'highs-ds', 'highs-ipm', 'revised simplex'}, default='highs'
        The linear-programming method of scikit-learn; every value trains
        with ortlearn's method (the same minimum). ``'interior-point'``
        raises a ``ValueError``, as there with scipy >= 1.11.
    solver_options : dict, default=None
        Options of scipy's ``linprog``: only None (a dict raises a ``ValueError``).
    {device}

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : float
    n_iter_ : int
        L-BFGS iterations, all the stages together.
    loss_ : float
        Exact objective at the returned weights.
    train_losses_ : list of float
        The smoothed objective at the end of each stage.
    n_features_in_ : int
    feature_names_in_ : ndarray of str

    See Also
    --------
    sklearn.linear_model.QuantileRegressor : The scikit-learn estimator.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtQuantileRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(100, 2)
    >>> y = X @ [1.0, -2.0] + rng.randn(100)
    >>> reg = OrtQuantileRegressor(quantile=0.5, alpha=0.01).fit(X, y)
    >>> reg.coef_.round(1)
    array([ 1.2, -2. ])
    """

    _parameter_constraints: dict = {
        "quantile": [Interval(Real, 0, 1, closed="neither")],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "fit_intercept": ["boolean"],
        "solver": [StrOptions(_SOLVERS)],
        "solver_options": [dict, None],
        "device": [str],
    }

    def __init__(self, *, quantile=0.5, alpha=1.0, fit_intercept=True, solver="highs",
                 solver_options=None, device="cpu"):
        self.quantile = quantile
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.solver_options = solver_options
        self.device = device

    def _check_params(self):
        if self.solver == "interior-point":
            raise ValueError("Solver interior-point is not anymore available in SciPy >= "
                             "1.11.0.")
        if self.solver_options is not None:
            raise ValueError("solver_options (options of scipy's linprog) is not available "
                             "in OrtQuantileRegressor: it does not run linprog; leave it None.")

    def _fit_validated(self, X, y, sample_weight):
        problem = QuantileProblem(X, np.asarray(y, dtype=np.float64), sample_weight,
                                  float(self.quantile), float(self.alpha), self.fit_intercept)
        n_features = X.shape[1]
        data_scale = 1.0 / sample_weight.sum()

        def smoothed(width):
            return pinball_objective(n_features, self.fit_intercept, problem.quantile,
                                      problem.alpha, width, data_scale, sparse=is_sparse(X))

        def attributes(weights):
            return {"coef_": (weights[POS] - weights[NEG])[:, 0].astype(self._dtype),
                    "intercept_": (float(weights[INTERCEPT][0]) if self.fit_intercept
                                   else 0.0)}

        result = minimize_smoothed_pinball(
            problem, smoothed, names=(POS, NEG, INTERCEPT, LABEL, SAMPLE_WEIGHT, LOSS),
            callback=iteration_hook(self, attributes), device=str(self.device),
            remedy="Scale the data.")
        coef, intercept = result.weights["coef"], result.weights["intercept"]
        self._weights = {POS: np.maximum(coef, 0)[:, None], NEG: np.maximum(-coef, 0)[:, None]}
        if self.fit_intercept:
            self._weights[INTERCEPT] = np.array([intercept])
        self.coef_ = coef.astype(self._dtype)
        self.intercept_ = intercept
        self.n_iter_ = result.n_iter
        self.loss_ = objective(problem, coef, intercept)
        self.train_losses_ = result.info["stage_losses"]
        if result.status == MAX_ITER:
            warnings.warn("The smoothing stages ended without a certified minimum of the "
                          "linear program: the objective may be above its minimum.",
                          ConvergenceWarning, stacklevel=user_stacklevel())
        return self
