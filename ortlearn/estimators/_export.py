"""Training artifacts of an estimator: what ``export_artifacts`` writes.

An estimator's loss graph, its update rule, its current weights and its
optimizer state become the four files of
:func:`ortlearn.artifacts.generate_artifacts` (written by
:func:`ortlearn.artifacts.export_training_artifacts`, the same code), so a
training started with ``fit``/``partial_fit`` goes on with
:mod:`ortlearn.api` (or :class:`ortlearn.TrainingSession`), step for step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from sklearn.base import clone, is_classifier
from sklearn.exceptions import NotFittedError

from ..artifacts import export_training_artifacts
from ..fileio import save_model
from ..graph import elem_type_of, opset_of, shape_of
from ..graph.passes import CHEAPER_NODES, GPU_NODES, PROVIDER_NODES, rewrite_model
from ..optim import build_optimizer_model, unpack_optimizer_model
from ..training.layout import read_layout
from ..training.sparse import is_sparse
from ..web import find_js_dir, write_page
from ._objective import LOSS, SAMPLE_WEIGHT

__all__ = ["export_estimator_artifacts", "export_estimator_web"]


def _initialized_copy(estimator, X, y):
    """A clone of ``estimator`` initialised as ``fit(X, y)`` would start, before any epoch."""
    est = clone(estimator)
    X, y = est._validate_xy(X, y, reset=True)
    est._dtype = np.dtype(X.dtype)
    if is_classifier(est):
        est._prepare_classes(y, None, False, True)
    est._initialize(X.astype(est._dtype, copy=False), y)
    est._schedule = est._make_schedule()
    return est


def _fresh_optimizer_state(est, weights: dict) -> dict:
    """The optimizer state ``fit`` starts from: zeros, no step, the first learning rate."""
    # the rate of fit's first update, of the rows a batch of the estimator holds
    lr_epoch, lr_for_step = est._learning_rates([est._update_rows], 1)
    lr = lr_epoch if lr_epoch is not None else lr_for_step(1)
    optimizer = est._optimizer()
    return {"states": {p: optimizer.init_state(w) for p, w in weights.items()}, "step": 0,
            "learning_rate": float(lr)}


def export_estimator_artifacts(estimator, directory, X=None, y=None, weighted=None,
                               prefix: str = "", passes=CHEAPER_NODES) -> None:
    """What :meth:`BaseOrtEstimator.export_artifacts` does (see its docstring)."""
    fitted = hasattr(estimator, "estimator_")
    if not fitted and X is None:
        raise NotFittedError(
            f"This {type(estimator).__name__} instance is not fitted yet: call fit or "
            "partial_fit before export_artifacts, or pass X and y to export the initial "
            "weights fit would start from.")
    if fitted and X is not None:
        raise ValueError("X and y are only used by an unfitted estimator (to initialise its "
                         "weights as fit would); this one is fitted.")
    if getattr(estimator, "solver", None) == "lbfgs":
        raise ValueError("solver='lbfgs' has no optimizer model to export; use 'sgd', "
                         "'adam' or 'adamw'.")
    est = estimator if fitted else _initialized_copy(estimator, X, y)
    if weighted is None:
        engine = est._runtime.engine
        weighted = engine is not None and SAMPLE_WEIGHT in engine.input_names
    model, trainable = est._loss_model(weighted=bool(weighted), values=True)
    weights = est.get_state()
    state = est._optimizer_state
    if state is None:
        state = _fresh_optimizer_state(est, weights)
    export_training_artifacts(model, trainable, est._optimizer(), directory,
                              weights=weights, optimizer_state=state, loss_output=LOSS,
                              prefix=prefix, passes=passes)


def _web_optimizer_model(est, directory) -> onnx.ModelProto:
    """The optimizer model of the page: onnxruntime's JavaScript API feeds no tensor sequences,
    and each tensor crossing into it costs microseconds, so the flat layout where the update
    allows it (three vectors a step), else the tensor layout. With float32 parameters, its
    step scalars (the learning rate, the bias corrections) are computed in float32:
    onnxruntime-web's WebGPU build has no float64 kernel, not even on its CPU provider."""
    directory = Path(directory)
    written = onnx.load(directory / "optimizer_model.onnx")
    training = onnx.load(directory / "training_model.onnx")
    declared = {i.name: i for i in training.graph.input}
    params = {p: (elem_type_of(declared[p]), shape_of(declared[p]))
              for p in read_layout(training, "training").trainable}
    try:
        model = build_optimizer_model(est._optimizer(), params, layout="flat",
                                      opset=opset_of(written))
    except ValueError:  # an update not element by element, mixed dtypes: one tensor a parameter
        model = unpack_optimizer_model(written)
    if all(elem == TensorProto.FLOAT for elem, _ in params.values()):
        _float64_in_float32(model.graph)
    return model


def _float64_in_float32(graph: onnx.GraphProto) -> None:
    """The float64 arithmetic of ``graph`` carried out in float32, in place: its casts to
    float64, constants, initializers and declared values (subgraphs included)."""
    for node in graph.node:
        for attribute in node.attribute:
            if node.op_type == "Cast" and attribute.name == "to" \
                    and attribute.i == TensorProto.DOUBLE:
                attribute.i = TensorProto.FLOAT
            elif attribute.type == onnx.AttributeProto.TENSOR \
                    and attribute.t.data_type == TensorProto.DOUBLE:
                attribute.t.CopyFrom(_as_float32(attribute.t))
            elif attribute.type == onnx.AttributeProto.GRAPH:
                _float64_in_float32(attribute.g)
    for init in graph.initializer:
        if init.data_type == TensorProto.DOUBLE:
            init.CopyFrom(_as_float32(init))
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type == TensorProto.DOUBLE:
            value.type.tensor_type.elem_type = TensorProto.FLOAT


def _as_float32(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)


def _without_float64(path: Path) -> bool:
    """Whether the model at ``path`` holds no float64 value (the WebGPU build can run it)."""
    model = onnx.load(path)
    demoted = onnx.ModelProto()
    demoted.CopyFrom(model)
    _float64_in_float32(demoted.graph)
    return demoted == model


def export_estimator_web(estimator, directory, X, y, X_test=None, y_test=None, *, epochs=5,
                         js_dir=None) -> Path:
    """What :meth:`BaseOrtEstimator.export_web` does (see its docstring)."""
    if (X_test is None) != (y_test is None):
        raise ValueError("Give both X_test and y_test, or neither.")
    if not (isinstance(epochs, int) and epochs >= 1):
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}.")
    js_dir = find_js_dir(js_dir)
    fitted = hasattr(estimator, "estimator_")
    if not fitted and X is None:
        raise NotFittedError(f"This {type(estimator).__name__} instance is not fitted yet: "
                             "call fit before export_web, or pass the X and y it starts from.")
    est = estimator if fitted else _initialized_copy(estimator, X, y)
    data = {}  # checked before anything is written
    for part, (features, target) in {"train": (X, y), "test": (X_test, y_test)}.items():
        if features is None:
            continue
        features, target = est._validate_xy(features, target, reset=False)
        if is_sparse(features):
            raise ValueError(f"X_{part} is sparse: the page trains on dense rows; pass "
                             "X.toarray() (or a dense slice) to export_web.")
        data[f"X_{part}"] = est._as_model_dtype(features)
        data[f"y_{part}"] = est._encode_target(target)
    # float32 models run on the WebGPU build: no operator it lacks (Sum, LogSoftmax, Mod,
    # Size, a column sum's ones), each would cross to the CPU and back at every step
    float32 = data["X_train"].dtype == np.float32
    export_estimator_artifacts(estimator, directory, None if fitted else X,
                               None if fitted else y, weighted=False,
                               passes=GPU_NODES if float32 else CHEAPER_NODES)
    path = Path(directory) / "optimizer_model.onnx"
    save_model(_web_optimizer_model(est, directory), path, what="the optimizer model")
    webgpu = all(_without_float64(Path(directory) / name) for name in
                 ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"))
    if webgpu:
        path = Path(directory) / "eval_model.onnx"
        save_model(rewrite_model(onnx.load(path), PROVIDER_NODES), path, what="the eval model")
    kind = est._kind()
    task = {
        "estimator": type(est).__name__,
        "kind": kind,
        "classes": est.classes_.tolist() if is_classifier(est) else None,
        "prediction": est._output_names()[-1],
        "epochs": epochs,
        "batch_size": est._batch_size(len(data["X_train"]), warn=False),
        "shuffle": bool(getattr(est, "shuffle", True)),
        # the WebGPU build runs float32 models only
        "webgpu": webgpu,
    }
    return write_page(directory, data, task, js_dir=js_dir)
