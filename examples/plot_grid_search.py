"""
Hyper-parameter search in a Pipeline
====================================

ortlearn's estimators are scikit-learn estimators: they clone, take ``set_params`` and go into
a :class:`~sklearn.pipeline.Pipeline` and a :class:`~sklearn.model_selection.GridSearchCV` like
any other. This example searches the regularisation strength ``C`` of a standardised
:class:`~ortlearn.estimators.OrtLogisticRegression` by 5-fold cross-validation on the breast
cancer data set, runs the same search with scikit-learn's
:class:`~sklearn.linear_model.LogisticRegression`, and plots the cross-validated accuracy of
both against ``C``.
"""

# %%
# The data and the two pipelines
# -------------------------------
#
# A quarter of the rows is kept aside as a test set. Each pipeline standardises the 30
# features, then fits a logistic regression; the step has the same name, ``model``, in both,
# so that one grid serves the two searches. ``OrtLogisticRegression`` minimises
# ``LogisticRegression``'s objective (L2 penalty, L-BFGS) with onnxruntime computing the loss
# and its gradient.

import time

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, StratifiedKFold, train_test_split
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from ortlearn import OrtLogisticRegression

X, y = load_breast_cancer(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.25, stratify=y, random_state=0
)
print(f"{X_train.shape[0]} training rows, {X_test.shape[0]} test rows, {X.shape[1]} features")

pipelines = {
    "scikit-learn": Pipeline([("scale", StandardScaler()), ("model", LogisticRegression())]),
    "ortlearn": Pipeline([("scale", StandardScaler()), ("model", OrtLogisticRegression())]),
}

# %%
# The search
# ----------
#
# Thirteen values of ``C`` from 1e-3 to 1e3, five stratified folds (the same folds for both
# searches): 65 fits per search, plus the refit of the best ``C`` on the whole training set.
# The default ``max_iter=100`` of L-BFGS is enough for every ``C`` on standardised data, so
# no fit warns.
#
# The searches are timed on one thread for both libraries (``threadpool_limits``, which
# ortlearn also reads when it opens its onnxruntime sessions): on the shared two-core machine
# that built this documentation, threads waiting for a busy core made the times of either
# library vary by an order of magnitude from run to run. Each search runs once before it is
# timed (imports, ortlearn's first conversion and session), and the printed times are those
# of that machine.

param_grid = {"model__C": np.logspace(-3, 3, 13)}
cv = StratifiedKFold(n_splits=5, shuffle=True, random_state=0)

searches, seconds = {}, {}
with threadpool_limits(limits=1):
    for name, pipe in pipelines.items():
        GridSearchCV(pipe, param_grid, cv=cv).fit(X_train, y_train)  # warm-up
        start = time.perf_counter()
        searches[name] = GridSearchCV(pipe, param_grid, cv=cv).fit(X_train, y_train)
        seconds[name] = time.perf_counter() - start

for name, search in searches.items():
    best_c = search.best_params_["model__C"]
    print(
        f"{name:>12}: best C = {best_c:.3g}, CV accuracy {search.best_score_:.4f}, "
        f"test accuracy {search.score(X_test, y_test):.4f}, search {seconds[name]:.2f} s"
    )

sk_scores = searches["scikit-learn"].cv_results_["mean_test_score"]
ort_scores = searches["ortlearn"].cv_results_["mean_test_score"]
print(f"largest difference of the mean CV accuracies: {np.abs(sk_scores - ort_scores).max():.2g}")

# %%
# Cross-validated accuracy against ``C``
# --------------------------------------
#
# The mean accuracy over the five folds, with a band of one standard deviation, for each
# value of ``C``. Both libraries minimise the same objective to the same tolerance, so the
# two curves coincide and the searches pick the same ``C``.

fig, ax = plt.subplots(figsize=(7, 4.5))
styles = {"scikit-learn": dict(lw=4, alpha=0.5), "ortlearn": dict(color="k", ls="--", marker=".")}
for name, search in searches.items():
    cs = np.asarray(search.cv_results_["param_model__C"], dtype=float)
    mean = search.cv_results_["mean_test_score"]
    std = search.cv_results_["std_test_score"]
    ax.plot(cs, mean, label=f"{name} (best C = {search.best_params_['model__C']:.3g})",
            **styles[name])
    if name == "scikit-learn":
        ax.fill_between(cs, mean - std, mean + std, alpha=0.15, label="± one std (scikit-learn)")
ax.set_xscale("log")
ax.set_xlabel("C (inverse of the L2 regularisation strength)")
ax.set_ylabel("mean 5-fold CV accuracy")
ax.set_title("Logistic regression on breast cancer: grid search over C")
ax.legend(loc="lower right")
fig.tight_layout()
plt.show()

# %%
# The best model
# --------------
#
# ``best_estimator_`` is the refitted pipeline. Its last step is a fitted ortlearn estimator
# with scikit-learn's attributes; ``to_onnx()`` gives its inference graph (the scaler is not
# in it: here the ONNX model takes standardised features).

best = searches["ortlearn"].best_estimator_
model = best.named_steps["model"]
print("coef_ shape:", model.coef_.shape, " intercept_:", np.round(model.intercept_, 4))
print("L-BFGS iterations of the refit:", model.n_iter_)
print("ONNX graph:", [node.op_type for node in model.to_onnx().graph.node])
