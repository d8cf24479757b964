"""What the parity suites share: fitting an ortlearn estimator beside its scikit-learn
counterpart with the same sample weights, comparing their objectives and parameters, and
reading what ortlearn logs."""

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

import ortlearn.log

#: ortlearn's objective may exceed the counterpart's by this much, relative.
RTOL = 1e-6


def assert_reaches(ours, theirs):
    """Our objective is at most the counterpart's, ``RTOL`` relative."""
    assert (ours - theirs) / abs(theirs) <= RTOL, (ours, theirs)


def sample_weights(n: int, weighted: bool):
    """``(sample_weight, weights)``: the fit's weights (None unweighted) and the objective's
    (ones unweighted), the same draw for every test."""
    sw = np.random.RandomState(0).uniform(0.5, 2.0, n) if weighted else None
    return sw, np.ones(n) if sw is None else sw


@contextlib.contextmanager
def ortlearn_log():
    """Within it, what ortlearn logs goes to the ``io.StringIO`` it yields, not stdout."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("ortlearn")
    logger.addHandler(handler)
    logger.removeHandler(ortlearn.log.stdout_handler)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.addHandler(ortlearn.log.stdout_handler)


def fit_both(ort_cls, sk_cls, X, y, sample_weight=None, **params):
    """``(ortlearn's, scikit-learn's)`` estimators fitted with the same parameters and data
    (a solver stopping at its budget is compared too, without its warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        sk = sk_cls(**params).fit(X, y, sample_weight=sample_weight)
        ort = ort_cls(**params).fit(X, y, sample_weight=sample_weight)
    return ort, sk


def check_counterpart_parameters(ort_cls, sk_cls, added=("device",)):
    """ortlearn's estimator takes every parameter of its counterpart, with its defaults,
    plus those ``added``."""
    params = sk_cls().get_params()
    ours = ort_cls(**params).get_params()
    assert set(ours) - set(params) == set(added)
    assert {k: ours[k] for k in params} == params
    ort_cls().set_params(**params)  # unchanged values pass


_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: A fresh process fits on a CSR of 100 000 x 50 000 with 50 values a row (0.1 %: 20 GB
#: dense in float32, 40 GB in float64) and prints the fit's peak memory beyond the data's.
_SPARSE_CHILD = """
import json, time, warnings
import numpy as np
import scipy.sparse as sp
import ortlearn
{status}
rows, cols, per_row = {shape}
rng = np.random.default_rng(0)
X = sp.csr_matrix((rng.standard_normal(rows * per_row).astype({dtype}),
                   rng.integers(0, cols, rows * per_row, dtype=np.int32),
                   np.arange(0, rows * per_row + 1, per_row, dtype=np.int32)),
                  shape=(rows, cols))
y = {target}
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM back to the current RSS
base = status("VmHWM")
start = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
{fit}
print(json.dumps({{"peak": status("VmHWM") - base, "seconds": time.perf_counter() - start,
                  "n_iter": int(np.max(est.n_iter_)), "loss": float(est.loss_)}}))
"""


def sparse_fit_peak(fit: str, target: str, dtype: str = "np.float64",
                    shape=(100_000, 50_000, 50)) -> dict:
    """``{'peak', 'seconds', 'n_iter', 'loss'}`` of ``fit`` (statements on ``X`` and ``y``
    that leave the fitted estimator in ``est``) on a large CSR ``X`` of ``shape`` (rows,
    columns, values a row; values of ``dtype``) and the ``target`` expression's ``y``,
    measured in a fresh process (Linux ``/proc``)."""
    from benchmarks.memory import STATUS_SOURCE

    code = _SPARSE_CHILD.format(status=textwrap.dedent(STATUS_SOURCE),
                                fit=textwrap.indent(fit, "    "), target=target, dtype=dtype,
                                shape=repr(tuple(shape)))
    env = dict(os.environ, PYTHONPATH=_REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
