"""What the fits of a process share: the compiled training problems of the last graphs.

A search fits the same model many times (cross-validation folds, grid points
that change no constant of the graph, a refit, clones): each fit would
build the same graphs and open the same onnxruntime session. The runtime
keeps the last ones in small :class:`LRUCache` maps keyed by everything the
graph and the session depend on, so that such a fit starts from them.
A session runs concurrent calls safely; each fit keeps its own buffers.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import onnx

__all__ = ["COMPILED_MAX_WEIGHT_BYTES", "COMPILED_STEPS", "LRUCache", "model_digest"]


class LRUCache:
    """A thread-safe map of at most ``size`` entries that forgets the least recently used.

    Parameters
    ----------
    size : int
        Entries kept.

    Examples
    --------
    >>> cache = LRUCache(2)
    >>> cache.put("a", 1); cache.put("b", 2); cache.get("a")
    1
    >>> cache.put("c", 3)  # "b" was used least recently
    >>> cache.get("b") is None, len(cache)
    (True, 2)
    """

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        """The value of ``key`` (now the most recently used), None when absent."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        """Keep ``value`` under ``key``, forgetting the oldest entries beyond ``size``."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every entry (their sessions go once no fit holds them)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def model_digest(model: onnx.ModelProto) -> str:
    """A digest of everything in ``model``: equal for graphs that compute the same way.

    Examples
    --------
    >>> from onnx import helper
    >>> model = helper.make_model(helper.make_graph([], "g", [], []))
    >>> len(model_digest(model))
    64
    """
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


#: The step and epoch graphs of the training engine with their layouts and
#: onnxruntime sessions, for the last fits of other structures: a fold of a
#: cross-validation, a grid point that changes no constant of the graph, a
#: refit start from them (``TrainingEngine``). Each entry holds a session and
#: its arena (the intermediates of one batch).
COMPILED_STEPS = LRUCache(8)

#: Only models of at most this many bytes of weights share their compiled step: a
#: larger model's epochs outlast its setup, and its session (arena, threads) should
#: go with its fit rather than stay in the process.
COMPILED_MAX_WEIGHT_BYTES = 1 << 20
