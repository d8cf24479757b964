"""Ridge regression trained with onnxruntime: ``OrtRidge``.

The objective of :class:`sklearn.linear_model.Ridge`, with sample weights
``w`` (ones by default), one column ``k`` per target::

    1/2 * sum_i w_i * ||y_i - x_i . coef - intercept||^2 + 1/2 * sum_k alpha_k ||coef_k||^2

(half of scikit-learn's, the same minimiser). As scikit-learn does, X and y
are centred with their weighted means when ``fit_intercept`` (the intercept
is then ``y_mean - x_mean . coef``). Dense data with at most
:data:`~ortlearn.training.normal_equations.GRAM_MAX_FEATURES` features are
solved as scikit-learn's default does, by the normal equations (onnxruntime
forms ``X^T W X`` and ``X^T W Y``, scipy's Cholesky solves); sparse data,
``positive=True`` and wider data by L-BFGS on the objective's graph.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.base import MultiOutputMixin, RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions

from ..loss import elementwise_loss
from ..training.normal_equations import GRAM_MAX_FEATURES, solve_normal_equations
from ..training.sparse import is_sparse
from ._callbacks import iteration_hook
from ._docs import fill_doc
from ._fullbatch import BaseOrtFullBatch, center_data, weighted_mean
from ._objective import COEF, linear_objective

__all__ = ["OrtRidge"]

_SOLVERS = {"auto", "svd", "cholesky", "lsqr", "sparse_cg", "sag", "saga", "lbfgs"}
_OWN_SOLVERS = ("auto", "cholesky", "lbfgs")
#: L-BFGS iterations when max_iter is None (scipy's default maxiter, as Ridge's lbfgs).
_DEFAULT_MAX_ITER = 15000


@fill_doc
class OrtRidge(MultiOutputMixin, RegressorMixin, BaseOrtFullBatch):
    """Ridge regression (one or several targets) trained with onnxruntime.

    Minimises the objective of :class:`sklearn.linear_model.Ridge`::

        ||y - X coef - intercept||^2_w + alpha * ||coef||^2

    (halved: the same minimiser) by its normal equations (``'cholesky'``:
    onnxruntime forms ``X^T W X`` and ``X^T W y``, scipy solves) or with
    scipy's L-BFGS-B on an onnxruntime loss and gradient (``'lbfgs'``), all
    targets at once.

    Parameters
    ----------
    alpha : float or array-like of shape (n_targets,), default=1.0
        Strength of the L2 penalty, one per target if an array.
    fit_intercept : bool, default=True
        Learn an intercept (X and y are centred first, as scikit-learn does).
    copy_X : bool, default=True
        X is never modified (accepted, as there).
    max_iter : int or None, default=None
        Maximum number of L-BFGS iterations; None: 15000 (scipy's default,
        as ``Ridge(solver='lbfgs')``). Unused by ``'cholesky'``.
    tol : float, default=1e-4
        ``gtol`` of L-BFGS-B on the halved objective: stop when the largest
        projected gradient component is below it. (``Ridge(solver='lbfgs')``
        gives ``tol`` to scipy as both ``gtol`` and ``ftol``; ortlearn keeps
        ``ftol=64 eps`` as scikit-learn's other L-BFGS paths, to reach the
        exact minimum the default ``'auto'`` (Cholesky) solver finds.)
    solver : {'auto', 'cholesky', 'lbfgs'}, default='auto'
        ``'cholesky'``: the normal equations, as scikit-learn's (a singular
        system, without penalty, gets the minimum-norm least-squares
        solution); dense ``X`` only. ``'lbfgs'``: ortlearn's L-BFGS.
        ``'auto'``: ``'cholesky'`` for a dense ``X`` of at most 2048
        features without ``positive``, ``'lbfgs'`` otherwise. scikit-learn's
        other solvers (``'svd'``, ``'lsqr'``, ``'sparse_cg'``, ``'sag'``,
        ``'saga'``) raise a ``ValueError``.
    positive : bool, default=False
        Constrain the coefficients to be >= 0 (L-BFGS-B bounds, as
        ``Ridge(positive=True)``).
    random_state : int, RandomState instance or None, default=None
        Unused (``'sag'``/``'saga'`` only; accepted, as there).
    {device}

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
    intercept_ : float or ndarray of shape (n_targets,)
    n_iter_ : ndarray of shape (n_targets,)
        L-BFGS iterations (the targets are fitted together: one count,
        repeated); 1 for ``'cholesky'`` (one pass over the data; ``Ridge``
        gives None for its direct solvers).
    loss_ : float
        Halved objective at the returned weights (on the centred data).
    {fitted}

    See Also
    --------
    sklearn.linear_model.Ridge : The scikit-learn estimator.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn.estimators import OrtRidge
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(20, 3)
    >>> y = X @ [1.0, -2.0, 0.5] + 1.0
    >>> reg = OrtRidge(alpha=0.1).fit(X, y)
    >>> reg.coef_.round(2)
    array([ 1.  , -1.99,  0.5 ])
    """

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="left"), np.ndarray],
        "fit_intercept": ["boolean"],
        "copy_X": ["boolean"],
        "max_iter": [Interval(Integral, 1, None, closed="left"), None],
        "tol": [Interval(Real, 0, None, closed="left")],
        "solver": [StrOptions(_SOLVERS)],
        "positive": ["boolean"],
        "random_state": ["random_state"],
        "device": [str],
    }
    _multi_output = True

    def __init__(self, alpha=1.0, *, fit_intercept=True, copy_X=True, max_iter=None,
                 tol=1e-4, solver="auto", positive=False, random_state=None, device="cpu"):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.copy_X = copy_X
        self.max_iter = max_iter
        self.tol = tol
        self.solver = solver
        self.positive = positive
        self.random_state = random_state
        self.device = device

    def _lbfgs_options(self) -> dict:
        max_iter = _DEFAULT_MAX_ITER if self.max_iter is None else self.max_iter
        return {"max_iter": max_iter, "tol": self.tol}

    def _bounds(self, n_features: int, n_outputs: int):
        return {COEF: (0.0, None)} if self.positive else None

    def _check_params(self):
        if self.solver not in _OWN_SOLVERS:
            raise ValueError(
                f"solver={self.solver!r} is not available in OrtRidge: ortlearn solves it "
                "by the normal equations or L-BFGS; use solver='auto', 'cholesky' or "
                "'lbfgs' (same minimiser).")
        if self.solver == "cholesky" and self.positive:
            raise ValueError("positive=True needs bound constraints: use solver='auto' or "
                             "'lbfgs' (as Ridge, whose only solver for it is 'lbfgs').")

    def _direct(self, X) -> bool:
        """Whether the normal equations solve this fit (``solver`` and the data)."""
        if self.solver == "cholesky":
            if is_sparse(X):
                raise ValueError("solver='cholesky' forms X^T X from a dense X: use "
                                 "solver='auto' or 'lbfgs' for sparse data.")
            return True
        return (self.solver == "auto" and not self.positive and not is_sparse(X)
                and X.shape[1] <= GRAM_MAX_FEATURES)

    def _fit_validated(self, X, y, sample_weight):
        y = np.asarray(y, dtype=np.float64)
        Y = y.reshape(len(y), -1)
        n_features, n_outputs = X.shape[1], Y.shape[1]
        alpha = np.asarray(self.alpha, dtype=np.float64).ravel()
        if alpha.size not in (1, n_outputs):
            raise ValueError(f"Number of targets and number of penalties do not correspond: "
                             f"{alpha.size} != {n_outputs}")
        if (alpha < 0).any():
            raise ValueError("alpha must be >= 0.")
        x_offset = None
        if self.fit_intercept:
            x_mean, X, x_offset = center_data(X, sample_weight)
            y_mean = weighted_mean(Y, sample_weight)
            Y = Y - y_mean

        def attributes(weights):
            coef = weights[COEF].T  # (n_targets, n_features)
            intercept = y_mean - x_mean @ coef.T if self.fit_intercept else np.zeros(n_outputs)
            if y.ndim == 1:
                return {"coef_": coef[0].astype(self._dtype),
                        "intercept_": float(intercept[0]) if self.fit_intercept else 0.0}
            return {"coef_": coef.astype(self._dtype),
                    "intercept_": intercept.astype(self._dtype)}

        if self._direct(X):
            result = solve_normal_equations(X, Y, sample_weight, alpha, device=str(self.device))
            weights = result.weights
            self.n_iter_ = np.full(n_outputs, result.n_iter, dtype=np.int32)
            hook = iteration_hook(self, attributes)
            if hook is not None:  # the one pass is the fit's one iteration
                hook(weights)
            self.loss_ = result.loss
            self.train_losses_ = [self.loss_]
        else:
            def row_loss(b, raw, label):
                return elementwise_loss(b, "squared_error", raw, label, np.float64)

            model = linear_objective(n_features, n_outputs, row_loss, fit_intercept=False,
                                     data_scale=0.5,
                                     l2=0.5 * np.broadcast_to(alpha, (n_outputs,)),
                                     x_offset=x_offset, loss_key="squared_error")
            weights, n_iter = self._minimize(model, X, np.ascontiguousarray(Y), sample_weight,
                                             {}, attributes)
            self.n_iter_ = np.full(n_outputs, n_iter, dtype=np.int32)
        self._weights = weights
        self.__dict__.update(attributes(weights))
        return self
