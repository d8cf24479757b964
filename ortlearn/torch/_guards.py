"""What an export assumed about the module, and whether it still holds: :class:`Guard`.

An exported graph is a snapshot: the submodules forward called, their train
or eval modes, their hooks, and the Python values forward read (a float
scale, a flag, a tensor attribute that is not a parameter or a buffer) are
baked into it. ``torch.compile`` guards on these; ORTModule does the same
with :class:`Guard`: taken when a call is exported, checked at every call,
and a call whose module no longer matches is exported again.

The values forward reads are found by running it once in torch with the
attribute reads of every submodule recorded (:func:`recording_reads`); what
forward reads of other objects (a config object, a global) is not seen. The
same run records where forward branches on a tensor's value
(:func:`recording_branches`): a trace (the TorchScript exporter) would keep
the branch of that one call for every later one.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref

import torch

__all__ = ["Guard", "recording_branches", "recording_reads"]

_SCALARS = (bool, int, float, str, type(None))
_MISSING = object()


def _snapshot(value):
    """What is compared at the next calls; ``_MISSING`` for a value not guarded."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        return ("tensor", id(value), value._version)  # in-place changes bump _version
    if isinstance(value, (tuple, list)) and all(isinstance(v, _SCALARS) for v in value):
        return (type(value).__name__, tuple(value))
    return _MISSING


def _walk(module: torch.nn.Module) -> list:
    """The submodules in ``named_modules(remove_duplicate=False)``'s order (a shared one
    each time it is met), read from the ``_modules`` dictionaries directly."""
    subs, stack = [], [module]
    while stack:
        sub = stack.pop()
        subs.append(sub)
        stack.extend(child for child in reversed(sub._modules.values()) if child is not None)
    return subs


def _signature(sub: torch.nn.Module) -> tuple:
    """What an export may depend on in ``sub`` itself: its mode, its hooks, its parameter
    and buffer names, its children (by ``id``, in order)."""
    return (sub.training, len(sub._forward_hooks), len(sub._forward_pre_hooks),
            tuple(sub._parameters), tuple(sub._buffers), tuple(map(id, sub._modules.values())))


class Guard:
    """The state of ``module`` an export depends on.

    Parameters
    ----------
    module : torch.nn.Module
    reads : iterable of (torch.nn.Module, str)
        The attributes forward read (:func:`recording_reads`).
    """

    # Submodules are held by weak references: one replaced since must not stay alive
    # with its weights.
    def __init__(self, module: torch.nn.Module, reads=()):
        self._expected = [(weakref.ref(sub), *_signature(sub)) for sub in _walk(module)]
        self._names = [name for name, _ in module.named_modules(remove_duplicate=False)]
        names = {id(sub): name for name, sub in module.named_modules()}
        self._reads = []
        for sub, attr in reads:
            snapshot = _snapshot(sub.__dict__.get(attr, _MISSING))
            if snapshot is not _MISSING:
                self._reads.append((weakref.ref(sub), attr, names.get(id(sub), "?"), snapshot))

    def holds(self, module: torch.nn.Module) -> bool:
        """Whether ``module`` is as it was when the guard was taken (what
        :meth:`difference` checks, in the fewest steps: it runs at every call)."""
        for ref, attr, _, snapshot in self._reads:
            sub = ref()
            if sub is None or _snapshot(sub.__dict__.get(attr, _MISSING)) != snapshot:
                return False
        # From the root down, each submodule is alive and has the same children (alive
        # objects have distinct ids): the walk of the module is the one recorded.
        for ref, training, hooks, pre_hooks, parameters, buffers, children in self._expected:
            sub = ref()
            if (sub is None or sub.training != training or len(sub._forward_hooks) != hooks
                    or len(sub._forward_pre_hooks) != pre_hooks
                    or tuple(sub._parameters) != parameters or tuple(sub._buffers) != buffers
                    or tuple(map(id, sub._modules.values())) != children):
                return False
        return self._expected[0][0]() is module

    def difference(self, module: torch.nn.Module) -> str | None:
        """What changed, in words (None: nothing)."""
        for ref, attr, where, snapshot in self._reads:
            sub = ref()
            if sub is None:
                return f"the submodule {where!r} was replaced"
            if _snapshot(sub.__dict__.get(attr, _MISSING)) != snapshot:
                return f"the attribute {attr!r} of {where or 'the module'!r} forward reads"
        if self._expected[0][0]() is not module:
            return "the module was replaced"
        for name, (ref, *recorded) in zip(self._names, self._expected):
            where = repr(name) if name else "the module"
            sub = ref()
            if sub is None:  # another object, with the id the recorded one had
                return f"the submodule {where} was replaced"
            current = _signature(sub)
            if current[0] != recorded[0]:
                return f"the train/eval mode of {where}"
            if current[1:3] != tuple(recorded[1:3]):
                return f"the forward hooks of {where}"
            if current[3:5] != tuple(recorded[3:5]):
                return f"the parameters or buffers of {where}"
            if current[5] != recorded[5]:
                keys = list(sub._modules)
                moved = next(i for i, (a, b) in enumerate(
                    zip([*current[5], None], [*recorded[5], None])) if a != b)
                if moved >= len(keys):
                    return f"a submodule of {where} was removed"
                child = f"{name}.{keys[moved]}" if name else keys[moved]
                return f"the submodule {child!r} was replaced, added or moved"
        return None


_RECORDING: dict = {}  # original class -> its recording subclass
_LOCAL = threading.local()


def _recording_class(cls: type) -> type:
    recording = _RECORDING.get(cls)
    if recording is None:
        def __getattribute__(self, name):
            reads = getattr(_LOCAL, "reads", None)
            if reads is not None and name in object.__getattribute__(self, "__dict__"):
                reads.add((self, name))
            return cls.__getattribute__(self, name)

        recording = _RECORDING[cls] = type(cls.__name__, (cls,),
                                           {"__getattribute__": __getattribute__,
                                            "__module__": cls.__module__})
    return recording


_TORCH_DIR = os.path.dirname(torch.__file__)
_TENSOR_BOOL = torch.Tensor.__bool__


def _recording_bool(self):
    branches = getattr(_LOCAL, "branches", None)
    if branches is not None:
        # the first frame outside torch: where the branch is written
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
            frame = frame.f_back
        if frame is not None:
            branches.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")
    return _TENSOR_BOOL(self)


@contextlib.contextmanager
def recording_branches():
    """Within it, the places where this thread's code takes the truth value of a tensor
    (``if tensor:``, ``while``, ``and``, ``assert`` on a tensor's value) are appended to
    the list it yields, as ``file:line``.

    In eager mode a size is a Python int, so these are branches on the data.
    """
    branches: list = []
    with _PATCH_LOCK:
        if _PATCHED[0] == 0:
            torch.Tensor.__bool__ = _recording_bool
        _PATCHED[0] += 1
    _LOCAL.branches = branches
    try:
        yield branches
    finally:
        _LOCAL.branches = None
        with _PATCH_LOCK:
            _PATCHED[0] -= 1
            if _PATCHED[0] == 0:
                torch.Tensor.__bool__ = _TENSOR_BOOL


_PATCH_LOCK = threading.Lock()
_PATCHED = [0]  # recording_branches blocks open in the process


@contextlib.contextmanager
def recording_reads(module: torch.nn.Module):
    """Within it, the instance attributes read of ``module``'s submodules are added to the
    set it yields, as ``(submodule, name)``.

    Each submodule's class is swapped for a subclass that records its reads,
    then given back; a submodule whose class cannot be swapped (TorchScript)
    is not recorded.
    """
    reads: set = set()
    swapped = []
    for sub in module.modules():
        cls = type(sub)
        if isinstance(sub, torch.jit.ScriptModule) or cls in _RECORDING.values():
            continue
        try:
            sub.__class__ = _recording_class(cls)
        except TypeError:
            continue
        swapped.append((sub, cls))
    _LOCAL.reads = reads
    try:
        yield reads
    finally:
        _LOCAL.reads = None
        for sub, cls in swapped:
            sub.__class__ = cls
