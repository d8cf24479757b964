"""The model that blocks build on: ``onnxblock.base`` and ``onnxblock.empty_base``.

Blocks do not receive the model they change as an argument: like
``onnxruntime.training.onnxblock``, they read it from an accessor that these
two context managers set for the duration of a ``with`` statement. The
accessor is the current thread's: two threads building two models (two
estimators exporting their artifacts at once) do not see each other's.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import onnx
from onnx import helper

from ..graph import DEFAULT_OPSET, finalize_model, load_model

__all__ = ["ModelAccessor", "base", "custom_op_library", "empty_base"]

#: ``accessor`` and ``custom_op_library`` of the thread's enclosing contexts
_CONTEXT = threading.local()


class ModelAccessor:
    """Holds the model the blocks of a ``with`` statement change.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; blocks change it in place.
    """

    def __init__(self, model: onnx.ModelProto):
        self._model = model

    @property
    def model(self) -> onnx.ModelProto:
        """The model being built."""
        return self._model


def current_model() -> onnx.ModelProto:
    """The model of the enclosing ``base``/``empty_base`` block.

    Raises
    ------
    RuntimeError
        Outside of ``with onnxblock.base(...)`` or ``with onnxblock.empty_base()``.
    """
    accessor = getattr(_CONTEXT, "accessor", None)
    if accessor is None:
        raise RuntimeError(
            "A block was called outside of a model context: build blocks inside "
            "`with onnxblock.base(model):` or `with onnxblock.empty_base():`."
        )
    return accessor.model


@contextmanager
def _accessor(model: onnx.ModelProto):
    if getattr(_CONTEXT, "accessor", None) is not None:
        raise RuntimeError("A base model is already active: onnxblock contexts do not nest.")
    _CONTEXT.accessor = ModelAccessor(model)
    try:
        yield _CONTEXT.accessor
    finally:
        _CONTEXT.accessor = None


@contextmanager
def base(model):
    """Build blocks on top of a copy of ``model``.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or path
        The base model (it is copied, never changed).

    Yields
    ------
    ModelAccessor
        Its ``model`` attribute is the model the blocks build.

    Examples
    --------
    >>> import onnx
    >>> from onnx import TensorProto, helper
    >>> from ortlearn import onnxblock
    >>> graph = helper.make_graph(
    ...     [helper.make_node("Identity", ["x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    >>> with onnxblock.base(model) as accessor:
    ...     loss = onnxblock.loss.MSELoss()("y")
    >>> [i.name for i in accessor.model.graph.input]
    ['x', 'target']
    """
    with _accessor(load_model(model)) as accessor:
        yield accessor


@contextmanager
def empty_base(opset_version: int | None = None):
    """Build blocks into an empty model (used for optimizer models).

    Parameters
    ----------
    opset_version : int, default=None
        ai.onnx opset of the model; None means ortlearn's default opset.

    Yields
    ------
    ModelAccessor
    """
    graph = helper.make_graph([], "onnxblock", [], [])
    version = DEFAULT_OPSET if opset_version is None else int(opset_version)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)],
                              producer_name="ortlearn")
    finalize_model(model, check=False)
    with _accessor(model) as accessor:
        yield accessor


@contextmanager
def custom_op_library(custom_op_library_path):
    """Declare the custom operator library the models built in this context use.

    onnxruntime-training's ``onnxblock.custom_op_library``. ortlearn builds
    gradients without running onnxruntime, so the blocks do not need the
    library; it is checked to exist and is available from
    :func:`current_custom_op_library` while the context lasts (sessions that
    run the models must register it in their own ``SessionOptions``).

    Parameters
    ----------
    custom_op_library_path : str or path-like
        Path of the shared library.

    Raises
    ------
    FileNotFoundError
        If the library does not exist.
    RuntimeError
        If a custom op library context is already active.

    Examples
    --------
    >>> from ortlearn import onnxblock
    >>> # with onnxblock.custom_op_library("libcustom.so"), onnxblock.base(model): ...
    """
    if getattr(_CONTEXT, "custom_op_library", None) is not None:
        raise RuntimeError("A custom op library is already registered: custom_op_library "
                           "contexts do not nest.")
    path = os.fsdecode(os.fspath(custom_op_library_path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"custom op library {path!r} does not exist.")
    _CONTEXT.custom_op_library = path
    try:
        yield path
    finally:
        _CONTEXT.custom_op_library = None


def current_custom_op_library() -> str | None:
    """Path of the library of the enclosing ``custom_op_library`` context (this thread's),
    else None."""
    return getattr(_CONTEXT, "custom_op_library", None)
