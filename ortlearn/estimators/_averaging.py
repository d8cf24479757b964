"""Model averaging: one estimator from copies of it trained on different data."""

from __future__ import annotations

import copy

import numpy as np
from sklearn.utils.validation import check_is_fitted

from ._session_cache import _SessionCache


def average_estimators(estimators, weights=None):
    """A copy of the first estimator with the weighted means of their weights and optimizer state.

    The copies must come from one model (same class, parameters and shapes),
    trained on different data since: the step of model averaging (local SGD).
    The optimizer state is averaged too (Adam's moments, SGD's momentum), its
    step count is the largest of theirs and its learning rate the first's.
    The counters and curves (``t_``, ``n_iter_``, ``train_losses_``) are the
    first's: the caller knows what they should say.

    Parameters
    ----------
    estimators : list of fitted estimators
    weights : array-like of shape (len(estimators),), default=None
        Non-negative, not all zero (the rows each copy trained on, typically).
        None: equal weights.

    Returns
    -------
    estimator
        A new estimator; the ones given are left as they are.

    Examples
    --------
    >>> import numpy as np
    >>> from ortlearn import OrtSGDRegressor
    >>> X = np.random.RandomState(0).randn(40, 2)
    >>> a = OrtSGDRegressor(random_state=0).partial_fit(X, X[:, 0])
    >>> b = OrtSGDRegressor(random_state=0).partial_fit(X, X[:, 1])
    >>> mean = average_estimators([a, b])
    >>> bool(np.allclose(mean.coef_, (a.coef_ + b.coef_) / 2))
    True
    """
    estimators = list(estimators)
    if not estimators:
        raise ValueError("average_estimators needs at least one estimator.")
    for est in estimators:
        check_is_fitted(est)
    first = estimators[0]
    if any(type(est) is not type(first) for est in estimators):
        raise TypeError("average_estimators averages copies of one estimator; got "
                        f"{sorted({type(est).__name__ for est in estimators})}.")
    w = np.ones(len(estimators)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (len(estimators),) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be {len(estimators)} non-negative numbers, not all "
                         f"zero; got {weights!r}.")
    w = w / w.sum()
    states = [get_training_state(est) for est in estimators]
    if any(set(s[0]) != set(states[0][0])
           or any(s[0][k].shape != states[0][0][k].shape for k in s[0]) for s in states):
        raise ValueError("average_estimators averages copies of one model: the weights of "
                         "these estimators differ in names or shapes.")
    mean = copy.deepcopy(first)
    mean._runtime = _SessionCache()
    set_training_state(mean, *average_training_states(states, w))
    return mean


def get_training_state(estimator) -> tuple:
    """``(weights, optimizer state)`` of a fitted estimator, what ``partial_fit`` continues from.

    Parameters
    ----------
    estimator : fitted mini-batch estimator

    Returns
    -------
    tuple
        The weights (:meth:`get_state`) and the optimizer state (``{"states": {weight:
        {name: ndarray}}, "step": int, "learning_rate": float}``, None before any epoch).
    """
    check_is_fitted(estimator)
    return estimator.get_state(), copy.deepcopy(getattr(estimator, "_optimizer_state", None))


def set_training_state(estimator, weights: dict, optimizer_state=None) -> None:
    """Replace the weights and the optimizer state a fitted estimator trains on.

    Into its live training session when ``partial_fit`` keeps one: the next
    ``partial_fit`` continues from them without building the session again.

    Parameters
    ----------
    estimator : fitted mini-batch estimator
    weights : dict of str to ndarray
        As :meth:`get_state` gives them.
    optimizer_state : dict, default=None
        As :func:`get_training_state` gives it; None keeps the estimator's.
    """
    estimator.set_state(weights)
    if optimizer_state is not None:
        estimator._optimizer_state = optimizer_state
        engine = estimator._runtime.engine
        if engine is not None:
            engine.load_optimizer_state(optimizer_state)


def average_training_states(states, weights=None) -> tuple:
    """The weighted mean of ``(weights, optimizer state)`` pairs of copies of one model.

    The optimizer's tensors are averaged, its step count is the largest and its
    learning rate the first's.

    Parameters
    ----------
    states : list of tuple
        As :func:`get_training_state` gives them.
    weights : array-like, default=None
        Non-negative, normalised here; None: equal weights.

    Returns
    -------
    tuple
        ``(weights, optimizer state)``.
    """
    w = np.ones(len(states)) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    tensors = {name: _mean([s[0][name] for s in states], w) for name in states[0][0]}
    optimizer = [s[1] for s in states]
    if any(o is None for o in optimizer):
        return tensors, None
    return tensors, {
        "states": {p: {k: _mean([o["states"][p][k] for o in optimizer], w) for k in d}
                   for p, d in optimizer[0]["states"].items()},
        "step": max(o["step"] for o in optimizer),
        "learning_rate": optimizer[0]["learning_rate"]}


def _mean(values, w):
    dtype = values[0].dtype
    total = np.zeros(values[0].shape, dtype=np.float64)
    for value, weight in zip(values, w):
        total += weight * value
    return total.astype(dtype, copy=False)
