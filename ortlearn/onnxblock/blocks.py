"""``Block``, the base of every onnxblock, and the simple building blocks.

Each building block adds a few standard ONNX nodes to the model of the
enclosing ``onnxblock.base``/``onnxblock.empty_base`` context and returns the
name of its output. Constants are ``Constant`` nodes (never initializers) and
take the float type of the tensor they combine with, so that blocks work on
float32 and float64 models alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import onnx
from onnx import numpy_helper

from ..graph import FLOAT_TYPES, np_dtype_to_onnx, onnx_to_np_dtype
from . import _graph_utils, model_accessor

__all__ = [
    "Abs",
    "Add",
    "Block",
    "Cast",
    "Clip",
    "Constant",
    "Div",
    "Linear",
    "Log",
    "Mul",
    "Neg",
    "PassThrough",
    "Pow",
    "ReduceMean",
    "ReduceSum",
    "Sigmoid",
    "Sub",
]


class Block(ABC):
    """Base class of the blocks that can be stacked on top of each other.

    A subclass implements :meth:`build`, which adds nodes to :attr:`base` and
    returns the name(s) of its output(s). Calling the block runs ``build`` on
    the model of the enclosing ``onnxblock.base(...)`` context.

    Subclasses need not call ``super().__init__()``: a block keeps no state of
    its own besides :attr:`base`, which is set on every call.

    Attributes
    ----------
    base : onnx.ModelProto or None
        The model the block changes (set when the block is called).

    Examples
    --------
    >>> from ortlearn import onnxblock
    >>> class WeightedAverageLoss(onnxblock.Block):
    ...     def __init__(self):
    ...         self._loss1 = onnxblock.loss.MSELoss()
    ...         self._loss2 = onnxblock.loss.MSELoss()
    ...         self._w1 = onnxblock.blocks.Constant(0.4)
    ...         self._w2 = onnxblock.blocks.Constant(0.6)
    ...         self._add = onnxblock.blocks.Add()
    ...         self._mul = onnxblock.blocks.Mul()
    ...
    ...     def build(self, output1, output2):
    ...         return self._add(
    ...             self._mul(self._w1(), self._loss1(output1, target_name="target1")),
    ...             self._mul(self._w2(), self._loss2(output2, target_name="target2")))
    """

    #: The model being built (a class attribute so that ``__init__`` may be skipped).
    base = None

    @abstractmethod
    def build(self, *args, **kwargs):
        """Add this block's nodes on top of the given value names; return the output name(s)."""

    def __call__(self, *args, **kwargs):
        """Run :meth:`build` on the model of the enclosing ``base`` context."""
        self.base = model_accessor.current_model()
        return self.build(*args, **kwargs)

    def infer_shapes_on_base(self) -> onnx.ModelProto:
        """Return the base model after onnx shape inference."""
        return onnx.shape_inference.infer_shapes(self.base)


def _emit(model, op_type, inputs, **attrs) -> str:
    b = _graph_utils.builder(model)
    out = b.op(op_type, inputs, **attrs)
    b.add_to_graph(model.graph)
    return out


def _as_float_const(model, value, elem_type) -> str:
    b = _graph_utils.builder(model)
    out = b.const(np.asarray(value, dtype=onnx_to_np_dtype(elem_type)), hint="const")
    b.add_to_graph(model.graph)
    return out


class _BinaryOp(Block):
    _op_type = ""

    def build(self, input_name1: str, input_name2: str) -> str:
        model = self.base
        a, b = _align_types(model, input_name1, input_name2, self._op_type)
        return _emit(model, self._op_type, [a, b])


def _align_types(model, name1: str, name2: str, op_type: str):
    """Cast a ``Constant`` operand to the float type of the other operand."""
    t1, t2 = _graph_utils.elem_type(model, name1), _graph_utils.elem_type(model, name2)
    if t1 is None or t2 is None or t1 == t2:
        return name1, name2
    for const, other, target in ((name1, name2, t2), (name2, name1, t1)):
        if target in FLOAT_TYPES and _graph_utils.is_constant_output(model, const):
            cast = _emit(model, "Cast", [const], to=target)
            return (cast, other) if const == name1 else (other, cast)
    raise TypeError(
        f"{op_type}: operands {name1!r} and {name2!r} have different element types "
        f"({onnx.TensorProto.DataType.Name(t1)} and {onnx.TensorProto.DataType.Name(t2)})."
    )


class Add(_BinaryOp):
    """Add an ``Add`` node: ``block(a, b)`` returns the name of ``a + b``."""

    _op_type = "Add"


class Sub(_BinaryOp):
    """Add a ``Sub`` node: ``block(a, b)`` returns the name of ``a - b``."""

    _op_type = "Sub"


class Mul(_BinaryOp):
    """Add a ``Mul`` node: ``block(a, b)`` returns the name of ``a * b``."""

    _op_type = "Mul"


class Div(_BinaryOp):
    """Add a ``Div`` node: ``block(a, b)`` returns the name of ``a / b``."""

    _op_type = "Div"


class _UnaryOp(Block):
    _op_type = ""

    def build(self, input_name: str) -> str:
        return _emit(self.base, self._op_type, [input_name])


class Sigmoid(_UnaryOp):
    """Add a ``Sigmoid`` node."""

    _op_type = "Sigmoid"


class Log(_UnaryOp):
    """Add a ``Log`` node."""

    _op_type = "Log"


class Neg(_UnaryOp):
    """Add a ``Neg`` node."""

    _op_type = "Neg"


class Abs(_UnaryOp):
    """Add an ``Abs`` node."""

    _op_type = "Abs"


class Pow(Block):
    """Raise the input to a constant power.

    Parameters
    ----------
    exponent : float
        The exponent (a constant of the input's float type).
    """

    def __init__(self, exponent: float):
        self._exponent = exponent

    def build(self, pow_input_name: str) -> str:
        model = self.base
        exponent = _as_float_const(model, self._exponent,
                                   _graph_utils.float_type_of(model, pow_input_name))
        return _emit(model, "Pow", [pow_input_name, exponent])


class Constant(Block):
    """A constant tensor (a ``Constant`` node).

    Parameters
    ----------
    value : float or array-like
        The value; a Python float gives a scalar (shape ``()``).
    dtype : numpy dtype, default=None
        Element type. None: the float type of the model (float32 or float64);
        a binary block casts the constant to the type of its other operand.

    Examples
    --------
    >>> from ortlearn import onnxblock
    >>> with onnxblock.empty_base():
    ...     name = onnxblock.blocks.Constant(0.4)()
    """

    def __init__(self, value, dtype=None):
        self._value = value
        self._dtype = dtype

    def build(self) -> str:
        model = self.base
        if self._dtype is None:
            elem = _graph_utils.default_float_type(model)
        else:
            elem = np_dtype_to_onnx(self._dtype)
        b = _graph_utils.builder(model)
        # Never cached with another constant: each call is its own node.
        name = b.unique_name("const")
        arr = np.asarray(self._value, dtype=onnx_to_np_dtype(elem))
        b.op("Constant", [], outputs=[name], value=numpy_helper.from_array(arr, name))
        b.add_to_graph(model.graph)
        return name


class _Reduce(Block):
    _op_type = ""

    def __init__(self, axes=None, keepdims: bool = True):
        self._axes = axes
        self._keepdims = keepdims

    def build(self, input_name: str) -> str:
        model = self.base
        b = _graph_utils.builder(model)
        out = b.reduce(self._op_type, input_name, axes=self._axes, keepdims=int(self._keepdims))
        b.add_to_graph(model.graph)
        return out


class ReduceMean(_Reduce):
    """Mean over ``axes`` (all axes by default).

    Parameters
    ----------
    axes : sequence of int, default=None
        Axes to reduce; None reduces every axis.
    keepdims : bool, default=True
        Keep the reduced axes with length 1 (ONNX's default).
    """

    _op_type = "ReduceMean"


class ReduceSum(_Reduce):
    """Sum over ``axes`` (all axes by default).

    Parameters
    ----------
    axes : sequence of int, default=None
        Axes to reduce; None reduces every axis.
    keepdims : bool, default=True
        Keep the reduced axes with length 1 (ONNX's default).
    """

    _op_type = "ReduceSum"


class Clip(Block):
    """Clip the input to ``[clip_min, clip_max]``.

    Parameters
    ----------
    clip_min, clip_max : float, default=None
        Bounds; None leaves that side open.
    """

    def __init__(self, clip_min: float | None = None, clip_max: float | None = None):
        self._min = clip_min
        self._max = clip_max

    def build(self, clip_input_name: str) -> str:
        model = self.base
        elem = _graph_utils.float_type_of(model, clip_input_name)
        bounds = [
            "" if v is None else _as_float_const(model, v, elem) for v in (self._min, self._max)
        ]
        while bounds and bounds[-1] == "":
            bounds.pop()
        return _emit(model, "Clip", [clip_input_name, *bounds])


class Cast(Block):
    """Cast the input to another element type.

    Parameters
    ----------
    to : int or numpy dtype
        A ``onnx.TensorProto`` element type (e.g. ``TensorProto.DOUBLE``) or a numpy dtype.
    """

    def __init__(self, to):
        self._to = to if isinstance(to, int) else np_dtype_to_onnx(to)

    def build(self, cast_input_name: str) -> str:
        return _emit(self.base, "Cast", [cast_input_name], to=self._to)


class PassThrough(Block):
    """Return its inputs unchanged (a loss that adds nothing).

    Returns
    -------
    tuple of str
        The input names.
    """

    def build(self, *input_names):
        return input_names


class Linear(Block):
    """A fully connected layer ``y = x @ weight.T + bias`` with new trainable initializers.

    The weights are initialised like ``torch.nn.Linear``: uniform in
    ``[-1/sqrt(in_features), 1/sqrt(in_features)]``.

    Parameters
    ----------
    in_features, out_features : int
        Sizes of the input's last axis and of the output's.
    bias : bool, default=True
        Add a bias.
    name : str, default='linear'
        Prefix of the initializers ``<name>.weight`` (shape ``(out, in)``) and ``<name>.bias``.
    random_state : int or numpy.random.Generator, default=None
        Seed of the initial weights.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 name: str = "linear", random_state=None):
        self._in = int(in_features)
        self._out = int(out_features)
        self._bias = bias
        self._name = name
        self._random_state = random_state

    def build(self, linear_input_name: str) -> str:
        model = self.base
        elem = _graph_utils.float_type_of(model, linear_input_name)
        dtype = onnx_to_np_dtype(elem)
        rng = np.random.default_rng(self._random_state)
        bound = 1.0 / np.sqrt(self._in)
        # No prefix: the parameters keep the documented names when they are free.
        b = _graph_utils.builder(model, prefix="")
        weight = b.unique_name(f"{self._name}.weight")
        model.graph.initializer.append(numpy_helper.from_array(
            rng.uniform(-bound, bound, (self._out, self._in)).astype(dtype), weight))
        inputs = [linear_input_name, weight]
        if self._bias:
            bias = b.unique_name(f"{self._name}.bias")
            model.graph.initializer.append(numpy_helper.from_array(
                rng.uniform(-bound, bound, self._out).astype(dtype), bias))
            inputs.append(bias)
        out = b.op("Gemm", inputs, transB=1)
        b.add_to_graph(model.graph)
        return out
