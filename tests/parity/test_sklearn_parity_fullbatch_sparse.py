"""Sparse X (scipy.sparse CSR/CSC) in the full-batch estimators and solver='lbfgs'.

The graph gets ``X @ W`` computed by scipy and ``W``'s gradient gets
``X^T @ d``: the fit reaches the dense fit's objective (1e-6 relative, in
practice to rounding) and scikit-learn's on the same sparse data, with
memory in the non-zeros.
"""

import os
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from counterparts import sparse_fit_peak
from sklearn import linear_model, svm

import ortlearn
from ortlearn.exceptions import ConvergenceWarning

RTOL = 1e-6


def _data(n=400, p=60, density=0.08, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=density, random_state=seed, format="csr",
                  data_rvs=lambda k: rng.uniform(0.5, 3.0, k))
    signal = X @ rng.standard_normal(p) * 0.5
    weights = rng.uniform(0.5, 2.0, n)
    return X, signal - signal.mean(), weights


#: L-BFGS-B's smoothing stages of the quantile regression take hundreds of iterations on
#: the shared data: a smaller problem keeps the file fast
_DATA = {"OrtQuantileRegressor": {"n": 150, "p": 10, "density": 0.3}}


def _targets(kind, signal):
    rng = np.random.default_rng(1)
    if kind == "binary":
        return (signal + 0.3 * rng.standard_normal(len(signal)) > 0).astype(int)
    if kind == "multiclass":
        return np.digitize(signal + 0.3 * rng.standard_normal(len(signal)), [-0.5, 0.5])
    if kind == "counts":
        return rng.poisson(np.exp(0.3 * signal)).astype(float)
    return signal + 0.2 * rng.standard_normal(len(signal)) + 3.0


CASES = [  # (estimator, target kind)
    (lambda: ortlearn.OrtLogisticRegression(), "binary"),
    (lambda: ortlearn.OrtLogisticRegression(C=0.5), "multiclass"),
    (lambda: ortlearn.OrtRidge(alpha=0.3), "continuous"),
    (lambda: ortlearn.OrtPoissonRegressor(alpha=0.01), "counts"),
    (lambda: ortlearn.OrtTweedieRegressor(power=1.5, alpha=0.01), "counts"),
    (lambda: ortlearn.OrtHuberRegressor(), "continuous"),
    (lambda: ortlearn.OrtLasso(alpha=0.01, tol=1e-8), "continuous"),
    (lambda: ortlearn.OrtElasticNet(alpha=0.02, tol=1e-8), "continuous"),
    # dense: Newton's method to its minimum; sparse: L-BFGS, to it at this tol
    (lambda: ortlearn.OrtLinearSVC(tol=1e-8), "multiclass"),
    (lambda: ortlearn.OrtLinearSVR(loss="squared_epsilon_insensitive", tol=1e-8),
     "continuous"),
    (lambda: ortlearn.OrtQuantileRegressor(alpha=0.01), "continuous"),
    (lambda: ortlearn.OrtMLPClassifier(hidden_layer_sizes=(8,), solver="lbfgs", max_iter=30,
                                       random_state=0), "multiclass"),
    (lambda: ortlearn.OrtMLPRegressor(hidden_layer_sizes=(8,), solver="lbfgs", max_iter=30,
                                      random_state=0), "continuous"),
    (lambda: ortlearn.OrtLinearClassifier(solver="lbfgs", max_iter=30, random_state=0),
     "binary"),
]


def _fit(est, X, y, weights):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        # the mini-batch families take no weights with lbfgs in every version: left out
        if "MLP" in type(est).__name__ or "OrtLinear" in type(est).__name__ and \
                not isinstance(est, (ortlearn.OrtLinearSVC, ortlearn.OrtLinearSVR)):
            return est.fit(X, y)
        return est.fit(X, y, sample_weight=weights)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("make, kind", CASES,
                         ids=[f"{type(m()).__name__}-{k}" for m, k in CASES])
def test_sparse_fit_is_the_dense_fit(make, kind, fmt):
    X, signal, weights = _data(**_DATA.get(type(make()).__name__, {}))
    y = _targets(kind, signal)
    dense = _fit(make(), X.toarray(), y, weights)
    sparse = _fit(make(), X.asformat(fmt), y, weights)
    assert abs(sparse.loss_ - dense.loss_) <= RTOL * abs(dense.loss_), (sparse.loss_,
                                                                         dense.loss_)
    predict = getattr(dense, "decision_function", dense.predict)
    np.testing.assert_allclose(getattr(sparse, predict.__name__)(X.asformat(fmt)),
                               predict(X.toarray()), rtol=1e-5, atol=1e-6)


# ------------------------------------------- the counterpart's objective, same sparse X
def _logistic(est, X, y, w, C=1.0):
    raw = np.asarray(X @ est.coef_.T) + est.intercept_
    target = (y == est.classes_[1]).astype(float)
    loss = np.logaddexp(0, raw[:, 0]) - target * raw[:, 0]
    return (w * loss).sum() / w.sum() + 0.5 / (C * w.sum()) * (est.coef_ ** 2).sum()


def _ridge(est, X, y, w, alpha=0.3):
    residual = y - X @ est.coef_ - est.intercept_
    return (w * residual ** 2).sum() + alpha * est.coef_ @ est.coef_


def _poisson(est, X, y, w, alpha=0.01):
    raw = X @ est.coef_ + est.intercept_
    return np.average(np.exp(raw) - y * raw, weights=w) + 0.5 * alpha * est.coef_ @ est.coef_


def _huber(est, X, y, w, epsilon=1.35, alpha=1e-4):
    z = (y - X @ est.coef_ - est.intercept_) / est.scale_
    H = np.where(np.abs(z) <= epsilon, z ** 2, 2 * epsilon * np.abs(z) - epsilon ** 2)
    return (w * (est.scale_ + est.scale_ * H)).sum() + alpha * est.coef_ @ est.coef_


def _lasso(est, X, y, w, alpha=0.01):
    sw = w * len(y) / w.sum()
    residual = y - X @ est.coef_ - est.intercept_
    return 0.5 * (sw * residual ** 2).sum() / len(y) + alpha * np.abs(est.coef_).sum()


def _svc(est, X, y, w, C=1.0):
    coef = np.append(est.coef_[0], est.intercept_[0])
    raw = X @ est.coef_[0] + est.intercept_[0]
    sign = np.where(y == est.classes_[1], 1.0, -1.0)
    return 0.5 * coef @ coef + C * (w * np.maximum(0, 1 - sign * raw) ** 2).sum()


def _quantile(est, X, y, w, alpha=0.01, q=0.5):
    r = y - X @ est.coef_ - est.intercept_
    return (w @ np.maximum(q * r, (q - 1) * r)) / w.sum() + alpha * np.abs(est.coef_).sum()


PAIRS = [
    (ortlearn.OrtLogisticRegression, linear_model.LogisticRegression, {}, "binary", _logistic),
    (ortlearn.OrtRidge, linear_model.Ridge, {"alpha": 0.3}, "continuous", _ridge),
    (ortlearn.OrtPoissonRegressor, linear_model.PoissonRegressor, {"alpha": 0.01}, "counts",
     _poisson),
    (ortlearn.OrtHuberRegressor, linear_model.HuberRegressor, {}, "continuous", _huber),
    (ortlearn.OrtLasso, linear_model.Lasso, {"alpha": 0.01, "tol": 1e-8}, "continuous",
     _lasso),
    (ortlearn.OrtLinearSVC, svm.LinearSVC, {"tol": 1e-8, "max_iter": 100_000}, "binary",
     _svc),
    (ortlearn.OrtQuantileRegressor, linear_model.QuantileRegressor, {"alpha": 0.01},
     "continuous", _quantile),
]


@pytest.mark.parametrize("ort_cls, sk_cls, params, kind, objective", PAIRS,
                         ids=[p[0].__name__ for p in PAIRS])
def test_sparse_fit_reaches_the_counterparts_objective(ort_cls, sk_cls, params, kind,
                                                       objective):
    X, signal, weights = _data(**_DATA.get(ort_cls.__name__, {}))
    y = _targets(kind, signal)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", UserWarning)
        theirs = sk_cls(**params).fit(X, y, sample_weight=weights)
        ours = ort_cls(**params).fit(X, y, sample_weight=weights)
    ours_value, theirs_value = objective(ours, X, y, weights), objective(theirs, X, y, weights)
    assert (ours_value - theirs_value) / abs(theirs_value) <= RTOL, (ours_value, theirs_value)


def test_the_dual_losses_refuse_sparse_x_clearly():
    X, signal, _ = _data()
    with pytest.raises(ValueError, match="loss='hinge' .*does not accept sparse X.*"
                                         "squared_hinge"):
        ortlearn.OrtLinearSVC(loss="hinge").fit(X, _targets("binary", signal))
    with pytest.raises(ValueError, match="squared_epsilon_insensitive"):
        ortlearn.OrtLinearSVR().fit(X, _targets("continuous", signal))


def test_lbfgs_refuses_a_sparse_input_it_cannot_multiply():
    from ortlearn.estimators._objective import linear_objective
    from ortlearn.training import minimize_lbfgs

    def row_loss(b, raw, label):  # reads X itself, not only through X @ coef
        return b.op("Mul", [b.op("Sub", [raw, label]), b.reduce("ReduceSum", "X", axes=[1])])

    model = linear_objective(3, 1, row_loss, fit_intercept=True, data_scale=1.0, l2=0.0)
    X = sp.csr_matrix(np.eye(3))
    with pytest.raises(ValueError, match="sparse 'X' is supported where it is only the left "
                                         "factor of MatMul.*ReduceSum"):
        minimize_lbfgs(model, ["coef", "intercept"], None,
                       [X, np.ones((3, 1)), np.ones(3)], ["X", "y", "sample_weight"])


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
@pytest.mark.parametrize("cls", ["OrtLogisticRegression", "OrtRidge"])
def test_sparse_fit_memory_is_proportional_to_the_non_zeros(cls):
    result = sparse_fit_peak(f"est = ortlearn.{cls}(max_iter=5).fit(X, y)",
                             "(X @ rng.standard_normal(cols) > 0).astype(int)")
    assert result["n_iter"] >= 1, result
    # dense: 40 GB; CSR: 60 MB (data + indices), its transpose as much again
    assert result["peak"] < 0.5 * 2**30, result
