"""onnxcustom's ``OrtDataLoader``: batches of consecutive observations, drawn at random."""

from __future__ import annotations

import numpy as np

from ..utils.onnxruntime_helper import get_ort_device, numpy_to_ort_value, ort_device_to_string

__all__ = ["OrtDataLoader"]


class OrtDataLoader:
    """Batches of ``batch_size`` consecutive observations, as numpy arrays or OrtValues.

    One pass yields ``ceil(n / batch_size)`` batches, all of ``batch_size``
    rows. With ``random_iter=True`` each batch starts at a row drawn
    uniformly in ``[0, n - batch_size)`` (onnxcustom's rule: rows may be seen
    twice or not at all in a pass); otherwise the batches follow each other,
    the last one ending on the last row. When ``batch_size >= n`` one batch
    holds everything.

    Parameters
    ----------
    X : numpy.ndarray
        Features, 2-D.
    y : numpy.ndarray
        Labels; a vector becomes a column.
    sample_weight : numpy.ndarray, optional
        One weight per row.
    batch_size : int, default=20
    device : str or OrtDevice, default='cpu'
        Where the OrtValues live.
    random_iter : bool, default=True
        Draw where each batch starts.
    random_state : int, numpy.random.RandomState or None, default=None
        Source of the draws; None uses numpy's global generator, as
        onnxcustom did (``numpy.random.seed`` makes a run repeatable).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.arange(10, dtype=np.float32).reshape(5, 2)
    >>> loader = OrtDataLoader(X, np.arange(5.0), batch_size=2, random_iter=False)
    >>> [x[:, 0].tolist() for x, y in loader.iter_numpy()]
    [[0.0, 2.0], [4.0, 6.0], [6.0, 8.0]]
    """

    def __init__(self, X, y, sample_weight=None, batch_size=20, device="cpu", random_iter=True,
                 random_state=None):
        y = np.asarray(y)
        if y.ndim == 1:
            y = y.reshape((-1, 1))
        if X.shape[0] != y.shape[0]:
            raise ValueError(f"X and y have different numbers of rows: X.shape={X.shape!r}, "
                             f"y.shape={y.shape!r}.")
        self.batch_size = batch_size
        self.device = get_ort_device(device)
        self.random_iter = random_iter
        self.random_state = random_state
        self.X_np = np.ascontiguousarray(X)
        self.y_np = np.ascontiguousarray(y).reshape((-1, 1)) if y.shape[1] == 1 else \
            np.ascontiguousarray(y)
        self.desc = [(self.X_np.shape, self.X_np.dtype), (self.y_np.shape, self.y_np.dtype)]
        if sample_weight is None:
            self.w_np = None
        else:
            sample_weight = np.asarray(sample_weight)
            if X.shape[0] != sample_weight.shape[0]:
                raise ValueError(f"X and sample_weight have different numbers of rows: "
                                 f"X.shape={X.shape!r}, sample_weight.shape="
                                 f"{sample_weight.shape!r}.")
            self.w_np = np.ascontiguousarray(sample_weight).reshape((-1,))
            self.desc.append((self.w_np.shape, self.w_np.dtype))
        self._to_device()

    def _to_device(self):
        self.X_ort = numpy_to_ort_value(self.X_np, self.device)
        self.y_ort = numpy_to_ort_value(self.y_np, self.device)
        self.w_ort = None if self.w_np is None else numpy_to_ort_value(self.w_np, self.device)
        if self.random_state is None or isinstance(self.random_state, np.random.RandomState):
            self._rng = self.random_state
        else:
            self._rng = np.random.RandomState(self.random_state)

    def __getstate__(self):
        state = {k: getattr(self, k) for k in ("X_np", "y_np", "w_np", "desc", "batch_size",
                                               "random_iter", "random_state")}
        state["device"] = ort_device_to_string(self.device)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.device = get_ort_device(self.device)
        self._to_device()

    def __repr__(self):
        return (f"{self.__class__.__name__}(..., ..., batch_size={self.batch_size!r}, "
                f"device={ort_device_to_string(self.device)!r})")

    def __len__(self):
        """The number of observations."""
        return self.desc[0][0][0]

    def _whole(self):
        """Whether one batch holds the whole data set."""
        return len(self) - self.batch_size <= 0 or self.batch_size <= 0

    def _starts(self):
        """Yield where each batch of one pass starts.

        Drawn batch by batch, as onnxcustom did, so that numpy's global
        generator advances the same way.
        """
        n, bs = len(self), self.batch_size
        i, seen = -1, 0
        while seen < n:
            if self.random_iter:
                i = (np.random if self._rng is None else self._rng).randint(0, n - bs)
            else:
                i = 0 if i == -1 else min(i + bs, n - bs)
            seen += bs
            yield i

    def _iter(self, convert):
        arrays = [a for a in (self.X_np, self.y_np, self.w_np) if a is not None]
        if self._whole():
            yield tuple(convert(a) for a in arrays)
            return
        for i in self._starts():
            yield tuple(convert(a[i:i + self.batch_size]) for a in arrays)

    def iter_numpy(self):
        """Yield ``(X, y)`` or ``(X, y, weight)`` batches as numpy arrays (views, CPU only)."""
        if ort_device_to_string(self.device) != "cpu":
            raise RuntimeError("iter_numpy() needs device='cpu'; use iter_ortvalue() on "
                               f"{ort_device_to_string(self.device)!r}.")
        return self._iter(lambda a: a)

    def iter_ortvalue(self):
        """Yield ``(X, y)`` or ``(X, y, weight)`` batches as OrtValues on the device."""
        if self._whole():
            return iter([self.data_ort])
        return self._iter(lambda a: numpy_to_ort_value(a, self.device))

    def iter_bind(self, bind, names):
        """Bind each batch to ``bind`` (an :class:`onnxruntime.IOBinding`) and yield its size.

        Parameters
        ----------
        bind : onnxruntime.IOBinding
        names : list of str
            Input names of the features, the labels, then (with weights) the
            weights; a last name (onnxcustom's learning rate) is not bound.
        """
        if len(names) not in (3, 4):
            raise ValueError("iter_bind expects three names (features, labels, learning rate) "
                             f"or four (features, labels, weights, learning rate), not {names!r}.")
        device = ort_device_to_string(self.device)
        kind, index = (device.split(":") + ["0"])[:2]
        values = [(names[0], self.X_ort, self.X_np), (names[1], self.y_ort, self.y_np)]
        if self.w_ort is not None:
            values.append((names[2], self.w_ort, self.w_np))

        def local_bind(offset, n):
            for name, value, array in values:
                row = int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize
                bind.bind_input(name, kind, int(index), array.dtype, [n, *array.shape[1:]],
                                value.data_ptr() + offset * row)

        if self._whole():
            local_bind(0, len(self))
            yield len(self)
            return
        for i in self._starts():
            local_bind(i, self.batch_size)
            yield self.batch_size

    @property
    def data_np(self):
        """The whole data set as numpy arrays."""
        return tuple(a for a in (self.X_np, self.y_np, self.w_np) if a is not None)

    @property
    def data_ort(self):
        """The whole data set as OrtValues."""
        return tuple(v for v in (self.X_ort, self.y_ort, self.w_ort) if v is not None)
