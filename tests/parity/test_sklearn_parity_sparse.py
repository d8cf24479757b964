"""Sparse X (scipy.sparse CSR/CSC), as scikit-learn's estimators take it.

A sparse X is densified one block of whole mini-batches at a time
(``ortlearn/training/sparse.py``): the fit is the dense fit of the same
data, weight for weight, and the memory is the non-zeros plus one block.
"""

import os
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from counterparts import sparse_fit_peak
from sklearn.datasets import load_diabetes, load_digits

import ortlearn
import ortlearn.training.sparse as sparse_module
from ortlearn.training.sparse import DenseRows


def _sparse_digits():
    X, y = load_digits(return_X_y=True)
    return X[:600] / 16.0, y[:600]


def _sparse_regression():
    X, y = load_diabetes(return_X_y=True)
    X = np.hstack([X, np.zeros((len(X), 20))])  # mostly zero columns
    X[np.abs(X) < 0.03] = 0.0
    return X, (y - y.mean()) / y.std()


CASES = [
    (ortlearn.OrtLinearRegressor, dict(max_iter=4, random_state=0), _sparse_regression),
    (ortlearn.OrtMLPRegressor, dict(hidden_layer_sizes=(8,), max_iter=4, random_state=0),
     _sparse_regression),
    (ortlearn.OrtLinearClassifier, dict(max_iter=4, random_state=0), _sparse_digits),
    (ortlearn.OrtMLPClassifier, dict(hidden_layer_sizes=(8,), max_iter=4, random_state=0),
     _sparse_digits),
    # scikit-learn's per-sample updates (batch_size=1) read the same rows
    (ortlearn.OrtSGDRegressor, dict(max_iter=4, random_state=0, tol=None), _sparse_regression),
    (ortlearn.OrtSGDClassifier, dict(loss="log_loss", max_iter=4, random_state=0, tol=None),
     _sparse_digits),
]
IDS = [c[0].__name__ for c in CASES]


def _fit(cls, params, X, y, **fit_params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**params).fit(X, y, **fit_params)


def _same_weights(a, b):
    sa, sb = a.get_state(), b.get_state()
    assert sa.keys() == sb.keys()
    for name in sa:
        np.testing.assert_array_equal(sa[name], sb[name], err_msg=name)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("cls, params, data", CASES, ids=IDS)
def test_sparse_fit_is_the_dense_fit(cls, params, data, fmt):
    X, y = data()
    Xs = sp.csr_matrix(X) if fmt == "csr" else sp.csc_matrix(X)
    dense, sparse = _fit(cls, params, X, y), _fit(cls, params, Xs, y)
    _same_weights(dense, sparse)
    np.testing.assert_allclose(sparse.loss_curve_, dense.loss_curve_, rtol=1e-12)
    np.testing.assert_array_equal(sparse.predict(Xs), dense.predict(X))
    assert sparse.score(Xs, y) == dense.score(X, y)
    if hasattr(dense, "predict_proba"):
        np.testing.assert_array_equal(sparse.predict_proba(Xs), dense.predict_proba(X))


@pytest.mark.parametrize("cls, params, data", CASES, ids=IDS)
def test_sparse_partial_fit_is_the_dense_one(cls, params, data):
    X, y = data()
    extra = {"classes": np.unique(y)} if "Classifier" in cls.__name__ else {}
    dense, sparse = cls(**params), cls(**params)
    for _ in range(2):
        dense.partial_fit(X, y, **extra)
        sparse.partial_fit(sp.csr_matrix(X), y, **extra)
    _same_weights(dense, sparse)


def test_sparse_many_blocks_weights_and_early_stopping(monkeypatch):
    # Blocks of a few batches each, sample weights and a validation split: still the dense fit.
    monkeypatch.setattr(sparse_module, "BLOCK_BYTES", 3 * 16 * 30 * 8)
    X, y = _sparse_regression()
    w = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    params = dict(max_iter=3, batch_size=16, early_stopping=True, random_state=0)
    dense = _fit(ortlearn.OrtLinearRegressor, params, X, y, sample_weight=w)
    sparse = _fit(ortlearn.OrtLinearRegressor, params, sp.csr_matrix(X), y, sample_weight=w)
    _same_weights(dense, sparse)
    # the sparse fit scores its validation rows in blocks, the dense one in one product:
    # float64 sums of 30 terms in other orders (30 * 2**-53 = 3.3e-15 relative)
    assert sparse.validation_scores_ == pytest.approx(dense.validation_scores_, rel=1e-12)
    monkeypatch.setattr(sparse_module, "BLOCK_BYTES", 7 * 30 * 8)  # predictions: 7 rows a block
    # the dense model on the same blocks: the same kernels on the same shapes, the same bits
    blocks = np.concatenate([dense.predict(X[i:i + 7]) for i in range(0, X.shape[0], 7)])
    np.testing.assert_array_equal(sparse.predict(sp.csr_matrix(X)), blocks)


def test_sparse_lbfgs_fits_as_dense():
    # L-BFGS multiplies the sparse X itself (training/lbfgs.py; more in
    # tests/parity/test_sklearn_parity_fullbatch_sparse.py)
    X, y = _sparse_regression()
    dense = ortlearn.OrtLinearRegressor(solver="lbfgs").fit(X, y)
    sparse = ortlearn.OrtLinearRegressor(solver="lbfgs").fit(sp.csr_matrix(X), y)
    np.testing.assert_allclose(sparse.loss_, dense.loss_, rtol=1e-12)


def test_dense_rows_sums_duplicates_and_clears():
    # A non-canonical CSR (duplicate entries) densifies as toarray() does.
    X = sp.csr_matrix((np.array([1.0, 2.0, 5.0]), np.array([1, 1, 0]), np.array([0, 2, 3])),
                      shape=(2, 3))
    assert not X.has_canonical_format
    dense = DenseRows(X, 2)
    np.testing.assert_array_equal(dense.fill(np.array([0, 1])), X.toarray())
    np.testing.assert_array_equal(dense.fill(np.array([1])), X.toarray()[[1]])
    assert X.nnz == 3  # the user's matrix is left as it was


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
def test_sparse_fit_memory_is_proportional_to_the_non_zeros():
    # one epoch of 100 batches (a batch of 1 000 rows is 200 MB dense)
    result = sparse_fit_peak(
        "est = ortlearn.OrtLinearRegressor(max_iter=1, tol=None, batch_size=1000,\n"
        "                                  random_state=0).fit(X, y)\n"
        "est.predict(X[:5000])",
        "rng.standard_normal(rows).astype(np.float32)", dtype="np.float32")
    assert np.isfinite(result["loss"])
    # dense: 20 GB; CSR: 40 MB; one dense block: BLOCK_BYTES
    assert result["peak"] < 1.5 * 2**30, result
