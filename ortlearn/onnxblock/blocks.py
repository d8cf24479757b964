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

from ..graph import DEFAULT_ML_OPSET, FLOAT_TYPES, np_dtype_to_onnx, onnx_to_np_dtype
from . import _graph_utils, model_accessor

__all__ = [
    "Abs",
    "Add",
    "Block",
    "Cast",
    "Clip",
    "Constant",
    "Div",
    "InputLike",
    "LabelEncoder",
    "Linear",
    "Log",
    "Mul",
    "Neg",
    "PassThrough",
    "Pow",
    "ReduceAllL2",
    "ReduceMean",
    "ReduceSum",
    "SequenceConstruct",
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
    value_float : float or array-like
        The value (the parameter's name in onnxruntime-training); a Python
        float gives a scalar (shape ``()``).
    dtype : numpy dtype, default=None
        Element type. None: the float type of the model (float32 or float64);
        a binary block casts the constant to the type of its other operand.

    Examples
    --------
    >>> from ortlearn import onnxblock
    >>> with onnxblock.empty_base():
    ...     name = onnxblock.blocks.Constant(0.4)()
    """

    def __init__(self, value_float, dtype=None):
        self._value = value_float
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
    """A fully connected layer ``y = alpha * x @ weight.T + beta * bias`` (a ``Gemm``).

    The weights are new initializers, initialised like ``torch.nn.Linear``:
    uniform in ``[-1/sqrt(in_features), 1/sqrt(in_features)]``.

    Parameters
    ----------
    in_features, out_features : int
        Sizes of the input's last axis and of the output's.
    bias : bool, default=True
        Add a bias.
    alpha, beta : float, default=1.0
        ``Gemm``'s scales of the product and of the bias (as onnxruntime-training's).
    name : str, default='linear'
        Prefix of the initializers ``<name>.weight`` (shape ``(out, in)``) and ``<name>.bias``.
    random_state : int or numpy.random.Generator, default=None
        Seed of the initial weights.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 alpha: float = 1.0, beta: float = 1.0, *, name: str = "linear",
                 random_state=None):
        self._in = int(in_features)
        self._out = int(out_features)
        self._bias = bias
        self._alpha = float(alpha)
        self._beta = float(beta)
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
        out = b.op("Gemm", inputs, transB=1, alpha=self._alpha, beta=self._beta)
        b.add_to_graph(model.graph)
        return out


class SequenceConstruct(Block):
    """A ``SequenceConstruct`` node: the inputs (tensors of one type) as one sequence.

    Returns
    -------
    str
        The name of the sequence.
    """

    def build(self, *sequence_input_names) -> str:
        if not sequence_input_names:
            raise ValueError("SequenceConstruct needs at least one input name.")
        return _emit(self.base, "SequenceConstruct", list(sequence_input_names))


class ReduceAllL2(Block):
    """The L2 norm of all the elements of all the inputs: ``sqrt(sum_i sum(x_i ** 2))``.

    onnxruntime-training writes its ``com.microsoft`` ``ReduceAllL2``
    operator, which the ordinary onnxruntime does not have; this block
    computes the same scalar with standard operators (``ReduceSumSquare``,
    ``Add``, ``Sqrt``), in the float type of the first input (inputs of
    another float type are cast to it).

    Returns
    -------
    str
        The name of the norm, a scalar (shape ``()``).
    """

    def build(self, *reduce_node_input_names) -> str:
        if not reduce_node_input_names:
            raise ValueError("ReduceAllL2 needs at least one input name.")
        model = self.base
        elem = _graph_utils.float_type_of(model, reduce_node_input_names[0])
        b = _graph_utils.builder(model)
        total = None
        for name in reduce_node_input_names:
            if _graph_utils.elem_type(model, name) not in (None, elem):
                name = b.cast(name, elem)
            squares = b.reduce("ReduceSumSquare", name, keepdims=0)
            total = squares if total is None else b.op("Add", [total, squares])
        out = b.op("Sqrt", [total])
        b.add_to_graph(model.graph)
        return out


class InputLike(Block):
    """A new graph input with the type and shape of a graph input or output.

    Parameters
    ----------
    like : str
        Name of the graph input (looked up first) or graph output to copy.

    Examples
    --------
    >>> from ortlearn import onnxblock
    >>> # inside `with onnxblock.base(model):` -> onnxblock.blocks.InputLike("output")("target")
    """

    def __init__(self, like: str):
        self._like = like

    def build(self, input_name: str | None = None) -> str:
        """Add the input, named ``input_name`` (a new unique name when None); return its name.

        Raises
        ------
        LookupError
            If ``like`` is neither a graph input nor a graph output.
        ValueError
            If ``input_name`` already names a value of the model.
        """
        model = self.base
        source = _graph_utils.graph_input_or_output(model, self._like)
        if source is None:
            raise LookupError(f"InputLike: {self._like!r} is neither a graph input nor a "
                              "graph output of the model.")
        if input_name is None:
            input_name = _graph_utils.builder(model, prefix="").unique_name("input")
        elif _graph_utils.value_exists(model, input_name):
            raise ValueError(f"InputLike: the model already has a value named {input_name!r}.")
        clone = onnx.ValueInfoProto()
        clone.CopyFrom(source)
        clone.name = input_name
        model.graph.input.append(clone)
        return input_name


class LabelEncoder(Block):
    """An ``ai.onnx.ml`` ``LabelEncoder`` node: map keys to values, others to the default.

    The parameters are the operator's attributes, with onnxruntime-training's
    names and defaults; give one ``keys_*`` and one ``values_*`` list of the
    same length. The model gets an ``ai.onnx.ml`` opset import if it has none.

    Parameters
    ----------
    default_float : float, default=0.0
    default_int64 : int, default=-1
    default_string : str, default='_Unused'
        The value of a key not listed, for each type of values.
    keys_floats, keys_int64s, keys_strings : list, default=None
    values_floats, values_int64s, values_strings : list, default=None

    Examples
    --------
    >>> from ortlearn import onnxblock
    >>> encoder = onnxblock.blocks.LabelEncoder(keys_strings=["cat", "dog"],
    ...                                         values_int64s=[0, 1])
    """

    def __init__(self, default_float: float = 0.0, default_int64: int = -1,
                 default_string: str = "_Unused", keys_floats=None, keys_int64s=None,
                 keys_strings=None, values_floats=None, values_int64s=None,
                 values_strings=None):
        keys = {"keys_floats": keys_floats, "keys_int64s": keys_int64s,
                "keys_strings": keys_strings}
        values = {"values_floats": values_floats, "values_int64s": values_int64s,
                  "values_strings": values_strings}
        keys = {k: list(v) for k, v in keys.items() if v is not None}
        values = {k: list(v) for k, v in values.items() if v is not None}
        if len(keys) != 1 or len(values) != 1:
            raise ValueError("LabelEncoder takes exactly one keys_* list and one values_* list, "
                             f"got {sorted(keys)} and {sorted(values)}.")
        (key_list,), (value_list,) = keys.values(), values.values()
        if len(key_list) != len(value_list):
            raise ValueError(f"LabelEncoder: {len(key_list)} keys but {len(value_list)} values.")
        self._attributes = {"default_float": float(default_float),
                            "default_int64": int(default_int64),
                            "default_string": default_string, **keys, **values}

    def build(self, label_encoder_input_name: str) -> str:
        model = self.base
        if not any(o.domain == "ai.onnx.ml" for o in model.opset_import):
            model.opset_import.append(onnx.helper.make_opsetid("ai.onnx.ml", DEFAULT_ML_OPSET))
        return _emit(model, "LabelEncoder", [label_encoder_input_name], domain="ai.onnx.ml",
                     **self._attributes)
