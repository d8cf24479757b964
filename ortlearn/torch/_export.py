"""A torch module's call exported to ONNX, ready to be differentiated.

The call ``module(*args, **kwargs)`` is exported through a wrapper taking the
tensors of ``args`` and ``kwargs`` as flat positional inputs (``input_<i>``)
and returning the tensors of the output as flat outputs (``output_<i>``); the
other leaves (numbers, strings, None) are part of the call's schema and are
baked into the graph. An export is made for the shapes of the call
(``dynamic=False``) or with every dimension of every input symbolic where the
exporter can keep it so (``dynamic=True``): torch's exporters take 1.7 to 2.7
times as long for the second. Parameters and buffers become graph inputs named by
their ``state_dict`` names: the torch tensors stay the only copy of the weights.

Both torch exporters are supported: the dynamo one (``torch.export``, the
default of torch 2.9 and later, ``optimize=False`` so that no parameter is
folded into a constant) and the TorchScript one (``dynamo=False``,
``do_constant_folding=False``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, is_dataclass

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from ..autodiff import mark_padding_idx
from ..graph import rename_value, shape_matches, shape_of, weights_to_inputs

__all__ = ["EXPORTERS", "Exported", "TreeSpec", "batchnorm_training_mode", "export_call",
           "flatten", "flatten_call", "quiet_exporters", "state_restored", "unflatten"]

EXPORTERS = ("dynamo", "torchscript")
#: Opset of the TorchScript exports (the dynamo exporter writes opset 18 or more).
TORCHSCRIPT_OPSET = 18
_PREFIX = "module."


# --------------------------------------------------------------------------- trees


@dataclass(frozen=True)
class TreeSpec:
    """The structure of nested tuples, lists and dicts, named tuples and mappings
    (``OrderedDict``, transformers' ``ModelOutput``): ``kind`` ``'tensor'`` marks a tensor
    leaf, ``'const'`` a constant leaf kept as is (``value``); a named tuple or a mapping
    other than ``dict`` keeps its class in ``value``, and comes back as one."""

    kind: str  # "tensor", "const", "tuple", "list", "dict", "namedtuple"
    children: tuple = ()
    keys: tuple = ()
    value: object = None


_TENSOR = TreeSpec("tensor")


def flatten(tree) -> tuple[list, TreeSpec]:
    """The tensors of ``tree`` in depth-first order, and its structure."""
    tensors: list = []
    return tensors, _flatten(tree, tensors)


def flatten_call(args: tuple, kwargs: dict) -> tuple[list, TreeSpec]:
    """:func:`flatten` of ``(args, kwargs)``, quick for the common call on tensors only."""
    if not kwargs and all(isinstance(a, torch.Tensor) for a in args):
        return list(args), _positional_spec(len(args))
    # Keyword order does not change the call: one schema for any order.
    return flatten((args, dict(sorted(kwargs.items()))))


@functools.lru_cache(maxsize=16)
def _positional_spec(n: int) -> TreeSpec:
    return TreeSpec("tuple", (TreeSpec("tuple", (_TENSOR,) * n), TreeSpec("dict")))


def _flatten(tree, tensors: list) -> TreeSpec:
    if isinstance(tree, torch.Tensor):
        tensors.append(tree)
        return _TENSOR
    if type(tree) in (tuple, list):
        return TreeSpec(type(tree).__name__, tuple(_flatten(t, tensors) for t in tree))
    if isinstance(tree, tuple) and hasattr(type(tree), "_fields"):
        return TreeSpec("namedtuple", tuple(_flatten(t, tensors) for t in tree),
                        value=type(tree))
    if isinstance(tree, dict):
        keys = tuple(tree)
        return TreeSpec("dict", tuple(_flatten(tree[k], tensors) for k in keys), keys,
                        None if type(tree) is dict else type(tree))
    return TreeSpec("const", value=tree)


def unflatten(spec: TreeSpec, tensors: Sequence):
    """The tree of ``spec`` holding ``tensors`` (inverse of :func:`flatten`)."""
    if spec.kind == "tensor":
        return tensors[0]
    return _unflatten(spec, iter(tensors))


def _unflatten(spec: TreeSpec, it):
    if spec.kind == "tensor":
        return next(it)
    if spec.kind == "const":
        return spec.value
    children = [_unflatten(c, it) for c in spec.children]
    if spec.kind == "dict":
        items = dict(zip(spec.keys, children))
        if spec.value is None:
            return items
        # a dataclass mapping (transformers' ModelOutput) takes its fields by keyword
        return spec.value(**items) if is_dataclass(spec.value) else spec.value(items)
    if spec.kind == "namedtuple":
        return spec.value(*children)
    return tuple(children) if spec.kind == "tuple" else children


def schema_key(spec: TreeSpec):
    """``spec`` where it is hashable, else a hashable stand-in (constant leaves by ``repr``)."""
    try:
        hash(spec)
        return spec
    except TypeError:
        return _hashable(spec)


def _hashable(spec: TreeSpec):
    if spec.kind == "const":
        try:
            hash(spec.value)
            return ("const", type(spec.value).__name__, spec.value)
        except TypeError:
            return ("const", type(spec.value).__name__, repr(spec.value))
    if spec.kind == "tensor":
        return "tensor"
    return (spec.kind, spec.keys, tuple(_hashable(c) for c in spec.children))


# --------------------------------------------------------------------------- export


class _FlatCall(torch.nn.Module):
    """``module(*args, **kwargs)`` with flat tensors in and out (what the exporters take),
    in ``module``'s mode."""

    def __init__(self, module: torch.nn.Module, call_spec: TreeSpec):
        super().__init__()
        self.module = module
        self._call_spec = call_spec
        # not .train(): that would set every submodule's mode
        self.training = module.training

    def forward(self, *tensors):
        args, kwargs = unflatten(self._call_spec, tensors)
        out, _ = flatten(self.module(*args, **kwargs))
        return tuple(out)


@dataclass
class Exported:
    """An exported call.

    Attributes
    ----------
    model : onnx.ModelProto
        Inputs ``input_<i>`` (the call's tensors), then the parameters and
        buffers it reads (``state_dict`` names); outputs ``output_<i>``.
    inputs : list of str
        The graph inputs of the call's tensors, in order.
    weights : list of str
        The graph inputs of the parameters and buffers, ``state_dict`` names.
    exporter : str
    symbolic : Exported or None
        For an export specialized to the shapes of one call (:meth:`specialized`),
        the export with symbolic dimensions it comes from.
    """

    model: onnx.ModelProto
    inputs: list
    weights: list
    exporter: str
    symbolic: Exported | None = None

    def specialized(self, tensors: Sequence[torch.Tensor]) -> Exported:
        """This export with the input dimensions of ``tensors``: the gradient rules of
        operators that resample along an axis (AveragePool, Resize) need its length."""
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        shapes = dict(zip(self.inputs, tensors))
        for graph_input in model.graph.input:
            if graph_input.name in shapes:
                dims = graph_input.type.tensor_type.shape.dim
                for dim, size in zip(dims, shapes[graph_input.name].shape):
                    dim.dim_value = int(size)  # clears dim_param (a oneof)
        del model.graph.value_info[:]  # inferred again, from these shapes
        return Exported(model, self.inputs, self.weights, self.exporter,
                        self.symbolic or self)

    @functools.cached_property
    def input_shapes(self) -> list:
        """The declared shapes of :attr:`inputs` (:func:`~ortlearn.graph.shape_of`)."""
        declared = {i.name: shape_of(i) for i in self.model.graph.input}
        return [declared[name] for name in self.inputs]

    def accepts(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether the graph's input shapes allow these tensors (an exporter may keep
        some dimensions static)."""
        symbols: dict = {}
        return all(shape_matches(shape, t.shape, symbols)
                   for shape, t in zip(self.input_shapes, tensors))


@contextlib.contextmanager
def state_restored(module: torch.nn.Module):
    """Within it, ``module``'s parameters and buffers may be changed in place (a run of
    forward that updates BatchNorm's statistics, an export); after it, those that changed
    get their values back, and their ``state_dict`` names are appended to the list it
    yields. The others are not written to: a backward still to run on an earlier call's
    graph checks the version of the tensors it saved. (BatchNorm's kernel updates its
    running statistics without a new version: the values are compared.)"""
    saved = [(name, t, None if t.is_inference() else t._version, t.detach().clone())
             for name, t in module.state_dict(keep_vars=True).items()]
    changed: list = []
    try:
        yield changed
    finally:
        with torch.no_grad():
            for name, tensor, version, value in saved:
                if (version is not None and tensor._version != version) \
                        or not _same_values(tensor, value):
                    tensor.copy_(value)
                    changed.append(name)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
    return torch.equal(a, b)


#: One export at a time in the process: the exporters' settings and the quiet
#: exporters' redirection of ``sys.stdout`` are process-wide (two interleaved
#: redirections would leave ``sys.stdout`` redirected for good).
_EXPORT_LOCK = threading.RLock()


@contextlib.contextmanager
def quiet_exporters():
    """Within it, torch's ONNX exporters print no progress line and warn no notice (one
    export at a time in the process)."""
    logger = logging.getLogger("torch.onnx")
    with _EXPORT_LOCK:
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                yield
        finally:
            logger.setLevel(level)


def export_call(module: torch.nn.Module, tensors: Sequence[torch.Tensor], call_spec: TreeSpec,
                n_outputs: int, *, train: bool, exporter: str,
                dynamic: bool = True) -> Exported:
    """Export ``module`` called on the tree ``call_spec`` holding ``tensors``.

    With ``dynamic``, every input dimension is symbolic where the exporter can
    keep it so; else the graph is for the shapes of ``tensors``.

    Each submodule is exported in the mode it is in (``train`` is the
    module's own): a BatchNorm or a Dropout frozen with ``.eval()`` inside a
    module in train mode stays in eval mode. ``module``'s state (parameters,
    buffers, modes) is left as it was: the TorchScript exporter runs a real
    forward, which steps BatchNorm's running statistics in train mode. The
    exporters get copies of the tensors (a forward may change its inputs).
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}.")
    wrapper = _FlatCall(module, call_spec)
    # Fresh leaves: torch.export's guards fail on a leaf whose .grad is set (an input
    # that requires a gradient, after a first backward).
    tensors = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    names = [f"input_{i}" for i in range(len(tensors))]
    outputs = [f"output_{i}" for i in range(n_outputs)]
    modes = [(sub, sub.training) for sub in module.modules()]
    try:
        with quiet_exporters(), state_restored(module):
            onx = (_dynamo(wrapper, tensors, dynamic) if exporter == "dynamo"
                   else _torchscript(wrapper, tensors, names, outputs, dynamic))
    finally:
        for sub, mode in modes:
            sub.training = mode
    _distinct_outputs(onx)
    for graph_input, name in zip(onx.graph.input, names):
        rename_value(onx, graph_input.name, name)
    for graph_output, name in zip(list(onx.graph.output), outputs):
        rename_value(onx, graph_output.name, name)
    if train and exporter == "dynamo":
        batchnorm_training_mode(onx)
    weights = _weights_to_inputs(onx, module)
    return Exported(_small_constants_folded(onx), names, weights, exporter)


#: Largest tensor :func:`_small_constants_folded` writes (elements): shapes and axes.
FOLDED_MAX_ELEMENTS = 1024


def _small_constants_folded(onx: onnx.ModelProto) -> onnx.ModelProto:
    """The small values computed from constants alone, made constants (onnxscript's folding).

    The dynamo exporter writes ``x.mean(dim)`` (RMSNorm, mean pooling,
    ``AdaptiveAvgPool2d``) as a ReduceMean whose axes are
    ``Reshape(Constant, Constant)``; onnx's shape inference stops there, and
    the forward graph's outputs after it would have no shape. The parameters
    and buffers are graph inputs by now: nothing trained is folded. Folding
    only helps: where onnxscript's folder fails (its ``SplitToSequence``
    evaluator on split sizes known at run time only), the graph stays as exported.
    """
    from onnxscript import ir, optimizer

    model = ir.serde.deserialize_model(onx)
    try:
        optimizer.fold_constants(model, output_size_limit=FOLDED_MAX_ELEMENTS)
    except RuntimeError:
        return onx
    # the constants only the folded nodes read (else onnxruntime warns, removing them)
    optimizer.remove_unused_nodes(model)
    return ir.serde.serialize_model(model)


def _distinct_outputs(onx: onnx.ModelProto) -> None:
    """Give each graph output a value of its own (an Identity): the dynamo exporter names an
    input returned as is, or a tensor returned twice, by the same value, which renaming
    the outputs ``output_<i>`` would break."""
    taken = {i.name for i in onx.graph.input} | {i.name for i in onx.graph.initializer}
    for i, output in enumerate(onx.graph.output):
        if output.name in taken:
            fresh = f"ortlearn_output_{i}"
            onx.graph.node.append(helper.make_node("Identity", [output.name], [fresh]))
            output.name = fresh
        taken.add(output.name)


def _dynamo(wrapper, tensors, dynamic: bool) -> onnx.ModelProto:
    auto = torch.export.Dim.AUTO
    shapes = (tuple({axis: auto for axis in range(t.dim())} for t in tensors),
              ) if dynamic else None
    program = torch.onnx.export(wrapper, tuple(tensors), dynamo=True, optimize=False,
                                dynamic_shapes=shapes, verbose=False)
    return program.model_proto


def _torchscript(wrapper, tensors, names, outputs, dynamic: bool) -> onnx.ModelProto:
    f = io.BytesIO()
    axes = ({name: list(range(t.dim())) for name, t in zip(names, tensors)} if dynamic
            else None)
    # PRESERVE: each submodule in its own mode (TRAINING would set them all).
    # keep_initializers_as_inputs: else the exporter merges the initializers of equal
    # values of a module in eval mode (a fresh BatchNorm's running variance with its
    # weight, its running mean with its bias) and the weight's gradient gets the variance's.
    torch.onnx.export(wrapper, tuple(tensors), f, dynamo=False,
                      training=torch.onnx.TrainingMode.PRESERVE,
                      do_constant_folding=False, export_params=True,
                      keep_initializers_as_inputs=True, opset_version=TORCHSCRIPT_OPSET,
                      input_names=names, output_names=outputs, dynamic_axes=axes)
    onx = onnx.load_from_string(f.getvalue())
    initializers = {i.name for i in onx.graph.initializer}
    inputs = [i for i in onx.graph.input if i.name not in initializers]
    del onx.graph.input[:]
    onx.graph.input.extend(inputs)
    return onx


def _weights_to_inputs(onx: onnx.ModelProto, module: torch.nn.Module) -> list[str]:
    """Turn the initializers holding ``module``'s parameters and buffers into graph inputs
    named by their ``state_dict`` names; raise if the exporter folded a parameter."""
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    found = {}
    for init in onx.graph.initializer:
        name = init.name[len(_PREFIX):] if init.name.startswith(_PREFIX) else init.name
        if name in tensors and init.name not in found:
            found[init.name] = name
    for old, new in found.items():
        if old != new:
            for init in onx.graph.initializer:
                if init.name == old:
                    init.name = new
            rename_value(onx, old, new)
    _check_nothing_folded(onx, module, set(found.values()))
    _mark_padding_rows(onx, module)
    weights_to_inputs(onx, list(found.values()))
    return list(found.values())


def _mark_padding_rows(onx: onnx.ModelProto, module: torch.nn.Module) -> None:
    """torch gives an embedding's ``padding_idx`` row no gradient; the TorchScript export
    loses that (:func:`~ortlearn.autodiff.mark_padding_idx`)."""
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.Embedding) and sub.padding_idx is not None:
            try:
                mark_padding_idx(onx, f"{name}.weight" if name else "weight", sub.padding_idx)
            except ValueError:  # no Gather reads it: nothing to mark
                pass


def _check_nothing_folded(onx, module, mapped: set) -> None:
    """A parameter missing from the graph while a constant holds its value (or its
    transpose) means the exporter baked it in: training would not change it."""
    # A tied parameter is in the graph under any of its names.
    aliases = dict(module.named_parameters(remove_duplicate=False))
    present = {id(aliases[n]) for n in mapped if n in aliases}
    missing = {n: p.detach().cpu().numpy() for n, p in module.named_parameters()
               if id(p) not in present and p.numel() > 1}
    if not missing:
        return
    for init in onx.graph.initializer:
        value = numpy_helper.to_array(init)
        for name, ref in missing.items():
            if (ref.shape == value.shape and np.array_equal(ref, value)) or (
                    ref.ndim == 2 and ref.T.shape == value.shape and np.array_equal(ref.T, value)):
                raise ValueError(
                    f"The exporter baked the parameter {name!r} into the constant "
                    f"{init.name!r}: training through ONNX would not update it.")


def batchnorm_training_mode(onx: onnx.ModelProto) -> list[str]:
    """Set ``training_mode=1`` on the BatchNormalization nodes the dynamo exporter recorded
    from train-mode torch calls (onnxscript writes them in inference mode and drops the
    running-statistics updates); returns their names."""
    changed = []
    for node in onx.graph.node:
        if node.op_type != "BatchNormalization":
            continue
        fx = {p.key: p.value for p in node.metadata_props}.get("pkg.torch.onnx.fx_node", "")
        if "batch_norm" in fx and "no_training" not in fx:
            kept = [a for a in node.attribute if a.name != "training_mode"]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("training_mode", 1)])
            # onnxruntime wants the running statistics as outputs in training mode
            while len(node.output) < 3:
                node.output.append(f"{node.name}_running_{('mean', 'var')[len(node.output) - 1]}")
            changed.append(node.name)
    return changed
