"""W10-W16: scikit-learn estimator families, ortlearn against its counterpart.

Each workload trains an ortlearn estimator and its scikit-learn counterpart with the
same parameters on the same data, in the same run:

* full-batch L-BFGS (W10 multinomial logistic regression, W11 Poisson GLM, W12 Huber,
  W13 Ridge): the whole fit, in seconds, to the counterpart's tolerance; quality is the
  counterpart's objective computed with one numpy formula from each model's ``coef_`` /
  ``intercept_`` (``objective_gap``: relative to scikit-learn's, under the table). Every
  ``scipy.optimize.minimize`` call in the fit is instrumented (:func:`_count_evaluations`):
  ``n_evals`` loss-and-gradient evaluations, ``eval_ms`` the mean time of one (the
  onnxruntime call for ortlearn, numpy/BLAS and Cython for scikit-learn), ``scipy_s``
  scipy's own L-BFGS-B work between them and ``setup_s`` the rest of the fit (validation;
  for ortlearn the graph, its gradient and the onnxruntime session);
* SGD (W14, hinge loss): seconds per epoch, ortlearn with scikit-learn's per-sample
  updates (``batch_size=1``) and with mini-batches, the same epochs, test accuracy;
* MLP (W15 Poisson loss, W16 multilabel), Adam: seconds per epoch, test quality.

* non-smooth and liblinear families: W17 (Lasso: ortlearn's FISTA against coordinate
  descent, both to the duality gap), W18 (LinearSVC, squared hinge: L-BFGS on the primal
  against liblinear), whole fits in seconds as the L-BFGS workloads.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from benchmarks._harness import (
    ADAM_LR,
    Contender,
    Options,
    Workload,
    ortlearn_epochs,
    ortlearn_estimator,
    rows,
    sklearn_epochs,
    timed,
)

LBFGS_TOL = 1e-4


# ---------------------------------------------------------------- helpers
@contextlib.contextmanager
def _count_evaluations():
    """Time every objective evaluation of the ``scipy.optimize.minimize`` calls in the block.

    Yields a dict: ``n_evals``, ``eval_s`` (their total time) and ``minimize_s`` (the
    time inside ``minimize``), summed over the calls. Both libraries call
    ``scipy.optimize.minimize`` through the module attribute, so one patch sees both; the
    wrapper adds a ``perf_counter`` pair per evaluation.
    """
    import scipy.optimize

    original = scipy.optimize.minimize
    stats = {"n_evals": 0, "eval_s": 0.0, "minimize_s": 0.0}

    def minimize(fun, x0, *args, **kwargs):
        def timed(*a, **k):
            start = time.perf_counter()
            try:
                return fun(*a, **k)
            finally:
                stats["eval_s"] += time.perf_counter() - start
                stats["n_evals"] += 1
        start = time.perf_counter()
        try:
            return original(timed, x0, *args, **kwargs)
        finally:
            stats["minimize_s"] += time.perf_counter() - start

    scipy.optimize.minimize = minimize
    try:
        yield stats
    finally:
        scipy.optimize.minimize = original


def _lbfgs_fit(est, X, y, objective) -> dict:
    """Fit ``est`` once; time, iterations, evaluations and the objective reached."""
    with _count_evaluations() as stats:
        seconds, est = timed(lambda: est.fit(X, y))
    n_iter = getattr(est, "n_iter_", None)
    n_evals = stats["n_evals"]
    return {"time": seconds, "total_s": seconds,
            "n_iter": None if n_iter is None else int(np.max(n_iter)),
            "n_evals": n_evals,
            "eval_ms": stats["eval_s"] / n_evals * 1e3 if n_evals else None,
            # scipy's own L-BFGS-B work between the evaluations
            "scipy_s": stats["minimize_s"] - stats["eval_s"],
            # the fit outside minimize: validation, graph, autodiff, session, write-back
            "setup_s": seconds - stats["minimize_s"],
            "objective": objective(est)}


def _lbfgs_workload(key, title, params, ours: tuple, theirs: tuple, objective, note):
    """A full-batch workload: ``ours``/``theirs`` are ``(name, make(warmup) -> est, note)``
    (:func:`_pair` makes both from the same parameters)."""
    w = Workload(key, title, "s/fit", "objective", params, sklearn_ref=theirs[0],
                 gap="objective")
    w.notes.append(note)
    X, y = params.pop("_data")

    def runner(make):
        return lambda seed, warmup: _lbfgs_fit(make(warmup), X, y, objective)

    w.contenders += [Contender(ours[0], "ortlearn", runner(ours[1]), ours[2]),
                     Contender(theirs[0], "sklearn", runner(theirs[1]), theirs[2])]
    return w


def _ort(name: str, params: dict, device: str):
    return ortlearn_estimator(name, {**params, "device": device}, {})


def _pair(opts: Options, ours: tuple, theirs: tuple, common: dict, max_iter: int) -> tuple:
    """The two contenders of a whole-fit workload, with the same parameters.

    ``ours`` is ``(label, ortlearn class name, note)``, ``theirs`` ``(label,
    scikit-learn class, note)``; both fit with ``common`` and ``max_iter`` (2 for
    the warm-up fit).
    """
    def iterations(warmup):
        return {**common, "max_iter": 2 if warmup else max_iter}

    return ((ours[0], lambda warmup: _ort(ours[1], iterations(warmup), opts.device), ours[2]),
            (theirs[0], lambda warmup: theirs[1](**iterations(warmup)), theirs[2]))


# ---------------------------------------------------------------- W10
def build_w10(opts: Options) -> Workload:
    """W10: multinomial logistic regression (5 classes), L-BFGS to tol 1e-4."""
    from scipy.special import logsumexp
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    n = rows(50_000, opts.scale, 500)
    X, y = make_classification(n_samples=n, n_features=50, n_informative=20, n_classes=5,
                               random_state=0)
    C, max_iter = 1.0, 1000

    def objective(est):
        # scikit-learn's: mean cross-entropy + ||coef||^2 / (2 C n)
        coef = np.asarray(est.coef_, np.float64)
        z = X @ coef.T + np.asarray(est.intercept_, np.float64)
        data = np.mean(logsumexp(z, axis=1) - z[np.arange(n), y])
        return float(data + np.sum(coef ** 2) / (2 * C * n))

    params = {"n_samples": n, "n_features": X.shape[1], "n_classes": 5, "C": C,
              "tol": LBFGS_TOL, "max_iter": max_iter, "_data": (X, y)}
    common = {"C": C, "tol": LBFGS_TOL}
    return _lbfgs_workload(
        "W10", "multinomial logistic regression, L-BFGS", params,
        *_pair(opts, ("ortlearn_lbfgs", "OrtLogisticRegression", "OrtLogisticRegression"),
               ("sklearn_lbfgs", LogisticRegression, "LogisticRegression(solver='lbfgs')"),
               common, max_iter),
        objective, "objective = mean cross-entropy + ||coef||^2 / (2 C n); time = whole fit")


# ---------------------------------------------------------------- W11
def build_w11(opts: Options) -> Workload:
    """W11: Poisson GLM (log link), L-BFGS to tol 1e-4."""
    from scipy.special import xlogy
    from sklearn.linear_model import PoissonRegressor

    n, p = rows(100_000, opts.scale, 500), 50
    rng = np.random.RandomState(0)
    X = rng.standard_normal((n, p))
    true = rng.uniform(-1, 1, p) / np.sqrt(p)
    y = rng.poisson(np.exp(X @ true + 0.5)).astype(np.float64)
    alpha, max_iter = 1e-3, 1000

    def objective(est):
        # scikit-learn's: mean half Poisson deviance + alpha / 2 ||coef||^2
        coef = np.asarray(est.coef_, np.float64)
        mu = np.exp(X @ coef + float(est.intercept_))
        deviance = np.mean(xlogy(y, y) - y * np.log(mu) - y + mu)
        return float(deviance + 0.5 * alpha * coef @ coef)

    params = {"n_samples": n, "n_features": p, "alpha": alpha, "tol": LBFGS_TOL,
              "max_iter": max_iter, "_data": (X, y)}
    common = {"alpha": alpha, "tol": LBFGS_TOL}
    return _lbfgs_workload(
        "W11", "Poisson GLM, L-BFGS", params,
        *_pair(opts, ("ortlearn_lbfgs", "OrtPoissonRegressor", "OrtPoissonRegressor"),
               ("sklearn_lbfgs", PoissonRegressor, "PoissonRegressor(solver='lbfgs')"),
               common, max_iter),
        objective, "objective = mean half Poisson deviance + alpha/2 ||coef||^2; time = whole fit")


# ---------------------------------------------------------------- W12
def build_w12(opts: Options) -> Workload:
    """W12: Huber regression (5 % outliers), L-BFGS-B to tol 1e-5."""
    from sklearn.datasets import make_regression
    from sklearn.linear_model import HuberRegressor

    n = rows(100_000, opts.scale, 500)
    X, y = make_regression(n_samples=n, n_features=50, noise=5.0, random_state=0)
    rng = np.random.RandomState(1)
    outliers = rng.rand(n) < 0.05
    y[outliers] += rng.standard_normal(outliers.sum()) * 10 * y.std()
    epsilon, alpha, tol, max_iter = 1.35, 1e-4, 1e-5, 1000

    def objective(est):
        # scikit-learn's (Owen's joint scale): sum(sigma + H(r / sigma) sigma) + alpha ||w||^2
        coef, sigma = np.asarray(est.coef_, np.float64), float(est.scale_)
        z = np.abs(y - X @ coef - float(est.intercept_)) / sigma
        h = np.where(z <= epsilon, z ** 2, 2 * epsilon * z - epsilon ** 2)
        return float(np.sum(sigma + h * sigma) + alpha * coef @ coef)

    params = {"n_samples": n, "n_features": X.shape[1], "outliers": int(outliers.sum()),
              "epsilon": epsilon, "alpha": alpha, "tol": tol, "max_iter": max_iter,
              "_data": (X, y)}
    common = {"epsilon": epsilon, "alpha": alpha, "tol": tol}
    return _lbfgs_workload(
        "W12", "Huber regression, L-BFGS-B", params,
        *_pair(opts, ("ortlearn_lbfgs", "OrtHuberRegressor", "OrtHuberRegressor"),
               ("sklearn_lbfgs", HuberRegressor, "HuberRegressor (scipy L-BFGS-B)"),
               common, max_iter),
        objective, "objective = sum(sigma + H(r/sigma) sigma) + alpha ||coef||^2 "
                   "(HuberRegressor's, over coef, intercept and sigma); time = whole fit")


# ---------------------------------------------------------------- W13
def build_w13(opts: Options) -> Workload:
    """W13: Ridge regression: ortlearn's L-BFGS against scikit-learn's Cholesky (OrtRidge's
    default solves the normal equations too: the end-to-end table times it)."""
    from sklearn.datasets import make_regression
    from sklearn.linear_model import Ridge

    n = rows(100_000, opts.scale, 500)
    X, y = make_regression(n_samples=n, n_features=50, noise=5.0, random_state=0)
    alpha = 1.0

    def objective(est):
        # scikit-learn's: ||y - X coef - intercept||^2 + alpha ||coef||^2
        coef = np.asarray(est.coef_, np.float64)
        r = y - X @ coef - float(est.intercept_)
        return float(r @ r + alpha * coef @ coef)

    params = {"n_samples": n, "n_features": X.shape[1], "alpha": alpha, "tol": LBFGS_TOL,
              "_data": (X, y)}
    return _lbfgs_workload(
        "W13", "Ridge regression", params,
        ("ortlearn_lbfgs", lambda warmup: _ort("OrtRidge",
                                               {"alpha": alpha, "tol": LBFGS_TOL,
                                                "solver": "lbfgs",
                                                "max_iter": 2 if warmup else None},
                                               opts.device), "OrtRidge(solver='lbfgs')"),
        ("sklearn_auto", lambda warmup: Ridge(alpha=alpha, tol=LBFGS_TOL),
         "Ridge(solver='auto'): Cholesky on X^T X, no iterations"),
        objective, "objective = ||y - X coef - b||^2 + alpha ||coef||^2; time = whole fit")


# ---------------------------------------------------------------- W14
def build_w14(opts: Options) -> Workload:
    """W14: linear SVM by SGD (hinge loss): per sample and mini-batch, s/epoch."""
    from sklearn.datasets import make_classification
    from sklearn.linear_model import SGDClassifier
    from sklearn.model_selection import train_test_split

    n = rows(12_500, opts.scale, 500)
    X, y = make_classification(n_samples=n, n_features=50, n_informative=20, random_state=0)
    X, X_test, y, y_test = train_test_split(X, y, test_size=0.2, random_state=0)
    epochs, batch = opts.epochs or 3, opts.batch or 256
    # scikit-learn's defaults (penalty l2, alpha 1e-4, learning_rate 'optimal'), no stopping
    common = {"loss": "hinge", "tol": None, "shuffle": True, "average": False}
    w = Workload("W14", "linear SVM (hinge), SGD", "s/epoch", "test_accuracy",
                 {"n_train": len(X), "n_test": len(X_test), "n_features": X.shape[1],
                  "epochs": epochs, "minibatch": batch, "learning_rate": "optimal",
                  "alpha": 1e-4},
                 sklearn_ref="sklearn_sgd_per_sample", gap="test_accuracy")

    def ortlearn_sgd(batch_size):
        def run(seed, warmup):
            def make(max_iter):
                return _ort("OrtSGDClassifier", {**common, "batch_size": batch_size,
                                                 "max_iter": max_iter, "random_state": seed},
                            opts.device)
            out, est = ortlearn_epochs(make, X, y, epochs, warmup)
            return {**out, "test_accuracy": float(est.score(X_test, y_test))}
        return run

    def sklearn_sgd(seed, warmup):
        est = SGDClassifier(**common, max_iter=1 if warmup else epochs, random_state=seed)
        out, est = sklearn_epochs(est, X, y)
        return {**out, "test_accuracy": float(est.score(X_test, y_test))}

    w.contenders += [
        Contender("ortlearn_sgd_per_sample", "ortlearn", ortlearn_sgd(1),
                  "OrtSGDClassifier(batch_size=1): scikit-learn's updates"),
        Contender(f"ortlearn_sgd_batch{batch}", "ortlearn", ortlearn_sgd(batch),
                  f"OrtSGDClassifier(batch_size={batch}): one update per mini-batch"),
        Contender("sklearn_sgd_per_sample", "sklearn", sklearn_sgd, "SGDClassifier (Cython)"),
    ]
    return w


# ---------------------------------------------------------------- W15, W16
def _mlp_workload(opts: Options, key, title, reference, X, y, X_test, quality_name, quality,
                  extra: dict, hidden=(100,)):
    epochs, batch = opts.epochs or 5, opts.batch or 200
    common = {"hidden_layer_sizes": hidden, "activation": "relu", "solver": "adam",
              "batch_size": batch, "learning_rate_init": ADAM_LR, "alpha": 1e-4,
              "tol": 0.0, "early_stopping": False, "shuffle": True, **extra}
    w = Workload(key, title, "s/epoch", quality_name,
                 {"n_train": len(X), "n_test": len(X_test), "n_features": X.shape[1],
                  "hidden_layer_sizes": hidden, "epochs": epochs, "batch_size": batch,
                  "learning_rate": ADAM_LR, **extra},
                 sklearn_ref="sklearn_adam", gap=quality_name)

    def ortlearn_adam(seed, warmup):
        def make(max_iter):
            return _ort("Ort" + reference.__name__,
                        {**common, "max_iter": max_iter, "n_iter_no_change": max_iter + 1,
                         "random_state": seed}, opts.device)
        out, est = ortlearn_epochs(make, X, y, epochs, warmup)
        return {**out, quality_name: quality(est)}

    def sklearn_adam(seed, warmup):
        max_iter = 1 if warmup else epochs
        est = reference(**common, max_iter=max_iter, n_iter_no_change=max_iter + 1,
                        random_state=seed)
        out, est = sklearn_epochs(est, X, y)
        return {**out, quality_name: quality(est)}

    w.contenders += [Contender("ortlearn_adam", "ortlearn", ortlearn_adam,
                               "Ort" + reference.__name__),
                     Contender("sklearn_adam", "sklearn", sklearn_adam, reference.__name__)]
    return w


def build_w15(opts: Options) -> Workload:
    """W15: MLP regressor with the Poisson loss (100 relu), Adam, batch 200."""
    from sklearn.metrics import mean_poisson_deviance
    from sklearn.neural_network import MLPRegressor

    n, p = rows(25_000, opts.scale, 500), 20
    rng = np.random.RandomState(0)
    X = rng.standard_normal((n + n // 4, p)).astype(np.float32)
    y = rng.poisson(np.exp(np.tanh(X[:, :5]).sum(axis=1) * 0.4)).astype(np.float32)
    X, X_test, y, y_test = X[:n], X[n:], y[:n], y[n:]
    return _mlp_workload(
        opts, "W15", "MLP regressor, Poisson loss, Adam", MLPRegressor, X, y, X_test,
        "test_poisson_deviance",
        lambda est: float(mean_poisson_deviance(y_test, np.maximum(est.predict(X_test),
                                                                   1e-12))),
        {"loss": "poisson"})


def build_w16(opts: Options) -> Workload:
    """W16: multilabel MLP classifier (5 labels, 100 relu), Adam, batch 200."""
    from sklearn.datasets import make_multilabel_classification
    from sklearn.neural_network import MLPClassifier

    n = rows(25_000, opts.scale, 500)
    X, Y = make_multilabel_classification(n_samples=n + n // 4, n_features=20, n_classes=5,
                                          random_state=0)
    X = (X / X.max()).astype(np.float32)
    X, X_test, Y, Y_test = X[:n], X[n:], Y[:n], Y[n:]
    return _mlp_workload(
        opts, "W16", "MLP classifier, multilabel, Adam", MLPClassifier, X, Y, X_test,
        "test_label_accuracy",
        lambda est: float(np.mean(est.predict(X_test) == Y_test)), {})


#: ``Wn -> builder``. Lasso / ElasticNet / LinearSVC / LinearSVR: W17 on, with their estimators.
# ---------------------------------------------------------------- W17
def build_w17(opts: Options) -> Workload:
    """W17: Lasso: ortlearn's FISTA (gradients in onnxruntime) against coordinate descent."""
    from sklearn.datasets import make_regression
    from sklearn.linear_model import Lasso

    n = rows(100_000, opts.scale, 500)
    X, y = make_regression(n_samples=n, n_features=50, n_informative=10, noise=5.0,
                           random_state=0)
    alpha, tol = 1.0, 1e-4

    def objective(est):
        # scikit-learn's: ||y - X coef - intercept||^2 / (2 n) + alpha ||coef||_1
        coef = np.asarray(est.coef_, np.float64)
        r = y - X @ coef - float(est.intercept_)
        return float(r @ r / (2 * n) + alpha * np.abs(coef).sum())

    params = {"n_samples": n, "n_features": X.shape[1], "alpha": alpha, "tol": tol,
              "_data": (X, y)}
    common = {"alpha": alpha, "tol": tol}
    return _lbfgs_workload(
        "W17", "Lasso", params,
        *_pair(opts, ("ortlearn_fista", "OrtLasso", "OrtLasso (FISTA)"),
               ("sklearn_cd", Lasso, "Lasso (coordinate descent)"), common, 1000),
        objective, "objective = ||r||^2 / (2 n) + alpha ||coef||_1; both stop on the duality "
                   "gap; time = whole fit")


# ---------------------------------------------------------------- W18
def build_w18(opts: Options) -> Workload:
    """W18: LinearSVC (squared hinge): ortlearn's L-BFGS on the primal against liblinear."""
    from sklearn.datasets import make_classification
    from sklearn.svm import LinearSVC

    n = rows(50_000, opts.scale, 500)
    X, y = make_classification(n_samples=n, n_features=50, n_informative=20, random_state=0)
    C, scaling = 1.0, 1.0

    def objective(est):
        # liblinear's: ||w||^2 / 2 + C sum max(0, 1 - s z)^2, the intercept a penalised weight
        w = np.append(np.ravel(est.coef_), float(np.ravel(est.intercept_)[0]) / scaling)
        z = X @ w[:-1] + w[-1] * scaling
        s = np.where(y == 1, 1.0, -1.0)
        return float(0.5 * w @ w + C * np.sum(np.maximum(0, 1 - s * z) ** 2))

    params = {"n_samples": n, "n_features": X.shape[1], "C": C, "tol": LBFGS_TOL,
              "_data": (X, y)}
    common = {"C": C, "tol": LBFGS_TOL}
    return _lbfgs_workload(
        "W18", "LinearSVC, squared hinge", params,
        *_pair(opts, ("ortlearn_lbfgs", "OrtLinearSVC", "OrtLinearSVC (primal L-BFGS)"),
               ("sklearn_liblinear", LinearSVC, "LinearSVC (liblinear)"), common, 1000),
        objective, "objective = liblinear's primal (intercept penalised); time = whole fit")


FAMILY_BUILDERS = {"W10": build_w10, "W11": build_w11, "W12": build_w12, "W13": build_w13,
                   "W14": build_w14, "W15": build_w15, "W16": build_w16, "W17": build_w17,
                   "W18": build_w18}
