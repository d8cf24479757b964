"""The runtime side of an estimator: its onnxruntime objects and its fit lock."""

from __future__ import annotations

import functools
import threading
import weakref

from ..training import make_session


class _SessionCache:
    """onnxruntime objects of a fitted estimator: created in ``fit``, filled lazily.

    ``InferenceSession`` objects cannot be pickled or deep-copied, and
    scikit-learn forbids ``predict`` to add attributes to the estimator: the
    estimator holds this object from ``fit`` on, ``predict`` fills it, and
    a copy or an unpickled estimator starts with an empty one. ``lock``
    makes threads calling ``predict`` at once create one inference session.
    """

    def __init__(self):
        self.engine = None
        self.session = None
        self.validation_session = None
        self.lock = threading.Lock()

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def __deepcopy__(self, memo):
        return _SessionCache()

    def inference_session(self, make_model, device):
        """The prediction session, built once from ``make_model()`` (thread-safe)."""
        session = self.session
        if session is None:
            with self.lock:
                if self.session is None:
                    self.session = make_session(make_model(), device)
                session = self.session
        return session

    def reset_predictions(self) -> None:
        """Forget the prediction session (the weights changed)."""
        self.session = None


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
