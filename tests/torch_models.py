"""Small torch models, their ONNX exports for training, and gradients both ways.

The zoo the torch acceptance tests share: each builder returns a
seeded ``torch.nn.Module`` and example inputs; :func:`export` writes it to ONNX
with the training recipe of ``doc/torch_models.rst`` for either exporter;
:func:`torch_gradients` and :func:`ortlearn_gradients` compute the gradient of
the same loss on the same weights and batch, keyed by the torch
``state_dict`` names, so an acceptance test is a few lines::

    model, inputs, target = lenet()
    onx = export(model, inputs, exporter="dynamo")
    expected = torch_gradients(model, inputs, target, "cross_entropy")
    got = ortlearn_gradients(onx, inputs, target, "cross_entropy")
    assert_gradients_close(got, expected, rtol=1e-4)
"""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper
from torch import nn

from ortlearn import artifacts
from ortlearn.torch import batchnorm_training_mode, quiet_exporters
from ortlearn.training.device import make_session

EXPORTERS = ("torchscript", "dynamo")


def gradient_grid(names):
    """The grid of the gradient tests against torch: each model of ``names``, each
    exporter, float64 and float32, through ``build_gradient`` and through the training API
    (the ``name``, ``exporter``, ``dtype`` and ``via`` arguments of the test)."""
    marks = [pytest.mark.parametrize("name", names),
             pytest.mark.parametrize("exporter", EXPORTERS),
             pytest.mark.parametrize("dtype", [torch.float64, torch.float32],
                                     ids=["float64", "float32"]),
             pytest.mark.parametrize("via", ["autodiff", "api"])]

    def decorate(test):
        for mark in reversed(marks):
            test = mark(test)
        return test

    return decorate
#: Opset of the TorchScript exports (the dynamo exporter writes opset 20 or more).
TORCHSCRIPT_OPSET = 18


# --------------------------------------------------------------------------- zoo


class LeNet(nn.Module):
    """LeNet-style CNN for 8x8 digits: Conv-BN-ReLU-MaxPool twice, Dropout, 2 Linear.

    ``bias=False``: Convs without bias (a bias before a train-mode BatchNorm gets an
    exactly zero gradient: a direction no optimizer should see)."""

    def __init__(self, n_classes=10, p=0.25, bias=True):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1, bias=bias)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1, bias=bias)
        self.bn2 = nn.BatchNorm2d(8)
        self.dropout = nn.Dropout(p)
        self.fc1 = nn.Linear(8 * 2 * 2, 16)
        self.fc2 = nn.Linear(16, n_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.dropout(torch.flatten(x, 1))
        return self.fc2(F.relu(self.fc1(x)))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, depthwise 3x3, 1x1 project, residual; ReLU6, HardSwish."""

    def __init__(self, channels=4, expand=2, n_classes=3):
        super().__init__()
        hidden = channels * expand
        self.expand = nn.Conv2d(channels, hidden, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(hidden)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.bn2 = nn.BatchNorm2d(hidden)
        self.project = nn.Conv2d(hidden, channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, n_classes)

    def forward(self, x):
        y = F.relu6(self.bn1(self.expand(x)))
        y = F.hardswish(self.bn2(self.depthwise(y)))
        y = self.bn3(self.project(y)) + x
        return self.head(y.mean(dim=(2, 3)))


class BasicBlock(nn.Module):
    """ResNet basic block (two 3x3 Conv-BN, skip connection) and a pooled Linear head."""

    def __init__(self, channels=4, n_classes=3):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, n_classes)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)) + x)
        return self.fc(torch.flatten(self.pool(y), 1))


class TransformerClassifier(nn.Module):
    """Embedding (padding_idx=0), one encoder layer (MHA with key padding mask, LayerNorm,
    GELU, dropout), mean over the non-padded tokens, Linear head.

    ``activation='relu'``: the feed-forward without Erf (onnxruntime's CPU build has no
    float64 Erf kernel; with ReLU the layer runs in float64 too)."""

    def __init__(self, vocab=12, d_model=8, heads=2, n_classes=3, p=0.1, activation="gelu"):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model, padding_idx=0)
        self.encoder = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=16, dropout=p, activation=activation,
            batch_first=True)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, tokens):
        pad = tokens == 0
        h = self.encoder(self.embedding(tokens), src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1))


class RecurrentClassifier(nn.Module):
    """2-layer bidirectional LSTM, then a GRU, on padded variable-length sequences.

    ``lengths`` masks the padded steps of the classifier's average (ONNX
    ``sequence_lens`` is not written by either exporter for a batch-first
    padded tensor: the mask keeps torch and ONNX equal on any padding).
    """

    def __init__(self, n_features=3, hidden=4, n_classes=3):
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, num_layers=2, bidirectional=True,
                            batch_first=True)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x, mask):
        y, _ = self.lstm(x)
        y, _ = self.gru(y)
        m = mask.unsqueeze(-1)
        return self.head((y * m).sum(1) / m.sum(1))


class UNetBlock(nn.Module):
    """Down (Conv, MaxPool), up (ConvTranspose and bilinear Upsample), skip concatenation."""

    def __init__(self, channels=2, width=4):
        super().__init__()
        self.down = nn.Conv2d(channels, width, 3, padding=1)
        self.mid = nn.Conv2d(width, width, 3, padding=1)
        self.up = nn.ConvTranspose2d(width, width, 2, stride=2)
        self.upsample = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.out = nn.Conv2d(2 * width + channels, 1, 1)

    def forward(self, x):
        d = F.relu(self.down(x))
        m = F.relu(self.mid(F.max_pool2d(d, 2)))
        u = torch.cat([self.up(m) + d, self.upsample(m), x], dim=1)
        return self.out(u)


class MLP(nn.Module):
    """Linear-activation-Linear; optional Dropout between (what ortlearn trains today)."""

    def __init__(self, n_in=4, hidden=6, n_out=3, activation="relu", p=0.0):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.act = {"relu": nn.ReLU(), "tanh": nn.Tanh(), "sigmoid": nn.Sigmoid()}[activation]
        self.dropout = nn.Dropout(p) if p else nn.Identity()
        self.fc2 = nn.Linear(hidden, n_out)

    def forward(self, x):
        return self.fc2(self.dropout(self.act(self.fc1(x))))


def _seeded(cls, seed, *args, **kwargs):
    torch.manual_seed(seed)
    return cls(*args, **kwargs)


def mlp(batch=5, seed=0, **kwargs):
    """(model, inputs, target) of :class:`MLP`, cross-entropy target."""
    model = _seeded(MLP, seed, **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, model.fc1.in_features, generator=g)
    target = torch.randint(0, model.fc2.out_features, (batch,), generator=g)
    return model, (x,), target


def lenet(batch=4, seed=0, **kwargs):
    model = _seeded(LeNet, seed, **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    return model, (torch.randn(batch, 1, 8, 8, generator=g),), torch.randint(
        0, 10, (batch,), generator=g)


def inverted_residual(batch=3, seed=0, **kwargs):
    model = _seeded(InvertedResidual, seed, **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    return model, (torch.randn(batch, 4, 5, 5, generator=g),), torch.randint(
        0, 3, (batch,), generator=g)


def basic_block(batch=3, seed=0, **kwargs):
    model = _seeded(BasicBlock, seed, **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    return model, (torch.randn(batch, 4, 6, 6, generator=g),), torch.randint(
        0, 3, (batch,), generator=g)


def transformer(batch=3, seq=5, seed=0, **kwargs):
    model = _seeded(TransformerClassifier, seed, **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(1, model.embedding.num_embeddings, (batch, seq), generator=g)
    for i in range(batch):  # row i ends with i padding tokens (row 0 has none)
        if i:
            tokens[i, -min(i, seq - 1):] = 0
    return model, (tokens,), torch.randint(0, 3, (batch,), generator=g)


def recurrent(batch=3, seq=4, seed=0, **kwargs):
    model = _seeded(RecurrentClassifier, seed, **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, seq, model.lstm.input_size, generator=g)
    lengths = torch.tensor([seq - (i % seq) for i in range(batch)])
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).to(x.dtype)
    x = x * mask.unsqueeze(-1)
    return model, (x, mask), torch.randint(0, 3, (batch,), generator=g)


def unet_block(batch=2, seed=0, **kwargs):
    model = _seeded(UNetBlock, seed, **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, 2, 6, 6, generator=g)
    return model, (x,), torch.randn(batch, 1, 6, 6, generator=g)


def dropout_off(model: nn.Module) -> nn.Module:
    """Every dropout of ``model`` (``nn.Dropout`` and attention dropout) set to 0, in place:
    train mode without randomness, to compare train-mode forwards and gradients."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        elif isinstance(module, nn.MultiheadAttention):
            module.dropout = 0.0
    return model


#: name -> (builder, loss): the zoo of the acceptance tests.
ZOO = {
    "lenet": (lenet, "cross_entropy"),
    "inverted_residual": (inverted_residual, "cross_entropy"),
    "basic_block": (basic_block, "cross_entropy"),
    "transformer": (transformer, "cross_entropy"),
    "recurrent": (recurrent, "cross_entropy"),
    "unet_block": (unet_block, "mse"),
}


# --------------------------------------------------------------------------- export


def _input_names(n):
    return [f"input{i}" if n > 1 else "input" for i in range(n)]


def export(model, example_inputs, exporter="torchscript", train=True, *, opset=None,
           dynamic_batch=True, dynamic_axes=None, batchnorm_training=True) -> onnx.ModelProto:
    """``model`` exported for training by ``exporter`` (the recipe of ``doc/torch_models.rst``).

    - ``'torchscript'``: ``dynamo=False``, ``training=TrainingMode.TRAINING`` (or ``EVAL``),
      ``do_constant_folding=False`` (else a 3-D Linear weight is transposed into
      ``onnx::MatMul_<n>``), ``keep_initializers_as_inputs=False``, ``dynamic_axes``;
    - ``'dynamo'``: ``optimize=False`` (else BatchNorm is fused into the Conv/Gemm and
      Linear weights are transposed into ``val_<n>``), ``dynamic_shapes``; in train mode
      the BatchNormalization nodes are switched to ``training_mode=1`` afterwards
      (:func:`batchnorm_training_mode`) unless ``batchnorm_training=False``.

    The inputs are named ``input`` (``input0``, ``input1``... for several) with a
    symbolic batch dimension ``N`` when ``dynamic_batch``, and the other symbolic
    dimensions ``dynamic_axes`` gives (``{axis: name}``, on every input: ``{1: "T"}``
    for a sequence length); the output is ``output``; the initializers carry the
    torch ``state_dict`` names.
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    args = tuple(example_inputs)
    names = _input_names(len(args))
    axes = {0: "N"} if dynamic_batch else {}
    axes.update(dynamic_axes or {})
    # TorchScript traces with a real forward: in train mode it steps every BatchNorm's
    # running statistics (and writes the stepped values); keep the module's own
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.train(train)
    with quiet_exporters():
        if exporter == "torchscript":
            f = io.BytesIO()
            mode = torch.onnx.TrainingMode.TRAINING if train else torch.onnx.TrainingMode.EVAL
            torch.onnx.export(
                model, args, f, dynamo=False, training=mode, do_constant_folding=False,
                export_params=True, keep_initializers_as_inputs=False,
                opset_version=opset or TORCHSCRIPT_OPSET, input_names=names,
                output_names=["output"],
                dynamic_axes={**{n: axes for n in names},
                              **({"output": {0: "N"}} if dynamic_batch else {})} or None)
            onx = onnx.load_from_string(f.getvalue())
        else:
            dims = None
            if axes:
                symbols = {axis: torch.export.Dim(name) for axis, name in axes.items()}
                dims = tuple(dict(symbols) for _ in args)
            program = torch.onnx.export(model, args, dynamo=True, optimize=False,
                                        opset_version=opset, dynamic_shapes=dims)
            onx = program.model_proto
            for graph_input, name in zip(onx.graph.input, names):
                _rename(onx, graph_input.name, name)
            _rename(onx, onx.graph.output[0].name, "output")
            if train and batchnorm_training:
                batchnorm_training_mode(onx)
    model.load_state_dict(state)
    for init in onx.graph.initializer:
        if init.name in state:
            init.CopyFrom(numpy_helper.from_array(state[init.name].numpy(), init.name))
    return onx


def _rename(onx: onnx.ModelProto, old: str, new: str) -> None:
    if old == new:
        return
    for value in [*onx.graph.input, *onx.graph.output, *onx.graph.value_info]:
        if value.name == old:
            value.name = new
    for node in onx.graph.node:
        node.input[:] = [new if n == old else n for n in node.input]
        node.output[:] = [new if n == old else n for n in node.output]


def parameter_map(onx: onnx.ModelProto, model: nn.Module) -> dict[str, tuple[str, bool]]:
    """ONNX initializer -> (``state_dict`` name, transposed) for each initializer holding a
    torch parameter or buffer.

    With :func:`export`'s recipe the names are the ``state_dict`` names for
    both exporters; for other exports (``optimize=True``, constant folding) an
    initializer is matched by value, itself or transposed (a folded Linear
    weight), and a fused value (BatchNorm folded into a Conv) matches nothing.
    """
    state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    out = {}
    for init in onx.graph.initializer:
        if init.name in state:
            out[init.name] = (init.name, False)
            continue
        value = numpy_helper.to_array(init)
        for key, ref in state.items():
            if ref.shape == value.shape and np.array_equal(ref, value):
                out[init.name] = (key, False)
                break
            if ref.ndim == 2 and ref.T.shape == value.shape and np.array_equal(ref.T, value):
                out[init.name] = (key, True)
                break
    return out


# --------------------------------------------------------------------------- gradients


def _torch_loss(loss, output, target):
    if loss == "cross_entropy":
        return F.cross_entropy(output, target)
    if loss == "mse":
        return F.mse_loss(output, target)
    raise ValueError(f"loss must be 'cross_entropy' or 'mse', got {loss!r}")


def torch_gradients(model, inputs, target, loss="cross_entropy", train=True):
    """``(loss, {state_dict name: gradient})`` of torch autograd, as numpy arrays."""
    model.train(train)
    model.zero_grad()
    value = _torch_loss(loss, model(*inputs), target)
    value.backward()
    grads = {k: p.grad.detach().numpy().copy() for k, p in model.named_parameters()
             if p.grad is not None}
    return float(value.detach()), grads


def _to_numpy(value):
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def _feeds(onx, inputs):
    inits = {i.name for i in onx.graph.initializer}
    names = [i.name for i in onx.graph.input if i.name not in inits]
    return dict(zip(names, (_to_numpy(x) for x in inputs)))


def _loss_graph(onx: onnx.ModelProto, loss: str, target_type) -> onnx.ModelProto:
    """``onx`` + ``loss`` on its first output: torch's mean cross-entropy or mean squared error."""
    model = onnx.ModelProto()
    model.CopyFrom(onx)
    g = model.graph
    out = g.output[0].name
    if loss == "cross_entropy":
        nodes = [helper.make_node("SoftmaxCrossEntropyLoss", [out, "target"], ["loss"],
                                  reduction="mean")]
        elem, shape = onnx.TensorProto.INT64, ["N"]
    else:
        nodes = [helper.make_node("Sub", [out, "target"], ["loss_diff"]),
                 helper.make_node("Mul", ["loss_diff", "loss_diff"], ["loss_sq"]),
                 helper.make_node("ReduceMean", ["loss_sq"], ["loss"], keepdims=0)]
        elem = target_type
        shape = [d.dim_param or d.dim_value or f"d{i}"
                 for i, d in enumerate(g.output[0].type.tensor_type.shape.dim)]
    g.node.extend(nodes)
    g.input.append(helper.make_tensor_value_info("target", elem, shape))
    elem_out = g.output[0].type.tensor_type.elem_type
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("loss", elem_out, []))
    return model


def ortlearn_gradients(onx, inputs, target, loss="cross_entropy", *, model=None,
                       requires_grad=None, via="autodiff", evaluator=None):
    """``(loss, {state_dict name: gradient})`` computed by ortlearn in onnxruntime.

    Parameters
    ----------
    onx : onnx.ModelProto
        A forward model from :func:`export`.
    inputs : tuple of tensors or arrays
        Fed to the graph inputs in order.
    target : tensor or array
        Class indices (``'cross_entropy'``) or values (``'mse'``).
    model : torch.nn.Module, default=None
        Maps initializer names to ``state_dict`` names (:func:`parameter_map`)
        and transposes folded weights back; None: the names are kept.
    requires_grad : list of str, default=None
        Initializers to differentiate; None: every float initializer mapped to a
        torch parameter (every float initializer when ``model`` is None).
    via : {'autodiff', 'api'}
        ``'autodiff'``: :func:`ortlearn.autodiff.build_gradient` on the model
        plus the loss; ``'api'``: :func:`ortlearn.artifacts.generate_artifacts`
        with ``LossType.CrossEntropyLoss``/``MSELoss`` and one
        :class:`ortlearn.api.Module` training step.
    evaluator : callable, default=None
        ``evaluator(model_proto)`` returns an object with ``run(names, feeds)``
        (onnx's reference evaluator, for float64 graphs onnxruntime has no
        kernel for); it then runs the gradient model (``'autodiff'``) or the
        training model ``generate_artifacts`` writes, fed the checkpoint's
        parameters (``'api'``). None: onnxruntime (:func:`session`,
        :class:`ortlearn.TrainingSession`).
    """
    names = parameter_map(onx, model) if model is not None else {}
    params = {k for k, _ in model.named_parameters()} if model is not None else None
    if requires_grad is None:
        requires_grad = [i.name for i in onx.graph.initializer
                         if i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
                         and (params is None or names.get(i.name, ("",))[0] in params)]
    target = _to_numpy(target)
    feeds = _feeds(onx, inputs)
    if via == "autodiff":
        loss_value, grads = _autodiff_gradients(onx, feeds, target, loss, requires_grad,
                                                evaluator)
    elif via == "api":
        loss_value, grads = _api_gradients(onx, feeds, target, loss, requires_grad, evaluator)
    else:
        raise ValueError(f"via must be 'autodiff' or 'api', got {via!r}")
    out = {}
    for name, grad in grads.items():
        key, transposed = names.get(name, (name, False))
        out[key] = grad.T if transposed else grad
    return loss_value, out




def session(model_bytes) -> ort.InferenceSession:
    """A CPU session as ortlearn opens them (without the optimizer that breaks
    training-mode BatchNorm: ``ortlearn.training.device.DISABLED_OPTIMIZERS``)."""
    return make_session(model_bytes)


def _autodiff_gradients(onx, feeds, target, loss, requires_grad, evaluator=None):
    from ortlearn.autodiff import build_gradient

    target_type = onnx.helper.np_dtype_to_tensor_dtype(target.dtype)
    grad_model = build_gradient(_loss_graph(onx, loss, target_type), wrt=list(requires_grad))
    runner = evaluator(grad_model) if evaluator else session(grad_model.SerializeToString())
    outputs = runner.run(None, {**feeds, "target": target})
    return float(outputs[0]), dict(zip(requires_grad, outputs[1:]))


#: The artifacts' loss for each loss name of the harness.
LOSS_TYPES = {"cross_entropy": artifacts.LossType.CrossEntropyLoss,
              "mse": artifacts.LossType.MSELoss}


#: The input holding the target in the training model of each loss (onnxruntime-training's
#: names: ``CrossEntropyLoss`` reads ``labels``, the others ``target``).
_LABEL_INPUTS = {"cross_entropy": "labels", "mse": "target"}


def _api_gradients(onx, feeds, target, loss, requires_grad, evaluator=None):
    """generate_artifacts, then one training step of the session ``api.Module`` wraps
    (``api.Module`` has no gradient getter; ``TrainingSession.get_gradient`` reads the
    accumulation buffer the step wrote); with ``evaluator``, one run of the training
    model on the checkpoint's parameters, accumulation buffers reset."""
    import tempfile

    from ortlearn import CheckpointState, TrainingSession

    loss_type = LOSS_TYPES[loss]
    with tempfile.TemporaryDirectory() as tmp:
        artifacts.generate_artifacts(onx, requires_grad=list(requires_grad), loss=loss_type,
                                     artifact_directory=tmp)
        state = CheckpointState.load_checkpoint(f"{tmp}/checkpoint")
        if evaluator is not None:
            return _run_training_model(evaluator, onnx.load(f"{tmp}/training_model.onnx"),
                                       state, {**feeds, _LABEL_INPUTS[loss]: target},
                                       requires_grad)
        session = TrainingSession(state, f"{tmp}/training_model.onnx",
                                  f"{tmp}/eval_model.onnx")
        outputs = session.train_step(*feeds.values(), target)
        grads = {name: session.get_gradient(name) for name in requires_grad}
        session.close()
    return float(np.asarray(outputs[0]).reshape(-1)[0]), grads


def _run_training_model(evaluator, train_model, state, feeds, requires_grad):
    from ortlearn.graph.format import GRAD_BUFFER_SUFFIX, GRAD_OUTPUT_SUFFIX, LAZY_RESET_GRAD

    values = dict(feeds)
    for graph_input in train_model.graph.input:
        name = graph_input.name
        if name.endswith(GRAD_BUFFER_SUFFIX):
            values[name] = np.zeros_like(state.parameters[name[:-len(GRAD_BUFFER_SUFFIX)]].data)
        elif name == LAZY_RESET_GRAD:
            values[name] = np.array(True)
        elif name not in values:
            values[name] = state.parameters[name].data
    outputs = dict(zip([o.name for o in train_model.graph.output],
                       evaluator(train_model).run(None, values)))
    grads = {name: outputs[name + GRAD_OUTPUT_SUFFIX] for name in requires_grad}
    return float(np.asarray(outputs["loss"]).reshape(-1)[0]), grads


def ort_forward(onx, inputs) -> np.ndarray:
    """The first output of ``onx`` run in onnxruntime on ``inputs`` (:func:`session`)."""
    return session(onx.SerializeToString()).run(None, _feeds(onx, inputs))[0]


def assert_gradients_close(got, expected, rtol, atol=0.0):
    """Same keys; each gradient within ``rtol`` of the largest magnitude of torch's."""
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    for key, ref in expected.items():
        scale = max(float(np.abs(ref).max()), 1e-12)
        err = float(np.abs(got[key] - ref).max())
        assert err <= rtol * scale + atol, f"{key}: max error {err:.3g}, scale {scale:.3g}"
