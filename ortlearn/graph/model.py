"""Models, values and nodes: what every module that reads or writes ONNX graphs shares.

The opset and IR version ortlearn writes, the dtype maps, loading,
finalising and pruning models, the type and shape of values, the attributes
and inputs of nodes, the values known before running.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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


def check_model(model: onnx.ModelProto, full_check: bool = False) -> None:
    """:func:`onnx.checker.check_model`, but for :data:`TOLERATED_DEPRECATED_OPS`.

    When the checker rejects only an operator version listed there as
    deprecated, the rest of the model is checked again, on a copy where
    those nodes belong to a domain the checker does not know (it checks
    their names and wiring, not their schema). Any other error raises, as
    does a deprecation of another operator.
    """
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


#: Element types of the initializers that can be trained.
TRAINABLE_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)


def get_train_initializer(onx) -> list[str]:
    """Names of the initializers of ``onx`` that can be trained.

    An initializer can be trained when its element type is a float type
    (float16, float32, float64); integer tensors (shapes, axes, class labels)
    are not weights. Nor is a float initializer that every node reads
    through an input carrying no gradient (a Dropout ratio, a shape, axes,
    BatchNormalization's running statistics:
    :func:`~ortlearn.graph.prepare.constant_initializers`). Constants written
    as ``Constant`` nodes are never listed: that is how ortlearn freezes a
    value.

    Parameters
    ----------
    onx : onnx.ModelProto, bytes or path
        The model.

    Returns
    -------
    list of str
        Initializer names, in the order of ``onx.graph.initializer``.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LinearRegression
    >>> from skl2onnx import to_onnx
    >>> X = np.random.rand(20, 3).astype(np.float32)
    >>> lr = LinearRegression().fit(X, X.sum(axis=1))
    >>> onx = to_onnx(lr, X, black_op={'LinearRegressor'})
    >>> get_train_initializer(onx)
    ['coef', 'intercept']
    """
    # prepare.py builds on this module: imported here, when both are loaded
    from .prepare import constant_initializers

    model = onx if isinstance(onx, onnx.ModelProto) else load_model(onx)
    constants = constant_initializers(model)
    return [init.name for init in model.graph.initializer
            if init.data_type in TRAINABLE_TYPES and init.name not in constants]


def initializer_map(graph: onnx.GraphProto) -> dict[str, TensorProto]:
    return {init.name: init for init in graph.initializer}


def initializers_to_inputs(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Turn the initializers ``names`` of ``model`` into graph inputs, in place.

    Returns their values, in the order of ``names`` (feeds for a session).
    """
    graph = model.graph
    wanted = set(names)
    values, kept = {}, []
    for init in graph.initializer:
        if init.name in wanted:
            values[init.name] = numpy_helper.to_array(init)
            graph.input.append(helper.make_tensor_value_info(init.name, init.data_type,
                                                             list(init.dims)))
        else:
            kept.append(init)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return {name: values[name] for name in names if name in values}


#: ai.onnx operators whose first output has the element type and shape of their
#: first input. :func:`value_info_map` gives them to it where onnx's shape
#: inference does not (onnx 1.23: none for GroupNormalization, no shape for
#: MeanVarianceNormalization), and :func:`~ortlearn.graph.refine_shapes`
#: propagates the shape.
OUTPUT_LIKE_INPUT0 = frozenset((
    "Abs", "Acos", "Asin", "Atan", "BatchNormalization", "Ceil", "Celu", "Clip", "Cos",
    "Cosh", "Dropout", "Elu", "Erf", "Exp", "Floor", "Gelu", "GroupNormalization",
    "HardSigmoid", "HardSwish", "Identity", "InstanceNormalization", "LayerNormalization",
    "LeakyRelu", "Log", "LogSoftmax", "LpNormalization", "MeanVarianceNormalization",
    "Mish", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin",
    "Sinh", "Softmax", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu",
))


def _typed(info: onnx.ValueInfoProto | None) -> bool:
    """Whether ``info`` gives an element type and a rank."""
    return info is not None and bool(elem_type_of(info)) and shape_of(info) is not None


#: A 1-D value longer than this is hidden from onnx's data propagation
#: (:func:`_infer_shapes`). onnx 1.23 propagates a 1-D tensor of static length
#: as one TensorShapeProto dimension per element through every elementwise
#: node, Concat, Slice...: about 1 KB and 2.5 us per element, 2.2 GB and 5 s
#: for the flat weights (2 million) of a fused step. Shape tensors, the
#: values data propagation is for, have one element per axis.
LONG_VECTOR = 4096


def _long_vectors(model: onnx.ModelProto) -> tuple[dict, dict]:
    """``{value: info}`` of the 1-D values longer than :data:`LONG_VECTOR`, and of
    all values, from shape inference without data propagation (empty where
    that fails)."""
    try:
        plain = _info_table(onnx.shape_inference.infer_shapes(model).graph)
    except Exception:  # shape inference is best effort
        return {}, {}
    long = {}
    for name, info in plain.items():
        dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else ()
        if len(dims) == 1 and dims[0].dim_value > LONG_VECTOR:
            long[name] = info
    return long, plain


def _long_vectors_cut(model: onnx.ModelProto, long: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose nodes read each value of ``long`` from a graph
    input of symbolic length (``<value>.ortlearn_long``) instead."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    g = probe.graph
    cut = set()
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in long:
                node.input[i] = name + ".ortlearn_long"
                cut.add(name)
    for name in sorted(cut):
        g.input.append(helper.make_tensor_value_info(
            name + ".ortlearn_long", elem_type_of(long[name]), [f"ortlearn_long.{name}"]))
    return probe


def _fill_static_dims(model: onnx.ModelProto, long: dict, plain: dict, n_inputs: int) -> None:
    """Undo :func:`_long_vectors_cut` in the inferred ``model``: drop the added
    inputs and give the long values their static length, and any dimension
    that inference left unknown (a slice of a long value) the one ``plain``
    (inference without data propagation) found."""
    g = model.graph
    del g.input[n_inputs:]
    seen = set()
    for info in itertools.chain(g.input, g.value_info, g.output):
        seen.add(info.name)
        if info.name in long:
            info.type.CopyFrom(long[info.name].type)
            continue
        known = plain.get(info.name)
        if not (info.type.HasField("tensor_type") and known is not None
                and known.type.HasField("tensor_type")):
            continue
        dims, static = info.type.tensor_type.shape.dim, known.type.tensor_type.shape.dim
        if len(dims) == len(static):
            for dim, other in zip(dims, static):
                if not dim.HasField("dim_value") and other.HasField("dim_value"):
                    dim.dim_value = other.dim_value  # clears dim_param (a oneof)
    g.value_info.extend(info for name, info in long.items() if name not in seen)


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx's shape inference, completed with :data:`OUTPUT_LIKE_INPUT0`.

    An output of those operators inference leaves without a type (or
    rank) gets its input's; inference then runs again from there, so that
    the nodes downstream get theirs. Long 1-D values (flat weights, their
    gradients) are hidden from data propagation (:data:`LONG_VECTOR`); their
    shapes come from inference without it.
    """
    long, plain = _long_vectors(model)
    if not long:
        return _infer_shapes_completed(model)
    inferred = _infer_shapes_completed(_long_vectors_cut(model, long))
    _fill_static_dims(inferred, long, plain, len(model.graph.input))
    return inferred


def _infer_shapes_completed(model: onnx.ModelProto) -> onnx.ModelProto:
    for _ in range(len(model.graph.node) + 1):
        try:
            model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception:  # shape inference is best effort; types come from declarations
            return model
        g = model.graph
        infos = _info_table(g)
        added = []
        for node in g.node:
            if (node.domain in ("", "ai.onnx") and node.op_type in OUTPUT_LIKE_INPUT0
                    and node.input and node.output and node.output[0]
                    and not _typed(infos.get(node.output[0]))
                    and _typed(infos.get(node.input[0]))):
                info = onnx.ValueInfoProto()
                info.CopyFrom(infos[node.input[0]])
                info.name = node.output[0]
                infos[info.name] = info
                added.append(info)
        if not added:
            return model
        names = {i.name for i in added}
        kept = [v for v in g.value_info if v.name not in names]
        del g.value_info[:]
        g.value_info.extend(kept + added)
    return model


def value_info_map(model: onnx.ModelProto, infer: bool = True) -> dict[str, onnx.ValueInfoProto]:
    """Type and shape of every named value (inputs, outputs, intermediates, initializers).

    With ``infer``, onnx's shape inference completes the model's
    declarations, and outputs of :data:`OUTPUT_LIKE_INPUT0` operators it
    leaves untyped get their first input's type and shape.
    """
    if infer:
        model = _infer_shapes(model)
    return _info_table(model.graph)


def _info_table(g: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto]:
    """``{name: value info}``: the declared inputs and outputs over ``value_info``, but
    an untyped declaration (an output declared without type) never hides a typed one."""
    infos = {}
    for v in itertools.chain(g.value_info, g.input, g.output):
        if v.name not in infos or elem_type_of(v):
            infos[v.name] = v
    for init in g.initializer:
        if init.name not in infos:
            infos[init.name] = helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims))
    return infos


def elem_type_of(info: onnx.ValueInfoProto) -> int:
    return info.type.tensor_type.elem_type


def shape_of(info: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """Static shape of a value: ints, symbolic names, None for unknown dims, None if no rank."""
    tt = info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def shape_matches(declared, actual: Sequence[int], symbols: dict | None = None) -> bool:
    """Whether an array shape fits a declared ONNX shape (from :func:`shape_of`).

    None (unknown rank) and None dimensions match anything; a symbolic
    dimension matches any size, the same size wherever the symbol appears
    when a ``symbols`` dict (symbol -> size, filled as it goes) is shared
    across the inputs of one call.
    """
    if declared is None:
        return True
    if len(declared) != len(actual):
        return False
    for dim, size in zip(declared, actual):
        if isinstance(dim, str):
            if symbols is not None and symbols.setdefault(dim, size) != size:
                return False
        elif dim is not None and dim != size:
            return False
    return True


def node_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node reads: its inputs and the outer values its subgraphs (If, Loop, Scan) use."""
    names = {i for i in node.input if i}
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for graph in graphs:
            for sub in graph.node:
                names |= node_reads(sub)
    return names


def attr(node: onnx.NodeProto, name: str, default=None):
    """Value of attribute ``name`` of ``node`` (``default`` when absent)."""
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def optional_input(node: onnx.NodeProto, index: int) -> str | None:
    """Name of input ``index`` of ``node``, None when omitted."""
    return node.input[index] if len(node.input) > index and node.input[index] else None


def constant_values(graph: onnx.GraphProto, wrt: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """Values known before running: initializers that are neither inputs nor in ``wrt``,
    and the outputs of ``Constant`` nodes."""
    inputs = {i.name for i in graph.input}
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer
              if init.name not in inputs and init.name not in wrt}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            a = node.attribute[0]
            if a.name == "value":
                values[node.output[0]] = numpy_helper.to_array(a.t)
            elif a.name in ("value_float", "value_int", "value_floats", "value_ints"):
                values[node.output[0]] = np.asarray(helper.get_attribute_value(a))
    return values


def needed_nodes(nodes: Sequence[onnx.NodeProto], outputs: Sequence[str]) -> list:
    """The nodes (in their order) that computing ``outputs`` needs."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed |= node_reads(node)
    kept.reverse()
    return kept


def prune_model(model: onnx.ModelProto, outputs: Sequence[str],
                weights: dict | None = None) -> onnx.ModelProto:
    """The part of ``model`` that computes ``outputs``, ``weights`` baked in.

    ``outputs`` may name any value of the graph, not only its outputs. Each
    entry of ``weights`` (name -> array) becomes an initializer, replacing
    the graph input or initializer of that name; inputs and initializers
    that no kept node reads are dropped.

    Raises
    ------
    ValueError
        If ``outputs`` is empty or names a value the graph does not have.
    """
    weights = weights or {}
    if not outputs:
        raise ValueError("No output to keep: name at least one output.")
    infos = value_info_map(model)
    unknown = [n for n in outputs if n not in infos]
    if unknown:
        raise ValueError(f"{unknown} are not values of the model; its outputs are "
                         f"{[o.name for o in model.graph.output]}.")
    graph = model.graph
    kept = needed_nodes(graph.node, outputs)
    needed = set(outputs)
    for node in kept:
        needed |= node_reads(node)
    inputs = [i for i in graph.input if i.name in needed and i.name not in weights]
    initializers = [numpy_helper.from_array(np.asarray(value), name)
                    for name, value in weights.items() if name in needed]
    initializers += [i for i in graph.initializer if i.name in needed and i.name not in weights]
    new_outputs = []
    for name in outputs:
        info = onnx.ValueInfoProto()
        info.CopyFrom(infos[name])
        new_outputs.append(info)
    new_graph = helper.make_graph(kept, graph.name, inputs, new_outputs, initializers)
    pruned = helper.make_model(new_graph, opset_imports=list(model.opset_import),
                               producer_name="ortlearn")
    pruned.functions.extend(model.functions)
    return finalize_model(pruned)


def rename_value(model: onnx.ModelProto, old: str, new: str) -> None:
    """Rename a value: its producer or graph input, its readers, graph outputs, value infos."""
    for node in model.graph.node:
        for seq in (node.input, node.output):
            for i, name in enumerate(seq):
                if name == old:
                    seq[i] = new
    for info in itertools.chain(model.graph.input, model.graph.output,
                                model.graph.value_info):
        if info.name == old:
            info.name = new


#: ``metadata_props`` key listing the inputs that hold class indices
#: (``{input: {"n_classes": int or null, "ignore_index": int or null}}``, JSON):
#: written by the cross-entropy losses, read where labels enter from the host.
CLASS_LABELS_KEY = "ortlearn.class_labels"


def class_label_marks(model: onnx.ModelProto) -> dict:
    """``{input: (n_classes or None, ignore_index or None)}``, from :func:`mark_class_labels`."""
    import json

    for prop in model.metadata_props:
        if prop.key == CLASS_LABELS_KEY:
            try:
                marks = json.loads(prop.value)
                return {name: (m.get("n_classes"), m.get("ignore_index"))
                        for name, m in marks.items()}
            except (ValueError, AttributeError):
                return {}  # a foreign or damaged entry: no check rather than a failure
    return {}


def mark_class_labels(model: onnx.ModelProto, label: str, n_classes: int | None,
                      ignore_index: int | None = None) -> None:
    """Record in ``model.metadata_props`` that the input ``label`` holds class indices.

    Parameters
    ----------
    model : onnx.ModelProto
        Modified in place.
    label : str
        The graph input holding the class indices.
    n_classes : int or None
        Number of classes (labels lie in ``[0, n_classes)``), None when the
        graph does not fix it.
    ignore_index : int, default=None
        A label value the loss skips, allowed outside the range.
    """
    import json

    marks = {name: {"n_classes": n, "ignore_index": i}
             for name, (n, i) in class_label_marks(model).items()}
    marks[label] = {"n_classes": None if n_classes is None else int(n_classes),
                    "ignore_index": None if ignore_index is None else int(ignore_index)}
    value = json.dumps(marks, sort_keys=True)
    for prop in model.metadata_props:
        if prop.key == CLASS_LABELS_KEY:
            prop.value = value
            return
    model.metadata_props.add(key=CLASS_LABELS_KEY, value=value)


#: Prefix of the names of the nodes :func:`guard_class_labels` adds (then the input's name).
CLASS_LABEL_GUARD = "ortlearn.class_label_guard."


def guard_class_labels(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` whose marked class-label inputs make the run fail when out of range.

    Labels that pass through Python are checked on the host
    (:func:`ortlearn.training.checks.check_class_labels`); labels fed as
    OrtValues may live on a device, where reading them back each step would
    cost a synchronisation. The graph checks those: each input recorded by
    :func:`mark_class_labels` goes through a ``Reshape`` to its own shape
    when every label lies in ``[0, n_classes)`` (or is the ``ignore_index``),
    and to an impossible shape otherwise, so that onnxruntime stops the run
    before any loss reads a wrapped-around index. The failing node is named
    ``CLASS_LABEL_GUARD + input`` for the caller to turn the error into a
    ``ValueError``. An unknown ``n_classes`` checks the sign only.

    Returns
    -------
    onnx.ModelProto
        ``model`` itself when it has no marked integer input, else a copy.
    """
    inputs = {i.name: i for i in model.graph.input}
    marks = {name: mark for name, mark in class_label_marks(model).items()
             if name in inputs and elem_type_of(inputs[name]) in (TensorProto.INT64,
                                                                   TensorProto.INT32)}
    if not marks or not model.graph.node:
        return model
    guarded = onnx.ModelProto()
    guarded.CopyFrom(model)
    graph = guarded.graph
    nodes, renamed = [], {}
    for name, (n_classes, ignore_index) in marks.items():
        label_dtype = onnx_to_np_dtype(elem_type_of(inputs[name]))
        prefix = CLASS_LABEL_GUARD + name

        def const(value, suffix, dtype=label_dtype):
            nodes.append(helper.make_node(
                "Constant", [], [f"{prefix}.{suffix}"], name=f"{prefix}.{suffix}",
                value=numpy_helper.from_array(np.array(value, dtype=dtype))))
            return f"{prefix}.{suffix}"

        def op(op_type, args, suffix, **kwargs):
            nodes.append(helper.make_node(op_type, args, [f"{prefix}.{suffix}"],
                                          name=f"{prefix}.{suffix}", **kwargs))
            return f"{prefix}.{suffix}"

        bad = op("Less", [name, const(0, "zero")], "negative")
        if n_classes is not None:
            bad = op("Or", [bad, op("GreaterOrEqual", [name, const(n_classes, "n")], "high")],
                     "outside")
        if ignore_index is not None:
            ignored = op("Equal", [name, const(ignore_index, "ignore")], "ignored")
            bad = op("And", [bad, op("Not", [ignored], "kept")], "bad")
        count = op("ReduceSum", [op("Cast", [bad], "as_int", to=TensorProto.INT64)], "count",
                   keepdims=0)
        flag = op("Min", [count, const(1, "one", np.int64)], "flag")
        # flag 0: the input's own shape; flag 1: every dimension d becomes 2d + 1,
        # which no tensor of the input's size can take.
        shape = op("Shape", [name], "shape")
        target = op("Add", [shape, op("Mul", [flag, op("Add", [shape, const(1, "one_dim",
                                                                              np.int64)],
                                                        "grown")], "excess")], "target")
        nodes.append(helper.make_node("Reshape", [name, target], [prefix], name=prefix))
        renamed[name] = prefix
    _rename_inputs(graph, renamed)
    old = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + old)
    return guarded


def _rename_inputs(graph: onnx.GraphProto, renamed: dict) -> None:
    """Make the nodes of ``graph`` (and of its subgraphs) read ``renamed[x]`` for ``x``."""
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                _rename_inputs(sub, renamed)
