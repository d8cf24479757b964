"""onnxcustom's ``onnxcustom.utils.orttraining_helper``: a loss appended to a graph its way.

:func:`add_loss_output` here keeps onnxcustom's reductions, which differ
from those of the native :func:`ortlearn.add_loss_output`:

==================  =============================================  ===========================
score_name          loss (``d = f(x) - y``, ``w`` sample weights)  native ortlearn
==================  =============================================  ===========================
``squared_error``   ``sum_i w_i sum_j d_ij ** 2``                  mean over rows
``absolute_error``  ``sum_i w_i sum_j |d_ij|``                     mean over rows
``elastic``         ``sum_i w_i sum_j (l1 |d| + l2 d ** 2)``       mean over rows
``log``             ``-mean_i w_i log p_i[y_i]`` of probabilities  logits, mean over rows
==================  =============================================  ===========================

(``w_i = 1`` without ``weight_name``), each plus the penalty
``sum_W l1 sum|W| + l2 sum W ** 2``, as a ``[1, 1]`` tensor: the sums make
the gradient grow with the batch, which onnxcustom's
:class:`~ortlearn.compat.onnxcustom.training.optimizers.OrtGradientOptimizer`
compensates by dividing the learning rate by the batch size.
"""

from __future__ import annotations

import numbers
import warnings
from collections import OrderedDict

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ....graph import (
    FLOAT_TYPES,
    GraphBuilder,
    elem_type_of,
    finalize_model,
    invalid_model_errors,
    load_model,
    needed_nodes,
    node_reads,
    np_dtype_to_onnx,
    onnx_to_np_dtype,
    rename_value,
)
from ....loss import elementwise_loss, penalty_terms

__all__ = ["add_loss_output", "get_train_initializer", "penalty_loss_onnx"]

#: score_name -> (the native score computing its elementwise loss, the keywords it takes).
_SUMMED_SCORES = {"squared_error": ("squared_error", ()), "l2": ("squared_error", ()),
                  "absolute_error": ("absolute_error", ()), "l1": ("absolute_error", ()),
                  "elastic": ("elastic", ("l1_weight", "l2_weight"))}
_LOG_KEYWORDS = ("eps",)


def get_train_initializer(onx):
    """The initializers of ``onx`` that can be trained, onnxcustom's way.

    Every float16, float or double initializer (the native
    :func:`ortlearn.get_train_initializer` also leaves out the float
    constants read only through inputs that carry no gradient, and returns
    a list of names).

    Parameters
    ----------
    onx : onnx.ModelProto, bytes or path

    Returns
    -------
    collections.OrderedDict
        ``{name: (numpy value, TensorProto)}`` in the order of
        ``onx.graph.initializer``.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LinearRegression
    >>> from skl2onnx import to_onnx
    >>> X = np.arange(20, dtype=np.float32).reshape(10, 2)
    >>> onx = to_onnx(LinearRegression().fit(X, X.sum(axis=1)), X,
    ...               black_op={'LinearRegressor'})
    >>> [(k, v[0].shape) for k, v in get_train_initializer(onx).items()]
    [('coef', (2, 1)), ('intercept', (1,))]
    """
    model = load_model(onx)
    return OrderedDict((init.name, (numpy_helper.to_array(init), init))
                       for init in model.graph.initializer
                       if init.data_type in (TensorProto.FLOAT16, TensorProto.FLOAT,
                                             TensorProto.DOUBLE))


def penalty_loss_onnx(name, dtype, l1=None, l2=None, existing_names=None):
    """The nodes computing ``l1 * sum|w| + l2 * sum w ** 2`` of the value ``name``.

    Parameters
    ----------
    name : str
        The penalised value (an initializer or an input).
    dtype : numpy dtype
        Its float type.
    l1, l2 : float, default=None
        The coefficients; None means 0. They cannot both be 0.
    existing_names : set of str, default=None
        Names already taken in the graph; the new ones are added to it.

    Returns
    -------
    inits : list of onnx.TensorProto
        Empty: the coefficients are ``Constant`` nodes (onnxcustom made them
        initializers, which a later :func:`get_train_initializer` would list
        as weights).
    nodes : list of onnx.NodeProto
        The last node's single output is the penalty, a scalar.

    Raises
    ------
    ValueError
        Both coefficients are None or 0, or one is negative.

    Examples
    --------
    >>> import numpy as np
    >>> inits, nodes = penalty_loss_onnx('coef', np.float32, l1=0.5)
    >>> inits, [n.op_type for n in nodes]
    ([], ['Abs', 'ReduceSum', 'Constant', 'Mul'])
    """
    if not l1 and not l2:
        raise ValueError(f"l1 and l2 cannot be null or None at the same time, name={name!r}.")
    used = existing_names if existing_names is not None else set()
    builder = GraphBuilder(used_names=used | {name}, prefix=f"penalty_{name}_")
    penalty_terms(builder, {name: {"l1": l1 or 0.0, "l2": l2 or 0.0}},
                  {name: np_dtype_to_onnx(np.dtype(dtype))}, dtype)
    if existing_names is not None:
        existing_names |= {out for node in builder.nodes for out in node.output}
    return [], builder.nodes


def _penalty_spec(penalty) -> dict:
    """onnxcustom's ``{name: beta}`` or ``{name: {'l1': a, 'l2': b}}`` as the second form."""
    if not isinstance(penalty, dict):
        raise TypeError("penalty must be a dict {weight_name: l2} or "
                        f"{{weight_name: {{'l1': a, 'l2': b}}}}, got {type(penalty).__name__}.")
    spec = {}
    for name, value in penalty.items():
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            value = {"l2": value}
        if not isinstance(value, dict):
            raise TypeError(f"penalty[{name!r}] must be a float (l2) or a dict with keys "
                            f"'l1' and/or 'l2', got {type(value).__name__}.")
        if not value.get("l1") and not value.get("l2"):
            raise ValueError(f"l1 and l2 cannot be null or None at the same time, "
                             f"name={name!r}.")
        spec[name] = {k: (0.0 if v is None else v) for k, v in value.items()}
    return spec


def _select_output(model: onnx.ModelProto, output_index) -> onnx.ValueInfoProto:
    """The graph output compared to the label, chosen as onnxcustom did."""
    outputs = list(model.graph.output)
    names = [o.name for o in outputs]
    if output_index is None:
        if len(outputs) != 1:
            raise ValueError(f"Unable to guess the output to compare to the expected labels "
                             f"among {names}: pass output_index.")
        return outputs[0]
    if isinstance(output_index, bool) or not isinstance(output_index, (numbers.Integral, str)):
        raise TypeError(f"output_index must be an integer or a str not {type(output_index)!r}.")
    if isinstance(output_index, str):
        if names.count(output_index) != 1:
            raise ValueError(f"Unable to find output {output_index!r} in {names}.")
        return outputs[names.index(output_index)]
    return outputs[output_index]


def add_loss_output(onx, score_name="squared_error", loss_name="loss", label_name="label",
                    weight_name=None, penalty=None, output_index=None, **kwargs):
    """Append a loss to a prediction graph, with onnxcustom's scores and reductions.

    Parameters
    ----------
    onx : onnx.ModelProto, bytes or path
        The prediction graph; not modified.
    score_name : str, default='squared_error'
        ``'squared_error'`` or ``'l2'``: ``sum_i w_i sum_j (f(x_i)-y_i)_j ** 2``;
        ``'absolute_error'`` or ``'l1'``: ``sum_i w_i sum_j |f(x_i)-y_i|_j``;
        ``'elastic'``: ``sum_i w_i sum_j (l1_weight |d| + l2_weight d ** 2)``
        (``l1_weight`` and ``l2_weight`` keywords, 0.5 each by default);
        ``'log'``: the binary log-loss of a 2-column probability output
        (``output_index`` names it) and an int64 label of shape (n, 1):
        probabilities clipped to ``[eps, 1 - eps]`` (``eps`` keyword,
        1e-6 by default) and renormalised per row, then
        ``-mean_i w_i ((1 - y_i) log p_i0 + y_i log p_i1)``. ``w_i`` are
        the sample weights (1 without ``weight_name``).
    loss_name : str, default='loss'
        The new output, of shape ``[1, 1]``.
    label_name : str, default='label'
        The new label input: the prediction's type and shape (int64, shape
        (n, 1) for ``'log'``). Values of the graph named ``'label'`` (the
        predicted label of a classifier) are renamed ``'_label_'`` first.
    weight_name : str, default=None
        A new sample-weight input of shape (n,), if given.
    penalty : dict, default=None
        ``{name: {'l1': a, 'l2': b}}`` or ``{name: b}`` (``l2`` only): adds
        ``a sum|W| + b sum W ** 2`` for each named weight, not scaled by the
        batch size.
    output_index : int or str, default=None
        The output compared to the label (an index or a name); None when
        the graph has one output.
    **kwargs
        The score's keywords (see ``score_name``). onnxcustom ignored
        keywords given to ``'squared_error'`` and ``'absolute_error'``;
        so does this function, with a warning.

    Returns
    -------
    onnx.ModelProto
        Inputs: those of ``onx``, then ``label_name`` (and ``weight_name``);
        outputs: ``loss_name``, then the selected output only; the nodes
        nothing needs any more are removed.

    Raises
    ------
    NotImplementedError
        An unknown ``score_name`` (onnxcustom's error).
    ValueError
        No ``output_index`` with several outputs, an unknown output name,
        a penalty with l1 and l2 both 0.
    TypeError
        ``output_index`` of another type, an output of unknown type,
        keywords the score does not take.
    RuntimeError
        The graph already holds a value named ``'_label_'``, or ``'log'``
        on an output named ``'output_label'`` (labels, not probabilities).

    Examples
    --------
    >>> import numpy as np
    >>> import onnxruntime as ort
    >>> from sklearn.linear_model import LinearRegression
    >>> from skl2onnx import to_onnx
    >>> X = np.arange(20, dtype=np.float32).reshape(10, 2)
    >>> y = X @ np.array([1.0, 2.0], dtype=np.float32)
    >>> onx = to_onnx(LinearRegression().fit(X, y + 1), X, black_op={'LinearRegressor'})
    >>> onx_loss = add_loss_output(onx, weight_name='weight')
    >>> [i.name for i in onx_loss.graph.input], [o.name for o in onx_loss.graph.output]
    (['X', 'label', 'weight'], ['loss', 'variable'])
    >>> sess = ort.InferenceSession(onx_loss.SerializeToString(),
    ...                             providers=['CPUExecutionProvider'])
    >>> w = np.full(10, 2, dtype=np.float32)
    >>> loss = sess.run(['loss'], {'X': X, 'label': y[:, None], 'weight': w})[0]
    >>> loss.shape, round(float(loss[0, 0]), 3)  # sum_i 2 * 1 ** 2
    ((1, 1), 20.0)
    """
    with invalid_model_errors(onx):
        return _add_loss_output(onx, score_name, loss_name, label_name, weight_name, penalty,
                                output_index, kwargs)


def _add_loss_output(onx, score_name, loss_name, label_name, weight_name, penalty,
                     output_index, kwargs):
    if score_name not in _SUMMED_SCORES and score_name != "log":
        raise NotImplementedError(f"Unexpected {score_name!r} value for score_name "
                                  f"(expected one of {[*_SUMMED_SCORES, 'log']}).")
    model = load_model(onx)
    graph = model.graph
    node_values = {name for node in graph.node for name in (*node.input, *node.output)}
    if "_label_" in node_values:
        raise RuntimeError("One intermediate result is named '_label_'; rename it first "
                           "(add_loss_output renames the values named 'label' to '_label_').")
    if "label" in node_values:
        # skl2onnx classifiers name their predicted label 'label', the usual label_name.
        rename_value(model, "label", "_label_")
    selected = _select_output(model, output_index)
    pred = selected.name
    elem = elem_type_of(selected)
    if elem == 0:
        raise TypeError(f"Unable to guess the tensor type of output {pred!r}.")
    if elem not in FLOAT_TYPES:
        raise TypeError(f"Output {pred!r} is a {TensorProto.DataType.Name(elem)} tensor; the "
                        "loss needs float scores or probabilities: choose output_index.")
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in selected.type.tensor_type.shape.dim]
    dtype = onnx_to_np_dtype(elem)

    builder = GraphBuilder.for_model(model, prefix=f"{loss_name}_")
    loss = builder.reserve(loss_name)
    label = builder.reserve(label_name)
    weight = None if weight_name is None else builder.reserve(weight_name)
    column = builder.ints([-1, 1], hint="shape")
    if score_name == "log":
        unknown = sorted(set(kwargs) - set(_LOG_KEYWORDS))
        if unknown:
            raise TypeError(f"Unexpected keyword argument(s) {unknown} for score_name='log', "
                            "which takes eps.")
        if pred == "output_label":
            raise RuntimeError(f"output_name={pred!r}, log loss does not work on labels.")
        data = _log_loss(builder, pred, label, weight, column, dtype, kwargs.get("eps", 1e-6))
        label_info = helper.make_tensor_value_info(label, TensorProto.INT64, [None, 1])
    else:
        native, keywords = _SUMMED_SCORES[score_name]
        ignored = sorted(set(kwargs) - set(keywords))
        if ignored and keywords:
            raise TypeError(f"Unexpected keyword argument(s) {ignored} for "
                            f"score_name={score_name!r}, which takes {', '.join(keywords)}.")
        if ignored:
            warnings.warn(f"score_name={score_name!r} takes no keyword argument: {ignored} "
                          "ignored (as onnxcustom did).", UserWarning, stacklevel=3)
        params = {k: v for k, v in kwargs.items() if k in keywords}
        per_elem = elementwise_loss(builder, native, pred, label, dtype, **params)
        if weight is not None:
            # (n,) weights against (n, k) losses: one weight per row.
            row_weight = builder.op("Reshape", [weight, column]) if len(dims) >= 2 else weight
            per_elem = builder.op("Mul", [per_elem, row_weight])
        data = builder.reduce("ReduceSum", per_elem, keepdims=1)
        label_info = helper.make_tensor_value_info(label, elem, [None] + dims[1:])
    if penalty is not None:
        inits = {init.name: init.data_type for init in graph.initializer}
        pen = penalty_terms(builder, _penalty_spec(penalty), inits, dtype)
        data = builder.op("Add", [builder.op("Reshape", [data, column]),
                                  builder.op("Reshape", [pen, column])])
    builder.op("Reshape", [data, builder.ints([1, 1], hint="shape")], outputs=[loss])

    builder.add_to_graph(graph)
    graph.input.append(label_info)
    if weight is not None:
        graph.input.append(helper.make_tensor_value_info(weight, elem, [None]))
    kept_output = onnx.ValueInfoProto()
    kept_output.CopyFrom(selected)
    del graph.output[:]
    graph.output.extend([helper.make_tensor_value_info(loss, elem, [1, 1]), kept_output])
    _remove_unused(graph)
    return finalize_model(model)


def _log_loss(builder: GraphBuilder, proba: str, label: str, weight, column: str, dtype,
              eps: float) -> str:
    """``mean_i w_i ((1 - y_i) log p_i0 + y_i log p_i1)`` negated, p clipped and renormalised."""
    clipped = builder.op("Clip", [proba, builder.const(np.array(eps, dtype=dtype)),
                                  builder.const(np.array(1 - eps, dtype=dtype))])
    axis1 = [1]
    total = builder.reduce("ReduceSum", clipped, axes=axis1, keepdims=1)
    log_p = builder.op("Log", [builder.op("Div", [clipped, total])])
    y = builder.cast(label, np_dtype_to_onnx(dtype))
    one_hot = builder.op("Concat", [builder.op("Sub", [builder.const(1.0, dtype), y]), y],
                         axis=1)
    likelihood = builder.reduce("ReduceSum", builder.op("Mul", [log_p, one_hot]), axes=axis1,
                                keepdims=1)
    if weight is not None:
        likelihood = builder.op("Mul", [likelihood, builder.op("Reshape", [weight, column])])
    return builder.op("Neg", [builder.reduce("ReduceMean", likelihood, keepdims=1)])


def _remove_unused(graph: onnx.GraphProto) -> None:
    """Drop the nodes and initializers the outputs do not need (the other outputs' nodes)."""
    kept = needed_nodes(graph.node, [o.name for o in graph.output])
    read = set().union(*(node_reads(node) for node in kept)) if kept else set()
    initializers = [i for i in graph.initializer if i.name in read]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(initializers)
