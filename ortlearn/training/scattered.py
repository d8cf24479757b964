"""A weight's scattered update as a second run, both in place: a large step without a copy.

:func:`~ortlearn.graph.passes.scattered_updates` writes SGD's step of a weight read by a
``Gather`` (a linear model on hashed features) as ``w' = ScatterElements(w * d, i, u,
reduction='add')``. In one onnxruntime run the product ``w * d`` is an intermediate of the
weights' size, copied into the buffer bound as ``w'``: onnxruntime neither reuses the
buffer of a graph input for its intermediates nor scatters into a graph output in place.
A large model's step (one run per batch, each weight one buffer read and written:
:attr:`~ortlearn.training.fused.FusedLayout.in_place`) therefore becomes two runs:

1. the step writes ``w' = w * d`` over ``w`` (an elementwise product, after every reader
   of ``w``: :func:`~ortlearn.training.fused.in_place_safe` decides) and outputs the flat
   positions ``i`` and the updates ``u`` (a few values a row);
2. a graph of one ``ScatterElements`` adds ``u`` at ``i`` of a flat view of ``w'``, bound
   as its input and its output: onnxruntime scatters into it without a copy.

The same operations on the same values, in the same order (the additions at a repeated
position are made in the order of ``i``): the weights are those of one run bit for bit,
one buffer of the weights' size and two passes over it a step fewer.
"""

from __future__ import annotations

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from ..graph import DEFAULT_OPSET, finalize_model
from ..graph.nodes import attr, readers
from .device import make_session

__all__ = ["ScatterRun", "split_scattered_updates"]

_POSITIONS, _UPDATES = ".positions", ".updates"


def split_scattered_updates(nodes: list, carried: dict, elem_types: dict
                            ) -> tuple[list, dict, list]:
    """The step's nodes with the scatter of each weight's update left to a second run.

    Parameters
    ----------
    nodes : list of onnx.NodeProto
        The step graph's nodes, after :func:`~ortlearn.graph.passes.scattered_updates`.
    carried : dict of str to str
        ``{weight input: output holding its next value}``.
    elem_types : dict of str to int
        The element type of each weight input.

    Returns
    -------
    nodes : list of onnx.NodeProto
        Where a weight's next value was ``ScatterElements(w * d, i, u)`` (a column
        ``(n, 1)``, ``i`` and ``u`` unsqueezed) or its reshape from a flat view,
        it is ``w * d``, and two nodes output the flat positions ``i`` (int64) and
        the updates ``u``, vectors.
    scatters : dict of str to tuple of str
        ``{weight input: (positions output, updates output)}``.
    outputs : list of onnx.ValueInfoProto
        The step graph's new outputs.
    """
    producer = {out: node for node in nodes for out in node.output}
    users = readers(nodes)
    replaced, added, scatters, outputs = {}, [], {}, []
    for weight, output in carried.items():
        found = _scattered(producer, users, weight, output)
        if found is None:
            continue
        product, positions, updates = found
        name_i, name_u = output + _POSITIONS, output + _UPDATES
        replaced[id(product)] = helper.make_node("Mul", list(product.input), [output],
                                                 name=output)
        replaced[id(producer[output])] = None  # the scatter, or the reshape of its flat view
        added += [helper.make_node("Cast", [positions], [name_i], to=TensorProto.INT64),
                  helper.make_node("Identity", [updates], [name_u])]
        scatters[weight] = (name_i, name_u)
        outputs += [helper.make_tensor_value_info(name_i, TensorProto.INT64, ["scattered"]),
                    helper.make_tensor_value_info(name_u, elem_types[weight], ["scattered"])]
    if not scatters:
        return nodes, {}, []
    kept = [replaced.get(id(node), node) for node in nodes]
    return [node for node in kept if node is not None] + added, scatters, outputs


def _scattered(producer: dict, users: dict, weight: str, output: str):
    """``(the product node w * d, flat positions, updates)`` of a scattered update of
    ``weight`` written to ``output``, else None."""
    node = producer.get(output)
    if users.get(output):  # read in the step (an average): the value of one run
        return None
    flat = node is not None and node.op_type == "Reshape"
    scatter = producer.get(node.input[0]) if flat else node
    if scatter is None or scatter.op_type != "ScatterElements" \
            or attr(scatter, "reduction") != "add" or attr(scatter, "axis", 0) != 0:
        return None
    data, positions, updates = scatter.input
    if flat:
        view = producer.get(data)
        if view is None or view.op_type != "Reshape" or len(users.get(data, ())) != 1:
            return None
        data = view.input[0]
    else:  # a column: its rows are the positions, unsqueezed to (k, 1)
        unsqueezed = [producer.get(v) for v in (positions, updates)]
        if any(u is None or u.op_type != "Unsqueeze" for u in unsqueezed):
            return None
        positions, updates = (u.input[0] for u in unsqueezed)
    product = producer.get(data)
    if product is None or product.op_type != "Mul" or weight not in product.input \
            or len(users.get(data, ())) != 1:
        return None
    return product, positions, updates


def scatter_model(scatters: dict, sizes: dict, elem_types: dict) -> onnx.ModelProto:
    """The second run: for each weight of ``scatters``, ``ScatterElements`` of its updates at
    its positions into its flat view (``sizes``: elements), ``reduction='add'``."""
    inputs, outputs, nodes = [], [], []
    for weight, (positions, updates) in scatters.items():
        elem = elem_types[weight]
        inputs += [helper.make_tensor_value_info(weight, elem, [sizes[weight]]),
                   helper.make_tensor_value_info(positions, TensorProto.INT64, ["k"]),
                   helper.make_tensor_value_info(updates, elem, ["k"])]
        outputs.append(helper.make_tensor_value_info(weight + ".scattered", elem,
                                                     [sizes[weight]]))
        nodes.append(helper.make_node("ScatterElements", [weight, positions, updates],
                                      [weight + ".scattered"], axis=0, reduction="add"))
    graph = helper.make_graph(nodes, "scattered_updates", inputs, outputs)
    return finalize_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)]))


class ScatterRun:
    """The second run of a step whose layout has ``scatters``, on the step's buffers.

    The step's two bindings (one per live half, :class:`~ortlearn.training._buffers.
    StepBuffers`) get the positions and updates as outputs onnxruntime allocates; this
    run's binding of each half reads them and scatters into a flat view of that half's
    weights, bound as its input and its output.

    Parameters
    ----------
    scatters : dict of str to tuple of str
        ``FusedLayout.scatters``.
    buffers : StepBuffers
        The step's buffers (on the CPU: their halves are numpy arrays).
    session_options : onnxruntime.SessionOptions
    """

    def __init__(self, scatters: dict, buffers, session_options: ort.SessionOptions):
        halves = {w: [buffers.half(w, p).reshape(-1) for p in (0, 1)] for w in scatters}
        elem_types = {w: helper.np_dtype_to_tensor_dtype(h[0].dtype) for w, h in halves.items()}
        model = scatter_model(scatters, {w: h[0].size for w, h in halves.items()}, elem_types)
        self.session = make_session(model, "cpu", session_options)
        self._views = halves  # the flat OrtValues below read these arrays
        self._cpu = ort.OrtDevice.make("cpu", 0)._get_c_device()
        first = len(buffers.bindings[0].get_outputs())
        self._outputs = []  # (step output index, this run's input name)
        for positions, updates in scatters.values():
            for name in (positions, updates):
                for binding in buffers.bindings:
                    binding.bind_output(name, "cpu")
                self._outputs.append((first + len(self._outputs), name))
        self.bindings = []
        for parity in (0, 1):
            binding = self.session.io_binding()
            for weight in scatters:
                value = ort.OrtValue.ortvalue_from_numpy(halves[weight][parity])
                binding.bind_ortvalue_input(weight, value)
                binding.bind_ortvalue_output(weight + ".scattered", value)
            self.bindings.append(binding)

    def run(self, step_binding, parity: int) -> None:
        """Scatter what the step run through ``step_binding`` (a pybind binding) output
        into the half ``parity`` (the one the step wrote, live once swapped)."""
        values = step_binding.get_outputs()
        binding = self.bindings[parity]._iobinding
        for index, name in self._outputs:
            binding.bind_ortvalue_input(name, values[index])
            # the next step allocates its own: a batch of another size has other lengths
            step_binding.bind_output(name, self._cpu)
        self.session._sess.run_with_iobinding(binding, None)

