"""What every solver of the runtime returns: :class:`SolverResult`.

scikit-learn's solvers hand back scipy's ``OptimizeResult`` and check it in
one place (``_check_optimize_result``); ortlearn's do the same with one type:
the solution, the iterations, the objective, whether the stopping test was
met and, in words, how the run ended. A solver that diverges raises
:class:`~ortlearn.exceptions.ConvergenceError` itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["CALLBACK", "CONVERGED", "INTERRUPTED", "MAX_ITER", "STALLED", "SolverResult"]

#: ``status`` of a run whose stopping test was met.
CONVERGED = "converged"
#: ``status`` of a run whose iteration or evaluation budget ran out.
MAX_ITER = "max_iter"
#: ``status`` of a run a callback stopped.
CALLBACK = "callback"
#: ``status`` of a run Ctrl-C stopped (the best point reached is returned).
INTERRUPTED = "interrupted"
#: ``status`` of a run that ended where it started although the gradient was not zero
#: there (a line search that found no decrease: badly scaled data).
STALLED = "stalled"


@dataclass(frozen=True)
class SolverResult:
    """What a solver reached.

    Attributes
    ----------
    weights : dict of str to numpy.ndarray, or numpy.ndarray
        The solution: the trained weights by name (L-BFGS, the quantile
        problem's ``coef`` and ``intercept``), or a coefficient matrix with one
        column per independent problem (FISTA, the SVM duals).
    n_iter : int or numpy.ndarray of int
        Iterations run (one per column for a column-wise solver).
    loss : float
        The objective at ``weights``.
    converged : bool or numpy.ndarray of bool
        Whether the stopping test was met (one per column for a column-wise
        solver).
    status : str
        How the run ended: :data:`CONVERGED`, :data:`MAX_ITER`, :data:`CALLBACK`,
        :data:`INTERRUPTED`, :data:`STALLED`, or the solver's own message
        (scipy's, for an abnormal stop).
    info : dict
        What one solver adds (FISTA's gaps, the quantile path's stage losses).

    Examples
    --------
    >>> result = SolverResult({"w": np.zeros(2)}, 3, 0.5, True, CONVERGED)
    >>> result.converged, result.status, result.info
    (True, 'converged', {})
    """

    weights: dict | np.ndarray
    n_iter: int | np.ndarray
    loss: float
    converged: bool | np.ndarray
    status: str
    info: dict = field(default_factory=dict)
