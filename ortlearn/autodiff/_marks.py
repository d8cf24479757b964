"""Marks a caller puts on a model's nodes to tell the gradient rules what the graph lost."""

from __future__ import annotations

import onnx

from ..graph import attr
from ..graph.format import PADDING_IDX_KEY


def mark_padding_idx(model: onnx.ModelProto, table: str, padding_idx: int) -> list[str]:
    """Mark row ``padding_idx`` of the embedding table ``table`` as torch's padding row.

    ``nn.Embedding(padding_idx=p)`` gives row ``p`` no gradient, so training
    leaves it untouched (except for weight decay). The dynamo exporter records
    ``padding_idx`` on the ``Gather`` node and ortlearn reads it; the
    TorchScript exporter writes a bare ``Gather`` and loses it. This sets the
    metadata key :data:`ortlearn.graph.format.PADDING_IDX_KEY` on every
    ``Gather`` (``axis=0``) reading ``table``, in place, so that
    :func:`build_gradient` and :func:`ortlearn.artifacts.generate_artifacts`
    drop the gradient of that row (and of the lookups of it).

    Parameters
    ----------
    model : onnx.ModelProto
        The forward model, modified in place.
    table : str
        Name of the embedding table (the initializer, e.g. ``"embedding.weight"``).
    padding_idx : int
        The padding row; negative counts from the end, as in torch.

    Returns
    -------
    list of str
        The names (or, for unnamed nodes, the first outputs) of the marked nodes.

    Raises
    ------
    ValueError
        If no ``Gather`` on axis 0 reads ``table``, or ``padding_idx`` is out of
        the table's range.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import TensorProto as T, helper as h, numpy_helper
    >>> from ortlearn.autodiff import mark_padding_idx
    >>> lookup = h.make_node("Gather", ["emb", "ids"], ["y"], name="lookup")
    >>> table = numpy_helper.from_array(np.zeros((5, 2), np.float32), "emb")
    >>> ids = h.make_tensor_value_info("ids", T.INT64, ["N"])
    >>> y = h.make_tensor_value_info("y", T.FLOAT, ["N", 2])
    >>> model = h.make_model(h.make_graph([lookup], "g", [ids], [y], [table]))
    >>> mark_padding_idx(model, "emb", -5)
    ['lookup']
    >>> model.graph.node[0].metadata_props[0].value
    '0'
    """
    rows = next((int(i.dims[0]) for i in model.graph.initializer
                 if i.name == table and i.dims), None)
    padding_idx = int(padding_idx)
    if rows is not None:
        if not -rows <= padding_idx < rows:
            raise ValueError(f"padding_idx={padding_idx} is out of range for table {table!r} "
                             f"of {rows} rows.")
        padding_idx %= rows
    elif padding_idx < 0:
        raise ValueError(f"A negative padding_idx needs the number of rows of {table!r}, "
                         "which is not an initializer of the model.")
    marked = []
    for node in model.graph.node:
        if node.op_type != "Gather" or node.input[0] != table or attr(node, "axis", 0) != 0:
            continue
        kept = [p for p in node.metadata_props if p.key != PADDING_IDX_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
        node.metadata_props.add(key=PADDING_IDX_KEY, value=str(padding_idx))
        marked.append(node.name or node.output[0])
    if not marked:
        raise ValueError(f"No Gather node on axis 0 reads {table!r}: it is not an embedding "
                         "table of the model.")
    return marked
