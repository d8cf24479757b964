"""Command line: ``python -m ortlearn {demo,export-web,info}``.

``demo`` trains ortlearn estimators on digits and on a make_regression of
200 000 rows (large enough that the time per epoch shows), prints one line
per epoch, then a table of scores and times per epoch next to
scikit-learn's own solvers with the same settings, and writes a PNG of the
loss curves (log scale). Each side fits twice: the times per epoch are the
second fit's, in a warm process; the first fit's time is in its own column.

``export-web`` writes a fitted estimator's training artifacts and a page that
goes on training them in a web browser (``BaseOrtEstimator.export_web``); without
``--estimator``, an ``OrtMLPClassifier`` fitted for a few epochs on digits.
"""

from __future__ import annotations

import argparse
import sys
import time

#: Rows of the demo's make_regression: large enough that the time per epoch shows.
DEMO_ROWS = 200_000


def _make_regression(return_X_y=True):
    """The demo's large regression problem (seeded, 20 features, 10 informative, noise)."""
    from sklearn.datasets import make_regression

    return make_regression(n_samples=DEMO_ROWS, n_features=20, n_informative=10, noise=10.0,
                           random_state=0)


def _demo_jobs(max_iter: int):
    """(title, data loader, ortlearn estimator, sklearn estimator, task) per demo run.

    Both sides get the same solver, hyper-parameters, epochs and random_state.
    """
    from sklearn.datasets import load_digits
    from sklearn.linear_model import SGDRegressor
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    from ortlearn import OrtLinearRegressor, OrtMLPClassifier, OrtMLPRegressor

    mlp = dict(hidden_layer_sizes=(64,), solver="adam", learning_rate_init=1e-2,
               batch_size=32, max_iter=max_iter, random_state=0, tol=0.0)
    # 200 000 rows: batches of 256 (a batch of 32 would be 6 000 steps an epoch for both)
    big = dict(mlp, batch_size=256, learning_rate_init=1e-3)
    sgd = dict(max_iter=max_iter, tol=None, random_state=0)
    # scikit-learn's SGD updates once per row; ortlearn once per mini-batch, a batch of
    # 1 024 rows a step (a step costs an onnxruntime call: per-row steps would be slow)
    return [
        ("MLP classifier, digits", load_digits,
         OrtMLPClassifier(**mlp), MLPClassifier(**mlp), "classification"),
        (f"MLP regressor, make_regression {DEMO_ROWS // 1000}k", _make_regression,
         OrtMLPRegressor(**big), MLPRegressor(**big), "regression"),
        (f"linear regressor (SGD), make_regression {DEMO_ROWS // 1000}k", _make_regression,
         OrtLinearRegressor(**sgd, batch_size=1024), SGDRegressor(**sgd), "regression"),
    ]


def _split(loader, task):
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X, y = loader(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, random_state=0, stratify=y if task == "classification" else None)
    scaler = StandardScaler().fit(X_train)
    if task == "regression":
        # scaled targets keep the same learning rate sensible for both libraries
        mean, std = y_train.mean(), y_train.std()
        y_train, y_test = (y_train - mean) / std, (y_test - mean) / std
    return scaler.transform(X_train), scaler.transform(X_test), y_train, y_test


def _fit_twice(estimator, X, y) -> tuple[float, float]:
    """Seconds of ``estimator``'s fit, then of a quiet clone's in the now warm process.

    The first fit of a process pays one-time costs (imports, converters'
    tables, onnxruntime's first session); the next fit, what a search or a
    script fitting again waits for, does not. The demo shows both.
    """
    from sklearn.base import clone

    first = _fit_timed(estimator, X, y)
    again = clone(estimator)
    if "verbose" in again.get_params():
        again.set_params(verbose=0)
    return first, _fit_timed(again, X, y)


def _fit_timed(estimator, X, y):
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        estimator.fit(X, y)
    return time.perf_counter() - start


def _sgd_objective(estimator, X, y) -> float:
    """SGDRegressor's objective (half squared error + L2 penalty) of the fitted weights."""
    import numpy as np

    coef = np.ravel(estimator.coef_)
    residual = X @ coef + np.ravel(estimator.intercept_)[0] - y
    return float(0.5 * np.mean(residual ** 2) + 0.5 * estimator.alpha * coef @ coef)


def run_demo(device: str = "cpu", max_iter: int = 10, plot: str | None = "ortlearn_demo.png",
             verbose: bool = True, out=None) -> list[dict]:
    """Train the demo models and compare them with scikit-learn.

    Returns one dict per job: title, ortlearn / sklearn test score, the time
    of the first fit in the process (``*_first_fit_s``) and of the same fit
    again (``*_fit_s``, the process warm) and its time per epoch, the two
    loss curves (scikit-learn's SGD records none: ``sklearn_final_loss`` is
    its objective at the end instead).
    """
    out = out or sys.stdout
    rows = []
    for title, loader, ort_est, skl_est, task in _demo_jobs(max_iter):
        X_train, X_test, y_train, y_test = _split(loader, task)
        if device.startswith("webgpu"):  # a float32 model: WebGPU computes no float64
            X_train, X_test = X_train.astype("float32"), X_test.astype("float32")
        if verbose:  # the header of the job's per-epoch lines
            print(f"\n== {title}: ortlearn {type(ort_est).__name__} on {device} ==", file=out)
        ort_est.set_params(device=device, verbose=int(verbose))
        ort_first, ort_time = _fit_twice(ort_est, X_train, y_train)
        skl_first, skl_time = _fit_twice(skl_est, X_train, y_train)
        skl_losses = list(getattr(skl_est, "loss_curve_", []))
        rows.append({
            "title": title,
            "ortlearn_score": ort_est.score(X_test, y_test),
            "sklearn_score": skl_est.score(X_test, y_test),
            "ortlearn_first_fit_s": ort_first,
            "sklearn_first_fit_s": skl_first,
            "ortlearn_fit_s": ort_time,
            "sklearn_fit_s": skl_time,
            "ortlearn_epoch_s": ort_time / max(ort_est.n_iter_, 1),
            "sklearn_epoch_s": skl_time / max(skl_est.n_iter_, 1),
            "ortlearn_losses": list(ort_est.train_losses_),
            "sklearn_losses": skl_losses,
            "sklearn_final_loss": (None if skl_losses
                                   else _sgd_objective(skl_est, X_train, y_train)),
            "n_train": len(X_train),
            "metric": "accuracy" if task == "classification" else "R²",
        })
    _print_table(rows, out, leading_blank=verbose)
    if plot:
        _plot(rows, plot, out)
    return rows


def _print_table(rows, out, leading_blank=True):
    header = (f"{'job':46s} {'metric':8s} {'ortlearn':>9s} {'sklearn':>9s} "
              f"{'ort s/epoch':>12s} {'skl s/epoch':>12s} {'speed-up':>9s} "
              f"{'first fit s (ort/skl)':>22s}")
    print("\n" * leading_blank + header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        first = f"{r['ortlearn_first_fit_s']:.2f} / {r['sklearn_first_fit_s']:.2f}"
        print(f"{r['title']:46s} {r['metric']:8s} "
              f"{r['ortlearn_score']:9.4f} {r['sklearn_score']:9.4f} "
              f"{r['ortlearn_epoch_s']:12.4f} {r['sklearn_epoch_s']:12.4f} "
              f"{r['sklearn_epoch_s'] / r['ortlearn_epoch_s']:8.1f}x {first:>22s}", file=out)
    print("s/epoch and speed-up: a second, identical fit in the same process; the first fit "
          "of a process also pays one-time costs (imports, the first onnxruntime session).",
          file=out)


def _plot(rows, path, out):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: plot skipped (pip install 'ortlearn[plot]').",
              file=out)
        return
    fig, axes = plt.subplots(1, len(rows), figsize=(5.5 * len(rows), 4.2))
    for ax, r in zip(axes, rows):
        epochs = range(1, len(r["ortlearn_losses"]) + 1)
        # The MLPs follow scikit-learn's updates: the curves coincide, so scikit-learn's is
        # drawn thick and pale under ortlearn's thin line with markers.
        if r["sklearn_losses"]:
            ax.plot(range(1, len(r["sklearn_losses"]) + 1), r["sklearn_losses"], "-",
                    color="tab:orange", linewidth=5, alpha=0.45, label="scikit-learn")
        else:
            ax.axhline(r["sklearn_final_loss"], color="tab:orange", linestyle="--",
                       label="scikit-learn, final objective")
            ax.text(0.97, 0.72, "scikit-learn's SGDRegressor records no loss\nper epoch: "
                    "the dashed line is its objective\nafter the last epoch",
                    transform=ax.transAxes, fontsize=7, color="tab:orange", ha="right",
                    va="top")
        ax.plot(epochs, r["ortlearn_losses"], "-o", color="tab:blue", markersize=3,
                linewidth=1.2, label="ortlearn")
        ax.set_yscale("log")
        ax.set_title(f"{r['title']} ({r['n_train']} training rows)\n"
                     f"{r['metric']}: ortlearn {r['ortlearn_score']:.3f}, "
                     f"scikit-learn {r['sklearn_score']:.3f}\n"
                     f"s/epoch: ortlearn {r['ortlearn_epoch_s']:.3f}, "
                     f"scikit-learn {r['sklearn_epoch_s']:.3f}", fontsize=8)
        ax.set_xlabel("epoch")
        ax.set_ylabel("training loss (log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"loss curves written to {path}", file=out)


def _demo_estimator_and_data():
    """An OrtMLPClassifier fitted for a few epochs on digits, and the digits split."""
    import warnings

    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import train_test_split

    from ortlearn import OrtMLPClassifier

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, stratify=y,
                                                        random_state=0)
    estimator = OrtMLPClassifier(hidden_layer_sizes=(32,), batch_size=32, max_iter=2,
                                 learning_rate_init=1e-2, random_state=0)
    with warnings.catch_warnings():  # two epochs on purpose: the browser goes on
        warnings.simplefilter("ignore", ConvergenceWarning)
        estimator.fit(X_train, y_train)
    return estimator, {"X_train": X_train, "y_train": y_train, "X_test": X_test,
                       "y_test": y_test}


def export_web(directory, estimator_path=None, data_path=None, epochs=5, js_dir=None):
    """What ``python -m ortlearn export-web`` does: the page's path."""
    import pickle

    import numpy as np

    if estimator_path is None:
        if data_path is not None:
            raise ValueError("--data goes with --estimator (the demo brings its digits).")
        estimator, data = _demo_estimator_and_data()
    else:
        if data_path is None:
            raise ValueError("--estimator needs --data: the .npz the page trains on.")
        with open(estimator_path, "rb") as f:
            estimator = pickle.load(f)
        if not hasattr(estimator, "export_web"):
            raise ValueError(f"{estimator_path} holds a {type(estimator).__name__}, not an "
                             "ortlearn mini-batch estimator (OrtMLP*, OrtSGD*, OrtLinear*).")
        with np.load(data_path, allow_pickle=False) as npz:
            data = {k: npz[k] for k in npz.files}
        missing = [k for k in ("X_train", "y_train") if k not in data]
        if missing:
            raise ValueError(f"{data_path} lacks {missing} (it holds {sorted(data)}).")
    return estimator.export_web(directory, data["X_train"], data["y_train"],
                                data.get("X_test"), data.get("y_test"), epochs=epochs,
                                js_dir=js_dir)


def _info(out=None):
    import onnx
    import onnxruntime
    import skl2onnx
    import sklearn

    import ortlearn

    out = out or sys.stdout
    print(f"ortlearn {ortlearn.__version__}", file=out)
    for mod in (onnxruntime, onnx, skl2onnx, sklearn):
        print(f"{mod.__name__} {mod.__version__}", file=out)
    print(f"providers: {', '.join(onnxruntime.get_available_providers())}", file=out)
    from ortlearn.training import webgpu

    print(f"webgpu: {'a device' if webgpu.webgpu_available() else 'none'}", file=out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ortlearn",
        description="ortlearn: train ONNX graphs with onnxruntime behind scikit-learn estimators.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="train on digits and a 200k-row make_regression, compare with "
                     "scikit-learn",
        description="Train OrtMLPClassifier on digits, OrtMLPRegressor and OrtLinearRegressor "
                    "on a make_regression of 200 000 rows, one line per epoch, then a table "
                    "of scores and times per epoch next to scikit-learn's solvers with the "
                    "same settings, and a PNG of the loss curves.")
    demo.add_argument("--device", default="cpu",
                      help="'cpu', 'cuda[:N]' or 'webgpu[:N]' (default: cpu)")
    demo.add_argument("--max-iter", type=int, default=10, help="epochs per model (default: 10)")
    demo.add_argument("--plot", default="ortlearn_demo.png",
                      help="PNG file for the loss curves (default: ortlearn_demo.png)")
    demo.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    demo.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    web = sub.add_parser(
        "export-web", help="write training artifacts and a page that trains them in a browser",
        description="Write the training artifacts of a fitted estimator and a static page "
                    "that goes on training them in a web browser with onnxruntime-web, then "
                    "serve the directory (python -m http.server -d DIRECTORY). Without "
                    "--estimator: an OrtMLPClassifier fitted for a few epochs on digits.")
    web.add_argument("directory", help="where to write the artifacts and the page")
    web.add_argument("--estimator", help="a pickle of a fitted ortlearn estimator (only open "
                                         "pickles you trust: loading one runs its code)")
    web.add_argument("--data", help="an .npz with X_train, y_train and optionally X_test, "
                                    "y_test (required with --estimator)")
    web.add_argument("--epochs", type=int, default=5, help="epochs the page trains (default 5)")
    web.add_argument("--js-dir", help="ortlearn's js/ folder, npm ci done (default: this "
                                      "checkout's)")
    sub.add_parser("info", help="print versions and available execution providers")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "info":
        _info()
        return 0
    if args.command == "export-web":
        try:
            page = export_web(args.directory, args.estimator, args.data, args.epochs,
                              args.js_dir)
        except (ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"page written to {page}\nserve it: python -m http.server -d {args.directory} "
              "8000, then open http://localhost:8000/")
        return 0
    if args.max_iter < 1:
        build_parser().error("--max-iter must be >= 1")
    plot = None if args.no_plot else args.plot
    try:
        # Checked before minutes of training, not after.
        _check_demo_args(args.device, plot)
        run_demo(device=args.device, max_iter=args.max_iter, plot=plot,
                 verbose=not args.quiet)
    except (ValueError, OSError) as exc:  # e.g. a CUDA device without onnxruntime-gpu
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _check_demo_args(device: str, plot: str | None) -> None:
    """ValueError for a device onnxruntime cannot use or a PNG path that cannot be written."""
    import os

    from ortlearn.training.device import parse_device

    parse_device(device)
    if plot is None:
        return
    directory = os.path.dirname(os.path.abspath(plot))
    if os.path.isdir(plot):
        raise ValueError(f"--plot {plot!r} is a directory; give a file name such as "
                         f"{os.path.join(plot, 'ortlearn_demo.png')!r}.")
    if not os.path.isdir(directory):
        raise ValueError(f"--plot {plot!r}: directory {directory!r} does not exist.")
    if not os.access(directory, os.W_OK):
        raise ValueError(f"--plot {plot!r}: directory {directory!r} is not writable.")


if __name__ == "__main__":
    sys.exit(main())
