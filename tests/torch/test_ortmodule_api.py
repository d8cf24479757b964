"""The API of ``ortlearn.torch.ORTModule`` (seed 004, onnxruntime-training's ``ORTModule``).

The ``torch.nn.Module`` surface (state dicts, parameters, modes, hooks,
``requires_grad_``, accumulation of gradients, ``.double()``), the call
schema and when it is exported again (``export_count``), ``DebugOptions``,
and the fallback to torch. Most modules are exported with the TorchScript
exporter (well under a second each); the cases named ``dynamo`` use the
default exporter, which takes seconds per export.
"""

import copy
import os
import pickle
import re
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from ortlearn.torch import DebugOptions, LogLevel, ORTModule, ORTModuleTorchModelException

TS = "torchscript"


def _mlp(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)


def _x(*shape, seed=1, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _grads(module):
    return {n: None if p.grad is None else p.grad.clone() for n, p in module.named_parameters()}


def _assert_grads_close(got, expected, rtol=1e-5, atol=1e-6):
    assert list(got) == list(expected)
    for name, value in expected.items():
        if value is None:
            assert got[name] is None, name
        else:
            torch.testing.assert_close(got[name], value, rtol=rtol, atol=atol, msg=name)


def _torch_step(module, *args, **kwargs):
    """Gradients of ``sum(module(...))`` in torch."""
    module(*args, **kwargs).sum().backward()
    return _grads(module)


def _torch_grad_of_input(module, x):
    x = x.clone().requires_grad_()
    module(x).sum().backward()
    return x.grad


def _recorded(fn):
    """Call ``fn``; its result and the UserWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in caught if issubclass(w.category, UserWarning)]


# --------------------------------------------------------------------------- construction


def test_wraps_only_a_module():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        ORTModule(lambda x: x)
    with pytest.raises(TypeError, match="already an ORTModule"):
        ORTModule(ORTModule(_mlp()))
    with pytest.raises(TypeError, match="DebugOptions"):
        ORTModule(_mlp(), debug_options={"save_onnx": True})
    with pytest.raises(ValueError, match="exporter"):
        ORTModule(_mlp(), exporter="jit")


def test_debug_options_validation():
    with pytest.raises(ValueError, match="onnx_prefix"):
        DebugOptions(save_onnx=True)
    with pytest.raises(TypeError, match="LogLevel"):
        DebugOptions(log_level="INFO")
    with pytest.raises(TypeError, match="LogLevel"):
        DebugOptions(log_level=2)
    with pytest.raises(TypeError, match="onnx_prefix"):
        DebugOptions(save_onnx=True, onnx_prefix=3)
    for escaping in ("../../x", "/tmp/x", "sub/m", ".."):  # nothing written outside the folder
        with pytest.raises(ValueError, match="ORTMODULE_SAVE_ONNX_PATH"):
            DebugOptions(save_onnx=True, onnx_prefix=escaping)
    options = DebugOptions(log_level=LogLevel.INFO, save_onnx=True, onnx_prefix="m")
    assert (options.log_level, options.save_onnx, options.onnx_prefix, options.strict) == (
        LogLevel.INFO, True, "m", False)


# --------------------------------------------------------------------------- dynamo


def test_dynamo_default_exporter_gradients_and_export_rules(caplog):
    """The default exporter: gradients equal torch's; the first call is exported for its
    shapes, the first other batch size or sequence length once more with every axis
    symbolic, which serves every shape after; another rank or dtype is another schema."""
    caplog.set_level("INFO", logger="ortlearn.torch")
    model = ORTModule(_mlp(), DebugOptions(log_level=LogLevel.INFO))
    x = _x(2, 5, 4).requires_grad_()
    ref_x = x.detach().clone().requires_grad_()
    model(x).sum().backward()
    assert model.export_count == 1
    _assert_grads_close(_grads(model), _torch_step(_mlp(), ref_x))
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-6)
    model(_x(2, 5, 4, seed=3))
    assert model.export_count == 1
    for shape in [(3, 5, 4), (2, 9, 4), (1, 1, 4), (2, 5, 4)]:
        out = model(_x(*shape))
        torch.testing.assert_close(out, _mlp()(_x(*shape)), rtol=1e-5, atol=1e-6)
    assert model.export_count == 2
    # Rank 2: another schema, exported from a leaf whose .grad is set (torch.export's
    # guards fail on such a leaf: the exporter must get a fresh one).
    x = _x(6, 4).requires_grad_()
    x.grad = torch.ones_like(x)
    _, caught = _recorded(lambda: model(x).sum().backward())
    assert caught == [] and model.export_count == 3
    torch.testing.assert_close(x.grad, 1 + _torch_grad_of_input(_mlp(), x.detach()))
    model(_x(11, 4))
    model(_x(2, 4))
    assert model.export_count == 4
    exports = [r.getMessage() for r in caplog.records if "xport" in r.getMessage()]
    shapes = "Exported Sequential (train mode) with the dynamo exporter for the call's shapes."
    symbolic = ("Exported Sequential (train mode) with the dynamo exporter with symbolic "
                "dimensions.")
    assert exports == [shapes, symbolic] * 2


class _SizeAsIgnoreIndex(nn.Module):
    """onnxruntime-training's cross-entropy test: a size of the input read as a number."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(32, 16, padding_idx=1)

    def forward(self, tokens, positions):
        output = torch.transpose(self.embedding(tokens), 0, 1)
        return nn.CrossEntropyLoss(ignore_index=output.size(1))(output, positions)


def test_a_module_without_a_symbolic_export_is_exported_for_each_shape():
    """``ignore_index=x.size(1)``: no export with symbolic dimensions builds (both exporters
    fail); each new length is exported for its shapes, with torch's gradients, up to
    ``MAX_EXPORTS_PER_SCHEMA`` shapes, then the module runs in torch with a warning."""
    from ortlearn.torch import MAX_EXPORTS_PER_SCHEMA

    model, ref = ORTModule(_SizeAsIgnoreIndex()), _SizeAsIgnoreIndex()
    lengths = [20, 27, 20, *range(5, 5 + MAX_EXPORTS_PER_SCHEMA - 2)]
    for i, n in enumerate(lengths):
        generator = torch.Generator().manual_seed(i)
        tokens = torch.randint(32, (n,), generator=generator)
        positions = torch.randint(n, (16,), generator=generator)
        for m in (model, ref):
            m.zero_grad()
        _, caught = _recorded(lambda: model(tokens, positions).backward())
        assert caught == []  # in onnxruntime
        ref(tokens, positions).backward()
        torch.testing.assert_close(model.module.embedding.weight.grad,
                                   ref.embedding.weight.grad, rtol=1e-5, atol=1e-6)
    assert model.export_count == len(set(lengths)) == MAX_EXPORTS_PER_SCHEMA
    out, caught = _recorded(lambda: model(torch.arange(3), torch.arange(16) % 3))
    assert any("cannot be exported with symbolic dimensions" in str(w.message) for w in caught)
    torch.testing.assert_close(out, ref(torch.arange(3), torch.arange(16) % 3))


def test_dynamo_double_after_first_call():
    """``.double()`` after a float32 call: the next call exports again (a new dtype) and
    the gradients are float64 ones, as torch's."""
    model = ORTModule(_mlp())
    model(_x(5, 4))
    model.double()
    assert all(p.dtype == torch.float64 for p in model.parameters())
    x = _x(5, 4, dtype=torch.float64)
    out = model(x)
    assert out.dtype == torch.float64 and model.export_count == 2
    out.sum().backward()
    expected = _torch_step(_mlp(dtype=torch.float64), x)
    _assert_grads_close(_grads(model), expected, rtol=1e-10, atol=1e-12)
    assert all(g.dtype == torch.float64 for g in _grads(model).values())


class _Tied(nn.Module):
    """Two layers sharing one weight (``b.weight is a.weight``), and a scalar tensor input."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def forward(self, x, s):
        return self.b(torch.tanh(self.a(x))) * s


@pytest.mark.parametrize("exporter", [TS, "dynamo"])
def test_tied_weights_scalar_and_non_contiguous_inputs(exporter):
    model = ORTModule(_Tied(), exporter=exporter)
    x = _x(4, 6).t()
    s = torch.tensor(1.5, requires_grad=True)
    ref_s = s.detach().clone().requires_grad_()
    assert not x.is_contiguous()
    _, caught = _recorded(lambda: model(x, s).pow(2).sum().backward())
    assert caught == [] and model.export_count == 1
    assert [n for n, _ in model.named_parameters()] == ["a.weight", "a.bias", "b.bias"]
    ref = _Tied()
    ref(x, ref_s).pow(2).sum().backward()
    _assert_grads_close(_grads(model), _grads(ref))
    torch.testing.assert_close(s.grad, ref_s.grad, rtol=1e-5, atol=1e-5)


class _Nested(nn.Module):
    """Positional tensors, a number, keyword tensors and strings; nested outputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, x, scale=1.0, *, mode="sum", extra=None):
        h = self.lin(x) * scale
        total = h.sum() if mode == "sum" else h.mean()
        # x returned as is and h twice: outputs that are an input or repeat a value.
        out = {"h": h, "pair": (h.tanh(), [h.argmax(1), total]), "x": x, "again": h}
        if extra is not None:
            out["e"] = h * extra
        return out


def _nested_loss(out):
    loss = (out["h"].sum() + out["pair"][0].pow(2).sum() + out["pair"][1][1]
            + out["x"].pow(2).sum() + out["again"].pow(3).sum())
    return loss + (out["e"].sum() if "e" in out else 0)


@pytest.mark.parametrize("exporter", [TS, "dynamo"])
def test_nested_outputs_kwargs_and_integer_outputs(exporter):
    model = ORTModule(_Nested(), exporter=exporter)
    ref = _Nested()
    x, extra = _x(5, 4).requires_grad_(), _x(3, seed=2).requires_grad_()
    ref_x, ref_extra = (t.detach().clone().requires_grad_() for t in (x, extra))
    out, caught = _recorded(lambda: model(x, 2.0, mode="sum", extra=extra))
    assert caught == []  # no fallback to torch
    expected = ref(ref_x, 2.0, mode="sum", extra=ref_extra)
    assert type(out) is dict and list(out) == ["h", "pair", "x", "again", "e"]
    for key in ("h", "x", "again", "e"):
        torch.testing.assert_close(out[key], expected[key], rtol=1e-5, atol=1e-6)
    assert type(out["pair"]) is tuple and type(out["pair"][1]) is list
    cls = out["pair"][1][0]
    assert cls.dtype == torch.int64 and not cls.requires_grad
    torch.testing.assert_close(cls, expected["pair"][1][0], rtol=0, atol=0)
    _nested_loss(out).backward()
    _nested_loss(expected).backward()
    _assert_grads_close(_grads(model), _grads(ref))
    torch.testing.assert_close(extra.grad, ref_extra.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-6)
    assert model.export_count == 1
    model(_x(9, 4), 2.0, mode="sum", extra=extra)  # another batch size: symbolic
    model(_x(2, 4), 2.0, mode="sum", extra=extra)
    assert model.export_count == 2


def test_constant_arguments_are_part_of_the_schema():
    """Numbers, strings and None are baked into the graph: a new value exports again,
    a value seen before reuses its export."""
    model = ORTModule(_Nested(), exporter=TS)
    ref = _Nested()
    x, extra = _x(5, 4), _x(3, seed=2)
    model(x, 2.0, mode="sum", extra=extra)
    assert model.export_count == 1
    out = model(x, 3.0, mode="sum", extra=extra)  # another number
    assert model.export_count == 2
    torch.testing.assert_close(out["h"], ref(x, 3.0)["h"], rtol=1e-5, atol=1e-6)
    out = model(x, 3.0, mode="mean", extra=extra)
    assert model.export_count == 3
    torch.testing.assert_close(out["pair"][1][1], ref(x, 3.0, mode="mean")["pair"][1][1])
    out = model(x, 3.0, mode="mean")  # None instead of a tensor
    assert model.export_count == 4 and "e" not in out
    model(x, 3.0, mode="mean", extra=extra)  # back to an earlier schema
    assert model.export_count == 4


def test_integer_outputs_are_not_differentiable():
    model = ORTModule(_Nested(), exporter=TS)
    out = model(_x(5, 4))
    cls = out["pair"][1][0]
    assert not cls.requires_grad and cls.grad_fn is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        cls.float().sum().backward()
    out["h"].sum().backward()
    assert model.module.lin.weight.grad is not None


def test_changed_dtype_exports_once_more():
    model = ORTModule(_mlp(), exporter=TS)
    model(_x(5, 4))
    model(_x(7, 4))
    assert model.export_count == 2  # the shapes of the first call, then symbolic ones
    model.to(torch.float64)
    out = model(_x(5, 4, dtype=torch.float64))
    assert out.dtype == torch.float64 and model.export_count == 3
    torch.testing.assert_close(out, _mlp(dtype=torch.float64)(_x(5, 4, dtype=torch.float64)),
                               rtol=1e-12, atol=1e-12)
    model(_x(3, 4, dtype=torch.float64))
    model(_x(9, 4, dtype=torch.float64))
    assert model.export_count == 4


def test_inputs_on_another_device_raise():
    model = ORTModule(_mlp(), exporter=TS)
    with pytest.raises(ValueError, match="meta.*cpu"):
        model(torch.empty(5, 4, device="meta"))
    assert model.export_count == 0


# --------------------------------------------------------------------------- nn.Module API


def test_module_property_and_delegation():
    inner = _mlp()
    model = ORTModule(inner, exporter=TS)
    assert model.module is inner
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in inner.named_parameters()]
    assert all(a is b for a, b in zip(model.parameters(), inner.parameters()))
    assert len(list(model.parameters())) == 4
    assert model.get_parameter("2.bias") is inner[2].bias
    assert model.get_submodule("0") is inner[0]
    assert [n for n, _ in model.named_modules()] == [n for n, _ in inner.named_modules()]
    assert [n for n, _ in model.named_children()] == ["0", "1", "2"]
    bn = ORTModule(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), exporter=TS)
    names = [n for n, _ in bn.named_buffers()]
    assert names == ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    assert all(a is b for a, b in zip(bn.buffers(), bn.module.buffers()))
    assert bn.get_buffer("1.running_var") is bn.module[1].running_var
    # registered on the wrapper itself (onnxruntime-training's test_named_buffers): listed
    # after the wrapped module's
    bn.register_buffer("extra", torch.ones(2))
    bn.register_parameter("scale", nn.Parameter(torch.ones(1)))
    assert [n for n, _ in bn.named_buffers()] == [*names, "extra"]
    assert list(bn.buffers())[-1] is bn.extra and len(list(bn.buffers())) == 4
    assert [n for n, _ in bn.named_parameters(prefix="m")][-1] == "m.scale"
    assert list(bn.parameters())[-1] is bn.scale


class _WithMethods(nn.Module):
    """A module with a configuration, a method and a documented forward, as modeling code."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.scale = 1.0

    def forward(self, x, mask=None):
        """The model's own docstring."""
        return self.linear(x) * self.scale

    def predict(self, x):
        return self(x).argmax(-1)


def test_attributes_methods_and_signature_are_the_wrapped_modules():
    import inspect

    torch.manual_seed(0)
    inner = _WithMethods()
    model = ORTModule(inner, exporter=TS)
    x = _x(3, 4)
    assert model.scale == 1.0
    assert list(inspect.signature(model.forward).parameters) == ["x", "mask"]
    assert model.forward.__doc__ == "The model's own docstring."
    # the method runs the wrapped module's forward in torch (it calls inner, not model)
    torch.testing.assert_close(model.predict(x), inner(x).argmax(-1))
    model.scale = 3.0  # set on the wrapped module, which forward reads: exported again
    assert inner.scale == 3.0 and "scale" not in model.__dict__
    torch.testing.assert_close(model(x), inner(x))
    model.note = "kept"
    assert inner.note == "kept"
    del model.note
    assert not hasattr(inner, "note")
    with pytest.raises(AttributeError, match="nothing_here"):
        model.nothing_here  # noqa: B018
    copied = pickle.loads(pickle.dumps(model))
    assert list(inspect.signature(copied.forward).parameters) == ["x", "mask"]
    torch.testing.assert_close(copied(x), inner(x))


def test_a_dropped_module_is_freed_without_the_garbage_collector():
    """Its sessions and weights go with the last reference (no reference cycle), and a kept
    ``model.forward`` keeps the module, as a bound method does."""
    import gc
    import weakref

    model = ORTModule(_WithMethods(), exporter=TS)
    model(_x(3, 4)).sum().backward()
    forward = model.forward
    alive = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert alive() is not None
        torch.testing.assert_close(forward(_x(3, 4)), alive()._original_module(_x(3, 4)))
        del forward
        assert alive() is None
    finally:
        gc.enable()


def test_a_module_holding_an_ortmodule_saves_and_loads_its_state_dict():
    torch.manual_seed(0)

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = ORTModule(_mlp(), exporter=TS)
            self.head = nn.Linear(3, 1)

        def forward(self, x):
            return self.head(self.body(x))

    first, second = Holder(), Holder()
    state = first.state_dict()
    assert "body.0.weight" in state and "head.weight" in state
    second.load_state_dict(state)  # strict: every key found
    for name, value in second.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0, msg=name)
    x = _x(5, 4)
    torch.testing.assert_close(second(x), first(x))


def test_add_module_raises():
    model = ORTModule(_mlp(), exporter=TS)
    with pytest.raises(ORTModuleTorchModelException, match="add"):
        model.add_module("extra", nn.Linear(3, 3))
    with pytest.raises(ORTModuleTorchModelException):
        model.register_module("extra", nn.Linear(3, 3))


def test_state_dict_round_trip_bit_for_bit():
    model = ORTModule(_mlp(seed=0), exporter=TS)
    x = _x(5, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).sum().backward()
    optimizer.step()  # weights the other module's seed cannot reproduce
    state = model.state_dict()
    assert list(state) == list(model.module.state_dict()) == ["0.weight", "0.bias", "2.weight",
                                                              "2.bias"]
    other = ORTModule(_mlp(seed=1), exporter=TS)
    before = other(x)  # exported and its graphs cached before the load
    other.load_state_dict(state)
    after = other(x)
    assert not torch.equal(before, after)
    assert torch.equal(after, model(x))
    assert other.export_count == 1
    with pytest.raises(RuntimeError, match="Missing key"):
        other.load_state_dict({"0.weight": state["0.weight"]})
    with pytest.raises(ValueError, match="assign"):
        other.load_state_dict(state, assign=True)


def test_deepcopy_and_pickle_after_a_call():
    """onnxruntime's sessions cannot be copied: a copy exports again on its first call and
    trains its own parameters."""
    model = ORTModule(_mlp(), exporter=TS)
    x = _x(5, 4)
    out = model(x)
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert copied.module is not model.module
        assert all(a is not b for a, b in zip(copied.parameters(), model.parameters()))
        assert torch.equal(copied(x), out)
        copied(x).sum().backward()
        assert all(p.grad is None for p in model.parameters())
        _assert_grads_close(_grads(copied), _torch_step(_mlp(), x))


def test_train_and_eval_propagate():
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    ref = copy.deepcopy(inner)
    model = ORTModule(inner, exporter=TS)
    assert model.eval() is model
    assert not model.training and not any(m.training for m in inner.modules())
    x = _x(6, 4)
    torch.testing.assert_close(model(x), ref.eval()(x), rtol=1e-5, atol=1e-6)
    assert model.train() is model
    assert model.training and all(m.training for m in inner.modules())
    model(x)
    ref.train()(x)
    # Train mode: BatchNorm's running statistics step as torch's.
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(inner[1], name), getattr(ref[1], name))
    assert inner[1].num_batches_tracked.item() == 1
    assert model.export_count == 2  # one export per mode
    model.eval()
    model(x)
    assert model.export_count == 2


def test_zero_grad():
    model = ORTModule(_mlp(), exporter=TS)
    model(_x(5, 4)).sum().backward()
    assert all(p.grad is not None for p in model.module.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.module.parameters())
    model(_x(5, 4)).sum().backward()
    model.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.module.parameters())


def test_requires_grad_false_on_one_layer():
    model = ORTModule(_mlp(), exporter=TS)
    x = _x(5, 4)
    model(x)
    model.module[0].requires_grad_(False)
    model(x).sum().backward()
    grads = _grads(model)
    assert grads["0.weight"] is None and grads["0.bias"] is None
    ref = _mlp()
    ref[0].requires_grad_(False)
    _assert_grads_close(grads, _torch_step(ref, x))
    # The same export, differentiated w.r.t. fewer weights.
    assert model.export_count == 1
    model.requires_grad_(False)
    out = model(x)
    assert not out.requires_grad and model.export_count == 1


def test_gradients_accumulate_without_zero_grad():
    model = ORTModule(_mlp(), exporter=TS)
    x = _x(5, 4)
    model(x).sum().backward()
    model(x).sum().backward()
    expected = _torch_step(_mlp(), x)
    _assert_grads_close(_grads(model), {n: 2 * g for n, g in expected.items()})


def test_gradient_of_the_input():
    model = ORTModule(_mlp(), exporter=TS)
    x = _x(5, 4).requires_grad_()
    ref_x = x.detach().clone().requires_grad_()
    model(x).pow(2).sum().backward()
    _mlp()(ref_x).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-6)


def test_torch_compile_of_an_ortmodule_runs_it_in_onnxruntime():
    """torch.compile does not trace into ORTModule (it recursed through its guards): the
    compiled module's call runs the ONNX graphs, with torch's gradients."""
    model = ORTModule(_mlp(), exporter=TS)
    compiled = torch.compile(model)
    reference = _mlp()
    x = _x(5, 4)
    for module in (compiled, reference):
        module(x).pow(2).sum().backward()
    _assert_grads_close(_grads(model), _grads(reference))
    assert model.export_count == 1 and model._fallback_reason is None


def test_double_backward_raises_rather_than_dropping_the_graph():
    """The backward runs in onnxruntime: a gradient of the gradient does not exist, and
    asking for one raises instead of returning gradients without their graph."""
    model = ORTModule(_mlp(), exporter=TS)
    loss = model(_x(5, 4)).pow(2).sum()
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        sum(g.pow(2).sum() for g in grads).backward()


def test_output_modified_in_place_before_backward_raises():
    """Tanh's gradient reads its output; changing that output before the backward must
    fail as in torch, not give a wrong gradient."""
    x = _x(5, 4)
    for module in (nn.Sequential(_mlp(), nn.Tanh()),
                   ORTModule(nn.Sequential(_mlp(), nn.Tanh()), exporter=TS)):
        out = module(x)
        out.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


@pytest.mark.parametrize("exporter, train", [(TS, True), ("dynamo", True), (TS, False)])
def test_a_backward_through_two_calls_with_an_export_between(exporter, train):
    """Two forward calls, the second of a new shape (exported again), one backward: the
    export leaves the weights and statistics the first call saved untouched (torch's
    in-place check passes) and the BatchNorm's running statistics as torch's two calls
    leave them."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))
    net[1].running_mean.uniform_(-1, 1)
    net.train(train)
    reference = copy.deepcopy(net)
    model = ORTModule(net, exporter=exporter)
    for module in (model, reference):
        (module(_x(5, 4)).sum() + module(_x(6, 4, seed=2)).pow(2).sum()).backward()
    assert model.export_count == 2
    _assert_grads_close(_grads(net), _grads(reference), rtol=1e-4, atol=1e-5)
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(net.get_buffer(name), buffer, rtol=1e-5, atol=1e-6)


class _ZeroGates(nn.Module):
    """Two parameters initialized to zeros (adapters' and LoRA's B matrices are)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.gate = nn.Parameter(torch.zeros(3))
        self.shift = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        y = self.linear(x)
        return y * (1 + self.gate) + self.shift * y * y


@pytest.mark.parametrize("exporter", [TS, "dynamo"])
@pytest.mark.parametrize("make", [
    lambda: nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3)),
    _ZeroGates], ids=["batch_norm", "zero_gates"])
def test_eval_mode_weights_of_equal_values_stay_apart(exporter, make):
    """In eval mode, weights of equal values (a fresh BatchNorm's running variance and its
    weight, its running mean and its bias; two zero-initialized parameters) stay distinct
    graph inputs: the TorchScript exporter merged the first pair, and the weight got the
    variance's gradient too."""
    torch.manual_seed(0)
    net = make().eval()
    reference = copy.deepcopy(net)
    model = ORTModule(net, exporter=exporter)
    x = _x(5, 4)
    model(x).sum().backward()
    _assert_grads_close(_grads(net), _torch_step(reference, x))


@pytest.mark.parametrize("exporter", [TS, "dynamo"])
def test_first_call_under_inference_mode(exporter):
    """The first call (the export) inside ``torch.inference_mode`` on inference tensors, a
    BatchNorm in train mode updating its statistics; then a training step outside."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))
    reference = copy.deepcopy(net)
    model = ORTModule(net, DebugOptions(strict=True), exporter=exporter)
    with torch.inference_mode():
        x = _x(5, 4)
        torch.testing.assert_close(model(x), reference(x))
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(net.get_buffer(name), buffer)
    _assert_grads_close(_torch_step(model, _x(6, 4, seed=2)),
                        _torch_step(reference, _x(6, 4, seed=2)))


def test_module_made_under_inference_mode():
    with torch.inference_mode():
        torch.manual_seed(0)
        net = nn.Linear(4, 3)
        model = ORTModule(net, DebugOptions(strict=True), exporter=TS)
        x = _x(5, 4)
        torch.testing.assert_close(model(x), net(x))


def test_dynamo_export_keeps_no_constant_only_folded_nodes_read():
    """The constants of a value folded at the export (weight norm's axes) go with it: a
    dangling Constant would have onnxruntime warn at every session it opens."""
    from ortlearn.torch._export import export_call, flatten_call

    torch.manual_seed(0)
    net = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(4, 6)), nn.ReLU(),
                        nn.Linear(6, 2)).eval()
    tensors, spec = flatten_call((_x(5, 4),), {})
    graph = export_call(net, tensors, spec, 1, train=False, exporter="dynamo").model.graph
    read = {name for node in graph.node for name in node.input}
    outputs = {o.name for o in graph.output}
    assert all(o in read or o in outputs for node in graph.node for o in node.output)


def test_input_modified_in_place_before_backward_raises():
    """The first Linear's weight gradient reads the input (a call after the first, whose
    graphs are remembered): changing it before the backward fails as in torch."""
    model = ORTModule(_mlp(), exporter=TS)
    model(_x(5, 4)).sum().backward()
    for module in (_mlp(), model):
        x = _x(5, 4)
        out = module(x)
        x.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_forward_hooks_and_pre_hooks_run():
    model = ORTModule(_mlp(), exporter=TS)
    calls = []

    def pre(module, args):
        calls.append(("pre", module))
        return (args[0] * 2,)

    def post(module, args, output):
        calls.append(("post", module))
        return output + 1

    handles = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
    x = _x(5, 4)
    out = model(x)
    assert calls == [("pre", model), ("post", model)]
    torch.testing.assert_close(out, _mlp()(2 * x) + 1, rtol=1e-5, atol=1e-6)
    for handle in handles:
        handle.remove()
    torch.testing.assert_close(model(x), _mlp()(x), rtol=1e-5, atol=1e-6)
    assert len(calls) == 2


def test_full_backward_hook_runs():
    model = ORTModule(_mlp(), exporter=TS)
    seen = []
    model.register_full_backward_pre_hook(lambda m, grad_out: seen.append(("pre", grad_out)))
    model.register_full_backward_hook(lambda m, gi, go: seen.append(("post", gi, go)))
    x = _x(5, 4).requires_grad_()
    ref_x = x.detach().clone().requires_grad_()
    model(x).pow(2).sum().backward()
    _mlp()(ref_x).pow(2).sum().backward()
    assert [s[0] for s in seen] == ["pre", "post"]
    (grad_input,), (grad_output,) = seen[1][1], seen[1][2]
    torch.testing.assert_close(grad_input, ref_x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_output, 2 * _mlp()(x.detach()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(seen[0][1][0], grad_output)


# --------------------------------------------------------------------------- save_onnx


def test_save_onnx_writes_loadable_graphs(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path))
    options = DebugOptions(save_onnx=True, onnx_prefix="mlp")
    model = ORTModule(_mlp(), options, exporter=TS)
    model(_x(5, 4)).sum().backward()
    model.eval()
    with torch.no_grad():
        model(_x(5, 4))
    # onnxruntime-training's names (torch_exported, pre_grad_optimized, optimized), then the
    # two graphs ortlearn runs
    assert sorted(os.listdir(tmp_path)) == sorted(
        f"mlp_{what}_{mode}.onnx" for mode in ("training", "inference")
        for what in ("torch_exported", "pre_grad_optimized", "optimized", "forward",
                     *(("backward",) if mode == "training" else ())))
    for path in tmp_path.iterdir():
        onnx.checker.check_model(onnx.load(path), full_check=True)
    backward = onnx.load(tmp_path / "mlp_backward_training.onnx")
    assert [o.name for o in backward.graph.output] and all(
        o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for o in backward.graph.output)
    # the optimized training graph is the forward and the backward in one: fed the inputs,
    # the weights and the output's cotangent, it returns torch's gradients
    optimized = onnx.load(tmp_path / "mlp_optimized_training.onnx")
    reference, x = _mlp(), _x(5, 4)
    reference(x).sum().backward()
    weights = {n: p.detach().numpy() for n, p in reference.named_parameters()}
    names = [i.name for i in optimized.graph.input]
    feeds = {n: weights[n] if n in weights else x.numpy() for n in names[:-1]}
    feeds[names[-1]] = np.ones((5, 3), np.float32)
    session = ort.InferenceSession(optimized.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in optimized.graph.output], session.run(None, feeds)))
    for name, param in reference.named_parameters():
        np.testing.assert_allclose(got[f"{name}_grad"], param.grad.numpy(), rtol=1e-5,
                                   atol=1e-6)


def _scaled(factor):
    class Scaled(nn.Module):  # one name and repr, another forward for each factor
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            return self.lin(x) * factor
    return Scaled()


def test_cache_dir_reuses_an_export_across_instances(tmp_path, monkeypatch):
    """ORTMODULE_CACHE_DIR: a second instance of the same module (other weights) loads the
    first one's export and trains as torch; what changes the export is another key."""
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    first = ORTModule(_mlp(0), exporter=TS)
    first(_x(5, 4)).sum().backward()
    assert first.export_count == 1 and len(os.listdir(tmp_path)) == 1
    again, reference = ORTModule(_mlp(3), exporter=TS), _mlp(3)
    for module in (again, reference):
        module(_x(5, 4)).pow(2).sum().backward()
    assert again.export_count == 0 and again._fallback_reason is None
    _assert_grads_close(_grads(again), _grads(reference))
    # another width, dtype, mode, exporter input, or forward: a new export each
    others = [(ORTModule(nn.Sequential(nn.Linear(4, 9), nn.Tanh(), nn.Linear(9, 3)),
                         exporter=TS), _x(5, 4)),
              (ORTModule(_mlp(dtype=torch.float64), exporter=TS), _x(5, 4, dtype=torch.float64)),
              (ORTModule(_mlp().eval(), exporter=TS), _x(5, 4)),
              (ORTModule(_mlp(), exporter=TS), _x(5, 4).requires_grad_()),
              (ORTModule(_scaled(2.0), exporter=TS), _x(5, 4)),
              (ORTModule(_scaled(3.0), exporter=TS), _x(5, 4))]
    for module, x in others:
        module(x).sum().backward()
        assert module.export_count == 1, module
    assert len(os.listdir(tmp_path)) == 1 + len(others)
    torch.testing.assert_close(others[-1][0](_x(5, 4)), _scaled(3.0)(_x(5, 4)))


def test_cache_dir_damaged_or_unwritable_warns_and_exports(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    ORTModule(_mlp(), exporter=TS)(_x(5, 4))
    (path,) = tmp_path.iterdir()
    path.write_bytes(b"not an onnx model")
    model = ORTModule(_mlp(), exporter=TS)
    with pytest.warns(RuntimeWarning, match="could not read the cached export"):
        model(_x(5, 4))
    assert model.export_count == 1 and model._fallback_reason is None
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(blocked / "cache"))
    model = ORTModule(_mlp(), exporter=TS)
    with pytest.warns(RuntimeWarning, match="could not keep its export"):
        model(_x(5, 4))
    assert model.export_count == 1 and model._fallback_reason is None


# --------------------------------------------------------------------------- fallback


class _StraightThrough(torch.autograd.Function):
    """Clamp forward, identity backward (a straight-through estimator)."""

    @staticmethod
    def forward(ctx, x):
        return x.clamp(-0.5, 0.5)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Clamped(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return _StraightThrough.apply(self.lin(x)) * 2


def test_index_out_of_range_raises_torchs_index_error():
    model = ORTModule(nn.Embedding(10, 3), exporter=TS)
    with pytest.raises(IndexError, match="index out of range"):
        model(torch.tensor([1, 12]))  # on the first call too: not a reason to fall back
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.tensor([1, 2]))
        with pytest.raises(IndexError, match="index out of range.*idx=10"):
            model(torch.tensor([10, 1]))  # the shapes of the export: in onnxruntime
    assert model.export_count == 1


def test_unwritable_debug_folder_warns_and_trains_in_onnxruntime(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path / "missing" / "folder"))
    model = ORTModule(_mlp(), DebugOptions(save_onnx=True, onnx_prefix="m", strict=True),
                      exporter=TS)
    with pytest.warns(RuntimeWarning, match="could not write its debug copy"):
        model(_x(2, 4)).sum().backward()
    assert model.export_count == 1 and model.module[0].weight.grad is not None


def test_custom_autograd_function_falls_back_to_torch():
    model = ORTModule(_Clamped(), exporter=TS)
    x = 3 * _x(5, 4)
    out, caught = _recorded(lambda: model(x))
    assert len(caught) == 1
    assert "_StraightThrough" in str(caught[0].message)
    assert "torch.autograd.Function" in str(caught[0].message)
    assert model.export_count == 0
    out.sum().backward()
    ref = _Clamped()
    expected = _torch_step(ref, x)
    _assert_grads_close(_grads(model), expected, rtol=0, atol=0)
    # The custom backward, not the clamp's: saturated outputs still carry a gradient.
    assert (ref.lin(x).abs() > 0.5).any()
    torch.testing.assert_close(expected["lin.bias"], torch.full((3,), 2.0 * 5))
    _, caught = _recorded(lambda: [model(x), model(_x(7, 4))])
    assert caught == []


@pytest.mark.parametrize("how", ["option", "ORTLEARN_ORTMODULE_STRICT",
                                 "ORTMODULE_FALLBACK_POLICY"])
def test_strict_mode_raises_instead_of_falling_back(how, monkeypatch):
    monkeypatch.delenv("ORTLEARN_ORTMODULE_STRICT", raising=False)
    monkeypatch.delenv("ORTMODULE_FALLBACK_POLICY", raising=False)
    options = None
    if how == "option":
        options = DebugOptions(strict=True)
    elif how == "ORTLEARN_ORTMODULE_STRICT":
        monkeypatch.setenv(how, "1")
    else:
        monkeypatch.setenv(how, "FALLBACK_DISABLE")
    model = ORTModule(_Clamped(), options, exporter=TS)
    with pytest.raises(ORTModuleTorchModelException, match="_StraightThrough"):
        model(_x(5, 4))


class _Det(nn.Module):
    """``torch.linalg.det``: ONNX Det, which has no gradient rule in ortlearn."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.linalg.det(self.lin(x).reshape(-1, 2, 2))


def test_operator_without_gradient_rule_falls_back_naming_it():
    from ortlearn.autodiff import GRADIENT_RULES
    assert ("", "Det") not in GRADIENT_RULES
    model = ORTModule(_Det(), exporter=TS)
    x = _x(5, 4)
    out, caught = _recorded(lambda: model(x))
    assert len(caught) == 1
    assert re.search(r"operator 'Det' \(node '[^']+'\)", str(caught[0].message))
    assert model.export_count == 1
    out.sum().backward()
    _assert_grads_close(_grads(model), _torch_step(_Det(), x), rtol=0, atol=0)


def test_operator_without_gradient_rule_in_strict_mode_raises():
    model = ORTModule(_Det(), DebugOptions(strict=True), exporter=TS)
    with pytest.raises(ORTModuleTorchModelException, match="operator 'Det'"):
        model(_x(5, 4))


def test_operator_without_gradient_rule_runs_without_gradients():
    """No weight requires a gradient: no backward graph, so Det runs in ONNX Runtime."""
    model = ORTModule(_Det(), exporter=TS)
    x = _x(5, 4)
    with torch.no_grad():
        out, caught = _recorded(lambda: model(x))
    assert caught == [] and model.export_count == 1
    torch.testing.assert_close(out, _Det()(x), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- GPU


def _cuda_ready():
    return torch.cuda.is_available() and "CUDAExecutionProvider" in \
        ort.get_available_providers()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ready(), reason="needs torch CUDA and onnxruntime's "
                                               "CUDAExecutionProvider")
def test_cuda_module_trains_as_torch():
    model = ORTModule(_mlp().cuda(), exporter=TS)
    x = _x(5, 4).cuda()
    out = model(x)
    assert out.is_cuda
    out.sum().backward()
    assert all(p.grad.is_cuda for p in model.parameters())
    expected = _torch_step(_mlp().cuda(), x)
    _assert_grads_close(_grads(model), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="cuda"):
        model(x.cpu())
    assert np.isfinite(out.detach().cpu().numpy()).all()
