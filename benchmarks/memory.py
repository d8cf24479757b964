"""Peak resident memory of an ortlearn fit, measured in a fresh process.

Usage::

    python -m benchmarks.memory [--rows 100000] [--epochs 2] [--cold]

The child process imports everything, opens one onnxruntime session (so that
the libraries and onnxruntime's fixed cost are in the baseline), creates the
W2 data in float32 without temporaries, fits 512 rows once (unless ``--cold``:
the first fit of a process imports skl2onnx and other modules, about 80 MB of
library code), resets the kernel's high-water mark
(``/proc/self/clear_refs``), fits ``OrtMLPRegressor`` (100-100-1, Adam) and
reads ``VmHWM``. tracemalloc cannot be used: onnxruntime allocates outside
Python. Linux only.
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

    The budget is the issue's: the process before the fit (libraries,
    onnxruntime's fixed cost, the data) + 3 x the model and optimizer state;
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--cold", action="store_true",
                        help="measure the first fit of the process (lazy imports included)")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.rows, args.epochs, warm=not args.cold), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
