"""The parameters of the mini-batch linear models and their ranges (scikit-learn's constraints).

A module of its own, without the training machinery: ``OrtLogisticRegression`` (a full-batch
estimator whose mini-batch solvers run ``OrtLinearClassifier``) checks them when it is
defined, and its first fit imports the mini-batch engine only when it runs it.
"""

from __future__ import annotations

from numbers import Integral, Real

from sklearn.utils._param_validation import Interval, StrOptions

__all__ = ["LINEAR_CONSTRAINTS"]

#: the constraints of :class:`~ortlearn.estimators._linear_base.BaseOrtLinear`'s parameters
LINEAR_CONSTRAINTS: dict = {
    "penalty": [StrOptions({"l2", "l1", "elasticnet"}), None],
    "alpha": [Interval(Real, 0, None, closed="left")],
    "l1_ratio": [Interval(Real, 0, 1, closed="both")],
    "fit_intercept": ["boolean"],
    "max_iter": [Interval(Integral, 1, None, closed="left")],
    "tol": [Interval(Real, None, None, closed="neither"), None],
    "shuffle": ["boolean"],
    "verbose": ["verbose"],
    "random_state": ["random_state"],
    "learning_rate": [StrOptions({"constant", "optimal", "invscaling", "adaptive"})],
    "eta0": [Interval(Real, 0, None, closed="neither")],
    "power_t": [Interval(Real, None, None, closed="neither")],
    "early_stopping": ["boolean"],
    "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
    "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
    "warm_start": ["boolean"],
    "solver": [StrOptions({"sgd", "adam", "adamw", "lbfgs"})],
    "batch_size": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
    "momentum": [Interval(Real, 0, 1, closed="both")],
    "nesterovs_momentum": ["boolean"],
    "beta_1": [Interval(Real, 0, 1, closed="left")],
    "beta_2": [Interval(Real, 0, 1, closed="left")],
    "device": [str],
}
