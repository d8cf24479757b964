"""What the fits of a process share: small maps of their last graphs and sessions.

A search fits the same model many times (cross-validation folds, grid points
that change no constant of the graph, a refit, clones): each fit would
convert the same estimator, build the same graphs and open the same
onnxruntime session. The floors above keep the last ones in :class:`LRUCache`
maps keyed by everything the graph depends on (:func:`model_digest` of a
graph less its weights' values), so that such a fit starts from them:
the converted graphs (``convert``), the compiled training steps and the
gradient sessions (``training/cache.py``, ``training/lbfgs.py``).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import onnx

__all__ = ["LRUCache", "model_digest"]


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

