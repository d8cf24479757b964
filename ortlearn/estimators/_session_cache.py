"""The runtime side of an estimator: its onnxruntime objects and its fit lock."""

from __future__ import annotations

import functools
import threading
import uuid
import weakref
from collections import OrderedDict

from ..training import make_session


class _SharedSessions:
    """Inference sessions of estimator copies, shared within this process (LRU).

    A copy of a fitted estimator (unpickled, deep-copied) carries the token
    of its weights; copies with one token predict through one session. Dask
    unpickles the estimator of ``ParallelPostFit`` or ``map_blocks`` once
    per task: without this each block would build its own session. Only
    copies enter it, so an estimator fitted in this process costs no more
    than its own session; the last :attr:`maxsize` sessions stay alive.
    """

    maxsize = 4

    def __init__(self):
        self._sessions: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.builds = 0
        self.hits = 0

    def get(self, key):
        with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                self._sessions.move_to_end(key)
                self.hits += 1
            return session

    def put(self, key, session) -> None:
        """Count a session built; keep it for the copies of ``key`` (None: not a copy)."""
        with self._lock:
            self.builds += 1
            if key is None:
                return
            self._sessions[key] = session
            while len(self._sessions) > self.maxsize:
                self._sessions.popitem(last=False)

    def info(self) -> dict:
        """``builds`` (inference sessions of estimators built in this process),
        ``hits`` (copies served by a shared one), ``size`` (shared sessions kept)."""
        with self._lock:
            return {"builds": self.builds, "hits": self.hits, "size": len(self._sessions)}


_SHARED = _SharedSessions()


def session_cache_info() -> dict:
    """Counts of the inference sessions built and shared in this process.

    Returns
    -------
    dict
        ``builds``: inference sessions the estimators built; ``hits``:
        predictions of a copy served by the session another copy of the same
        fitted weights built; ``size``: sessions kept for copies.
    """
    return _SHARED.info()


class _SessionCache:
    """onnxruntime objects of a fitted estimator: created in ``fit``, filled lazily.

    ``InferenceSession`` objects cannot be pickled or deep-copied, and
    scikit-learn forbids ``predict`` to add attributes to the estimator: the
    estimator holds this object from ``fit`` on, ``predict`` fills it, and
    a copy or an unpickled estimator starts with an empty one, which keeps
    only the token of the weights (:class:`_SharedSessions`). ``lock``
    makes threads calling ``predict`` at once create one inference session.
    """

    def __init__(self, token: str | None = None):
        self.engine = None
        self.session = None
        self.validation_session = None
        self.lock = threading.Lock()
        # names the weights this session predicts with, once a copy was made
        self.token = token

    def _copy_token(self) -> str:
        if self.token is None:
            self.token = uuid.uuid4().hex
        return self.token

    def __getstate__(self):
        return {"token": self._copy_token()}

    def __setstate__(self, state):
        self.__init__(state.get("token"))

    def __deepcopy__(self, memo):
        return _SessionCache(self._copy_token())

    def inference_session(self, make_model, device):
        """The prediction session, built once from ``make_model()`` (thread-safe)."""
        session = self.session
        if session is None:
            with self.lock:
                if self.session is None:
                    key = None if self.token is None else (self.token, str(device))
                    shared = None if key is None else _SHARED.get(key)
                    if shared is None:
                        shared = make_session(make_model(), device)
                        _SHARED.put(key, shared)
                    self.session = shared
                session = self.session
        return session

    def reset_predictions(self) -> None:
        """Forget the prediction session (the weights changed)."""
        self.session = None
        self.token = None


# One lock per estimator object, outside its __dict__: clone, pickle and deepcopy see no
# lock, and a copy (a new object) gets its own.
_FIT_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_FIT_LOCKS_GUARD = threading.Lock()


def serialized(method):
    """Run ``method`` under the estimator's fit lock.

    ``fit``, ``partial_fit`` and ``set_state`` of one estimator called from
    several threads run one after another, each complete: they share the
    estimator's engine, weights and curves, and interleaved steps would mix
    updates while the history claims every call ran. The lock is reentrant
    so that a subclass's ``fit`` may call its parent's.
    """
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with _FIT_LOCKS_GUARD:
            lock = _FIT_LOCKS.get(self)
            if lock is None:
                lock = _FIT_LOCKS[self] = threading.RLock()
        with lock:
            return method(self, *args, **kwargs)
    return locked
