"""The mini-batches of an epoch: :class:`Batches`, the one way the runtime and the estimators
slice rows."""

from __future__ import annotations

import numpy as np

__all__ = ["Batches"]


class Batches(tuple):
    """Row indices of the mini-batches of one epoch: views of ``order`` that tile it in order.

    The engine feeds ``order`` itself to the step graph (a plain list of index
    arrays is concatenated first). The views follow ``order``: shuffled in
    place, it gives the next epoch's batches without a new ``Batches``, and the
    engine, seeing the same ``sizes`` object, writes no new batch bounds.

    Parameters
    ----------
    order : numpy.ndarray of int64, shape (n_samples,)
        The rows in the order of the epoch.
    batch_size : int
        Rows per batch; the last batch holds the remainder.

    Attributes
    ----------
    order : numpy.ndarray
    sizes : numpy.ndarray of int64
        Rows of each batch (read-only).
    """

    def __new__(cls, order: np.ndarray, batch_size: int):
        self = super().__new__(cls, (order[start:start + batch_size]
                                     for start in range(0, len(order), batch_size)))
        self.order = order
        self.sizes = np.array([len(b) for b in self], dtype=np.int64)
        self.sizes.flags.writeable = False
        return self

    @classmethod
    def for_epoch(cls, n_samples: int, batch_size: int, rng=None) -> Batches:
        """The batches of one epoch of ``n_samples`` rows, in order or shuffled.

        Parameters
        ----------
        n_samples : int
            Number of rows.
        batch_size : int
            Rows per batch; the last batch holds the remainder.
        rng : numpy.random.RandomState or numpy.random.Generator, default=None
            Shuffles the rows (one ``permutation`` call per epoch); None keeps
            the order.

        Returns
        -------
        Batches
            One int64 index array per batch.

        Examples
        --------
        >>> [b.tolist() for b in Batches.for_epoch(5, 2)]
        [[0, 1], [2, 3], [4]]
        """
        if n_samples < 1:
            raise ValueError(f"Cannot make batches of {n_samples} samples.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        order = np.arange(n_samples) if rng is None else rng.permutation(n_samples)
        return cls(order.astype(np.int64, copy=False), batch_size)
