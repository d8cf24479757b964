"""Fuzzing of the entry points that read untrusted bytes: refused cleanly, or a finding.

Usage::

    python -m benchmarks.fuzz [--seconds 60] [--timeout 10] [--targets checkpoint ...]
                              [--engine auto|atheris|builtin] [--seed 0]
                              [--rss-limit-mb 2048] [--out benchmark_results/fuzz]

Each target (:data:`TARGETS`) is a function of one ``bytes`` argument:

- ``checkpoint``: ``CheckpointState.load_checkpoint(data)``;
- ``training_session``: ``TrainingSession(state, data)`` on a valid checkpoint, one
  ``train_step`` when it opens;
- ``generate_artifacts`` / ``build_artifacts``: the artifacts (MSE loss, AdamW) of the
  model ``data``, written to a temporary directory / built in memory;
- ``module_training``, ``module_eval``, ``module_optimizer``, ``module_checkpoint``:
  ``ortlearn.api`` on the artifacts of a tiny linear model, one of the four files
  replaced by ``data``: ``Module(training_model, state, eval_model)``,
  ``Optimizer(optimizer_model, module)``, a training step, an optimizer step and an
  eval step.

The seed corpus is built at start (:func:`build_fixtures`): the ONNX model of a
``LinearRegression``, the artifacts ``generate_artifacts`` writes for it, a checkpoint
saved after a step (optimizer state and properties) and a nominal one.

An input passes when the target returns or raises a documented refusal: a
``ValueError``, a ``TypeError`` or one of ortlearn's exceptions
(:mod:`ortlearn.exceptions`), unless the class comes from onnx, onnxruntime, protobuf
or safetensors (``onnx.checker.ValidationError``, a raw onnxruntime error: those
escaping are findings). Anything else is a finding: another exception, a crash (a
signal, an abort), a hang (an input running over ``--timeout`` seconds) or an input
taking the process over ``--rss-limit-mb``. Each finding's input is saved in
``--out``/<target>/ (``<kind>-<hash>.bin``, with the traceback or the log in ``.txt``).

Engine: `atheris <https://github.com/google/atheris>`_ (libFuzzer, coverage-guided
over ortlearn's and onnx's Python code) when it is installed
(``pip install atheris``, in the ``bench`` extra on x86-64), else a built-in seeded
mutator (bit flips, byte insertions and deletions, truncations, splices between
corpus entries; structure-aware edits of the safetensors checkpoint's JSON headers
and tensors, re-signed with the checkpoint's checksum so that the checks behind it
are reached, and of the ONNX protobuf: operators, wiring, attributes, types, shapes,
initializers, opsets and ortlearn's ``metadata_props``; an input giving a new kind of
refusal joins the corpus). With atheris the same structure-aware edits are half of
the mutations, and the corpus libFuzzer grows stays in ``--out``/<target>/corpus for
the next run. Each target runs in a child process for ``--seconds`` of fuzzing, so
that a crash or a hang is caught, with the input that caused it, by this process;
the child is restarted for the time left after one.

Prints a table per target (engine, inputs run, seconds, outcomes: ``ok`` and each
refusal class counted, findings) and a summary, and writes into ``--out``
``fuzz.json`` and ``fuzz.png`` (the outcomes per target, when matplotlib is installed):
the last run of each target, so that ``--targets`` runs in turn add up. Exits with 1
when this run has a finding. Linux only (``/proc`` for the child's memory).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

from benchmarks.report import pyplot, save_figure

#: Classes of foreign libraries: escaping ortlearn, they are findings even when they
#: derive from ValueError (top-level module names).
FOREIGN_MODULES = ("onnx", "onnxruntime", "google", "safetensors", "safetensors_rust",
                   "pyo3_runtime")

#: What the structured mutations may put in a JSON header.
_JSON_VALUES = [None, True, False, 0, -1, 1, 3, 2**31, -2**63, 2**63, 2**64, 1e308, -0.0,
                "", "nan", "inf", "float32", "float64", "float16", "int32", "int64", "bool",
                "bfloat16", "uint8", "F32", "F64", "I64", "BOOL", "coef", "intercept",
                "param/coef", "x" * 300, [], {}, [0], [-1], [3, 1], [1], [2**40, 2**40],
                [0, 0], ["coef"], ["coef", "coef"], {"dtype": "float32", "shape": [3, 1],
                                                     "nominal": False}]

_ONNX_OPS = ["Add", "Sub", "Mul", "Div", "MatMul", "Gemm", "Relu", "Identity", "Reshape",
             "Transpose", "ReduceSum", "ReduceMean", "Softmax", "Cast", "Concat", "Neg",
             "Exp", "Log", "Sigmoid", "Tanh", "Where", "Loop", "If", "Scan", "Constant",
             "Shape", "Size", "Gather", "Slice", "Squeeze", "Unsqueeze", "Sum", "Max",
             "Pow", "Sqrt", "Abs", "Expand", "Flatten", "Dropout", "NoSuchOp", ""]

MAX_LEN = 1 << 16

#: The fixed batch of the training, optimizer and eval steps: X (4, 3), target (4, 1).
_ROWS = 4


# ----------------------------------------------------------------------- fixtures

def build_fixtures(directory) -> dict:
    """Write the valid inputs of the targets into ``directory``; return name -> path.

    ``forward.onnx`` (a ``LinearRegression`` of 3 features), the artifacts of
    ``generate_artifacts`` for it (MSE loss, AdamW): ``training_model.onnx``,
    ``eval_model.onnx``, ``optimizer_model.onnx`` and ``checkpoint``;
    ``checkpoint_trained`` (after one step: optimizer state and properties) and
    ``checkpoint_nominal`` (names and shapes only).
    """
    import numpy as np
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    from ortlearn import CheckpointState, TrainingSession
    from ortlearn.artifacts import LossType, OptimType, generate_artifacts

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    X = np.random.RandomState(0).randn(10, 3).astype(np.float32)
    onx = to_onnx(LinearRegression().fit(X, X[:, 0]), X, black_op={"LinearRegressor"})
    (directory / "forward.onnx").write_bytes(onx.SerializeToString())
    options = {"requires_grad": ["coef", "intercept"], "loss": LossType.MSELoss,
               "optimizer": OptimType.AdamW}
    generate_artifacts(onx, artifact_directory=directory, **options)
    with tempfile.TemporaryDirectory() as tmp:
        generate_artifacts(onx, artifact_directory=tmp, nominal_checkpoint=True, **options)
        shutil.copyfile(Path(tmp) / "checkpoint", directory / "checkpoint_nominal")
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    session = TrainingSession(state, str(directory / "training_model.onnx"),
                              str(directory / "eval_model.onnx"),
                              str(directory / "optimizer_model.onnx"))
    xb, yb = _batch()
    session.train_step(xb, yb)
    session.optimizer_step()
    session.close()
    state.properties["epoch"] = 1
    state.properties["learning_rate"] = 0.01
    state.properties["note"] = "fuzz seed"
    CheckpointState.save_checkpoint(state, str(directory / "checkpoint_trained"),
                                    include_optimizer_state=True)
    return {p.name: p for p in directory.iterdir() if p.is_file()}


def _batch():
    import numpy as np

    X = np.random.RandomState(1).randn(_ROWS, 3).astype(np.float32)
    return X, X[:, :1].copy()


#: name -> (what it runs, the fixtures of its seed corpus: the first must be accepted).
TARGETS = {
    "checkpoint": ("CheckpointState.load_checkpoint(data)",
                   ["checkpoint", "checkpoint_trained", "checkpoint_nominal"]),
    "training_session": ("TrainingSession(state, data) + train_step",
                         ["training_model.onnx", "eval_model.onnx"]),
    "generate_artifacts": ("generate_artifacts(data, ...) to a temporary directory",
                           ["forward.onnx"]),
    "build_artifacts": ("build_artifacts(data, ...)", ["forward.onnx"]),
    "module_training": ("api.Module, training_model.onnx replaced",
                        ["training_model.onnx", "eval_model.onnx"]),
    "module_eval": ("api.Module, eval_model.onnx replaced",
                    ["eval_model.onnx", "training_model.onnx"]),
    "module_optimizer": ("api.Optimizer, optimizer_model.onnx replaced",
                         ["optimizer_model.onnx"]),
    "module_checkpoint": ("api.Module, checkpoint replaced",
                          ["checkpoint", "checkpoint_trained"]),
}

_MODULE_FILES = {"module_training": "training_model.onnx", "module_eval": "eval_model.onnx",
                 "module_optimizer": "optimizer_model.onnx", "module_checkpoint": "checkpoint"}


def make_target(name: str, fixtures, workdir):
    """The function of ``bytes`` of target ``name``, on the fixtures in ``fixtures``.

    ``workdir`` is a directory of the target's own (the module targets copy the
    artifacts there and replace one file; generate_artifacts writes there).
    """
    from ortlearn import CheckpointState, TrainingSession
    from ortlearn.artifacts import LossType, OptimType, build_artifacts, generate_artifacts

    fixtures, workdir = Path(fixtures), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    X, y = _batch()
    options = {"requires_grad": ["coef", "intercept"], "loss": LossType.MSELoss,
               "optimizer": OptimType.AdamW}

    if name == "checkpoint":
        return CheckpointState.load_checkpoint

    if name == "training_session":
        checkpoint = (fixtures / "checkpoint").read_bytes()

        def run(data):
            session = TrainingSession(CheckpointState.load_checkpoint(checkpoint), data)
            try:
                session.train_step(X, y)
            finally:
                session.close()
        return run

    if name == "generate_artifacts":
        return lambda data: generate_artifacts(data, artifact_directory=workdir, **options)

    if name == "build_artifacts":
        return lambda data: build_artifacts(data, **options)

    if name in _MODULE_FILES:
        from ortlearn.api import Module, Optimizer

        paths = {}
        for file in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx",
                     "checkpoint"):
            paths[file] = workdir / file
            shutil.copyfile(fixtures / file, paths[file])
        fuzzed = paths[_MODULE_FILES[name]]

        def run(data):
            fuzzed.write_bytes(data)
            state = CheckpointState.load_checkpoint(str(paths["checkpoint"]))
            with Module(str(paths["training_model.onnx"]), state,
                        str(paths["eval_model.onnx"])) as model:
                optimizer = Optimizer(str(paths["optimizer_model.onnx"]), model)
                model.lazy_reset_grad()
                model(X, y)
                optimizer.step()
                model.eval()
                model(X, y)
        return run

    raise ValueError(f"unknown target {name!r}; the targets are {sorted(TARGETS)}")


def seeds_of(name: str, fixtures) -> list:
    return [(Path(fixtures) / file).read_bytes() for file in TARGETS[name][1]]


# ----------------------------------------------------------------- classification

def documented_refusals() -> tuple:
    """The exception classes a target may raise on bad bytes."""
    from ortlearn import exceptions

    return (ValueError, TypeError, exceptions.TrainingApiError, exceptions.NoGradientRuleError,
            exceptions.NominalCheckpointError, exceptions.ConvergenceError)


def is_refusal(exc: BaseException, documented: tuple) -> bool:
    """Whether ``exc`` is a documented refusal (not a foreign library's class)."""
    if type(exc).__module__.split(".")[0] in FOREIGN_MODULES:
        return False
    return isinstance(exc, documented)


def class_name(cls: type) -> str:
    """``ValueError``, ``TrainingApiValueError``, ``json.decoder.JSONDecodeError``..."""
    module = cls.__module__
    if module.startswith("ortlearn") and getattr(sys.modules.get(module), cls.__qualname__,
                                                 None) is not cls:
        # as_training_api_error's twin of a class: TrainingApiError[UnicodeDecodeError]
        return f"TrainingApiError[{cls.__qualname__}]"
    if module == "builtins" or module.startswith("ortlearn"):
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


def _kind_of_message(exc: BaseException) -> str:
    """The class and the message's first words, names and numbers left out."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", str(exc).split("\n")[0])
    return f"{type(exc).__name__}: {text[:60]}"


def where(exc: BaseException) -> str:
    """``in file.py:function`` of the innermost frame, and of the innermost ortlearn frame."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve() != Path(__file__).resolve()]
    if not frames:
        return "in ?"

    def name(index):  # a comprehension or a lambda: named in its function
        frame = frames[index]
        text = frame.name
        while text.startswith("<") and index > 0 and frames[index - 1].filename == frame.filename:
            index -= 1
            text = f"{frames[index].name}.{text}"
        return f"{Path(frame.filename).name}:{text}"

    text = f"in {name(len(frames) - 1)}"
    ours = [i for i, f in enumerate(frames) if f"{os.sep}ortlearn{os.sep}" in f.filename]
    if ours and ours[-1] != len(frames) - 1:
        text += f" from {name(ours[-1])}"
    return text


class Recorder:
    """Runs inputs on a target; counts the outcomes and saves the findings' inputs."""

    def __init__(self, target: str, workdir, timeout: float, engine: str):
        self.target, self.workdir, self.timeout = target, Path(workdir), timeout
        self.engine = engine
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.outcomes: Counter = Counter()
        self.classes: dict = {}
        self.types: dict = {}  # label -> the refusal's class (in this process only)
        self.findings: dict = {}
        self.inputs = 0
        self.seconds = 0.0
        self.kinds: set = set()
        self._documented = documented_refusals()

    def run(self, function, data: bytes) -> bool:
        """Run ``function(data)``; return whether the outcome is of a new kind."""
        start = time.perf_counter()
        new = False
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                function(data)
            label = "ok"
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: B036 - a PanicException, a SystemExit: findings
            if is_refusal(exc, self._documented):
                label = class_name(type(exc))
                self.classes[label] = f"{type(exc).__module__}.{type(exc).__qualname__}"
                self.types[label] = type(exc)
                kind = _kind_of_message(exc)
            else:
                label = "FINDING " + class_name(type(exc))
                kind = self.exception_finding(exc, data)
            if kind not in self.kinds:
                self.kinds.add(kind)
                new = True
        elapsed = time.perf_counter() - start
        self.seconds += elapsed
        self.inputs += 1
        self.outcomes[label] += 1
        if elapsed > self.timeout:  # only seen here when it ran in-process and ended
            self.add_finding("hang", f"an input ran {elapsed:.1f} s (--timeout "
                             f"{self.timeout:g})", data, "")
        return new

    def exception_finding(self, exc: BaseException, data: bytes) -> str:
        signature = f"{class_name(type(exc))} {where(exc)}"
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.add_finding("exception", signature, data, text)
        return signature

    def add_finding(self, kind: str, signature: str, data: bytes, detail: str) -> dict:
        key = f"{kind}: {signature}"
        if key in self.findings:
            self.findings[key]["count"] += 1
            return self.findings[key]
        digest = hashlib.sha1(key.encode()).hexdigest()[:12]
        path = self.workdir / f"{kind}-{digest}.bin"
        path.write_bytes(data)
        path.with_suffix(".txt").write_text(
            f"target: {self.target}\nkind: {kind}\nsignature: {signature}\n"
            f"input: {path.name} ({len(data)} bytes)\n\n{detail}")
        finding = {"kind": kind, "signature": signature, "count": 1, "input": str(path),
                   "detail": detail[-4000:]}
        self.findings[key] = finding
        return finding

    def stats(self, done: bool = False) -> dict:
        return {"target": self.target, "engine": self.engine, "inputs": self.inputs,
                "seconds": round(self.seconds, 3), "outcomes": dict(self.outcomes),
                "classes": self.classes, "findings": list(self.findings.values()),
                "done": done}


# ------------------------------------------------------------------------ mutator

def _walk_json(obj, nodes: list) -> None:
    if isinstance(obj, dict):
        for key in list(obj):
            nodes.append((obj, key))
            _walk_json(obj[key], nodes)
    elif isinstance(obj, list):
        for index in range(len(obj)):
            nodes.append((obj, index))
            _walk_json(obj[index], nodes)


def mutate_json(obj, rng: random.Random):
    """``obj`` (a JSON value) with one value replaced, removed, renamed, nudged or doubled."""
    nodes: list = []
    _walk_json(obj, nodes)
    if not nodes:
        return copy.deepcopy(rng.choice(_JSON_VALUES))
    container, key = rng.choice(nodes)
    op = rng.randrange(5)
    value = container[key]
    if op == 0:
        container[key] = copy.deepcopy(rng.choice(_JSON_VALUES))
    elif op == 1:
        del container[key]
    elif op == 2 and isinstance(container, dict):
        new = rng.choice(["", "coef", "intercept", "x", str(key) + "_", "param/coef",
                          "__metadata__", str(key).upper()])
        container[new] = container.pop(key)
    elif op == 3 and isinstance(value, (int, float)) and not isinstance(value, bool):
        container[key] = rng.choice([value + 1, value - 1, -value, value * 2**20, 0])
    elif op == 3 and isinstance(value, str):
        container[key] = rng.choice([value[:-1], value + "x", value * 2, value.upper()])
    elif isinstance(container, list):
        container.insert(key, copy.deepcopy(value))
    else:
        container[key] = copy.deepcopy(rng.choice(_JSON_VALUES))
    return obj


def _safetensors_parts(data: bytes):
    """``(header dict, body)`` of bytes that look like a safetensors file, else None."""
    if len(data) < 10:
        return None
    size = int.from_bytes(data[:8], "little")
    if size > len(data) - 8 or data[8:9] != b"{":
        return None
    try:
        header = json.loads(data[8:8 + size])
    except ValueError:
        return None
    return (header, data[8 + size:]) if isinstance(header, dict) else None


def _safetensors_join(header, body: bytes, sort_keys: bool = False) -> bytes:
    text = json.dumps(header, separators=(",", ":"), sort_keys=sort_keys).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + body


def mutate_checkpoint(data: bytes, rng: random.Random):
    """An edit of a safetensors checkpoint's headers or tensors, else None.

    Most edits are re-signed (``ortlearn.checksum`` recomputed), so that the checks
    behind the checksum see them.
    """
    import numpy as np
    import safetensors.numpy

    from ortlearn.training.checkpoint import _checksum

    parts = _safetensors_parts(data)
    if parts is None:
        return None
    header, body = parts
    if rng.random() < 0.3:  # the safetensors header itself: dtypes, shapes, offsets
        return _safetensors_join(mutate_json(header, rng), body)
    try:
        tensors = dict(safetensors.numpy.load(data))
    except BaseException:  # noqa: B036 - safetensors panics on some headers
        return _safetensors_join(mutate_json(header, rng), body)
    metadata = {str(k): str(v) for k, v in (header.get("__metadata__") or {}).items()}
    try:
        ort_header = json.loads(metadata.get("ortlearn.header", "{}"))
    except ValueError:
        ort_header = {}
    op = rng.randrange(5)
    if op <= 1:
        ort_header = mutate_json(ort_header, rng)
    elif op == 2 and tensors:
        key = rng.choice(sorted(tensors))
        arr = tensors[key]
        edit = rng.randrange(6)
        if edit == 0 and arr.size and arr.dtype.kind == "f":
            arr = arr.copy()
            arr.reshape(-1)[rng.randrange(arr.size)] = rng.choice(
                [np.nan, np.inf, -np.inf, 1e38, 0.0])
        elif edit == 1:
            arr = arr.astype(rng.choice([np.float16, np.float32, np.float64, np.int32,
                                         np.int64, np.bool_, np.uint8]))
        elif edit == 2:
            arr = arr.reshape(-1) if arr.ndim != 1 else arr.reshape(1, -1)
        elif edit == 3:
            arr = np.zeros(rng.choice([(0,), (2,), (3, 2), (1, 1, 1)]), arr.dtype)
        elif edit == 4:
            del tensors[key]
            arr = None
        else:
            tensors[rng.choice(["param/extra", "optim/coef/momentum", key + "_",
                                "param/"])] = arr
        if arr is not None and edit != 5:
            tensors[key] = arr
    elif op == 3:
        metadata[rng.choice(["ortlearn.checkpoint", "ortlearn.header", "ortlearn.checksum",
                             "other"])] = rng.choice(["1", "2", "", "01", "{}", "null"])
    else:
        properties = ort_header.get("properties") if isinstance(ort_header, dict) else None
        if isinstance(properties, list):
            properties.append([rng.choice(["p", "", "epoch"]), rng.choice(["int", "float",
                                                                             "str", "bool"]),
                               rng.choice(["zz", "-0x1", "nan", "1e999", "", "ff" * 40])])
    metadata["ortlearn.header"] = json.dumps(ort_header)
    if rng.random() < 0.8:
        try:
            metadata["ortlearn.checksum"] = _checksum(metadata["ortlearn.header"], tensors)
        except Exception:
            pass
    try:
        saved = safetensors.numpy.save(tensors, metadata=metadata)
    except BaseException:  # noqa: B036 - a dtype safetensors cannot write
        return None
    # safetensors writes the metadata in a hash map's order, which changes between
    # processes: sorted, a seeded run gives the same inputs each time
    header, body = _safetensors_parts(saved)
    return _safetensors_join(header, body, sort_keys=True)


def mutate_onnx(data: bytes, rng: random.Random):
    """An edit of an ONNX model's graph, types, opsets or metadata, else None."""
    import onnx

    try:
        model = onnx.ModelProto.FromString(data)
    except Exception:
        return None
    graph = model.graph
    if not graph.node:
        return None
    node = rng.choice(graph.node)
    names = [n for nd in graph.node for n in list(nd.input) + list(nd.output)]
    names += [v.name for v in graph.input] + [t.name for t in graph.initializer] + ["", "x"]
    op = rng.randrange(12)
    if op == 0:
        node.op_type = rng.choice(_ONNX_OPS)
    elif op == 1:
        graph.node.remove(node)
    elif op == 2:
        graph.node.add().CopyFrom(node)
    elif op == 3 and node.input:
        node.input[rng.randrange(len(node.input))] = rng.choice(names)
    elif op == 3:
        node.input.append(rng.choice(names))
    elif op == 4 and node.output:
        node.output[rng.randrange(len(node.output))] = rng.choice(names)
    elif op == 5:
        if node.attribute and rng.random() < 0.7:
            attr = rng.choice(node.attribute)
            attr.i = rng.choice([-1, 0, 1, 2, 2**40])
            attr.f = rng.choice([0.0, -1.0, float("nan")])
            if rng.random() < 0.3:
                attr.type = rng.randrange(15)
        else:
            node.attribute.append(onnx.helper.make_attribute(
                rng.choice(["axis", "transA", "keepdims", "to", "perm", "alpha"]),
                rng.choice([0, 1, -5, 2**40, [1, 0], 0.5])))
    elif op == 6:
        node.domain = rng.choice(["com.microsoft", "ai.onnx.ml", "ai.onnx.preview.training",
                                  "no.such.domain", ""])
    elif op == 7 and graph.initializer:
        tensor = rng.choice(graph.initializer)
        edit = rng.randrange(4)
        if edit == 0:
            tensor.dims[:] = rng.choice([[], [0], [2**31], [3, 2], [1, 1, 1]])
        elif edit == 1:
            tensor.data_type = rng.randrange(0, 24)
        elif edit == 2:
            tensor.raw_data = tensor.raw_data[:rng.randrange(len(tensor.raw_data) + 1)]
        else:
            graph.initializer.remove(tensor)
    elif op == 8:
        values = list(graph.input) + list(graph.output)
        value = rng.choice(values)
        edit = rng.randrange(5)
        if edit == 0:
            value.type.tensor_type.elem_type = rng.randrange(0, 24)
        elif edit == 1 and value.type.tensor_type.shape.dim:
            dim = rng.choice(value.type.tensor_type.shape.dim)
            if rng.random() < 0.5:
                dim.dim_value = rng.choice([0, 1, 2, 7, 2**40])
            else:
                dim.dim_param = rng.choice(["N", "", "batch"])
        elif edit == 2:
            value.type.tensor_type.shape.dim.add().dim_value = rng.choice([1, 2])
        elif edit == 3:
            value.ClearField("type")
        else:
            container = graph.input if value in graph.input else graph.output
            container.remove(value)
    elif op == 9:
        if model.opset_import and rng.random() < 0.7:
            rng.choice(model.opset_import).version = rng.choice([1, 7, 12, 99, 10000, -1])
        else:
            model.ir_version = rng.choice([0, 3, 7, 99, -1])
    elif op == 10 and model.metadata_props:
        prop = rng.choice(model.metadata_props)
        try:
            prop.value = json.dumps(mutate_json(json.loads(prop.value), rng))
        except ValueError:
            prop.value = rng.choice(["", "{", "null", "[]"])
    else:
        graph.node.reverse()
    try:
        return model.SerializeToString()
    except Exception:  # a field set out of its range
        return None


def mutate_bytes(data: bytes, corpus: list, rng: random.Random) -> bytes:
    """A bit flip, an interesting byte, an insertion, a deletion, a truncation or a splice."""
    out = bytearray(data)
    if not out:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    other = rng.choice(corpus) if corpus else data
    op = rng.randrange(7)
    if op == 0:
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif op == 1:
        out[rng.randrange(len(out))] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
    elif op == 2:
        at = rng.randrange(len(out) + 1)
        if rng.random() < 0.5:
            chunk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        else:
            start = rng.randrange(len(out))
            chunk = bytes(out[start:start + rng.randint(1, 64)])
        out[at:at] = chunk
    elif op == 3:
        start = rng.randrange(len(out))
        del out[start:start + rng.randint(1, 64)]
    elif op == 4:
        del out[rng.randrange(len(out)):]
    elif op == 5:
        out = out[:rng.randrange(len(out) + 1)] + other[rng.randrange(len(other) + 1):]
    else:
        start = rng.randrange(len(out))
        source = rng.randrange(len(other) + 1)
        chunk = other[source:source + rng.randint(1, 64)]
        out[start:start + len(chunk)] = chunk
    return bytes(out)


def mutate(data: bytes, corpus: list, rng: random.Random) -> bytes:
    """One input derived from ``data``: a structure-aware edit or 1-3 byte mutations."""
    if rng.random() < 0.5:
        try:
            edited = mutate_checkpoint(data, rng)
            if edited is None:
                edited = mutate_onnx(data, rng)
        except Exception:  # the mutator's own parsing of a damaged input
            edited = None
        if edited is not None:
            return edited[:MAX_LEN]
    for _ in range(rng.choice([1, 1, 2, 3])):
        data = mutate_bytes(data, corpus, rng)
    return data[:MAX_LEN]


def builtin_fuzz(function, seeds: list, recorder: Recorder, seed: int = 0,
                 max_inputs: int | None = None, deadline: float | None = None,
                 before=None) -> Recorder:
    """Run the seeds, then mutants of the corpus, until ``max_inputs`` or ``deadline``.

    ``before(data)`` is called before each input (the child writes it for its parent).
    An input whose outcome is of a new kind (class and message) joins the corpus.
    """
    rng = random.Random(seed)
    corpus = list(seeds)
    count = 0

    def done():
        return ((max_inputs is not None and count >= max_inputs)
                or (deadline is not None and time.monotonic() >= deadline))

    for data in seeds:
        if done():
            break
        if before:
            before(data)
        recorder.run(function, data)
        count += 1
    while not done():
        data = mutate(rng.choice(corpus), corpus, rng)
        if before:
            before(data)
        if recorder.run(function, data) and len(corpus) < 2000:
            corpus.append(data)
        count += 1
    return recorder


def fuzz_in_process(name: str, fixtures, workdir, inputs: int = 150, seed: int = 0,
                    timeout: float = 10.0) -> dict:
    """The built-in mutator on target ``name`` in this process, for ``inputs`` inputs.

    No crash protection: for tests (a hang is only seen once the input ends).
    Returns the stats (:meth:`Recorder.stats`) and ``"types"``: refusal label -> class.
    """
    workdir = Path(workdir)
    function = make_target(name, fixtures, workdir / "work")
    recorder = Recorder(name, workdir, timeout, "builtin")
    builtin_fuzz(function, seeds_of(name, fixtures), recorder, seed=seed, max_inputs=inputs)
    return dict(recorder.stats(done=True), types=dict(recorder.types))


# ------------------------------------------------------------------------- child

def atheris_available() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def _child(args) -> int:
    """The fuzzing child process of one target (``--child``)."""
    import faulthandler

    workdir = Path(args.workdir)
    faulthandler.enable(all_threads=True)
    # the parent asks for the stacks of a hung child before killing it
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    seed = args.seed
    if args.engine == "atheris":
        import atheris

        hook = atheris.instrument_imports(include=["ortlearn", "onnx"])
    else:
        hook = contextlib.nullcontext()
    with hook:
        import ortlearn.api  # noqa: F401
        import ortlearn.artifacts  # noqa: F401

        function = make_target(args.child, args.fixtures, workdir / "work")
        seeds = seeds_of(args.child, args.fixtures)
        # the lazy imports of the first run are instrumented too
        scratch = Recorder(args.child, workdir / "scratch", args.timeout, args.engine)
        for data in seeds:
            scratch.run(function, data)
        shutil.rmtree(workdir / "scratch", ignore_errors=True)
    recorder = Recorder(args.child, workdir, args.timeout, args.engine)
    stats_path = workdir / "stats.json"
    current = None
    state = {"deadline": None, "dumped": 0.0}

    def dump(done=False):
        tmp = stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(recorder.stats(done)))
        os.replace(tmp, stats_path)
        state["dumped"] = time.monotonic()

    def before(data):
        nonlocal current
        if current is None:  # the parent times inputs from the first one on
            current = open(workdir / "current.bin", "wb")
            state["deadline"] = time.monotonic() + args.seconds
        current.seek(0)
        current.write(data)
        current.truncate()
        current.flush()
        if time.monotonic() - state["dumped"] > 1.0:
            dump()

    if args.engine == "builtin":
        builtin_fuzz(function, seeds, recorder, seed=seed,
                     deadline=time.monotonic() + args.seconds, before=before)
        dump(done=True)
        return 0

    import atheris

    corpus = workdir / "corpus"
    seeds_dir = workdir / "seeds"
    corpus.mkdir(exist_ok=True)
    max_len = max(4096, 2 * max(len(s) for s in seeds))
    rng_corpus = list(seeds)

    def test_one_input(data: bytes) -> None:
        if state["deadline"] is not None and time.monotonic() >= state["deadline"]:
            dump(done=True)
            os._exit(0)
        before(data)
        if recorder.run(function, data) and len(rng_corpus) < 500:
            rng_corpus.append(data)

    def custom_mutator(data: bytes, max_size: int, mutator_seed: int) -> bytes:
        rng = random.Random(mutator_seed)
        if rng.random() < 0.5:
            return atheris.Mutate(data, max_size)
        return mutate(data, rng_corpus, rng)[:max_size]

    argv = [sys.argv[0], f"-seed={seed + 1}", f"-max_len={max_len}",
            f"-max_total_time={int(args.seconds) + 30}", f"-timeout={int(args.timeout * 3)}",
            "-rss_limit_mb=0", f"-artifact_prefix={workdir}/libfuzzer-",
            str(corpus), str(seeds_dir)]
    atheris.Setup(argv, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()
    dump(done=True)
    return 0


# ------------------------------------------------------------------------ parent

def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _merge(total: dict, part: dict) -> None:
    total["inputs"] += part.get("inputs", 0)
    total["target_seconds"] += part.get("seconds", 0.0)
    total["outcomes"].update(part.get("outcomes", {}))
    total["classes"].update(part.get("classes", {}))
    for finding in part.get("findings", []):
        key = f"{finding['kind']}: {finding['signature']}"
        if key in total["findings"]:
            total["findings"][key]["count"] += finding["count"]
        else:
            total["findings"][key] = dict(finding)


def fuzz_target(name: str, fixtures, out, seconds: float = 60, timeout: float = 10,
                engine: str = "builtin", seed: int = 0, rss_limit_mb: float = 2048,
                setup_limit: float = 300, max_restarts: int = 20) -> dict:
    """Fuzz target ``name`` in child processes for ``seconds`` of fuzzing in all.

    A child that crashes, hangs (an input over ``timeout`` s) or goes over
    ``rss_limit_mb`` is a finding (its input saved in ``out/name``); another child
    goes on for the time left. Returns the merged stats.
    """
    workdir = Path(out) / name
    workdir.mkdir(parents=True, exist_ok=True)
    seeds_dir = workdir / "seeds"
    shutil.rmtree(seeds_dir, ignore_errors=True)
    seeds_dir.mkdir()
    for index, data in enumerate(seeds_of(name, fixtures)):
        (seeds_dir / f"seed-{index}").write_bytes(data)
    total = {"target": name, "engine": engine, "inputs": 0, "seconds": 0.0,
             "target_seconds": 0.0,
             "outcomes": Counter(), "classes": {}, "findings": {}, "children": 0}
    recorder = Recorder(name, workdir, timeout, engine)  # for the crash findings
    env = dict(os.environ, ORTLEARN_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH")])))
    left = seconds
    for restart in range(max_restarts + 1):
        if left < 1:
            break
        stats_path, current = workdir / "stats.json", workdir / "current.bin"
        for path in (stats_path, current):
            path.unlink(missing_ok=True)
        log = workdir / f"child-{restart}.log"
        command = [sys.executable, "-m", "benchmarks.fuzz", "--child", name,
                   "--engine", engine, "--seconds", str(left), "--timeout", str(timeout),
                   "--seed", str(seed + restart), "--workdir", str(workdir),
                   "--fixtures", str(fixtures)]
        with open(log, "wb") as log_file:
            child = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        total["children"] += 1
        spawned, started, killed = time.monotonic(), None, None
        while child.poll() is None:
            time.sleep(0.2)
            now = time.monotonic()
            if _rss_mb(child.pid) > rss_limit_mb:
                killed = "memory"
            elif started is None:
                if current.exists():
                    started = now
                elif now - spawned > setup_limit:
                    killed = "setup"
            else:
                with contextlib.suppress(OSError):
                    if time.time() - current.stat().st_mtime > timeout:
                        killed = "hang"
                if now - started > left + timeout + 60:
                    killed = "overrun"
            if killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGUSR1)  # the Python stacks into the log
                    time.sleep(1.0)
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                break
        rc = child.returncode
        ran = time.monotonic() - started if started is not None else 0.0
        part = json.loads(stats_path.read_text()) if stats_path.exists() else {}
        _merge(total, part)
        total["seconds"] += ran
        if started is None:
            raise RuntimeError(f"the fuzzing child of {name!r} did not start (exit {rc}):\n"
                               f"{_tail(log)}")
        if killed is None and rc == 0 and part.get("done"):
            break
        data = current.read_bytes() if current.exists() else b""
        if killed == "hang":
            kind, signature = "hang", f"an input ran over {timeout:g} s"
        elif killed == "memory":
            kind, signature = "memory", f"the process went over {rss_limit_mb:g} MB"
        elif killed is not None:
            kind, signature = "hang", f"the child ran over its time ({killed})"
        elif rc is not None and rc < 0:
            kind, signature = "crash", f"signal {signal.Signals(-rc).name}"
        else:
            text = _tail(log, 400)
            reason = ("libFuzzer timeout" if "libFuzzer: timeout" in text
                      else "libFuzzer deadly signal" if "deadly signal" in text
                      else f"exit status {rc}")
            kind = "hang" if "timeout" in reason else "crash"
            signature = reason
        finding = recorder.add_finding(kind, signature, data, _tail(log, 400))
        _merge(total, {"findings": [dict(finding, count=1)]})
        total["outcomes"][f"FINDING {kind}"] += 1
        left -= ran
    total["outcomes"] = dict(total["outcomes"])
    total["findings"] = list(total["findings"].values())
    total["seconds"] = round(total["seconds"], 1)
    total["target_seconds"] = round(total["target_seconds"], 1)
    return total


# ------------------------------------------------------------------------ report

def target_table(stats: dict) -> str:
    name = stats["target"]
    lines = [f"== {name}: {TARGETS[name][0]}",
             f"{'engine':<10}{stats['engine']}", f"{'inputs':<10}{stats['inputs']}",
             f"{'seconds':<10}{stats['seconds']:.1f} (in the target: "
             f"{stats.get('target_seconds', stats['seconds']):.1f})",
             f"{'findings':<10}{len(stats['findings'])}",
             f"{'outcome':<48}{'count':>9}"]
    for label, count in sorted(stats["outcomes"].items(), key=lambda kv: -kv[1]):
        lines.append(f"{label:<48}{count:>9}")
    return "\n".join(lines)


def summary_table(results: list) -> str:
    lines = [f"{'target':<20}{'engine':<9}{'inputs':>9}{'seconds':>9}{'ok':>8}"
             f"{'refused':>9}{'findings':>9}"]
    for s in results:
        ok = s["outcomes"].get("ok", 0)
        refused = sum(c for k, c in s["outcomes"].items()
                      if k != "ok" and not k.startswith("FINDING"))
        lines.append(f"{s['target']:<20}{s['engine']:<9}{s['inputs']:>9}{s['seconds']:>9.1f}"
                     f"{ok:>8}{refused:>9}{len(s['findings']):>9}")
    return "\n".join(lines)


def findings_report(results: list) -> str:
    lines = []
    for s in results:
        for f in s["findings"]:
            detail = [line for line in f["detail"].strip().splitlines() if line.strip()]
            if f["kind"] != "exception":  # the innermost frame of the child's stack dump
                stack = [i for i, line in enumerate(detail) if line.startswith("Current thread")]
                detail = detail[stack[-1] + 1:stack[-1] + 2] if stack else detail[-1:]
            lines.append(f"FINDING {s['target']}: {f['kind']}: {f['signature']} "
                         f"(x{f['count']}), input {f['input']}")
            if detail:
                lines.append(f"    {detail[-1].strip()[:200]}")
    return "\n".join(lines)


def plot(results: list, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    labels = sorted({k for s in results for k in s["outcomes"]},
                    key=lambda k: (k != "ok", k.startswith("FINDING"), k))
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(results) + 1.8))
    left = [0.0] * len(results)
    # ok green, refusals blues to browns, findings reds
    refusal_colors = ["tab:blue", "lightsteelblue", "tab:purple", "tab:cyan", "tab:gray",
                      "tab:olive", "tab:brown", "tab:pink", "navy", "khaki"]
    finding_colors = plt.get_cmap("Reds")
    findings = [k for k in labels if k.startswith("FINDING")]
    refusals = [k for k in labels if k != "ok" and not k.startswith("FINDING")]
    for label in labels:
        share = [s["outcomes"].get(label, 0) / max(s["inputs"], 1) for s in results]
        if label == "ok":
            color = "tab:green"
        elif label in findings:
            color = finding_colors(0.45 + 0.5 * findings.index(label) / max(len(findings), 1))
        else:
            color = refusal_colors[refusals.index(label) % len(refusal_colors)]
        ax.barh([s["target"] for s in results], share, left=left, label=label, color=color)
        left = [a + b for a, b in zip(left, share)]
    ax.set_xlabel("share of the inputs")
    ax.set_title("Fuzzed inputs: accepted (ok), refused (by class) or findings", fontsize=9)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(fig, path, dpi=120)


def merge_results(path: Path, results: list) -> list:
    """``results`` and the results of the other targets in ``path`` (an earlier run's
    ``fuzz.json``), in the order of :data:`TARGETS`: the last run of each target."""
    names = {s["target"] for s in results}
    try:
        previous = [s for s in json.loads(path.read_text()) if s["target"] not in names
                    and s["target"] in TARGETS]
    except (OSError, ValueError, TypeError, KeyError):
        previous = []
    order = list(TARGETS)
    return sorted(previous + results, key=lambda s: order.index(s["target"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60,
                        help="seconds of fuzzing per target")
    parser.add_argument("--timeout", type=float, default=10,
                        help="an input running longer is a hang")
    parser.add_argument("--targets", nargs="+", choices=sorted(TARGETS), default=None)
    parser.add_argument("--engine", choices=["auto", "atheris", "builtin"], default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rss-limit-mb", type=float, default=2048)
    parser.add_argument("--out", default="benchmark_results/fuzz")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--fixtures", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if atheris_available() else "builtin"
    elif engine == "atheris" and not atheris_available():
        parser.error("atheris is not installed (pip install atheris)")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    fixtures = build_fixtures(out / "fixtures")
    fixtures_dir = next(iter(fixtures.values())).parent
    results = []
    for name in args.targets or list(TARGETS):
        stats = fuzz_target(name, fixtures_dir, out, seconds=args.seconds,
                            timeout=args.timeout, engine=engine, seed=args.seed,
                            rss_limit_mb=args.rss_limit_mb)
        results.append(stats)
        print(target_table(stats), flush=True)
        print(flush=True)
    print(summary_table(results))
    report = findings_report(results)
    if report:
        print()
        print(report)
    everything = merge_results(out / "fuzz.json", results)
    (out / "fuzz.json").write_text(json.dumps(everything, indent=1))
    if plot(everything, out / "fuzz.png"):
        print(f"plot written to {out / 'fuzz.png'}")
    else:
        print("matplotlib is not installed: no plot")
    return 1 if any(s["findings"] for s in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
