"""Shared base of the full-batch smooth linear models trained with ortlearn's L-BFGS.

``OrtLogisticRegression``, ``OrtRidge``, the GLMs (``OrtPoissonRegressor``,
``OrtGammaRegressor``, ``OrtTweedieRegressor``) and ``OrtHuberRegressor``
minimise the objective of their scikit-learn counterpart with
:func:`ortlearn.training.minimize_lbfgs`: one onnxruntime call on a gradient
graph per evaluation, scipy's L-BFGS-B with the counterpart's options.

Every objective has the form::

    data_scale * sum_i w_i * row_loss_i + sum_k l2_k * ||coef[:, k]||^2

on ``raw = X @ coef + intercept`` (the intercept is never penalised); each
family gives its ``row_loss`` (a score of :mod:`ortlearn.loss`), its
``data_scale`` and ``l2``. The graph is float64: scipy works in float64, and
the counterparts reach their minimum to the precision that needs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted, validate_data

from ..exceptions import ConvergenceError
from ..graph import GraphBuilder, finalize_model
from ..graph.model import DEFAULT_OPSET
from ..training import minimize_lbfgs
from ._validation import check_sample_weight

__all__ = ["BaseOrtFullBatch", "linear_objective"]

COEF, INTERCEPT, LOSS = "coef", "intercept", "loss"
LABEL, SAMPLE_WEIGHT = "y", "sample_weight"


def linear_objective(n_features: int, n_outputs: int, row_loss, *, fit_intercept: bool,
                     data_scale: float, l2, int_label: bool = False,
                     extra_weights: dict | None = None) -> onnx.ModelProto:
    """The float64 objective graph of a linear model with a smooth loss.

    Parameters
    ----------
    n_features, n_outputs : int
        ``coef`` has shape ``(n_features, n_outputs)``, ``intercept``
        ``(n_outputs,)``.
    row_loss : callable
        ``row_loss(builder, raw, label) -> name``: the loss of each row, of
        shape ``(N, 1)`` or ``(N, k)`` (summed over its columns).
    fit_intercept : bool
        Give the graph an ``intercept`` initializer.
    data_scale : float
        Factor of the weighted sum of the row losses.
    l2 : float or array of shape (n_outputs,)
        Factor of the squared norm of each column of ``coef``.
    int_label : bool, default=False
        The label is int64 class indices ``(N,)`` (else float64 ``(N, n_outputs)``).
    extra_weights : dict of str to ndarray, default=None
        More float64 initializers (trained too) the row loss reads.

    Returns
    -------
    onnx.ModelProto
        Inputs ``X``, ``y``, ``sample_weight``; output ``loss``; initializers
        ``coef``, ``intercept`` (with ``fit_intercept``) and ``extra_weights``.
    """
    dtype = np.float64
    b = GraphBuilder(used_names=["X", LABEL, SAMPLE_WEIGHT, COEF, INTERCEPT, LOSS,
                                 *(extra_weights or {})], prefix="objective_")
    raw = b.op("MatMul", ["X", COEF])
    inits = [numpy_helper.from_array(np.zeros((n_features, n_outputs), dtype), COEF)]
    if fit_intercept:
        raw = b.op("Add", [raw, INTERCEPT])
        inits.append(numpy_helper.from_array(np.zeros(n_outputs, dtype), INTERCEPT))
    for name, value in (extra_weights or {}).items():
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
    rows = row_loss(b, raw, LABEL)
    # (N, k) row losses: the weights (N, 1) broadcast over the columns.
    weight = b.unsqueeze(SAMPLE_WEIGHT, [1])
    data = b.reduce("ReduceSum", b.op("Mul", [rows, weight]), keepdims=0)
    loss = b.op("Mul", [b.const(data_scale, dtype), data])
    l2 = np.broadcast_to(np.asarray(l2, dtype), (n_outputs,))
    if np.any(l2):
        squares = b.op("Mul", [COEF, COEF])
        penalty = b.reduce("ReduceSum", b.op("Mul", [squares, b.const(l2.copy(), dtype)]),
                           keepdims=0)
        loss = b.op("Add", [loss, penalty])
    b.op("Identity", [loss], outputs=[LOSS])
    label = (helper.make_tensor_value_info(LABEL, TensorProto.INT64, ["N"]) if int_label
             else helper.make_tensor_value_info(LABEL, TensorProto.DOUBLE, ["N", n_outputs]))
    graph = helper.make_graph(
        b.nodes, "objective",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", n_features]), label,
         helper.make_tensor_value_info(SAMPLE_WEIGHT, TensorProto.DOUBLE, ["N"])],
        [helper.make_tensor_value_info(LOSS, TensorProto.DOUBLE, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)])
    return finalize_model(model)


class BaseOrtFullBatch(BaseEstimator):
    """Fit of the full-batch linear models (not for direct use).

    Subclasses give ``_prepare(X, y, sample_weight) -> (y_enc, sample_weight,
    n_outputs)``, ``_graph(n_features, n_outputs, sw_sum) -> model``,
    ``_initial_weights(...)`` and ``_store(weights, n_iter)``; the options of
    scipy are ``_lbfgs_options()``.
    """

    _int_label = False

    def _validate(self, X, y):
        return validate_data(self, X, y, dtype=[np.float64, np.float32], y_numeric=True,
                             multi_output=getattr(self, "_multi_output", False))

    def _lbfgs_options(self) -> dict:
        return {"max_iter": self.max_iter, "tol": self.tol}

    def _bounds(self, n_features: int, n_outputs: int) -> dict | None:
        return None

    def _minimize(self, model, X, y_enc, sample_weight, initial: dict):
        trainable = [i.name for i in model.graph.initializer]
        weights, n_iter, loss = minimize_lbfgs(
            model, trainable, initial, [X, y_enc, sample_weight], ["X", LABEL, SAMPLE_WEIGHT],
            device=str(self.device), verbose=int(getattr(self, "verbose", 0)),
            loss_output=LOSS, bounds=self._bounds(X.shape[1], model.graph.initializer[0].dims[1]),
            **self._lbfgs_options())
        if not (np.isfinite(loss) and all(np.isfinite(w).all() for w in weights.values())):
            raise ConvergenceError(
                f"L-BFGS diverged: the loss is {loss} (or a weight is not finite). Scale the "
                "data or increase the regularisation.")
        self.loss_ = float(loss)
        self.train_losses_ = [self.loss_]
        return weights, n_iter

    def _prepare_fit(self, X, y, sample_weight):
        """X and y validated, X as float64 for the graph, weights (ones by default)."""
        X, y = self._validate(X, y)
        self._dtype = X.dtype
        sample_weight = check_sample_weight(sample_weight, X.shape[0], np.float64)
        if sample_weight is None:
            sample_weight = np.ones(X.shape[0], np.float64)
        return np.ascontiguousarray(X, dtype=np.float64), y, sample_weight

    def _decision(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32])
        return X @ np.asarray(self.coef_).T + self.intercept_

    def get_state(self) -> dict:
        """The trained weights, named as in the objective graph.

        Returns
        -------
        dict of str to ndarray
            ``coef`` of shape (n_features, n_outputs), ``intercept`` of shape
            (n_outputs,) (with ``fit_intercept``), ``scale`` (Huber). For
            ``OrtRidge`` with ``fit_intercept``, the weights of the centred
            problem (the intercept is computed from them).
        """
        check_is_fitted(self)
        return {k: np.array(v, copy=True) for k, v in self._weights.items()}

    #: ONNX operator of the inverse link applied to the linear predictor (None: identity)
    _inverse_link_op = None

    def to_onnx(self) -> onnx.ModelProto:
        """The trained inference model, in standard ONNX operators.

        Returns
        -------
        onnx.ModelProto
            Input ``X`` (the training data's float type). Regressors: output
            ``variable`` of shape (n_samples, n_outputs), the prediction.
            Classifiers: ``label``, ``probabilities`` (sigmoid or softmax) and
            ``raw_scores`` (the logits).
        """
        check_is_fitted(self)
        dtype = np.dtype(self._dtype)
        elem = helper.np_dtype_to_tensor_dtype(dtype)
        coef = np.asarray(self.coef_, dtype)
        coef = coef.reshape(1, -1) if coef.ndim == 1 else coef
        intercept = np.asarray(self.intercept_, dtype).reshape(-1)
        b = GraphBuilder(used_names=["X", COEF, INTERCEPT], prefix="inference_")
        raw = b.op("Add", [b.op("MatMul", ["X", COEF]), INTERCEPT])
        inits = [numpy_helper.from_array(np.ascontiguousarray(coef.T), COEF),
                 numpy_helper.from_array(intercept, INTERCEPT)]
        outputs = self._inference_outputs(b, raw, elem)
        graph = helper.make_graph(
            b.nodes, type(self).__name__,
            [helper.make_tensor_value_info("X", elem, ["N", coef.shape[1]])],
            [helper.make_tensor_value_info(name, kind, shape)
             for name, kind, shape in outputs], inits)
        model = helper.make_model(graph,
                                  opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)])
        return finalize_model(model)

    def _inference_outputs(self, b: GraphBuilder, raw: str, elem: int) -> list:
        """Regressors: ``variable`` (the inverse link of ``raw``)."""
        op = self._inverse_link_op
        b.op(op or "Identity", [raw], outputs=["variable"])
        return [("variable", elem, ["N", np.atleast_2d(self.coef_).shape[0]])]
