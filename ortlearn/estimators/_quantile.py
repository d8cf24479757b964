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
from onnx import TensorProto, helper, numpy_helper
from sklearn.base import RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions

from ..exceptions import ConvergenceWarning
from ..graph import GraphBuilder, finalize_model
from ..graph.model import DEFAULT_OPSET
from ..log import user_stacklevel
from ..training.quantile import (
    QuantileProblem,
    minimize_smoothed_pinball,
    objective,
)
from ..training.sparse import is_sparse
from ._fullbatch import (
    DATA_SCALE,
    INTERCEPT,
    LABEL,
    LOSS,
    SAMPLE_WEIGHT,
    BaseOrtFullBatch,
    fill_shared_doc,
)

__all__ = ["OrtQuantileRegressor"]

POS, NEG = "coef_positive", "coef_negative"
_SOLVERS = {"highs-ds", "highs-ipm", "highs", "interior-point", "revised simplex"}


def _pinball_objective(n_features, fit_intercept, quantile, alpha, width, data_scale,
                       sparse=False):
    """Smoothed pinball on ``X @ (pos - neg) + intercept`` plus ``alpha sum(pos + neg)``.

    ``sparse``: ``X @ pos - X @ neg``, the form a sparse ``X`` needs (it may
    only multiply trained weights, :func:`ortlearn.training.minimize_lbfgs`).
    """
    f64 = np.float64
    # the numbers are untrained initializers, fed as data by minimize_lbfgs: every
    # smoothing stage reuses the first stage's gradient session
    numbers = {"smoothing_width": width, "smoothing_factor": 0.5 / width, "quantile": quantile,
               DATA_SCALE: data_scale, "l1_strength": alpha}
    b = GraphBuilder(used_names=["X", LABEL, SAMPLE_WEIGHT, POS, NEG, INTERCEPT, LOSS,
                                 *numbers], prefix="quantile_")
    if sparse:
        raw = b.op("Sub", [b.op("MatMul", ["X", POS]), b.op("MatMul", ["X", NEG])])
    else:
        raw = b.op("MatMul", ["X", b.op("Sub", [POS, NEG])])
    # vectors (N,) from here: onnxruntime broadcasts (N, 1) with scalars slowly
    # (linear_objective says how much)
    raw = b.op("Reshape", [raw, b.ints([-1], hint="rows")])
    inits = [numpy_helper.from_array(np.zeros((n_features, 1), f64), POS),
             numpy_helper.from_array(np.zeros((n_features, 1), f64), NEG),
             *(numpy_helper.from_array(np.asarray(v, f64), k) for k, v in numbers.items())]
    if fit_intercept:
        raw = b.op("Add", [raw, INTERCEPT])
        inits.append(numpy_helper.from_array(np.zeros(1, f64), INTERCEPT))
    residual = b.op("Sub", [b.op("Reshape", [LABEL, b.ints([-1], hint="rows")]), raw])
    # q r + relu(-r), relu smoothed: m = min(relu(z), width), m^2 / (2 width) + relu(z) - m.
    below = b.op("Relu", [b.op("Neg", [residual])])
    m = b.op("Min", [below, "smoothing_width"])
    smooth = b.op("Add", [b.op("Mul", [b.op("Mul", [m, m]), "smoothing_factor"]),
                          b.op("Sub", [below, m])])
    rows = b.op("Add", [b.op("Mul", ["quantile", residual]), smooth])
    data = b.reduce("ReduceSum", b.op("Mul", [rows, SAMPLE_WEIGHT]), keepdims=0)
    l1 = b.reduce("ReduceSum", b.op("Add", [POS, NEG]), keepdims=0)
    b.op("Add", [b.op("Mul", [DATA_SCALE, data]), b.op("Mul", ["l1_strength", l1])],
         outputs=[LOSS])
    graph = helper.make_graph(
        b.nodes, "quantile",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", n_features]),
         helper.make_tensor_value_info(LABEL, TensorProto.DOUBLE, ["N", 1]),
         helper.make_tensor_value_info(SAMPLE_WEIGHT, TensorProto.DOUBLE, ["N"])],
        [helper.make_tensor_value_info(LOSS, TensorProto.DOUBLE, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)])
    return finalize_model(model)


@fill_shared_doc
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
            return _pinball_objective(n_features, self.fit_intercept, problem.quantile,
                                      problem.alpha, width, data_scale, sparse=is_sparse(X))

        def attributes(weights):
            return {"coef_": (weights[POS] - weights[NEG])[:, 0].astype(self._dtype),
                    "intercept_": (float(weights[INTERCEPT][0]) if self.fit_intercept
                                   else 0.0)}

        result = minimize_smoothed_pinball(
            problem, smoothed, names=(POS, NEG, INTERCEPT, LABEL, SAMPLE_WEIGHT, LOSS),
            callback=self._iteration_hook(attributes), device=str(self.device),
            remedy="Scale the data.")
        coef, intercept = result.coef, result.intercept
        self._weights = {POS: np.maximum(coef, 0)[:, None], NEG: np.maximum(-coef, 0)[:, None]}
        if self.fit_intercept:
            self._weights[INTERCEPT] = np.array([intercept])
        self.coef_ = coef.astype(self._dtype)
        self.intercept_ = intercept
        self.n_iter_ = result.n_iter
        self.loss_ = objective(problem, coef, intercept)
        self.train_losses_ = result.stage_losses
        if not result.stopped and not result.optimal:
            warnings.warn("The smoothing stages ended without a certified minimum of the "
                          "linear program: the objective may be above its minimum.",
                          ConvergenceWarning, stacklevel=user_stacklevel())
        return self
