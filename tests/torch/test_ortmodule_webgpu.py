"""``ORTModule(module, device='webgpu')``: the graphs run on a GPU through the WebGPU plugin
provider while the module's tensors stay on the CPU.

Without a GPU the graphs built for WebGPU (the provider's rewrites, ``GPU_NODES``) run on
the CPU provider instead (``on_the_cpu``): they train as torch does and leave no node to the
CPU but what the warning names. The ``webgpu``-marked test runs them on a real GPU.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import ortlearn.torch._graphs as graphs_module
import ortlearn.torch._module as module_module
from ortlearn.torch import ORTModule
from ortlearn.training import webgpu
from ortlearn.training.device import Device, make_session


@pytest.fixture
def on_the_cpu(monkeypatch):
    """ORTModule takes ``device='webgpu'`` and builds its graphs for WebGPU, whose sessions
    open on the CPU provider (no GPU here)."""
    real = module_module.parse_device

    def parse(device):
        return Device("webgpu", 0) if str(device).startswith("webgpu") else real(device)

    monkeypatch.setattr(module_module, "sessions_device",
                        lambda device: None if device is None else "webgpu:0")
    monkeypatch.setattr(module_module, "parse_device", parse)
    monkeypatch.setattr(graphs_module, "parse_device", parse)
    monkeypatch.setattr(graphs_module, "make_session",
                        lambda model, device, options: make_session(model, "cpu", options))


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))


def _encoder():
    # GELU (no WebGPU kernel: written with Erf), LayerNorm, attention's Softmax
    return torch.nn.Sequential(torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0,
                                                                activation="gelu",
                                                                batch_first=True),
                               torch.nn.Flatten(), torch.nn.Linear(16 * 6, 3))


def _cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                               torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                               torch.nn.Dropout(0.2), torch.nn.Linear(4 * 4 * 4, 3))


CASES = {"mlp": (_mlp, lambda g: torch.randn(16, 12, generator=g)),
         "encoder": (_encoder, lambda g: torch.randn(8, 6, 16, generator=g))}


def _steps(model, make_x, n=5):
    g = torch.Generator().manual_seed(1)
    # (plain SGD: Adam would magnify the rounding of the attention key bias's gradient,
    # zero up to rounding, into steps of its learning rate)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(n):
        x, y = make_x(g), torch.randint(0, 3, (len(make_x(g)),), generator=g)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_webgpu_graphs_train_as_torch(on_the_cpu, name):
    make, make_x = CASES[name]
    torch.manual_seed(0)
    reference = make()
    wrapped = ORTModule(copy.deepcopy(reference), device="webgpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no node left to the CPU
        losses = _steps(wrapped, make_x)
    expected = _steps(reference, make_x)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-4,
                               atol=1e-5)
    for ours, theirs in zip(wrapped.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    assert wrapped.export_count == 1


def test_dropout_is_the_node_left_to_the_cpu(on_the_cpu):
    """WebGPU has no random kernels: a training Dropout draws its mask on the CPU, and the
    warning says so (eval mode has no Dropout)."""
    model = ORTModule(_cnn(), device="webgpu")
    x = torch.randn(4, 1, 8, 8)
    with pytest.warns(RuntimeWarning, match=r"1 node\(s\) of ORTModule's forward graph would "
                                            r"run on the CPU.*Dropout"):
        model(x).sum().backward()
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        model(x)


def test_webgpu_takes_cpu_tensors(on_the_cpu):
    model = ORTModule(_mlp().to("meta"), device="webgpu")
    with pytest.raises(ValueError, match="reads the module's tensors on the CPU"):
        model(torch.randn(2, 12, device="meta"))


def test_the_device_option_names_what_it_takes():
    with pytest.raises(ValueError, match="'webgpu' or 'webgpu:N'"):
        ORTModule(_mlp(), device="cuda")
    with pytest.raises(ValueError, match="webgpu"):
        ORTModule(_mlp(), device="vulkan")
    if not webgpu.webgpu_available():
        with pytest.raises(ValueError, match=r"ortlearn\[webgpu\]|no WebGPU device"):
            ORTModule(_mlp(), device="webgpu")


@pytest.mark.webgpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_webgpu_training_matches_torch(name):
    """On a GPU: the same steps as torch's on the CPU, to float32 rounding."""
    make, make_x = CASES[name]
    torch.manual_seed(0)
    reference = make()
    wrapped = ORTModule(copy.deepcopy(reference), device="webgpu")
    losses, expected = _steps(wrapped, make_x), _steps(reference, make_x)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-4,
                               atol=1e-5)
    for ours, theirs in zip(wrapped.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-4)
