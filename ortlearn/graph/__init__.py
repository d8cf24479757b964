"""The ground floor: ONNX models, values and nodes, the node builder, shapes, rewrite passes.

- :class:`GraphBuilder`: appends nodes with unique names in the form the
  opset wants; what gradient rules, losses and optimizers receive.
- :mod:`~ortlearn.graph.model`: opsets, dtypes, loading, checking and
  finalising models.
- :mod:`~ortlearn.graph.values`: the type and shape of every value (onnx's shape
  inference, completed); :func:`refine_shapes`: static shapes where it gives up.
- :mod:`~ortlearn.graph.nodes`: node attributes and inputs, constant values,
  pruning and renaming, initializers as inputs.
- :mod:`~ortlearn.graph.labels`: class-label inputs, marked and guarded.
- :mod:`~ortlearn.graph.passes`: the rewrites that keep a graph's values and
  cost onnxruntime less, each a named pass.
- :mod:`~ortlearn.graph.format`: the names of the training artifacts.
- :mod:`~ortlearn.graph.prepare`: local functions inlined and constant Ifs
  folded before differentiation; the inputs that carry no gradient, and the
  initializers that are constants, not weights.

Nothing here imports another ortlearn package.
"""

from .batch_norm import set_inference_mode
from .builder import GraphBuilder
from .labels import (
    CLASS_LABEL_GUARD,
    CLASS_LABELS_KEY,
    class_label_marks,
    guard_class_labels,
    mark_class_labels,
)
from .model import (
    DEFAULT_ML_OPSET,
    DEFAULT_OPSET,
    FLOAT_TYPES,
    MIN_OPSET,
    TOLERATED_DEPRECATED_OPS,
    check_model,
    finalize_model,
    invalid_model_errors,
    is_weight_stub,
    load_model,
    make_model,
    np_dtype_to_onnx,
    onnx_to_np_dtype,
    opset_of,
    weight_stub,
)
from .nodes import (
    attr,
    constant_values,
    initializer_map,
    initializers_to_inputs,
    needed_nodes,
    node_reads,
    optional_input,
    prune_model,
    rename_value,
    weights_to_inputs,
)
from .prepare import (
    NON_DIFFERENTIABLE_INPUTS,
    TRAINABLE_TYPES,
    constant_initializers,
    get_train_initializer,
    graph_names,
    prepare_for_gradient,
    select_trainable,
)
from .shapes import refine_shapes
from .values import OUTPUT_LIKE_INPUT0, elem_type_of, shape_matches, shape_of, value_info_map

__all__ = [
    "CLASS_LABELS_KEY",
    "CLASS_LABEL_GUARD",
    "class_label_marks",
    "guard_class_labels",
    "mark_class_labels",
    "DEFAULT_ML_OPSET",
    "DEFAULT_OPSET",
    "FLOAT_TYPES",
    "MIN_OPSET",
    "NON_DIFFERENTIABLE_INPUTS",
    "OUTPUT_LIKE_INPUT0",
    "TOLERATED_DEPRECATED_OPS",
    "TRAINABLE_TYPES",
    "GraphBuilder",
    "attr",
    "check_model",
    "constant_initializers",
    "constant_values",
    "elem_type_of",
    "finalize_model",
    "get_train_initializer",
    "graph_names",
    "initializer_map",
    "initializers_to_inputs",
    "invalid_model_errors",
    "is_weight_stub",
    "load_model",
    "make_model",
    "needed_nodes",
    "node_reads",
    "np_dtype_to_onnx",
    "onnx_to_np_dtype",
    "opset_of",
    "prepare_for_gradient",
    "optional_input",
    "prune_model",
    "refine_shapes",
    "rename_value",
    "select_trainable",
    "set_inference_mode",
    "shape_matches",
    "shape_of",
    "value_info_map",
    "weight_stub",
    "weights_to_inputs",
]
