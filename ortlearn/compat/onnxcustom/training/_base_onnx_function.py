"""The base of onnxcustom's learning-rate, loss and penalty objects."""

from __future__ import annotations

import inspect
import os
import warnings

#: onnxcustom's abbreviations in the names of saved graphs.
_SHORT_NAMES = {"Learning": "L", "OrtGradient": "Grad", "ForwardBackward": "FB"}


def save_onnx_graphs(owner, attributes, folder, prefix=None, suffix=None):
    """Save the ONNX graphs among ``attributes`` (a dict) of ``owner``, recursively.

    ``folder`` is a directory, or ``bytes`` to get the serialized graphs;
    returns ``{attribute: file name, bytes or a nested dict}``. Files are
    named ``<prefix><class name><suffix>.<attribute>.onnx`` as onnxcustom
    named them.
    """
    prefix, suffix = prefix or "", suffix or ""
    if isinstance(folder, str) and not os.path.exists(folder):
        raise FileNotFoundError(f"Folder {folder!r} does not exist.")
    cls_name = owner.__name__ if isinstance(owner, type) else owner.__class__.__name__
    saved = {}
    for k, v in attributes.items():
        if hasattr(v, "SerializeToString"):
            if not isinstance(folder, str):
                saved[k] = v.SerializeToString()
                continue
            name = f"{prefix}{cls_name}{suffix}.{k}.onnx"
            for long, short in _SHORT_NAMES.items():
                name = name.replace(long, short)
            filename = os.path.join(folder, name)
            if os.path.exists(filename):
                warnings.warn(f"Filename {filename!r} already exists.", stacklevel=3)
            with open(filename, "wb") as f:
                f.write(v.SerializeToString())
            saved[k] = filename
        elif hasattr(v, "save_onnx_graph"):
            saved[k] = v.save_onnx_graph(folder, prefix=prefix, suffix=f"{suffix}.{k}")
    return saved


class BaseLearningOnnx:
    """An object computing its part of a training step with small ONNX functions.

    Subclasses build their functions in :meth:`build_onnx_function` (one
    onnxruntime session each, on the training device). Sessions are not
    pickled: an unpickled object builds them again when first used.
    """

    @classmethod
    def _get_param_names(cls):
        params = inspect.signature(cls.__init__).parameters.values()
        return [(p.name, p.default) for p in params
                if p.name != "self" and p.kind != p.VAR_KEYWORD]

    def build_onnx_function(self, opset, device, *args):
        """Build the functions this object runs (``opset``: the trained model's)."""
        raise NotImplementedError("This method must be overwritten.")

    def save_onnx_graph(self, folder, prefix=None, suffix=None):
        """Save the ONNX graphs this object runs in ``folder`` (``bytes``: return them)."""
        return save_onnx_graphs(self, self.__dict__, folder, prefix, suffix)

    def __getstate__(self):
        # Sessions cannot be pickled; fitted values (ending with '_') that are
        # plain Python numbers are kept.
        return {k: v for k, v in self.__dict__.items()
                if not k.endswith("_") or isinstance(v, (int, float, str, type(None)))}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr_extended__(self):
        return ""

    def __repr__(self):
        args = []
        for name, default in self._get_param_names():
            if name in self.__dict__:
                value = getattr(self, name)
                if default is inspect.Parameter.empty or value != default:
                    args.append(f"{name}={value!r}")
        return f"{self.__class__.__name__}({', '.join(args)}){self.__repr_extended__()}"
