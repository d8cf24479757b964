"""What of a training step depends on the rows of its batch, found from the step's shapes.

:func:`probe_shapes` infers a step's shapes for two batch sizes (and two
values of the data's other symbolic dims); :func:`batch_multiples` finds
from them the ``Size`` and ``Shape`` values that scale with the rows; the
epoch's ``Loop`` computes them once per epoch
(:func:`~ortlearn.training.fused.build_fused_epoch`), and a table-fed step
computes each ``Size`` from its ``rows`` input (:func:`sizes_from_rows`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..graph import attr, elem_type_of, shape_of
from ..graph.passes import GraphView

__all__ = ["PROBE_OTHER", "PROBE_ROWS", "batch_multiples", "probe_shapes", "sizes_from_rows"]

#: Two batch sizes (primes) the step's shapes are inferred with: a ``Size`` or
#: ``Shape`` whose value scales with them is a multiple of the batch's rows.
PROBE_ROWS = (1009, 1013)
#: Two values (primes) of the data's other dims that are not static, in the probes.
PROBE_OTHER = (1019, 1021)


def probe_shapes(model: onnx.ModelProto, nodes, layout) -> list[dict] | None:
    """The shapes of a step's values for two batch sizes (:data:`PROBE_ROWS`), and for two
    values of the data's other dims that are not static (the padded width of sparse rows,
    :data:`PROBE_OTHER`): ``[{value: shape}, ...]``, None when a data input's rank is
    unknown or the shapes cannot be inferred."""
    declared = {i.name: i for i in model.graph.input}
    data = {name: declared[src] for name, src in layout.data.items()}
    if any(shape_of(i) is None for i in data.values()):
        return None
    symbolic = any(not isinstance(d, int) for i in data.values() for d in shape_of(i)[1:])
    cases = [(PROBE_ROWS[0], PROBE_OTHER[0]), (PROBE_ROWS[1], PROBE_OTHER[0])]
    if symbolic:
        cases.append((PROBE_ROWS[0], PROBE_OTHER[1]))
    steps = [n for n in nodes if not set(n.output) & set(data)]
    probes = []
    for rows, other in cases:
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        graph = probe.graph
        del graph.input[:]
        graph.input.extend(
            [helper.make_tensor_value_info(name, elem_type_of(info), [
                rows, *(d if isinstance(d, int) else other for d in shape_of(info)[1:])])
             for name, info in data.items()]
            + [i for i in declared.values() if i.name not in set(layout.data.values())])
        del graph.output[:]
        del graph.value_info[:]
        try:
            probes.append(GraphView(probe, steps, []).shapes)
        except (onnx.shape_inference.InferenceError, ValueError, KeyError, TypeError):
            return None
    return probes


def batch_multiples(model: onnx.ModelProto, nodes, layout, probes=None) -> dict:
    """``{output: (coef, const)}`` of the ``Size`` and ``Shape`` nodes of a step that
    depend on the batch only through its number of rows ``B``.

    A ``Size`` is ``coef * B`` (``coef`` an int); a ``Shape`` is
    ``coef * B + const`` (int vectors). Found from the step's shapes for two
    batch sizes (``probes``, :func:`probe_shapes`'s, computed when None), only
    what does not change with the data's other dims. Empty when a data input's
    rank is unknown.
    """
    wanted = [n for n in nodes if n.op_type in ("Size", "Shape")]
    if not wanted:
        return {}
    probes = probe_shapes(model, nodes, layout) if probes is None else probes
    if probes is None:
        return {}
    found = {}
    for node in wanted:
        dims = [shapes.get(node.input[0]) for shapes in probes]
        if any(d is None or not all(isinstance(v, int) for v in d) for d in dims):
            continue
        if node.op_type == "Size":
            dims = [[int(np.prod(d, dtype=np.int64))] for d in dims]
        else:
            end = attr(node, "end")
            dims = [d[attr(node, "start", 0):end] for d in dims]
        if len(dims) > 2 and dims[2] != dims[0]:
            continue  # it depends on the data's other dims
        coef, const = [], []
        for small, large in zip(dims[0], dims[1]):
            if small == large:
                coef.append(0)
                const.append(small)
            elif small % PROBE_ROWS[0] == 0 and large == small // PROBE_ROWS[0] * PROBE_ROWS[1]:
                coef.append(small // PROBE_ROWS[0])
                const.append(0)
            else:
                break
        else:
            found[node.output[0]] = (coef[0], const[0]) if node.op_type == "Size" else (coef,
                                                                                        const)
    return found


def sizes_from_rows(model, nodes, layout, rows_value: str, dtype) -> list:
    """``nodes`` of a table-fed step, each ``Size`` that is ``coef * rows`` computed from
    the value ``rows_value`` (the batch's rows, a float of ``dtype``), each the same
    for every batch a constant (:func:`batch_multiples`).

    ``Size`` is a CPU operator on GPU providers: its value would be copied to
    the device at each step (a wait for the GPU, and no graph capture). The
    rows are a float of the loss's dtype, exact up to 2**24 rows in float32. A
    ``Cast`` of such a size back to that float (a mean's divisor) reads the
    float itself.
    """
    multiples = batch_multiples(model, nodes, layout)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    floats = {}  # each Size computed here -> its value as a float of ``dtype``
    out = []
    for node in nodes:
        if (node.op_type == "Cast" and node.input[0] in floats
                and attr(node, "to") == elem):
            # the Size cast back to the rows' float: the rows themselves, an exact
            # integer (one kernel fewer a step on a GPU provider)
            out.append(helper.make_node("Identity", [floats[node.input[0]]],
                                        list(node.output), name=node.name))
            continue
        if node.op_type != "Size" or node.output[0] not in multiples:
            out.append(node)
            continue
        name = node.output[0]
        coef, const = multiples[name]
        if coef == 0:  # the same size for every batch
            out.append(helper.make_node("Constant", [], [name], name=name,
                                        value=onnx.numpy_helper.from_array(
                                            np.array(const, dtype=np.int64))))
            continue
        rows = rows_value
        if coef != 1:
            factor = name + ".coef"
            out.append(helper.make_node("Constant", [], [factor], name=factor,
                                        value=onnx.numpy_helper.from_array(
                                            np.array(coef, dtype=dtype))))
            rows = name + ".rows"
            out.append(helper.make_node("Mul", [rows_value, factor], [rows], name=rows))
        out.append(helper.make_node("Cast", [rows], [name], to=TensorProto.INT64, name=name))
        floats[name] = rows
    return out

