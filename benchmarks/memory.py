"""Peak resident memory of an ortlearn fit, measured in a fresh process.

Usage::

    python -m benchmarks.memory [--rows 100000] [--epochs 2] [--cold]
    python -m benchmarks.memory --shapes [wide deep long]

The child process imports everything, opens one onnxruntime session (so that
the libraries and onnxruntime's fixed cost are in the baseline), creates the
W2 data in float32 without temporaries, fits 512 rows once (unless ``--cold``:
the first fit of a process imports skl2onnx and other modules, about 80 MB of
library code), resets the kernel's high-water mark
(``/proc/self/clear_refs``), fits ``OrtMLPRegressor`` (100-100-1, Adam) and
reads ``VmHWM``. tracemalloc cannot be used: onnxruntime allocates outside
Python. Linux only.

``--shapes`` measures instead the fits of :data:`SHAPES` (wide, deep and
long inputs), each with ortlearn and with scikit-learn in its own process,
and prints a table: peak above the baseline, data, weights and the ratio
(peak - baseline) / (data + weights).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

#: Source of ``status(key)`` for the child processes: a line of /proc/self/status in bytes.
STATUS_SOURCE = '''
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)
'''

_CHILD = STATUS_SOURCE + r"""
import json, sys, warnings
import numpy as np
import onnx
from onnx import TensorProto, helper
import ortlearn
from ortlearn.training.device import make_session

rows, epochs, warm = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "warm"
graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
model.ir_version = 8
make_session(model).run(None, {"x": np.zeros(1, np.float32)})
libs = status("VmRSS")
rs = np.random.default_rng(0)
X = rs.standard_normal((rows, 100), dtype=np.float32)
y = rs.standard_normal(rows, dtype=np.float32)

def fit(X, y):
    est = ortlearn.OrtMLPRegressor(hidden_layer_sizes=(100,), solver="adam", batch_size=256,
                                   max_iter=epochs, tol=0.0, n_iter_no_change=epochs + 1,
                                   random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(X, y)

before_warmup = status("VmRSS")
if warm:
    # A fit on 512 rows loads what the first fit imports lazily (skl2onnx, scikit-learn's
    # MLP, the autodiff) and onnxruntime's kernels: library code, not a cost per fit.
    fit(X[:512], y[:512])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS
# Read after the reset: the RSS may shrink meanwhile (freed pages), and the peak of the fit,
# counted from the reset, must not come out below the baseline.
before_fit = status("VmRSS")
est = fit(X, y)
n_weights = sum(v.size for v in est.get_state().values())
state = n_weights * 4 * 3  # weights + Adam's two moments, float32
print(json.dumps({"rows": rows, "warm": warm, "rss_libraries_and_ort": libs,
                  "data_bytes": X.nbytes + y.nbytes,
                  "lazy_imports_and_warmup_bytes": before_fit - before_warmup,
                  "rss_before_fit": before_fit, "peak_rss_during_fit": status("VmHWM"),
                  "model_and_optimizer_state_bytes": state}))
"""


def measure(rows: int = 100_000, epochs: int = 2, warm: bool = True) -> dict:
    """Run the child process; return its measurements plus the budget and the verdict.

    ``warm=True`` first fits 512 rows in the child, so that the baseline holds
    the modules the first fit of a process imports lazily (skl2onnx and
    others, about 80 MB) and the measure is what a fit itself costs;
    ``warm=False`` measures the first fit of a fresh process.

    The budget is the process before the fit (libraries, onnxruntime's fixed
    cost, the data) + 3 x the model and optimizer state;
    ``overhead_bytes`` is what the fit added on top of ``rss_before_fit``.
    """
    out = subprocess.run([sys.executable, "-c", _CHILD, str(rows), str(epochs),
                          "warm" if warm else "cold"],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["overhead_bytes"] = result["peak_rss_during_fit"] - result["rss_before_fit"]
    result["budget_bytes"] = result["rss_before_fit"] + 3 * result[
        "model_and_optimizer_state_bytes"]
    result["within_budget"] = result["peak_rss_during_fit"] <= result["budget_bytes"]
    return result


#: name -> (rows, features, hidden_layer_sizes) of the ``--shapes`` fits
#: (Adam, 2 epochs, float32).
SHAPES = {
    "wide": (4, 200_000, (10,)),
    "deep": (20_000, 256, (256,) * 8),
    "long": (1_000_000, 20, (10,)),
}

_SHAPE_CHILD = STATUS_SOURCE + r"""
import json, sys, warnings
import numpy as np
library, rows, features, hidden = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    tuple(json.loads(sys.argv[4]))
if library == "ortlearn":
    from ortlearn import OrtMLPRegressor as MLP
else:
    from sklearn.neural_network import MLPRegressor as MLP
rs = np.random.default_rng(0)
X = rs.standard_normal((rows, features), dtype=np.float32)
y = rs.standard_normal(rows, dtype=np.float32)

def fit(X, y):
    est = MLP(hidden_layer_sizes=hidden, solver="adam", max_iter=2, tol=0.0,
              n_iter_no_change=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 2 epochs do not converge
        return est.fit(X, y)

# A small fit first: the modules the first fit imports and onnxruntime's kernels
# are library code, in the baseline.
fit(X[:64, :min(features, 50)], y[:64])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
before = status("VmRSS")
est = fit(X, y)
peak = status("VmHWM")
if library == "ortlearn":
    n_weights = sum(v.size for v in est.get_state().values())
else:
    n_weights = sum(a.size for a in est.coefs_ + est.intercepts_)
print(json.dumps({"baseline": before, "peak": peak, "data": X.nbytes + y.nbytes,
                  "weights": 4 * n_weights}))
"""


def measure_shape(name: str, library: str = "ortlearn") -> dict:
    """Peak memory of the fit of :data:`SHAPES` ``[name]`` with ``library``
    ('ortlearn' or 'sklearn') in a fresh process.

    Returns ``baseline`` (RSS before the fit, data loaded), ``peak``,
    ``data`` and ``weights`` (float32 bytes) and ``ratio``:
    (peak - baseline) / (data + weights).
    """
    rows, features, hidden = SHAPES[name]
    out = subprocess.run([sys.executable, "-c", _SHAPE_CHILD, library, str(rows),
                          str(features), json.dumps(list(hidden))],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["ratio"] = (result["peak"] - result["baseline"]) / (
        result["data"] + result["weights"])
    return result


def shapes_table(names) -> str:
    """The ``--shapes`` table of the fits of ``names`` (MB = 10**6 bytes)."""
    lines = [f"{'shape':<6} {'rows x features, hidden':<32} {'data MB':>8} {'weights MB':>10} "
             f"{'ortlearn peak-base MB':>21} {'ratio':>6} {'sklearn peak-base MB':>20} "
             f"{'ratio':>6}"]
    for name in names:
        rows, features, hidden = SHAPES[name]
        o, s = measure_shape(name, "ortlearn"), measure_shape(name, "sklearn")
        shape = f"{rows} x {features}, {hidden[0]}" + (f" x {len(hidden)}" if len(hidden) > 1
                                                       else "")
        lines.append(f"{name:<6} {shape:<32} {o['data'] / 1e6:8.1f} {o['weights'] / 1e6:10.1f} "
                     f"{(o['peak'] - o['baseline']) / 1e6:21.1f} {o['ratio']:6.1f} "
                     f"{(s['peak'] - s['baseline']) / 1e6:20.1f} {s['ratio']:6.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--cold", action="store_true",
                        help="measure the first fit of the process (lazy imports included)")
    parser.add_argument("--shapes", nargs="*", choices=sorted(SHAPES), default=None,
                        help="measure the fits of these shapes (all when none is named) "
                             "with ortlearn and scikit-learn; print a table")
    args = parser.parse_args(argv)
    if args.shapes is not None:
        print(shapes_table(args.shapes or list(SHAPES)))
        return 0
    print(json.dumps(measure(args.rows, args.epochs, warm=not args.cold), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
