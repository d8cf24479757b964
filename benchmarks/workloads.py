"""The workloads and their contenders (W6 and W7, torch networks: :mod:`benchmarks.networks`;
W8 and W9, torch modules through ``ORTModule``: :mod:`benchmarks.ortmodule`; W10-W18,
scikit-learn estimator families: :mod:`benchmarks.families`; W19, scale-out on Dask:
:mod:`benchmarks.scaleout`; W20, the GEMM-bound MLP: :mod:`benchmarks.gemm`; JAX
contenders: :mod:`benchmarks.xla`).

A :class:`Workload` holds the data and a list of :class:`Contender`; calling a
contender trains once and returns its measurement (a dict): ``time`` in the
workload's unit, the quality reached and any extra timing. What is timed:

* ortlearn, epoch workloads (W1-W3, W5): two fits per repetition, one of 1 epoch
  (``t1``) and one of ``E`` epochs (``tE``), both with ``tol``/early stopping off so
  that they run exactly that many epochs. ``time = (tE - t1) / (E - 1)`` is the
  cost of one epoch, ``setup_s = t1 - time`` what a fit costs on top of its epochs
  (graph building, autodiff, session creation, write-back). With ``E == 1`` the
  1-epoch fit is all there is and the setup is not separated.
* scikit-learn: the whole ``fit`` divided by ``n_iter_`` (its setup is negligible).
* PyTorch: the training loop divided by the epochs; building the model, the
  optimizer and the tensors is ``setup_s``.
* W4 (L-BFGS, no epochs): the whole fit, in seconds.
* W5: microseconds per mini-batch step (per-epoch time / batches per epoch), and
  for the bare compute one onnxruntime forward call on one batch.

Quality is measured after the timed part: training-set MSE (W1, W2, W5), test
accuracy (W3), the objective ``mean log-loss + alpha/2 ||w||^2`` (W4).
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks._harness import (
    ADAM_LR,
    SGD_LR,
    SGD_LR_SAMPLE,
    Contender,
    Options,
    Workload,
    device_pair,
    half_mse,
    mlp_adam_contenders,
    mse,
    ortlearn_epochs,
    ortlearn_estimator,
    regression_data,
    rows,
    sklearn_epochs,
    sync,
    timed,
    torch_adam_contenders,
    torch_loop,
    torch_predict,
)
from benchmarks.xla import add_jax

W5_STEPS = 1000      # mini-batches per epoch in W5 at scale 1


def _linear_sgd_maker(batch: int, learning_rate: float, seed: int, device: str):
    """``max_iter -> OrtLinearRegressor``: plain mini-batch SGD at a constant rate, no stopping."""
    def make(max_iter):
        return ortlearn_estimator("OrtLinearRegressor",
                         {"solver": "sgd", "batch_size": batch, "max_iter": max_iter,
                          "eta0": learning_rate, "random_state": seed, "device": device},
                         {"loss": "squared_error", "penalty": None, "alpha": 0.0,
                          "learning_rate": "constant", "tol": None, "shuffle": True,
                          "early_stopping": False})
    return make


def build_w1(opts: Options) -> Workload:
    """W1: linear regression by SGD, batch 256."""
    from sklearn.linear_model import LinearRegression, SGDRegressor

    X, y = regression_data(opts)
    epochs, batch = opts.epochs or 10, opts.batch or 256
    w = Workload("W1", "linear regression, SGD", "s/epoch", "train_mse",
                 {"n_samples": len(X), "n_features": X.shape[1], "epochs": epochs,
                  "batch_size": batch, "learning_rate": SGD_LR, "init": "zeros"},
                 sklearn_ref="sklearn_sgd_per_sample", torch_ref="torch_sgd")

    def ortlearn_sgd(seed, warmup):
        make = _linear_sgd_maker(batch, SGD_LR, seed, opts.device)
        out, est = ortlearn_epochs(make, X, y, epochs, warmup)
        return {**out, "train_mse": mse(est.predict(X), y)}

    def sklearn_sgd(seed, warmup):
        est = SGDRegressor(loss="squared_error", penalty=None, learning_rate="constant",
                           eta0=SGD_LR_SAMPLE, max_iter=1 if warmup else epochs, tol=None,
                           shuffle=True, random_state=seed)
        out, est = sklearn_epochs(est, X, y)
        return {**out, "train_mse": mse(est.predict(X), y)}

    def sklearn_closed(seed, warmup):
        seconds, est = timed(lambda: LinearRegression().fit(X, y))
        return {"time": seconds, "total_s": seconds, "train_mse": mse(est.predict(X), y)}

    w.contenders += [
        Contender("ortlearn_sgd", "ortlearn", ortlearn_sgd, "constant eta0, mini-batch"),
        Contender("sklearn_sgd_per_sample", "sklearn", sklearn_sgd,
                  f"SGDRegressor: batch 1 (its only mode), eta0={SGD_LR_SAMPLE}"),
        Contender("sklearn_closed_form", "sklearn", sklearn_closed,
                  "LinearRegression (closed form, for reference): whole fit", unit="s/fit"),
    ]
    if opts.torch is not None:
        torch = opts.torch
        y2 = y.reshape(-1, 1)

        def torch_sgd(seed, warmup):
            def build(generator):
                model = torch.nn.Linear(X.shape[1], 1)
                with torch.no_grad():
                    model.weight.zero_()
                    model.bias.zero_()
                return model, torch.optim.SGD(model.parameters(), lr=SGD_LR)
            out, model = torch_loop(opts, build, half_mse(torch), X, y2,
                                     1 if warmup else epochs, batch, seed)
            return {**out, "train_mse": mse(torch_predict(opts, model, X), y)}

        w.contenders.append(Contender("torch_sgd", "torch", torch_sgd, "nn.Linear + optim.SGD"))
    return w


def build_w2(opts: Options) -> Workload:
    """W2: MLP regressor 100-100(relu)-1, Adam, batch 256."""
    X, y = regression_data(opts)
    epochs, batch, hidden = opts.epochs or 10, opts.batch or 256, (100,)
    w = Workload("W2", "MLP regressor, Adam", "s/epoch", "train_mse",
                 {"n_samples": len(X), "n_features": X.shape[1], "hidden_layer_sizes": hidden,
                  "activation": "relu", "epochs": epochs, "batch_size": batch,
                  "learning_rate": ADAM_LR, "alpha": 0.0},
                 sklearn_ref="sklearn_adam", torch_ref="torch_adam",
                 device_pair=device_pair(opts, "ortlearn_adam"))
    w.contenders += mlp_adam_contenders(opts, X, y, hidden, epochs, batch, False,
                                         lambda predict: {"train_mse": mse(predict(X), y)})
    if opts.torch is not None:
        w.contenders += torch_adam_contenders(opts, X, y.reshape(-1, 1), hidden, epochs,
                                               batch, regression=True)
    add_jax(w, opts, X, y, hidden, epochs, batch, False,
             lambda predict: {"train_mse": mse(predict(X), y)}, rtol=0.05)
    return w


# ---------------------------------------------------------------- W3
def build_w3(opts: Options) -> Workload:
    """W3: MLP classifier on digits (64-100-10), Adam, batch 64."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    X_all = (digits.data / 16.0).astype(np.float32)
    y_all = digits.target.astype(np.int64)
    n = min(rows(len(X_all), opts.scale, 200), len(X_all))
    X_all, y_all = X_all[:n], y_all[:n]
    X, X_test, y, y_test = train_test_split(X_all, y_all, test_size=0.25, stratify=y_all,
                                            random_state=0)
    X, X_test = np.ascontiguousarray(X), np.ascontiguousarray(X_test)
    epochs, batch, hidden = opts.epochs or 50, opts.batch or 64, (100,)
    w = Workload("W3", "MLP classifier on digits, Adam", "s/epoch", "test_accuracy",
                 {"n_train": len(X), "n_test": len(X_test), "n_features": X.shape[1],
                  "n_classes": 10, "hidden_layer_sizes": hidden, "activation": "relu",
                  "epochs": epochs, "batch_size": batch, "learning_rate": ADAM_LR, "alpha": 0.0},
                 sklearn_ref="sklearn_adam", torch_ref="torch_adam",
                 device_pair=device_pair(opts, "ortlearn_adam"))
    w.contenders += mlp_adam_contenders(
        opts, X, y, hidden, epochs, batch, True,
        lambda predict: {"test_accuracy": float(np.mean(predict(X_test) == y_test))})
    if opts.torch is not None:
        w.contenders += torch_adam_contenders(opts, X, y, hidden, epochs, batch,
                                               regression=False, X_test=X_test, y_test=y_test)
    add_jax(w, opts, X, y, hidden, epochs, batch, True,
             lambda predict: {"test_accuracy": float(np.mean(predict(X_test) == y_test))},
             rtol=0.03)
    return w


# ---------------------------------------------------------------- W4
def _logistic_objective(coef, intercept, X, y, alpha: float) -> float:
    """mean log-loss + alpha / 2 * ||coef||^2, in float64 (the objective all contenders share)."""
    w = np.asarray(coef, dtype=np.float64).ravel()
    z = X.astype(np.float64) @ w + float(np.asarray(intercept, dtype=np.float64).ravel()[0])
    return float(np.mean(np.logaddexp(0.0, z) - y * z) + 0.5 * alpha * w @ w)


def build_w4(opts: Options) -> Workload:
    """W4: binary logistic regression by L-BFGS to scikit-learn's tolerance."""
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    n = rows(100_000, opts.scale, 500)
    X, y = make_classification(n_samples=n, n_features=100, n_informative=20, random_state=0)
    X, y = X.astype(np.float32), y.astype(np.int64)
    C, tol, max_iter = 1.0, 1e-4, 1000
    alpha = 1.0 / (C * n)
    w = Workload("W4", "logistic regression, L-BFGS", "s/fit", "objective",
                 {"n_samples": n, "n_features": X.shape[1], "C": C, "alpha": alpha, "tol": tol,
                  "max_iter": max_iter},
                 sklearn_ref="sklearn_lbfgs", torch_ref="torch_lbfgs")
    w.notes.append("objective = mean log-loss + alpha/2 ||w||^2 with alpha = 1/(C n), "
                   "intercept unpenalised; time = whole fit")

    def quality(coef, intercept, decision):
        return {"objective": _logistic_objective(coef, intercept, X, y, alpha),
                "train_accuracy": float(np.mean((np.asarray(decision).ravel() > 0) == y))}

    def ortlearn_lbfgs(seed, warmup):
        est = ortlearn_estimator("OrtLinearClassifier",
                        {"solver": "lbfgs", "alpha": alpha, "max_iter": 2 if warmup else max_iter,
                         "tol": tol, "device": opts.device},
                        {"loss": "log_loss", "penalty": "l2", "fit_intercept": True,
                         "random_state": seed})
        seconds, est = timed(lambda: est.fit(X, y))
        return {"time": seconds, "total_s": seconds, "n_iter": int(np.max(est.n_iter_)),
                **quality(est.coef_, est.intercept_, est.decision_function(X))}

    def sklearn_lbfgs(seed, warmup):
        est = LogisticRegression(C=C, solver="lbfgs", tol=tol,
                                 max_iter=2 if warmup else max_iter)
        seconds, est = timed(lambda: est.fit(X, y))
        return {"time": seconds, "total_s": seconds, "n_iter": int(np.max(est.n_iter_)),
                **quality(est.coef_, est.intercept_, est.decision_function(X))}

    w.contenders += [Contender("ortlearn_lbfgs", "ortlearn", ortlearn_lbfgs,
                               f"OrtLinearClassifier(alpha=1/(C n)={alpha:.3g})"),
                     Contender("sklearn_lbfgs", "sklearn", sklearn_lbfgs,
                               "LogisticRegression (scipy L-BFGS-B)")]
    if opts.torch is not None:
        w.contenders.append(_torch_lbfgs_contender(opts, X, y, alpha, tol, max_iter, quality))
    return w


def _torch_lbfgs_contender(opts: Options, X, y, alpha, tol, max_iter, quality):
    torch, device = opts.torch, opts.torch_device

    def torch_lbfgs(seed, warmup):
        start = time.perf_counter()
        Xt = torch.from_numpy(X).to(device)
        yt = torch.from_numpy(y.astype(np.float32)).to(device)
        coef = torch.zeros(X.shape[1], device=device, requires_grad=True)
        bias = torch.zeros(1, device=device, requires_grad=True)
        # history 10 and strong Wolfe line search, like scipy's L-BFGS-B
        optimizer = torch.optim.LBFGS([coef, bias], max_iter=2 if warmup else max_iter,
                                      tolerance_grad=tol, tolerance_change=64 * np.finfo(float).eps,
                                      history_size=10, line_search_fn="strong_wolfe")
        bce = torch.nn.BCEWithLogitsLoss()

        def closure():
            optimizer.zero_grad()
            loss = bce(Xt @ coef + bias, yt) + 0.5 * alpha * (coef @ coef)
            loss.backward()
            return loss

        optimizer.step(closure)
        sync(torch, device)
        seconds = time.perf_counter() - start
        n_iter = optimizer.state[optimizer._params[0]].get("n_iter", 0)
        w, b = coef.detach().cpu().numpy(), bias.detach().cpu().numpy()
        return {"time": seconds, "total_s": seconds, "n_iter": int(n_iter),
                **quality(w, b, X @ w + b)}

    return Contender("torch_lbfgs", "torch", torch_lbfgs,
                     "optim.LBFGS(history 10, strong Wolfe), full batch")


# ---------------------------------------------------------------- W5
def build_w5(opts: Options) -> Workload:
    """W5: per-step overhead on a tiny linear model (10 features, batch 32)."""
    from sklearn.datasets import make_regression

    batch = 32
    steps = max(int(round(W5_STEPS * opts.scale)), 10)
    X, y = make_regression(n_samples=steps * batch, n_features=10, noise=1.0, random_state=0)
    X, y = X.astype(np.float32), y.astype(np.float32)
    epochs = opts.epochs or 5
    w = Workload("W5", "per-step overhead, tiny linear model", "us/step", "train_mse",
                 {"n_samples": len(X), "n_features": X.shape[1], "batch_size": batch,
                  "steps_per_epoch": steps, "epochs": epochs, "learning_rate": SGD_LR_SAMPLE},
                 torch_ref="torch_sgd")
    w.notes.append("W5 has no scikit-learn counterpart (its SGD is per sample)")
    fitted = {}

    def ortlearn_sgd(seed, warmup):
        make = _linear_sgd_maker(batch, SGD_LR_SAMPLE, seed, opts.device)
        out, est = ortlearn_epochs(make, X, y, epochs, warmup)
        fitted["model"] = est
        return {**out, "time": out["time"] / steps * 1e6, "train_mse": mse(est.predict(X), y)}

    def ort_forward(seed, warmup):
        if "model" not in fitted:
            raise RuntimeError("the bare compute runs the model ortlearn_sgd trained, "
                               "and ortlearn_sgd failed")
        return {"time": _forward_us(fitted["model"], X[:batch], opts.device, warmup)}

    w.contenders += [
        Contender("ortlearn_sgd", "ortlearn", ortlearn_sgd,
                  "one training step: forward, gradient and SGD update"),
        Contender("ort_forward", "onnxruntime", ort_forward,
                  "bare compute: InferenceSession.run of the trained model on one batch"),
    ]
    if opts.torch is not None:
        torch = opts.torch

        def torch_sgd(seed, warmup):
            def build(generator):
                model = torch.nn.Linear(X.shape[1], 1)
                return model, torch.optim.SGD(model.parameters(), lr=SGD_LR_SAMPLE)
            out, model = torch_loop(opts, build, half_mse(torch), X, y.reshape(-1, 1),
                                     1 if warmup else epochs, batch, seed)
            return {**out, "time": out["time"] / steps * 1e6,
                    "train_mse": mse(torch_predict(opts, model, X), y)}

        w.contenders.append(Contender("torch_sgd", "torch", torch_sgd,
                                      "zero_grad + forward + backward + SGD step"))
    return w


def _forward_us(estimator, batch, device: str, warmup: bool) -> float:
    """Microseconds per ``InferenceSession.run`` of the estimator's ONNX model on one batch."""
    from ortlearn.training.device import make_session, make_session_options

    # one thread, as ortlearn's engine uses for a model this small
    session = make_session(estimator.to_onnx(), device, make_session_options(1))
    feeds = {session.get_inputs()[0].name: batch}
    calls = 100 if warmup else 2000
    for _ in range(min(calls, 200)):
        session.run(None, feeds)
    seconds, _ = timed(lambda: [session.run(None, feeds) for _ in range(calls)])
    return seconds / calls * 1e6


#: What the torch workloads are (their modules import torch: not imported for --help).
_TORCH_WORKLOADS = {
    "W6": "LeNet-style CNN on digits 8x8 through ortlearn.artifacts/api, against torch "
          "eager, ms per AdamW step.",
    "W7": "transformer encoder layer through ortlearn.artifacts/api, against torch eager, "
          "ms per AdamW step.",
    "W8": "W2's MLP in ortlearn.torch.ORTModule, against torch eager and torch.compile, "
          "ms per Adam step (batch 256).",
    "W9": "W6's CNN in ortlearn.torch.ORTModule, against torch eager and torch.compile, "
          "ms per AdamW step (batch 64).",
    "W21": "W7's transformer layer in ortlearn.torch.ORTModule, against torch eager and "
           "torch.compile, ms per AdamW step (batch 32).",
}


def _network(key: str):
    def build(opts: Options) -> Workload:
        from benchmarks.networks import build_network

        return build_network(key, opts)
    build.__doc__ = f"{key}: {_TORCH_WORKLOADS[key]}"
    return build


def _ortmodule(key: str):
    def build(opts: Options) -> Workload:
        from benchmarks.ortmodule import build_ortmodule_workload

        return build_ortmodule_workload(key, opts)
    build.__doc__ = f"{key}: {_TORCH_WORKLOADS[key]}"
    return build


#: The scikit-learn estimator families (:mod:`benchmarks.families`).
_FAMILY_WORKLOADS = {
    "W10": "multinomial logistic regression (5 classes), L-BFGS to tol 1e-4: "
           "OrtLogisticRegression against LogisticRegression, whole fit.",
    "W11": "Poisson GLM, L-BFGS: OrtPoissonRegressor against PoissonRegressor, whole fit.",
    "W12": "Huber regression, L-BFGS-B: OrtHuberRegressor against HuberRegressor, whole fit.",
    "W13": "Ridge: OrtRidge (L-BFGS) against Ridge (Cholesky), whole fit.",
    "W14": "linear SVM (hinge) by SGD: OrtSGDClassifier per sample and mini-batch against "
           "SGDClassifier, s/epoch.",
    "W15": "MLP regressor with the Poisson loss, Adam: OrtMLPRegressor against "
           "MLPRegressor, s/epoch.",
    "W16": "multilabel MLP classifier, Adam: OrtMLPClassifier against MLPClassifier, s/epoch.",
    "W17": "Lasso: OrtLasso (FISTA) against Lasso (coordinate descent), both to the duality "
           "gap, whole fit.",
    "W18": "LinearSVC, squared hinge: OrtLinearSVC (primal L-BFGS) against liblinear, whole fit.",
}


def build_w20(opts: Options) -> Workload:
    """W20: MLP regressor 200-512-512-1, Adam, batch 512: GFLOP/s against the GEMM peak."""
    from benchmarks.gemm import build_w20 as build

    return build(opts)


def _family(key: str):
    def build(opts: Options) -> Workload:
        from benchmarks.families import FAMILY_BUILDERS

        return FAMILY_BUILDERS[key](opts)
    build.__doc__ = f"{key}: {_FAMILY_WORKLOADS[key]}"
    return build


def build_w19(opts: Options) -> Workload:
    """W19: scale-out on Dask: a 16-point grid on 1 and 2 workers, an out-of-core pass."""
    from benchmarks.scaleout import build_w19 as build

    return build(opts)


BUILDERS = {"W1": build_w1, "W2": build_w2, "W3": build_w3, "W4": build_w4, "W5": build_w5,
            "W6": _network("W6"), "W7": _network("W7"), "W8": _ortmodule("W8"),
            "W9": _ortmodule("W9"), **{key: _family(key) for key in _FAMILY_WORKLOADS},
            "W19": build_w19, "W20": build_w20, "W21": _ortmodule("W21")}
