"""ORTModule's default mode on models from transformers' own modeling code.

Small random configurations (no weights are downloaded), dropout off (onnxruntime's
random masks are not torch's): each model trains in ONNX Runtime with no fallback
(strict), returns transformers' ``ModelOutput`` (``outputs.logits``), has torch's first
gradients and follows torch over a few AdamW steps.
"""

import copy

import pytest
import torch
import transformers

from ortlearn.torch import DebugOptions, ORTModule

STEPS, LR = 4, 1e-3


def _tokens(seed):
    generator = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, 64, (2, 8), generator=generator)}


def _pixels(seed):
    return {"pixel_values": torch.randn(2, 3, 32, 32,
                                        generator=torch.Generator().manual_seed(seed))}


MODELS = {
    # RMSNorm, rotary position embeddings, grouped-query attention, SwiGLU
    "llama": (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        use_cache=False)), _tokens),
    # a fused QKV projection split in three
    "gpt2": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)), _tokens),
    "bert": (lambda: transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)), _tokens),
    # depthwise convolutions, LayerNorm over the channels, mean pooling
    "convnext": (lambda: transformers.ConvNextForImageClassification(transformers.ConvNextConfig(
        num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3,
        image_size=32)), _pixels),
    # BatchNorm, residual blocks, adaptive average pooling
    "resnet": (lambda: transformers.ResNetForImageClassification(transformers.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3,
        layer_type="basic")), _pixels),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_model_trains_in_onnxruntime_as_in_torch(name):
    make, inputs = MODELS[name]
    torch.manual_seed(0)
    net = make()
    reference = copy.deepcopy(net)
    model = ORTModule(net, DebugOptions(strict=True))
    opt = torch.optim.AdamW(net.parameters(), lr=LR)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=LR)
    for step in range(STEPS):
        batch = inputs(step)
        opt.zero_grad()
        ref_opt.zero_grad()
        out, ref_out = model(**batch), reference(**batch)
        assert type(out) is type(ref_out)
        loss, ref_loss = (out.logits ** 2).mean(), (ref_out.logits ** 2).mean()
        loss.backward()
        ref_loss.backward()
        assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-4, abs=1e-7), step
        if step == 0:
            grads = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
            scale = max(g.abs().max().item() for g in grads.values())
            for n, p in net.named_parameters():
                if n in grads:
                    torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-5 * scale,
                                               msg=n)
        opt.step()
        ref_opt.step()
    assert model.export_count == 1
