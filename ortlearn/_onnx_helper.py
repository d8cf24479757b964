"""Small helpers shared by every module that builds ONNX graphs.

One place for: the opset and IR version ortlearn writes, the dtype maps, a
:class:`GraphBuilder` that emits nodes with unique names (and knows which
form of an operator the opset wants), and model finalisation/validation.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Sequence

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


def opset_of(model: onnx.ModelProto, domain: str = "") -> int | None:
    """Version of ``domain`` imported by ``model`` (None when absent)."""
    for imp in model.opset_import:
        if imp.domain in (domain, "ai.onnx" if domain == "" else domain):
            return imp.version
    return None


def finalize_model(model: onnx.ModelProto, check: bool = True) -> onnx.ModelProto:
    """Set the smallest IR version the opsets need, then check the model.

    onnx >= 1.23 writes IR 14 by default, which onnxruntime 1.31 refuses;
    every model ortlearn writes goes through here.
    """
    model.ir_version = max(helper.find_min_ir_version_for(list(model.opset_import)), 7)
    if check:
        onnx.checker.check_model(model)
    return model


def make_model(graph: onnx.GraphProto, opset_imports: Sequence, **kwargs) -> onnx.ModelProto:
    """``helper.make_model`` + :func:`finalize_model` (opsets as ids or a model's list)."""
    opsets = [helper.make_opsetid(o.domain, o.version) for o in opset_imports]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="ortlearn", **kwargs)
    return finalize_model(model)


def load_model(model) -> onnx.ModelProto:
    """Accept a ModelProto, serialized bytes or a path; always return a copy."""
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
    the model when :func:`onnx.checker.check_model` rejects it (a ValueError
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
            onnx.checker.check_model(load_model(model))
        except Exception as invalid:
            raise ValueError(f"{what} is not a valid ONNX model: {invalid}") from exc
        raise


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


def value_info_map(model: onnx.ModelProto, infer: bool = True) -> dict[str, onnx.ValueInfoProto]:
    """Type and shape of every named value (inputs, outputs, intermediates, initializers)."""
    if infer:
        try:
            model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception:  # shape inference is best effort; types come from declarations
            pass
    g = model.graph
    infos = {v.name: v for v in itertools.chain(g.value_info, g.input, g.output)}
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


class GraphBuilder:
    """Append nodes to a graph under construction, with unique names.

    Parameters
    ----------
    opset : int
        Version of the ai.onnx domain of the target model: :meth:`reduce`,
        :meth:`split` and friends emit the form that version wants.
    used_names : iterable of str
        Names already present in the graph (never reused).
    prefix : str
        Prefix of every generated name, which keeps generated values apart
        from the user's.

    Examples
    --------
    >>> b = GraphBuilder(opset=18, prefix="loss_")
    >>> d = b.op("Sub", ["pred", "label"])
    >>> sq = b.op("Mul", [d, d])
    >>> out = b.reduce("ReduceMean", sq, keepdims=0)
    >>> [n.op_type for n in b.nodes]
    ['Sub', 'Mul', 'ReduceMean']
    """

    def __init__(self, opset: int = DEFAULT_OPSET, used_names: Iterable[str] = (),
                 prefix: str = ""):
        if opset < MIN_OPSET:
            raise ValueError(f"ortlearn needs ai.onnx opset >= {MIN_OPSET}, the model has {opset}.")
        self.opset = opset
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self._used = set(used_names)
        self._counter = itertools.count()
        self._const_cache: dict[tuple, str] = {}

    @classmethod
    def for_model(cls, model: onnx.ModelProto, prefix: str = "") -> GraphBuilder:
        """A builder for nodes to be added to ``model`` (its opset, its names)."""
        g = model.graph
        names = {v.name for v in itertools.chain(g.input, g.output, g.initializer, g.value_info)}
        for node in g.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
        return cls(opset=opset_of(model) or DEFAULT_OPSET, used_names=names, prefix=prefix)

    def unique_name(self, hint: str) -> str:
        base = f"{self.prefix}{hint}"
        name = base
        while name in self._used:
            name = f"{base}_{next(self._counter)}"
        self._used.add(name)
        return name

    def reserve(self, name: str) -> str:
        """Claim an exact name (for outputs whose name is part of an API)."""
        if name in self._used:
            raise ValueError(f"Name {name!r} is already used in the graph.")
        self._used.add(name)
        return name

    def op(self, op_type: str, inputs: Sequence[str], n_outputs: int = 1,
           outputs: Sequence[str] | None = None, domain: str = "", **attrs):
        """Add one node; return its output name (or list of names if ``n_outputs > 1``)."""
        if outputs is None:
            outputs = [self.unique_name(f"{op_type}_out") for _ in range(n_outputs)]
        node = helper.make_node(op_type, list(inputs), list(outputs),
                                name=self.unique_name(op_type), domain=domain or None, **attrs)
        self.nodes.append(node)
        return outputs[0] if len(outputs) == 1 and n_outputs == 1 else list(outputs)

    def const(self, value, dtype=None, hint: str = "const") -> str:
        """A ``Constant`` node holding ``value`` (cached: each constant is emitted once).

        Constants are nodes, never initializers, so that they are never
        mistaken for trainable weights (see ``get_train_initializer``).
        """
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._const_cache:
            name = self.unique_name(hint)
            self.op("Constant", [], outputs=[name], value=numpy_helper.from_array(arr, name))
            self._const_cache[key] = name
        return self._const_cache[key]

    def ints(self, values: Sequence[int], hint: str = "axes") -> str:
        return self.const(np.asarray(list(values), dtype=np.int64), hint=hint)

    # Operators whose signature changed across the supported opsets.
    def reduce(self, op_type: str, x: str, axes: Sequence[int] | str | None = None,
               keepdims: int = 1, output: str | None = None, **attrs) -> str:
        """Reduce* with ``axes`` as input or attribute as the opset requires.

        ``axes=None`` reduces over every axis. ``axes`` may be the name of an
        int64 tensor (dynamic axes, input form only).
        """
        input_form = op_type == "ReduceSum" or self.opset >= 18
        outputs = [output] if output else None
        if axes is None:
            return self.op(op_type, [x], outputs=outputs, keepdims=keepdims, **attrs)
        if isinstance(axes, str):
            if not input_form:
                raise ValueError(f"{op_type} takes dynamic axes from opset 18 on.")
            return self.op(op_type, [x, axes], outputs=outputs, keepdims=keepdims, **attrs)
        if input_form:
            return self.op(op_type, [x, self.ints(axes)], outputs=outputs, keepdims=keepdims,
                           **attrs)
        return self.op(op_type, [x], outputs=outputs, axes=list(axes), keepdims=keepdims, **attrs)

    def squeeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Squeeze", [x, self.ints(axes)])

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Unsqueeze", [x, self.ints(axes)])

    def cast(self, x: str, to: int) -> str:
        return self.op("Cast", [x], to=to)

    def add_to_graph(self, graph: onnx.GraphProto) -> None:
        """Append the nodes built so far to ``graph`` (and start a new batch)."""
        graph.node.extend(self.nodes)
        self.nodes = []
        self._const_cache.clear()


def _subgraph_inputs(node: onnx.NodeProto) -> set:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from outer scopes."""
    names = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            for sub in graph.node:
                names.update(sub.input)
                names.update(_subgraph_inputs(sub))
    return names


def needed_nodes(nodes: Sequence[onnx.NodeProto], outputs: Sequence[str]) -> list:
    """The nodes (in their order) that computing ``outputs`` needs."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(n for n in node.input if n)
            needed.update(_subgraph_inputs(node))
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
        needed.update(n for n in node.input if n)
        needed.update(_subgraph_inputs(node))
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
