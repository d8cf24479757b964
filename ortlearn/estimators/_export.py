"""Training artifacts of an estimator: what ``export_artifacts`` writes.

An estimator's loss graph, its update rule, its current weights and its
optimizer state become the four files of
:func:`ortlearn.artifacts.generate_artifacts` (written by
:func:`ortlearn.artifacts.export_training_artifacts`, the same code), so a
training started with ``fit``/``partial_fit`` goes on with
:mod:`ortlearn.api` (or :class:`ortlearn.TrainingSession`), step for step.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import clone, is_classifier
from sklearn.exceptions import NotFittedError

from ..artifacts import export_training_artifacts
from ._objective import LOSS, SAMPLE_WEIGHT

__all__ = ["export_estimator_artifacts"]


def _initialized_copy(estimator, X, y):
    """A clone of ``estimator`` initialised as ``fit(X, y)`` would start, before any epoch."""
    est = clone(estimator)
    X, y = est._validate_xy(X, y, reset=True)
    est._dtype = np.dtype(X.dtype)
    if is_classifier(est):
        est._prepare_classes(y, None, False, True)
    est._initialize(X.astype(est._dtype, copy=False), y)
    est._schedule = est._make_schedule()
    return est


def _fresh_optimizer_state(est, weights: dict) -> dict:
    """The optimizer state ``fit`` starts from: zeros, no step, the first learning rate."""
    # the rate of fit's first update, of the rows a batch of the estimator holds
    lr_epoch, lr_for_step = est._learning_rates([est._update_rows], 1)
    lr = lr_epoch if lr_epoch is not None else lr_for_step(1)
    optimizer = est._optimizer()
    return {"states": {p: optimizer.init_state(w) for p, w in weights.items()}, "step": 0,
            "learning_rate": float(lr)}


def export_estimator_artifacts(estimator, directory, X=None, y=None, weighted=None,
                               prefix: str = "") -> None:
    """What :meth:`BaseOrtEstimator.export_artifacts` does (see its docstring)."""
    fitted = hasattr(estimator, "estimator_")
    if not fitted and X is None:
        raise NotFittedError(
            f"This {type(estimator).__name__} instance is not fitted yet: call fit or "
            "partial_fit before export_artifacts, or pass X and y to export the initial "
            "weights fit would start from.")
    if fitted and X is not None:
        raise ValueError("X and y are only used by an unfitted estimator (to initialise its "
                         "weights as fit would); this one is fitted.")
    if getattr(estimator, "solver", None) == "lbfgs":
        raise ValueError("solver='lbfgs' has no optimizer model to export; use 'sgd', "
                         "'adam' or 'adamw'.")
    est = estimator if fitted else _initialized_copy(estimator, X, y)
    if weighted is None:
        engine = est._runtime.engine
        weighted = engine is not None and SAMPLE_WEIGHT in engine.input_names
    model, trainable = est._loss_model(weighted=bool(weighted))
    weights = est.get_state()
    state = est._optimizer_state
    if state is None:
        state = _fresh_optimizer_state(est, weights)
    export_training_artifacts(model, trainable, est._optimizer(), directory,
                              weights=weights, optimizer_state=state, loss_output=LOSS,
                              prefix=prefix)
