"""What a gradient rule sees: the builder, static types and shapes, helpers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..graph import GraphBuilder, elem_type_of, onnx_to_np_dtype, shape_of

#: Largest number of elements :meth:`GradientContext.fill_like` stores as a
#: constant tensor; above it, a ``ConstantOfShape`` builds the tensor at run time.
MAX_STORED_FILL = 16


class GradientContext:
    """State shared by the gradient rules during one backward pass.

    Attributes
    ----------
    b : GraphBuilder
        Builder receiving the backward nodes.
    """

    def __init__(self, builder: GraphBuilder, infos: dict, constants: dict, differentiable: set,
                 shapes: dict | None = None):
        self.b = builder
        self._infos = infos
        self._static_shapes = shapes or {}
        self._constants = constants
        self._differentiable = differentiable
        self._shapes: dict[str, str] = {}
        self._axis_sums: dict[tuple[str, int], str] = {}

    @property
    def opset(self) -> int:
        return self.b.opset

    def needs(self, name: str | None) -> bool:
        """Whether the gradient of ``name`` is wanted (it depends on a weight)."""
        return bool(name) and name in self._differentiable

    # static information -------------------------------------------------
    def shape(self, name: str) -> list | None:
        """Static shape of a forward value (ints, symbols, None), None if unknown rank."""
        if name in self._static_shapes:
            return list(self._static_shapes[name])
        info = self._infos.get(name)
        return None if info is None else shape_of(info)

    def rank(self, name: str, node: onnx.NodeProto | None = None) -> int | None:
        """Rank of ``name``; with ``node``, raise ValueError when it is unknown."""
        shape = self.shape(name)
        if shape is None and node is not None:
            raise ValueError(
                f"The gradient of {node.op_type} node {node.name!r} needs the rank of "
                f"{name!r}, which shape inference could not find."
            )
        return None if shape is None else len(shape)

    def dtype(self, name: str) -> int:
        """ONNX element type of ``name``."""
        info = self._infos.get(name)
        elem = elem_type_of(info) if info is not None else 0
        if not elem:
            raise ValueError(f"The element type of {name!r} is unknown (shape inference failed).")
        return elem

    def constant_value(self, name: str | None) -> np.ndarray | None:
        """Value of a non-trainable initializer or Constant output, else None."""
        return self._constants.get(name) if name else None

    # emitting helpers ---------------------------------------------------
    def const(self, value, like: str) -> str:
        """A constant with the element type of value ``like``."""
        return self.b.const(np.asarray(value, dtype=onnx_to_np_dtype(self.dtype(like))))

    def shape_of(self, name: str) -> str:
        """A ``Shape`` node of ``name`` (one per value)."""
        if name not in self._shapes:
            self._shapes[name] = self.b.op("Shape", [name])
        return self._shapes[name]

    def size_as(self, name: str, like: str) -> str:
        """Number of elements of ``name`` as a scalar of ``like``'s type."""
        return self.b.cast(self.b.op("Size", [name]), self.dtype(like))

    def fill_like(self, name: str, value: float, dtype_of: str | None = None) -> str:
        """A tensor of ``name``'s shape filled with ``value``.

        A static shape of at most :data:`MAX_STORED_FILL` elements gives a
        stored constant (no node runs); a larger one a ``ConstantOfShape`` of
        the static shape, so that the model never stores a tensor of the
        data's size; an unknown shape a ``ConstantOfShape`` of its ``Shape``.
        """
        np_dtype = onnx_to_np_dtype(self.dtype(dtype_of or name))
        shape = self.shape(name)
        if shape is not None and all(isinstance(d, int) for d in shape):
            if int(np.prod(shape)) <= MAX_STORED_FILL:
                return self.b.const(np.full(shape, value, dtype=np_dtype))
            dims = self.b.ints(shape, hint="shape")
        else:
            dims = self.shape_of(name)
        return self.b.op("ConstantOfShape", [dims],
                         value=numpy_helper.from_array(np.array([value], dtype=np_dtype)))

    def zeros_like(self, name: str) -> str:
        return self.fill_like(name, 0)

    def expose_output(self, node: onnx.NodeProto, index: int, hint: str) -> str:
        """Name of the optional output ``index`` of the forward ``node``, exposed if need be.

        A rule that needs what the forward pass computed anyway (Dropout's
        mask, MaxPool's Indices, LSTM's Y, LayerNormalization's Mean and
        InvStdDev) reads that optional output: when the model leaves it out
        (missing or ``''``), a fresh name (from ``hint``) is given to it on
        the forward node, in place. Outputs before ``index`` that are
        missing become ``''`` (omitted).
        """
        while len(node.output) <= index:
            node.output.append("")
        if not node.output[index]:
            node.output[index] = self.b.unique_name(hint)
        return node.output[index]

    def static_shape_input(self, name: str) -> str | None:
        """A constant shape operand reshaping a tensor of ``name``'s size to its shape.

        None unless the shape is known but for at most one dimension (given
        as -1); a 0 dimension would be read as "copy" by Reshape.
        """
        shape = self.shape(name)
        if shape is None or 0 in shape:
            return None
        unknown = [i for i, d in enumerate(shape) if not isinstance(d, int)]
        if len(unknown) > 1:
            return None
        return self.b.ints([-1 if i in unknown else d for i, d in enumerate(shape)],
                           hint="shape")

    def reshape_like(self, grad: str, name: str) -> str:
        """``grad`` (of ``name``'s size) reshaped to the shape of ``name``."""
        static = self.static_shape_input(name)
        return self.b.op("Reshape", [grad, self.shape_of(name) if static is None else static])

    def expand_like(self, grad: str, name: str, axes: Sequence[int] | None,
                    same_rank: bool = True) -> str:
        """``grad`` (``name``'s shape but 1 on ``axes``, all if None) broadcast to ``name``.

        Static shapes spare the ``Shape`` node, and the ``Expand`` itself
        when every expanded axis already has length 1 and ``grad`` has the
        rank of ``name`` (``same_rank``; a scalar ``grad`` does not).
        """
        shape = self.shape(name)
        if shape is None:
            return self.b.op("Expand", [grad, self.shape_of(name)])
        axes = set(range(len(shape)) if axes is None else (a % len(shape) for a in axes))
        if same_rank and all(shape[a] == 1 for a in axes):
            return grad
        # Expand keeps grad's length where the target says 1: only the
        # expanded axes need their (static) length.
        if any(not isinstance(shape[a], int) for a in axes):
            return self.b.op("Expand", [grad, self.shape_of(name)])
        target = [d if a in axes else 1 for a, d in enumerate(shape)]
        return self.b.op("Expand", [grad, self.b.ints(target, hint="shape")])

    def mask_where(self, cond: str, grad: str, like: str) -> str:
        """``grad`` where ``cond`` holds, 0 elsewhere (``like``: a value of grad's type)."""
        return self.b.op("Where", [cond, grad, self.const(0, like=like)])

    def note_axis_sum(self, value: str, axis: int, total: str) -> None:
        """Record that ``total`` is ``ReduceSum(value, [axis], keepdims=1)`` (axis >= 0)."""
        self._axis_sums[value, axis] = total

    def axis_sum(self, value: str, axis: int) -> str:
        """``ReduceSum(value, [axis], keepdims=1)``: a recorded one, else a new node.

        ``axis`` is counted from 0, as :meth:`note_axis_sum` records it.

        A rule that knows the sum of the gradient it returns (a one-hot
        product sums to its factor) records it with :meth:`note_axis_sum`,
        and the rule downstream that needs that sum reuses it.
        """
        if (value, axis) in self._axis_sums:
            return self._axis_sums[value, axis]
        return self.b.reduce("ReduceSum", value, [axis], keepdims=1)

    def transpose_last2(self, x: str, rank: int) -> str:
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        return self.b.op("Transpose", [x], perm=perm)

    def accumulate(self, grads: Sequence[str]) -> str:
        """Sum of gradient contributions to one value."""
        return grads[0] if len(grads) == 1 else self.b.op("Sum", list(grads))

    def sum_to(self, grad: str, target: str, grad_shape: Sequence | None) -> str:
        """Reduce a broadcast gradient back to the shape of ``target``.

        Static shapes decide the axes when they can (no node when none is
        needed); otherwise the axes are computed at run time from the shapes
        of ``grad`` and ``target`` (dynamic batch dimension).

        Parameters
        ----------
        grad : str
            Gradient with the broadcast shape.
        target : str
            Forward value the gradient belongs to.
        grad_shape : list or None
            Static shape of ``grad`` (ints, symbols or None per dim), None if
            its rank is unknown.
        """
        tshape = self.shape(target)
        if grad_shape is not None and tshape is not None:
            axes = _static_reduce_axes(list(grad_shape), tshape)
            if axes is not None:
                if not axes:
                    return grad
                lead = len(grad_shape) - len(tshape)
                red = self.b.reduce("ReduceSum", grad, axes, keepdims=1)
                return self.b.squeeze(red, list(range(lead))) if lead else red
        return self._dynamic_sum_to(grad, target, grad_shape, tshape)

    def _dynamic_sum_to(self, grad, target, grad_shape, tshape) -> str:
        b = self.b
        gshape = b.op("Shape", [grad])
        tsh = self.shape_of(target)
        if grad_shape is not None and tshape is not None:
            lead = len(grad_shape) - len(tshape)
            padded = b.op("Concat", [b.ints([1] * lead, hint="ones"), tsh], axis=0) if lead else tsh
        else:
            lead = b.op("Sub", [b.op("Size", [gshape]), b.op("Size", [tsh])])
            ones = b.op("ConstantOfShape", [b.op("Reshape", [lead, b.ints([1], hint="one")])],
                        value=numpy_helper.from_array(np.array([1], dtype=np.int64)))
            padded = b.op("Concat", [ones, tsh], axis=0)
        # Axes where target and gradient differ: the target has 1 (or no dim) there.
        differ = b.op("Not", [b.op("Equal", [padded, gshape])])
        axes = b.op("Reshape", [b.op("NonZero", [differ]), b.ints([-1], hint="flat")])
        red = b.op("ReduceSum", [grad, axes], keepdims=1, noop_with_empty_axes=1)
        return b.op("Reshape", [red, tsh])

    def scatter_flat(self, x: str, positions: str, grad: str, accumulate: bool) -> str:
        """Zeros of ``x``'s shape receiving ``grad`` at flat ``positions``.

        With ``accumulate``, repeated positions add up (Gather); otherwise
        they are assumed unique (Slice).
        """
        b = self.b
        flat_pos = b.op("Reshape", [positions, b.ints([-1], hint="flat")])
        flat_g = b.op("Reshape", [grad, b.ints([-1], hint="flat")])
        size = b.op("Size", [x])
        kwargs = {}
        if accumulate and self.opset < 16:
            flat_pos, flat_g = self._segment_sums(flat_pos, flat_g, x)
        elif accumulate:
            kwargs = {"reduction": "add"}
        zeros = b.op("ConstantOfShape", [b.unsqueeze(size, [0])],
                     value=numpy_helper.from_array(
                         np.array([0], dtype=onnx_to_np_dtype(self.dtype(x)))))
        flat = b.op("ScatterElements", [zeros, flat_pos, flat_g], axis=0, **kwargs)
        return self.reshape_like(flat, x)

    def _segment_sums(self, flat_pos: str, flat_g: str, x: str) -> tuple[str, str]:
        """``(unique positions, sum of flat_g at each)``: what ScatterElements-16 adds up.

        Below opset 16 ScatterElements has no ``reduction``, and a one-hot
        product (positions x elements) grows with the square of the tensor
        (a MaxPool with overlapping windows, a Gather on a real embedding
        table). Instead: sort the positions (TopK), take prefix sums of the
        gradient in that order, and difference them at the last element of
        each run of equal positions: O(M log M) time and O(M) memory for M
        contributions. The prefix sums run in float64 so that the
        differences keep float32's precision whatever the length of the
        tensor (for a float64 gradient, the error is a few ulps of the
        largest prefix sum, not of each sum).
        """
        b = self.b
        sorted_pos, order = b.op("TopK", [flat_pos, b.op("Shape", [flat_pos])], n_outputs=2,
                                 axis=0, largest=0, sorted=1)
        dtype = self.dtype(x)
        g = b.op("Gather", [flat_g, order], axis=0)
        if dtype != TensorProto.DOUBLE:
            g = b.cast(g, TensorProto.DOUBLE)
        prefix = b.op("CumSum", [g, b.const(np.int64(0))])
        # A run of equal positions ends where the next position differs (or at the end).
        following = b.op("Concat", [
            b.op("Slice", [sorted_pos, b.ints([1], hint="one"),
                           b.ints([np.iinfo(np.int64).max], hint="end")]),
            b.ints([-1], hint="flat")], axis=0)
        ends = b.squeeze(b.op("NonZero", [b.op("Not", [b.op("Equal", [sorted_pos, following])])]),
                         [0])
        at_ends = b.op("Gather", [prefix, ends], axis=0)
        before = b.op("Concat", [b.const(np.zeros(1)), b.op("Slice", [
            at_ends, b.ints([0], hint="zero"), b.ints([-1], hint="flat")])], axis=0)
        sums = b.op("Sub", [at_ends, before])
        if dtype != TensorProto.DOUBLE:
            sums = b.cast(sums, dtype)
        return b.op("Gather", [sorted_pos, ends], axis=0), sums

    def positions(self, x: str) -> str:
        """Int64 tensor of ``x``'s shape holding each element's flat index."""
        b = self.b
        flat = b.op("Range", [b.const(np.int64(0)), b.op("Size", [x]), b.const(np.int64(1))])
        return self.reshape_like(flat, x)


def _static_reduce_axes(gshape: list, tshape: list) -> list[int] | None:
    """Axes to sum so a gradient of shape ``gshape`` fits ``tshape`` (None: unknown)."""
    lead = len(gshape) - len(tshape)
    if lead < 0:
        return None
    axes = list(range(lead))
    for i, (dg, dt) in enumerate(zip(gshape[lead:], tshape), start=lead):
        if dt == 1:
            if dg != 1:
                axes.append(i)
        elif isinstance(dt, int):
            continue  # a dim > 1 is never broadcast
        elif dt is None or dg != dt:
            return None  # a symbolic dim may be 1 at run time
    return axes
