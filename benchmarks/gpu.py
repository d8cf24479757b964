"""The GPU check: on a GPU machine without a package registry, install the wheels carried
there, run the WebGPU tests, and time WebGPU against the same machine's CPU.

::

    python benchmarks/gpu.py OUT [--wheels DIR] [--scale 0.25] [--reps 3] [--threads N]
                                 [--contenders ortlearn_adam,ortlearn_adam_cpu]
                                 [--only kernels,tests,placement,profile,ortmodule,bench]

``OUT`` receives eight files, one or two a stage: ``kernels.json`` (which
one-operator models open on the device without the CPU, and their outputs'
error: :mod:`benchmarks.kernels`), ``tests.log`` (``pytest`` of the WebGPU
tests: :data:`TESTS`), ``placement.txt`` (the provider of every
node of W2's and W3's steps), ``profile.txt`` (the time of a step and the time
an epoch adds to its steps, W2's and W20's models; a copy to the device and
back; a replay's cost per node and the GPU's time of a few kernels),
``ortmodule.txt`` (a training step of ORTModule with ``device='webgpu'`` against
ORTModule and torch on the CPU: W8's MLP, W9's CNN, W7's transformer layer),
``bench.log`` (every benchmark's output), ``summary.json`` (the GPU,
onnxruntime, the WebGPU device, the kernel table read off the device, and the
figures of every stage, written after each) and ``summary.md`` (per run:
ortlearn's seconds per epoch on WebGPU and on the CPU, their ratio, and the
other contenders), in well under ten minutes at the default scale.

Prepare the wheels on a machine with a registry, for the GPU machine's
Python (3.12 and x86-64 here) and beside what its image has (onnx,
scikit-learn, scipy, torch, JAX)::

    pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 \\
        --platform manylinux_2_17_x86_64 -d .whl \\
        onnxruntime==1.32.0 onnxruntime-ep-webgpu==0.4.0 skl2onnx==1.20.0

On Linux the provider needs a Vulkan loader (Debian's ``libvulkan1``) and the
GPU driver's Vulkan driver (NVIDIA: ``nvidia_icd.json``); ``summary.json``
says when onnxruntime lists no WebGPU device, and what of the two it found.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: (run name, workload, --batch, extra environment): what issue-sized GPU minutes measure.
RUNS = [
    ("W2 batch 256", "W2", 256, {}),
    ("W2 batch 1024", "W2", 1024, {}),
    ("W3", "W3", None, {}),
    ("W3 without graph capture", "W3", None, {"ORTLEARN_WEBGPU_GRAPH_CAPTURE": "0"}),
    ("W20", "W20", None, {}),
    # Dawn's validation of each dispatch, on by default, is host time a replay may not need
    ("W2 batch 1024 without validation", "W2", 1024,
     {"ORTLEARN_WEBGPU_OPTIONS": "validationMode=disabled"}),
    ("W20 without validation", "W20", None, {"ORTLEARN_WEBGPU_OPTIONS": "validationMode=disabled"}),
]
#: The stages of a check, in order.
STAGES = ("kernels", "tests", "placement", "profile", "ortmodule", "bench")
#: The test files of the ``tests`` stage (their ``webgpu``-marked tests run on the device).
TESTS = ("tests/training/test_webgpu.py", "tests/training/test_session_webgpu.py",
         "tests/torch/test_ortmodule_webgpu.py")
#: The contenders timed: ortlearn on both devices, and JAX and torch where the image has them.
CONTENDERS = "ortlearn_adam,ortlearn_adam_cpu,jax_adam,torch_adam"


def install(wheels: Path, target: Path) -> None:
    """``pip install`` every wheel of ``wheels`` into ``target``, from those files alone."""
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    if not files:
        raise SystemExit(f"no wheel in {wheels}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target),
                    *files], check=True)


def environment() -> dict:
    import onnxruntime as ort

    from ortlearn.training import webgpu

    info = {"python": sys.version.split()[0], "onnxruntime": ort.__version__}
    try:
        info["gpu"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                     timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["gpu"] = f"nvidia-smi: {exc}"
    try:
        device = webgpu.ep_device()
        info["webgpu"] = {"vendor_id": device.device.vendor_id,
                          "device_id": device.device.device_id,
                          "metadata": dict(device.device.metadata),
                          "provider": dict(device.ep_metadata)}
    except ValueError as exc:
        info["webgpu"] = str(exc)
        # what the provider needs on Linux: the Vulkan loader and the driver's manifest
        info["vulkan_loader"] = subprocess.run(["sh", "-c", "ldconfig -p | grep libvulkan"],
                                               capture_output=True, text=True).stdout.strip()
        info["vulkan_drivers"] = sorted(str(p) for d in ("/usr/share/vulkan/icd.d",
                                                         "/etc/vulkan/icd.d",
                                                         "/usr/local/nvidia/share/vulkan/icd.d")
                                        for p in Path(d).glob("*.json"))
    return info


#: A child process fits W2's and W3's MLPs for one epoch on the device with onnxruntime's
#: verbose log on its standard error, where onnxruntime lists the node placements.
_PLACEMENT = """
import sys, warnings
import numpy as np
from sklearn.datasets import load_digits, make_regression
from ortlearn import OrtMLPClassifier, OrtMLPRegressor
from ortlearn.training import device, policy
warnings.simplefilter("ignore")
quiet = device.make_session_options
def verbose(*args, **kwargs):
    options = quiet(*args, **kwargs)
    options.log_severity_level = 0
    return options
device.make_session_options = policy.make_session_options = verbose
X, y = make_regression(4096, 100, random_state=0)
print("W2's step: MLP regressor 100-100-1, batch 1024", file=sys.stderr, flush=True)
OrtMLPRegressor((100,), batch_size=1024, max_iter=1, device=sys.argv[1]).fit(
    X.astype(np.float32), y.astype(np.float32))
X, y = load_digits(return_X_y=True)
print("W3's step: MLP classifier 64-100-10, batch 64", file=sys.stderr, flush=True)
OrtMLPClassifier((100,), batch_size=64, max_iter=1, device=sys.argv[1]).fit(
    (X / 16.0).astype(np.float32), y)
"""


def placement(device: str, out: Path, timeout: float) -> None:
    """``placement.txt``: which nodes of W2's and W3's steps onnxruntime put on which provider."""
    try:
        log = subprocess.run([sys.executable, "-c", _PLACEMENT, device], cwd=REPO,
                             capture_output=True, text=True, timeout=timeout).stderr
    except subprocess.TimeoutExpired as exc:
        log = f"(stopped after {timeout:.0f} s)\n{exc.stderr or ''}"
    keep = ("W2's step", "W3's step", "Node(s) placed", "VerifyEachNodeIsAssignedToAnEp]   ",
            "graph capture", "Memcpy", "Error", "error")
    lines = [line.split("] ", 1)[-1] if "VerifyEachNode" in line else line
             for line in log.splitlines() if any(k in line for k in keep)]
    (out / "placement.txt").write_text("\n".join(lines) + "\n")


#: A child process splits an epoch's time into a cost per step and a cost per epoch
#: (``partial_fit`` epochs of 8 and 32 batches: the slope and the intercept), and times a
#: copy of a small array to the device and back (the waits a step must not hold).
_PROFILE = """
import sys, time, warnings
import numpy as np
import onnxruntime as ort
from sklearn.datasets import make_regression
from ortlearn import OrtMLPRegressor
from ortlearn.training import parse_device
warnings.simplefilter("ignore")
device = sys.argv[1]
print("model, batch: ms per step, ms per epoch besides its steps (median of 5 epochs)")
for hidden, features, batch in [((100,), 100, 256), ((100,), 100, 1024), ((512, 512), 200, 512)]:
    times = {}
    for steps in (8, 32):
        X, y = make_regression(steps * batch, features, random_state=0)
        X, y = X.astype(np.float32), (y / y.std()).astype(np.float32)
        est = OrtMLPRegressor(hidden, batch_size=batch, random_state=0, device=device)
        est.partial_fit(X, y)
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            est.partial_fit(X, y)
            runs.append(time.perf_counter() - start)
        times[steps] = float(np.median(runs))
    step = (times[32] - times[8]) / 24
    print(f"{hidden} batch {batch}: {step * 1e3:.3f} ms per step, "
          f"{(times[8] - 8 * step) * 1e3:.2f} ms per epoch", flush=True)
where = parse_device(device)
value = ort.OrtValue.ortvalue_from_shape_and_type([256], np.int32, where.ort_device_type,
                                                  where.index)
host = np.arange(256, dtype=np.int32)
for name, call in (("copy to the device", lambda: value.update_inplace(host)),
                   ("copy to the host", value.numpy)):
    call()
    start = time.perf_counter()
    for _ in range(100):
        call()
    print(f"{name} (1 KiB): {(time.perf_counter() - start) * 1e4:.1f} us")

# A run's cost against its nodes: chains of n links on a 1024 x 100 float32 value bound to
# device buffers, recorded (graph capture) or not; "then one read": 200 runs and a read of
# the output, so the GPU's time when it is behind (runs return before the GPU is done).
from onnx import TensorProto, helper, numpy_helper
from ortlearn.training.device import make_session, make_session_options
rng = np.random.default_rng(0)
CONSTANTS = {"c": rng.random(100, np.float32), "W": rng.random((100, 100), np.float32) / 100,
             "T": rng.random((25000, 100), np.float32),
             "idx": rng.integers(0, 25000, 1024).astype(np.int64),
             "axis0": np.array([0], np.int64)}
LINKS = {  # name: (nodes of link i from x to y, the constants it reads)
    "Add x + c(100)": lambda i, x, y: [helper.make_node("Add", [x, "c"], [y])],
    "Relu": lambda i, x, y: [helper.make_node("Relu", [x], [y])],
    "MatMul x @ W(100x100)": lambda i, x, y: [helper.make_node("MatMul", [x, "W"], [y])],
    "Gemm x^T x (K=1024), MatMul": lambda i, x, y: [
        helper.make_node("Gemm", [x, x], [f"g{i}"], transA=1, alpha=1e-4),
        helper.make_node("MatMul", [x, f"g{i}"], [y])],
    # the same product as a Transpose and a MatMul (a step's weight gradient; unscaled:
    # the time of a kernel does not depend on its values)
    "Transpose, MatMul x^T x (K=1024), MatMul": lambda i, x, y: [
        helper.make_node("Transpose", [x], [f"t{i}"]),
        helper.make_node("MatMul", [f"t{i}", x], [f"g{i}"]),
        helper.make_node("MatMul", [x, f"g{i}"], [y])],
    "ReduceSum rows, Add": lambda i, x, y: [
        helper.make_node("ReduceSum", [x, "axis0"], [f"r{i}"]),
        helper.make_node("Add", [x, f"r{i}"], [y])],
    "ReduceMean all, Add": lambda i, x, y: [
        helper.make_node("ReduceMean", [x], [f"m{i}"]),
        helper.make_node("Add", [x, f"m{i}"], [y])],
    "Gather 1024 rows of 25000, Add": lambda i, x, y: [
        helper.make_node("Gather", ["T", "idx"], [f"t{i}"]),
        helper.make_node("Add", [x, f"t{i}"], [y])],
}
def chain(n, link):
    nodes = [node for i in range(n) for node in LINKS[link](
        i, "X" if i == 0 else f"y{i - 1}", "Y" if i == n - 1 else f"y{i}")]
    used = {name for node in nodes for name in node.input}
    info = [helper.make_tensor_value_info(k, TensorProto.FLOAT, [1024, 100]) for k in "XY"]
    graph = helper.make_graph(nodes, "chain", info[:1], info[1:],
                              [numpy_helper.from_array(v, k) for k, v in CONSTANTS.items()
                               if k in used])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
X = ort.OrtValue.ortvalue_from_numpy(rng.random((1024, 100), np.float32),
                                     where.ort_device_type, where.index)
def timed(n, link, capture):
    session = make_session(chain(n, link), where, make_session_options(), capture)
    Y = ort.OrtValue.ortvalue_from_shape_and_type([1024, 100], np.float32,
                                                  where.ort_device_type, where.index)
    binding = session.io_binding()
    binding.bind_ortvalue_input("X", X)
    binding.bind_ortvalue_output("Y", Y)
    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", "0" if capture else "-1")
    for _ in range(5):
        session.run_with_iobinding(binding, options)
    Y.numpy()
    start = time.perf_counter()
    for _ in range(200):
        session.run_with_iobinding(binding, options)
    runs = time.perf_counter() - start
    Y.numpy()
    return runs / 200 * 1e6, (time.perf_counter() - start) / 200 * 1e6
capture = where.kind == "webgpu"
print("link: us per run of 1 and 64 links (recorded); per link, 64 links: a run's, "
      "200 runs then a read's; unrecorded run's")
for link in LINKS:
    one = timed(1, link, capture)
    many = timed(64, link, capture)
    plain = timed(64, link, False)
    print(f"{link}: {one[0]:.1f}, {many[0]:.1f} us; per link {many[0] / 64:.2f}, "
          f"{many[1] / 64:.2f}, {plain[0] / 64:.2f} us", flush=True)
"""


def profile(device: str, out: Path, timeout: float) -> None:
    """``profile.txt``: the cost of a step and of an epoch, and of a copy each way."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROFILE, device], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout)
        text = done.stdout + (done.stderr[-3000:] if done.returncode else "")
    except subprocess.TimeoutExpired as exc:
        text = f"(stopped after {timeout:.0f} s)\n{exc.stdout or ''}"
    (out / "profile.txt").write_text(text)


def kernels(device: str, out: Path, seconds: float) -> dict:
    """``kernels.json``: which one-operator models open on ``device`` alone, and their
    outputs' largest relative error (:mod:`benchmarks.kernels`); returns the counts, the
    cases whose outputs differ, and the kernel table read off them."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.kernels", device, str(seconds)],
                          cwd=REPO, capture_output=True, text=True, timeout=seconds + 120)
    records = json.loads(done.stdout) if done.returncode == 0 else []
    (out / "kernels.json").write_text(json.dumps(records, indent=0) if records
                                      else done.stderr[-5000:])
    counts: dict = {}
    for record in records:
        counts[record["placed"]] = counts.get(record["placed"], 0) + 1
    wrong = sorted(r["case"] for r in records if r.get("error", 0) > 1e-3 or "run_error" in r)
    from benchmarks.kernels import kernel_table

    table = {op: " ".join(types) for op, types in kernel_table(records).items()}
    return {"placed": counts, "wrong_outputs": wrong, "kernel_table": table}


def _run(command: list, log, timeout: float, env: dict | None = None) -> int:
    """Run ``command`` in the repository, its output appended to ``log``; its exit status."""
    log.write(f"\n$ {' '.join(command)}\n")
    log.flush()
    try:
        return subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              timeout=timeout, env={**os.environ, **(env or {})}).returncode
    except subprocess.TimeoutExpired:
        log.write(f"\n(stopped after {timeout:.0f} s)\n")
        return 124


def bench(args, out: Path, rows: list, save) -> None:
    """Each of :data:`RUNS`: the medians of ortlearn on WebGPU and on the CPU, and the rest,
    appended to ``rows``; ``save()`` after each."""
    with open(out / "bench.log", "a") as log, tempfile.TemporaryDirectory() as tmp:
        for name, workload, batch, env in RUNS:
            if args.runs and name not in args.runs.split(","):
                continue
            folder = Path(tmp) / name.replace(" ", "_")
            command = [sys.executable, "-m", "benchmarks", "--workloads", workload,
                       "--device", args.device, "--reps", str(args.reps), "--threads",
                       str(args.threads), "--scale", str(args.scale), "--pause", "0.1",
                       "--contenders", args.contenders, "--out", str(folder)]
            if batch:
                command += ["--batch", str(batch)]
            started = time.perf_counter()
            status = _run(command, log, args.timeout, env)
            row = {"run": name, "status": status, "wall_s": round(time.perf_counter() - started)}
            results = folder / "results.json"
            if results.exists():
                result = json.loads(results.read_text())["workloads"][workload]
                row["params"] = result["params"]
                row["seconds_per_epoch"] = {
                    c: e.get("median", {}).get("time") for c, e in result["contenders"].items()}
                row["errors"] = {c: e["error"] for c, e in result["contenders"].items()
                                 if "error" in e}
                row["device_over_cpu"] = result.get("device_to_cpu")
            rows.append(row)
            save()
            print(f"{name}: {row.get('seconds_per_epoch')} ({row['wall_s']} s)", flush=True)


#: A child process times training steps (forward, loss, backward, AdamW) of ORTModule on the
#: device, ORTModule on the CPU and torch on the CPU, medians over interleaved blocks.
_ORTMODULE = """
import sys, time, warnings
import numpy as np, torch
from benchmarks.networks import _cnn, _transformer
from ortlearn.torch import ORTModule
warnings.simplefilter("ignore")
device, blocks = sys.argv[1], int(sys.argv[2])
F = torch.nn.functional
MODELS = {  # name: (model, inputs of a batch, targets, loss)
    "W8 MLP 100-100-1, batch 1024": (
        lambda: torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.ReLU(),
                                    torch.nn.Linear(100, 1)),
        lambda g: torch.randn(1024, 100, generator=g), lambda g: torch.randn(1024, 1, generator=g),
        F.mse_loss),
    "W9 CNN (digits), batch 64": (
        lambda: _cnn(torch), lambda g: torch.randn(64, 1, 8, 8, generator=g),
        lambda g: torch.randint(0, 10, (64,), generator=g), F.cross_entropy),
    "W7 transformer layer, batch 32 x 64 tokens": (
        lambda: _transformer(torch), lambda g: torch.randint(1, 100, (32, 64), generator=g),
        lambda g: torch.randint(0, 2, (32,), generator=g), F.cross_entropy),
}
print(f"ms per training step (median of {blocks} blocks of 10 steps): "
      f"ORTModule on {device}, ORTModule on the CPU, torch on the CPU")
# (on the CPU the first is the second: the check's own test runs there)
on_device = ORTModule if device == "cpu" else (lambda m: ORTModule(m, device=device))
for name, (make, inputs, targets, loss_fn) in MODELS.items():
    g = torch.Generator().manual_seed(0)
    x, y = inputs(g), targets(g)
    steppers = {}
    for label, wrap in (("device", on_device), ("cpu", ORTModule), ("torch", lambda m: m)):
        torch.manual_seed(0)
        model = wrap(make())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(model=model, optimizer=optimizer):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        step()
        steppers[label] = step
    times = {label: [] for label in steppers}
    for _ in range(blocks):
        for label, step in steppers.items():
            start = time.perf_counter()
            for _ in range(10):
                step()
            times[label].append((time.perf_counter() - start) / 10)
    cells = ", ".join(f"{np.median(t) * 1e3:.3f}" for t in times.values())
    print(f"{name}: {cells}", flush=True)
"""


def ortmodule(device: str, out: Path, timeout: float, blocks: int) -> None:
    """``ortmodule.txt``: ORTModule's training step on ``device`` against the CPU's."""
    try:
        run = subprocess.run([sys.executable, "-c", _ORTMODULE, device, str(blocks)], cwd=REPO,
                             capture_output=True, text=True, timeout=timeout)
        text = run.stdout + (run.stderr[-3000:] if run.returncode else "")
    except subprocess.TimeoutExpired as exc:
        text = f"(stopped after {timeout:.0f} s)\n{exc.stdout or ''}"
    (out / "ortmodule.txt").write_text(text)


def markdown(env: dict, tests_status: int, rows: list, device: str) -> str:
    lines = [f"GPU: {env.get('gpu')}; onnxruntime {env.get('onnxruntime')}; "
             f"the WebGPU tests' exit status {tests_status}", "",
             f"| run | ortlearn on {device} s/epoch | ortlearn on the CPU s/epoch | "
             "CPU / device | JAX s/epoch | torch s/epoch |",
             "|---|---:|---:|---:|---:|---:|"]

    def cell(value):
        return "-" if value is None else f"{value:.4g}"

    for row in rows:
        times = row.get("seconds_per_epoch", {})
        gpu, cpu = times.get("ortlearn_adam"), times.get("ortlearn_adam_cpu")
        speedup = cpu / gpu if gpu and cpu else None
        lines.append(f"| {row['run']} | {cell(gpu)} | {cell(cpu)} | {cell(speedup)} | "
                     f"{cell(times.get('jax_adam'))} | {cell(times.get('torch_adam'))} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="folder of the results")
    parser.add_argument("--wheels", default=None, help="folder of wheels to install first")
    parser.add_argument("--device", default="webgpu", help="ortlearn's GPU device")
    parser.add_argument("--scale", type=float, default=0.25, help="fraction of the data sizes")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions (median)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="CPU threads of the CPU runs (default: every core)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per benchmark run")
    parser.add_argument("--only", default=",".join(STAGES),
                        help=f"the stages run, of {','.join(STAGES)}")
    parser.add_argument("--kernel-seconds", type=float, default=100,
                        help="seconds for opening ONNX's node test models on the device")
    parser.add_argument("--runs", default="",
                        help="the runs of the bench stage, by name, separated by commas "
                             "(default: all; 'W2 batch 1024,W20' for a short GPU session)")
    parser.add_argument("--contenders", default=CONTENDERS,
                        help=f"the contenders timed (default: {CONTENDERS})")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.wheels:
        # the installed packages shadow the image's, in a fresh process
        target = Path(tempfile.mkdtemp(prefix="ortlearn-gpu-site-"))
        install(Path(args.wheels), target)
        path = os.pathsep.join([str(target), str(REPO), os.environ.get("PYTHONPATH", "")])
        rest = [a for a in (argv if argv is not None else sys.argv[1:])]
        i = rest.index("--wheels")
        del rest[i:i + 2]
        return subprocess.run([sys.executable, __file__, *rest],
                              env={**os.environ, "PYTHONPATH": path}).returncode
    sys.path.insert(0, str(REPO))
    env = environment()
    summary = {"environment": env}

    def save():  # after each stage: a run stopped midway still leaves what it measured
        (out / "summary.json").write_text(json.dumps(summary, indent=1))

    save()
    print(json.dumps(env), flush=True)
    if args.device.startswith("webgpu") and not isinstance(env.get("webgpu"), dict):
        return 1  # no device: nothing below would run on it
    stages = set(args.only.split(","))
    if "kernels" in stages:
        summary["kernels"] = kernels(args.device, out, args.kernel_seconds)
        save()
        print(f"kernels: {summary['kernels']}", flush=True)
    if "tests" in stages:
        with open(out / "tests.log", "w") as log:
            summary["tests"] = _run([sys.executable, "-m", "pytest", "-q", "-p",
                                     "no:cacheprovider", *TESTS], log, args.timeout)
        save()
        print(f"{' '.join(TESTS)}: exit status {summary['tests']}", flush=True)
    if "placement" in stages:
        placement(args.device, out, args.timeout)
    if "profile" in stages:
        profile(args.device, out, args.timeout)
        print((out / "profile.txt").read_text(), flush=True)
    if "ortmodule" in stages:
        ortmodule(args.device, out, args.timeout, max(args.reps, 1))
        print((out / "ortmodule.txt").read_text(), flush=True)
    summary["runs"] = []
    if "bench" in stages:
        bench(args, out, summary["runs"], save)
    table = markdown(env, summary.get("tests"), summary["runs"], args.device)
    (out / "summary.md").write_text(table)
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
