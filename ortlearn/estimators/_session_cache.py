"""The cache of a fitted estimator's onnxruntime objects."""

from __future__ import annotations

import threading

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
