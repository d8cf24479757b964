"""Training in a web browser: a page that trains ortlearn's artifacts with onnxruntime-web.

The page (``js/web/``), the JavaScript ``TrainingSession`` it drives (``js/src/``, the npm
package ``ortlearn-training``) and onnxruntime-web (``js/node_modules/``, installed by
``cd js && npm ci``) live in the repository's ``js/`` folder. :func:`write_page` copies them
beside a directory of training artifacts, with the data the page trains on
(``data.safetensors``) and what it needs to know of the task (``task.json``); any static file
server then serves the result (``python -m http.server -d DIR``). The estimators' ``export_web``
writes the artifacts and calls it (``doc/edge_training.rst``).

Nothing here imports another ortlearn module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .fileio import atomic_write

__all__ = ["JS_DIR_ENV", "ORT_WEB_FILES", "find_js_dir", "write_page"]

#: Environment variable naming the ``js/`` folder (default: the one of this checkout).
JS_DIR_ENV = "ORTLEARN_JS_DIR"

#: onnxruntime-web's files the page loads: the ES modules and binaries of the WebAssembly
#: build and of the WebGPU build (loaded where the browser has a WebGPU adapter and the
#: models hold no float64 value: that build has no float64 kernel).
ORT_WEB_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm",
                 "ort.webgpu.min.mjs", "ort-wasm-simd-threaded.asyncify.mjs",
                 "ort-wasm-simd-threaded.asyncify.wasm")

_PAGE_FILES = ("index.html", "app.js")


def _ort_dist(js_dir: Path) -> Path:
    return js_dir / "node_modules" / "onnxruntime-web" / "dist"


def find_js_dir(js_dir=None) -> Path:
    """The ``js/`` folder to copy the page from, checked.

    Parameters
    ----------
    js_dir : str or path, default=None
        None: the environment variable ``ORTLEARN_JS_DIR``, else the ``js/`` folder of the
        checkout ortlearn was installed from.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    ValueError
        If the folder lacks the page, the library or onnxruntime-web's files (the message
        says which, and to run ``npm ci`` there).
    """
    if js_dir is None:
        js_dir = os.environ.get(JS_DIR_ENV) or Path(__file__).resolve().parents[1] / "js"
    js_dir = Path(js_dir)
    needed = ([js_dir / "src" / "index.js"] + [js_dir / "web" / f for f in _PAGE_FILES]
              + [_ort_dist(js_dir) / f for f in ORT_WEB_FILES])
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(
            f"The browser page needs ortlearn's js/ folder with its npm dependencies: "
            f"{missing[0]} is missing{more}. Run `npm ci` in {js_dir}, or name another js/ "
            f"folder with js_dir= or {JS_DIR_ENV}.")
    return js_dir


def _copy(source: Path, target: Path) -> None:
    atomic_write(str(target), source.read_bytes(), what=f"the page's {target.name}")


def write_page(directory, data: Mapping[str, np.ndarray], task: Mapping, js_dir=None) -> Path:
    """Write the training page beside the artifacts of ``directory``.

    Parameters
    ----------
    directory : str or path
        A directory holding ``checkpoint``, ``training_model.onnx``, ``eval_model.onnx`` and
        an ``optimizer_model.onnx`` of the tensor layout (onnxruntime's JavaScript API feeds
        no tensor sequences).
    data : dict of str to ndarray
        ``X_train``, ``y_train`` and optionally ``X_test``, ``y_test``, as the training
        model's inputs read them.
    task : dict
        What the page shows and how it trains: JSON-serialisable (see ``js/web/app.js``).
    js_dir : str or path, default=None
        See :func:`find_js_dir`.

    Returns
    -------
    pathlib.Path
        The page, ``directory/index.html``.

    Raises
    ------
    ValueError
        If ``data`` lacks ``X_train`` or ``y_train``, or :func:`find_js_dir` fails.
    """
    from safetensors.numpy import save

    missing = [k for k in ("X_train", "y_train") if k not in data]
    if missing:
        raise ValueError(f"The page needs the training data: {missing} missing from data.")
    js_dir = find_js_dir(js_dir)
    directory = Path(directory)
    for sub in ("lib", "ort"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    for name in _PAGE_FILES:
        _copy(js_dir / "web" / name, directory / name)
    for source in sorted((js_dir / "src").glob("*.js")):
        _copy(source, directory / "lib" / source.name)
    for name in ORT_WEB_FILES:
        _copy(_ort_dist(js_dir) / name, directory / "ort" / name)
    arrays = {k: np.ascontiguousarray(v) for k, v in data.items()}
    atomic_write(str(directory / "data.safetensors"), save(arrays), what="the page's data")
    atomic_write(str(directory / "task.json"), json.dumps(dict(task), indent=1).encode(),
                 what="the page's task")
    return directory / "index.html"
