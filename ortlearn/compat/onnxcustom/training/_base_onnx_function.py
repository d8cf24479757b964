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


#: A value whose repr is longer is shortened in :func:`constructor_repr` (a model's bytes).
REPR_MAX_CHARS = 50


def constructor_repr(obj, values: dict | None = None) -> str:
    """``Class(name=value, ...)`` with every constructor parameter ``obj`` holds, in the
    signature's order, defaults included: onnxcustom's repr, which its scripts and tests
    compare (scikit-learn's prints the changed ones, sorted). A value whose repr is
    longer than :data:`REPR_MAX_CHARS` characters, or spans lines, is shortened to its
    first ten characters, but for the learning objects (rates, losses, penalties), printed
    whole. ``values`` overrides what is printed for some names.
    """
    params = inspect.signature(type(obj).__init__).parameters.values()
    args = []
    for p in params:
        if p.name == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        if values and p.name in values:
            text = repr(values[p.name])
        elif p.name in obj.__dict__:
            text = repr(obj.__dict__[p.name])
        else:
            continue
        learning = isinstance(obj.__dict__.get(p.name), BaseLearningOnnx)
        if not learning and (len(text) > REPR_MAX_CHARS or "\n" in text):
            text = repr(text[:10].replace("\n", " ") + "...")
        args.append(f"{p.name}={text}")
    return f"{type(obj).__name__}({', '.join(args)})"


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
        return constructor_repr(self) + self.__repr_extended__()
