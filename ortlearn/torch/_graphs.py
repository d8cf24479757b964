"""The forward and backward sessions of one exported call, and how tensors cross into them.

Tensors cross without copies: an input is bound by its data pointer
(``IOBinding.bind_input``), an output is allocated by onnxruntime and handed
to torch by DLPack, on the CPU and on CUDA alike. On WebGPU (whose tensors
torch cannot hold) the inputs are CPU tensors that onnxruntime copies to the
GPU at each run, and the outputs come back to the CPU.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch.autograd.function import once_differentiable

from ..autodiff import build_forward_backward
from ..fileio import save_model
from ..graph.batch_norm import add_running_statistics_updates
from ..graph.passes import CHEAPER_NODES, GPU_NODES, rewrite_model
from ..training.device import make_session, make_session_options, parse_device
from ..training.placement import warn_cpu_fallbacks
from ._export import Exported, TreeSpec

__all__ = ["Graphs", "RunGraphs", "build_graphs", "numpy_view", "run_session",
           "sessions_device"]

_NUMPY_DTYPES = {
    torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
    torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
    torch.uint8: np.uint8, torch.bool: np.bool_,
}


@dataclass
class Graphs:
    """The sessions of one exported call in one mode, and the names that connect them.

    ``forward`` reads :attr:`inputs` (the call's tensors, then the weights)
    and returns the call's outputs, the new running statistics
    (:attr:`updated`), then the values the backward needs (:attr:`saved`).
    ``backward`` (None when nothing requires a gradient) reads the
    cotangents, the saved values and :attr:`reused` inputs, and returns the
    gradients of :attr:`gradients`.
    """

    exported: Exported
    output_spec: TreeSpec
    forward: ort.InferenceSession
    backward: ort.InferenceSession | None
    inputs: list
    outputs: list
    updated: dict = field(default_factory=dict)
    saved: list = field(default_factory=list)
    cotangents: dict = field(default_factory=dict)
    reused: list = field(default_factory=list)
    gradients: dict = field(default_factory=dict)
    #: The ``num_batches_tracked`` buffers to step after each run (train-mode BatchNorm:
    #: the exporters drop that update).
    counters: list = field(default_factory=list)
    #: Whether a forward run succeeded (the first one may still fall back to torch).
    checked: bool = False

    def __post_init__(self):
        # Positions computed once: a call of a small model takes about as long in Python
        # as in its sessions.
        #: What the forward session returns, each name once.
        self.forward_outputs = list(dict.fromkeys([*self.outputs, *self.updated.values(),
                                                   *self.saved]))
        returned = {name: i for i, name in enumerate(self.forward_outputs)}
        position = {name: i for i, name in enumerate(self.inputs)}
        output_index = {name: i for i, name in enumerate(self.outputs)}
        self._output_slots = [returned[name] for name in self.outputs]
        self._updates = [(position[name], returned[out]) for name, out in self.updated.items()]
        self._reused_positions = [position[name] for name in self.reused]
        # A saved value that is also an output goes through save_for_backward (changed in
        # place before the backward, it raises, as in torch); the others only the
        # backward reads: kept as the session returned them.
        self._saved_outputs = [output_index[n] for n in self.saved if n in output_index]
        self._saved_slots = [returned[n] for n in self.saved if n not in output_index]
        self._non_differentiable = [i for i, name in enumerate(self.outputs)
                                    if name not in self.cotangents]
        self._cotangent_slots = [output_index[out] for out in self.cotangents]
        self._backward_inputs = [*self.cotangents.values(),
                                 *[n for n in self.saved if n not in output_index],
                                 *[n for n in self.saved if n in output_index], *self.reused]
        self._gradient_names = list(self.gradients.values())
        gradient_index = {name: i for i, name in enumerate(self.gradients)}
        self._gradient_slots = [gradient_index.get(name) for name in self.inputs]


def _backward(ctx, *grad_outputs):
    graphs: Graphs = ctx.graphs
    if graphs.backward is None:
        return (None,) * (2 + len(graphs.inputs))
    values = [grad_outputs[i] for i in graphs._cotangent_slots]
    values += ctx.kept
    # unpacked for torch's check that none changed in place since; the reused inputs are
    # read as the forward session read them
    values += ctx.saved_tensors[:len(graphs._saved_outputs)]
    values += ctx.reused
    grads = run_session(graphs.backward, graphs._backward_inputs, values,
                        graphs._gradient_names)
    return (None, None,
            *[None if i is None else _tensor(grads[i]) for i in graphs._gradient_slots])


_backward_once = once_differentiable(_backward)


class RunGraphs(torch.autograd.Function):
    """One call of the forward session; its backward runs the backward session.

    ``tensors`` are the graph inputs in order (the call's tensors, then the
    weights): torch autograd routes the gradients to them, accumulating into
    ``param.grad`` as for any torch operation.
    """

    @staticmethod
    def forward(ctx, graphs: Graphs, feeds, *tensors):
        # feeds: what the session reads for tensors (numpy views kept by the caller), or None
        feeds = session_feeds(feeds or tensors)
        values = run_session(graphs.forward, graphs.inputs, feeds, graphs.forward_outputs)
        for position, slot in graphs._updates:
            tensors[position].copy_(_tensor(values[slot]))
        outputs = [_tensor(values[i]) for i in graphs._output_slots]
        ctx.graphs = graphs
        ctx.kept = [values[i] for i in graphs._saved_slots]
        ctx.reused = [feeds[i] for i in graphs._reused_positions]
        ctx.save_for_backward(*[outputs[i] for i in graphs._saved_outputs],
                              *[tensors[i] for i in graphs._reused_positions])
        if graphs._non_differentiable:
            ctx.mark_non_differentiable(*[outputs[i] for i in graphs._non_differentiable])
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        if torch.is_grad_enabled():
            # create_graph=True: these gradients have no graph, differentiating them raises
            return _backward_once(ctx, *grad_outputs)
        return _backward(ctx, *grad_outputs)


def build_graphs(exported: Exported, output_spec: TreeSpec, wrt: Sequence[str], *,
                 train: bool, device: str, log_level: int, save_prefix: str | None = None
                 ) -> Graphs:
    """Forward and backward sessions of ``exported``, differentiated w.r.t. ``wrt`` (graph
    input names: the call's tensors and weights that require a gradient).

    In train mode the running statistics of the BatchNormalization nodes are
    extra outputs (``<buffer>.updated``, torch's update rule). Off the CPU the
    graphs take the rewrites of a GPU provider (:data:`~ortlearn.graph.passes.GPU_NODES`);
    on WebGPU a warning names the nodes it would still leave to the CPU.
    """
    model = onnx.ModelProto()
    model.CopyFrom(exported.model)
    outputs = [o.name for o in model.graph.output]
    updated = add_running_statistics_updates(model, exported.weights) if train else []
    updated = {name: o.name for name, o in zip(updated, model.graph.output[len(outputs):])}
    mode = "training" if train else "inference"
    _save(save_prefix, f"torch_exported_{mode}", exported.model)
    _save(save_prefix, f"pre_grad_optimized_{mode}", model)
    options = make_session_options()
    options.log_severity_level = int(log_level)
    inputs = [*exported.inputs, *exported.weights]
    kind = parse_device(device).kind
    passes = CHEAPER_NODES if kind == "cpu" else GPU_NODES
    if not wrt:
        if kind != "cpu":
            model = rewrite_model(model, passes)
        _save(save_prefix, f"optimized_{mode}", model)
        _save(save_prefix, f"forward_{mode}", model)
        if kind == "webgpu":
            warn_cpu_fallbacks(model, f"ORTModule's {mode} graph")
        return Graphs(exported, output_spec, make_session(model, device, options), None,
                      inputs, outputs, updated)
    fb = build_forward_backward(model, list(wrt), differentiable_outputs=outputs)
    forward, backward = rewrite_model(fb.forward, passes), rewrite_model(fb.backward, passes)
    if kind == "webgpu":
        warn_cpu_fallbacks(forward, "ORTModule's forward graph")
        warn_cpu_fallbacks(backward, "ORTModule's backward graph")
    if save_prefix is not None:
        _save(save_prefix, f"optimized_{mode}", _gradient_graph(fb, forward, backward))
    _save(save_prefix, f"forward_{mode}", forward)
    _save(save_prefix, f"backward_{mode}", backward)
    return Graphs(exported, output_spec, make_session(forward, device, options),
                  make_session(backward, device, options), inputs, outputs, updated,
                  fb.saved, fb.cotangents, fb.reused_inputs, fb.gradients)


def _gradient_graph(fb, forward: onnx.ModelProto, backward: onnx.ModelProto) -> onnx.ModelProto:
    """The forward and backward graphs as one (onnxruntime-training's "optimized" training
    model, for reading): inputs, then the outputs' cotangents; outputs, then the gradients."""
    first = onnx.ModelProto()
    first.CopyFrom(forward)
    # the backward's reads of the forward's inputs connect through outputs of the forward
    for name in fb.reused_inputs:
        first.graph.node.append(onnx.helper.make_node("Identity", [name], [f"{name}.reused"]))
        first.graph.output.append(onnx.helper.make_empty_tensor_value_info(f"{name}.reused"))
    io_map = [(s, s) for s in fb.saved] + [(f"{n}.reused", n) for n in fb.reused_inputs]
    merged = onnx.compose.merge_models(first, backward, io_map, prefix2="backward.")
    # each gradient named after its weight, as onnxruntime-training names them
    names = {f"backward.{g}": f"{w}_grad" for w, g in fb.gradients.items()}
    for output in merged.graph.output:
        if output.name in names:
            merged.graph.node.append(onnx.helper.make_node("Identity", [output.name],
                                                           [names[output.name]]))
            output.name = names[output.name]
    return merged


def _save(prefix: str | None, what: str, model: onnx.ModelProto) -> None:
    """Write the debug copy ``<prefix>_<what>.onnx``; a failure to write it is a warning,
    not a reason to stop training in ONNX Runtime."""
    if prefix is None:
        return
    path = os.path.abspath(f"{prefix}_{what}.onnx")
    try:
        save_model(model, path)
    except OSError as exc:
        warnings.warn(f"ORTModule could not write its debug copy {path} ({exc}); it trains "
                      "in ONNX Runtime without it.", RuntimeWarning, stacklevel=2)


def sessions_device(device) -> str | None:
    """ORTModule's ``device`` option as the device of its sessions: None (the tensors'
    device) or ``'webgpu:N'``; a ``ValueError`` for another, or where the provider is
    missing."""
    if device is None:
        return None
    if not isinstance(device, str) or device.partition(":")[0] != "webgpu":
        raise ValueError(
            f"device={device!r}: ORTModule runs on the device of the module's tensors (move "
            "the module with .to('cuda')); device= is for a provider torch has no device "
            "for: 'webgpu' or 'webgpu:N'.")
    return str(parse_device(device))  # names what is missing: the wheel, a GPU, Vulkan


def run_session(session: ort.InferenceSession, names: Sequence[str], values: Sequence,
                outputs: Sequence[str]) -> list:
    """Run ``session`` on the inputs ``names`` given ``values``; its outputs, without copies.

    The values are torch tensors on the session's device (the CPU's for a
    WebGPU session) or values this function returned. On the CPU, onnxruntime
    reads numpy views of the tensors in place and its outputs come back as
    numpy arrays (:func:`_tensor` shares them with torch; a WebGPU session
    copies them to the GPU and back); on CUDA, inputs are bound by data
    pointer (``IOBinding``) and outputs come back as torch tensors by DLPack.
    """
    values = session_feeds(values)
    first = values[0] if values else None
    if not isinstance(first, torch.Tensor):
        return session.run(outputs, dict(zip(names, values)))
    binding = session.io_binding()
    kept = []
    for name, tensor in zip(names, values):
        tensor = tensor.detach().contiguous()
        kept.append(tensor)
        binding.bind_input(name, "cuda", tensor.device.index or 0, _numpy_dtype(tensor),
                           tuple(tensor.shape), tensor.data_ptr())
    index = first.device.index or 0
    for name in outputs:
        binding.bind_output(name, "cuda", index)
    # onnxruntime runs on its own stream: torch's pending work on the inputs first.
    torch.cuda.current_stream(first.device).synchronize()
    session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    values = binding.get_outputs_as_ortvaluevector()
    return [torch.from_dlpack(values.dlpack_at(i)) for i in range(len(outputs))]


def session_feeds(values: Sequence) -> Sequence:
    """``values`` as :func:`run_session` feeds them: numpy views on the CPU (made once,
    read again by the backward), CUDA tensors as they are."""
    first = values[0] if values else None
    if isinstance(first, torch.Tensor) and first.is_cuda:
        return values
    try:
        return [v if type(v) is np.ndarray else v.detach().numpy() for v in values]
    except TypeError:  # a dtype numpy lacks (bfloat16)
        for value in values:
            if isinstance(value, torch.Tensor):
                numpy_view(value)
        raise


def _tensor(value) -> torch.Tensor:
    """A value of :func:`run_session` as a torch tensor (sharing its memory)."""
    return torch.from_numpy(value) if type(value) is np.ndarray else value


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """The numpy array over a CPU tensor's memory; a ``TypeError`` naming a dtype numpy
    lacks."""
    _numpy_dtype(tensor)
    return tensor.detach().numpy()


def _numpy_dtype(tensor: torch.Tensor):
    try:
        return _NUMPY_DTYPES[tensor.dtype]
    except KeyError:
        raise TypeError(f"ORTModule cannot pass a tensor of dtype {tensor.dtype} to ONNX "
                        f"Runtime; supported: {sorted(map(str, _NUMPY_DTYPES))}.") from None
