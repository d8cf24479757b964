"""Public names of a package imported when first used (PEP 562's module ``__getattr__``).

ortlearn's packages re-export the names of their modules; importing them all
at ``import ortlearn.estimators`` would import skl2onnx, the training engine
and most of scikit-learn for a fit that needs none of them (a full-batch
estimator's first fit: its solver, onnx and onnxruntime).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from importlib import import_module

__all__ = ["lazy_exports"]


def lazy_exports(package: str, names: Mapping[str, str],
                 submodules: Iterable[str] = ()) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` of ``package`` whose ``names`` come from other modules.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    names : mapping of str to str
        Public name -> the module defining it (absolute, or relative to ``package``:
        ``'.engine'``).
    submodules : iterable of str, default=()
        Submodules reached as attributes (``ortlearn.training``) without an import.

    Returns
    -------
    tuple of callables
        The package's module-level ``__getattr__`` and ``__dir__``.

    Examples
    --------
    >>> getattr_, dir_ = lazy_exports("ortlearn", {"ConvergenceError": "ortlearn.exceptions"})
    >>> getattr_("ConvergenceError").__name__
    'ConvergenceError'
    """
    submodules = frozenset(submodules)

    def __getattr__(name: str):
        if name in submodules:
            return import_module(f"{package}.{name}")
        if name in names:
            return getattr(import_module(names[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(names) | submodules)

    return __getattr__, __dir__
