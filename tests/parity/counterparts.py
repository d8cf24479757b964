"""What the parity suites of the full-batch families share: fitting an ortlearn estimator
beside its scikit-learn counterpart, and comparing their objectives and parameters."""

import warnings

from sklearn.exceptions import ConvergenceWarning

#: ortlearn's objective may exceed the counterpart's by this much, relative.
RTOL = 1e-6


def assert_reaches(ours, theirs):
    """Our objective is at most the counterpart's, ``RTOL`` relative."""
    assert (ours - theirs) / abs(theirs) <= RTOL, (ours, theirs)


def fit_both(ort_cls, sk_cls, X, y, sample_weight=None, **params):
    """``(ortlearn's, scikit-learn's)`` estimators fitted with the same parameters and data
    (a solver stopping at its budget is compared too, without its warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        sk = sk_cls(**params).fit(X, y, sample_weight=sample_weight)
        ort = ort_cls(**params).fit(X, y, sample_weight=sample_weight)
    return ort, sk


def check_counterpart_parameters(ort_cls, sk_cls):
    """ortlearn's estimator takes every parameter of its counterpart, with its defaults,
    plus ``device``."""
    params = sk_cls().get_params()
    ours = ort_cls(**params).get_params()
    assert set(ours) - set(params) == {"device"}
    assert {k: ours[k] for k in params} == params
    ort_cls().set_params(**params)  # unchanged values pass
