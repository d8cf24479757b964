"""Where a call's tensors are found: the module's weights by name (:class:`WeightTable`),
and what a call found, for the next calls like it (:class:`CallMemo`).

A call of a small model spends about as long in ORTModule's Python as in its
sessions: finding its graphs (the call's schema, the exports' shapes and
guards, which inputs need a gradient) and reading the weights through
``nn.Module.__getattr__``. A later call with the same key (the call's
schema, train or eval mode, grad mode, and each tensor's dtype, shape,
device and ``requires_grad``) reuses what the first found, after checking
what can change without changing the key: the export's guard, the weights'
device and their ``requires_grad``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ._graphs import Graphs, numpy_view
from ._guards import Guard

__all__ = ["Call", "CallMemo", "WeightTable", "call_key"]


class WeightTable:
    """The parameters and buffers of a module by ``state_dict`` name, read at each call
    (``.to()`` and attribute assignments replace tensors; the owning modules stay)."""

    def __init__(self, module: torch.nn.Module):
        self._module = module
        self._owners: dict = {}

    def __contains__(self, name: str) -> bool:
        if name not in self._owners:
            self._owners = self._find(self._module)
        return name in self._owners

    def first(self) -> torch.Tensor | None:
        """The first parameter (or buffer): where the module lives."""
        if not self._owners:
            self._owners = self._find(self._module)
        for owner in self._owners.values():
            return getattr(*owner)
        return None

    def refresh(self) -> None:
        """Find the owners again (a submodule was replaced or added)."""
        self._owners = {}

    def tensors(self, names) -> list:
        try:
            return [getattr(*self._owners[n]) for n in names]
        except (KeyError, AttributeError):
            self._owners = self._find(self._module)
            return [getattr(*self._owners[n]) for n in names]

    def places(self, names) -> tuple:
        """Where each of ``names`` is held: ``(its owner's _parameters or _buffers dict,
        its name there)``, read without ``nn.Module.__getattr__``."""
        self.tensors(names)  # the owners, found again if needed
        places = []
        for name in names:
            owner, attr = self._owners[name]
            places.append((owner._parameters if attr in owner._parameters else owner._buffers,
                           attr))
        return tuple(places)

    @staticmethod
    def _find(module: torch.nn.Module) -> dict:
        owners = {}
        for prefix, sub in module.named_modules(remove_duplicate=False):
            for name, _ in [*sub.named_parameters(recurse=False),
                            *sub.named_buffers(recurse=False)]:
                owners[f"{prefix}.{name}" if prefix else name] = (sub, name)
        return owners


def call_key(module: torch.nn.Module, tensors, call_spec) -> tuple:
    """What decides a call's graphs apart from the module's state (a key of
    :class:`CallMemo`)."""
    return (call_spec, module.training, torch.is_grad_enabled(),
            *[(t.dtype, t.shape, t.device, t.requires_grad) for t in tensors])


@dataclass
class Call:
    """The graphs a call ran, the guard of their export and where their weights are."""

    graphs: Graphs
    guard: Guard
    places: tuple  # WeightTable.places of the graphs' weights
    device: torch.device | None  # the first weight's
    requires_grad: list  # each weight's
    #: (data pointer, shape, strides, numpy view) of each weight on the CPU, made again
    #: for a weight whose memory changed (``param.data = ...``)
    views: list = field(default_factory=list)

    def feeds(self, tensors, weights) -> list | None:
        """What the forward session reads: the call's tensors and numpy views of the
        weights, kept from call to call (None off the CPU)."""
        if self.device is None or self.device.type != "cpu":
            return None
        views = self.views  # replaced, never cleared, by another thread's forget_views
        if len(views) != len(weights):
            views = self.views = [None] * len(weights)
        feeds = list(tensors)
        for i, w in enumerate(weights):
            view = views[i]
            if view is None or view[0] != w.data_ptr() or view[1] != w.shape \
                    or view[2] != w.stride():
                # the view keeps the memory it reads alive: no other tensor gets its address
                view = views[i] = (w.data_ptr(), w.shape, w.stride(), numpy_view(w))
            feeds.append(view[3])
        return feeds

    def weights(self, module: torch.nn.Module) -> list | None:
        """The weight tensors of a call of ``module`` with this call's key, or None when
        this call's graphs may not serve it (the module changed, a weight moved to
        another device or was frozen or unfrozen)."""
        if not self.guard.holds(module):
            return None
        weights = [held[name] for held, name in self.places]
        if weights and weights[0].device != self.device:
            return None
        if [w.requires_grad for w in weights] != self.requires_grad:
            return None
        return weights


class CallMemo:
    """The :class:`Call` of the last calls by :func:`call_key` (at most ``size``: a
    module called with ever new shapes keeps only the latest)."""

    def __init__(self, size: int = 16):
        self._size = size
        self._calls: dict = {}

    def get(self, key) -> Call | None:
        try:
            return self._calls.get(key)
        except TypeError:  # a constant argument that cannot be hashed (a list)
            return None

    def remember(self, key, call: Call) -> None:
        try:
            hash(key)
        except TypeError:
            return
        if len(self._calls) >= self._size and key not in self._calls:
            # the oldest; another thread may be dropping it too
            for old in list(self._calls)[:len(self._calls) - self._size + 1]:
                self._calls.pop(old, None)
        self._calls[key] = call

    def clear(self) -> None:
        self._calls.clear()

    def forget_views(self) -> None:
        """Drop the weights' views: each holds the memory it reads, which a weight moved
        or cast since (``.to()``) no longer uses."""
        for call in list(self._calls.values()):
            call.views = []
