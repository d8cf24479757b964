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

A sparse ``X`` (CSR or CSC) is never densified: ``minimize_lbfgs`` feeds the
graph ``X @ coef`` from scipy and adds ``X^T @ d`` to ``coef``'s gradient;
centring (``OrtRidge``, ``OrtElasticNet``) is ``(X - x_offset) @ coef`` in
the graph.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.preprocessing import LabelEncoder
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ..graph import GraphBuilder, finalize_model
from ..graph.model import DEFAULT_OPSET
from ..training.lbfgs import minimize_lbfgs
from ..training.sparse import is_sparse
from ._callbacks import CallbackSupportMixin, fit_task, iteration_hook
from ._objective import (
    COEF,
    DATA_SCALE,
    INTERCEPT,
    L2,
    LABEL,
    LOSS,
    SAMPLE_WEIGHT,
)
from ._validation import check_sample_weight

__all__ = ["BaseOrtFullBatch", "FullBatchClassifierMixin", "center_data"]


def weighted_mean(A, sample_weight):
    """The column means of ``A`` under the weights; equal weights take the plain mean
    (the same value, without ``np.average``'s weighted copy of ``A``)."""
    uniform = sample_weight.size and np.all(sample_weight == sample_weight[0])
    return A.mean(axis=0) if uniform else np.average(A, axis=0, weights=sample_weight)


def center_data(X, sample_weight):
    """``(x_mean, X, x_offset)``: the weighted column means and the centred data.

    Dense ``X`` comes back centred (``x_offset`` None); a sparse one as it
    is, with ``x_offset = x_mean`` for :func:`linear_objective` (centring
    would densify it).
    """
    if is_sparse(X):
        x_mean = np.asarray(X.T @ sample_weight).ravel() / sample_weight.sum()
        return x_mean, X, x_mean
    x_mean = weighted_mean(X, sample_weight)
    return x_mean, X - x_mean, None


class BaseOrtFullBatch(CallbackSupportMixin, BaseEstimator):
    """Fit of the full-batch linear models (not for direct use).

    :meth:`fit` validates the parameters, calls ``_check_params()`` (a
    ``ValueError`` for a counterpart value ortlearn cannot honour, before the
    data is read), validates the data and hands it to
    ``_fit_validated(X, y, sample_weight)``, which each subclass gives; the
    options of scipy are ``_lbfgs_options()``, its bounds ``_bounds()``.

    scikit-learn's callbacks (``set_callbacks``, scikit-learn >= 1.9) see the
    fit as one task with a subtask ``'iteration'`` per iteration of the
    solver, reported when the iteration ends; its ``fitted_estimator``
    predicts with that iteration's weights (``attributes(weights)`` of the
    family: the fitted attributes its weights give), and a callback
    returning True stops the fit there.
    """

    _int_label = False

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the model on the whole data set.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Target values (class labels for a classifier).
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples (ones by default).

        Returns
        -------
        self : object
            The fitted estimator.
        """
        return self._fit(X, y, sample_weight)

    def _fit(self, X, y, sample_weight):
        """The fit on the whole data set, the parameters validated."""
        self._check_params()
        X, y, sample_weight = self._prepare_fit(X, y, sample_weight)
        with fit_task(self, X, y, sample_weight):
            return self._fit_validated(X, y, sample_weight)

    def _check_params(self) -> None:
        """Raise a ``ValueError`` for a parameter value ortlearn cannot honour."""

    def _accepts_sparse(self) -> bool:
        """Whether fit takes a sparse X with these parameters."""
        return True

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = self._accepts_sparse()
        return tags

    def _fit_validated(self, X, y, sample_weight):
        """Fit on validated data: X float64, sample_weight float64 (ones by default)."""
        raise NotImplementedError

    def predict(self, X):
        """Predict with the linear model.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_targets)
            ``X @ coef_.T + intercept_``; two dimensions for a
            two-dimensional ``y`` at fit only.
        """
        return self._decision(X)

    #: scipy.sparse formats fit takes as they are (others are converted to CSR)
    _ACCEPT_SPARSE = ("csr", "csc")

    def _validate(self, X, y):
        return validate_data(self, X, y, dtype=[np.float64, np.float32], y_numeric=True,
                             multi_output=getattr(self, "_multi_output", False),
                             accept_sparse=self._ACCEPT_SPARSE)

    def _lbfgs_options(self) -> dict:
        return {"max_iter": self.max_iter, "tol": self.tol}

    def _bounds(self, n_features: int, n_outputs: int) -> dict | None:
        return None

    def _minimize(self, model, X, y_enc, sample_weight, initial: dict, attributes=None):
        """L-BFGS on ``model``; ``attributes(weights)``: the fitted attributes, for callbacks."""
        trainable = [i.name for i in model.graph.initializer if i.name not in (DATA_SCALE, L2)]
        result = minimize_lbfgs(
            model, trainable, initial, [X, y_enc, sample_weight], ["X", LABEL, SAMPLE_WEIGHT],
            device=str(self.device), verbose=int(getattr(self, "verbose", 0)),
            loss_output=LOSS, bounds=self._bounds(X.shape[1], model.graph.initializer[0].dims[1]),
            callback=iteration_hook(self, attributes), **self._lbfgs_options())
        self.loss_ = float(result.loss)
        self.train_losses_ = [self.loss_]
        return result.weights, result.n_iter

    def _prepare_fit(self, X, y, sample_weight):
        """X and y validated, X as float64 for the graph, weights (ones by default)."""
        X, y = self._validate(X, y)
        self._dtype = X.dtype
        sample_weight = check_sample_weight(sample_weight, X.shape[0], np.float64)
        if sample_weight is None:
            sample_weight = np.ones(X.shape[0], np.float64)
        if is_sparse(X):
            # Stays sparse: the graph gets X @ coef, computed by scipy (training/lbfgs.py).
            return X.astype(np.float64, copy=False).tocsr(), y, sample_weight
        return np.ascontiguousarray(X, dtype=np.float64), y, sample_weight

    def _decision(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32],
                          accept_sparse=self._ACCEPT_SPARSE)
        return np.asarray(X @ np.asarray(self.coef_).T) + self.intercept_

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


class FullBatchClassifierMixin(ClassifierMixin):
    """Labels of the full-batch linear classifiers (not for direct use).

    One score per class, or one for two classes (positive: ``classes_[1]``),
    as :class:`sklearn.linear_model.LogisticRegression` and
    :class:`sklearn.svm.LinearSVC`.
    """

    def _validate(self, X, y):
        return validate_data(self, X, y, dtype=[np.float64, np.float32],
                             accept_sparse=self._ACCEPT_SPARSE)

    def _encode_labels(self, y):
        """``classes_`` and the index of each row's class in it."""
        check_classification_targets(y)
        y = np.asarray(y)
        if y.dtype.kind in "biuf":
            # LabelEncoder's classes and codes, without its input checks (made just above)
            classes, codes = np.unique(y, return_inverse=True)
            codes = codes.reshape(-1)
        else:  # labels of Python objects: LabelEncoder's ordering and its mixed-type error
            encoder = LabelEncoder().fit(y)
            classes, codes = encoder.classes_, encoder.transform(y)
        if len(classes) < 2:
            raise ValueError("This solver needs samples of at least 2 classes in the data, "
                             f"but the data contains only one class: {classes[0]!r}")
        return classes, codes

    def _label_output(self, b: GraphBuilder, raw: str) -> tuple:
        """The ``label`` output (one of ``classes_``) of the inference graph."""
        if len(self.classes_) == 2:
            index = b.cast(b.op("Greater", [raw, b.const(0.0, np.dtype(self._dtype))]),
                           TensorProto.INT64)
            index = b.op("Reshape", [index, b.ints([-1], hint="shape")])
        else:
            index = b.op("ArgMax", [raw], axis=1, keepdims=0)
        classes = self.classes_
        if classes.dtype.kind in "OUS":
            classes, label_elem = classes.astype(str).astype(object), TensorProto.STRING
        else:
            classes, label_elem = classes.astype(np.int64), TensorProto.INT64
        b.op("Gather", [b.const(classes, hint="classes"), index], outputs=["label"], axis=0)
        return "label", label_elem, ["N"]

    def decision_function(self, X):
        """Scores of the linear model (logits, or signed distances for an SVM).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_classes)
            ``X @ coef_.T + intercept_``: one column per class, or one score
            (that of ``classes_[1]``) for two classes.
        """
        scores = self._decision(X)
        return scores.ravel() if scores.shape[1] == 1 else scores

    def predict(self, X):
        """Predict class labels.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples,)
            The class of the largest score (two classes: ``classes_[1]``
            where the score is positive).
        """
        scores = self.decision_function(X)
        index = (scores > 0).astype(np.intp) if scores.ndim == 1 else scores.argmax(axis=1)
        return self.classes_[index]
