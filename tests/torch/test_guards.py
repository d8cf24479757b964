"""ORTModule against a module that changes between calls (``ortlearn.torch._guards``).

Each test pins a pattern that used to run the first export silently: a
submodule replaced or added, a submodule frozen with ``.eval()``, an
attribute forward reads, a tensor attribute changed in place, a forward
hook, a branch on a tensor's value, a forward that changes its input, the
first call from several threads. The reference is the same module run in
torch. The TorchScript exporter keeps each export well under a second.
"""

import copy
import io
import sys
import threading
import warnings

import pytest
import torch
from torch import nn

from ortlearn.torch import MAX_EXPORTS_PER_SCHEMA, ORTModule
from ortlearn.torch._guards import Guard, recording_reads

TS = "torchscript"


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _step(module, x):
    """Output and parameter gradients of ``sum(module(x) ** 2)``, from zero gradients (the
    gradient of a plain sum through a BatchNorm in train mode is zero)."""
    module.zero_grad(set_to_none=True)
    out = module(x)
    (out ** 2).sum().backward()
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in module.named_parameters()}
    return out.detach(), grads


def _assert_same_step(ort_module, reference, x):
    out, grads = _step(ort_module, x)
    ref_out, ref_grads = _step(reference, x)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    # float32 rounding of the largest gradient (a bias before a BatchNorm in train mode
    # has a zero gradient, computed as a difference of such numbers)
    atol = 1e-6 * max(1.0, *(g.abs().max().item() for g in ref_grads.values() if g is not None))
    for name, grad in ref_grads.items():
        if grad is None:
            assert grads[name] is None, name
        else:
            torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=atol, msg=name)


def _pair(module):
    """``(ORTModule of module, a torch copy of it)``."""
    return ORTModule(module, exporter=TS), copy.deepcopy(module)


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.scale = 2.0
        self.offset = torch.zeros(3)  # a plain tensor attribute: neither parameter nor buffer
        self.unused = 0  # forward never reads it

    def forward(self, x):
        return self.linear(x) * self.scale + self.offset


def test_submodule_frozen_with_eval_stays_frozen():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.ReLU(),
                        nn.Linear(8, 2))
    net.train()
    net[1].eval()  # the fine-tuning recipe: frozen statistics
    net[2].eval()  # no dropout
    model, reference = _pair(net)
    running = net[1].running_mean.clone()
    for seed in range(3):
        _assert_same_step(model, reference, _x(16, 4, seed=seed))
    assert net.training and not net[1].training and not net[2].training
    torch.testing.assert_close(net[1].running_mean, running, rtol=0, atol=0)
    assert model.export_count == 1


def test_mode_of_a_submodule_changed_after_the_first_call_exports_again():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).train()
    model, reference = _pair(net)
    _assert_same_step(model, reference, _x(16, 4))
    net[1].eval()
    reference[1].eval()
    _assert_same_step(model, reference, _x(16, 4, seed=2))
    assert model.export_count == 2


def test_replaced_submodule_is_the_one_trained():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model, reference = _pair(net)
    _assert_same_step(model, reference, _x(8, 4))
    torch.manual_seed(1)
    net[0] = nn.Linear(4, 8, bias=False)
    reference[0] = copy.deepcopy(net[0])
    _assert_same_step(model, reference, _x(8, 4, seed=2))
    assert net[0].weight.grad is not None
    assert model.export_count == 2


def test_appended_layer_and_parameter_added_later_are_used():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4)])

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(layer(x))
            return x * getattr(self, "gain", torch.ones(()))

    torch.manual_seed(0)
    model, reference = _pair(Stack())
    _assert_same_step(model, reference, _x(8, 4))
    model.module.layers.append(nn.Linear(4, 4))
    reference.layers.append(copy.deepcopy(model.module.layers[1]))
    _assert_same_step(model, reference, _x(8, 4, seed=2))
    model.module.gain = nn.Parameter(torch.tensor(1.5))
    reference.gain = nn.Parameter(torch.tensor(1.5))
    _assert_same_step(model, reference, _x(8, 4, seed=3))
    assert model.module.gain.grad is not None
    assert model.export_count == 3


def test_attributes_forward_reads_are_guarded():
    torch.manual_seed(0)
    model, reference = _pair(_Scaled())
    _assert_same_step(model, reference, _x(8, 4))
    model.module.unused = 5  # not read by forward: no export
    _assert_same_step(model, reference, _x(8, 4, seed=2))
    assert model.export_count == 1
    model.module.scale = reference.scale = 3.0
    _assert_same_step(model, reference, _x(8, 4, seed=3))
    assert model.export_count == 2
    model.module.offset.add_(1.0)  # in place: the same tensor object
    reference.offset.add_(1.0)
    _assert_same_step(model, reference, _x(8, 4, seed=4))
    assert model.export_count == 3
    model.module.scale = reference.scale = 2.0  # back to a state exported before? no:
    _assert_same_step(model, reference, _x(8, 4, seed=5))  # the offset differs from then
    assert model.export_count == 4


def test_returning_to_an_exported_state_reuses_its_graphs():
    torch.manual_seed(0)
    model, reference = _pair(_Scaled())
    for scale in (2.0, 3.0, 2.0, 3.0):
        model.module.scale = reference.scale = scale
        _assert_same_step(model, reference, _x(8, 4))
    assert model.export_count == 2


def test_forward_hook_registered_after_the_first_call_runs():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model, reference = _pair(net)
    _assert_same_step(model, reference, _x(8, 4))

    def double(module, inputs, output):
        return output * 2

    net[0].register_forward_hook(double)
    reference[0].register_forward_hook(double)
    _assert_same_step(model, reference, _x(8, 4, seed=2))
    assert model.export_count == 2


def test_attribute_changed_at_every_call_falls_back_naming_it():
    torch.manual_seed(0)
    model, reference = _pair(_Scaled())
    with pytest.warns(UserWarning, match="'scale'.*changed between calls|changed between "
                                         "calls.*'scale'"):
        for step in range(MAX_EXPORTS_PER_SCHEMA + 1):
            model.module.scale = reference.scale = 1.0 + step
            _assert_same_step(model, reference, _x(8, 4, seed=step))
    assert model.export_count == MAX_EXPORTS_PER_SCHEMA
    model.module.scale = reference.scale = 50.0  # in torch from now on: still right
    _assert_same_step(model, reference, _x(8, 4))


def test_branch_on_a_tensor_value_is_not_traced_silently():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, x):
            if x.sum() > 0:
                return self.linear(x)
            return -self.linear(x)

    torch.manual_seed(0)
    model, reference = _pair(Branchy())
    with pytest.warns(UserWarning, match="branches on a tensor.s value .*test_guards.py"):
        _assert_same_step(model, reference, _x(8, 4).abs())
    _assert_same_step(model, reference, -_x(8, 4).abs())  # the other branch, as torch


def test_forward_changing_its_input_runs_in_torch_and_changes_it_once():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, x):
            x.add_(1.0)
            return self.linear(x)

    torch.manual_seed(0)
    model, reference = _pair(InPlace())
    x, x_ref = _x(8, 4), _x(8, 4)
    with torch.no_grad(), pytest.warns(UserWarning, match="changes its input tensor 0 in place"):
        out = model(x)
    with torch.no_grad():
        ref = reference(x_ref)
    torch.testing.assert_close(x, x_ref, rtol=0, atol=0)  # incremented once, as in torch
    torch.testing.assert_close(out, ref)


class _Counted(nn.Module):
    """A forward that counts its calls in a buffer, and scales by the count."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.linear(x) * self.calls


def _spectral():
    return nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Linear(4, 3)), nn.Tanh())


@pytest.mark.parametrize("make, written", [(_Counted, "'calls'"), (_spectral, "_u'")])
def test_forward_writing_a_buffer_runs_in_torch(make, written):
    """A buffer forward updates in place (a counter; spectral norm's power-iteration vector)
    is not carried back by the graph: the module runs in torch, as many times as called."""
    torch.manual_seed(0)
    model, reference = _pair(make())
    with pytest.warns(UserWarning, match=f"forward changes .*{written} of the module in place"):
        model(_x(8, 4))
    reference(_x(8, 4))
    for seed in range(2, 4):
        _assert_same_step(model, reference, _x(8, 4, seed=seed))
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(model.module.get_buffer(name), buffer, rtol=0, atol=0)


def test_forward_writing_a_buffer_in_strict_mode_raises():
    from ortlearn.torch import DebugOptions, ORTModuleTorchModelException

    model = ORTModule(_Counted(), DebugOptions(strict=True), exporter=TS)
    with pytest.raises(ORTModuleTorchModelException, match="'calls' of the module in place"):
        model(_x(8, 4))
    assert model.module.calls.item() == 0  # the probe's increment undone


def test_first_calls_from_several_threads():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model = ORTModule(net, exporter=TS)
    x = _x(8, 4)
    expected = net(x).detach()
    stdout = sys.stdout
    results, errors = [None] * 4, []

    def call(i):
        try:
            with torch.no_grad():
                results[i] = model(x)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback either
        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors, errors
    for result in results:
        torch.testing.assert_close(result, expected)
    assert model.export_count == 1
    assert sys.stdout is stdout and not isinstance(sys.stdout, io.StringIO)


def test_guard_says_what_changed():
    torch.manual_seed(0)
    module = _Scaled()
    with recording_reads(module) as reads:
        module(_x(2, 4))
    assert (module, "scale") in reads and (module, "unused") not in reads
    assert type(module) is _Scaled  # the class is given back
    guard = Guard(module, reads)
    assert guard.holds(module)
    module.scale = 4.0
    assert "'scale'" in guard.difference(module)
    module.scale = 2.0
    module.linear = nn.Linear(4, 3)
    assert guard.difference(module) == "the submodule 'linear' was replaced, added or moved"


def _tree():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Tanh(), nn.Dropout(0.1)),
                         nn.Linear(8, 2))


def _swap(net):
    net[0], net[2] = net[2], net[0]


@pytest.mark.parametrize("change, said", [
    (lambda net: net[1][1].eval(), "the train/eval mode of '1.1'"),
    (lambda net: net[1].register_forward_hook(lambda *a: None), "the forward hooks of '1'"),
    (lambda net: net[0].register_forward_pre_hook(lambda *a: None), "the forward hooks of '0'"),
    (lambda net: net[2].register_buffer("scale", torch.ones(2)),
     "the parameters or buffers of '2'"),
    (lambda net: net.register_parameter("gain", nn.Parameter(torch.ones(()))),
     "the parameters or buffers of the module"),
    (lambda net: setattr(net[1], "0", nn.ReLU()), "the submodule '1.0' was replaced"),
    (lambda net: net.append(nn.Tanh()), "the submodule '3' was replaced, added or moved"),
    (lambda net: net[1].pop(1), "a submodule of '1' was removed"),
    (_swap, "the submodule '0' was replaced, added or moved"),
])
def test_holds_and_difference_agree_on_each_change(change, said):
    net = _tree()
    guard = Guard(net)
    assert guard.holds(net) and guard.difference(net) is None
    change(net)
    assert not guard.holds(net)
    assert guard.difference(net).startswith(said)


def test_a_guard_keeps_no_submodule_alive():
    import gc
    import weakref

    net = _tree()
    with recording_reads(net) as reads:
        net(_x(2, 4))
    guard = Guard(net, reads)
    assert any(sub is net[1][1] for sub, _ in reads)  # Dropout's p and training are read
    old_linear, old_dropout = weakref.ref(net[0]), weakref.ref(net[1][1])
    del reads
    net[0] = nn.Linear(4, 8)
    net[1][1] = nn.Dropout(0.1)
    gc.collect()
    assert old_linear() is None and old_dropout() is None
    assert not guard.holds(net)
    assert "replaced" in guard.difference(net)
