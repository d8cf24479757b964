"""Lowering of the ``ai.onnx.ml`` operators skl2onnx emits to standard operators.

:func:`lower_ml_operators` rewrites each ``ai.onnx.ml`` node with the function
registered for its operator in ``_LOWERINGS`` (``LinearRegressor``,
``LinearClassifier``, ``Scaler``, ``Normalizer``, ``ArrayFeatureExtractor``,
``Binarizer``),
so that the graph can be differentiated and the weights become initializers.
A lowering function takes ``(node, attributes, builder, value_infos)``, adds
its nodes to the builder and returns the new initializers.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..graph import (
    GraphBuilder,
    elem_type_of,
    load_model,
    shape_of,
    value_info_map,
)

__all__ = ["lower_ml_operators"]

_ML_DOMAIN = "ai.onnx.ml"


def lower_ml_operators(onx) -> onnx.ModelProto:
    """Replace the ``ai.onnx.ml`` operators of a model by standard operators.

    The lowered graph computes the same outputs with operators that can be
    differentiated; the weights of ``LinearRegressor`` and
    ``LinearClassifier`` (attributes of those operators) become float
    initializers named ``coef`` (``(n_features, n_targets)``) and
    ``intercept`` (``(n_targets,)``), which :func:`get_train_initializer`
    lists. The parameters of ``Scaler`` and ``Normalizer`` and the class
    labels become ``Constant`` nodes. A binary ``LinearClassifier`` written
    as two opposite rows (skl2onnx's form of a binary logistic regression) is
    lowered to its decision function, one column.

    Lowered: ``LinearRegressor`` (post_transform NONE), ``LinearClassifier``
    (NONE, LOGISTIC, SOFTMAX), ``Scaler``, ``Normalizer``,
    ``ArrayFeatureExtractor`` (as ``Gather``), ``Binarizer`` (as ``Greater``). The ml
    operators compute in float32: so does the lowered graph (other inputs
    are cast to float32).

    Parameters
    ----------
    onx : onnx.ModelProto, bytes or path
        The model; it is not modified.

    Returns
    -------
    onnx.ModelProto
        A new model without ``ai.onnx.ml`` nodes (the ``ai.onnx.ml`` opset
        import is removed).

    Raises
    ------
    ValueError
        An ``ai.onnx.ml`` operator (or attribute value) ortlearn cannot lower;
        the message names the node.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LinearRegression
    >>> from skl2onnx import to_onnx
    >>> from ortlearn.convert import get_train_initializer
    >>> X = np.random.rand(20, 3).astype(np.float32)
    >>> onx = to_onnx(LinearRegression().fit(X, X[:, 0]), X)
    >>> [n.op_type for n in onx.graph.node]
    ['LinearRegressor']
    >>> lowered = lower_ml_operators(onx)
    >>> [n.op_type for n in lowered.graph.node], get_train_initializer(lowered)
    (['MatMul', 'Add'], ['coef', 'intercept'])
    """
    model = load_model(onx)
    infos = value_info_map(model)
    b = GraphBuilder.for_model(model)
    nodes, inits = [], []
    for node in model.graph.node:
        if node.domain != _ML_DOMAIN:
            nodes.append(node)
            continue
        lower = _LOWERINGS.get(node.op_type)
        if lower is None:
            raise ValueError(
                f"ortlearn cannot lower the {_ML_DOMAIN} operator {node.op_type} "
                f"(node {node.name!r}) to standard operators; it lowers "
                f"{', '.join(sorted(_LOWERINGS))}."
            )
        start = len(b.nodes)
        inits.extend(lower(node, _attributes(node), b, infos))
        nodes.extend(b.nodes[start:])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(inits)
    # skl2onnx may import the main domain twice
    kept = {o.domain: o for o in reversed(model.opset_import) if o.domain != _ML_DOMAIN}
    del model.opset_import[:]
    model.opset_import.extend(kept.values())
    return model


def _attributes(node) -> dict:
    values = {}
    for att in node.attribute:
        value = helper.get_attribute_value(att)
        values[att.name] = value.decode() if isinstance(value, bytes) else value
    return values


def _unsupported_attribute(node, name, value):
    return ValueError(
        f"ortlearn cannot lower {node.op_type} node {node.name!r} with {name}={value!r}."
    )


def _as_float(name: str, b: GraphBuilder, infos) -> str:
    """``name`` cast to float32 unless it already is (ml operators compute in float)."""
    if name in infos and elem_type_of(infos[name]) == TensorProto.FLOAT:
        return name
    return b.cast(name, TensorProto.FLOAT)


def _linear(x: str, coef: np.ndarray, intercept: np.ndarray, b: GraphBuilder,
            output: str | None = None):
    """``x @ coef + intercept`` with the weights as new initializers."""
    wname, cname = b.unique_name("coef"), b.unique_name("intercept")
    product = b.op("MatMul", [x, wname])
    out = b.op("Add", [product, cname], outputs=[output] if output else None)
    inits = [numpy_helper.from_array(coef.astype(np.float32), wname),
             numpy_helper.from_array(intercept.astype(np.float32), cname)]
    return out, inits


def _lower_linear_regressor(node, att, b, infos):
    if att.get("post_transform", "NONE") != "NONE":
        raise _unsupported_attribute(node, "post_transform", att["post_transform"])
    targets = att.get("targets", 1)
    coef = np.asarray(att["coefficients"], dtype=np.float32).reshape(targets, -1).T
    intercept = np.asarray(att.get("intercepts", np.zeros(targets)), dtype=np.float32)
    x = _as_float(node.input[0], b, infos)
    _, inits = _linear(x, coef, intercept, b, output=node.output[0])
    return inits


def _class_labels(node, att, b) -> tuple[str, int]:
    if "classlabels_strings" in att:
        labels = np.array([s.decode() for s in att["classlabels_strings"]], dtype=object)
    else:
        labels = np.asarray(att["classlabels_ints"], dtype=np.int64)
    name = b.unique_name("classes")
    b.op("Constant", [], outputs=[name], value=numpy_helper.from_array(labels, name))
    return name, len(labels)


def _lower_linear_classifier(node, att, b, infos):
    post = att.get("post_transform", "NONE")
    if post not in ("NONE", "LOGISTIC", "SOFTMAX"):
        raise _unsupported_attribute(node, "post_transform", post)
    classes, n_classes = _class_labels(node, att, b)
    coefs = np.asarray(att["coefficients"], dtype=np.float32)
    n_rows = len(att["intercepts"]) if "intercepts" in att else n_classes
    intercepts = np.asarray(att.get("intercepts", np.zeros(n_rows)), dtype=np.float32)
    coefs = coefs.reshape(n_rows, -1)
    x = _as_float(node.input[0], b, infos)
    label_out = node.output[0]
    score_out = node.output[1] if len(node.output) > 1 and node.output[1] else None
    binary = (n_classes == 2 and n_rows == 2 and np.array_equal(coefs[0], -coefs[1])
              and intercepts[0] == -intercepts[1])
    if binary:
        # skl2onnx writes a binary model as rows (-w, w): one column of
        # weights (the decision function) is what sklearn trains.
        raw, inits = _linear(x, coefs[1:].T, intercepts[1:], b)
        index = b.cast(b.op("Greater", [raw, b.const(np.zeros(1, np.float32), hint="zero")]),
                       TensorProto.INT64)
        index = b.op("Reshape", [index, b.ints([-1], hint="flat")])
        if score_out:
            _binary_scores(raw, post, b, score_out)
    elif n_rows == n_classes:
        raw, inits = _linear(x, coefs.T, intercepts, b)
        index = b.op("ArgMax", [raw], axis=1, keepdims=0)
        if score_out:
            transform = {"NONE": "Identity", "LOGISTIC": "Sigmoid", "SOFTMAX": "Softmax"}[post]
            b.op(transform, [raw], outputs=[score_out])
    else:
        raise ValueError(
            f"ortlearn cannot lower LinearClassifier node {node.name!r}: {n_rows} rows of "
            f"coefficients for {n_classes} classes (expected {n_classes}, or two opposite "
            "rows for a binary problem)."
        )
    b.op("Gather", [classes, index], outputs=[label_out], axis=0)
    return inits


def _binary_scores(raw, post, b, output):
    """The two columns (negative class, positive class) of a binary classifier."""
    if post == "LOGISTIC":
        # 1 - p as in sklearn's predict_proba
        proba = b.op("Sigmoid", [raw])
        one = b.const(np.ones(1, np.float32), hint="one")
        b.op("Concat", [b.op("Sub", [one, proba]), proba], outputs=[output], axis=1)
        return
    both = b.op("Concat", [b.op("Neg", [raw]), raw], axis=1)
    b.op("Softmax" if post == "SOFTMAX" else "Identity", [both], outputs=[output])


def _lower_scaler(node, att, b, infos):
    offset = np.asarray(att.get("offset", [0.0]), dtype=np.float32)
    scale = np.asarray(att.get("scale", [1.0]), dtype=np.float32)
    x = _as_float(node.input[0], b, infos)
    shifted = b.op("Sub", [x, b.const(offset, hint="offset")])
    b.op("Mul", [shifted, b.const(scale, hint="scale")], outputs=[node.output[0]])
    return []


def _lower_normalizer(node, att, b, infos):
    norm = att.get("norm", "MAX")
    x = _as_float(node.input[0], b, infos)
    if norm == "MAX":
        size = b.reduce("ReduceMax", x, axes=[-1], keepdims=1)
    elif norm == "L1":
        size = b.reduce("ReduceSum", b.op("Abs", [x]), axes=[-1], keepdims=1)
    elif norm == "L2":
        size = b.op("Sqrt", [b.reduce("ReduceSumSquare", x, axes=[-1], keepdims=1)])
    else:
        raise _unsupported_attribute(node, "norm", norm)
    # rows of norm 0 are left as they are (onnxruntime and sklearn both do)
    zero = b.const(np.zeros(1, np.float32), hint="zero")
    one = b.const(np.ones(1, np.float32), hint="one")
    size = b.op("Where", [b.op("Equal", [size, zero]), one, size])
    b.op("Div", [x, size], outputs=[node.output[0]])
    return []


def _lower_array_feature_extractor(node, att, b, infos):
    data, indices = node.input
    flat = b.op("Reshape", [indices, b.ints([-1], hint="flat")])
    info = infos.get(data)
    shape = shape_of(info) if info is not None else None
    if shape is None:
        raise ValueError(
            f"ortlearn cannot lower ArrayFeatureExtractor node {node.name!r}: "
            f"the rank of {data!r} is unknown."
        )
    if len(shape) == 1:
        # ArrayFeatureExtractor returns a row (1, n) from a 1-D tensor
        picked = b.op("Gather", [data, flat], axis=0)
        b.op("Unsqueeze", [picked, b.ints([0])], outputs=[node.output[0]])
    else:
        b.op("Gather", [data, flat], axis=-1, outputs=[node.output[0]])
    return []


def _lower_binarizer(node, att, b, infos):
    # Binarizer(x) = 1 where x > threshold, else 0, in x's type (skl2onnx's multilabel
    # MLPClassifier labels: probabilities > 0.5).
    x = node.input[0]
    info = infos.get(x)
    elem = elem_type_of(info) if info is not None else TensorProto.FLOAT
    dtype = np.float64 if elem == TensorProto.DOUBLE else np.float32
    threshold = b.const(np.array([att.get("threshold", 0.0)], dtype), hint="threshold")
    b.op("Cast", [b.op("Greater", [x, threshold])], outputs=[node.output[0]], to=elem)
    return []


_LOWERINGS = {
    "ArrayFeatureExtractor": _lower_array_feature_extractor,
    "Binarizer": _lower_binarizer,
    "LinearClassifier": _lower_linear_classifier,
    "LinearRegressor": _lower_linear_regressor,
    "Normalizer": _lower_normalizer,
    "Scaler": _lower_scaler,
}

