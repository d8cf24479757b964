"""One epoch loop for every face of ortlearn: the estimators, ``OrtGradientOptimizer`` and
onnxcustom's optimizer run their epochs through :func:`run_epochs`.

Each face keeps its own semantics in what it passes: what one epoch does
(learning rate, shuffle, batches, the engine's ``train_epoch``), what follows
it (stopping rules, validation, callbacks, logs) and what a divergence means
(an error, a warning). The loop owns what they share: the count of epochs, the
loss curve, and Ctrl-C, which stops training and keeps the weights reached.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from ..exceptions import ConvergenceError
from ..log import user_stacklevel

__all__ = ["run_epochs"]


def run_epochs(max_epochs: int, train_epoch: Callable[[int], float], losses: list, *,
               after_epoch: Callable[[int, float], bool] | None = None,
               on_diverged: Callable[[ConvergenceError, int], None] | None = None,
               interruptible: bool = True) -> int:
    """Train up to ``max_epochs`` epochs.

    Parameters
    ----------
    max_epochs : int
    train_epoch : callable
        ``train_epoch(number) -> loss``: the epoch ``number`` (1-based).
    losses : list
        The loss curve: each epoch's loss is appended to it.
    after_epoch : callable, default=None
        ``after_epoch(number, loss) -> stop``: the bookkeeping of an epoch, run
        after its loss is appended; a true value ends training.
    on_diverged : callable, default=None
        ``on_diverged(error, number)`` for a :class:`~ortlearn.exceptions.ConvergenceError`
        raised by epoch ``number`` (the engine has restored the weights of the
        last finite epoch): it raises, or returns to end training. None
        lets the error through.
    interruptible : bool, default=True
        Ctrl-C (``KeyboardInterrupt``) ends training with a ``UserWarning``,
        the weights reached so far kept, as scikit-learn's MLP does; False
        lets it through.

    Returns
    -------
    int
        The epochs that ran to the end.

    Examples
    --------
    >>> curve = []
    >>> run_epochs(5, lambda number: 1.0 / number, curve,
    ...            after_epoch=lambda number, loss: loss < 0.4)
    3
    >>> curve
    [1.0, 0.5, 0.3333333333333333]
    """
    done = 0
    try:
        for number in range(1, max_epochs + 1):
            loss = train_epoch(number)
            losses.append(loss)
            done = number
            if after_epoch is not None and after_epoch(number, loss):
                break
    except ConvergenceError as error:
        if on_diverged is None:
            raise
        on_diverged(error, done + 1)
    except KeyboardInterrupt:
        if not interruptible:
            raise
        warnings.warn(f"Training interrupted by user after {done} epochs; the weights "
                      "reached so far are kept.", stacklevel=user_stacklevel())
    return done
