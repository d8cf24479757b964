"""Sparse data (``scipy.sparse``) in graphs written for dense ``X``.

Where ``X`` is read only as the left factor of products with trained weights
(a linear model, an MLP's first layer) and its rows hold similar numbers of
non-zeros, the training graphs read it sparse (:func:`rows_as_gathers`): each
row as its column indices and values padded to the longest row
(:func:`padded_rows`), each product ``X @ W`` as ``sum_j values_ij W[indices_ij]``.
A step then costs the batch's non-zeros, not its dense size (an MLP's batch of
200 rows of 2 million hashed features would be 1.6 GB dense).

Otherwise (rows too uneven to pad, :func:`paddable`; predictions) a sparse
matrix whose dense form would not fit in memory (100 000 x 50 000 at 0.1 %
non-zeros is 20 GB in float32, its CSR form 40 MB) is densified a block of rows
at a time into one reused host buffer (:class:`DenseRows`), so that the memory
is the non-zeros plus one block. A block of training rows is a whole number of
mini-batches in the order of the epoch: each step sees the rows, in the order,
of the dense fit of the same data, and computes the same numbers.
"""

from __future__ import annotations

import numpy as np
import onnx
import scipy.sparse as sp
from onnx import TensorProto, helper

from .batches import Batches

__all__ = ["BLOCK_BYTES", "DenseRows", "is_sparse", "left_products", "padded_rows",
           "paddable", "rows_as_gathers", "sparse_epoch"]

#: the padded form is used while its entries are at most this many times the non-zeros
PADDING_RATIO = 4

#: Bytes of the dense block of rows a sparse X is densified into (at least one
#: mini-batch or one row): large enough that a block is many onnxruntime steps,
#: small next to the data.
BLOCK_BYTES = 64 * 2**20


def is_sparse(X) -> bool:
    """Whether ``X`` is a scipy sparse matrix or array."""
    return sp.issparse(X)


def block_rows(n_features: int, itemsize: int, multiple: int = 1,
               max_bytes: int = BLOCK_BYTES) -> int:
    """Rows of a block: a multiple of ``multiple`` (at least one) within ``max_bytes``."""
    rows = max_bytes // max(1, n_features * itemsize)
    return max(multiple, rows // multiple * multiple)


class DenseRows:
    """One reused dense buffer that rows of a CSR matrix are written into.

    :meth:`fill` writes the given rows and returns a view of the buffer;
    the next :meth:`fill` first zeroes what the previous one wrote (cost
    proportional to its non-zeros, not to the dense size).

    Parameters
    ----------
    X : scipy.sparse CSR matrix or array
    rows : int
        Most rows of one block.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> X = sp.csr_matrix(np.array([[0.0, 1.0], [2.0, 0.0], [0.0, 3.0]]))
    >>> dense = DenseRows(X, 2)
    >>> dense.fill(np.array([2, 0])).tolist()
    [[0.0, 3.0], [0.0, 1.0]]
    >>> dense.fill(np.array([1])).tolist()
    [[2.0, 0.0]]
    """

    def __init__(self, X, rows: int):
        self.X = X
        if not X.has_canonical_format:
            # duplicates summed once (on a copy: X is the user's), so that a fill is a
            # scatter of the non-zeros rather than toarray's zeroing of the whole block
            X = X.copy()
            X.sum_duplicates()
        self._csr = X
        self.buffer = np.zeros((max(1, min(rows, X.shape[0])), X.shape[1]), X.dtype)
        self._written = None  # (row, column) of the non-zeros of the last fill

    def fill(self, index) -> np.ndarray:
        """The rows ``index`` of X, dense, as a C-contiguous view of the buffer."""
        self.clear()
        part = self._csr[index]
        n = part.shape[0]
        if n > len(self.buffer):
            self.buffer = np.zeros((n, self.X.shape[1]), self.X.dtype)
        out = self.buffer[:n]
        written = (np.repeat(np.arange(n), np.diff(part.indptr)), part.indices)
        out[written] = part.data
        self._written = written
        return out

    def clear(self) -> None:
        """Zero what the last :meth:`fill` wrote."""
        if self._written is not None:
            self.buffer[self._written] = 0
            self._written = None


def sparse_epoch(engine, arrays: list, batches: Batches, lr_for_step=None,
                 max_bytes: int | None = None) -> float:
    """One epoch of ``engine`` over data whose first array is a CSR matrix.

    The epoch's batches are grouped in blocks of whole batches; each
    block's rows, in the epoch's order, are densified (:class:`DenseRows`)
    and trained by :meth:`TrainingEngine.train_epoch` with the other arrays
    reordered the same way. The weights are those of
    ``engine.train_epoch`` on the dense data (same rows, same order, same
    steps); the loss is the mean of the blocks' losses weighted by their
    rows (equal up to rounding).

    Parameters
    ----------
    engine : TrainingEngine
    arrays : list
        A CSR ``X`` then dense arrays (labels, sample weights), aligned with
        ``engine.input_names``.
    batches : Batches
        The epoch's batches (``order`` and ``sizes``).
    lr_for_step : callable, default=None
        As for :meth:`TrainingEngine.train_epoch`.
    max_bytes : int, default=None
        Most bytes of one dense block (None: :data:`BLOCK_BYTES`).

    Returns
    -------
    float
        The epoch's training loss.
    """
    max_bytes = BLOCK_BYTES if max_bytes is None else max_bytes
    X, rest = arrays[0], arrays[1:]
    order, sizes = batches.order, batches.sizes
    per_block = max(1, max_bytes // max(1, int(sizes.max()) * X.shape[1] * X.dtype.itemsize))
    dense = getattr(engine, "_sparse_rows", None)
    if dense is None or dense.X is not X:
        rows = int(sizes[:per_block].sum()) if len(sizes) else 1
        dense = engine._sparse_rows = DenseRows(X, rows)
    total, n_rows, start = 0.0, 0, 0
    try:
        for first in range(0, len(sizes), per_block):
            block_sizes = sizes[first:first + per_block]
            n = int(block_sizes.sum())
            index = order[start:start + n]
            start += n
            block = [dense.fill(index)] + [np.ascontiguousarray(a[index]) for a in rest]
            # The dense buffer is reused in place: the engine must not keep the
            # previous block's data (uploaded once on a GPU).
            engine.release_data()
            local = Batches(np.arange(n, dtype=np.int64), int(block_sizes[0]))
            total += engine.train_epoch(block, local, lr_for_step=lr_for_step) * n
            n_rows += n
    finally:
        engine.release_data()
    return total / n_rows


def dense_blocks(X, max_bytes: int | None = None):
    """Yield the dense blocks of consecutive rows of a sparse X (for predictions).

    Each block is a view of one reused buffer, valid until the next one.
    """
    max_bytes = BLOCK_BYTES if max_bytes is None else max_bytes
    X = X.tocsr()
    rows = block_rows(X.shape[1], X.dtype.itemsize, max_bytes=max_bytes)
    dense = DenseRows(X, rows)
    for start in range(0, X.shape[0], rows):
        yield dense.fill(np.arange(start, min(start + rows, X.shape[0])))


def left_products(model: onnx.ModelProto, name: str, trainable) -> tuple[list, list, int]:
    """The nodes reading the input ``name``, when it is only the left factor of products.

    ``name`` may reach the ``MatMul`` nodes through a ``Cast`` (skl2onnx casts
    the input of a float64 loss). Returns ``([(MatMul node, W), ...], the nodes
    reading name or its cast, the element type of the products)``; a
    ``ValueError`` when ``name`` reaches another node, or a ``W`` that is not a
    trained 2-D weight.
    """
    graph = model.graph
    shapes = {init.name: list(init.dims) for init in graph.initializer}
    elem = next(i.type.tensor_type.elem_type for i in graph.input if i.name == name)
    sources, readers, products, bad = [name], [], [], []
    for node in graph.node:
        left = [i for i, value in enumerate(node.input) if value in sources]
        if not left:
            continue
        readers.append(node)
        if node.op_type == "Cast" and len(sources) == 1:
            sources.append(node.output[0])
            elem = next(a.i for a in node.attribute if a.name == "to")
        elif (node.op_type == "MatMul" and left == [0] and node.input[1] in trainable
              and len(shapes.get(node.input[1], ())) == 2):
            products.append((node, node.input[1]))
        else:
            bad.append(node.op_type)
    if bad or not products:
        raise ValueError(
            f"A sparse {name!r} is supported where it is only the left factor of MatMul "
            f"nodes with a trained 2-D weight (here it reaches {bad or 'no MatMul'}): pass "
            "a dense array (X.toarray()) if it fits in memory.")
    return products, readers, elem


def rows_as_gathers(model: onnx.ModelProto, name: str, trainable) -> onnx.ModelProto:
    """A copy of ``model`` reading the rows of ``name`` as padded column indices and values.

    The input ``name`` (N, F) becomes ``name.indices`` (int64) and
    ``name.values`` (N, M) (:func:`padded_rows`); each ``MatMul(name, W)`` becomes
    ``ReduceSum(Gather(W, indices) * values[..., None], axis=1)``: the same
    product, with a gradient of ``W`` that scatters the batch's non-zeros. A
    ``ValueError`` where ``name`` is read otherwise (:func:`left_products`).
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    products, readers, elem = left_products(model, name, trainable)
    indices, values = name + ".indices", name + ".values"
    nodes = []
    axes_last = helper.make_tensor(name + ".axis_last", TensorProto.INT64, [1], [-1])
    axes_row = helper.make_tensor(name + ".axis_row", TensorProto.INT64, [1], [1])
    graph.initializer.extend([axes_last, axes_row])
    scaled = name + ".values_column"
    nodes.append(helper.make_node("Unsqueeze", [values, axes_last.name], [scaled]))
    for node, weight in products:
        picked = node.output[0] + ".picked"
        nodes += [helper.make_node("Gather", [weight, indices], [picked], axis=0),
                  helper.make_node("Mul", [picked, scaled], [picked + ".scaled"]),
                  helper.make_node("ReduceSum", [picked + ".scaled", axes_row.name],
                                   [node.output[0]], keepdims=0)]
    kept = [node for node in graph.node if all(node is not r for r in readers)]
    del graph.node[:]
    graph.node.extend(nodes + kept)
    position = next(i for i, v in enumerate(graph.input) if v.name == name)
    graph.input.pop(position)
    graph.input.insert(position, helper.make_tensor_value_info(values, elem, ["N", "M"]))
    graph.input.insert(position, helper.make_tensor_value_info(indices, TensorProto.INT64,
                                                               ["N", "M"]))
    return model


def paddable(X, ratio: float | None = None) -> bool:
    """Whether the padded rows of a CSR ``X`` hold at most ``ratio`` (None:
    :data:`PADDING_RATIO`) times its non-zeros (one entry a row at least)."""
    ratio = PADDING_RATIO if ratio is None else ratio
    lengths = np.diff(X.indptr)
    longest = int(lengths.max()) if len(lengths) else 0
    return X.shape[0] * max(1, longest) <= ratio * max(X.nnz, X.shape[0])


def padded_rows(X, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, values)`` of shape (N, M): each row's column indices and values, padded
    with column 0 and value 0 to the longest row's M non-zeros (M >= 1).

    Examples
    --------
    >>> X = sp.csr_matrix(np.array([[0.0, 2.0, 3.0], [4.0, 0.0, 0.0]]))
    >>> indices, values = padded_rows(X)
    >>> indices.tolist(), values.tolist()
    ([[1, 2], [0, 0]], [[2.0, 3.0], [4.0, 0.0]])
    """
    X = sp.csr_matrix(X) if not sp.issparse(X) else X.tocsr()
    if not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    lengths = np.diff(X.indptr)
    width = max(1, int(lengths.max()) if len(lengths) else 1)
    rows = np.repeat(np.arange(X.shape[0]), lengths)
    slots = np.arange(X.nnz) - np.repeat(X.indptr[:-1], lengths)
    indices = np.zeros((X.shape[0], width), np.int64)
    values = np.zeros((X.shape[0], width), dtype or X.dtype)
    indices[rows, slots] = X.indices
    values[rows, slots] = X.data
    return indices, values
