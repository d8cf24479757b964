"""The base of onnxcustom's learning-rate, loss and penalty objects."""

from __future__ import annotations

import inspect


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
