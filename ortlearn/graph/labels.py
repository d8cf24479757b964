"""Class-label inputs: marked in a model's metadata, and guarded by a node that fails on
a label outside ``[0, n_classes)`` (a GatherElements would wrap a negative one around).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .model import onnx_to_np_dtype
from .values import elem_type_of

#: ``metadata_props`` key listing the inputs that hold class indices
#: (``{input: {"n_classes": int or null, "ignore_index": int or null}}``, JSON):
#: written by the cross-entropy losses, read where labels enter from the host.
CLASS_LABELS_KEY = "ortlearn.class_labels"


def class_label_marks(model: onnx.ModelProto) -> dict:
    """``{input: (n_classes or None, ignore_index or None)}``, from :func:`mark_class_labels`."""

    for prop in model.metadata_props:
        if prop.key == CLASS_LABELS_KEY:
            try:
                marks = json.loads(prop.value)
                return {name: (m.get("n_classes"), m.get("ignore_index"))
                        for name, m in marks.items()}
            except (ValueError, AttributeError):
                return {}  # a foreign or damaged entry: no check rather than a failure
    return {}


def mark_class_labels(model: onnx.ModelProto, label: str, n_classes: int | None,
                      ignore_index: int | None = None) -> None:
    """Record in ``model.metadata_props`` that the input ``label`` holds class indices.

    Parameters
    ----------
    model : onnx.ModelProto
        Modified in place.
    label : str
        The graph input holding the class indices.
    n_classes : int or None
        Number of classes (labels lie in ``[0, n_classes)``), None when the
        graph does not fix it.
    ignore_index : int, default=None
        A label value the loss skips, allowed outside the range.
    """

    marks = {name: {"n_classes": n, "ignore_index": i}
             for name, (n, i) in class_label_marks(model).items()}
    marks[label] = {"n_classes": None if n_classes is None else int(n_classes),
                    "ignore_index": None if ignore_index is None else int(ignore_index)}
    value = json.dumps(marks, sort_keys=True)
    for prop in model.metadata_props:
        if prop.key == CLASS_LABELS_KEY:
            prop.value = value
            return
    model.metadata_props.add(key=CLASS_LABELS_KEY, value=value)


#: Prefix of the names of the nodes :func:`guard_class_labels` adds (then the input's name).
CLASS_LABEL_GUARD = "ortlearn.class_label_guard."


def guard_class_labels(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` whose marked class-label inputs make the run fail when out of range.

    Labels that pass through Python are checked on the host
    (:func:`ortlearn.training.checks.check_class_labels`); labels fed as
    OrtValues may live on a device, where reading them back each step would
    cost a synchronisation. The graph checks those: each input recorded by
    :func:`mark_class_labels` goes through a ``Reshape`` to its own shape
    when every label lies in ``[0, n_classes)`` (or is the ``ignore_index``),
    and to an impossible shape otherwise, so that onnxruntime stops the run
    before any loss reads a wrapped-around index. The failing node is named
    ``CLASS_LABEL_GUARD + input`` for the caller to turn the error into a
    ``ValueError``. An unknown ``n_classes`` checks the sign only.

    Returns
    -------
    onnx.ModelProto
        ``model`` itself when it has no marked integer input, else a copy.
    """
    inputs = {i.name: i for i in model.graph.input}
    marks = {name: mark for name, mark in class_label_marks(model).items()
             if name in inputs and elem_type_of(inputs[name]) in (TensorProto.INT64,
                                                                   TensorProto.INT32)}
    if not marks or not model.graph.node:
        return model
    guarded = onnx.ModelProto()
    guarded.CopyFrom(model)
    graph = guarded.graph
    nodes, renamed = [], {}
    for name, (n_classes, ignore_index) in marks.items():
        label_dtype = onnx_to_np_dtype(elem_type_of(inputs[name]))
        prefix = CLASS_LABEL_GUARD + name

        def const(value, suffix, dtype=label_dtype):
            nodes.append(helper.make_node(
                "Constant", [], [f"{prefix}.{suffix}"], name=f"{prefix}.{suffix}",
                value=numpy_helper.from_array(np.array(value, dtype=dtype))))
            return f"{prefix}.{suffix}"

        def op(op_type, args, suffix, **kwargs):
            nodes.append(helper.make_node(op_type, args, [f"{prefix}.{suffix}"],
                                          name=f"{prefix}.{suffix}", **kwargs))
            return f"{prefix}.{suffix}"

        bad = op("Less", [name, const(0, "zero")], "negative")
        if n_classes is not None:
            bad = op("Or", [bad, op("GreaterOrEqual", [name, const(n_classes, "n")], "high")],
                     "outside")
        if ignore_index is not None:
            ignored = op("Equal", [name, const(ignore_index, "ignore")], "ignored")
            bad = op("And", [bad, op("Not", [ignored], "kept")], "bad")
        # in int32, and the shape read off the int32 mask: GPU providers (WebGPU) reduce
        # and take the shape of int32 tensors, not always of int64 ones
        as_int = op("Cast", [bad], "as_int", to=TensorProto.INT32)
        count = op("ReduceSum", [as_int], "count", keepdims=0)
        flag = op("Cast", [op("Min", [count, const(1, "one", np.int32)], "flag32")], "flag",
                  to=TensorProto.INT64)
        # flag 0: the input's own shape; flag 1: every dimension d becomes 2d + 1,
        # which no tensor of the input's size can take.
        shape = op("Shape", [as_int], "shape")
        target = op("Add", [shape, op("Mul", [flag, op("Add", [shape, const(1, "one_dim",
                                                                              np.int64)],
                                                        "grown")], "excess")], "target")
        nodes.append(helper.make_node("Reshape", [name, target], [prefix], name=prefix))
        renamed[name] = prefix
    _rename_inputs(graph, renamed)
    old = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + old)
    return guarded


def _rename_inputs(graph: onnx.GraphProto, renamed: dict) -> None:
    """Make the nodes of ``graph`` (and of its subgraphs) read ``renamed[x]`` for ``x``."""
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                _rename_inputs(sub, renamed)
