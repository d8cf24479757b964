"""Sparse X (scipy.sparse CSR/CSC), as scikit-learn's estimators take it.

The training graphs read the rows sparse, as padded column indices and values
(``ortlearn/training/sparse.py``): the products ``X @ W`` sum the non-zeros where
the dense graph sums every column, in another order, so the fit is the dense fit
to rounding. Rows too uneven to pad are densified one block of whole
mini-batches at a time: then the fit is the dense fit weight for weight.
"""

import os
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from counterparts import sparse_fit_peak
from sklearn.datasets import load_diabetes, load_digits

import ortlearn
import ortlearn.estimators._sgd as _sgd
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


def _as_if_sparse(cls, monkeypatch):
    """Dense fits of ``cls`` step the intercept as on sparse data: scikit-learn's SGD steps
    it 100 times shorter there (the other estimators have no such factor)."""
    if hasattr(cls, "_intercept_decay_of"):
        monkeypatch.setattr(cls, "_intercept_decay_of", staticmethod(
            lambda X: _sgd.SPARSE_INTERCEPT_DECAY))


#: Sums of at most 64 float64 products in another order differ by about 64 * 2**-53
#: = 7e-15 relative; a few dozen steps carry that into the weights: 1e-10 is far above
#: it and far below any difference of training.
GATHER_RTOL = 1e-10
#: OrtSGDClassifier's 'optimal' schedule starts at rates of about 3 on one-vs-all columns
#: whose log-loss saturates: each update of the first epochs multiplies a rounding
#: difference, measured up to 8e-7 relative after 4 epochs.
SGD_OPTIMAL_RTOL = 1e-5


def _same_weights(a, b, rtol=0.0):
    sa, sb = a.get_state(), b.get_state()
    assert sa.keys() == sb.keys()
    for name in sa:
        np.testing.assert_allclose(sa[name], sb[name], rtol=rtol, atol=rtol * 1e-2,
                                   err_msg=name)


@pytest.fixture(params=["gathers", "blocks"])
def sparse_path(request, monkeypatch):
    """How the graphs read sparse rows: padded gathers, or dense blocks (rows too uneven
    to pad); the tolerance of a sparse fit against the dense one on each path."""
    if request.param == "blocks":
        monkeypatch.setattr(sparse_module, "PADDING_RATIO", 0)
        return 0.0
    return GATHER_RTOL


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("cls, params, data", CASES, ids=IDS)
def test_sparse_fit_is_the_dense_fit(cls, params, data, fmt, sparse_path, monkeypatch):
    if sparse_path and cls is ortlearn.OrtSGDClassifier:
        sparse_path = SGD_OPTIMAL_RTOL
    X, y = data()
    Xs = sp.csr_matrix(X) if fmt == "csr" else sp.csc_matrix(X)
    sparse = _fit(cls, params, Xs, y)
    _as_if_sparse(cls, monkeypatch)
    dense = _fit(cls, params, X, y)
    _same_weights(dense, sparse, sparse_path)
    np.testing.assert_allclose(sparse.loss_curve_, dense.loss_curve_, rtol=1e-12 + sparse_path)
    # predictions are densified blocks on both paths: the same kernels as the dense model
    if sparse_path == 0.0:
        np.testing.assert_array_equal(sparse.predict(Xs), dense.predict(X))
        assert sparse.score(Xs, y) == dense.score(X, y)
    else:
        assert abs(sparse.score(Xs, y) - dense.score(X, y)) < 1e-9
    if hasattr(dense, "predict_proba"):
        np.testing.assert_allclose(sparse.predict_proba(Xs), dense.predict_proba(X),
                                   rtol=sparse_path, atol=sparse_path)


@pytest.mark.parametrize("cls, params, data", CASES, ids=IDS)
def test_sparse_partial_fit_is_the_dense_one(cls, params, data, sparse_path, monkeypatch):
    if sparse_path and cls is ortlearn.OrtSGDClassifier:
        sparse_path = SGD_OPTIMAL_RTOL
    X, y = data()
    extra = {"classes": np.unique(y)} if "Classifier" in cls.__name__ else {}
    sparse = cls(**params)
    for _ in range(2):
        sparse.partial_fit(sp.csr_matrix(X), y, **extra)
    _as_if_sparse(cls, monkeypatch)
    dense = cls(**params)
    for _ in range(2):
        dense.partial_fit(X, y, **extra)
    _same_weights(dense, sparse, sparse_path)


def test_partial_fit_moves_between_dense_and_sparse_rows():
    """Each call's data picks the graph; the weights and optimizer state go on."""
    X, y = _sparse_regression()
    params = dict(max_iter=4, random_state=0, solver="adam")
    mixed, dense = ortlearn.OrtLinearRegressor(**params), ortlearn.OrtLinearRegressor(**params)
    for data in (X, sp.csr_matrix(X), X):
        mixed.partial_fit(data, y)
        dense.partial_fit(X, y)
    _same_weights(dense, mixed, GATHER_RTOL)


def test_padded_rows_products_are_the_sparse_products():
    """The gathered products of a CSR with empty rows and duplicate entries are X @ W."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    X = sp.csr_matrix((np.array([1.0, 2.0, 5.0, -3.0]), np.array([1, 1, 0, 3]),
                       np.array([0, 2, 2, 4])), shape=(3, 4))
    W = np.arange(8.0).reshape(4, 2)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, ["N", 2])],
        [numpy_helper.from_array(W, "W")])
    model = sparse_module.rows_as_gathers(helper.make_model(graph), "X", ["W"])
    indices, values = sparse_module.padded_rows(X)
    assert indices.shape == values.shape == (3, 2) and X.nnz == 4  # X left as it was
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    got = session.run(None, {"X.indices": indices, "X.values": values})[0]
    np.testing.assert_array_equal(got, X @ W)
    with pytest.raises(ValueError, match="only the left factor"):
        sparse_module.rows_as_gathers(helper.make_model(graph), "X", [])
    skewed = sp.csr_matrix(np.vstack([np.ones((1, 100)), np.eye(100)[:40]]))
    assert sparse_module.paddable(X) and not sparse_module.paddable(skewed)


def test_sparse_many_blocks_weights_and_early_stopping(monkeypatch):
    # Blocks of a few batches each, sample weights and a validation split: still the dense fit.
    monkeypatch.setattr(sparse_module, "PADDING_RATIO", 0)
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


def _hashed_peaks(ours: str, theirs: str) -> list[dict]:
    """The peaks of an ortlearn fit and of its scikit-learn counterpart's (statements leaving
    the estimator in ``est``) on 300 rows of 2 million hashed features, 10 values a row, two
    classes, each in a fresh process."""
    runs = [sparse_fit_peak(fit, "np.arange(rows) % 2", shape=(300, 2_000_000, 10))
            for fit in (ours, theirs + "\nest.loss_ = 0.0")]
    assert np.isfinite(runs[0]["loss"])
    return runs


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
def test_linear_svc_on_hashed_features_takes_scikit_learns_memory():
    """300 rows of 2 million hashed features: the squared hinge's dual on the rows' Gram
    matrix holds the rows and one coefficient vector, as liblinear's; L-BFGS on the primal
    held its history of 2 million weights (959 MB, 10 s). Within 1.5x scikit-learn's peak
    (the minimum: test_sklearn_parity_nonsmooth.py)."""
    ours, theirs = _hashed_peaks("est = ortlearn.OrtLinearSVC().fit(X, y)",
                                 "from sklearn.svm import LinearSVC\n"
                                 "est = LinearSVC(tol=1e-8, max_iter=100_000).fit(X, y)")
    assert ours["peak"] <= 1.5 * theirs["peak"], (ours, theirs)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
def test_mlp_on_hashed_features_reads_its_rows_sparse():
    """300 rows of 2 million hashed features, 10 values a row: a dense batch of 200 rows
    would be 3.2 GB; the padded rows are 48 kB. What remains is the first layer (64 MB),
    Adam's two moments, and the step's gradient of it (scattered into zeros of its size)."""
    result = sparse_fit_peak(
        "est = ortlearn.OrtMLPClassifier(hidden_layer_sizes=(4,), max_iter=3,\n"
        "                                random_state=0).fit(X, y)",
        "np.arange(rows) % 2", shape=(300, 2_000_000, 10))
    assert np.isfinite(result["loss"])
    assert result["peak"] < 1.0 * 2**30, result


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
def test_sgd_classifier_on_hashed_features_takes_scikit_learns_memory():
    """300 rows of 2 million hashed features (16 MB of float64 weights), within 1.5x
    scikit-learn's peak. The weights stay out of the graphs (stubs); no conversion is
    imported (the scores are written from their formula); a step decays the weights in
    place and scatters the rows' updates in a second run, in place too
    (training/scattered.py): the weights' buffer and the copy a divergence restores. The
    rest of the difference is the imports of onnxruntime and onnx. 2.15 times
    scikit-learn's peak when the graphs held the weights and the step summed three tensors
    of their size, 1.66 with one intermediate and skl2onnx's import."""
    ours, theirs = _hashed_peaks("est = ortlearn.OrtSGDClassifier().fit(X, y)",
                                 "from sklearn.linear_model import SGDClassifier\n"
                                 "est = SGDClassifier().fit(X, y)")
    assert ours["peak"] <= 1.5 * theirs["peak"], (ours, theirs)
