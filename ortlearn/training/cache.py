"""The compiled training problems the fits of a process share (``TrainingEngine``).

A session runs concurrent calls safely; each fit keeps its own buffers. The map
itself is :class:`ortlearn.graph.cache.LRUCache`.
"""

from __future__ import annotations

from ..graph.cache import LRUCache

__all__ = ["COMPILED_MAX_WEIGHT_BYTES", "COMPILED_STEPS"]


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
