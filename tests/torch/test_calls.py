"""What a call of an ORTModule reuses from the last one like it (``ortlearn.torch._calls``).

A call with the same key as an earlier one (schema, mode, grad mode, the
tensors' dtypes, shapes, devices and ``requires_grad``) takes that call's
graphs and weight places after checking the export's guard; each test
changes something that key does not hold between two calls, and compares
the step with the same module in torch.
"""

import copy

import pytest
import torch
from torch import nn

from ortlearn.torch import ORTModule
from ortlearn.torch._calls import CallMemo

TS = "torchscript"


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _step(module, x):
    """Output and parameter gradients of ``sum(module(x) ** 2)``, from no gradients."""
    for p in module.parameters():
        p.grad = None
    out = module(x)
    (out ** 2).sum().backward()
    return out.detach(), {n: None if p.grad is None else p.grad.clone()
                          for n, p in module.named_parameters()}


def _assert_same_step(model, reference, x):
    out, grads = _step(model, x)
    ref_out, ref_grads = _step(reference, x)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        if grad is None:
            assert grads[name] is None, name
        else:
            torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def _trained_pair():
    """An ORTModule that made a few steps (its calls remembered), and torch's copy."""
    net = _mlp()
    model, reference = ORTModule(net, exporter=TS), copy.deepcopy(net)
    for seed in range(3):
        _assert_same_step(model, reference, _x(5, 4, seed=seed))
    return net, model, reference


def test_a_parameter_replaced_between_calls_is_the_one_read_and_trained():
    net, model, reference = _trained_pair()
    weight = torch.randn(3, 8, generator=torch.Generator().manual_seed(7))
    net[2].weight = nn.Parameter(weight.clone())
    reference[2].weight = nn.Parameter(weight.clone())
    _assert_same_step(model, reference, _x(5, 4, seed=9))
    assert net[2].weight.grad is not None
    assert model.export_count == 1  # the same names: the same graphs


def test_a_parameter_given_new_data_between_calls_is_read():
    net, model, reference = _trained_pair()
    data = torch.randn(8, 4, generator=torch.Generator().manual_seed(8))
    net[0].weight.data = data.clone()
    reference[0].weight.data = data.clone()
    _assert_same_step(model, reference, _x(5, 4, seed=9))


def test_a_weight_frozen_then_unfrozen_between_calls():
    net, model, reference = _trained_pair()
    for frozen in (True, False, True):
        net[0].weight.requires_grad_(not frozen)
        reference[0].weight.requires_grad_(not frozen)
        _assert_same_step(model, reference, _x(5, 4, seed=9))
        assert (net[0].weight.grad is None) == frozen
    assert model.export_count == 1


def test_calls_without_gradients_between_training_calls():
    net, model, reference = _trained_pair()
    with torch.no_grad():
        out = model(_x(5, 4))
    assert not out.requires_grad
    torch.testing.assert_close(out, reference(_x(5, 4)).detach(), rtol=1e-5, atol=1e-6)
    _assert_same_step(model, reference, _x(5, 4, seed=9))


def test_a_submodule_switched_to_eval_between_calls():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    model, reference = ORTModule(net, exporter=TS), copy.deepcopy(net)
    model(_x(5, 4)).sum().backward()
    model(_x(5, 4)).sum().backward()
    net[1].eval()
    reference[1].eval()
    _assert_same_step(model, reference, _x(5, 4, seed=9))  # no dropout: deterministic
    assert model.export_count == 2


def test_a_list_argument_runs_without_being_remembered():
    class Picks(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x, columns):
            return self.linear(x)[:, columns]

    torch.manual_seed(0)
    net = Picks()
    model, reference = ORTModule(net, exporter=TS), copy.deepcopy(net)
    for _ in range(2):
        torch.testing.assert_close(model(_x(5, 4), [0, 2]), reference(_x(5, 4), [0, 2]))
    assert model.export_count == 1


def test_call_memo_keeps_the_latest_and_skips_unhashable_keys():
    memo = CallMemo(size=2)
    for key in ("a", "b", "c"):
        memo.remember(key, key.upper())
    assert memo.get("a") is None and memo.get("b") == "B" and memo.get("c") == "C"
    memo.remember(("d", [1]), "D")  # a list in the key: not remembered, no error
    assert memo.get(("d", [1])) is None and memo.get("c") == "C"
    memo.clear()
    assert memo.get("c") is None


@pytest.mark.parametrize("shapes", [[(5, 4)] * 3, [(5, 4), (6, 4), (5, 4), (7, 4)]])
def test_shapes_that_come_back_reuse_their_graphs(shapes):
    net = _mlp()
    model, reference = ORTModule(net, exporter=TS), copy.deepcopy(net)
    for i, shape in enumerate(shapes):
        _assert_same_step(model, reference, _x(*shape, seed=i))
    assert model.export_count == (1 if len(set(shapes)) == 1 else 2)


def test_a_square_weight_transposed_in_place_is_read_in_its_new_layout():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    model, reference = ORTModule(net, exporter=TS), copy.deepcopy(net)
    for seed in range(2):
        _assert_same_step(model, reference, _x(5, 4, seed=seed))
    # the same memory, the same shape, other strides
    net[0].weight.data = net[0].weight.data.t()
    reference[0].weight.data = reference[0].weight.data.t()
    _assert_same_step(model, reference, _x(5, 4, seed=9))


def test_weights_cast_by_to_are_not_kept_alive_by_their_views():
    net, model, reference = _trained_pair()
    views = [v for call in model._calls._calls.values() for v in call.views]
    assert views and all(v[3].dtype == "float32" for v in views)
    model.double()
    assert all(not call.views for call in model._calls._calls.values())
    out = model(_x(5, 4).double())
    torch.testing.assert_close(out, reference.double()(_x(5, 4).double()))


def test_threads_calling_one_module_with_remembered_and_new_shapes():
    """Four threads call one module, each with its own batches, one of them with a new
    batch size at every call (each such call drops the kept weight views the others
    read): every output is torch's."""
    import threading

    net, model, reference = _trained_pair()
    failures = []

    def run(thread):
        try:
            for i in range(25):
                rows = 5 + (i % 7 if thread == 0 else 0)
                x = _x(rows, 4, seed=100 * thread + i)
                out = model(x)
                out.sum().backward()
                torch.testing.assert_close(out.detach(), reference(x).detach(),
                                           rtol=1e-5, atol=1e-6)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
