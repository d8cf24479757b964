"""ORTModule's default mode on real models: transformers' modeling code, and blocks in the
style of the models that fell back or diverged (``tests/torch_blocks.py``).

Each model trains in ONNX Runtime (strict: no fallback to torch), returns what torch
returns (a ``ModelOutput``, a named tuple), has torch's first gradients and follows torch
over AdamW steps. transformers' models are built from small random configurations (no
weights are downloaded), dropout off (onnxruntime's random masks are not torch's). The
blocks: RMSNorm's ``mean`` (its axes folded to a constant), a fused QKV ``split``, a
causal mask of ``-inf``, ``interpolate(size=)`` and ``AvgPool2d`` on symbolic spatial
sizes, ``torch.max(x, dim)``, a named-tuple output.
"""

import copy

import pytest
import torch
import transformers
from torch_blocks import BLOCKS

from benchmarks.first_call import TRANSFORMERS
from ortlearn.torch import DebugOptions, ORTModule


def _transformers_case(make, make_inputs):
    return (lambda: make(transformers)), (lambda seed: make_inputs(torch, seed))


#: name -> (make, make_input(seed), AdamW steps, learning rate); a transformers export
#: takes seconds: fewer steps
CASES = {**{f"transformers_{k}": (*_transformers_case(*v), 4, 1e-3)
            for k, v in TRANSFORMERS.items()},
         **{k: (*v, 20, 1e-2) for k, v in BLOCKS.items()}}


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    values = out.values() if isinstance(out, dict) else out
    return [t for value in values for t in _tensors(value)]


def _loss(out):
    return sum((t ** 2).mean() for t in _tensors(out))


def _adamw_drift(first_grads, steps, lr):
    """Largest difference AdamW's arithmetic allows after ``steps`` steps, per element.

    Adam's step does not depend on the gradient's scale: where the gradient is
    structurally zero (a key bias before a softmax, a bias before a BatchNorm)
    both sides step by about ``lr`` along the sign of their rounding noise, up
    to ``2 lr`` apart per step; elsewhere the steps agree to float32 rounding.
    """
    drifts = {}
    for name, g in first_grads.items():
        tiny = g.abs() <= 1e-5 * g.abs().max().clamp_min(1e-30)
        drifts[name] = torch.where(tiny, 2 * lr * steps, 1e-4)
    return drifts


def _call(module, x):
    return module(**x) if isinstance(x, dict) else module(x)


@pytest.mark.parametrize("name", sorted(CASES))
def test_model_trains_in_onnxruntime_as_in_torch(name):
    make, make_input, steps, lr = CASES[name]
    torch.manual_seed(0)
    net = make()
    reference = copy.deepcopy(net)
    model = ORTModule(net, DebugOptions(strict=True))  # default exporter: 'auto'
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=lr)
    drift = None
    for step in range(steps):
        x = make_input(seed=step)
        opt.zero_grad()
        ref_opt.zero_grad()
        out, ref_out = _call(model, x), _call(reference, x)
        assert type(out) is type(ref_out)
        loss, ref_loss = _loss(out), _loss(ref_out)
        loss.backward()
        ref_loss.backward()
        assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-4, abs=1e-6), step
        if step == 0:
            ref_grads = {n: p.grad for n, p in reference.named_parameters()
                         if p.grad is not None}
            scale = max(g.abs().max().item() for g in ref_grads.values())
            for n, p in net.named_parameters():
                if n in ref_grads:
                    torch.testing.assert_close(p.grad, ref_grads[n], rtol=1e-4,
                                               atol=1e-5 * scale, msg=n)
            drift = _adamw_drift(ref_grads, steps, lr)
        opt.step()
        ref_opt.step()
    for (n, p), q in zip(net.named_parameters(), reference.parameters()):
        if n in drift:
            assert torch.all((p - q).abs() <= drift[n] * max(1.0, q.abs().max().item())), n
    assert model.export_count == 1


def test_new_spatial_size_builds_graphs_without_exporting_again():
    """The second size exports with symbolic dimensions, whose interpolation has no gradient
    rule: graphs of each later size come from that export, without another."""
    make, _ = BLOCKS["unet_decoder"]
    torch.manual_seed(0)
    net = make()
    reference = copy.deepcopy(net)
    model = ORTModule(net, DebugOptions(strict=True))
    for size in (8, 12, 16, 8, 12):
        x = torch.randn(2, 4, size, size, generator=torch.Generator().manual_seed(size))
        torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-6)
    assert model.export_count == 2
