"""The workloads and their contenders (W6 and W7, torch networks: :mod:`benchmarks.networks`;
W8 and W9, torch modules through ``ORTModule``: :mod:`benchmarks.ortmodule`; W10-W18, the
scikit-learn families of issue 23: :mod:`benchmarks.families`; W19, scale-out on Dask:
:mod:`benchmarks.scaleout`; W20, the GEMM-bound MLP of issue 24: :mod:`benchmarks.gemm`; JAX
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
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

SGD_LR = 1e-2        # W1: minibatch SGD step (ortlearn, torch)
SGD_LR_SAMPLE = 1e-3  # W1: SGDRegressor's per-sample step (batch 1 needs a smaller one)
ADAM_LR = 1e-3
W5_STEPS = 1000      # mini-batches per epoch in W5 at scale 1


@dataclass
class Contender:
    """One way of training a workload.

    Parameters
    ----------
    name : str
        Row label, ``<library>_<method>``.
    library : {'ortlearn', 'sklearn', 'torch', 'onnxruntime'}
    run : callable
        ``run(seed, warmup) -> dict``; ``warmup=True`` asks for a short run.
    note : str
        What differs from the others (printed under the table).
    unit : str or None
        Unit of ``time`` when it differs from the workload's (no ratio is then
        computed for it).
    """

    name: str
    library: str
    run: Callable[[int, bool], dict]
    note: str = ""
    unit: str | None = None


@dataclass
class Workload:
    """A problem, its settings, and the contenders that solve it."""

    key: str
    title: str
    unit: str
    quality: str
    params: dict
    contenders: list = field(default_factory=list)
    sklearn_ref: str | None = None
    torch_ref: str | None = None
    notes: list = field(default_factory=list)
    #: ``(ortlearn on --device, the same on the CPU)`` when --device is a GPU
    device_pair: tuple[str, str] | None = None
    #: ``(contender, reference)`` pairs whose ratio is printed under the table
    pairs: list = field(default_factory=list)
    #: ``(contender, reference, rtol)``: the contender's median quality must be within ``rtol``
    #: (relative) of the reference's, else it is reported failed (the same training, W2/W3)
    same_quality: list = field(default_factory=list)
    #: a quality key compared with the scikit-learn reference's (``objective_gap`` /
    #: ``quality_diff`` under the table): both reach the same objective or score
    gap: str | None = None


class Unavailable(Exception):
    """Raised by a contender that cannot run on this machine (a missing compiler): it is
    reported with the reason, not as a failure of the run."""


@dataclass
class Options:
    """What the command line decides for every workload."""

    scale: float = 1.0
    epochs: int | None = None
    batch: int | None = None      # rows per mini-batch of W1-W3 (None: each one's own)
    device: str = "cpu"
    torch: object = None          # the torch module, or None
    torch_device: str = "cpu"
    exporter: str = "auto"        # ORTModule's exporter (W8, W9)
    compile_backend: str = "inductor"  # torch.compile's backend (W2, W3, W8, W9, W20)
    jax: object = None            # the jax module, or None (benchmarks.xla)
    optax: object = None


# ---------------------------------------------------------------- helpers
def _rows(n: int, scale: float, floor: int) -> int:
    return max(int(round(n * scale)), floor)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _mse(pred, y) -> float:
    diff = np.asarray(pred, dtype=np.float64).ravel() - np.asarray(y, dtype=np.float64).ravel()
    return float(np.mean(diff ** 2))


def _ortlearn(cls_name: str, required: dict, optional: dict):
    """An ortlearn estimator; ``optional`` parameters it lacks are left out.

    Raises
    ------
    TypeError
        When the estimator lacks a parameter the comparison depends on.
    """
    import ortlearn

    cls = getattr(ortlearn, cls_name)
    known = cls().get_params()
    missing = sorted(set(required) - set(known))
    if missing:
        raise TypeError(f"{cls_name} has no parameter(s) {missing}; the benchmark needs them "
                        "to match the other contenders.")
    return cls(**required, **{k: v for k, v in optional.items() if k in known})


def _linear_sgd_maker(batch: int, learning_rate: float, seed: int, device: str):
    """``max_iter -> OrtLinearRegressor``: plain mini-batch SGD at a constant rate, no stopping."""
    def make(max_iter):
        return _ortlearn("OrtLinearRegressor",
                         {"solver": "sgd", "batch_size": batch, "max_iter": max_iter,
                          "eta0": learning_rate, "random_state": seed, "device": device},
                         {"loss": "squared_error", "penalty": None, "alpha": 0.0,
                          "learning_rate": "constant", "tol": None, "shuffle": True,
                          "early_stopping": False})
    return make


def _ortlearn_epochs(make, X, y, epochs: int, warmup: bool):
    """Time ortlearn per epoch by difference of a 1-epoch and an E-epoch fit."""
    t1, est = _timed(lambda: make(1).fit(X, y))
    if warmup or epochs == 1:
        return {"time": t1, "total_s": t1, "setup_s": None, "epochs": 1}, est
    t_all, est = _timed(lambda: make(epochs).fit(X, y))
    done = int(est.n_iter_)
    if done < 2:
        raise RuntimeError(f"{type(est).__name__} stopped after {done} epoch(s) of {epochs}.")
    per_epoch = (t_all - t1) / (done - 1)
    if per_epoch <= 0:
        # timing noise exceeds an epoch (tiny smoke runs): no setup split possible
        per_epoch = t_all / done
    return {"time": per_epoch, "total_s": t_all, "fit_1_epoch_s": t1,
            "setup_s": t1 - per_epoch, "epochs": done}, est


def _sklearn_epochs(est, X, y):
    seconds, est = _timed(lambda: est.fit(X, y))
    return {"time": seconds / est.n_iter_, "total_s": seconds, "epochs": int(est.n_iter_)}, est


def _glorot_(torch, layer, generator, factor=6.0):
    """scikit-learn's MLP initialisation (uniform, bound sqrt(factor / (fan_in + fan_out)))."""
    fan_out, fan_in = layer.weight.shape
    bound = float(np.sqrt(factor / (fan_in + fan_out)))
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=generator)
        layer.bias.uniform_(-bound, bound, generator=generator)


def _torch_mlp(torch, n_in, hidden, n_out, generator):
    layers, width = [], n_in
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    layers.append(torch.nn.Linear(width, n_out))
    model = torch.nn.Sequential(*layers)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            _glorot_(torch, layer, generator)
    return model


def _half_mse(torch):
    # 0.5 * mean squared error: the objective scikit-learn's SGD and MLP regressors descend
    return lambda pred, target: 0.5 * torch.mean((pred - target) ** 2)


def _torch_loop(opts: Options, build, loss_fn, X, y, epochs: int, batch: int, seed: int):
    """Train a torch model with mini-batches reshuffled every epoch.

    ``build(generator) -> (model, optimizer)``. Returns the measurement and the
    trained model (on ``opts.torch_device``).
    """
    torch, device = opts.torch, opts.torch_device
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    model, optimizer = build(generator)
    model.to(device)
    Xt, yt = torch.from_numpy(X).to(device), torch.from_numpy(y).to(device)
    n = len(X)
    setup = time.perf_counter() - start
    _sync(torch, device)
    start = time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator).to(device)
        for first in range(0, n, batch):
            idx = order[first:first + batch]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(Xt[idx]), yt[idx]).backward()
            optimizer.step()
    _sync(torch, device)
    loop = time.perf_counter() - start
    return {"time": loop / epochs, "total_s": loop, "setup_s": setup, "epochs": epochs}, model


def _sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _torch_predict(opts: Options, model, X) -> np.ndarray:
    torch = opts.torch
    with torch.no_grad():
        return model(torch.from_numpy(X).to(opts.torch_device)).cpu().numpy()


# ---------------------------------------------------------------- W1, W2 data
def _regression_data(opts: Options):
    from sklearn.datasets import make_regression

    n = _rows(100_000, opts.scale, 512)
    X, y = make_regression(n_samples=n, n_features=100, noise=1.0, random_state=0)
    return X.astype(np.float32), y.astype(np.float32)


def build_w1(opts: Options) -> Workload:
    """W1: linear regression by SGD, batch 256."""
    from sklearn.linear_model import LinearRegression, SGDRegressor

    X, y = _regression_data(opts)
    epochs, batch = opts.epochs or 10, opts.batch or 256
    w = Workload("W1", "linear regression, SGD", "s/epoch", "train_mse",
                 {"n_samples": len(X), "n_features": X.shape[1], "epochs": epochs,
                  "batch_size": batch, "learning_rate": SGD_LR, "init": "zeros"},
                 sklearn_ref="sklearn_sgd_per_sample", torch_ref="torch_sgd")

    def ortlearn_sgd(seed, warmup):
        make = _linear_sgd_maker(batch, SGD_LR, seed, opts.device)
        out, est = _ortlearn_epochs(make, X, y, epochs, warmup)
        return {**out, "train_mse": _mse(est.predict(X), y)}

    def sklearn_sgd(seed, warmup):
        est = SGDRegressor(loss="squared_error", penalty=None, learning_rate="constant",
                           eta0=SGD_LR_SAMPLE, max_iter=1 if warmup else epochs, tol=None,
                           shuffle=True, random_state=seed)
        out, est = _sklearn_epochs(est, X, y)
        return {**out, "train_mse": _mse(est.predict(X), y)}

    def sklearn_closed(seed, warmup):
        seconds, est = _timed(lambda: LinearRegression().fit(X, y))
        return {"time": seconds, "total_s": seconds, "train_mse": _mse(est.predict(X), y)}

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
            out, model = _torch_loop(opts, build, _half_mse(torch), X, y2,
                                     1 if warmup else epochs, batch, seed)
            return {**out, "train_mse": _mse(_torch_predict(opts, model, X), y)}

        w.contenders.append(Contender("torch_sgd", "torch", torch_sgd, "nn.Linear + optim.SGD"))
    return w


def build_w2(opts: Options) -> Workload:
    """W2: MLP regressor 100-100(relu)-1, Adam, batch 256."""
    X, y = _regression_data(opts)
    epochs, batch, hidden = opts.epochs or 10, opts.batch or 256, (100,)
    w = Workload("W2", "MLP regressor, Adam", "s/epoch", "train_mse",
                 {"n_samples": len(X), "n_features": X.shape[1], "hidden_layer_sizes": hidden,
                  "activation": "relu", "epochs": epochs, "batch_size": batch,
                  "learning_rate": ADAM_LR, "alpha": 0.0},
                 sklearn_ref="sklearn_adam", torch_ref="torch_adam",
                 device_pair=_device_pair(opts, "ortlearn_adam"))
    w.contenders += _mlp_adam_contenders(opts, X, y, hidden, epochs, batch, False,
                                         lambda predict: {"train_mse": _mse(predict(X), y)})
    if opts.torch is not None:
        w.contenders += _torch_adam_contenders(opts, X, y.reshape(-1, 1), hidden, epochs,
                                               batch, regression=True)
    _add_jax(w, opts, X, y, hidden, epochs, batch, False,
             lambda predict: {"train_mse": _mse(predict(X), y)}, rtol=0.05)
    return w


def _add_jax(w: Workload, opts: Options, X, y, hidden, epochs, batch, classifier, quality,
             rtol: float) -> None:
    """W2/W3's JAX contender (when installed) and the ratios to JAX and torch.compile."""
    from benchmarks.xla import jax_mlp_contender

    contender = jax_mlp_contender(opts, X, y, hidden, epochs, batch, classifier, quality,
                                  ADAM_LR)
    if contender is not None:
        w.contenders.append(contender)
        w.pairs.append(("ortlearn_adam", "jax_adam"))
        # same weights, order and optimizer as ortlearn: the same model within float noise
        w.same_quality.append(("jax_adam", "ortlearn_adam", rtol))
    if opts.torch is not None:
        w.pairs.append(("ortlearn_adam", "torch_compile_adam"))


def _mlp_adam_contenders(opts: Options, X, y, hidden, epochs, batch, classifier: bool,
                         quality) -> list:
    """ortlearn's and scikit-learn's MLP trained by Adam (W2, W3), with the same settings.

    ``quality(predict) -> dict`` scores a fitted model from its ``predict``.
    """
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    reference = MLPClassifier if classifier else MLPRegressor
    common = {"hidden_layer_sizes": hidden, "activation": "relu", "solver": "adam",
              "batch_size": batch, "learning_rate_init": ADAM_LR, "alpha": 0.0}
    no_stop = {"tol": 0.0, "early_stopping": False, "shuffle": True}

    def ortlearn_adam(device):
        def run(seed, warmup):
            def make(max_iter):
                return _ortlearn("Ort" + reference.__name__,
                                 {**common, "max_iter": max_iter, "random_state": seed,
                                  "device": device},
                                 {**no_stop, "n_iter_no_change": max_iter + 1})
            out, est = _ortlearn_epochs(make, X, y, epochs, warmup)
            return {**out, **quality(est.predict)}
        return run

    def sklearn_adam(seed, warmup):
        max_iter = 1 if warmup else epochs
        est = reference(**common, **no_stop, max_iter=max_iter, n_iter_no_change=max_iter + 1,
                        random_state=seed)
        out, est = _sklearn_epochs(est, X, y)
        return {**out, **quality(est.predict)}

    contenders = [Contender("ortlearn_adam", "ortlearn", ortlearn_adam(opts.device)),
                  Contender("sklearn_adam", "sklearn", sklearn_adam, reference.__name__)]
    if opts.device != "cpu":
        contenders.append(Contender("ortlearn_adam_cpu", "ortlearn", ortlearn_adam("cpu"),
                                    "ortlearn_adam on the CPU (device_pair)"))
    return contenders


def _device_pair(opts: Options, name: str) -> tuple[str, str] | None:
    """The contender ``name`` on --device and on the CPU, when --device is a GPU."""
    return None if opts.device == "cpu" else (name, name + "_cpu")


def _torch_adam_contenders(opts: Options, X, y, hidden, epochs, batch, regression, X_test=None,
                           y_test=None) -> list:
    """torch eager and ``torch.compile`` (the same loop with the module compiled) for W2/W3."""
    torch = opts.torch
    n_out = 1 if regression else int(y.max()) + 1
    loss_fn = _half_mse(torch) if regression else torch.nn.CrossEntropyLoss()

    def score(out, model):
        if regression:
            return {**out, "train_mse": _mse(_torch_predict(opts, model, X), y)}
        pred = _torch_predict(opts, model, X_test).argmax(axis=1)
        return {**out, "test_accuracy": float(np.mean(pred == y_test))}

    def torch_adam(seed, warmup):
        def build(generator):
            model = _torch_mlp(torch, X.shape[1], hidden, n_out, generator)
            return model, torch.optim.Adam(model.parameters(), lr=ADAM_LR, eps=1e-8)
        out, model = _torch_loop(opts, build, loss_fn, X, y, 1 if warmup else epochs, batch,
                                 seed)
        return score(out, model)

    held = {}  # compiled once (the warm-up run, both batch shapes); weights reloaded in place

    def torch_compile_adam(seed, warmup):
        def build(generator):
            fresh = _torch_mlp(torch, X.shape[1], hidden, n_out, generator)
            if "compiled" not in held:
                held["module"] = fresh
                # one graph per batch shape (the full and the last batch), as JAX and
                # ortlearn specialise: the dynamic-shape graph torch would switch to is slower
                held["compiled"] = torch.compile(fresh, backend=opts.compile_backend,
                                                 dynamic=False)
            held["module"].load_state_dict(fresh.state_dict())
            return held["compiled"], torch.optim.Adam(held["module"].parameters(), lr=ADAM_LR,
                                                      eps=1e-8)
        if not hasattr(torch, "compile"):
            raise Unavailable(f"torch {torch.__version__} has no torch.compile")
        first = "compiled" not in held
        try:
            out, model = _torch_loop(opts, build, loss_fn, X, y, 1 if warmup else epochs,
                                     batch, seed)
        except Exception as exc:  # noqa: BLE001  eager runs the same loop: compiling failed
            if not first:
                raise
            held.clear()
            lines = str(exc).strip().splitlines()
            raise Unavailable(f"torch.compile(backend={opts.compile_backend!r}) failed: "
                              f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]) from exc
        return score(out, model)

    return [Contender("torch_adam", "torch", torch_adam,
                      "Linear-ReLU-Linear, optim.Adam, sklearn's Glorot init"),
            Contender("torch_compile_adam", "torch", torch_compile_adam,
                      f"torch_adam's loop, the module torch.compile'd "
                      f"(backend={opts.compile_backend!r}, dynamic=False, compiled in the "
                      "warm-up run)")]


# ---------------------------------------------------------------- W3
def build_w3(opts: Options) -> Workload:
    """W3: MLP classifier on digits (64-100-10), Adam, batch 64."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    X_all = (digits.data / 16.0).astype(np.float32)
    y_all = digits.target.astype(np.int64)
    n = min(_rows(len(X_all), opts.scale, 200), len(X_all))
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
                 device_pair=_device_pair(opts, "ortlearn_adam"))
    w.contenders += _mlp_adam_contenders(
        opts, X, y, hidden, epochs, batch, True,
        lambda predict: {"test_accuracy": float(np.mean(predict(X_test) == y_test))})
    if opts.torch is not None:
        w.contenders += _torch_adam_contenders(opts, X, y, hidden, epochs, batch,
                                               regression=False, X_test=X_test, y_test=y_test)
    _add_jax(w, opts, X, y, hidden, epochs, batch, True,
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

    n = _rows(100_000, opts.scale, 500)
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
        est = _ortlearn("OrtLinearClassifier",
                        {"solver": "lbfgs", "alpha": alpha, "max_iter": 2 if warmup else max_iter,
                         "tol": tol, "device": opts.device},
                        {"loss": "log_loss", "penalty": "l2", "fit_intercept": True,
                         "random_state": seed})
        seconds, est = _timed(lambda: est.fit(X, y))
        return {"time": seconds, "total_s": seconds, "n_iter": int(np.max(est.n_iter_)),
                **quality(est.coef_, est.intercept_, est.decision_function(X))}

    def sklearn_lbfgs(seed, warmup):
        est = LogisticRegression(C=C, solver="lbfgs", tol=tol,
                                 max_iter=2 if warmup else max_iter)
        seconds, est = _timed(lambda: est.fit(X, y))
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
        _sync(torch, device)
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
        out, est = _ortlearn_epochs(make, X, y, epochs, warmup)
        fitted["model"] = est
        return {**out, "time": out["time"] / steps * 1e6, "train_mse": _mse(est.predict(X), y)}

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
            out, model = _torch_loop(opts, build, _half_mse(torch), X, y.reshape(-1, 1),
                                     1 if warmup else epochs, batch, seed)
            return {**out, "time": out["time"] / steps * 1e6,
                    "train_mse": _mse(_torch_predict(opts, model, X), y)}

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
    seconds, _ = _timed(lambda: [session.run(None, feeds) for _ in range(calls)])
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


#: The scikit-learn families of issue 23 (:mod:`benchmarks.families`).
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
            "W19": build_w19, "W20": build_w20}
