"""
An MLP on digits, next to scikit-learn
======================================

This example trains :class:`~ortlearn.estimators.OrtMLPClassifier` and scikit-learn's
:class:`~sklearn.neural_network.MLPClassifier` with the same parameters on the digits data set,
draws the training loss of every epoch of both on one plot, and prints their test accuracy and
fit time. ortlearn starts from the weights scikit-learn would draw with the same
``random_state``, takes the same mini-batches and applies the same Adam updates, so the two
loss curves lie on top of each other.
"""

# %%
# The data
# --------
#
# The 8 x 8 images of handwritten digits, pixels from 0 to 16 scaled to [0, 1], split into a
# training set and a test set (a quarter of the rows, stratified by class).

import statistics
import time

import matplotlib.pyplot as plt
import numpy as np
import onnxruntime
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

from ortlearn import OrtMLPClassifier

X, y = load_digits(return_X_y=True)
X = X / 16.0
X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.25, stratify=y, random_state=0
)
print(f"{X_train.shape[0]} training rows, {X_test.shape[0]} test rows, {X.shape[1]} features")

# %%
# Two models, one set of parameters
# ---------------------------------
#
# One hidden layer of 64 ReLU units, Adam with a learning rate of 0.003, mini-batches of
# ``min(200, n_samples)`` rows (``batch_size='auto'``). Training stops when the training loss
# has not improved by ``tol=3e-3`` for ``n_iter_no_change=10`` epochs in a row, which happens
# after about 50 epochs here, well before ``max_iter=100``: both fits converge, so neither
# library warns. ortlearn's estimator takes exactly the parameters of its scikit-learn
# counterpart (plus ``device``), so the same dictionary builds both.

params = dict(
    hidden_layer_sizes=(64,),
    solver="adam",
    learning_rate_init=3e-3,
    max_iter=100,
    tol=3e-3,
    n_iter_no_change=10,
    random_state=0,
)
extra = sorted(set(OrtMLPClassifier().get_params()) - set(MLPClassifier().get_params()))
print("parameters ortlearn adds:", extra)

# %%
# Training and timing
# -------------------
#
# Each model is fitted three times. The first fit of a process also pays one-time costs (for
# ortlearn: importing skl2onnx and its converters, onnxruntime's first session), so it is
# printed apart; the time reported next to it is the median of the two fits that follow, as
# the fits of a script or a search that fits again are. An ortlearn fit is end to end: it
# converts the initial scikit-learn model to ONNX, builds the training graphs from it (the
# loss, its gradient and the Adam update), opens the onnxruntime sessions and runs the
# epochs. Timings are those of the machine that built this documentation (two shared
# cores), and vary from run to run.


def timed_fits(make_model, repeats=3):
    """Fit ``repeats`` fresh models; return the last one and the seconds of each fit."""
    seconds = []
    for _ in range(repeats):
        model = make_model()
        start = time.perf_counter()
        model.fit(X_train, y_train)
        seconds.append(time.perf_counter() - start)
    return model, seconds


sk_model, sk_seconds = timed_fits(lambda: MLPClassifier(**params))
ort_model, ort_seconds = timed_fits(lambda: OrtMLPClassifier(**params))

for name, model, seconds in [
    ("scikit-learn", sk_model, sk_seconds),
    ("ortlearn", ort_model, ort_seconds),
]:
    print(
        f"{name:>12}: {model.n_iter_} epochs, test accuracy {model.score(X_test, y_test):.4f}, "
        f"first fit {seconds[0]:.3f} s, then {statistics.median(seconds[1:]):.3f} s per fit"
    )

# %%
# The loss curves
# ---------------
#
# ``loss_curve_`` holds the training loss (mean log-loss plus the L2 term ``alpha``) of every
# epoch; ortlearn also names it ``train_losses_``. The two curves are drawn on a log scale,
# scikit-learn's as a thick line and ortlearn's as dots on top of it.

sk_curve = np.asarray(sk_model.loss_curve_)
ort_curve = np.asarray(ort_model.loss_curve_)
n = min(len(sk_curve), len(ort_curve))
gap = np.abs(sk_curve[:n] - ort_curve[:n])
print(f"epochs: scikit-learn {len(sk_curve)}, ortlearn {len(ort_curve)}")
print(f"largest difference between the curves: {gap.max():.2e} "
      f"(relative {np.max(gap / sk_curve[:n]):.2e})")

fig, ax = plt.subplots(figsize=(7, 4.5))
epochs = np.arange(1, n + 1)
ax.plot(epochs, sk_curve[:n], lw=4, alpha=0.5, label="scikit-learn MLPClassifier")
ax.plot(epochs, ort_curve[:n], "k.", ms=5, label="ortlearn OrtMLPClassifier")
ax.set_yscale("log")
ax.set_xlabel("epoch")
ax.set_ylabel("training loss (log-loss + L2 penalty)")
ax.set_title("MLP (64,) on digits, Adam: training loss per epoch")
ax.legend()
fig.tight_layout()
plt.show()

# %%
# How close the curves are
# ------------------------
#
# The curves agree to about 1e-8: the same initial weights, the same shuffled batches and the
# same updates, computed in float64 by onnxruntime instead of numpy, so that only the rounding
# of the two libraries' matrix products separates them. The predictions agree as well:

agree = np.mean(sk_model.predict(X_test) == ort_model.predict(X_test))
print(f"test predictions that agree: {agree:.2%}")
print("largest difference of the first layer's weights: "
      f"{np.abs(sk_model.coefs_[0] - ort_model.coefs_[0]).max():.2e}")

# %%
# The trained model is an ONNX graph
# ----------------------------------
#
# ``to_onnx()`` returns the trained inference model, which onnxruntime alone can run, with no
# scikit-learn or ortlearn installed where it is deployed.

onx = ort_model.to_onnx()
session = onnxruntime.InferenceSession(
    onx.SerializeToString(), providers=["CPUExecutionProvider"]
)
first_input = session.get_inputs()[0]
dtype = np.float64 if first_input.type == "tensor(double)" else np.float32
onnx_labels = session.run(None, {first_input.name: X_test[:10].astype(dtype)})[0]
print("onnxruntime:", onnx_labels.ravel())
print("ortlearn:   ", ort_model.predict(X_test[:10]))
