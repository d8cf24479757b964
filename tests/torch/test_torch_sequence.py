"""The sequence models of the zoo (tests/torch_models.py), against torch.

The transformer encoder layer (embedding with padding_idx, multi-head attention with a
padding mask, LayerNorm, GELU, dropout, classification head) and the recurrent
classifier (2-layer bidirectional LSTM then a GRU on padded variable-length
sequences), exported by both torch exporters with a symbolic batch ``N`` and sequence
length ``T``:

- the gradient of the loss equals torch autograd's on the same weights and batch,
  through ``build_gradient`` and ``generate_artifacts``: float64 to 1e-6 (in onnx's
  reference evaluator with float64 Erf and onnxruntime-semantics LSTM/GRU: onnxruntime
  has no float64 LSTM, GRU or Erf kernel), float32 to 1e-4 (onnxruntime);
- the embedding's padding row gets no gradient and stays untouched, as torch's: the
  dynamo exporter records padding_idx, a TorchScript export is marked with
  :func:`ortlearn.autodiff.mark_padding_idx`;
- 30 AdamW steps of ``generate_artifacts`` + ``ortlearn.api`` follow
  ``torch.optim.AdamW`` (dropout off) to 1e-4 per step, on batches of two batch sizes
  and sequence lengths alternately (the same artifacts);
- with dropout on, the loss falls and the exported inference model agrees, in plain
  onnxruntime, with torch's eval mode on the trained weights.
"""

import functools
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import AttributeProto, TensorProto, numpy_helper
from reference_ops import Float64Reference
from torch_models import (
    EXPORTERS,
    ZOO,
    TransformerClassifier,
    assert_gradients_close,
    dropout_off,
    export,
    gradient_grid,
    ort_forward,
    ortlearn_gradients,
    parameter_map,
    torch_gradients,
    transformer,
)

from ortlearn import api, artifacts, onnxblock
from ortlearn.autodiff import mark_padding_idx
from ortlearn.graph.format import OPTIMIZER_METADATA_KEY, PADDING_IDX_KEY

NAMES = ("transformer", "recurrent")
TOL = {torch.float64: 1e-6, torch.float32: 1e-4}
SEQUENCE = {1: "T"}  # the sequence axis of every input is symbolic too
TABLE = "embedding.weight"
LR = 0.01
#: (batch, sequence length) of the training steps, alternately: one set of artifacts
BATCHES = ((3, 5), (4, 7))
#: The TorchScript exporter bakes the example's sequence length (5) into the Reshapes
#: of nn.MultiheadAttention (``tgt_len`` is a Python int when traced): only the batch
#: size of its transformer varies (test_torchscript_attention_has_a_static_length).
STATIC_LENGTH = {("transformer", "torchscript"): ((3, 5), (4, 5)),
                 ("attended_padding", "torchscript"): ((3, 5), (4, 5))}


def shapes(name, exporter):
    return STATIC_LENGTH.get((name, exporter), BATCHES)


#: Where the gradient is zero in exact arithmetic (softmax ignores the key bias) and
#: float32 leaves rounding noise (1e-9 in torch) that Adam's normalisation turns into
#: steps of either sign: compared as gradients (both ~0), not as trained weights.
NOISE_ONLY = {"encoder.self_attn.in_proj_bias": slice(8, 16)}


class AttendedPadding(TransformerClassifier):
    """The zoo's transformer without its padding mask: the padding tokens are attended
    and averaged, so their embedding row matters and torch's padding_idx shows (the zoo's
    model masks them: its padding row's gradient is zero with or without padding_idx)."""

    def forward(self, tokens):
        return self.head(self.encoder(self.embedding(tokens)).mean(1))


def attended_padding(batch=3, seq=5, seed=0):
    model, inputs, target = transformer(batch, seq, seed)
    torch.manual_seed(seed)
    return AttendedPadding(), inputs, target


BUILDERS = {**{name: build for name, (build, _) in ZOO.items()},
            "attended_padding": attended_padding}


def _as_float64(onx):
    """``onx`` computing in float64: float initializers, constants, casts and types.

    torch's TorchScript exporter cannot write the float64 transformer: its
    ``scaled_dot_product_attention`` symbolic (symbolic_opset14.py) accepts a bool or
    float32 attention mask only (``ValueError: Unsupported type for attn_mask: 7``) and
    writes float32 constants for a bool one; the float32 export is converted instead.
    """
    out = onnx.ModelProto()
    out.CopyFrom(onx)

    def double(t):
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    g = out.graph
    for init in g.initializer:
        if init.data_type == TensorProto.FLOAT:
            double(init)
    for value in [*g.input, *g.output, *g.value_info]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in g.node:
        for a in node.attribute:
            if a.type == AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                double(a.t)
            elif node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
    assert not any(a.type == AttributeProto.FLOAT and a.name == "value_float"
                   for n in g.node for a in n.attribute)
    return out


def build(name, dtype=torch.float32, dropout=False, **kwargs):
    """(model, inputs, target) of the zoo, in ``dtype``, dropout off unless ``dropout``."""
    model, inputs, target = BUILDERS[name](**kwargs)
    if not dropout:
        dropout_off(model)
    inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
    return model.to(dtype), inputs, target


@functools.cache
def _export(name, exporter, dtype, dropout=False):
    """The export of ``build(name, dtype, dropout)``; cached: a dynamo export takes 10-20 s.
    A TorchScript transformer has its padding row marked (the recipe of the user guide)."""
    model, inputs, _ = build(name, dtype, dropout)
    # float64 from the float32 export: TorchScript cannot export a float64 attention mask,
    # and torch 2.13 specialises the length of a second dynamo export of nn.LSTM in a
    # process (doc/torch_models.rst)
    from_float32 = (exporter == "torchscript") != (name == "recurrent")
    if dtype == torch.float64 and from_float32:
        onx = _as_float64(_export(name, exporter, torch.float32, dropout))
        state = model.state_dict()
        for init in onx.graph.initializer:
            if init.name in state:
                init.CopyFrom(numpy_helper.from_array(state[init.name].numpy(), init.name))
        return onx
    onx = export(model, inputs, exporter, dynamic_axes=SEQUENCE)
    if exporter == "torchscript" and name != "recurrent":
        mark_padding_idx(onx, TABLE, model.embedding.padding_idx)
    if exporter == "dynamo" and name == "recurrent":
        # torch.export specializes the sequence length of nn.LSTM ("You marked T as
        # dynamic but your code specialized it to be a constant (4)"); torch.onnx.export
        # then writes that length in the value_info of the LSTM's outputs, while the
        # graph's inputs and operators keep it symbolic: drop the stale shapes
        assert [d.dim_value for v in onx.graph.value_info if v.name == "getitem"
                for d in v.type.tensor_type.shape.dim][1] == 4
        del onx.graph.value_info[:]
    return onx


def exported(name, exporter, dtype=torch.float32, dropout=False):
    """(fresh model, inputs, target, a copy of its cached export)."""
    model, inputs, target = build(name, dtype, dropout)
    onx = onnx.ModelProto()
    onx.CopyFrom(_export(name, exporter, dtype, dropout))
    return model, inputs, target, onx


# ----------------------------------------------------------------- 1. gradients vs torch


@gradient_grid(NAMES)
def test_gradients_match_torch(name, exporter, dtype, via):
    model, inputs, target, onx = exported(name, exporter, dtype)
    assert sorted(parameter_map(onx, model)) == sorted(model.state_dict())
    dims = [d.dim_param for d in onx.graph.input[0].type.tensor_type.shape.dim[:2]]
    assert dims == ["N", "T"]
    # another batch size and sequence length than the export's
    batch, seq = shapes(name, exporter)[1]
    _, inputs, target = build(name, dtype, batch=batch, seq=seq, seed=3)
    loss, expected = torch_gradients(model, inputs, target)
    got_loss, got = ortlearn_gradients(
        onx, inputs, target, model=model, via=via,
        evaluator=Float64Reference if dtype == torch.float64 else None)
    assert got_loss == pytest.approx(loss, rel=TOL[dtype])
    assert_gradients_close(got, expected, rtol=TOL[dtype])
    if name == "transformer":  # torch's padding row: no gradient, exactly
        assert not expected[TABLE][0].any() and not got[TABLE][0].any()
        assert np.abs(got[TABLE][1:]).max() > 0


# ----------------------------------------------------------------- 2. padding_idx


def test_torchscript_loses_padding_idx_and_the_mark_restores_it():
    """TorchScript writes a bare Gather: unmarked, the padding row gets a gradient;
    :func:`mark_padding_idx` gives torch's (the dynamo exporter records padding_idx)."""
    model, inputs, target = build("attended_padding")
    onx = export(model, inputs, "torchscript")
    (gather,) = [n for n in onx.graph.node if n.op_type == "Gather" and n.input[0] == TABLE]
    assert not gather.metadata_props
    _, expected = torch_gradients(model, inputs, target)
    _, got = ortlearn_gradients(onx, inputs, target, model=model)
    assert np.abs(got[TABLE][0]).max() > 1e-3 * np.abs(expected[TABLE]).max()
    assert mark_padding_idx(onx, TABLE, -12) == [gather.name]  # -12: row 0 of 12
    assert {p.key: p.value for p in gather.metadata_props}[PADDING_IDX_KEY] == "0"
    _, got = ortlearn_gradients(onx, inputs, target, model=model)
    assert_gradients_close(got, expected, rtol=1e-4)
    with pytest.raises(ValueError, match="out of range"):
        mark_padding_idx(onx, TABLE, 12)
    with pytest.raises(ValueError, match="No Gather node on axis 0 reads 'head.weight'"):
        mark_padding_idx(onx, "head.weight", 0)


# ----------------------------------------------------------------- 3, 5. AdamW vs torch


def _batches(name, steps, sizes=BATCHES):
    """``steps`` batches of the two ``sizes`` alternately, each from its own seed."""
    out = []
    for step in range(steps):
        batch, seq = sizes[step % 2]
        _, inputs, target = build(name, batch=batch, seq=seq, seed=100 + step)
        out.append((inputs, target))
    return out


def _artifacts(onx, model, directory, optimizer=artifacts.OptimType.TorchAdamW):
    artifacts.generate_artifacts(
        onx, requires_grad=[k for k, _ in model.named_parameters()],
        loss=artifacts.LossType.CrossEntropyLoss, optimizer=optimizer,
        artifact_directory=directory)
    state = api.CheckpointState.load_checkpoint(directory / "checkpoint")
    module = api.Module(directory / "training_model.onnx", state, directory / "eval_model.onnx")
    optimizer = api.Optimizer(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(LR)
    return state, module, optimizer


def _train_ortlearn(module, optimizer, batches):
    module.train()
    losses = []
    for inputs, target in batches:
        losses.append(float(module(*(x.numpy() for x in inputs), target.numpy())))
        optimizer.step()
        module.lazy_reset_grad()
    return losses


def _train_torch(model, batches, **hyper):
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, **hyper)
    losses = []
    for inputs, target in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(*inputs), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _trained_weights(state, model):
    return {k: np.asarray(state.parameters[k].data) for k, _ in model.named_parameters()}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_adamw_follows_torch(name, exporter, tmp_path):
    """OptimType.TorchAdamW is torch.optim.AdamW with its defaults (betas, eps, weight decay):
    30 steps, one set of artifacts on two batch sizes and sequence lengths alternately."""
    model, _, _, onx = exported(name, exporter)
    state, module, optimizer = _artifacts(onx, model, tmp_path)
    hyper = json.loads({p.key: p.value for p in onnx.load(
        tmp_path / "optimizer_model.onnx").metadata_props}[OPTIMIZER_METADATA_KEY])["hyper"]
    defaults = torch.optim.AdamW([torch.zeros(1)]).defaults
    assert (hyper["betas"], hyper["eps"], hyper["weight_decay"]) == (
        list(defaults["betas"]), defaults["eps"], defaults["weight_decay"])
    assert hyper["bias_correction"] and not defaults["amsgrad"] and not hyper["clip_grad"]
    batches = _batches(name, 30, shapes(name, exporter))
    assert {inputs[0].shape[:2] for inputs, _ in batches} == set(shapes(name, exporter))
    got = _train_ortlearn(module, optimizer, batches)
    expected = _train_torch(model, batches)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    # it learned something (the comparison means something): the loss fell
    assert np.mean(expected[-6:]) < np.mean(expected[:6])
    weights = _trained_weights(state, model)
    initial = build(name)[0].state_dict()
    for key, value in model.named_parameters():
        ref, got_w = value.detach().numpy(), weights[key]
        assert np.abs(ref - initial[key].numpy()).max() > 1e-3, key  # every weight moved
        if key in NOISE_ONLY:
            noise = NOISE_ONLY[key]
            for grads in (ortlearn_gradients(onx, *batches[0], model=build(name)[0])[1],
                          torch_gradients(build(name)[0], *batches[0])[1]):
                assert np.abs(grads[key][noise]).max() < 1e-6 * np.abs(grads[key]).max()
            keep = np.ones(ref.shape, bool)
            keep[noise] = False
            ref, got_w = ref[keep], got_w[keep]
        err = np.abs(got_w - ref).max()
        assert err <= 1e-4 * np.abs(ref).max(), f"{key}: {err:.3g}"


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_padding_row_stays_untouched(exporter, tmp_path):
    """30 AdamW steps without weight decay, padding tokens attended: the padding row gets
    no gradient and is bit-for-bit the initial one, in torch and in ortlearn (with weight
    decay both decay it alike: test_adamw_follows_torch)."""
    model, inputs, target, onx = exported("attended_padding", exporter)
    _, expected = torch_gradients(model, inputs, target)
    _, got = ortlearn_gradients(onx, inputs, target, model=model)
    assert_gradients_close(got, expected, rtol=1e-4)
    assert not got[TABLE][0].any() and not expected[TABLE][0].any()
    initial = model.embedding.weight.detach().numpy().copy()
    state, module, optimizer = _artifacts(onx, model, tmp_path,
                                          optimizer=onnxblock.optim.TorchAdamW(weight_decay=0.0))
    batches = _batches("attended_padding", 30, shapes("attended_padding", exporter))
    assert all((inputs[0] == 0).any() for inputs, _ in batches)  # padding in every batch
    got = _train_ortlearn(module, optimizer, batches)
    expected = _train_torch(model, batches, weight_decay=0.0)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    table = np.asarray(state.parameters[TABLE].data)
    np.testing.assert_array_equal(model.embedding.weight.detach().numpy()[0], initial[0])
    np.testing.assert_array_equal(table[0], initial[0])
    assert np.abs(table[1:] - initial[1:]).min(axis=1).max() > 1e-3  # the other rows moved


# ----------------------------------------------------------------- 4. dropout on


def test_dropout_on_trains_and_exports_for_inference(tmp_path):
    """Transformer with its dropout (p=0.1, attention included), TorchScript recipe:
    the loss falls over 30 steps; the inference model ortlearn exports runs in plain
    onnxruntime, its Dropouts in inference mode, and agrees with torch's eval mode on the
    trained weights."""
    model, _, _, onx = exported("transformer", "torchscript", dropout=True)
    assert sum(n.op_type == "Dropout" for n in onx.graph.node) == 4  # attention's, 3 more
    _, module, optimizer = _artifacts(onx, model, tmp_path)
    _, inputs, target = build("transformer", batch=8, seq=5, seed=7)
    losses = _train_ortlearn(module, optimizer, [(inputs, target)] * 30)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    path = str(tmp_path / "inference.onnx")
    module.export_model_for_inferencing(path, ["output"])
    inference = onnx.load(path)
    # Dropout in inference mode: training_mode absent or a constant false (the identity)
    constants = {i.name: numpy_helper.to_array(i) for i in inference.graph.initializer}
    constants.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t)
                      for n in inference.graph.node if n.op_type == "Constant"})
    modes = [constants[n.input[2]] for n in inference.graph.node
             if n.op_type == "Dropout" and len(n.input) > 2 and n.input[2]]
    assert not any(m.any() for m in modes)
    names = parameter_map(inference, model)
    assert sorted(v for v, _ in names.values()) == sorted(k for k, _ in model.named_parameters())
    model.load_state_dict({key: torch.from_numpy(numpy_helper.to_array(init).copy())
                           for init in inference.graph.initializer if init.name in names
                           for key, _ in [names[init.name]]}, strict=False)
    model.eval()
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch, seq in shapes("transformer", "torchscript"):
        _, (tokens,), _ = build("transformer", batch=batch, seq=seq, seed=11)
        with torch.no_grad():
            expected = model(tokens).numpy()
        predicted = session.run(None, {"input": tokens.numpy()})[0]
        np.testing.assert_allclose(predicted, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.xfail(strict=True, raises=ort.capi.onnxruntime_pybind11_state.Fail,
                   reason="torch's TorchScript exporter traces nn.MultiheadAttention's "
                   "sequence length as a constant (Reshape to (5, N*heads, head_dim)): "
                   "export attention for several lengths with the dynamo exporter")
def test_torchscript_attention_has_a_static_length():
    model, _, _, onx = exported("transformer", "torchscript")
    _, inputs, _ = build("transformer", batch=3, seq=7)
    np.testing.assert_allclose(ort_forward(onx, inputs), model(*inputs).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
