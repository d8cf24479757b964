"""``ORTModule``: a ``torch.nn.Module`` whose forward and backward run in ONNX Runtime."""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import threading
import warnings
from dataclasses import dataclass, field

import torch

from ..training.device import parse_device
from ._cache import cache_dir, cache_key, load_export, store_export
from ._calls import Call, CallMemo, WeightTable, call_key
from ._export import (
    EXPORTERS,
    Exported,
    export_call,
    flatten,
    flatten_call,
    schema_key,
    state_restored,
    unflatten,
)
from ._graphs import Graphs, RunGraphs, build_graphs, sessions_device
from ._guards import Guard, recording_branches, recording_reads
from ._options import DebugOptions, ORTModuleTorchModelException

__all__ = ["ORTModule"]

logger = logging.getLogger("ortlearn.torch")


class _SignedMethod:
    """A method that, read on an ORTModule, shows the wrapped module's own method's
    signature and docstring (``inspect.signature(model.forward)``, which the callers that
    pick the arguments to pass read).

    The bound object is made on each read, as Python's bound methods are: stored on the
    instance it would make a reference cycle, and a dropped module, sessions included,
    would wait for the garbage collector.
    """

    def __init__(self, function):
        self._function = function
        functools.update_wrapper(self, function)

    def __set_name__(self, owner, name):
        self._name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self._function
        return _BoundSigned(self._function, instance, self._name)


class _BoundSigned:
    __slots__ = ("__func__", "__self__", "_name")

    def __init__(self, function, instance, name):
        self.__func__, self.__self__, self._name = function, instance, name

    def __call__(self, *args, **kwargs):
        return self.__func__(self.__self__, *args, **kwargs)

    @property
    def __wrapped__(self):
        return getattr(self.__self__._original_module, self._name)

    @property
    def __doc__(self):
        return self.__wrapped__.__doc__

    @property
    def __name__(self):
        return self._name

    def __repr__(self):
        return f"<bound method ORTModule.{self._name} of {self.__self__!r}>"


#: Exports of one call schema for a module that keeps changing (an attribute forward reads
#: set at every step): beyond, the module runs in torch (torch.compile's cache limit idea).
MAX_EXPORTS_PER_SCHEMA = 8


@dataclass
class _Schema:
    """The graphs exported for one call schema in one mode (a list: the exporter may keep
    some dimensions static, and another size then needs another export; the module may
    have changed since an export: each holds the :class:`Guard` of what it assumed)."""

    exports: list = field(default_factory=list)  # (Exported, output spec, Guard)
    graphs: dict = field(default_factory=dict)  # (export index, wrt) -> Graphs
    #: why the export with symbolic dimensions failed (then each shape is exported alone)
    symbolic_failure: str | None = None


class ORTModule(torch.nn.Module):
    """Wrap a ``torch.nn.Module`` so that its forward and backward run in ONNX Runtime.

    The rest of a PyTorch training script stays as it is: optimizers,
    schedulers, gradient clipping, data loaders. A script written for
    onnxruntime-training changes one import
    (``from onnxruntime.training import ORTModule`` becomes
    ``from ortlearn.torch import ORTModule``).

    The first call exports the module for the shapes of its tensors (torch's
    dynamo exporter, the TorchScript one if it fails), builds with
    :mod:`ortlearn.autodiff` a forward graph that also returns what the
    backward needs and a backward graph, and opens their sessions; later
    calls reuse them. The first call with other shapes (a smaller last batch,
    another sequence length) exports it again with symbolic dimensions, which
    serves every shape after, as ``torch.compile`` makes a dimension dynamic
    once it changed (the exporters take about twice as long with symbolic
    dimensions). The module is
    exported again when the call's schema changes (the number, dtypes and
    ranks of the tensors, the other arguments, train or eval mode: each mode
    has its graphs) and when what the export assumed of the module changed:
    a submodule replaced or added, a submodule's train/eval mode, a forward
    hook, an attribute forward reads (:class:`~ortlearn.torch._guards.Guard`;
    after ``MAX_EXPORTS_PER_SCHEMA`` such exports the module runs in torch,
    with a warning). Each submodule keeps the mode it has: a BatchNorm
    frozen with ``.eval()`` in a module in train mode stays frozen. The
    parameters stay the torch tensors: they are inputs of the graphs, and the
    gradients land in ``param.grad``
    (accumulating, as torch does). BatchNorm's running statistics are
    written back to the module's buffers.

    When the module cannot run in ONNX Runtime (the export fails, an
    operator has no gradient rule, a custom ``torch.autograd.Function`` with
    its own backward) it runs in torch, with one warning saying why, unless
    ``debug_options.strict`` (or ``ORTLEARN_ORTMODULE_STRICT=1``) asks to raise.

    Parameters
    ----------
    module : torch.nn.Module
        The module to train (not copied: its parameters are trained).
    debug_options : DebugOptions, optional
    exporter : {'auto', 'dynamo', 'torchscript'}, default='auto'
        ``'auto'``: the dynamo exporter, then the TorchScript one if it fails.
    device : {None, 'webgpu', 'webgpu:N'}, default=None
        Where the graphs run. None: on the device of the module's tensors (the
        CPU, or CUDA through onnxruntime-gpu). ``'webgpu'``: on a GPU through
        onnxruntime's WebGPU plugin provider (``pip install ortlearn[webgpu]``;
        NVIDIA, AMD, Intel and Apple GPUs), the module and its inputs staying
        on the CPU (torch has no WebGPU device): each run copies its inputs,
        the parameters included, to the GPU and its outputs back. The graphs
        are rewritten for the provider (:data:`ortlearn.graph.passes.GPU_NODES`)
        and a warning names any node it would still leave to the CPU.

    Examples
    --------
    >>> import torch
    >>> from ortlearn.torch import ORTModule
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = ORTModule(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
    ...                                       torch.nn.Linear(8, 1)))
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> x, y = torch.randn(16, 4), torch.randn(16, 1)
    >>> for _ in range(3):
    ...     optimizer.zero_grad()
    ...     loss = torch.nn.functional.mse_loss(model(x), y)
    ...     loss.backward()
    ...     optimizer.step()
    >>> model.export_count
    1
    """

    def __init__(self, module: torch.nn.Module, debug_options: DebugOptions | None = None,
                 *, exporter: str = "auto", device: str | None = None):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"ORTModule wraps a torch.nn.Module, got {type(module).__name__}.")
        if isinstance(module, ORTModule):
            raise TypeError("The module is already an ORTModule.")
        if debug_options is not None and not isinstance(debug_options, DebugOptions):
            raise TypeError(f"debug_options must be a DebugOptions, got {debug_options!r}.")
        if exporter not in ("auto", *EXPORTERS):
            raise ValueError(f"exporter must be 'auto', 'dynamo' or 'torchscript', "
                             f"got {exporter!r}.")
        session_device = sessions_device(device)
        super().__init__()
        # nn.Module.__setattr__ registers the child without calling add_module.
        self._original_module = module
        self._device = session_device
        self._debug_options = debug_options or DebugOptions()
        self._exporters = EXPORTERS if exporter == "auto" else (exporter,)
        self._schemas: dict = {}
        self._weight_table = WeightTable(module)
        self._calls = CallMemo()
        self._fallback_reason: str | None = None
        # the first calls of several threads export once, one at a time
        self._lock = threading.RLock()
        self.export_count = 0
        level = self._debug_options.log_level.logging_level
        if logger.getEffectiveLevel() > level:
            # Lowered only: each ORTModule filters its own messages (_log).
            logger.setLevel(level)
        # a parent module's load_state_dict reaches the wrapped module through this one:
        # its keys have no "_original_module." (state_dict gives the wrapped module's)
        super().register_load_state_dict_pre_hook(_wrapped_keys)
        self._initialized = True

    # ------------------------------------------------------------------ attributes

    def __getattr__(self, name: str):
        """An attribute the wrapper does not have is the wrapped module's (its methods,
        its configuration: ``model.config``, ``model.generate``)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if self.__dict__.get("_initialized"):
                return getattr(self.__dict__["_modules"]["_original_module"], name)
            raise

    def __setattr__(self, name: str, value) -> None:
        """Once wrapped, an attribute the wrapper does not hold is set on the wrapped module
        (what its forward reads: the next call sees it, and exports again if the export
        depended on it)."""
        if (not self.__dict__.get("_initialized") or name in self.__dict__
                or name in ("training", "export_count")):
            super().__setattr__(name, value)
        else:
            setattr(self._original_module, name, value)

    def __delattr__(self, name: str) -> None:
        if self.__dict__.get("_initialized") and name not in self.__dict__:
            delattr(self._original_module, name)
        else:
            super().__delattr__(name)

    # ------------------------------------------------------------------ the call

    # torch.compile does not trace into it: onnxruntime runs the whole forward and backward
    @_SignedMethod
    @torch.compiler.disable
    def forward(self, *inputs, **kwargs):
        """Run the module's forward in ONNX Runtime (the first call exports it).

        Returns what the module's forward returns: tensors, or nested
        tuples, lists and dicts of tensors.
        """
        if self._fallback_reason is not None:
            return self._original_module(*inputs, **kwargs)
        tensors, call_spec = flatten_call(inputs, kwargs)
        key = call_key(self._original_module, tensors, call_spec)
        call = self._calls.get(key)
        weights = call.weights(self._original_module) if call is not None else None
        if weights is not None:
            graphs, feeds = call.graphs, call.feeds(tensors, weights)
        else:
            self._calls.forget_views()  # what changed may have moved the weights
            device = self._check_devices(tensors)
            try:
                graphs, weights, guard = self._graphs(tensors, call_spec, device)
            except _Unsupported as exc:
                return self._fall_back(str(exc), exc.__cause__, inputs, kwargs)
            call = feeds = None
        if graphs.checked:
            try:
                outputs = RunGraphs.apply(graphs, feeds, *tensors, *weights)
            except Exception as exc:
                raise _as_torch_error(exc) from exc
        else:
            try:
                outputs = self._first_run(graphs, tensors, weights)
            except _Unsupported as exc:
                return self._fall_back(str(exc), exc.__cause__, inputs, kwargs)
        if call is None:
            self._calls.remember(key, Call(
                graphs, guard, self._weight_table.places(graphs.exported.weights),
                weights[0].device if weights else None, [w.requires_grad for w in weights]))
        if graphs.counters:
            with torch.no_grad():
                for counter in self._weight_table.tensors(graphs.counters):
                    counter.add_(1)
        return unflatten(graphs.output_spec, outputs)

    def _first_run(self, graphs: Graphs, tensors, weights):
        """The first run of new graphs: a kernel onnxruntime lacks may fail only now
        (LSTM in float64), and the buffers it wrote are restored then."""
        buffers = {n: b.detach().clone() for n, b in self._original_module.named_buffers()}
        try:
            outputs = RunGraphs.apply(graphs, None, *tensors, *weights)
        except Exception as exc:  # noqa: BLE001 - any failure of a first run means fallback
            with torch.no_grad():
                for name, value in buffers.items():
                    self._original_module.get_buffer(name).copy_(value)
            error = _as_torch_error(exc)
            if error is not exc:  # the data's fault (an index out of range), not the graph's
                raise error from exc
            raise _Unsupported(f"{type(exc).__name__}: {exc}") from exc
        graphs.checked = True
        return outputs

    def _check_devices(self, tensors) -> str:
        """The device the graphs of this call run on (``'cpu'``, ``'cuda:N'``,
        ``'webgpu:N'``), from the tensors' and the ``device`` option."""
        first = self._weight_table.first()
        device = first.device if first is not None else (
            tensors[0].device if tensors else torch.device("cpu"))
        for i, t in enumerate(tensors):
            if t.device != device:
                raise ValueError(f"Input tensor {i} is on {t.device}, the module on {device}: "
                                 "move them to the same device.")
        if self._device is not None:
            if device.type != "cpu":
                raise ValueError(
                    f"ORTModule(device={self._device!r}) reads the module's tensors on the "
                    f"CPU (onnxruntime copies them to the GPU at each run); they are on "
                    f"{device}: move the module and its inputs to the CPU.")
            return self._device
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"ORTModule runs on cpu or cuda, not on {device} "
                             "(device='webgpu' runs the graphs of CPU tensors on a GPU).")
        return "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"

    def _log(self, level: int, message: str, *args) -> None:
        if level >= self._debug_options.log_level.logging_level:
            logger.log(level, message, *args)

    def _fall_back(self, reason: str, cause, inputs, kwargs):
        message = (f"ORTModule runs {type(self._original_module).__name__} in torch, not in "
                   f"ONNX Runtime: {reason}")
        if self._debug_options.fallback_disabled:
            raise ORTModuleTorchModelException(message) from cause
        self._fallback_reason = reason
        warnings.warn(message, UserWarning, stacklevel=_caller_stacklevel())
        self._log(logging.INFO, message)  # the UserWarning is the console line
        return self._original_module(*inputs, **kwargs)

    # ------------------------------------------------------------------ graphs

    def _graphs(self, tensors, call_spec, device):
        """The graphs of this call, the weight tensors they read and the guard of their
        export (exported and built on the first call of a schema, and again when the
        module changed since)."""
        with self._lock:
            if not torch.is_inference_mode_enabled():
                return self._graphs_locked(tensors, call_spec, device)
            # A call under torch.inference_mode exports outside it (the probe and the
            # exporters read versions and record an autograd graph, which inference tensors
            # have not), gradients still off (inference_mode(False) turns them on).
            with torch.inference_mode(False), torch.no_grad():
                return self._graphs_locked(tensors, call_spec, device)

    def _graphs_locked(self, tensors, call_spec, device):
        module = self._original_module
        train = module.training
        key = (train, device, schema_key(call_spec), tuple((t.dtype, t.dim()) for t in tensors))
        schema = self._schemas.get(key)
        if schema is None:
            parse_device(device)  # a CUDA module needs the CUDA provider
            schema = self._schemas[key] = _Schema()
        index = next((i for i, (exported, _, guard) in enumerate(schema.exports)
                      if exported.accepts(tensors) and guard.holds(module)), None)
        if index is None:
            index = self._specialize(schema, tensors, train, device)
        if index is None:
            changed = next((guard.difference(module) for exported, _, guard in schema.exports
                            if exported.accepts(tensors)), None)
            if changed is not None:
                if len(schema.exports) >= MAX_EXPORTS_PER_SCHEMA:
                    raise _Unsupported(
                        f"the module changed between calls {len(schema.exports)} times (last: "
                        f"{changed}), and each change needs another export; keep what "
                        "forward reads fixed during training, or pass it as an input")
                self._log(logging.INFO, "Exporting %s again: %s changed.",
                          type(module).__name__, changed)
                self._weight_table.refresh()
            *export, built = self._export_for(schema, tensors, call_spec, train, device)
            schema.exports.append(tuple(export))
            index = len(schema.exports) - 1
            schema.graphs[(index, built[0])] = built[1]
        exported, output_spec, guard = schema.exports[index]
        weights = self._weight_table.tensors(exported.weights)
        wrt = self._wrt(exported, tensors, weights)
        graphs = schema.graphs.get((index, wrt))
        if graphs is None:
            graphs = self._build(exported, output_spec, wrt, train, device)
            schema.graphs[(index, wrt)] = graphs
        return graphs, weights, guard

    def _export_for(self, schema: _Schema, tensors, call_spec, train: bool, device):
        """:meth:`_export` of a call of ``schema``: for this call's shapes at first (the
        exporters take about twice as long with symbolic ones), with symbolic dimensions
        once the shapes changed, or, where that export fails (a size read as a number:
        ``ignore_index=x.size(1)``), for each new shape, up to ``MAX_EXPORTS_PER_SCHEMA``."""
        shapes_changed = any(not exported.accepts(tensors) for exported, _, _ in schema.exports)
        if shapes_changed and schema.symbolic_failure is None:
            try:
                return self._export(tensors, call_spec, train, device, dynamic=True)
            except _Unsupported as exc:
                schema.symbolic_failure = str(exc)
                self._log(logging.INFO, "The export with symbolic dimensions failed (%s); "
                          "exporting for each shape.", exc)
        if shapes_changed and len(schema.exports) >= MAX_EXPORTS_PER_SCHEMA:
            raise _Unsupported(
                f"the input shapes changed {len(schema.exports)} times and the module cannot "
                f"be exported with symbolic dimensions ({schema.symbolic_failure}); keep the "
                "shapes fixed (pad the batches) or make the sizes forward reads tensors")
        return self._export(tensors, call_spec, train, device, dynamic=False)

    def _specialize(self, schema: _Schema, tensors, train: bool, device) -> int | None:
        """The index of a new entry of ``schema``: an export specialized to these tensors'
        shapes from a symbolic one that holds (None if there is none)."""
        module = self._original_module
        for exported, output_spec, guard in schema.exports:
            symbolic = exported.symbolic
            if symbolic is None or not symbolic.accepts(tensors) or not guard.holds(module):
                continue
            specialized = symbolic.specialized(tensors)
            wrt = self._wrt(specialized, tensors,
                            self._weight_table.tensors(specialized.weights))
            graphs = self._build(specialized, output_spec, wrt, train, device)
            schema.exports.append((specialized, output_spec, guard))
            schema.graphs[(len(schema.exports) - 1, wrt)] = graphs
            return len(schema.exports) - 1
        return None

    @staticmethod
    def _wrt(exported: Exported, tensors, weights) -> tuple:
        """The graph inputs of this call that need a gradient."""
        if not torch.is_grad_enabled():
            return ()
        return tuple(name for name, t in zip(exported.inputs + exported.weights,
                                             [*tensors, *weights]) if t.requires_grad)

    def _export(self, tensors, call_spec, train: bool, device, dynamic: bool):
        """``(exported, output spec, guard, (wrt, graphs))``: the export of this call and its
        graphs, with symbolic dimensions if ``dynamic``, else for these shapes. With
        ``exporter='auto'``, an export whose graphs cannot be built (an operator without
        a gradient rule, a graph onnxruntime refuses) is tried with the next exporter."""
        module = self._original_module
        output_spec, n_outputs, reads, branches = _probe(module, tensors, call_spec)
        guard = Guard(module, reads)
        failures = []  # (exporter, why, exception)
        for exporter in self._exporters:
            if exporter == "torchscript" and branches:
                # the dynamo exporter refuses such a branch; a trace would keep this one
                why = (f"the forward branches on a tensor's value ({', '.join(branches[:3])}), "
                       "which a trace records as the branch of its first call; write it with "
                       "torch.where or torch.cond")
                failures.append((exporter, why, None))
                continue
            folder = cache_dir()
            key = cache_key(module, tensors, call_spec, exporter, dynamic) if folder else None
            exported = load_export(folder, key) if folder else None
            if exported is not None:
                self._log(logging.INFO, "Loaded the %s export of %s (%s mode) from %s.",
                          exporter, type(module).__name__, "train" if train else "eval",
                          folder)
            else:
                try:
                    exported = export_call(module, tensors, call_spec, n_outputs, train=train,
                                           exporter=exporter, dynamic=dynamic)
                except Exception as exc:  # noqa: BLE001 - any exporter failure: fallback
                    failures.append((exporter, "torch.onnx.export failed "
                                     f"({_first_line(exc)})", exc))
                    self._log(logging.INFO, "The %s exporter failed: %s", exporter, exc)
                    continue
                self.export_count += 1
                self._log(logging.INFO, "Exported %s (%s mode) with the %s exporter %s.",
                          type(module).__name__, "train" if train else "eval", exporter,
                          "with symbolic dimensions" if dynamic else "for the call's shapes")
                if folder:
                    store_export(folder, key, exported)
            wrt = self._wrt(exported, tensors, self._weight_table.tensors(exported.weights))
            try:
                graphs = self._build(exported, output_spec, wrt, train, device)
            except _Unsupported as exc:
                # a rule that needs static lengths (AveragePool, Resize): the graphs of
                # this call's shapes, built again for each new shape (no new export)
                self._log(logging.INFO, "The graphs of the %s export failed (%s); building "
                          "them for the shapes of this call.", exporter, exc)
                exported = exported.specialized(tensors)
                try:
                    graphs = self._build(exported, output_spec, wrt, train, device)
                except _Unsupported as again:
                    failures.append((exporter, str(again), again.__cause__))
                    continue
            return exported, output_spec, guard, (wrt, graphs)
        if len(failures) == 1:
            raise _Unsupported(failures[0][1]) from failures[0][2]
        raise _Unsupported("; ".join(f"{exporter}: {why}" for exporter, why, _ in failures)
                           ) from next((exc for *_, exc in failures if exc is not None), None)

    def _build(self, exported: Exported, output_spec, wrt, train: bool, device) -> Graphs:
        options = self._debug_options
        prefix = (os.path.join(options.save_path, options.onnx_prefix)
                  if options.save_onnx else None)
        try:
            graphs = build_graphs(exported, output_spec, wrt, train=train,
                                  device=device, log_level=options.log_level,
                                  save_prefix=prefix)
        except Exception as exc:  # noqa: BLE001 - any failure here means fallback
            raise _Unsupported(f"{type(exc).__name__}: {exc}") from exc
        counters = [name.removesuffix("running_mean") + "num_batches_tracked"
                    for name in graphs.updated if name.endswith("running_mean")]
        graphs.counters = [name for name in counters if name in self._weight_table]
        return graphs

    # ------------------------------------------------------------------ nn.Module API

    @property
    def module(self) -> torch.nn.Module:
        """The wrapped ``torch.nn.Module``."""
        return self._original_module

    def add_module(self, name: str, module: torch.nn.Module | None) -> None:
        """Raise :class:`ORTModuleTorchModelException`: an ORTModule takes no new module."""
        raise ORTModuleTorchModelException(
            "ORTModule does not support adding modules to it; add it to the wrapped module "
            "before wrapping it.")

    def train(self, mode: bool = True):
        """Set train (``mode=True``) or eval mode on the wrapped module; each mode has its
        graphs."""
        self.training = mode
        self._original_module.train(mode)
        return self

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """The wrapped module's ``state_dict`` (same keys, no wrapper prefix)."""
        return self._original_module.state_dict(*args, destination=destination,
                                                prefix=prefix, keep_vars=keep_vars)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load into the wrapped module; the graphs read the parameters at each call."""
        if assign:
            raise ValueError("load_state_dict(assign=True) would replace the parameters the "
                             "optimizer holds; load values in place (assign=False).")
        return self._original_module.load_state_dict(state_dict, strict=strict)

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True):
        """The wrapped module's ``named_parameters`` (same names), then those registered on
        the wrapper itself (``register_parameter``)."""
        yield from self._original_module.named_parameters(
            prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)
        yield from _own(self._parameters, prefix)

    def parameters(self, recurse: bool = True):
        """The wrapped module's parameters (and the wrapper's own): give them to the
        optimizer."""
        for _, parameter in self.named_parameters(recurse=recurse):
            yield parameter

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True):
        """The wrapped module's ``named_buffers`` (same names), then those registered on
        the wrapper itself (``register_buffer``)."""
        yield from self._original_module.named_buffers(
            prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)
        yield from _own(self._buffers, prefix)

    def buffers(self, recurse: bool = True):
        """The wrapped module's buffers, and the wrapper's own."""
        for _, buffer in self.named_buffers(recurse=recurse):
            yield buffer

    def named_children(self):
        """The wrapped module's ``named_children``."""
        yield from self._original_module.named_children()

    def named_modules(self, *args, **kwargs):
        """The wrapped module's ``named_modules``."""
        yield from self._original_module.named_modules(*args, **kwargs)

    def get_submodule(self, target: str) -> torch.nn.Module:
        """The wrapped module's submodule ``target``."""
        return self._original_module.get_submodule(target)

    def get_parameter(self, target: str) -> torch.nn.Parameter:
        """The wrapped module's parameter ``target``."""
        return self._original_module.get_parameter(target)

    def get_buffer(self, target: str) -> torch.Tensor:
        """The wrapped module's buffer ``target``."""
        return self._original_module.get_buffer(target)

    def register_state_dict_pre_hook(self, hook):
        """Registered on the wrapped module, whose ``state_dict`` this is."""
        return self._original_module.register_state_dict_pre_hook(hook)

    def register_state_dict_post_hook(self, hook):
        """Registered on the wrapped module, whose ``state_dict`` this is."""
        return self._original_module.register_state_dict_post_hook(hook)

    def register_load_state_dict_pre_hook(self, hook):
        """Registered on the wrapped module, which ``load_state_dict`` loads."""
        return self._original_module.register_load_state_dict_pre_hook(hook)

    def register_load_state_dict_post_hook(self, hook):
        """Registered on the wrapped module, which ``load_state_dict`` loads."""
        return self._original_module.register_load_state_dict_post_hook(hook)

    def _apply(self, fn, recurse=True):
        # .to(), .cuda(), .double(): the graphs of the old device or dtype stay cached by
        # their key; the tensors are read again at each call, and the views of the old
        # ones are dropped (they would keep the old memory alive).
        self._calls.forget_views()
        self._original_module._apply(fn, recurse)
        return self

    def __getstate__(self):
        # onnxruntime's sessions cannot be copied or pickled: a copy (copy.deepcopy, pickle)
        # exports again on its first call.
        state = dict(self.__dict__)
        state["_schemas"] = {}
        state["_calls"] = CallMemo()
        del state["_lock"]
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__["_lock"] = threading.RLock()

    def _replicate_for_data_parallel(self):
        raise NotImplementedError("ORTModule does not support torch.nn.DataParallel; use "
                                  "one ORTModule per process (DistributedDataParallel).")


def _own(tensors: dict, prefix: str):
    """``(name, tensor)`` of the tensors a wrapper registered on itself."""
    for name, tensor in tensors.items():
        if tensor is not None:
            yield (f"{prefix}.{name}" if prefix else name), tensor


def _wrapped_keys(module, state_dict, prefix, *args) -> None:
    """Load-state-dict pre-hook of an ORTModule: its keys ``prefix + name`` (what
    :meth:`ORTModule.state_dict` writes) are the wrapped module's
    ``prefix + '_original_module.' + name``."""
    inner = prefix + "_original_module."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)


_BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d,
                torch.nn.SyncBatchNorm)


class _Unsupported(Exception):
    """The call cannot run in ONNX Runtime; the message says why (for the warning)."""


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside ortlearn.torch and torch.nn: the
    user's call of the module, for the warning to point at."""
    inside = (os.path.dirname(__file__), os.path.dirname(torch.nn.__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def _as_torch_error(exc: Exception) -> Exception:
    """The error torch raises for what onnxruntime refused in ``exc`` (an index out of range:
    torch's ``IndexError``), else ``exc`` itself."""
    message = str(exc)
    if "out of data bounds" in message or "out of bounds" in message:
        detail = message.split("Status Message:")[-1].strip()
        return IndexError(f"index out of range in self ({detail})")
    return exc


def _first_line(error: Exception) -> str:
    # torch colours its error messages for terminals; a warning is plain text.
    lines = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _probe(module: torch.nn.Module, tensors, call_spec):
    """Run ``module`` once in torch: the structure of its output, its number of tensors and
    the submodules' attributes forward read; :class:`_Unsupported` if its autograd graph
    holds a custom ``autograd.Function`` (the export would keep its forward and drop its
    backward), a BatchNorm with ``momentum=None`` (a cumulative average the graph does
    not reproduce) or a forward that changes an input in place (checked on copies: the
    caller's tensors change once, in the call that counts); and where forward branches
    on a tensor's value."""
    for name, sub in module.named_modules():
        if (isinstance(sub, _BATCH_NORMS) and sub.training
                and sub.track_running_stats and sub.momentum is None):
            raise _Unsupported(f"the BatchNorm {name!r} has momentum=None (a cumulative "
                               "average of the batch statistics), which ORTModule does not "
                               "reproduce; give it a momentum")
    copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    versions = [c._version for c in copies]
    args, kwargs = unflatten(call_spec, copies)
    with state_restored(module) as written, torch.enable_grad(), \
            recording_reads(module) as reads, recording_branches() as branches:
        out = module(*args, **kwargs)
    changed = [i for i, (c, v) in enumerate(zip(copies, versions)) if c._version != v]
    if changed:
        raise _Unsupported(
            f"forward changes its input tensor {changed[0]} in place, which an ONNX graph "
            "cannot do to its inputs; work on a copy (x = x + 1, not x.add_(1))")
    carried = _running_statistics(module)
    written = [name for name in written if name not in carried]
    if written:
        raise _Unsupported(
            f"forward changes {written[0]!r} of the module in place, which the exported "
            "graph would not do (an ONNX graph does not write its inputs; ORTModule carries "
            "back BatchNorm's running statistics only); update it outside forward, or return "
            "its new value and assign it in the training loop")
    flat, output_spec = flatten(out)
    custom = _custom_functions(flat)
    if custom:
        raise _Unsupported(
            f"it calls the custom torch.autograd.Function {', '.join(custom)}: the ONNX export "
            "keeps its forward and drops its backward, so the gradients would differ")
    return output_spec, len(flat), reads, branches


def _running_statistics(module: torch.nn.Module) -> set:
    """The ``state_dict`` names of the statistics train-mode BatchNorms update (the graphs
    return their new values, :func:`~ortlearn.graph.add_running_statistics_updates`)."""
    names = set()
    for name, sub in module.named_modules():
        if isinstance(sub, _BATCH_NORMS) and sub.training and sub.track_running_stats:
            prefix = f"{name}." if name else ""
            names |= {prefix + s for s in ("running_mean", "running_var",
                                           "num_batches_tracked")}
    return names


def _custom_functions(outputs) -> list[str]:
    """Names of the custom ``torch.autograd.Function`` classes in the autograd graph."""
    seen, found = set(), []
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if isinstance(fn, torch.autograd.function.BackwardCFunction):
            name = type(fn).__name__.removesuffix("Backward")
            if name not in found:
                found.append(name)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return found
