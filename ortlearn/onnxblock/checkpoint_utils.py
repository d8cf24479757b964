"""``onnxblock.save_checkpoint`` and ``onnxblock.load_checkpoint_to_model``.

The two functions of ``onnxruntime.training.onnxblock.checkpoint_utils``,
writing and reading ortlearn checkpoints
(:class:`~ortlearn.training.CheckpointState`'s format).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import onnx
from onnx import numpy_helper

from ..exceptions import NominalCheckpointError
from ..training.checkpoint import CheckpointState

__all__ = ["load_checkpoint_to_model", "save_checkpoint"]


def _tensors(tensors, what: str) -> dict:
    """``{name: numpy array}`` of a list of TensorProto."""
    if isinstance(tensors, (str, bytes)) or not isinstance(tensors, Sequence):
        raise TypeError(f"The {what} parameters must be a list of onnx.TensorProto, "
                        f"got {type(tensors).__name__}.")
    values = {}
    for tensor in tensors:
        if not isinstance(tensor, onnx.TensorProto):
            raise TypeError(f"The {what} parameters must be onnx.TensorProto, got "
                            f"{type(tensor).__name__}; TrainingBlock.parameters() returns them.")
        if tensor.name in values:
            raise ValueError(f"Two {what} parameters are named {tensor.name!r}.")
        values[tensor.name] = numpy_helper.to_array(tensor)
    return values


def save_checkpoint(parameters, path_to_checkpoint, nominal_checkpoint: bool = False) -> None:
    """Write parameters to a checkpoint file, as ``TrainingBlock.parameters()`` gives them.

    Parameters
    ----------
    parameters : tuple of (list of onnx.TensorProto, list of onnx.TensorProto)
        ``(trainable, non_trainable)``: what ``TrainingBlock.parameters()``
        returns once the block was called. The first list is trained, the
        second is frozen.
    path_to_checkpoint : str or os.PathLike
        The checkpoint file to write (its directory must exist).
    nominal_checkpoint : bool, default=False
        Write names, dtypes and shapes only, no values (a nominal checkpoint,
        what ``generate_artifacts(nominal_checkpoint=True)`` writes too).

    Raises
    ------
    RuntimeError
        If ``parameters`` is None (as onnxruntime-training).
    TypeError
        If ``parameters`` is not a pair of lists of TensorProto, or a tensor's
        dtype is not one a checkpoint holds.
    ValueError
        If a name is both trainable and frozen, or given twice.
    ortlearn.exceptions.NominalCheckpointError
        If ``nominal_checkpoint`` is true and the file is a checkpoint that
        holds values (trained values are never overwritten by a nominal file).

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> from onnx import numpy_helper
    >>> from ortlearn.api import CheckpointState
    >>> w = numpy_helper.from_array(np.ones((2, 1), np.float32), "w")
    >>> b = numpy_helper.from_array(np.zeros(1, np.float32), "b")
    >>> path = os.path.join(tempfile.mkdtemp(), "checkpoint")
    >>> save_checkpoint(([w], [b]), path)
    >>> state = CheckpointState.load_checkpoint(path)
    >>> [(name, p.requires_grad) for name, p in state.parameters]
    [('w', True), ('b', False)]
    """
    if parameters is None:
        raise RuntimeError("No checkpoint parameters provided: pass "
                           "TrainingBlock.parameters(), a (trainable, non_trainable) pair of "
                           "lists of onnx.TensorProto.")
    try:
        trainable, frozen = parameters
    except (TypeError, ValueError):
        raise TypeError("parameters must be a (trainable, non_trainable) pair of lists of "
                        f"onnx.TensorProto, got {type(parameters).__name__}.") from None
    state = CheckpointState.from_parameters(_tensors(trainable, "trainable"),
                                            _tensors(frozen, "non-trainable"),
                                            nominal=bool(nominal_checkpoint))
    CheckpointState.save_checkpoint(state, path_to_checkpoint)


def load_checkpoint_to_model(path_to_checkpoint, model: onnx.ModelProto) -> None:
    """Replace a model's initializers by the values of a checkpoint, in place.

    As in onnxruntime-training: every initializer of the main graph whose
    name is a parameter of the checkpoint becomes that parameter (its value,
    dtype and shape); other initializers stay as they are, and parameters
    the model does not have are ignored.

    Parameters
    ----------
    path_to_checkpoint : str or os.PathLike
        A complete checkpoint (not a nominal one).
    model : onnx.ModelProto
        The model to change, e.g. the inference model (``onnx.load(...)``).

    Raises
    ------
    TypeError
        If ``model`` is not an ``onnx.ModelProto``.
    ortlearn.exceptions.NominalCheckpointError
        If the checkpoint is nominal (it has no values to load).
    OSError, ValueError
        If the file cannot be read or is not a checkpoint (also
        ``RuntimeError``, as in onnxruntime-training).

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> from onnx import helper, numpy_helper, TensorProto
    >>> w = numpy_helper.from_array(np.full((1,), 3.0, np.float32), "w")
    >>> path = os.path.join(tempfile.mkdtemp(), "checkpoint")
    >>> save_checkpoint(([w], []), path)
    >>> graph = helper.make_graph(
    ...     [helper.make_node("Mul", ["x", "w"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    ...     [numpy_helper.from_array(np.zeros(1, np.float32), "w")])
    >>> model = helper.make_model(graph)
    >>> load_checkpoint_to_model(path, model)
    >>> numpy_helper.to_array(model.graph.initializer[0]).tolist()
    [3.0]
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be an onnx.ModelProto (onnx.load(path)), got "
                        f"{type(model).__name__}.")
    state = CheckpointState.load_checkpoint(os.fspath(path_to_checkpoint))
    if state.is_nominal:
        raise NominalCheckpointError(
            f"{os.fspath(path_to_checkpoint)!r} is a nominal checkpoint (names and shapes, no "
            "values): load a complete checkpoint into the model.")
    params = state.parameters
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.name in params:
            model.graph.initializer[index].CopyFrom(
                numpy_helper.from_array(params[tensor.name].data, tensor.name))
