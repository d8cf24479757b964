"""scikit-learn's callbacks (``sklearn.callback``, scikit-learn 1.9 and later) around a fit:
the one glue of every estimator.

A fit is one task; each epoch of a mini-batch solver, or each iteration of a
full-batch one, is a subtask whose end may ask training to stop. A callback's
``fitted_estimator`` is built, only when a callback asks for it, from the
attributes the solver gives for the weights of that epoch or iteration.
Before scikit-learn 1.9 (no ``_init_callback_context``) there is no task and
every function here does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

__all__ = ["CallbackSupportMixin", "FitTask", "current_task", "fit_task", "iteration_hook"]

try:  # scikit-learn >= 1.9: set_callbacks(ProgressBar(), ScoringMonitor(...))
    from sklearn.callback import CallbackSupportMixin
except ImportError:  # pragma: no cover
    class CallbackSupportMixin:
        """No callbacks before scikit-learn 1.9."""

#: Where the task of the fit in progress is kept on the estimator (gone after the fit).
_TASK = "_callback_task"


class FitTask:
    """A fit as a task of scikit-learn's callbacks, its epochs or iterations as subtasks.

    Parameters
    ----------
    estimator : BaseEstimator
        An estimator with scikit-learn's callback support.
    X, y : array-like
        The data of the fit, as the callbacks see them.
    sample_weight : array-like or None
        Passed to the callbacks as metadata.
    max_subtasks : int or None
        The most epochs or iterations (None: not known in advance).
    """

    def __init__(self, estimator, X, y, sample_weight, max_subtasks):
        self.estimator, self.X, self.y = estimator, X, y
        self.metadata = None if sample_weight is None else {"sample_weight": sample_weight}
        self.context = estimator._init_callback_context(max_subtasks=max_subtasks)
        self._subtask = None

    @property
    def observed(self) -> bool:
        """Whether a callback is registered: subtasks cost nothing otherwise."""
        return bool(getattr(self.estimator, "_skl_callbacks", None))

    def _call(self, context, end: bool, reconstruction=None):
        data = {"estimator": self.estimator, "X": self.X, "y": self.y, "metadata": self.metadata}
        if not end:
            return context.call_on_fit_task_begin(**data)
        return context.call_on_fit_task_end(**data, reconstruction_attributes=reconstruction)

    def begin_subtask(self, name: str) -> None:
        """Begin the subtask of one epoch (``name='epoch'``) or iteration."""
        self._subtask = self.context.subcontext(task_name=name)
        self._call(self._subtask, end=False)

    def end_subtask(self, reconstruction: Callable[[], dict]) -> bool:
        """End the subtask; True when a callback asks to stop.

        ``reconstruction()`` gives the attributes of the ``fitted_estimator``
        a callback may ask for.
        """
        return bool(self._call(self._subtask, end=True, reconstruction=reconstruction))


@contextmanager
def fit_task(estimator, X, y, sample_weight=None, max_subtasks=None):
    """The task of scikit-learn's callbacks around a solver; yields it (None before 1.9).

    The task ends when the solver returns; when it raises, the task does not
    end and the error goes through. The callbacks' ``teardown`` is
    scikit-learn's ``_fit_context``. A fitted estimator keeps no reference to
    the task nor to the data of its fit.
    """
    if not hasattr(estimator, "_init_callback_context"):  # scikit-learn < 1.9
        yield None
        return
    task = FitTask(estimator, X, y, sample_weight, max_subtasks)
    setattr(estimator, _TASK, task)
    try:
        task._call(task.context, end=False)
        yield task
        task._call(task.context, end=True, reconstruction={})
    finally:
        estimator.__dict__.pop(_TASK, None)


def current_task(estimator) -> FitTask | None:
    """The task of the fit in progress when a callback observes it, else None."""
    task = getattr(estimator, _TASK, None)
    return task if task is not None and task.observed else None


def iteration_hook(estimator, attributes: Callable) -> Callable | None:
    """``hook(weights) -> stop`` for a full-batch solver's iterations; None without callbacks.

    scipy reports an iteration when it ends: the hook begins and ends its
    subtask there. ``attributes(weights)`` gives the fitted attributes
    (``coef_``, ...) of those weights.
    """
    task = current_task(estimator)
    if task is None:
        return None

    def hook(weights) -> bool:
        task.begin_subtask("iteration")
        return task.end_subtask(lambda: attributes(weights))

    return hook
