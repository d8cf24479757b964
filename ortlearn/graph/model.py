"""Models: what every module that reads or writes ONNX graphs shares.

The opset and IR version ortlearn writes, the dtype maps, loading, checking
and finalising models. The values of a model are :mod:`~ortlearn.graph.values`'
business, its nodes :mod:`~ortlearn.graph.nodes`'.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

#: ai.onnx opset used for the graphs ortlearn converts from scikit-learn.
#: 18 is the first opset where every Reduce* takes ``axes`` as an input;
#: onnxruntime >= 1.14 runs it.
DEFAULT_OPSET = 18
#: Oldest ai.onnx opset ortlearn differentiates (Squeeze/Unsqueeze/ReduceSum
#: take their axes as inputs from 13 on).
MIN_OPSET = 13
#: ai.onnx.ml opset matching :data:`DEFAULT_OPSET`.
DEFAULT_ML_OPSET = 3

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE)

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.bool_): TensorProto.BOOL,
}
_ONNX_TO_NP = {v: k for k, v in _NP_TO_ONNX.items()}


def np_dtype_to_onnx(dtype) -> int:
    """Return the ``TensorProto`` element type of a numpy dtype."""
    try:
        return _NP_TO_ONNX[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"Unsupported dtype {np.dtype(dtype)!r} for an ONNX tensor.") from None


def onnx_to_np_dtype(elem_type: int) -> np.dtype:
    """Return the numpy dtype of a ``TensorProto`` element type."""
    try:
        return _ONNX_TO_NP[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type)
        raise TypeError(f"Unsupported ONNX element type {name}.") from None


def _domain_key(domain: str) -> str:
    """``''`` and ``'ai.onnx'`` name the same domain."""
    return "" if domain == "ai.onnx" else domain


def opset_of(model: onnx.ModelProto, domain: str = "") -> int | None:
    """Version of ``domain`` imported by ``model`` (None when absent).

    A model may list a domain several times (``''`` and ``'ai.onnx'`` are
    one domain): the highest version is the one its nodes are written for.
    """
    versions = [imp.version for imp in model.opset_import
                if _domain_key(imp.domain) == _domain_key(domain)]
    return max(versions) if versions else None


def merge_opset_imports(model: onnx.ModelProto) -> onnx.ModelProto:
    """Keep one import per domain, at its highest version, in place; return ``model``.

    onnxruntime reads the last import of a domain and onnx's checker the
    first: with the versions merged, both see the one :func:`opset_of` reads.
    """
    highest: dict[str, onnx.OperatorSetIdProto] = {}
    for imp in model.opset_import:
        key = _domain_key(imp.domain)
        if key not in highest or imp.version > highest[key].version:
            highest[key] = imp
    if len(highest) < len(model.opset_import):
        kept = [helper.make_opsetid(imp.domain, imp.version) for imp in highest.values()]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return model


def finalize_model(model: onnx.ModelProto, check: bool = True) -> onnx.ModelProto:
    """Set the smallest IR version the opsets need, then check the model.

    onnx >= 1.23 writes IR 14 by default, which onnxruntime 1.31 refuses;
    every model ortlearn writes goes through here. Domains onnx does not
    know (a custom operator's) do not raise the IR version.
    """
    model.ir_version = max(helper.find_min_ir_version_for(
        list(model.opset_import), ignore_unknown=True), 7)
    if check:
        check_model(model)
    return model


#: ``(domain, op_type)`` of operator versions onnx's checker rejects as
#: deprecated but onnxruntime runs: :func:`check_model` lets them pass.
#: onnx 1.23 deprecates GroupNormalization-18 (scale and bias per group) for
#: GroupNormalization-21 (per channel); torch and older models write it.
TOLERATED_DEPRECATED_OPS = frozenset({("", "GroupNormalization")})

_DEPRECATED = re.compile(r"Op registered for (\w+) is deprecated in domain_version of \d+")
#: Domain the tolerated nodes move to in the copy the checker reads instead.
_UNCHECKED_DOMAIN = "ortlearn.deprecated_unchecked"


def weight_stub(name: str, elem_type: int, shape: Sequence[int]) -> onnx.TensorProto:
    """An initializer of a name, an element type and a shape without values: a weight
    whose value a training session is given apart (see :func:`is_weight_stub`)."""
    return onnx.TensorProto(name=name, data_type=elem_type, dims=shape)


def is_weight_stub(tensor: onnx.TensorProto) -> bool:
    """Whether an initializer is a :func:`weight_stub`: a shape that holds elements and no
    value field (onnx's checker refuses it; :func:`check_model` reads it as an input)."""
    if tensor.data_location == TensorProto.EXTERNAL or not tensor.dims or 0 in tensor.dims:
        return False
    return not {field.name for field, _ in tensor.ListFields()} & _VALUE_FIELDS


_VALUE_FIELDS = frozenset(("raw_data", "float_data", "double_data", "int32_data", "int64_data",
                           "uint64_data", "string_data"))


def check_model(model: onnx.ModelProto, full_check: bool = False) -> None:
    """:func:`onnx.checker.check_model`, but for :data:`TOLERATED_DEPRECATED_OPS` and
    :func:`weight_stub` initializers.

    When the checker rejects only an operator version listed there as
    deprecated, the rest of the model is checked again, on a copy where
    those nodes belong to a domain the checker does not know (it checks
    their names and wiring, not their schema). Any other error raises, as
    does a deprecation of another operator. Weight stubs are checked as the
    graph inputs they stand for, on a copy (small: they hold no values).
    """
    stubs = [i for i in model.graph.initializer if is_weight_stub(i)]
    if stubs:
        model = _stubs_as_inputs(model, stubs)
    tolerated: set[str] = set()
    while True:
        try:
            onnx.checker.check_model(_with_unchecked_ops(model, tolerated) if tolerated
                                     else model, full_check=full_check)
            return
        except onnx.checker.ValidationError as exc:
            match = _DEPRECATED.search(str(exc))
            op = match.group(1) if match else None
            if ("", op) not in TOLERATED_DEPRECATED_OPS or op in tolerated:
                raise
            tolerated.add(op)


def _stubs_as_inputs(model: onnx.ModelProto, stubs: list) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers ``stubs`` are graph inputs."""
    names = {s.name for s in stubs}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    kept = [i for i in graph.initializer if i.name not in names]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    declared = {i.name for i in graph.input}
    graph.input.extend(helper.make_tensor_value_info(s.name, s.data_type, list(s.dims))
                       for s in stubs if s.name not in declared)
    return copy


def _with_unchecked_ops(model: onnx.ModelProto, op_types: set[str]) -> onnx.ModelProto:
    """A copy of ``model`` where the ai.onnx nodes ``op_types`` move to an unknown domain."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graphs = [copy.graph, *copy.functions]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and node.op_type in op_types:
                node.domain = _UNCHECKED_DOMAIN
            graphs.extend(a.g for a in node.attribute if a.HasField("g"))
            graphs.extend(sub for a in node.attribute for sub in a.graphs)
    for owner in (copy, *copy.functions):
        if not any(o.domain == _UNCHECKED_DOMAIN for o in owner.opset_import):
            owner.opset_import.append(helper.make_opsetid(_UNCHECKED_DOMAIN, 1))
    return copy


def make_model(graph: onnx.GraphProto, opset_imports: Sequence, **kwargs) -> onnx.ModelProto:
    """``helper.make_model`` + :func:`finalize_model` (opsets as ids or a model's list)."""
    opsets = [helper.make_opsetid(o.domain, o.version) for o in opset_imports]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="ortlearn", **kwargs)
    return finalize_model(model)


def load_model(model) -> onnx.ModelProto:
    """Accept a ModelProto, serialized bytes or a path; always return a copy.

    A domain imported several times is imported once, at its highest version
    (:func:`merge_opset_imports`).
    """
    return merge_opset_imports(_load(model))


def _load(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(model))
        except Exception as exc:
            raise ValueError(f"The bytes given are not a serialized ONNX model: {exc}") from exc
    if isinstance(model, (str,)) or hasattr(model, "__fspath__"):
        try:
            return onnx.load(model)
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise ValueError(f"{model!s} is not a readable ONNX model: {exc}") from exc
    raise TypeError(
        f"Expected an onnx.ModelProto, bytes or a path, got {type(model).__name__}."
    )


@contextlib.contextmanager
def invalid_model_errors(model, what: str = "The model"):
    """Turn an unexpected failure caused by a malformed input model into a ValueError.

    Code that transforms a user's model runs inside this context. A
    ValueError or TypeError passes through; any other exception is blamed on
    the model when :func:`onnx.checker.check_model` (with shape inference) rejects it (a ValueError
    quoting the checker), and re-raised unchanged otherwise (a bug of ours).
    Valid models pay nothing: the checker only runs after a failure.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or path
        The model as the user gave it (not a copy being modified).
    what : str, default='The model'
        How the error message names the model.

    Examples
    --------
    >>> with invalid_model_errors(b"not a model"):  # doctest: +SKIP
    ...     transform(b"not a model")
    """
    try:
        yield
    except (ValueError, TypeError):
        raise
    except Exception as exc:
        try:
            check_model(load_model(model), full_check=True)
        except Exception as invalid:
            raise ValueError(f"{what} is not a valid ONNX model: {invalid}") from exc
        raise


