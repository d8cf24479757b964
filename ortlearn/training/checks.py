"""The argument checks of the runtime: weights, data inputs, loss output, states, rates.

Each check raises a ``ValueError`` (or ``TypeError``) naming the problem and
what the graph offers instead; the engine, L-BFGS and the estimators share
them.
"""

from __future__ import annotations

import contextlib
import math
import re

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from ..autodiff import check_scalar_loss
from ..exceptions import TrainingApiValueError
from ..graph import (
    CLASS_LABEL_GUARD,
    FLOAT_TYPES,
    is_weight_stub,
    onnx_to_np_dtype,
    shape_of,
    value_info_map,
)

__all__ = [
    "check_class_labels",
    "memory_errors",
    "run_errors",
    "check_label_values",
    "check_input_names",
    "check_learning_rate",
    "check_learning_rates",
    "check_loss_output",
    "check_trainable",
    "conform_state",
    "data_inputs",
    "initial_values",
    "replace_initializers",
]


def check_trainable(model: onnx.ModelProto, trainable) -> list[str]:
    """``trainable`` as a list: names of distinct float initializers of ``model``."""
    if isinstance(trainable, str) or not trainable:
        raise ValueError(f"trainable must be a non-empty list of initializer names, "
                         f"got {trainable!r}.")
    trainable = list(trainable)
    inits = {i.name: i for i in model.graph.initializer}
    unknown = [n for n in trainable if n not in inits]
    if unknown:
        floats = [n for n, i in inits.items() if i.data_type in FLOAT_TYPES]
        raise ValueError(f"Unknown weights {unknown}: the graph's float initializers are "
                         f"{floats}.")
    not_float = [n for n in trainable if inits[n].data_type not in FLOAT_TYPES]
    if not_float:
        raise ValueError(f"Weights {not_float} are not float32/float64 initializers and "
                         "cannot be trained.")
    duplicated = sorted({n for n in trainable if trainable.count(n) > 1})
    if duplicated:
        raise ValueError(f"Weights {duplicated} are listed more than once.")
    return trainable


def data_inputs(model: onnx.ModelProto) -> list[str]:
    """The graph inputs that are not initializers, in graph order."""
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def check_input_names(model: onnx.ModelProto, input_names) -> list[str]:
    """``input_names`` (None: :func:`data_inputs`), each data input of the graph once."""
    data = data_inputs(model)
    if input_names is None:
        return data
    names = list(input_names)
    unknown = [n for n in names if n not in data]
    missing = [n for n in data if n not in names]
    if unknown or missing or len(set(names)) != len(names):
        raise ValueError(f"input_names {names} must list each data input of the graph "
                         f"once: unknown {unknown}, missing {missing}; the graph's data "
                         f"inputs are {data}.")
    return names


def check_loss_output(model: onnx.ModelProto, loss_output: str) -> bool:
    """ValueError unless the graph has the output ``loss_output``, a scalar.

    Checked on the graph as the user gave it: the graphs built from it for the
    runtime take the data through other inputs and would hide that the loss has
    one value per row. Returns whether its shape proves it one element (False:
    shape inference could not tell, the data will).
    """
    outputs = [o.name for o in model.graph.output]
    if loss_output not in outputs:
        raise ValueError(f"The graph has no output {loss_output!r} (its outputs are "
                         f"{outputs}); add one with ortlearn.add_loss_output.")
    declared = {o.name: o for o in model.graph.output}
    # The declared output type is enough almost always; shape inference (a copy of
    # the model) only when the output has no declared shape.
    infos = (declared if declared[loss_output].type.tensor_type.HasField("shape")
             else value_info_map(model))
    check_scalar_loss(model.graph, loss_output, infos)
    shape = shape_of(infos[loss_output]) if loss_output in infos else None
    return shape is not None and all(isinstance(d, int) for d in shape)


def replace_initializers(model: onnx.ModelProto, weights: dict) -> None:
    """Overwrite initializer values in place (names, shapes and dtypes checked)."""
    inits = {i.name: i for i in model.graph.initializer}
    current = {n: _like(inits[n]) for n in weights if n in inits}
    clean = conform_state(weights, current, partial=True)
    for name, value in clean.items():
        inits[name].CopyFrom(numpy_helper.from_array(value, name))


def initial_values(model: onnx.ModelProto, trainable, initial_weights=None) -> dict:
    """The value each weight of ``trainable`` starts from: its value in ``initial_weights``
    (checked against the initializer's shape, cast to its dtype, not copied when it already
    has it), else the initializer's. A :func:`~ortlearn.graph.weight_stub` (a weight whose
    graph holds no value) must be given one: a large model's weights are then never
    copied into the graph."""
    inits = {i.name: i for i in model.graph.initializer}
    given = conform_state(dict(initial_weights or {}), {n: _like(inits[n]) for n in trainable},
                          partial=True)
    missing = [n for n in trainable if n not in given and is_weight_stub(inits[n])]
    if missing:
        raise ValueError(f"Weights {missing} hold no value in the graph (weight stubs): "
                         "give their values in initial_weights.")
    return {n: given[n] if n in given else numpy_helper.to_array(inits[n]) for n in trainable}


def _like(init: onnx.TensorProto) -> np.ndarray:
    """A read-only array of the initializer's shape and dtype that copies nothing."""
    return np.broadcast_to(np.zeros((), onnx_to_np_dtype(init.data_type)), tuple(init.dims))


def conform_state(state, expected: dict, partial: bool = False) -> dict:
    """``state`` cast to the dtypes of ``expected``; ValueError listing every problem."""
    if not isinstance(state, dict):
        raise TypeError(f"A state is a dict of name -> array, got {type(state).__name__}.")
    problems = []
    unknown = [n for n in state if n not in expected]
    if unknown:
        problems.append(f"unknown weights {unknown} (expected {list(expected)})")
    if not partial:
        missing = [n for n in expected if n not in state]
        if missing:
            problems.append(f"missing weights {missing}")
    clean = {}
    for name, value in state.items():
        if name not in expected:
            continue
        ref = expected[name]
        value = np.asarray(value)
        if value.shape != ref.shape:
            problems.append(f"weight {name!r} has shape {value.shape}, expected {ref.shape}")
            continue
        if not np.issubdtype(value.dtype, np.number):
            problems.append(f"weight {name!r} has non-numeric dtype {value.dtype}")
            continue
        clean[name] = np.ascontiguousarray(value, dtype=ref.dtype)
    if problems:
        raise ValueError("Invalid state: " + "; ".join(problems) + ".")
    return clean


def check_learning_rate(lr) -> float:
    """``lr`` as a float; ValueError unless finite, > 0 and within float32's range.

    The optimizer graphs may take the rate as float32, where a larger value
    becomes infinity and every weight NaN after one step.
    """
    lr = float(lr)
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"The learning rate must be a finite number > 0, got {lr!r}.")
    if lr > FLOAT32_MAX:
        raise ValueError(f"The learning rate {lr!r} overflows float32 (at most "
                         f"{FLOAT32_MAX:.4g}): it would become infinity in the optimizer.")
    return lr


def check_learning_rates(rates) -> np.ndarray:
    """:func:`check_learning_rate` of each of ``rates`` at once: a float64 array."""
    rates = np.asarray(rates, dtype=np.float64)
    bad = ~(np.isfinite(rates) & (rates > 0) & (rates <= FLOAT32_MAX))
    if bad.any():
        check_learning_rate(rates[bad][0])  # raises, naming the rate
    return rates


#: the largest learning rate the optimizer graphs' float32 inputs can hold
FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_class_labels(marks: dict, feeds: dict, what: str) -> None:
    """ValueError naming the labels outside ``[0, n_classes)`` fed to a cross-entropy loss.

    The inputs holding class indices are the ones a cross-entropy loss marked in
    ``model.metadata_props`` (:func:`ortlearn.graph.mark_class_labels`). Without
    the check, such labels give a zero loss (a one-hot product), wrap around to
    the last classes (negative indices) or fail deep inside onnxruntime. The
    cheap path is one min and one max per array; host arrays only: an OrtValue
    already on a device is not read back.

    Parameters
    ----------
    marks : dict
        ``{input: (n_classes, ignore_index)}``, from
        :func:`ortlearn.graph.class_label_marks` of the model.
    feeds : dict of str to array-like
        The inputs by name; names without a mark, and OrtValues, are skipped.
    what : str
        Who receives the inputs, for the message.
    """
    for name, (n_classes, ignore_index) in marks.items():
        value = feeds.get(name)
        if value is None or isinstance(value, ort.OrtValue):
            # An OrtValue may live on a device: not copied back; the graph checks it
            # (ortlearn.graph.guard_class_labels, errors by run_errors).
            continue
        value = np.asarray(value)
        check_label_values(value, n_classes, ignore_index, f"Input {name!r} of {what}")


#: onnxruntime's words when it cannot allocate a buffer (its CPU arena, a device's, new)
_ALLOCATION_FAILURES = ("Failed to allocate memory", "bad_alloc", "bad allocation",
                        "out of memory")


def as_memory_error(error: Exception, what: str, remedy: str) -> MemoryError | None:
    """The MemoryError for ``error`` when onnxruntime could not allocate memory while running
    ``what`` (its own error, a RuntimeError or one of its classes, names only a buffer's
    size), naming ``remedy``; None for another error."""
    message = str(error)
    if not any(words in message for words in _ALLOCATION_FAILURES):
        return None
    size = re.search(r"buffer of size (\d+)", message)
    buffer = f" (a buffer of {int(size.group(1)) / 2**20:.0f} MiB)" if size else ""
    return MemoryError(f"onnxruntime ran out of memory running {what}{buffer}: {remedy}")


@contextlib.contextmanager
def memory_errors(what: str, remedy: str):
    """Raise onnxruntime's failures to allocate memory within as a MemoryError naming
    ``remedy`` (:func:`as_memory_error`); other errors go through."""
    try:
        yield
    except Exception as error:  # onnxruntime's own exception types
        memory = as_memory_error(error, what, remedy)
        if memory is None:
            raise
        raise memory from error


@contextlib.contextmanager
def run_errors(marks: dict, what: str):
    """Turn onnxruntime's failure to run a model into errors that name the cause.

    The failure of a :func:`ortlearn.graph.guard_class_labels` node is a
    ValueError about the labels; another error of onnxruntime at run time (a
    shape the graph does not accept, a model that onnxruntime opens but cannot
    run) a :class:`~ortlearn.exceptions.TrainingApiValueError` (a
    ``RuntimeError`` too, as onnxruntime's) naming the step, with onnxruntime's
    message.

    Parameters
    ----------
    marks : dict
        ``{input: (n_classes, ignore_index)}`` of the model that runs.
    what : str
        Who received the inputs, for the message.
    """
    try:
        yield
    except Exception as error:  # onnxruntime's own exception types
        message = str(error)
        name = next((n for n in marks if f"'{CLASS_LABEL_GUARD}{n}'" in message), None)
        if name is None:
            # ortlearn's own refusals and memory go through; what is left is onnxruntime's
            if isinstance(error, (ValueError, TypeError, MemoryError)):
                raise
            memory = as_memory_error(error, what, "train on smaller batches.")
            if memory is not None:
                raise memory from error
            raise TrainingApiValueError(
                f"onnxruntime could not run {what}: {message.strip().splitlines()[0]} "
                "Check the inputs' shapes and types against the model's inputs "
                "(input_names, and the artifacts' doc/artifacts_format.md), or the model "
                "itself.") from error
        n_classes, ignore_index = marks[name]
        classes = "[0, n_classes)" if n_classes is None else f"[0, {n_classes})"
        ignored = "" if ignore_index is None else f" and are not the ignore_index {ignore_index}"
        raise ValueError(
            f"Input {name!r} of {what} holds class labels outside {classes}{ignored} (checked "
            "in the graph, as the labels came as an OrtValue). Labels must be class indices "
            "of the loss: encode them (e.g. sklearn.preprocessing.LabelEncoder) before "
            "training.") from None


def check_label_values(labels: np.ndarray, n_classes: int | None, ignore_index=None,
                       what: str = "The labels") -> None:
    """ValueError unless ``labels`` are integers in ``[0, n_classes)`` (or ``ignore_index``)."""
    if labels.dtype.kind not in "iuf" or labels.size == 0:
        return
    low, high = labels.min(), labels.max()
    upper = np.inf if n_classes is None else n_classes
    in_range = low >= 0 and high < upper
    integral = labels.dtype.kind != "f" or bool(np.all(np.floor(labels) == labels))
    if in_range and integral:
        return
    bad = ~((labels >= 0) & (labels < upper))
    if labels.dtype.kind == "f":
        bad |= np.floor(labels) != labels
    if ignore_index is not None:
        bad &= labels != ignore_index
    if not bad.any():
        return
    values = np.unique(labels[bad])
    shown = ", ".join(str(v) for v in values[:10].tolist()) + (", ..." if len(values) > 10 else "")
    classes = "[0, n_classes)" if n_classes is None else f"[0, {n_classes})"
    ignored = "" if ignore_index is None else f" or the ignore_index {ignore_index}"
    raise ValueError(
        f"{what} holds class labels outside {classes}{ignored}: {shown} "
        f"({int(bad.sum())} of {labels.size} values). Class labels are integer indices "
        f"of the classes; encode them (e.g. sklearn.preprocessing.LabelEncoder) or fix "
        f"the data.")
