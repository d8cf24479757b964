"""
Fine-tuning a small CNN: the training artifacts and ORTModule
=============================================================

A small convolutional network is pre-trained in plain torch on the digits 0 to 4 of
scikit-learn's 8x8 digits, then fine-tuned on the digits 5 to 9 with its convolution frozen:
only the classifier head learns. The fine-tuning runs three ways, on the same batches from the
same pre-trained weights:

(a) through the *training artifacts*: the model exported to ONNX, turned into training, eval
    and optimizer models by :func:`ortlearn.artifacts.generate_artifacts`, and trained with
    :mod:`ortlearn.api` (``CheckpointState``, ``Module``, ``Optimizer``), the on-device
    workflow of onnxruntime-training;
(b) through :class:`ortlearn.torch.ORTModule`, which runs the forward and backward passes of
    the torch module in onnxruntime inside an ordinary torch training loop;
(c) in plain torch, the reference.
"""

# %%
# The data and the network
# ------------------------
#
# ``load_digits`` gives 1797 images of 8x8 pixels with values 0 to 16. The old task is the
# digits 0 to 4, the new task the digits 5 to 9; each is split into a training and a test set.

import copy
import os
import tempfile

import matplotlib.pyplot as plt
import numpy as np
import onnx
import onnxruntime as ort
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from ortlearn import api, artifacts
from ortlearn.torch import ORTModule, quiet_exporters

torch.manual_seed(0)
np.random.seed(0)

X, y = load_digits(return_X_y=True)
X = (X / 16).astype(np.float32).reshape(-1, 1, 8, 8)
y = y.astype(np.int64)
old, new = y < 5, y >= 5
X_old_train, X_old_test, y_old_train, y_old_test = train_test_split(
    X[old], y[old], test_size=0.3, stratify=y[old], random_state=0)
X_new_train, X_new_test, y_new_train, y_new_test = train_test_split(
    X[new], y[new], test_size=0.5, stratify=y[new], random_state=0)
print(f"old task: {len(X_old_train)} training images, new task: {len(X_new_train)}")

# %%
# The network: one convolution with its ReLU and max-pooling, the backbone, and a linear
# head with one output per digit. Its parameters are ``conv.weight``, ``conv.bias``,
# ``head.weight`` and ``head.bias``: the names the ONNX export keeps.


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        features = self.pool(torch.relu(self.conv(x)))
        return self.head(torch.flatten(features, 1))


def accuracy(predict, X, y):
    """Accuracy of ``predict`` (numpy images -> logits) on X, y."""
    return float((np.asarray(predict(X)).argmax(axis=1) == y).mean())


def torch_predict(model):
    def predict(X):
        model.eval()
        with torch.no_grad():
            return model(torch.from_numpy(X)).numpy()
    return predict


# %%
# Pre-training in torch
# ---------------------
#
# A few epochs of Adam on the old task, the whole network trained.

pretrained = SmallCNN()
optimizer = torch.optim.Adam(pretrained.parameters(), lr=1e-2)
generator = torch.Generator().manual_seed(0)
Xt, yt = torch.from_numpy(X_old_train), torch.from_numpy(y_old_train)
for _ in range(10):
    pretrained.train()
    for rows in torch.randperm(len(Xt), generator=generator).split(64):
        optimizer.zero_grad()
        nn.functional.cross_entropy(pretrained(Xt[rows]), yt[rows]).backward()
        optimizer.step()

acc_before = (accuracy(torch_predict(pretrained), X_old_test, y_old_test),
              accuracy(torch_predict(pretrained), X_new_test, y_new_test))
print(f"pre-trained: accuracy on the old digits {acc_before[0]:.3f}, "
      f"on the new digits {acc_before[1]:.3f}")

# %%
# The head has never seen a 5 to 9 in training: it predicts none, and the accuracy on the new
# digits is close to 0. The fine-tuning keeps the convolution (the features) and retrains the
# head. All three methods see the same mini-batches, drawn here once.

EPOCHS, BATCH, LR = 6, 32, 5e-3
rng = np.random.default_rng(0)
batches = [rows for _ in range(EPOCHS)
           for rows in np.array_split(rng.permutation(len(X_new_train)),
                                      len(X_new_train) // BATCH)]
head_names = ["head.weight", "head.bias"]
conv_names = ["conv.weight", "conv.bias"]
print(f"{len(batches)} fine-tuning steps of about {BATCH} images")

# %%
# (a) The training artifacts
# --------------------------
#
# :doc:`/torch_models` gives the export recipe: the TorchScript exporter (``dynamo=False``)
# in training mode and without constant folding keeps every parameter as an initializer under
# its ``state_dict`` name, which is what ``requires_grad`` and ``frozen_params`` refer to. That
# exporter, and its ``training`` argument, are deprecated in torch 2.13, which says so with
# ``DeprecationWarning``\ s at each call: :func:`ortlearn.torch.quiet_exporters` silences the
# exporters' notices and progress lines within its block only.

tmp = tempfile.TemporaryDirectory()
directory = tmp.name
model_path = os.path.join(directory, "cnn.onnx")
pretrained.train()
with quiet_exporters():
    torch.onnx.export(
        pretrained, (torch.from_numpy(X_new_train[:2]),), model_path, dynamo=False,
        training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
        export_params=True, keep_initializers_as_inputs=False, opset_version=18,
        input_names=["input"], output_names=["output"],
        dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})
onx = onnx.load(model_path)
print("initializers:", sorted(i.name for i in onx.graph.initializer))

# %%
# The head is trainable, the convolution frozen: its weights go into the checkpoint but no
# gradient is computed for them (the training model has no convolution gradient at all). The
# loss is added on the first output and reads the class indices from an input ``labels``.

artifacts.generate_artifacts(
    onx, requires_grad=head_names, frozen_params=conv_names,
    loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
    artifact_directory=directory)
print("artifacts:", sorted(f for f in os.listdir(directory) if f != "cnn.onnx"))

state = api.CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
module = api.Module(os.path.join(directory, "training_model.onnx"), state,
                    os.path.join(directory, "eval_model.onnx"))
optimizer = api.Optimizer(os.path.join(directory, "optimizer_model.onnx"), module)
print("inputs", module.input_names(), "outputs", module.output_names())

# %%
# The loop of onnxruntime-training: a call of the module is a training step (forward,
# loss, backward, gradients accumulated), ``Optimizer.step`` updates the trainable
# parameters, ``lazy_reset_grad`` clears the gradients at the next step.

optimizer.set_learning_rate(LR)
module.train()
losses_artifacts = []
for rows in batches:
    loss = module(X_new_train[rows], y_new_train[rows])
    optimizer.step()
    module.lazy_reset_grad()
    losses_artifacts.append(float(loss))
print(f"training API: loss {losses_artifacts[0]:.3f} at the first step, "
      f"{losses_artifacts[-1]:.3f} at the last")

# %%
# The eval model (forward and loss) needs the labels; for predictions, the module writes an
# inference model with the trained weights, which any onnxruntime session runs.

module.eval()
print(f"eval loss on the new test digits: {float(module(X_new_test, y_new_test)):.4f}")
inference_path = os.path.join(directory, "inference.onnx")
module.export_model_for_inferencing(inference_path, ["output"])
session = ort.InferenceSession(inference_path, providers=["CPUExecutionProvider"])


def onnx_predict(X):
    return session.run(None, {"input": X})[0]


acc_artifacts = (accuracy(onnx_predict, X_old_test, y_old_test),
                 accuracy(onnx_predict, X_new_test, y_new_test))
frozen_kept = np.array_equal(state.parameters["conv.weight"].data,
                             pretrained.conv.weight.detach().numpy())
print("convolution unchanged:", frozen_kept)
module.close()

# %%
# (b) ORTModule
# -------------
#
# A copy of the pre-trained network, wrapped in :class:`~ortlearn.torch.ORTModule`: the
# training loop is torch's, with ``torch.optim.AdamW`` on the head's parameters. The
# convolution is frozen as in any torch script, ``requires_grad_(False)``: the exported graphs
# then compute no gradient for it, and its ``.grad`` stays ``None``. The first call exports
# the module; the default, ``exporter='auto'``, tries torch's dynamo exporter first, which takes
# a few seconds; the TorchScript exporter, asked for here, takes a fraction of a second on a
# module this simple and gives the same graphs' numbers. The later calls reuse the export.


def finetune_torch(model):
    """Fine-tune ``model``'s head on the batches; the loss of each step."""
    model.conv.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=LR)
    Xt, yt = torch.from_numpy(X_new_train), torch.from_numpy(y_new_train)
    model.train()
    losses = []
    for rows in batches:
        rows = torch.from_numpy(rows)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(Xt[rows]), yt[rows])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


ort_model = ORTModule(copy.deepcopy(pretrained), exporter="torchscript")
losses_ortmodule = finetune_torch(ort_model)
print(f"ORTModule: {ort_model.export_count} export for {len(batches)} steps, "
      f"conv.weight.grad is {ort_model.conv.weight.grad}")
acc_ortmodule = (accuracy(torch_predict(ort_model), X_old_test, y_old_test),
                 accuracy(torch_predict(ort_model), X_new_test, y_new_test))

# %%
# (c) Plain torch
# ---------------

reference = copy.deepcopy(pretrained)
losses_torch = finetune_torch(reference)
acc_torch = (accuracy(torch_predict(reference), X_old_test, y_old_test),
             accuracy(torch_predict(reference), X_new_test, y_new_test))

# %%
# The three fine-tunings
# ----------------------
#
# ORTModule and torch run the same optimizer on the same gradients: their losses agree to
# float32 rounding. The training artifacts use ``OptimType.AdamW``, onnxruntime-training's
# AdamW (bias correction folded into the learning rate, eps 1e-6 added to the uncorrected
# square root, no weight decay), where ``torch.optim.AdamW`` uses eps 1e-8 and a weight decay of
# 0.01: the curves are close but not equal. ``OptimType.TorchAdamW`` writes torch's rule
# (with it, the artifacts' losses also follow torch's to float32 rounding).

losses_artifacts, losses_ortmodule, losses_torch = map(
    np.array, (losses_artifacts, losses_ortmodule, losses_torch))
print(f"largest |ORTModule - torch| loss difference: "
      f"{np.abs(losses_ortmodule - losses_torch).max():.2e}")
print(f"largest |artifacts - torch| loss difference: "
      f"{np.abs(losses_artifacts - losses_torch).max():.2e}")
for name, (acc_old, acc_new) in [("training artifacts", acc_artifacts),
                                 ("ORTModule", acc_ortmodule), ("torch", acc_torch)]:
    print(f"{name:>18}: accuracy on the new digits {acc_new:.3f}, on the old ones {acc_old:.3f}")

fig, ax = plt.subplots(figsize=(7, 4))
steps = np.arange(1, len(batches) + 1)
ax.plot(steps, losses_torch, label="torch (reference)", lw=4, alpha=0.4)
ax.plot(steps, losses_ortmodule, "--", label="ORTModule")
ax.plot(steps, losses_artifacts, ":", label="training artifacts (ortlearn.api)")
ax.set_xlabel("fine-tuning step")
ax.set_ylabel("cross-entropy loss of the batch")
ax.set_yscale("log")
ax.set_title("Fine-tuning the head on the digits 5-9, convolution frozen")
ax.legend()
fig.tight_layout()

# %%
# The first losses are large: the pre-trained head gives the old digits large logits and the
# new ones none. Only the head learned: the new digits are recognised from the features
# learned on the old ones, and the old digits are forgotten, since nothing in the new batches
# asks the head to keep predicting them (train on a mix of both tasks to keep them).

tmp.cleanup()
