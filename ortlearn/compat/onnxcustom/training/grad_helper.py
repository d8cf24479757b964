"""onnxcustom's ``onnx_derivative``: the gradient graph of an ONNX graph, in standard ONNX.

onnxcustom asked onnxruntime-training for it (its graphs held com.microsoft
kernels such as ``YieldOp``); here :mod:`ortlearn.autodiff` writes it and any
onnxruntime runs it.
"""

from __future__ import annotations

from enum import IntFlag

import onnx
from onnx import TensorProto, helper

from ....autodiff import build_forward_backward, build_gradient
from ....graph import (
    finalize_model,
    get_train_initializer,
    load_model,
    value_info_map,
    weights_to_inputs,
)

__all__ = ["DerivativeOptions", "onnx_derivative"]

_FLOAT_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)


class DerivativeOptions(IntFlag):
    """How :func:`onnx_derivative` builds the gradient graph.

    - ``Zero``: inputs are the graph's inputs, the weights, then one
      gradient ``<output>_grad`` per output; outputs are the gradients
      ``<input>_grad`` then ``<weight>_grad``;
    - ``KeepOutputs``: the graph's outputs follow the gradients;
    - ``FillGrad``: no ``<output>_grad`` input, the gradient of every output
      is a tensor of ones (needs ``KeepOutputs``, as in onnxcustom);
    - ``KeepYieldOp``: onnxruntime-training's form, where a ``YieldOp`` node
      (domain ``com.microsoft``) takes the forward outputs and gives their
      gradients; the ordinary onnxruntime has no kernel for it, so the graph
      can be built and inspected, not run (``Zero`` gives the same gradients
      with the outputs' gradients as inputs);
    - ``Loss``: the graph holds a loss; gradients of the loss w.r.t. the
      inputs (see :func:`onnx_derivative`).
    """

    Zero = 0
    KeepYieldOp = 1
    KeepOutputs = 2
    FillGrad = 4
    Loss = 5


#: Domain of onnxruntime-training's YieldOp.
_MS_DOMAIN = "com.microsoft"


def onnx_derivative(onx, weights=None, inputs=None, options=DerivativeOptions.Zero, loss=None,
                    label=None, path_name=None):
    """The gradient graph of ``onx`` w.r.t. its weights and inputs.

    Parameters
    ----------
    onx : onnx.ModelProto
    weights : list of str, optional
        Initializers to differentiate against (they become inputs of the
        gradient graph); default: the trainable float initializers, ``[]``
        for none.
    inputs : list of str, optional
        Inputs to differentiate against; default: every float input.
    options : DerivativeOptions, default=DerivativeOptions.Zero
    loss : str, optional
        With ``options=DerivativeOptions.Loss``: the name of the loss output.
    label : str or list of str, optional
        With ``DerivativeOptions.Loss``: the label input(s), excluded from the
        inputs differentiated against.
    path_name : str, optional
        With ``DerivativeOptions.Loss``: where the gradient graph is saved.

    Returns
    -------
    onnx.ModelProto
        With ``Loss``: the graph's outputs other than the loss, the loss,
        then ``<input>_grad`` for each input (the weights stay initializers). Otherwise as
        :class:`DerivativeOptions` describes.

    Raises
    ------
    TypeError
        When ``options`` is not a :class:`DerivativeOptions`.
    ValueError
        For ``FillGrad`` without ``KeepOutputs``, ``KeepYieldOp`` combined with
        another option, missing ``loss``, ``label`` or ``path_name`` with ``Loss``.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import helper, numpy_helper, TensorProto
    >>> from onnxruntime import InferenceSession
    >>> graph = helper.make_graph(
    ...     [helper.make_node("Mul", ["X", "W"], ["Y"])], "g",
    ...     [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
    ...     [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 2])],
    ...     [numpy_helper.from_array(np.array([2.0, 3.0], np.float32), "W")])
    >>> onx = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    >>> grad = onnx_derivative(onx)
    >>> [i.name for i in grad.graph.input], [o.name for o in grad.graph.output]
    (['X', 'W', 'Y_grad'], ['X_grad', 'W_grad'])
    >>> sess = InferenceSession(grad.SerializeToString(), providers=["CPUExecutionProvider"])
    >>> X = np.array([[1.0, 1.0]], np.float32)
    >>> sess.run(None, {"X": X, "W": np.array([2.0, 3.0], np.float32), "Y_grad": X})
    [array([[2., 3.]], dtype=float32), array([1., 1.], dtype=float32)]
    """
    if not isinstance(options, DerivativeOptions):
        raise TypeError(f"options must be a DerivativeOptions, not {type(options)!r}.")
    if options == DerivativeOptions.Loss:
        return _derivative_loss(onx, weights, inputs, loss, label, path_name)
    if options & DerivativeOptions.KeepYieldOp:
        if options != DerivativeOptions.KeepYieldOp:
            raise ValueError("Option KeepYieldOp cannot be combined with any other.")
    if options & DerivativeOptions.FillGrad and not options & DerivativeOptions.KeepOutputs:
        raise ValueError("FillGrad must be set with KeepOutputs.")
    return _derivative_forward(onx, weights, inputs, options)


def _default_inputs(model):
    """The float inputs of ``model``."""
    return [i.name for i in model.graph.input if i.type.tensor_type.elem_type in _FLOAT_TYPES]


def _derivative_forward(onx, weights, inputs, options):
    model = load_model(onx)
    weights = list(get_train_initializer(model)) if weights is None else list(weights)
    inputs = _default_inputs(model) if inputs is None else list(inputs)
    original_inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    weights_to_inputs(model, weights)
    by_name = {i.name: i for i in model.graph.input}
    ordered = [by_name[n] for n in original_inputs] + [by_name[w] for w in weights]
    del model.graph.input[:]
    model.graph.input.extend(ordered)
    wrt = inputs + weights
    if not wrt:
        raise ValueError("Nothing to differentiate against: weights and inputs are empty.")
    fb = build_forward_backward(model, wrt)
    infos = value_info_map(fb.forward)

    taken = {v.name for v in ordered} | set(outputs) | {
        o for n in list(fb.forward.graph.node) + list(fb.backward.graph.node) for o in n.output}

    def fresh(name):
        if name in taken:
            raise ValueError(f"The gradient graph would name a value {name!r}, a name the graph "
                             "already uses; rename it first.")
        taken.add(name)
        return name

    nodes = list(fb.forward.graph.node)
    graph_inputs = list(ordered)
    fill = bool(options & DerivativeOptions.FillGrad)
    yielded = bool(options & DerivativeOptions.KeepYieldOp)
    if yielded:  # the outputs' gradients come out of a YieldOp, not in as inputs
        nodes.append(helper.make_node(
            "YieldOp", outputs, [fresh(f"{o}_grad") for o in outputs], domain=_MS_DOMAIN,
            full_shape_outputs=list(range(len(outputs))), name="YieldOp"))
    for out in outputs:
        name = f"{out}_grad"
        if fill:
            if out not in fb.cotangents:
                continue
            shape = fresh(f"{out}_shape")
            elem = infos[out].type.tensor_type.elem_type
            nodes.append(helper.make_node("Shape", [out], [shape]))
            nodes.append(helper.make_node("ConstantOfShape", [shape], [fb.cotangents[out]],
                                          value=helper.make_tensor("value", elem, [1], [1])))
            continue
        if yielded:
            if out in fb.cotangents:
                nodes.append(helper.make_node("Identity", [name], [fb.cotangents[out]]))
            continue
        info = onnx.ValueInfoProto()
        info.CopyFrom(infos[out])
        info.name = fresh(name)
        graph_inputs.append(info)
        if out in fb.cotangents:
            nodes.append(helper.make_node("Identity", [name], [fb.cotangents[out]]))
    nodes.extend(fb.backward.graph.node)
    grad_infos = value_info_map(fb.backward)
    graph_outputs = []
    for w in wrt:
        name = fresh(f"{w}_grad")
        nodes.append(helper.make_node("Identity", [fb.gradients[w]], [name]))
        info = onnx.ValueInfoProto()
        info.CopyFrom(grad_infos.get(fb.gradients[w]) or by_name[w])
        info.name = name
        graph_outputs.append(info)
    if options & DerivativeOptions.KeepOutputs:
        graph_outputs.extend(infos[o] for o in outputs)
    initializers = {i.name: i for i in fb.forward.graph.initializer}
    initializers.update({i.name: i for i in fb.backward.graph.initializer})
    graph = helper.make_graph(nodes, model.graph.name, graph_inputs, graph_outputs,
                              list(initializers.values()))
    opsets = list(model.opset_import)
    if yielded and all(o.domain != _MS_DOMAIN for o in opsets):
        opsets.append(helper.make_opsetid(_MS_DOMAIN, 1))
    new = helper.make_model(graph, opset_imports=opsets,
                            producer_name="ortlearn", ir_version=model.ir_version)
    new.functions.extend(fb.forward.functions)
    return finalize_model(new, check=False)


def _derivative_loss(onx, weights, inputs, loss, label, path_name):
    if path_name is None:
        raise ValueError("path_name must not be None if options is 'Loss'.")
    if weights is not None:
        raise ValueError("weights must be None if options is 'Loss'.")
    if label is None:
        raise ValueError("label must not be None if options is 'Loss'.")
    if loss is None or not isinstance(loss, str):
        raise ValueError("loss must be a string (the loss output) if options is 'Loss'.")
    labels = {label} if isinstance(label, str) else set(label)
    model = load_model(onx)
    if inputs is None:
        inputs = _default_inputs(model)
    elif isinstance(inputs, str):
        inputs = [inputs]
    inputs = [x for x in inputs if x not in labels]
    grad = build_gradient(model, wrt=inputs, loss_output=loss)
    # build_gradient returns the loss and the gradients; the graph's other
    # outputs come back first, as onnxruntime-training's builder kept them.
    infos = value_info_map(grad)
    others = [o for o in model.graph.output if o.name != loss]
    kept = [infos.get(o.name, o) for o in others]
    outputs = list(grad.graph.output)
    del grad.graph.output[:]
    grad.graph.output.extend(kept + outputs)
    onnx.save(grad, path_name)
    return grad
