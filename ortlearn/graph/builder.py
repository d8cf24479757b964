"""The public builder of ONNX nodes that gradient rules, losses and optimizers append to."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .model import DEFAULT_OPSET, MIN_OPSET, opset_of

__all__ = ["GraphBuilder"]


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

    def take(self, first: int = 0) -> list:
        """The nodes built from position ``first`` on, taken out of the builder.

        The constants among them are forgotten: nodes taken out may land anywhere
        in a graph, and a later :meth:`const` emits its own rather than reading one
        of theirs.
        """
        taken = self.nodes[first:]
        del self.nodes[first:]
        names = {o for node in taken for o in node.output}
        self._const_cache = {k: v for k, v in self._const_cache.items() if v not in names}
        return taken

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
