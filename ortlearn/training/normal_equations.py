"""Penalized least squares by its normal equations: :func:`solve_normal_equations`.

scikit-learn's ``Ridge(solver='cholesky')``, its default for dense data:
with sample weights ``w`` and one L2 strength ``alpha_k`` per target,

    (X^T W X + alpha_k I) coef_k = X^T W y_k

onnxruntime computes the Gram matrix ``X^T W X`` and the right-hand side
``X^T W Y`` in one call (one pass over the data, on the training device: the
work that grows with the rows), and scipy's Cholesky solves the
``(n_features, n_features)`` systems on the host, as scikit-learn does after
its own products. A system Cholesky finds singular or ill-conditioned (no
penalty, collinear columns) is solved by least squares instead: the
minimum-norm solution (where scikit-learn's Cholesky, and its SVD, return
coefficients of the size of the inverse of the rounding error).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import scipy.linalg
from onnx import TensorProto, helper

from ..graph import DEFAULT_OPSET, GraphBuilder, finalize_model
from ..graph.cache import LRUCache
from .device import make_session, parse_device
from .result import CONVERGED, SolverResult

__all__ = ["GRAM_MAX_FEATURES", "gram_model", "solve_normal_equations", "weighted_products"]

#: Most features of a Gram matrix worth forming (32 MB of float64): beyond, an
#: iterative solver that never holds it is the better choice.
GRAM_MAX_FEATURES = 2048

#: One session per device and weighting: the graph has symbolic shapes, every fit reuses it.
_SESSIONS = LRUCache(8)


def gram_model(weighted: bool = True) -> onnx.ModelProto:
    """The graph of ``X^T W X``, ``X^T W Y`` and ``1^T W (Y * Y)`` (float64, any shapes).

    Inputs ``X`` (N, F), ``Y`` (N, K), and ``sample_weight`` (N,) when
    ``weighted``; outputs ``gram`` (F, F), ``rhs`` (F, K) and ``yy`` (1, K),
    what the objective's value at a solution needs. The products read ``X``
    transposed in place (``Gemm``'s ``transA``); without weights ``X`` is read
    as it is, with them once scaled.
    """
    names = ["X", "Y", "gram", "rhs", "yy"] + (["sample_weight"] if weighted else [])
    b = GraphBuilder(used_names=names, prefix="gram_")
    if weighted:
        left = b.op("Mul", ["X", b.unsqueeze("sample_weight", [1])])
        b.op("MatMul", [b.unsqueeze("sample_weight", [0]), b.op("Mul", ["Y", "Y"])],
             outputs=["yy"])
    else:
        left = "X"
        b.op("ReduceSumSquare", ["Y", b.ints([0], hint="rows")], outputs=["yy"], keepdims=1)
    b.op("Gemm", [left, "X"], outputs=["gram"], transA=1)
    b.op("Gemm", [left, "Y"], outputs=["rhs"], transA=1)
    f64 = TensorProto.DOUBLE
    inputs = [helper.make_tensor_value_info("X", f64, ["N", "F"]),
              helper.make_tensor_value_info("Y", f64, ["N", "K"])]
    if weighted:
        inputs.append(helper.make_tensor_value_info("sample_weight", f64, ["N"]))
    graph = helper.make_graph(
        b.nodes, "normal_equations", inputs,
        [helper.make_tensor_value_info("gram", f64, ["F", "F"]),
         helper.make_tensor_value_info("rhs", f64, ["F", "K"]),
         helper.make_tensor_value_info("yy", f64, [1, "K"])])
    return finalize_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)]))


def _session(device, weighted: bool):
    key = (str(device), weighted)
    session = _SESSIONS.get(key)
    if session is None:
        session = make_session(gram_model(weighted), device)
        _SESSIONS.put(key, session)
    return session


def _solve(gram: np.ndarray, rhs: np.ndarray, alpha: float) -> np.ndarray:
    """``(gram + alpha I)^-1 rhs``; the minimum-norm least-squares solution where the
    system is singular or ill-conditioned (scipy's ``LinAlgWarning``)."""
    system = gram + alpha * np.eye(len(gram))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", scipy.linalg.LinAlgWarning)
            return scipy.linalg.solve(system, rhs, assume_a="pos")
    except (np.linalg.LinAlgError, scipy.linalg.LinAlgError, scipy.linalg.LinAlgWarning):
        # singular values below the rounding of the largest are the null space's
        cond = np.finfo(np.float64).eps * len(system)
        return scipy.linalg.lstsq(system, rhs, cond=cond)[0]


def weighted_products(X, Y, sample_weight, *, device="cpu") -> tuple:
    """``(X^T W X, X^T W Y, y^T W y)``: what a squared loss needs of the data, one pass.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    Y : ndarray of shape (n_samples, n_targets)
    sample_weight : ndarray of shape (n_samples,)
    device : str, default='cpu'
        Where onnxruntime forms them.

    Returns
    -------
    tuple of ndarray
        Shapes (n_features, n_features), (n_features, n_targets) and
        (n_targets,), float64.

    Examples
    --------
    >>> X = np.array([[1.0, 0.0], [0.0, 2.0]])
    >>> gram, rhs, yy = weighted_products(X, np.array([[1.0], [1.0]]), np.ones(2))
    >>> gram.tolist(), rhs.ravel().tolist(), yy.tolist()
    ([[1.0, 0.0], [0.0, 4.0]], [1.0, 2.0], [2.0])
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    Y = np.ascontiguousarray(Y, dtype=np.float64).reshape(len(X), -1)
    sample_weight = np.ascontiguousarray(sample_weight, np.float64)
    feeds = {"X": X, "Y": Y}
    weighted = not np.all(sample_weight == 1.0)  # scaling X by ones would copy it for nothing
    if weighted:
        feeds["sample_weight"] = sample_weight
    gram, rhs, yy = _session(parse_device(device), weighted).run(None, feeds)
    return gram, rhs, yy[0]


def solve_normal_equations(X, Y, sample_weight, alpha, *, device="cpu") -> SolverResult:
    """Minimise ``1/2 sum_i w_i ||y_i - x_i coef||^2 + 1/2 sum_k alpha_k ||coef_k||^2``.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
        Dense float64 data (centred by the caller for an intercept).
    Y : ndarray of shape (n_samples, n_targets)
    sample_weight : ndarray of shape (n_samples,)
    alpha : float or ndarray of shape (n_targets,)
        L2 strength of each target (>= 0).
    device : str, default='cpu'
        Where onnxruntime forms the products.

    Returns
    -------
    SolverResult
        ``weights``: ``{'coef': (n_features, n_targets)}``; ``n_iter`` 1 (one
        pass over the data); ``loss`` the objective at the solution.

    Examples
    --------
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> result = solve_normal_equations(X, X @ [[2.0], [-1.0]], np.ones(3), 0.0)
    >>> np.round(result.weights["coef"].ravel(), 6)
    array([ 2., -1.])
    """
    gram, rhs, yy = weighted_products(X, Y, sample_weight, device=device)
    n_targets = rhs.shape[1]
    alpha = np.broadcast_to(np.asarray(alpha, dtype=np.float64).ravel(), (n_targets,))
    if np.all(alpha == alpha[0]):
        coef = _solve(gram, rhs, float(alpha[0]))
    else:  # one system per strength, as scikit-learn
        coef = np.column_stack([_solve(gram, rhs[:, [k]], float(a))[:, 0]
                                for k, a in enumerate(alpha)])
    # sum_i w_i ||y_i - x_i coef||^2 from the products, without another pass over X
    data = yy.sum() - 2 * np.sum(coef * rhs) + np.sum(coef * (gram @ coef))
    loss = 0.5 * (max(float(data), 0.0) + float(alpha @ np.square(coef).sum(axis=0)))
    return SolverResult({"coef": coef}, 1, loss, True, CONVERGED)
