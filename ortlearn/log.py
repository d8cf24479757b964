"""ortlearn's ``logging`` logger: what ``verbose`` prints.

With ``verbose > 0`` the estimators report each epoch (the lines
scikit-learn prints: ``Iteration 3, loss = 0.12345678`` for the MLPs) and
:func:`~ortlearn.training.minimize_lbfgs` each L-BFGS iteration, as
``INFO`` records of the ``ortlearn`` logger (:data:`logger`), not with
``print``. As users of scikit-learn expect, they show on the standard
output without any logging configuration: :data:`stdout_handler`, on the
``ortlearn`` logger, writes those records (and only those) to
``sys.stdout``. The records also reach the handlers of the root logger
(``propagate``): to see them only there (a log file, a format with
timestamps), remove the default handler::

    import logging
    import ortlearn.log
    logging.getLogger("ortlearn").removeHandler(ortlearn.log.stdout_handler)

With ``verbose=0`` nothing is logged.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["logger", "stdout_handler", "user_stacklevel", "verbose_log"]

#: The ``ortlearn`` logger.
logger = logging.getLogger("ortlearn")

_VERBOSE = "ortlearn_verbose"


class _StdoutHandler(logging.StreamHandler):
    """Writes to the ``sys.stdout`` of the moment (pytest's capsys, a redirected stdout)."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ sets it
        pass


#: The handler that shows the ``verbose`` lines on the standard output.
stdout_handler = _StdoutHandler()
stdout_handler.setFormatter(logging.Formatter("%(message)s"))
stdout_handler.addFilter(lambda record: getattr(record, _VERBOSE, False))
logger.addHandler(stdout_handler)


def verbose_log(message: str, name: str = "ortlearn", stacklevel: int = 2) -> None:
    """Log ``message`` at ``INFO`` for a ``verbose`` caller, whatever the logger levels.

    ``verbose`` is the user's request for these lines: they are not
    dropped by the ``WARNING`` level that the root logger has by default.
    A logger (``name``, under ``ortlearn``) disabled or filtered by the
    user still drops them.
    """
    log = logging.getLogger(name)
    if log.disabled:
        return
    fn, lno, func, _ = log.findCaller(stacklevel=stacklevel)
    record = log.makeRecord(log.name, logging.INFO, fn, lno, message, None, None, func,
                            extra={_VERBOSE: True})
    log.handle(record)


def user_stacklevel() -> int:
    """The ``stacklevel`` of ``warnings.warn`` that names the user's line.

    Counts the frames above the caller of this function that are inside
    ortlearn or scikit-learn (the ``fit`` wrappers of ``_fit_context``,
    ``cross_val_score``...): the warning points at the first frame outside
    both, the line of the user that called them, however deep ortlearn's
    own calls are.
    """
    import os

    import sklearn

    inside = tuple(os.path.dirname(m.__file__) + os.sep
                   for m in (sys.modules[__name__.rpartition(".")[0]], sklearn))
    frame = sys._getframe(1)  # the function that warns: stacklevel 1
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame = frame.f_back
        level += 1
    return level
