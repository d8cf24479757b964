"""``BaseOrtLinear``: the parameters and update rules the mini-batch linear models share.

The rules are scikit-learn's MLP ones, for a linear model: ``solver='sgd'`` is mini-batch
SGD with ``momentum`` and a ``learning_rate`` schedule counting mini-batches, ``'adam'``,
``'adamw'`` (the penalty's L2 part as decoupled weight decay) and full-batch ``'lbfgs'``;
the penalty is part of the objective (its L1 part a subgradient). ``BaseOrtSGD`` replaces
``'sgd'`` with scikit-learn's per-sample rule and keeps the others.
"""

from __future__ import annotations

from sklearn.utils.validation import check_is_fitted

from ..convert import get_weights
from ..optim import SGD, Adam, TorchAdamW
from ..optim.schedules import Adaptive, Constant, InvScaling, Optimal
from ._base import BaseOrtEstimator
from ._constraints import LINEAR_CONSTRAINTS
from ._scores import linear_scores

__all__ = ["BaseOrtLinear"]

_L1_RATIO = {"l2": 0.0, "l1": 1.0, None: 0.0}


class BaseOrtLinear(BaseOrtEstimator):
    """Shared parameters and hooks of the linear models (not for direct use)."""

    _parameter_constraints: dict = dict(LINEAR_CONSTRAINTS)

    #: SGD stops once the count of epochs without improvement reaches n_iter_no_change.
    _stop_after_exceeding = False
    _multi_output = False
    _architecture_params = ("fit_intercept",)

    @property
    def coef_(self):
        """Weights of the trained model (those of ``estimator_``)."""
        check_is_fitted(self)
        return self.estimator_.coef_

    @property
    def intercept_(self):
        """Intercepts of the trained model (those of ``estimator_``)."""
        check_is_fitted(self)
        return self.estimator_.intercept_

    def _scores_model(self, values: bool):
        # no conversion: the objective reads only the scores (module _scores)
        return linear_scores(get_weights(self.estimator_), self._kind(), self._dtype, values)

    def _l1_ratio(self) -> float:
        return self.l1_ratio if self.penalty == "elasticnet" else _L1_RATIO[self.penalty]

    def _penalty_args(self) -> dict:
        """Penalty of the objective; with 'adamw' its L2 part is the optimizer's decay."""
        if self.solver != "adamw" or self.penalty is None:
            return {"penalty": self.penalty, "alpha": self.alpha, "l1_ratio": self.l1_ratio}
        return {"penalty": "l1", "alpha": self.alpha * self._l1_ratio()}

    def _optimizer(self):
        if self.solver == "sgd":
            return SGD(momentum=self.momentum,
                       nesterov=self.nesterovs_momentum and self.momentum > 0)
        if self.solver == "adam":
            return Adam(beta_1=self.beta_1, beta_2=self.beta_2)
        decay = 0.0 if self.penalty is None else self.alpha * (1 - self._l1_ratio())
        return TorchAdamW(betas=(self.beta_1, self.beta_2), weight_decay=decay)

    def _make_schedule(self):
        if self.solver != "sgd" or self.learning_rate == "constant":
            return Constant(self.eta0)
        if self.learning_rate == "optimal":
            if self.alpha == 0:
                raise ValueError("alpha must be > 0 since learning_rate is 'optimal': "
                                 "its step size is 1 / (alpha * (t0 + t)).")
            return Optimal(self.alpha)
        if self.learning_rate == "invscaling":
            return InvScaling(self.eta0, self.power_t)
        return Adaptive(self.eta0)

    def _learning_rates(self, sizes, first_step):
        if self.solver == "sgd":
            # The schedule counts optimizer steps (mini-batches), 1-based.
            return None, self._schedule.learning_rate
        return self._schedule.learning_rate(1), None

    def _check_solver(self) -> None:
        if self.solver == "lbfgs" and self.penalty in ("l1", "elasticnet") and self.alpha:
            raise ValueError(f"solver='lbfgs' needs a smooth objective: penalty="
                             f"{self.penalty!r} is not differentiable; use penalty='l2' or "
                             "None, or another solver.")
