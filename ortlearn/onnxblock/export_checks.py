"""Checks on a forward model exported by torch: can it train as the user expects?

torch 2.13's exporters can hand over a graph that trains something other than
the torch module (measured, ``doc/torch_models.rst``):

- the dynamo exporter's default ``optimize=True`` (onnxscript's rewriter)
  folds a BatchNorm into the Conv or Gemm before it (the weight keeps the
  torch name with fused values, the BatchNorm's parameters vanish), and folds
  the ``Transpose`` of a Linear weight into a constant ``val_<n>``; the
  TorchScript exporter's ``do_constant_folding=True`` does the same
  transpose fold into ``onnx::MatMul_<n>``;
- the dynamo exporter (onnxscript 0.7) writes every BatchNormalization in
  inference mode, even for a module in train mode: the training graph then
  normalises with the frozen running statistics, not the batch's.

:func:`check_exported_model` turns what the graph shows of these into a
``ValueError`` naming the folded parameters or a ``UserWarning`` naming the
BatchNormalization, each with the export recipe. It only speaks on evidence
in the graph (exporter-generated names, onnxscript's rewrite marks, the
exporter's record of the torch call), so models from other converters
(skl2onnx, hand-written graphs) pass silently.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence

import onnx
from onnx import numpy_helper

from ..graph import FLOAT_TYPES, attr, initializer_map

__all__ = ["RECIPE", "check_exported_model", "tied_parameter_hint"]

#: How to export a torch module for training (both exporters).
RECIPE = ("export for training with torch.onnx.export(model.train(), args, dynamo=True, "
          "optimize=False) or torch.onnx.export(model.train(), args, f, dynamo=False, "
          "training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False); see the "
          "user guide page 'Training torch models'")

# Names the exporters give to the constants they create: dynamo/onnxscript
# ``val_12``, TorchScript's constant folding ``onnx::MatMul_6``, and the
# ``*_transposed`` some optimizers write.
_EXPORTER_NAME = re.compile(r"^(val_\d+|onnx::\w+_\d+|.*_transposed)$")
# The name of a torch parameter or buffer in a state_dict: ``fc.weight``,
# ``layers.0.bn.running_var``, ``lstm.weight_ih_l0_reverse``.
_TORCH_NAME = re.compile(
    r"^([\w]+\.)*(weight|bias|running_mean|running_var|\w*(weight|bias)\w*|in_proj_\w+)$")
# Node metadata the exporters write (torch.onnx, onnxscript's rewriter).
_RULE_KEY = "pkg.onnxscript.rewriter.rule_name"
_FX_KEY = "pkg.torch.onnx.fx_node"


def _metadata(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def _exporter_constants(model: onnx.ModelProto) -> list[str]:
    """Float initializers and Constant outputs named by an exporter, not after a parameter."""
    names = [i.name for i in model.graph.initializer if i.data_type in FLOAT_TYPES]
    names += [n.output[0] for n in model.graph.node
              if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
              and attr(n, "value") is not None and attr(n, "value").data_type in FLOAT_TYPES
              and len(attr(n, "value").dims) >= 1]
    return [n for n in names if _EXPORTER_NAME.match(n)]


def _rewritten_nodes(model: onnx.ModelProto) -> list[str]:
    """``"Conv 'node_Conv_7' (FuseBatchNormIntoConv)"`` for each node onnxscript's rewriter made."""
    out = []
    for node in model.graph.node:
        rule = _metadata(node).get(_RULE_KEY)
        if rule:
            out.append(f"{node.op_type} {node.name!r} ({rule})")
    return out


def tied_parameter_hint(model: onnx.ModelProto, requires_grad, frozen) -> str:
    """For a torch export, the sentence that explains a parameter name missing from the graph
    by a tie (empty for other models)."""
    if model.producer_name != "pytorch":
        return ""
    unnamed = sorted(set(initializer_map(model.graph)) - set(requires_grad) - set(frozen))
    return (" torch exports a tied parameter (one tensor under two names, such as an "
            "embedding and a language-model head) under one of its names, which need not be "
            "the one named_parameters() lists (dict(module.named_parameters("
            "remove_duplicate=False)) lists them all): pass the name the graph has; the "
            f"initializers named in neither list are {unnamed}.")


def _check_folded_parameters(model, requires_grad, frozen) -> None:
    inits = initializer_map(model.graph)
    unknown = [n for n in [*requires_grad, *frozen] if n not in inits]
    torch_like = [n for n in unknown if _TORCH_NAME.match(n)]
    if not torch_like:
        return
    constants, rewritten = _exporter_constants(model), _rewritten_nodes(model)
    if not constants and not rewritten:
        return
    evidence = []
    if constants:
        evidence.append(f"constants named by the exporter ({constants[:8]})")
    if rewritten:
        evidence.append(f"nodes made by onnxscript's optimizer ({rewritten[:8]})")
    raise ValueError(
        f"Parameters {torch_like} are not initializers of the model, which holds "
        f"{' and '.join(evidence)}: the exporter folded these torch parameters away "
        "(a Linear weight transposed into a renamed constant, a BatchNorm merged into the "
        f"Conv or Gemm before it), so they cannot be trained under their torch names. "
        f"{RECIPE[0].upper()}{RECIPE[1:]}. The model's initializers are {sorted(inits)}."
        f"{tied_parameter_hint(model, requires_grad, frozen)}")


def _warn_fused_weights(model, requires_grad) -> None:
    """A trained weight feeding a node into which the rewriter folded a BatchNorm."""
    trained = set(requires_grad)
    for node in model.graph.node:
        rule = _metadata(node).get(_RULE_KEY, "")
        if not rule.startswith("FuseBatchNorm"):
            continue
        fused = [n for n in node.input if n in trained]
        if fused:
            warnings.warn(
                f"{node.op_type} node {node.name!r} holds a BatchNormalization that "
                f"onnxscript's optimizer folded into it (rule {rule}): the trained {fused} "
                "are the fused values, not the torch parameters of that name, and the "
                "BatchNorm trains neither its scale and bias nor its statistics; "
                f"{RECIPE}.", UserWarning, stacklevel=5)


def _is_training_mode(node: onnx.NodeProto) -> bool:
    return bool(attr(node, "training_mode", 0))


def _train_mode_evidence(model: onnx.ModelProto, node: onnx.NodeProto) -> str | None:
    """Why the torch module looks exported in train mode, or None."""
    fx = _metadata(node).get(_FX_KEY, "")
    if "batch_norm" in fx and "no_training" not in fx:
        return ("the exporter recorded a train-mode torch batch_norm call for it "
                "(the dynamo exporter through onnxscript 0.7 writes BatchNormalization in "
                "inference mode whatever the module's mode)")
    constants = {n.output[0]: attr(n, "value") for n in model.graph.node
                 if n.op_type == "Constant" and attr(n, "value") is not None}
    constants.update(initializer_map(model.graph))
    for other in model.graph.node:
        if other.op_type == "Dropout" and len(other.input) > 2 and other.input[2] in constants:
            value = numpy_helper.to_array(constants[other.input[2]])
            if value.size == 1 and bool(value.reshape(-1)[0]):
                return f"the graph has Dropout node {other.name!r} in training mode"
    return None


def _warn_inference_batchnorm(model, requires_grad, frozen) -> None:
    trained, kept = set(requires_grad), set(frozen)
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        if _is_training_mode(node):
            continue
        params, stats = list(node.input[1:3]), list(node.input[3:5])
        # (running statistics are never trained: graph.prepare.select_trainable freezes them)
        trained_params = [n for n in params if n in trained]
        frozen_stats = [n for n in stats if n in kept]
        if not (trained_params or frozen_stats):
            continue
        what = []
        if trained_params:
            what.append(f"its scale/bias {trained_params} are trained")
        if frozen_stats:
            what.append(f"its running statistics {frozen_stats} are kept in the checkpoint")
        evidence = _train_mode_evidence(model, node)
        seen = f"; {evidence}" if evidence else ""
        warnings.warn(
            f"BatchNormalization node {node.name!r} is in inference mode (training_mode "
            f"absent or 0) while {' and '.join(what)}{seen}: training normalises with the "
            "frozen running statistics, which never change, not with the batch statistics "
            "torch uses in train mode. To train with batch statistics, export the module in "
            "train mode with the TorchScript exporter (torch.onnx.export(model.train(), args, "
            "f, dynamo=False, training=torch.onnx.TrainingMode.TRAINING, "
            "do_constant_folding=False)), which writes training_mode=1, or set "
            "training_mode=1 on this node (with its two running-statistics outputs); to keep "
            "the statistics frozen on purpose, ignore this warning.", UserWarning,
            stacklevel=5)


def check_exported_model(model: onnx.ModelProto, requires_grad: Sequence[str],
                         frozen: Sequence[str] = ()) -> None:
    """Refuse or warn about a forward model that cannot train as its torch module would.

    Called by :func:`ortlearn.artifacts.generate_artifacts` (through
    ``_build``) before the training graph is built; the warnings point at the
    caller of ``generate_artifacts``/``build_artifacts``.

    Parameters
    ----------
    model : onnx.ModelProto
        The forward model.
    requires_grad, frozen : sequence of str
        The names to train and to keep in the checkpoint.

    Raises
    ------
    ValueError
        When names in ``requires_grad`` or ``frozen`` look like torch
        parameters but are not initializers, and the graph shows that an
        exporter folded parameters into renamed constants (names ``val_<n>``,
        ``onnx::<Op>_<n>``, ``*_transposed``, or nodes marked by onnxscript's
        rewriter). The message gives the export recipe. Without such
        evidence nothing is raised here (the generic unknown-name error
        follows).

    Warns
    -----
    UserWarning
        For a BatchNormalization in inference mode whose scale or bias is
        trained, or whose running statistics are trained or frozen (they
        never change: the graph normalises with them); the message says why
        the module looks exported in train mode when the graph shows it.
        For a trained weight of a node into which onnxscript's optimizer
        folded a BatchNorm.
    """
    requires_grad, frozen = list(requires_grad), list(frozen)
    _check_folded_parameters(model, requires_grad, frozen)
    _warn_fused_weights(model, requires_grad)
    _warn_inference_batchnorm(model, requires_grad, frozen)
