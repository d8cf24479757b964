"""From a forward+loss model to the training and eval models of the artifact format.

See ``doc/artifacts_format.md`` for the names and the order of the inputs and
outputs written here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper

from ..graph import (
    FLOAT_TYPES,
    GraphBuilder,
    finalize_model,
    initializer_map,
    set_inference_mode,
)
from ..graph.batch_norm import add_running_statistics_updates, running_statistics
from ..graph.format import (
    GRAD_BUFFER_SUFFIX,
    GRAD_OUTPUT_SUFFIX,
    INPUT_GRADIENTS_KEY,
    LAZY_RESET_GRAD,
    TRAINING_METADATA_KEY,
    UPDATED_FROZEN_KEY,
)
from .export_checks import tied_parameter_hint


def split_parameters(model: onnx.ModelProto, requires_grad: Sequence[str],
                     frozen: Sequence[str]) -> tuple[list[TensorProto], list[TensorProto]]:
    """The initializers named in ``requires_grad`` and ``frozen`` (copies, in that order).

    Raises
    ------
    ValueError
        For a name that is not an initializer of the model, or in both lists.
    TypeError
        For a trainable initializer whose type is not float32 or float64.
    """
    both = sorted(set(requires_grad) & set(frozen))
    if both:
        raise ValueError(f"Parameters both trainable and frozen: {both}.")
    inits = initializer_map(model.graph)
    unknown = [n for n in [*requires_grad, *frozen] if n not in inits]
    if unknown:
        inputs = sorted(i.name for i in model.graph.input if i.name not in inits)
        raise ValueError(
            f"Parameters {unknown} are neither initializers nor graph inputs of the model; "
            f"its initializers are {sorted(inits)}, its graph inputs {inputs}."
            f"{tied_parameter_hint(model, requires_grad, frozen)}")
    not_float = [f"{n} ({TensorProto.DataType.Name(inits[n].data_type)})"
                 for n in requires_grad if inits[n].data_type not in FLOAT_TYPES]
    if not_float:
        raise TypeError(f"Only float32/float64 initializers can be trained, got {not_float}.")

    def copies(names):
        out = []
        for name in names:
            t = TensorProto()
            t.CopyFrom(inits[name])
            out.append(t)
        return out

    return copies(requires_grad), copies(frozen)


def _parameters_to_inputs(model: onnx.ModelProto, params: list[TensorProto]) -> list[str]:
    """Turn the parameters into graph inputs placed after the user inputs.

    Return the user inputs.
    """
    g = model.graph
    names = {p.name for p in params}
    kept = [i for i in g.initializer if i.name not in names]
    del g.initializer[:]
    g.initializer.extend(kept)
    user_inputs = [i for i in g.input if i.name not in names]
    del g.input[:]
    g.input.extend(user_inputs)
    g.input.extend(helper.make_tensor_value_info(p.name, p.data_type, list(p.dims)) for p in params)
    return [i.name for i in user_inputs]


def _set_metadata(model, user_inputs, user_outputs, trainable, frozen, updated=(),
                  input_grads=()) -> None:
    meta = {"user_inputs": list(user_inputs), "user_outputs": list(user_outputs),
            "trainable": list(trainable), "frozen": list(frozen)}
    if updated:
        meta[UPDATED_FROZEN_KEY] = list(updated)
    if input_grads:
        meta[INPUT_GRADIENTS_KEY] = list(input_grads)
    kept = [p for p in model.metadata_props if p.key != TRAINING_METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=TRAINING_METADATA_KEY, value=json.dumps(meta))


def _add_gradient_accumulation(model: onnx.ModelProto, wrt: list[onnx.ValueInfoProto],
                               grads: dict[str, str]) -> None:
    """``out = Where(lazy_reset_grad, grad, buffer + grad)`` for each value of ``wrt``."""
    g = model.graph
    b = GraphBuilder.for_model(model, prefix="accumulation_")
    reset = b.reserve(LAZY_RESET_GRAD)
    for info in wrt:
        buffer, out = onnx.ValueInfoProto(), onnx.ValueInfoProto()
        for value, suffix in ((buffer, GRAD_BUFFER_SUFFIX), (out, GRAD_OUTPUT_SUFFIX)):
            value.CopyFrom(info)
            value.name = b.reserve(info.name + suffix)
        g.input.append(buffer)
        grad = grads[info.name]
        b.op("Where", [reset, grad, b.op("Add", [buffer.name, grad])], outputs=[out.name])
        g.output.append(out)
    g.input.append(helper.make_tensor_value_info(reset, TensorProto.BOOL, []))
    b.add_to_graph(g)


def _value_infos(model: onnx.ModelProto, params: list[TensorProto],
                 input_grads: Sequence[str]) -> list[onnx.ValueInfoProto]:
    """Type and shape of the parameters, then of the graph inputs ``input_grads``."""
    infos = [helper.make_tensor_value_info(p.name, p.data_type, list(p.dims)) for p in params]
    inputs = {i.name: i for i in model.graph.input}
    for name in input_grads:
        if inputs[name].type.tensor_type.elem_type not in FLOAT_TYPES:
            raise TypeError(f"requires_grad({name!r}): only float32/float64 graph inputs have "
                            "a gradient.")
        infos.append(inputs[name])
    return infos


# ------------------------------------------------ BatchNormalization running statistics
def _check_not_trained(model: onnx.ModelProto, requires_grad: Sequence[str]) -> None:
    trained = [n for n in running_statistics(model) if n in set(requires_grad)]
    if trained:
        raise ValueError(
            f"{trained} are running statistics of BatchNormalization nodes in training mode: "
            "each training step updates them from the batch statistics (as torch does), they "
            "cannot also be trained. Move them from requires_grad to frozen_params.")


def build_training_and_eval(model: onnx.ModelProto, requires_grad: Sequence[str],
                            frozen: Sequence[str], input_grads: Sequence[str] = ()):
    """Training and eval models of a forward+loss model whose first output is the loss.

    ``input_grads`` names graph inputs whose gradients the training model
    outputs too, after the parameters' (``<input>_grad.accumulation.out``).

    Returns
    -------
    training_model, eval_model : onnx.ModelProto
    parameters : tuple of (list of TensorProto, list of TensorProto)
        Trainable and frozen parameters.
    """
    from ..autodiff import append_backward

    trainable, frozen_params = split_parameters(model, requires_grad, frozen)
    _check_not_trained(model, requires_grad)
    user_outputs = [o.name for o in model.graph.output]
    forward = onnx.ModelProto()
    forward.CopyFrom(model)
    user_inputs = _parameters_to_inputs(forward, trainable + frozen_params)
    names = ([p.name for p in trainable], [p.name for p in frozen_params])

    eval_model = onnx.ModelProto()
    eval_model.CopyFrom(forward)
    set_inference_mode(eval_model)
    _set_metadata(eval_model, user_inputs, user_outputs, *names)

    training = forward
    input_grads = list(input_grads)
    wrt = _value_infos(training, trainable, input_grads)
    grads = append_backward(training, user_outputs[0], [*names[0], *input_grads])
    _add_gradient_accumulation(training, wrt, grads)
    updated = add_running_statistics_updates(training, [p.name for p in frozen_params])
    _set_metadata(training, user_inputs, user_outputs, *names, updated, input_grads)
    return finalize_model(training), finalize_model(eval_model), (trainable, frozen_params)
