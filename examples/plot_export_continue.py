"""
From a fitted estimator to the training API
===========================================

An :class:`~ortlearn.OrtMLPRegressor` is fitted on the data a server holds, then writes its
*training artifacts* with ``export_artifacts``: the ONNX models of its objective, of its
optimizer, and a checkpoint of its weights and optimizer state. A device that sees data of its
own goes on training from those files with :mod:`ortlearn.api` (``CheckpointState``,
``Module``, ``Optimizer``), evaluates with the eval model and predicts with an exported
inference model in a plain ``onnxruntime.InferenceSession``. The same continuation in Python
with ``partial_fit`` gives the same weights.
"""

# %%
# Two sources of data
# -------------------
#
# Friedman's regression problem #1, with a shift: the server's rows have a first feature
# below 0.5, the device's rows above. The target is standardised with the server's
# statistics; everything is float32, the type the models compute in.

import os
import tempfile

import matplotlib.pyplot as plt
import numpy as np
import onnxruntime as ort
from sklearn.datasets import make_friedman1
from sklearn.metrics import r2_score
from sklearn.model_selection import train_test_split

from ortlearn import OrtMLPRegressor, api

X, y = make_friedman1(n_samples=3000, n_features=6, noise=0.5, random_state=0)
X = X.astype(np.float32)
server = X[:, 0] < 0.5
y_mean, y_std = y[server].mean(), y[server].std()
y = ((y - y_mean) / y_std).astype(np.float32)
X_server, y_server = X[server], y[server]
X_device, X_test, y_device, y_test = train_test_split(
    X[~server], y[~server], test_size=0.4, random_state=0)
# whole batches of 50 rows, to compare step for step below
n_device = len(X_device) // 50 * 50
X_device, y_device = X_device[:n_device], y_device[:n_device]
print(f"server rows: {len(X_server)}, device rows: {len(X_device)}, "
      f"device test rows: {len(X_test)}")

# %%
# Fitting on the server
# ---------------------
#
# ``fit`` stops when the training loss no longer improves (``tol``, ``n_iter_no_change``), as
# ``MLPRegressor``'s does. ``shuffle=False`` makes the batches of ``partial_fit`` the rows in
# their order, which the comparison at the end reproduces; with ``shuffle=True``, a device
# would draw its own order.

est = OrtMLPRegressor(hidden_layer_sizes=(32, 16), batch_size=50, learning_rate_init=3e-3,
                      shuffle=False, random_state=0)
est.fit(X_server, y_server)
print(f"fitted in {est.n_iter_} epochs, last epoch loss {est.loss_:.4f}")
score_before = est.score(X_test, y_test)
print(f"R2 on the server's own rows: {est.score(X_server, y_server):.3f}, "
      f"on the device's test rows: {score_before:.3f}")

# %%
# The artifacts
# -------------
#
# ``export_artifacts(directory)`` writes four files:
#
# - ``training_model.onnx``: the forward pass, the estimator's loss (half the squared error
#   plus its L2 penalty ``alpha``) and its gradients, accumulated in buffers, for the user
#   inputs ``X`` and ``y``;
# - ``eval_model.onnx``: the forward pass and the loss only;
# - ``optimizer_model.onnx``: one update of the estimator's solver, Adam with its
#   ``beta_1``, ``beta_2`` and ``epsilon``;
# - ``checkpoint``: the trained weights, Adam's moments, the number of updates made and the
#   learning rate, in a safetensors file.
#
# That is the on-device workflow of onnxruntime-training: a machine with scikit-learn and the
# full data prepares the artifacts once; the device receives the four files and runs them. Its
# loop builds no graph and holds no estimator: it feeds batches to the training model and
# calls the optimizer model, with onnxruntime. The models are plain ONNX, the checkpoint a
# plain safetensors file.

tmp = tempfile.TemporaryDirectory()
directory = os.path.join(tmp.name, "artifacts")
est.export_artifacts(directory)
for name in sorted(os.listdir(directory)):
    print(f"{name:>22}: {os.path.getsize(os.path.join(directory, name)):>7} bytes")

# %%
# On the device: going on with ``ortlearn.api``
# ---------------------------------------------
#
# The checkpoint holds the estimator's weights and its Adam state: the first update continues
# the server's training (the step count goes on, and so does the learning rate, which the
# checkpoint stores; with a schedule, ``learning_rate='invscaling'`` for example, the loop
# would set each step's rate with ``Optimizer.set_learning_rate``). The target is a float
# column, as the objective reads it.

state = api.CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
module = api.Module(os.path.join(directory, "training_model.onnx"), state,
                    os.path.join(directory, "eval_model.onnx"))
optimizer = api.Optimizer(os.path.join(directory, "optimizer_model.onnx"), module)
# iterating over ``state.parameters`` gives (name, Parameter) pairs, as in onnxruntime-training
print("parameters:", {name: p.shape for name, p in state.parameters})
print("inputs:", module.input_names(), "outputs:", module.output_names(),
      f"learning rate: {optimizer.get_learning_rate():.3g}")

EPOCHS, BATCH = 10, 50
Y_device, Y_test = y_device.reshape(-1, 1), y_test.reshape(-1, 1)
module.eval()
eval_losses = [float(module(X_test, Y_test))]
step_losses = []
for _ in range(EPOCHS):
    module.train()
    for start in range(0, len(X_device), BATCH):
        module.lazy_reset_grad()
        loss = module(X_device[start:start + BATCH], Y_device[start:start + BATCH])
        optimizer.step()
        step_losses.append(float(loss))
    module.eval()
    eval_losses.append(float(module(X_test, Y_test)))
print(f"{len(step_losses)} steps; eval loss on the device's test rows: "
      f"{eval_losses[0]:.4f} before, {eval_losses[-1]:.4f} after")

# %%
# The eval model computes the loss, so it needs the targets. To predict, the module writes an
# inference model: the eval model with the current weights as initializers, keeping the
# outputs asked for (``variable``, the estimator's prediction). Any onnxruntime runs it.

inference_path = os.path.join(tmp.name, "device_model.onnx")
module.export_model_for_inferencing(inference_path, ["variable"])
session = ort.InferenceSession(inference_path, providers=["CPUExecutionProvider"])
print("inference model:", [i.name for i in session.get_inputs()], "->",
      [o.name for o in session.get_outputs()])
predicted = session.run(None, {"X": X_test})[0].ravel()
score_device = r2_score(y_test, predicted)
print(f"R2 on the device's test rows after continuing with ortlearn.api: {score_device:.3f}")

# %%
# The same continuation with ``partial_fit``
# ------------------------------------------
#
# Each ``partial_fit`` is one epoch over the rows it gets, in batches of ``batch_size``, with
# the estimator's learning rate: the same updates as the loop above. ``loss_`` is the mean of
# the epoch's batch losses.

epoch_losses = []
partial_scores = [score_before]
for _ in range(EPOCHS):
    est.partial_fit(X_device, y_device)
    epoch_losses.append(est.loss_)
    partial_scores.append(est.score(X_test, y_test))
print(f"R2 on the device's test rows after partial_fit: {partial_scores[-1]:.3f}, "
      f"on the server's rows: {est.score(X_server, y_server):.3f}")

weights = est.get_state()
largest = max(float(np.abs(state.parameters[name].data - value).max())
              for name, value in weights.items())
print(f"largest weight difference, ortlearn.api against partial_fit: {largest:.1e}")
print(f"largest prediction difference: {np.abs(predicted - est.predict(X_test)).max():.1e}")
module.close()

# %%
# The loss over the continued steps
# ---------------------------------
#
# On the left, the batch losses of the device's training, their mean per epoch and
# ``partial_fit``'s ``loss_`` (the same numbers); on the right, the loss of the eval model on
# the device's test rows after each epoch and ``partial_fit``'s R2 there.

steps_per_epoch = len(X_device) // BATCH
step_means = np.array(step_losses).reshape(EPOCHS, steps_per_epoch).mean(axis=1)
epoch_ends = steps_per_epoch * np.arange(1, EPOCHS + 1)
print(f"largest difference of the epoch losses, api against partial_fit: "
      f"{np.abs(step_means - np.array(epoch_losses)).max():.1e}")
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
left.plot(np.arange(1, len(step_losses) + 1), step_losses, lw=0.8, label="batch loss (api)")
left.plot(epoch_ends, step_means, "o-", label="epoch mean (api)")
left.plot(epoch_ends, epoch_losses, "x", ms=10, color="black", label="partial_fit loss_")
left.set_xlabel("training step on the device")
left.set_ylabel("training loss")
left.set_yscale("log")
left.set_title("Continued training")
left.legend()
right.plot(np.arange(EPOCHS + 1), eval_losses, "o-", label="eval model loss (api)")
right.set_xlabel("epochs on the device")
right.set_ylabel("loss on the device's test rows")
twin = right.twinx()
twin.plot(np.arange(EPOCHS + 1), partial_scores, "s--", color="tab:red",
          label="partial_fit R2")
twin.set_ylabel("R2")
right.set_title("Held-out rows of the device")
right.legend(handles=right.get_lines() + twin.get_lines(), loc="center right")
fig.tight_layout()

# %%
# The device's model fits the device's rows, and loses part of its fit of the server's
# (its R2 there drops): it only saw the device's rows while continuing. Both continuations,
# with the artifacts and with ``partial_fit``, made the same updates: the weights agree bit
# for bit on the CPU, as ``export_artifacts``' documentation says for the same batches and
# learning rates.

tmp.cleanup()
