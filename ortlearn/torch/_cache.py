"""Exports kept on disk across processes and instances (``ORTMODULE_CACHE_DIR``).

onnxruntime-training's ``ORTModule`` reuses an export saved in the folder
named by ``ORTMODULE_CACHE_DIR``, keyed by the module's ``repr`` alone. The
key here also holds what an export depends on besides the module's
structure: the code of the ``forward`` of every module class in it and the
values it closes over (a changed ``forward`` is a new key), the names,
shapes and dtypes of its parameters and buffers, the call's tensors (shape,
dtype, whether they require a gradient) and schema, each submodule's
train/eval mode, the exporter, whether the dimensions are symbolic, and the
versions of torch, onnx and ortlearn. A file is written whole under a
temporary name, then renamed: readers never see half of one. Code that
``forward`` calls outside the module classes' ``forward`` (a helper
function, another method) is not in the key: delete the folder after
changing it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tempfile
import warnings
from collections.abc import Sequence

import onnx
import torch

from .. import __version__
from ._export import Exported, TreeSpec

__all__ = ["CACHE_DIR_ENV", "cache_dir", "cache_key", "load_export", "store_export"]

#: onnxruntime-training's variable: the folder where exports are kept and found.
CACHE_DIR_ENV = "ORTMODULE_CACHE_DIR"
_METADATA_KEY = "ortlearn.export"


def cache_dir() -> str | None:
    """The folder of ``ORTMODULE_CACHE_DIR``, or None when it is unset or empty."""
    return os.environ.get(CACHE_DIR_ENV) or None


def _code(code) -> list:
    """A code object's bytecode, names and constants (nested functions' code included), without
    the addresses its ``repr`` shows."""
    return [code.co_code.hex(), list(code.co_names),
            [_code(c) if inspect.iscode(c) else repr(c) for c in code.co_consts]]


def _forward(cls: type) -> list:
    """What ``cls.forward`` computes: its code and the values of the variables it closes over
    (a factor given to the function that made the class)."""
    function = getattr(cls.forward, "__func__", cls.forward)
    if not inspect.isfunction(function):
        return [f"{cls.__module__}.{cls.__qualname__}.forward"]
    cells = [repr(c.cell_contents) for c in function.__closure__ or ()]
    return [f"{cls.__module__}.{cls.__qualname__}", _code(function.__code__), cells]


def cache_key(module: torch.nn.Module, tensors: Sequence[torch.Tensor], call_spec: TreeSpec,
              exporter: str, dynamic: bool = True) -> str:
    """A hex digest of everything the export of this call depends on (see the module)."""
    classes = {type(m) for m in module.modules()}
    parts = {
        "module": repr(module),
        "forwards": sorted((_forward(c) for c in classes), key=repr),
        "state": [(k, list(v.shape), str(v.dtype), bool(v.requires_grad))
                  for k, v in module.state_dict(keep_vars=True).items()],
        "modes": [m.training for m in module.modules()],
        "call": [(list(t.shape), str(t.dtype), bool(t.requires_grad)) for t in tensors],
        "schema": repr(call_spec),
        "exporter": exporter,
        "dynamic": dynamic,
        "versions": [torch.__version__, onnx.__version__, __version__],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _path(folder: str, key: str) -> str:
    return os.path.join(folder, f"{key}.onnx")


def load_export(folder: str, key: str) -> Exported | None:
    """The export kept under ``key``, or None (none kept, or a file ortlearn did not write)."""
    path = _path(folder, key)
    if not os.path.isfile(path):
        return None
    try:
        model = onnx.load(path)
        props = {p.key: p.value for p in model.metadata_props}
        info = json.loads(props[_METADATA_KEY])
        return Exported(model, list(info["inputs"]), list(info["weights"]), info["exporter"])
    except Exception as exc:  # noqa: BLE001 - a damaged file means: export again
        warnings.warn(f"ORTModule could not read the cached export {path} ({exc}); it exports "
                      "the module again.", RuntimeWarning, stacklevel=3)
        return None


def store_export(folder: str, key: str, exported: Exported) -> None:
    """Keep ``exported`` under ``key`` in ``folder`` (created if needed); a failure to write
    is a warning, not a reason to stop training in onnxruntime."""
    model = onnx.ModelProto()
    model.CopyFrom(exported.model)
    kept = [p for p in model.metadata_props if p.key != _METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=_METADATA_KEY, value=json.dumps(
        {"inputs": exported.inputs, "weights": exported.weights, "exporter": exported.exporter}))
    path = _path(folder, key)
    try:
        os.makedirs(folder, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(model.SerializeToString())
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        warnings.warn(f"ORTModule could not keep its export in {folder} ({exc}); it trains "
                      "in onnxruntime without it.", RuntimeWarning, stacklevel=3)
