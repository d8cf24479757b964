"""``generate_artifacts``: the training artifacts of ``onnxruntime.training.artifacts``,
in standard ONNX.

The files follow ``doc/artifacts_format.md`` and are read by
:class:`ortlearn.TrainingSession`. ``from onnxruntime.training import artifacts``
becomes ``from ortlearn import artifacts``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from enum import Enum
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from . import fileio
from .fileio import model_data_size, save_model
from .graph import (
    DEFAULT_OPSET,
    invalid_model_errors,
    load_model,
    opset_of,
    prune_model,
    rename_value,
    select_trainable,
)
from .graph.batch_norm import running_statistics
from .graph.passes import CHEAPER_NODES, rewrite_model
from .onnxblock import blocks
from .onnxblock import loss as loss_blocks
from .onnxblock import optim as optim_blocks
from .onnxblock.blocks import Block
from .onnxblock.export_checks import check_exported_model
from .onnxblock.model_accessor import base, empty_base
from .onnxblock.onnxblock import TrainingBlock
from .optim import Optimizer

__all__ = ["LossType", "OptimType", "build_artifacts", "export_training_artifacts",
           "generate_artifacts"]

#: Name of the loss output when a loss is added.
LOSS_OUTPUT = "loss"


class LossType(Enum):
    """Loss added by :func:`generate_artifacts` (same values as onnxruntime-training).

    - ``MSELoss`` = 1: :class:`ortlearn.onnxblock.loss.MSELoss`;
    - ``CrossEntropyLoss`` = 2: :class:`~ortlearn.onnxblock.loss.CrossEntropyLoss`
      (target: int64 class indices);
    - ``BCEWithLogitsLoss`` = 3: :class:`~ortlearn.onnxblock.loss.BCEWithLogitsLoss`;
    - ``L1Loss`` = 4: :class:`~ortlearn.onnxblock.loss.L1Loss`.

    All use ``reduction='mean'``; their target is the graph input ``target``,
    ``labels`` for ``CrossEntropyLoss`` (onnxruntime-training's names).
    """

    MSELoss = 1
    CrossEntropyLoss = 2
    BCEWithLogitsLoss = 3
    L1Loss = 4


class OptimType(Enum):
    """Optimizer of the optimizer model written by :func:`generate_artifacts`.

    Values 1 and 2 are those of onnxruntime-training, with its update rules
    and defaults; 3 to 6 are ortlearn's additions:

    - ``AdamW`` = 1: :class:`ortlearn.onnxblock.optim.AdamW` with its defaults,
      onnxruntime-training's AdamW (betas (0.9, 0.999), eps 1e-6, no weight
      decay, bias correction in the learning rate: :class:`ortlearn.optim.AdamW`);
    - ``SGD`` = 2: plain SGD (``p -= lr * g``);
    - ``Adam`` = 3: Adam as scikit-learn's MLP computes it (:class:`ortlearn.optim.Adam`);
    - ``SGDMomentum`` = 4: SGD with momentum 0.9;
    - ``SGDNesterov`` = 5: SGD with Nesterov momentum 0.9;
    - ``TorchAdamW`` = 6: ``torch.optim.AdamW`` with its defaults (eps 1e-8,
      weight decay 0.01: :class:`ortlearn.optim.TorchAdamW`).
    """

    AdamW = 1
    SGD = 2
    Adam = 3
    SGDMomentum = 4
    SGDNesterov = 5
    TorchAdamW = 6


_LOSSES = {
    LossType.MSELoss: loss_blocks.MSELoss,
    LossType.CrossEntropyLoss: loss_blocks.CrossEntropyLoss,
    LossType.BCEWithLogitsLoss: loss_blocks.BCEWithLogitsLoss,
    LossType.L1Loss: loss_blocks.L1Loss,
}
#: Lowest ai.onnx opset of an optimizer model (the blocks' ReduceSum reads its axes as an
#: input, as from opset 13).
MIN_OPTIMIZER_OPSET = 13

_OPTIMIZERS = {
    OptimType.AdamW: lambda: optim_blocks.AdamW(),
    OptimType.SGD: lambda: optim_blocks.SGD(),
    OptimType.Adam: lambda: optim_blocks.Adam(),
    OptimType.SGDMomentum: lambda: optim_blocks.SGD(momentum=0.9),
    OptimType.SGDNesterov: lambda: optim_blocks.SGD(momentum=0.9, nesterov=True),
    OptimType.TorchAdamW: lambda: optim_blocks.TorchAdamW(),
}


class _TrainingBlock(TrainingBlock):
    """Loss on the chosen outputs, the loss renamed ``loss``, then the extra outputs."""

    def __init__(self, loss_block: Block, rename_loss: bool, additional_output_names):
        super().__init__()
        self._loss = loss_block
        self._rename_loss = rename_loss
        self._additional = list(additional_output_names or [])

    def build(self, *inputs_to_loss):
        output = self._loss(*inputs_to_loss)
        names = [output] if isinstance(output, str) else list(output)
        model = self.base
        if (self._rename_loss and names[0] != LOSS_OUTPUT
                and any(names[0] in node.output for node in model.graph.node)
                and LOSS_OUTPUT not in _all_names(model)):
            rename_value(model, names[0], LOSS_OUTPUT)
            names[0] = LOSS_OUTPUT
        return [*names, *self._additional]


def _all_names(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    names = {i.name for i in g.input} | {i.name for i in g.initializer}
    for node in g.node:
        names.update(node.output)
    return names


def _loss_block(loss) -> Block:
    if loss is None:
        return blocks.PassThrough()
    if isinstance(loss, Block):
        return loss
    if isinstance(loss, LossType):
        return _LOSSES[loss]()
    raise TypeError(
        f"loss must be a LossType, an onnxblock.Block or None, got {loss!r}; "
        f"supported LossType values: {[t.name for t in LossType]}.")


class _SpecBlock(optim_blocks._OptimizerBlock):
    """The optimizer block of an :class:`ortlearn.optim.Optimizer` instance."""

    def __init__(self, spec: Optimizer):
        self.spec = spec


def _optimizer_block(optimizer) -> Block | None:
    if optimizer is None or isinstance(optimizer, Block):
        return optimizer
    if isinstance(optimizer, OptimType):
        return _OPTIMIZERS[optimizer]()
    if isinstance(optimizer, Optimizer):
        return _SpecBlock(optimizer)
    raise TypeError(
        f"optimizer must be an OptimType, an onnxblock optimizer block, an "
        f"ortlearn.optim.Optimizer or None, got {optimizer!r}; supported OptimType values: "
        f"{[t.name for t in OptimType]}.")


@contextlib.contextmanager
def _block_errors(what: str, block: Block):
    """onnx's checker and shape-inference errors about what ``block`` built, as ValueErrors.

    ortlearn documents ValueError for a model it cannot build; onnx's own
    exception classes would otherwise leak out of build_artifacts.
    """
    try:
        yield
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ValueError(
            f"The {what} block {type(block).__name__} built an invalid ONNX model: "
            f"{str(exc).rstrip('.')}. "
            "Check the nodes its build() adds (operator names, attributes, unique output "
            "names).") from exc


def _name_list(names, what: str) -> list[str]:
    if names is None:
        return []
    if isinstance(names, str):
        raise TypeError(f"{what} must be a list of names, got the string {names!r}.")
    names = list(names)
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"{what} names {duplicated} more than once.")
    return names


def _loss_inputs(model: onnx.ModelProto, loss, loss_input_names) -> list[str]:
    """Values fed to the loss: ``loss_input_names``, else the first output for a LossType
    loss and every output for a custom block (onnxruntime-training's behaviour)."""
    outputs = [o.name for o in model.graph.output]
    if loss_input_names is not None:
        names = _name_list(loss_input_names, "loss_input_names")
        unknown = [n for n in names if n not in _all_names(model)]
        if unknown:
            raise ValueError(f"loss_input_names {unknown} are not values of the model.")
        return names
    if not outputs:
        raise ValueError("The model has no output to put a loss on.")
    return outputs[:1] if isinstance(loss, LossType) else outputs


def _is_big(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is saved with its weights in an external ``.data`` file."""
    return model_data_size(model) > fileio.EXTERNAL_DATA_THRESHOLD


def _save(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` atomically: a failure leaves the file already at ``path`` intact."""
    save_model(model, path)


def _check_destination(artifact_directory, prefix) -> tuple[Path, str]:
    """The directory to write to, and how to name it in messages (as the user gave it).

    ValueError/TypeError before any work is done.
    """
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a string, got {type(prefix).__name__}.")
    if any(sep and sep in prefix for sep in (os.sep, os.altsep)):
        raise ValueError(f"prefix {prefix!r} contains a path separator: put directories in "
                         "artifact_directory.")
    if artifact_directory is None:
        return Path(os.getcwd()), ""
    if not isinstance(artifact_directory, (str, bytes, os.PathLike)):
        raise TypeError(f"artifact_directory must be a path, got "
                        f"{type(artifact_directory).__name__}.")
    given = os.fsdecode(os.fspath(artifact_directory))
    if not given:
        raise ValueError("artifact_directory is empty: name the directory to write the "
                         "artifacts to ('.' for the current one).")
    directory = Path(given)
    existing = directory
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"artifact_directory {given!r} cannot be used: "
                         f"{str(existing)!r} is a file, not a directory.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"artifact_directory {given!r} cannot be used: "
                         f"{str(existing)!r} is not writable.")
    return directory, given


def _file_names(prefix: str, optimizer: bool, nominal: bool, ort_format: bool) -> list[str]:
    """The names of the files generate_artifacts writes (besides external data)."""
    models = ["training_model", "eval_model"] + ["optimizer_model"] * optimizer
    return ([f"{prefix}{m}.onnx" for m in models] + [f"{prefix}checkpoint"]
            + [f"{prefix}nominal_checkpoint"] * nominal
            + [f"{prefix}{m}.ort" for m in models] * ort_format)


def _check_files(directory: Path, given: str, names: list[str]) -> None:
    """Refuse, before anything is written, a destination file that cannot be replaced.

    Each file is replaced atomically; checking them all first means a
    refusal leaves every file as it was, never some old and some new ones.
    Messages name the path as the user gave it (``given``).
    """
    if not directory.is_dir():
        return  # created empty: nothing in the way
    problems = []
    for name in names:
        shown = os.path.join(given, name) if given else name
        # a symbolic link is replaced, never written through (fileio.atomic_write)
        target = os.path.join(os.path.realpath(directory), name)
        if os.path.islink(target):
            continue
        if os.path.isdir(target):
            problems.append(f"{shown!r} is a directory")
        elif os.path.lexists(target) and not os.path.isfile(target):
            problems.append(f"{shown!r} is not a regular file")
        elif os.path.exists(target) and not os.access(target, os.W_OK):
            problems.append(f"{shown!r} is not writable")
        elif not os.access(os.path.dirname(target), os.W_OK | os.X_OK):
            problems.append(f"{shown!r} is in the directory {os.path.dirname(target)!r}, "
                            "which is not writable")
    if problems:
        where = f"artifact_directory {given!r}" if given else "the current directory"
        raise ValueError(
            f"The artifacts cannot be written into {where}: {'; '.join(problems)}. "
            "Nothing was written. Move or remove what is in the way (or make it writable), "
            "or choose another artifact_directory or prefix.")


def generate_artifacts(model, requires_grad=None, frozen_params=None, loss=None, optimizer=None,
                       artifact_directory=None, prefix: str = "", ort_format: bool = False,
                       custom_op_library=None, additional_output_names=None,
                       nominal_checkpoint: bool = False, loss_input_names=None) -> None:
    """Write the training, eval and optimizer models and the checkpoint of ``model``.

    Same signature as ``onnxruntime.training.artifacts.generate_artifacts``;
    the files are standard ONNX models and a safetensors checkpoint, laid out
    as ``doc/artifacts_format.md`` describes:

    - ``{prefix}training_model.onnx``: forward, loss, gradients of the loss
      w.r.t. ``requires_grad`` and their accumulation buffers;
    - ``{prefix}eval_model.onnx``: forward and loss, Dropout and
      BatchNormalization in inference mode;
    - ``{prefix}optimizer_model.onnx`` when ``optimizer`` is given;
    - ``{prefix}checkpoint`` (and ``{prefix}nominal_checkpoint`` if asked).

    The initializers in ``requires_grad`` and ``frozen_params`` become graph
    inputs whose values go to the checkpoint; other initializers stay in the
    models.

    Parameters
    ----------
    model : onnx.ModelProto or path
        Forward model (a path loads external data too, for models over 2 GB).
    requires_grad : list of str, default=None
        Initializers to train. None or empty: nothing is trained, as in
        onnxruntime-training (the initializers stay constants of the models,
        ``frozen_params`` go to the checkpoint; the training model computes
        the loss and no gradient). A constant (an initializer feeding only
        inputs that carry no gradient: a Dropout ratio, a shape) is never
        trained: named here, it joins the frozen parameters with a
        ``UserWarning``. A graph input named here gets its gradient as an
        output of the training model (``<input>_grad.accumulation.out``).
    frozen_params : list of str, default=None
        Initializers kept constant but stored in the checkpoint.
    loss : LossType or onnxblock.Block, default=None
        Loss added on the model's output(s), renamed ``loss``. A ``LossType``
        takes the first output and a graph input ``target``; a custom block is
        called on every output (as onnxruntime-training does). None: no loss
        is added and the first output is differentiated.
    optimizer : OptimType, onnxblock optimizer block or ortlearn.optim.Optimizer, default=None
        None: no optimizer model. An :class:`ortlearn.optim.Optimizer`
        instance (``SGD(momentum=0.5)``, ``Adam(beta_1=0.8)``, ...) writes
        its update rule with its hyper-parameters. The optimizer model takes
        the parameters, gradients and states as tensor sequences, as
        onnxruntime-training's does (``doc/artifacts_format.md``): the
        trainable parameters must then share one element type.
    artifact_directory : str or path, default=None
        Where to write (created if missing). None: the current directory.
    prefix : str, default=''
        Prefix of every file name.
    ort_format : bool, default=False
        Also write each model in onnxruntime's ORT format (``training_model.ort``,
        ...), converted by onnxruntime itself as its
        ``convert_onnx_models_to_ort`` tool does (optimised on the CPU, with
        the optimizers ortlearn's sessions leave out left out). ``TrainingSession``
        and ``api.Module`` load them.
    custom_op_library : path, default=None
        Shared library of custom operators the model uses, registered in the
        sessions this function opens (the ORT-format conversion). Custom
        operators may sit where no gradient flows (a frozen branch, after the
        loss); a gradient through one needs a rule registered with
        :func:`ortlearn.autodiff.register_gradient`. Sessions running the
        artifacts need it too: register it in their ``session_options``
        (``SessionOptions.register_custom_ops_library``), as with
        onnxruntime-training.
    additional_output_names : list of str, default=None
        Values of the model added as outputs after the loss.
    nominal_checkpoint : bool, default=False
        Also write a checkpoint holding only the parameters' types and shapes.
    loss_input_names : list of str, default=None
        Values fed to the loss instead of the default outputs.

    Raises
    ------
    FileNotFoundError
        For a ``custom_op_library`` that does not exist.
    ValueError
        For a ``custom_op_library`` onnxruntime cannot load, an unknown,
        duplicated or both trainable and frozen parameter name, an
        ``optimizer`` with no parameter to train, an unknown loss input or
        output name, an ``artifact_directory`` that is a file or not writable,
        a ``prefix`` holding a path separator, a destination file that is a
        directory or not writable (the message names the paths as given),
        duplicated initializer names in ``model``, a loss or optimizer block
        that refers to or returns a name the model lacks or builds an invalid
        model, a model onnxruntime cannot convert to the ORT format. All
        checked before anything is written (the ORT conversion included), so
        a refusal leaves the files already in ``artifact_directory`` as they
        were; those are then replaced atomically, one by one.
    TypeError
        For an unsupported loss or optimizer, a trainable initializer that
        is not float32/float64, an ``artifact_directory`` that is not a path.

    Examples
    --------
    >>> from ortlearn import artifacts
    >>> # artifacts.generate_artifacts(model, requires_grad=["weight1", "bias1"],
    >>> #     loss=artifacts.LossType.CrossEntropyLoss,
    >>> #     optimizer=artifacts.OptimType.AdamW, artifact_directory="out")
    """
    library = None if custom_op_library is None else _check_custom_op_library(custom_op_library)
    directory, given = _check_destination(artifact_directory, prefix)
    # Every destination is checked before the (possibly long) build, and again
    # with the external-data files of big models before the first write.
    _check_files(directory, given, _file_names(prefix, optimizer is not None,
                                               nominal_checkpoint, ort_format))
    with invalid_model_errors(model):  # onnx's errors about the model, as ValueErrors
        training_model, eval_model, optim_model, trainable_params, frozen_tensors = _build(
            model, requires_grad, frozen_params, loss, optimizer, additional_output_names,
            loss_input_names)
        # read before any file is written (external data may be refused)
        values = ({t.name: numpy_helper.to_array(t) for t in trainable_params},
                  {t.name: numpy_helper.to_array(t) for t in frozen_tensors})
    models = {"training_model": training_model, "eval_model": eval_model,
              "optimizer_model": optim_model}
    _check_files(directory, given, [f"{prefix}{name}.onnx.data" for name, built
                                    in models.items() if built is not None and _is_big(built)])

    # Everything is built before the first file is written; each file is
    # replaced atomically, so a failure never leaves a half-written file.
    directory.mkdir(parents=True, exist_ok=True)
    # onnxruntime's conversion to the ORT format may fail (an operator it cannot
    # optimise): it runs before any file is replaced, into a staging directory.
    staging_dir = (tempfile.TemporaryDirectory(dir=directory, prefix=f".{prefix}artifacts.")
                   if ort_format else contextlib.nullcontext())
    with staging_dir as staging:
        staged_ort = {}
        if ort_format:
            for name, built in models.items():
                if built is not None:
                    staged = Path(staging) / f"{prefix}{name}.ort"
                    _save_ort(built, staged, library)
                    staged_ort[staged] = directory / staged.name
        for name, built in models.items():
            if built is not None:
                _save(built, directory / f"{prefix}{name}.onnx")
        _write_checkpoints(directory, prefix, values, nominal_checkpoint)
        for staged, target in staged_ort.items():
            os.replace(staged, target)


def _check_custom_op_library(path) -> str:
    """The library's path, once onnxruntime has loaded it (before anything is built)."""
    import onnxruntime as ort

    path = os.fsdecode(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"custom_op_library {path!r} does not exist.")
    try:
        ort.SessionOptions().register_custom_ops_library(path)
    except Exception as exc:
        raise ValueError(f"onnxruntime cannot load the custom_op_library {path!r}: {exc}") from exc
    return path


def _save_ort(model: onnx.ModelProto, path: Path, custom_op_library: str | None) -> None:
    """Write ``model`` in onnxruntime's ORT format, converted by onnxruntime itself.

    As ``onnxruntime.tools.convert_onnx_models_to_ort`` does (its ``Fixed``
    style): a CPU session optimises the model and saves it with
    ``session.save_model_format=ORT``. The optimizers ortlearn's sessions
    leave out stay out (:data:`ortlearn.training.device.DISABLED_OPTIMIZERS`:
    ConstantSharing would tie a BatchNorm's scale to its running variance),
    and so does the NCHWc layout the tool leaves out for portability.
    """
    import onnxruntime as ort

    from .training.device import DISABLED_OPTIMIZERS

    if _is_big(model):
        # A flatbuffer (the ORT format) has 32-bit offsets and no external data.
        raise ValueError(
            f"{path.name!r} cannot be converted to the ORT format: its weights take "
            f"{model_data_size(model) / 2**30:.1f} GiB, and an ORT-format file holds its "
            f"weights inline (at most {fileio.EXTERNAL_DATA_THRESHOLD / 2**30:.0f} GiB here). "
            "Pass ort_format=False: the .onnx files keep large weights in a .data file.")
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
        staged = Path(tmp) / path.name
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        so.optimized_model_filepath = os.fspath(staged)
        so.add_session_config_entry("session.save_model_format", "ORT")
        so.add_session_config_entry("session.qdqisint8allowed", "0")
        if custom_op_library is not None:
            so.register_custom_ops_library(custom_op_library)
        try:
            ort.InferenceSession(model.SerializeToString(), sess_options=so,
                                 providers=["CPUExecutionProvider"],
                                 disabled_optimizers=[*DISABLED_OPTIMIZERS, "NchwcTransformer"])
        except Exception as exc:  # onnxruntime's own classes (Fail, ...)
            raise ValueError(
                f"onnxruntime cannot convert {path.name!r} to the ORT format: {exc}. A custom "
                "operator needs its library (custom_op_library=...); otherwise pass "
                "ort_format=False.") from exc
        os.replace(staged, path)


def build_artifacts(model, requires_grad=None, frozen_params=None, loss=None, optimizer=None,
                    additional_output_names=None, loss_input_names=None) -> tuple:
    """The artifacts of :func:`generate_artifacts`, in memory (nothing is written).

    Parameters
    ----------
    model, requires_grad, frozen_params, loss, optimizer, additional_output_names, \
loss_input_names
        As for :func:`generate_artifacts`.

    Returns
    -------
    training_model : onnx.ModelProto
    eval_model : onnx.ModelProto
    optimizer_model : onnx.ModelProto or None
        None when ``optimizer`` is None.
    checkpoint : ortlearn.CheckpointState
        The trainable and frozen parameters.

    Raises
    ------
    ValueError, TypeError
        As :func:`generate_artifacts`.

    Examples
    --------
    >>> from ortlearn import artifacts
    >>> # training, evaluation, optimizer, state = artifacts.build_artifacts(
    >>> #     model, requires_grad=["coef"], optimizer=artifacts.OptimType.SGD)
    """
    from .training.checkpoint import CheckpointState

    # onnx's own errors about the model (external data pointing outside its directory, a
    # checker failure) as the ValueError generate_artifacts raises too
    with invalid_model_errors(model):
        training_model, eval_model, optim_model, trainable, frozen = _build(
            model, requires_grad, frozen_params, loss, optimizer, additional_output_names,
            loss_input_names)
        state = CheckpointState.from_parameters(
            {t.name: numpy_helper.to_array(t) for t in trainable},
            {t.name: numpy_helper.to_array(t) for t in frozen})
    return training_model, eval_model, optim_model, state


def _build(model, requires_grad, frozen_params, loss, optimizer, additional_output_names,
           loss_input_names) -> tuple:
    """Training, eval and optimizer models, trainable and frozen parameter tensors."""
    loss_block = _loss_block(loss)
    optim_block = _optimizer_block(optimizer)
    frozen = _name_list(frozen_params, "frozen_params")
    base_model = load_model(model)
    # Checked before anything reads the initializers: with two of one name, which
    # one is trained (and which one the checkpoint holds) is undefined.
    names = [i.name for i in base_model.graph.initializer]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(
            f"The model has several initializers named {duplicated}: an ONNX model gives "
            "each initializer its own name, and ortlearn could not tell which one to train "
            "or store in the checkpoint. Rename or remove the duplicates in the model.")
    # The running statistics of a training-mode BatchNormalization are training state,
    # updated by every step as torch's train mode does, whatever the lists say (torch
    # freezes them only with the layer in eval mode: export it so).
    frozen += [n for n in running_statistics(base_model) if n not in frozen]
    # constants (a Dropout ratio, a shape) are never trained: see select_trainable
    # requires_grad=None trains nothing, as in onnxruntime-training
    trainable, frozen = select_trainable(
        base_model, _name_list(requires_grad, "requires_grad"), frozen)
    both = [n for n in trainable if n in frozen]
    if both:
        raise ValueError(f"Parameters both in requires_grad and frozen_params: {both}.")
    initializers = {i.name for i in base_model.graph.initializer}
    graph_inputs = {i.name for i in base_model.graph.input} - initializers
    if optim_block is not None and not [n for n in trainable if n not in graph_inputs]:
        raise ValueError(
            "An optimizer needs parameters to update, and requires_grad names none: "
            "requires_grad=None trains nothing, as in onnxruntime-training. Pass the "
            "initializers to train (requires_grad=[...]), or optimizer=None.")
    # torch exports that cannot train as their module would: refuse or warn, with the recipe
    # (a graph input in requires_grad is no parameter: its gradient is an output)
    check_exported_model(base_model, [n for n in trainable if n not in graph_inputs], frozen)
    additional = _name_list(additional_output_names, "additional_output_names")
    unknown = [n for n in additional if n not in _all_names(base_model)]
    if unknown:
        raise ValueError(f"additional_output_names {unknown} are not values of the model.")

    block = _TrainingBlock(loss_block, loss is not None, additional)
    for name in trainable:
        block.requires_grad(name)
    for name in frozen:
        block.requires_grad(name, False)
    # invalid_model_errors blames the user's model when it fails onnx's checker;
    # what is left then comes from the blocks (the loss given as a block).
    with _block_errors("loss", loss_block), invalid_model_errors(model), base(base_model):
        block(*_loss_inputs(base_model, loss, loss_input_names))
        training_model, eval_model = block.to_model_proto()
    trainable_params, frozen_tensors = block.parameters()

    optim_model = None
    if optim_block is not None:
        # the model's opset, as onnxruntime-training ("all generated ModelProtos use the
        # same opsets defined by model"); 13 at least (ReduceSum's axes as an input)
        opset = max(opset_of(base_model) or DEFAULT_OPSET, MIN_OPTIMIZER_OPSET)
        with _block_errors("optimizer", optim_block), empty_base(opset) as accessor:
            optim_block((trainable_params, frozen_tensors))
        optim_model = accessor.model
    return training_model, eval_model, optim_model, trainable_params, frozen_tensors


def _write_checkpoints(directory: Path, prefix: str, values: tuple, nominal: bool) -> None:
    """The checkpoint of ``values`` (the trainable and the frozen parameters' arrays)."""
    from .training.checkpoint import CheckpointState

    CheckpointState.save_checkpoint(CheckpointState.from_parameters(*values),
                                    directory / f"{prefix}checkpoint")
    if nominal:
        CheckpointState.save_checkpoint(CheckpointState.from_parameters(*values, nominal=True),
                                        directory / f"{prefix}nominal_checkpoint")


def export_training_artifacts(loss_model, trainable, optimizer, artifact_directory, *,
                              weights=None, optimizer_state=None, loss_output: str = LOSS_OUTPUT,
                              prefix: str = "", passes=CHEAPER_NODES) -> None:
    """Write the artifacts of a training in progress: models, weights and optimizer state.

    What the estimators' ``export_artifacts`` writes. The files are those of
    :func:`generate_artifacts` (``doc/artifacts_format.md``), built by the
    same code from a graph that already computes its loss: training,
    eval and optimizer models, and a checkpoint holding the weights and the
    optimizer state (moments, number of steps made, learning rate of the
    last step). The training model is rewritten by the passes of the
    engine's fused step (``passes``: the same values, fewer or cheaper nodes). Continuing with
    :mod:`ortlearn.api` (``Module``,
    ``Optimizer``: ``lazy_reset_grad``, a training step, ``step``) on the
    batches and learning rates a :class:`~ortlearn.training.TrainingEngine`
    would use gives the engine's weights, bit for bit on the CPU.

    Parameters
    ----------
    loss_model : onnx.ModelProto, bytes or path
        A graph with a scalar output ``loss_output``; its other outputs are
        dropped.
    trainable : list of str
        Float initializers to train, in order.
    optimizer : ortlearn.optim.Optimizer
        The update rule of the optimizer model.
    artifact_directory : str or path
        Where to write (created if missing).
    weights : dict of str to array-like, default=None
        Values replacing initializers of ``loss_model`` (the current weights).
    optimizer_state : dict, default=None
        ``{"states": {param: {state: array}}, "step": int, "learning_rate":
        float}`` (:meth:`TrainingEngine.optimizer_state
        <ortlearn.training.TrainingEngine.optimizer_state>`). None: no
        optimizer state in the checkpoint (a session starts at step 0).
    loss_output : str, default='loss'
        Name of the loss output (kept in the artifacts).
    prefix : str, default=''
        Prefix of every file name.
    passes : sequence of ortlearn.graph.passes.Pass, default=CHEAPER_NODES
        The rewrites of the training model: the CPU step's, or
        :data:`~ortlearn.graph.passes.GPU_NODES` for a GPU provider (no operator
        that WebGPU lacks: each would cross to the CPU and back at every step).

    Raises
    ------
    ValueError, TypeError
        As :func:`generate_artifacts`; a missing loss output; an optimizer
        state that does not match the optimizer. Nothing is written then.
    """
    from .training.checkpoint import CheckpointState
    from .training.checks import check_loss_output, replace_initializers

    if not isinstance(optimizer, Optimizer):
        raise TypeError("optimizer must be an ortlearn.optim.Optimizer instance, got "
                        f"{type(optimizer).__name__}.")
    directory, given = _check_destination(artifact_directory, prefix)
    _check_files(directory, given, _file_names(prefix, True, False, False))
    model = load_model(loss_model)
    check_loss_output(model, loss_output)
    if weights:
        replace_initializers(model, dict(weights))
    if len(model.graph.output) > 1:
        model = prune_model(model, [loss_output])
    training_model, eval_model, optim_model, state = build_artifacts(
        model, requires_grad=list(trainable), optimizer=optimizer)
    # The engine's fused step runs the same rewrites: the gradients are then those of
    # the engine to the last bit (1 to 2 float32 ulps apart without them).
    training_model = rewrite_model(training_model, passes)
    if optimizer_state is not None:
        try:
            states = optimizer_state["states"]
            step, lr = int(optimizer_state["step"]), float(optimizer_state["learning_rate"])
        except (KeyError, TypeError) as exc:
            raise ValueError("optimizer_state is a dict with keys 'states', 'step' and "
                             f"'learning_rate', got {optimizer_state!r}.") from exc
        missing = [f"{p}.{s}" for p in trainable for s in optimizer.state_names
                   if s not in states.get(p, {})]
        if missing:
            raise ValueError(f"optimizer_state lacks {missing}.")
        params = state.parameters
        state.set_optimizer_state(
            {p: {s: np.asarray(states[p][s], dtype=params[p].dtype)
                 for s in optimizer.state_names} for p in trainable}, step, lr)
    directory.mkdir(parents=True, exist_ok=True)
    _save(training_model, directory / f"{prefix}training_model.onnx")
    _save(eval_model, directory / f"{prefix}eval_model.onnx")
    _save(optim_model, directory / f"{prefix}optimizer_model.onnx")
    CheckpointState.save_checkpoint(state, directory / f"{prefix}checkpoint",
                                    include_optimizer_state=optimizer_state is not None)
