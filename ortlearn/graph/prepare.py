"""A graph made ready for differentiation, and the initializers that are constants, not weights.

Exporters write things no gradient rule sees: calls to model-local
functions (``FunctionProto``: the dynamo exporter, ``pkg.*`` domains) and
``If`` nodes whose condition is known before running. :func:`prepare_for_gradient`
inlines the first and folds the second, so that the reverse pass meets
only plain operators.

:data:`NON_DIFFERENTIABLE_INPUTS` says which inputs of an operator carry
no gradient (shapes, axes, ratios, indices, running statistics). It lives
here, on the ground floor, rather than next to the gradient rules of
:mod:`ortlearn.autodiff`: :func:`~ortlearn.graph.get_train_initializer`
(this floor) needs it and may not import a floor above, and it states a
fact about the operators' inputs (what an input *is*), which every rule
must agree with, not how a gradient is computed.

This is not one of the :mod:`~ortlearn.graph.passes` (``pass(nodes, graph)
-> nodes``): inlining rewrites the model's function library and folding
needs the subgraphs, so both work on the whole model.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto, helper, numpy_helper

from .builder import GraphBuilder
from .gathered_sums import gathered_sums_as_reductions
from .model import FLOAT_TYPES, load_model, opset_of
from .nodes import attr, constant_values, readers, rewritten
from .values import shape_of, value_info_map

__all__ = [
    "NON_DIFFERENTIABLE_INPUTS",
    "constant_initializers",
    "fold_constant_ifs",
    "graph_names",
    "inline_functions",
    "prepare_for_gradient",
    "select_trainable",
]

#: ``op_type -> indices of the inputs through which no gradient flows``; None
#: means every input (the output is piecewise constant, or not a number).
#: A float initializer read only through such inputs is a constant, never a
#: weight. ``Clip``'s bounds and ``Pad``'s ``constant_value`` are absent on
#: purpose: the loss does depend on them, and ortlearn differentiates them.
#: ``BatchNormalization``'s ``input_mean`` and ``input_var`` are running
#: statistics: state that a training-mode node updates (as torch's buffers),
#: never what an optimizer moves, whatever the mode.
NON_DIFFERENTIABLE_INPUTS: dict[str, tuple[int, ...] | None] = {
    "Dropout": (1, 2),
    "BatchNormalization": (3, 4),
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
    "Slice": (1, 2, 3, 4), "Split": (1,), "Pad": (1, 3), "TopK": (1,),
    "Resize": (1, 2, 3), "Upsample": (1,), "CumSum": (1,), "Trilu": (1,),
    "Gather": (1,), "GatherElements": (1,), "GatherND": (1,), "Compress": (1,),
    "ScatterElements": (1,), "ScatterND": (1,), "Scatter": (1,),
    **dict.fromkeys(("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                     "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                     "ReduceSumSquare"), (1,)),
    # No input carries a gradient: ortlearn.autodiff.NON_DIFFERENTIABLE_OPS is built from these.
    **dict.fromkeys(("Shape", "Size", "Constant", "ConstantOfShape", "Range", "EyeLike",
                     "OneHot", "ArgMax", "ArgMin", "Hardmax", "NonZero", "Equal", "Less",
                     "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor",
                     "Sign", "Floor", "Ceil", "Round", "IsNaN", "IsInf", "RandomNormalLike",
                     "RandomUniformLike", "Bernoulli", "Multinomial"), None),
}


def _blocked(node: onnx.NodeProto, index: int) -> bool:
    """Whether input ``index`` of ``node`` carries no gradient."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Cast":  # a cast to an integer or boolean type
        return attr(node, "to") not in TRAINABLE_TYPES
    blocked = NON_DIFFERENTIABLE_INPUTS.get(node.op_type, ())
    return blocked is None or index in blocked


def _input_label(node: onnx.NodeProto, index: int) -> str:
    """``Dropout input 1 ('ratio') of node 'd'``: what the warning names."""
    try:
        formal = onnx.defs.get_schema(node.op_type).inputs
        name = formal[min(index, len(formal) - 1)].name
    except Exception:  # an operator onnx does not know: its position is enough
        name = None
    what = f"{node.op_type} input {index}" + (f" ({name!r})" if name else "")
    return f"{what} of node {node.name!r}"


def constant_initializers(model: onnx.ModelProto) -> dict[str, str]:
    """The float initializers read only through inputs that carry no gradient.

    Parameters
    ----------
    model : onnx.ModelProto

    Returns
    -------
    dict of str to str
        ``{initializer name: why it is not a weight}``, for every float
        initializer that some node reads and that every reader reads through
        an input of :data:`NON_DIFFERENTIABLE_INPUTS` (or a Cast to an
        integer type). An initializer read by a subgraph (If, Loop, Scan) or
        by an operator of another domain counts as a weight.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import helper, numpy_helper, TensorProto
    >>> graph = helper.make_graph(
    ...     [helper.make_node("Dropout", ["X", "ratio"], ["Y"], name="drop")], "g",
    ...     [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
    ...     [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
    ...     [numpy_helper.from_array(np.array(0.3, np.float32), "ratio")])
    >>> constant_initializers(helper.make_model(graph))
    {'ratio': "Dropout input 1 ('ratio') of node 'drop'"}
    """
    graph = model.graph
    floats = {i.name for i in graph.initializer if i.data_type in TRAINABLE_TYPES}
    inputs = {i.name for i in graph.input}
    reasons: dict[str, list[str]] = {}
    weights: set[str] = set()
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in floats:
                if _blocked(node, index):
                    reasons.setdefault(name, []).append(_input_label(node, index))
                else:
                    weights.add(name)
        for a in node.attribute:  # outer-scope reads of a subgraph: assume a weight
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                weights |= _subgraph_reads(sub) & floats
    return {name: ", ".join(why) for name, why in reasons.items()
            if name not in weights and name not in inputs}


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    names = set()
    for node in graph.node:
        names.update(node.input)
        for a in node.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                names |= _subgraph_reads(sub)
    return names


def select_trainable(model: onnx.ModelProto, requires_grad: Sequence[str] | None,
                     frozen: Sequence[str]) -> tuple[list[str], list[str]]:
    """The parameters to train and to freeze, constants kept out of the first.

    Parameters
    ----------
    model : onnx.ModelProto
    requires_grad : list of str or None
        The names the user asked to train; None: every float32/float64
        initializer outside ``frozen`` that is a weight.
    frozen : list of str
        The names the user asked to freeze.

    Returns
    -------
    requires_grad, frozen : list of str
        A name of ``requires_grad`` that :func:`constant_initializers` lists
        moves to the end of ``frozen`` (kept in the checkpoint, never
        trained) with a :class:`UserWarning` naming it and the input it
        feeds; by default such initializers stay constants of the model.
        Unknown names are left for the caller to report.
    """
    constants = constant_initializers(model)
    frozen = list(frozen)
    if requires_grad is None:
        return [i.name for i in model.graph.initializer if i.data_type in FLOAT_TYPES
                and i.name not in frozen and i.name not in constants], frozen
    kept = []
    for name in requires_grad:
        if name not in constants:
            kept.append(name)
            continue
        warnings.warn(
            f"{name!r} is not trained: it only feeds inputs that carry no gradient "
            f"({constants[name]}). It joins the frozen parameters: kept in the checkpoint, "
            "changed only by what the graph computes (a training-mode BatchNormalization "
            "updates its running statistics).",
            UserWarning, stacklevel=4)
        if name not in frozen:
            frozen.append(name)
    return kept, frozen


# -- local functions ---------------------------------------------------------------------

def _graphs_of(node: onnx.NodeProto):
    for a in node.attribute:
        yield from [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs


def _all_nodes(nodes):
    """Every node of ``nodes`` and of their subgraphs, recursively."""
    for node in nodes:
        yield node
        for sub in _graphs_of(node):
            yield from _all_nodes(sub.node)


def _function_defaults(model: onnx.ModelProto) -> dict:
    """``{(domain, name): {attribute: AttributeProto default}}`` of the local functions."""
    return {(f.domain, f.name): {a.name: a for a in f.attribute_proto} for f in model.functions}


def _propagate_defaults(model: onnx.ModelProto, defaults: dict) -> None:
    """Give a function attribute the default of the callee attribute it is forwarded to.

    ``G`` calling ``F`` with ``alpha`` referring to ``G``'s ``beta``: when
    ``G`` is called without ``beta``, ``F`` gets no ``alpha`` and must use
    its default, which the inliner drops once ``G`` is expanded. ``beta``
    takes ``F``'s default when every reference to it agrees; otherwise the
    model is refused.
    """
    changed = True
    while changed:
        changed = False
        for f in model.functions:
            own = defaults[f.domain, f.name]
            wanted: dict[str, list] = {}
            for node in _all_nodes(f.node):
                callee = defaults.get((node.domain, node.op_type))
                for a in node.attribute:
                    if a.ref_attr_name and a.ref_attr_name not in own:
                        wanted.setdefault(a.ref_attr_name, []).append(
                            None if callee is None else callee.get(a.name))
            for ref, values in wanted.items():
                if all(v is None for v in values):
                    continue
                first = values[0]
                if any(v is None or not _same_value(v, first) for v in values):
                    raise NotImplementedError(
                        f"Function {f.domain}.{f.name} forwards its attribute {ref!r} to "
                        "attributes with different defaults: ortlearn cannot inline it "
                        "faithfully. Give the attribute a default in the function.")
                default = onnx.AttributeProto()
                default.CopyFrom(first)
                default.name = ref
                f.attribute_proto.append(default)
                own[ref] = default
                changed = True


def _same_value(a: onnx.AttributeProto, b: onnx.AttributeProto) -> bool:
    return helper.get_attribute_value(a) == helper.get_attribute_value(b)


def _fill_defaults(model: onnx.ModelProto, defaults: dict) -> None:
    """Write each omitted attribute of a local-function call with its default."""
    nodes = itertools.chain(model.graph.node, *(f.node for f in model.functions))
    for node in _all_nodes(nodes):
        callee = defaults.get((node.domain, node.op_type))
        if not callee:
            continue
        present = {a.name for a in node.attribute}
        for name, default in callee.items():
            if name not in present:
                node.attribute.append(default)


def inline_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every call to one of its local functions inlined, recursively.

    :func:`onnx.inliner.inline_local_functions` does the work (nested
    calls, attribute references, a function's own ai.onnx opset converted to
    the model's). onnx 1.23's inliner ignores the attribute defaults of a
    function (``attribute_proto``): a call that omits such an attribute got
    the operator's default instead, a silently different graph. They are
    written on each call first.

    Parameters
    ----------
    model : onnx.ModelProto
        Left unchanged.

    Returns
    -------
    onnx.ModelProto
        ``model`` itself when it has no local function, else a new model
        without ``functions``. Calls to functions the model does not hold
        stay as they are.
    """
    if not model.functions:
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    defaults = _function_defaults(model)
    _propagate_defaults(model, defaults)
    _fill_defaults(model, defaults)
    inlined = onnx.inliner.inline_local_functions(model, convert_version=True)
    # The functions' domains go with them (no IR version is known for them).
    used = {n.domain for n in _all_nodes(inlined.graph.node)} | {"", "ai.onnx"}
    kept = [o for o in inlined.opset_import if o.domain in used]
    del inlined.opset_import[:]
    inlined.opset_import.extend(kept)
    return inlined


# -- If nodes with a known condition --------------------------------------------------------

def graph_names(graph: onnx.GraphProto) -> set[str]:
    """Every value and node name of ``graph`` and its subgraphs (names a new value avoids)."""
    names = {v.name for v in itertools.chain(graph.input, graph.output, graph.initializer,
                                             graph.value_info)}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        names.add(node.name)
        for sub in _graphs_of(node):
            names |= graph_names(sub)
    return names


class _Constants:
    """Values known before running: constants, and what nodes compute from them alone.

    A node is evaluated (by onnx's reference evaluator) when it has no
    subgraph and every input is known; ``Shape`` when its input's shape is
    static. That covers the conditions exporters write (``Equal(Shape(x)[0],
    1)`` with a static shape, a ``Constant``).
    """

    def __init__(self, model: onnx.ModelProto, nodes, wrt: Sequence[str]):
        self.model = model
        self.values = constant_values(model.graph, wrt)
        self.producers = {o: n for n in nodes for o in n.output if o}
        self._infos = None
        # Values found unknown, remembered: a value read twice by each node of a chain (h + h)
        # would otherwise be worked out 2**depth times.
        self._unknown: set[str] = set()

    def _declared(self, name: str):
        """The shape of ``name`` as declared or inferred (None when unknown)."""
        if self._infos is None:
            self._infos = value_info_map(self.model)
        info = self._infos.get(name)
        return shape_of(info) if info is not None else None

    def rank(self, name: str) -> int | None:
        """The rank of ``name`` (None when unknown)."""
        shape = self._declared(name)
        return None if shape is None else len(shape)

    def _shape(self, name: str):
        shape = self._declared(name)
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        return np.array(shape, dtype=np.int64)

    def get(self, name: str):
        """The value of ``name``, None when unknown before running.

        The values it needs are worked out first, each once (an explicit stack: no
        recursion limit on long chains, a cycle makes its values unknown).
        """
        stack, open_ = [name], set()
        while stack:
            current = stack[-1]
            if not current or current in self.values or current in self._unknown:
                stack.pop()
                continue
            node = self.producers.get(current)
            needed = self._needed_inputs(node)
            if needed is None:  # not computable before running
                self._unknown.add(current)
                stack.pop()
                continue
            if current not in open_:
                open_.add(current)
                if any(i in open_ for i in needed):  # a cycle
                    self._unknown.add(current)
                    open_.discard(current)
                    stack.pop()
                    continue
                stack.extend(i for i in needed
                             if i not in self.values and i not in self._unknown)
                continue
            stack.pop()
            open_.discard(current)
            if self._evaluate(node, current) is None:
                self._unknown.add(current)
        return self.values.get(name)

    @staticmethod
    def _needed_inputs(node) -> list | None:
        """The inputs ``node``'s value needs, None when it cannot be known before running."""
        if node is None or node.domain not in ("", "ai.onnx") or any(_graphs_of(node)):
            return None
        if node.op_type in ("RandomNormal", "RandomUniform", "RandomNormalLike",
                            "RandomUniformLike", "Bernoulli", "Multinomial", "Dropout"):
            return None
        return [] if node.op_type == "Shape" else [i for i in node.input if i]

    def _evaluate(self, node, name: str):
        """The value of ``name``, output of ``node``, its needed inputs already looked at."""
        if node.op_type == "Shape":
            value = self._shape(node.input[0])
            if value is not None:
                value = value[attr(node, "start", 0):attr(node, "end", None)]
                self.values[name] = value
            return value
        inputs = [self.values.get(i) if i else None for i in node.input]
        if any(v is None for i, v in zip(node.input, inputs) if i):
            return None
        from onnx.reference import ReferenceEvaluator

        try:
            ev = ReferenceEvaluator(node, opsets={"": opset_of(self.model) or 18})
            outputs = ev.run(None, {i: v for i, v in zip(node.input, inputs) if i})
        except Exception:  # what the reference evaluator cannot run stays unknown
            return None
        for out, value in zip(node.output, outputs):
            if out:
                self.values[out] = np.asarray(value)
        return self.values.get(name)


def _rename(node: onnx.NodeProto, names: dict) -> None:
    """Rename the values of ``node`` and its subgraphs' outer references, in place."""
    for seq in (node.input, node.output):
        for i, name in enumerate(seq):
            if name in names:
                seq[i] = names[name]
    for sub in _graphs_of(node):
        for inner in sub.node:
            _rename(inner, names)
        for out in sub.output:
            if out.name in names:
                out.name = names[out.name]


def _branch_nodes(node: onnx.NodeProto, branch: onnx.GraphProto, b: GraphBuilder) -> list:
    """The nodes of ``branch`` computing the outputs of the If ``node`` in the outer graph."""
    if branch.sparse_initializer:
        raise NotImplementedError(
            f"If node {node.name!r}: a branch with sparse initializers cannot be folded.")
    local = {init.name for init in branch.initializer}
    for inner in branch.node:
        local.update(o for o in inner.output if o)
    names = {name: b.unique_name(name) for name in sorted(local)}
    nodes = [helper.make_node("Constant", [], [names[init.name]],
                              value=numpy_helper.from_array(numpy_helper.to_array(init),
                                                            names[init.name]))
             for init in branch.initializer]
    for inner in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        _rename(copy, names)
        if copy.name:
            copy.name = b.unique_name(copy.name)
        nodes.append(copy)
    produced = {o for n in nodes for o in n.output}
    routed: dict[str, str] = {}  # branch value -> the If output it became
    for out, target in zip(branch.output, node.output):
        value = names.get(out.name, out.name)
        if not target:
            continue
        if value in produced and value not in routed:
            for n in nodes:  # the producer writes the If's output, its readers read it
                _rename(n, {value: target})
            routed[value] = target
        else:  # an outer value, or a value already routed to another output
            nodes.append(helper.make_node("Identity", [routed.get(value, value)], [target],
                                          name=b.unique_name(f"{node.name}_output")))
    return nodes


def fold_constant_ifs(model: onnx.ModelProto, wrt: Sequence[str] = ()) -> int:
    """Replace each ``If`` whose condition is known before running by its branch, in place.

    The branch's nodes go where the If was, its values renamed apart from
    the outer graph's and its outputs named as the If's outputs; its
    initializers become ``Constant`` nodes (constants, never weights).
    Outer-scope references stay as they are; nested Ifs are folded in turn.
    A condition is known when it is a ``Constant`` or an initializer (not in
    ``wrt``, not a graph input), or computed from such values and static
    shapes. Ifs in the subgraphs of Loop and Scan are left alone.

    Parameters
    ----------
    model : onnx.ModelProto
        Modified in place.
    wrt : sequence of str, default=()
        Initializers whose values are not constant (the weights).

    Returns
    -------
    int
        The number of If nodes folded.
    """
    folded = 0
    while True:
        nodes = list(model.graph.node)
        ifs = [n for n in nodes if n.op_type == "If" and n.domain in ("", "ai.onnx")]
        if not ifs:
            return folded
        constants = _Constants(model, nodes, wrt)
        b = GraphBuilder(opset_of(model) or 18, used_names=graph_names(model.graph))
        out, changed = [], False
        for node in nodes:
            cond = constants.get(node.input[0]) if node in ifs else None
            if cond is None:
                out.append(node)
                continue
            branch = attr(node, "then_branch" if bool(np.asarray(cond).reshape(-1)[0])
                          else "else_branch")
            out.extend(_branch_nodes(node, branch, b))
            folded += 1
            changed = True
        del model.graph.node[:]
        model.graph.node.extend(out)
        if not changed:
            return folded


def prepare_for_gradient(model: onnx.ModelProto, wrt: Sequence[str] = ()) -> bool:
    """Inline the local functions of ``model``, fold its constant Ifs and the operands
    rules need as constants (:func:`fold_static_operands`), in place.

    What the reverse pass of :mod:`ortlearn.autodiff` runs first: the
    gradient rules see only plain operators. Ops of other domains without a
    rule, and Ifs whose condition depends on the inputs, are left for the
    reverse pass to report when a differentiable value reaches them.

    Parameters
    ----------
    model : onnx.ModelProto
        Modified in place.
    wrt : sequence of str, default=()
        The weights (their values are not constants).

    Returns
    -------
    bool
        Whether the graph changed.
    """
    changed = False
    if model.functions:
        inlined = inline_functions(model)
        # in place, field by field: callers may hold ``model.graph``
        model.graph.CopyFrom(inlined.graph)
        del model.functions[:]
        del model.opset_import[:]
        model.opset_import.extend(inlined.opset_import)
        changed = True
    changed = fold_constant_ifs(model, wrt) > 0 or changed
    changed = sequences_as_splits(model) > 0 or changed
    changed = gathered_sums_as_reductions(model) > 0 or changed
    return fold_static_operands(model, wrt) > 0 or changed


def sequences_as_splits(model: onnx.ModelProto) -> int:
    """Rewrite each ``SplitToSequence`` read only by ``SequenceAt`` of constant indices as a
    ``Split`` (whose gradient is a ``Concat``), in place.

    The dynamo exporter writes ``x.split(n, dim)`` and ``x.chunk(k, dim)`` on a
    dimension known at run time only (a fused QKV projection) as
    ``SplitToSequence(x, n)`` followed by ``SequenceAt(seq, i)``. The pieces
    read are the first ``m = max(i) + 1``: the Split has ``m`` pieces of ``n``
    rows (the last ``min(n, rest)``) and one more holding the rest (empty when
    there are ``m`` pieces). A negative index needs the number of pieces: that
    sequence is left as it is, as one whose sizes are a list of unknown length.

    Returns
    -------
    int
        The number of sequences rewritten.
    """
    graph = model.graph
    nodes = list(graph.node)
    reading = readers(nodes)
    outputs = {o.name for o in graph.output}
    constants = _Constants(model, nodes, ())
    b = GraphBuilder(opset_of(model) or 18, used_names=graph_names(graph))
    replaced: dict = {}  # id of a SplitToSequence -> the nodes that stand for it
    dropped: set = set()
    for node in nodes:
        if node.op_type != "SplitToSequence" or node.domain not in ("", "ai.onnx"):
            continue
        seq = node.output[0]
        users = reading.get(seq, [])
        indices = [constants.get(u.input[1]) if u.op_type == "SequenceAt" else None
                   for u in users]
        if (seq in outputs or not users or any(i is None or np.ndim(i) or int(i) < 0
                                               for i in indices)):
            continue
        split = node.input[1] if len(node.input) > 1 and node.input[1] else None
        axis = attr(node, "axis", 0)
        count = max(int(i) for i in indices) + 1
        if split is None:
            if not attr(node, "keepdims", 1):
                continue  # squeezed pieces of one row: rare, left as they are
            split = b.ints([1], hint="one")
        size = constants.get(split)
        if size is not None and np.ndim(size) == 1:
            if len(size) < count:
                continue
            sizes, count = split, len(size)
        elif size is None and constants.rank(split) != 0:
            continue  # a list of sizes of unknown length
        else:
            # m pieces of n, the last one min(n, rest), then the rest
            n = b.op("Reshape", [split, b.ints([1], hint="one")])
            length = b.op("Gather", [b.op("Shape", [node.input[0]]),
                                     b.ints([axis], hint="axis")], axis=0)
            before = b.op("Mul", [n, b.ints([count - 1], hint="pieces")])
            last = b.op("Min", [n, b.op("Sub", [length, before])])
            rest = b.op("Sub", [b.op("Sub", [length, before]), last])
            sizes = b.op("Concat", [b.op("Expand", [n, b.ints([count - 1], hint="pieces")]),
                                    last, rest], axis=0)
            count += 1
        pieces = b.op("Split", [node.input[0], sizes], n_outputs=count, axis=axis)
        pieces = [pieces] if isinstance(pieces, str) else list(pieces)
        for user, index in zip(users, indices):
            b.op("Identity", [pieces[int(index)]], outputs=[user.output[0]])
            dropped.add(id(user))
        replaced[id(node)] = list(b.nodes)
        del b.nodes[:]
    if not replaced:
        return 0
    out = rewritten(nodes, replaced, dropped)
    del graph.node[:]
    graph.node.extend(out)
    return len(replaced)


#: Inputs that gradient rules need known before running, by operator: they are
#: replaced by Constant nodes when computable from constants and static shapes.
STATIC_OPERANDS = {"Resize": (1, 2, 3)}


def fold_static_operands(model: onnx.ModelProto, wrt: Sequence[str] = ()) -> int:
    """Replace each input of :data:`STATIC_OPERANDS` computed from constants by a Constant.

    The TorchScript exporter writes ``nn.Upsample(scale_factor=2)``'s scales as
    ``Concat(Constant, Constant)``; the Resize gradient needs their values.
    The producing nodes stay (pruned later if nothing else reads them).

    Returns
    -------
    int
        The number of inputs replaced.
    """
    nodes = list(model.graph.node)
    if not any(n.op_type in STATIC_OPERANDS for n in nodes):
        return 0
    constants = _Constants(model, nodes, wrt)
    b = GraphBuilder(opset_of(model) or 18, used_names=graph_names(model.graph))
    folded, out = 0, []
    for node in nodes:
        indices = STATIC_OPERANDS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
        for i in indices:
            if i >= len(node.input) or not node.input[i] or node.input[i] in constants.values:
                continue
            value = constants.get(node.input[i])
            if value is None:
                continue
            name = b.unique_name(f"{node.input[i]}_static")
            out.append(helper.make_node("Constant", [], [name],
                                        value=numpy_helper.from_array(np.asarray(value), name)))
            node.input[i] = name
            folded += 1
        out.append(node)
    if folded:
        del model.graph.node[:]
        model.graph.node.extend(out)
    return folded


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
    model = onx if isinstance(onx, onnx.ModelProto) else load_model(onx)
    constants = constant_initializers(model)
    return [init.name for init in model.graph.initializer
            if init.data_type in TRAINABLE_TYPES and init.name not in constants]
