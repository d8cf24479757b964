"""Peak resident memory of an ortlearn fit, measured in a fresh process.

Usage::

    python -m benchmarks.memory [--rows 100000] [--epochs 2]

The child process imports everything, opens one onnxruntime session (so that
the libraries and onnxruntime's fixed cost are in the baseline), creates the
W2 data in float32 without temporaries, resets the kernel's high-water mark
(``/proc/self/clear_refs``), fits ``OrtMLPRegressor`` (100-100-1, Adam) and
reads ``VmHWM``. tracemalloc cannot be used: onnxruntime allocates outside
Python. Linux only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CHILD = r"""
import json, sys, warnings
import numpy as np
import onnx
from onnx import TensorProto, helper
import ortlearn
from ortlearn.training.device import make_session

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)

rows, epochs = int(sys.argv[1]), int(sys.argv[2])
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
before_fit = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM
est = ortlearn.OrtMLPRegressor(hidden_layer_sizes=(100,), solver="adam", batch_size=256,
                               max_iter=epochs, tol=0.0, n_iter_no_change=epochs + 1,
                               random_state=0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    est.fit(X, y)
n_weights = sum(v.size for v in est.get_state().values())
state = n_weights * 4 * 3  # weights + Adam's two moments, float32
print(json.dumps({"rows": rows, "rss_libraries_and_ort": libs, "data_bytes": X.nbytes + y.nbytes,
                  "rss_before_fit": before_fit, "peak_rss_during_fit": status("VmHWM"),
                  "model_and_optimizer_state_bytes": state}))
"""


def measure(rows: int = 100_000, epochs: int = 2) -> dict:
    """Run the child process; return its measurements plus the budget and the verdict.

    The budget is the issue's: the process before the fit (libraries,
    onnxruntime's fixed cost, the data) + 3 x the model and optimizer state;
    ``overhead_bytes`` is what the fit added on top of ``rss_before_fit``.
    """
    out = subprocess.run([sys.executable, "-c", _CHILD, str(rows), str(epochs)],
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
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.rows, args.epochs), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
