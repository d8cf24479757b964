"""What every workload module shares: the :class:`Workload` and :class:`Contender` types,
the run's :class:`Options`, and the contenders and timings several workloads build from (an
ortlearn estimator's epochs, scikit-learn's, a torch training loop, the MLP/Adam contenders).

The workload modules (:mod:`benchmarks.workloads`, :mod:`~benchmarks.networks`,
:mod:`~benchmarks.ortmodule`, :mod:`~benchmarks.families`, :mod:`~benchmarks.gemm`,
:mod:`~benchmarks.scaleout`, :mod:`~benchmarks.xla`) import from here, never from each other's
private helpers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

SGD_LR = 1e-2        # W1: minibatch SGD step (ortlearn, torch)


SGD_LR_SAMPLE = 1e-3  # W1: SGDRegressor's per-sample step (batch 1 needs a smaller one)


ADAM_LR = 1e-3


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
def rows(n: int, scale: float, floor: int) -> int:
    return max(int(round(n * scale)), floor)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def mse(pred, y) -> float:
    diff = np.asarray(pred, dtype=np.float64).ravel() - np.asarray(y, dtype=np.float64).ravel()
    return float(np.mean(diff ** 2))


def ortlearn_estimator(cls_name: str, required: dict, optional: dict):
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


def ortlearn_epochs(make, X, y, epochs: int, warmup: bool):
    """Time ortlearn per epoch by difference of a 1-epoch and an E-epoch fit."""
    t1, est = timed(lambda: make(1).fit(X, y))
    if warmup or epochs == 1:
        return {"time": t1, "total_s": t1, "setup_s": None, "epochs": 1}, est
    t_all, est = timed(lambda: make(epochs).fit(X, y))
    done = int(est.n_iter_)
    if done < 2:
        raise RuntimeError(f"{type(est).__name__} stopped after {done} epoch(s) of {epochs}.")
    per_epoch = (t_all - t1) / (done - 1)
    if per_epoch <= 0:
        # timing noise exceeds an epoch (tiny smoke runs): no setup split possible
        per_epoch = t_all / done
    return {"time": per_epoch, "total_s": t_all, "fit_1_epoch_s": t1,
            "setup_s": t1 - per_epoch, "epochs": done}, est


def sklearn_epochs(est, X, y):
    seconds, est = timed(lambda: est.fit(X, y))
    return {"time": seconds / est.n_iter_, "total_s": seconds, "epochs": int(est.n_iter_)}, est


def glorot_(torch, layer, generator, factor=6.0):
    """scikit-learn's MLP initialisation (uniform, bound sqrt(factor / (fan_in + fan_out)))."""
    fan_out, fan_in = layer.weight.shape
    bound = float(np.sqrt(factor / (fan_in + fan_out)))
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=generator)
        layer.bias.uniform_(-bound, bound, generator=generator)


def torch_mlp(torch, n_in, hidden, n_out, generator):
    layers, width = [], n_in
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    layers.append(torch.nn.Linear(width, n_out))
    model = torch.nn.Sequential(*layers)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            glorot_(torch, layer, generator)
    return model


def half_mse(torch):
    # 0.5 * mean squared error: the objective scikit-learn's SGD and MLP regressors descend
    return lambda pred, target: 0.5 * torch.mean((pred - target) ** 2)


def torch_loop(opts: Options, build, loss_fn, X, y, epochs: int, batch: int, seed: int):
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
    sync(torch, device)
    start = time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator).to(device)
        for first in range(0, n, batch):
            idx = order[first:first + batch]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(Xt[idx]), yt[idx]).backward()
            optimizer.step()
    sync(torch, device)
    loop = time.perf_counter() - start
    return {"time": loop / epochs, "total_s": loop, "setup_s": setup, "epochs": epochs}, model


def sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def torch_predict(opts: Options, model, X) -> np.ndarray:
    torch = opts.torch
    with torch.no_grad():
        return model(torch.from_numpy(X).to(opts.torch_device)).cpu().numpy()


# ---------------------------------------------------------------- W1, W2 data
def regression_data(opts: Options):
    from sklearn.datasets import make_regression

    n = rows(100_000, opts.scale, 512)
    X, y = make_regression(n_samples=n, n_features=100, noise=1.0, random_state=0)
    return X.astype(np.float32), y.astype(np.float32)


def mlp_adam_contenders(opts: Options, X, y, hidden, epochs, batch, classifier: bool,
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
                return ortlearn_estimator("Ort" + reference.__name__,
                                 {**common, "max_iter": max_iter, "random_state": seed,
                                  "device": device},
                                 {**no_stop, "n_iter_no_change": max_iter + 1})
            out, est = ortlearn_epochs(make, X, y, epochs, warmup)
            return {**out, **quality(est.predict)}
        return run

    def sklearn_adam(seed, warmup):
        max_iter = 1 if warmup else epochs
        est = reference(**common, **no_stop, max_iter=max_iter, n_iter_no_change=max_iter + 1,
                        random_state=seed)
        out, est = sklearn_epochs(est, X, y)
        return {**out, **quality(est.predict)}

    contenders = [Contender("ortlearn_adam", "ortlearn", ortlearn_adam(opts.device)),
                  Contender("sklearn_adam", "sklearn", sklearn_adam, reference.__name__)]
    if opts.device != "cpu":
        contenders.append(Contender("ortlearn_adam_cpu", "ortlearn", ortlearn_adam("cpu"),
                                    "ortlearn_adam on the CPU (device_pair)"))
    return contenders


def device_pair(opts: Options, name: str) -> tuple[str, str] | None:
    """The contender ``name`` on --device and on the CPU, when --device is a GPU."""
    return None if opts.device == "cpu" else (name, name + "_cpu")


def torch_adam_contenders(opts: Options, X, y, hidden, epochs, batch, regression, X_test=None,
                           y_test=None) -> list:
    """torch eager and ``torch.compile`` (the same loop with the module compiled) for W2/W3."""
    torch = opts.torch
    n_out = 1 if regression else int(y.max()) + 1
    loss_fn = half_mse(torch) if regression else torch.nn.CrossEntropyLoss()

    def score(out, model):
        if regression:
            return {**out, "train_mse": mse(torch_predict(opts, model, X), y)}
        pred = torch_predict(opts, model, X_test).argmax(axis=1)
        return {**out, "test_accuracy": float(np.mean(pred == y_test))}

    def torch_adam(seed, warmup):
        def build(generator):
            model = torch_mlp(torch, X.shape[1], hidden, n_out, generator)
            return model, torch.optim.Adam(model.parameters(), lr=ADAM_LR, eps=1e-8)
        out, model = torch_loop(opts, build, loss_fn, X, y, 1 if warmup else epochs, batch,
                                 seed)
        return score(out, model)

    held = {}  # compiled once (the warm-up run, both batch shapes); weights reloaded in place

    def torch_compile_adam(seed, warmup):
        def build(generator):
            fresh = torch_mlp(torch, X.shape[1], hidden, n_out, generator)
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
            out, model = torch_loop(opts, build, loss_fn, X, y, 1 if warmup else epochs,
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
