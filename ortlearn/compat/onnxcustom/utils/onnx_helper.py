"""onnxcustom's graph helpers (``onnxcustom.utils.onnx_helper``), on ortlearn's graph floor."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ....graph import load_model, opset_of, rename_value
from ..training._functions import to_numpy

__all__ = [
    "add_initializer",
    "dtype_to_var_type",
    "get_onnx_opset",
    "onnx_rename_weights",
    "proto_type_to_dtype",
    "replace_initializers_into_onnx",
]


def onnx_rename_weights(onx):
    """Rename the initializers so that their names sort in the graph's order; in place.

    The i-th initializer ``name`` becomes ``I<i>_name``, ``i`` zero-padded to
    the number of digits of the count (``I0_coef``, or ``I00_coef`` ...
    ``I11_bias`` for 12 initializers), as onnxcustom named them. Subgraphs are
    not visited.

    Parameters
    ----------
    onx : onnx.ModelProto

    Returns
    -------
    onnx.ModelProto
        ``onx`` itself.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import helper, numpy_helper, TensorProto
    >>> graph = helper.make_graph(
    ...     [helper.make_node("Add", ["X", "b"], ["Y"])], "g",
    ...     [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 1])],
    ...     [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])],
    ...     [numpy_helper.from_array(np.ones(1, np.float32), "b")])
    >>> onx = onnx_rename_weights(helper.make_model(graph))
    >>> [i.name for i in onx.graph.initializer], list(onx.graph.node[0].input)
    (['I0_b'], ['X', 'I0_b'])
    """
    names = [init.name for init in onx.graph.initializer]
    if not names:
        return onx
    width = max(1, int(math.log(len(names)) / math.log(10) + 1))
    for i, init in enumerate(onx.graph.initializer):
        new = f"I{i:0{width}d}_{init.name}"
        rename_value(onx, init.name, new)
        init.name = new
    return onx


def get_onnx_opset(onx, domain=""):
    """The opset version ``onx`` imports for ``domain``; ValueError when it imports none."""
    version = opset_of(onx, domain)
    if version is None:
        raise ValueError(f"Unable to find opset for domain={domain!r}.")
    return version


def proto_type_to_dtype(proto_type):
    """numpy dtype of an ONNX float type (``TensorProto.FLOAT`` or ``'tensor(float)'``...).

    Examples
    --------
    >>> proto_type_to_dtype(TensorProto.DOUBLE)
    <class 'numpy.float64'>
    """
    types = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64,
             "tensor(float)": np.float32, "tensor(double)": np.float64}
    if proto_type not in types:
        raise ValueError(f"Unexpected value proto_type={proto_type!r}: expected float or double.")
    return types[proto_type]


def dtype_to_var_type(dtype):
    """skl2onnx's tensor type for a numpy dtype (float32, float64, int64, int32)."""
    from skl2onnx.common.data_types import (
        DoubleTensorType,
        FloatTensorType,
        Int32TensorType,
        Int64TensorType,
    )

    types = {np.dtype(np.float32): FloatTensorType, np.dtype(np.float64): DoubleTensorType,
             np.dtype(np.int64): Int64TensorType, np.dtype(np.int32): Int32TensorType}
    if np.dtype(dtype) not in types:
        raise ValueError(f"Unexpected value dtype={dtype!r}: expected float32, float64, "
                         "int64 or int32.")
    return types[np.dtype(dtype)]


def add_initializer(model, name, value):
    """A copy of ``model`` with one more initializer ``name`` holding ``value``."""
    if any(i.name == name for i in model.graph.initializer):
        raise ValueError(f"Name {name!r} is already an initializer of the model.")
    new = load_model(model)
    new.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name=name))
    return new


def replace_initializers_into_onnx(model, results):
    """A copy of ``model`` whose initializers named in ``results`` hold its values.

    Parameters
    ----------
    model : onnx.ModelProto
    results : dict
        ``{initializer name: numpy array or OrtValue}``.
    """
    new = load_model(model)
    index = {init.name: i for i, init in enumerate(new.graph.initializer)}
    for name, value in results.items():
        if name not in index:
            raise ValueError(f"Unable to find initializer {name!r} among {list(index)}.")
        tensor = (value if isinstance(value, onnx.TensorProto)
                  else numpy_helper.from_array(np.asarray(to_numpy(value)), name))
        new.graph.initializer[index[name]].CopyFrom(tensor)
    return new
