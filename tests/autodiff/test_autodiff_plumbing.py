"""Gradients of the tensor plumbing torch and transformers emit: Einsum, Scatter*,
GatherND, CumSum, Trilu, TopK, ReduceProd, embeddings, dynamic reshapes, batched MatMul.

Finite differences in float64 (``check_op``) and torch autograd in float64.
"""

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
from gradcheck import away, check_op, node, randn, session
from onnx import TensorProto, helper

from ortlearn.autodiff import build_gradient, mark_padding_idx
from ortlearn.graph import finalize_model

I64 = np.int64


def _torch_check(nodes, weights, consts, fn, opset=18):
    """ortlearn's gradient of ``sum(Y * R)`` vs torch autograd of ``fn``, float64."""
    from gradcheck import analytic_gradient, assert_close, loss_model, random_weights_of
    model, feeds = loss_model(nodes, weights, consts, opset=opset)
    grads, _ = analytic_gradient(model, feeds, list(weights))
    tw = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in weights.items()}
    y = fn(**tw, **{k: torch.tensor(v) for k, v in (consts or {}).items()})
    (y * torch.tensor(random_weights_of(model))).sum().backward()
    for k in weights:
        assert_close(grads[k], tw[k].grad.numpy())
    return grads


# ---------------------------------------------------------------- Einsum
EINSUM_CASES = [
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),  # attention scores
    ("bhqk,bhkd->bqhd", [(2, 2, 3, 4), (2, 2, 4, 5)]),  # attention output, transposed
    ("ij->ji", [(3, 4)]),
    ("ij->ij", [(3, 4)]),
    ("ii->i", [(3, 3)]),  # diagonal
    ("ii->", [(3, 3)]),  # trace
    ("iij->ji", [(3, 3, 2)]),
    ("ii...->i...", [(3, 3, 2)]),
    ("ij,jk", [(3, 4), (4, 2)]),  # implicit output
    ("ba,ab", [(2, 3), (3, 2)]),  # implicit scalar
    ("Ab,bC->AC", [(2, 3), (3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij->i", [(3, 4)]),  # j summed: broadcast back
    ("...ij,...jk->...ik", [(1, 3, 4), (2, 4, 5)]),  # broadcast batch
    ("...ij,...j->...i", [(2, 1, 3, 4), (1, 5, 4)]),
    ("i...j,j->...i", [(3, 2, 4), (4,)]),  # ellipsis summed away for the vector
    ("i...,...->i...", [(3, 1, 2), (4, 2)]),
    ("...j,j->...", [(2, 3, 4), (4,)]),
    ("...", [(2, 3)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("i,j->ij", [(3,), (4,)]),
    ("i,i->", [(3,), (3,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("ij,ij->", [(3, 4), (3, 4)]),
]


@pytest.mark.parametrize("eq, shapes", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum(eq, shapes):
    names = [f"X{k}" for k in range(len(shapes))]
    check_op([node("Einsum", names, equation=eq)],
             {n: randn(*s) for n, s in zip(names, shapes)}, float32=len(shapes) > 1)


@pytest.mark.parametrize("eq, shapes", [
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]), ("ii->i", [(3, 3)]),
    ("...ij,...jk->...ik", [(1, 3, 4), (2, 4, 5)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("iij->ji", [(3, 3, 2)]), ("i...j,j->...i", [(3, 2, 4), (4,)])])
def test_einsum_torch(eq, shapes):
    names = [f"X{k}" for k in range(len(shapes))]
    _torch_check([node("Einsum", names, equation=eq)],
                 {n: randn(*s) for n, s in zip(names, shapes)}, None,
                 lambda **t: torch.einsum(eq, *[t[n] for n in names]))


def test_einsum_same_operand_twice_and_dynamic_shapes():
    """A weight used twice, and operands with symbolic dims (a trace needs Range)."""
    w = randn(3, 3)
    x = randn(2, 3, 3)
    nodes = [node("Einsum", ["X", "W", "W"], "T", equation="bii,ij,jk->bk"),
             node("Einsum", ["T"], equation="bk->k")]
    _dynamic_check(nodes, {"W": w}, {"X": x}, {"X": ["N", "M", "M"]},
                   lambda W, X: torch.einsum("bk->k", torch.einsum("bii,ij,jk->bk", X, W, W)))


def _dynamic_check(nodes, weights, inputs, dims, fn):
    """Gradients with symbolic input dims vs torch (float64)."""
    from gradcheck import analytic_gradient, assert_close, loss_model, random_weights_of
    model, feeds = loss_model(nodes, weights, inputs=inputs, input_dims=dims)
    grads, _ = analytic_gradient(model, feeds, list(weights))
    tw = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
    y = fn(**tw, **{k: torch.tensor(v) for k, v in inputs.items()})
    (y * torch.tensor(random_weights_of(model))).sum().backward()
    for k in weights:
        assert_close(grads[k], tw[k].grad.numpy())


# ---------------------------------------------------------------- Scatter / Gather
SCATTER_IDX = {0: np.array([[1, 0, 2, 0], [0, 2, 1, 1]]), 1: np.array([[1, 0, 3], [0, 2, -1]])}


@pytest.mark.parametrize("reduction", ["none", "add", "mul"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(reduction, axis):
    idx = SCATTER_IDX[axis % 2]
    data = away(3, 4) if axis == 0 else away(2, 4)
    check_op([node("ScatterElements", ["D", "I", "U"], axis=axis, reduction=reduction)],
             {"D": data, "U": away(*idx.shape)}, consts={"I": idx})


@pytest.mark.parametrize("reduction", ["none", "add", "mul"])
def test_scatter_elements_torch(reduction):
    idx = np.array([[1, 0, 3], [0, 2, 1]])
    torch_reduce = {"none": None, "add": "sum", "mul": "prod"}[reduction]

    def fn(D, U, Ix):
        if torch_reduce is None:
            return D.scatter(1, Ix, U)
        return D.scatter_reduce(1, Ix, U, reduce=torch_reduce, include_self=True)
    _torch_check([node("ScatterElements", ["D", "Ix", "U"], axis=1, reduction=reduction)],
                 {"D": away(2, 4), "U": away(2, 3)}, {"Ix": idx}, fn)


def test_scatter_elements_duplicates_add_opset_16():
    idx = np.array([[1, 1, 1], [0, 0, 2]])
    check_op([node("ScatterElements", ["D", "I", "U"], axis=1, reduction="add")],
             {"D": randn(2, 4), "U": randn(2, 3)}, consts={"I": idx}, opset=16)


def test_scatter_elements_opset_13():
    check_op([node("ScatterElements", ["D", "I", "U"], axis=0)],
             {"D": randn(3, 2), "U": randn(1, 2)}, consts={"I": np.array([[2, 0]])}, opset=13)


@pytest.mark.parametrize("reduction", ["none", "add", "mul"])
@pytest.mark.parametrize("idx, ushape", [
    (np.array([[1], [0]]), (2, 4)),  # rows
    (np.array([[1, 2], [0, 0], [2, -1]]), (3,)),  # elements
    (np.array([[[0, 1]], [[2, 3]]]), (2, 1)),  # a batch of element indices
])
def test_scatter_nd(reduction, idx, ushape):
    check_op([node("ScatterND", ["D", "I", "U"], reduction=reduction)],
             {"D": away(3, 4), "U": away(*ushape)}, consts={"I": idx})


def test_scatter_nd_add_duplicates_torch():
    idx = np.array([[1], [1], [-1]])

    def fn(D, U, Ix):
        return D.index_put((Ix[:, 0] % 3,), U, accumulate=True)
    _torch_check([node("ScatterND", ["D", "Ix", "U"], reduction="add")],
                 {"D": randn(3, 4), "U": randn(3, 4)}, {"Ix": idx}, fn)


@pytest.mark.parametrize("op, reduction, idx", [
    ("ScatterElements", "max", np.array([[0, 1]])),
    ("ScatterElements", "mul", np.array([[0, 0]])),  # duplicates: updates refused
    ("ScatterND", "min", np.array([[0, 1]])),
])
def test_scatter_refusals(op, reduction, idx):
    from gradcheck import loss_model
    kwargs = {"axis": 1} if op == "ScatterElements" else {}
    model, _ = loss_model([node(op, ["D", "I", "U"], reduction=reduction, **kwargs)],
                          {"D": randn(2, 3), "U": randn(1, 2) if op == "ScatterElements"
                           else randn(1)}, {"I": idx})
    with pytest.raises(NotImplementedError, match=f"{op}.*{reduction}|{reduction}.*{op}"):
        build_gradient(model, wrt=["D", "U"])
    if reduction == "mul":  # the data alone is fine
        build_gradient(model, wrt=["D"])


def test_scatter_mul_dynamic_indices_refused_for_updates():
    from gradcheck import loss_model
    model, feeds = loss_model(
        [node("ScatterElements", ["D", "I", "U"], axis=0, reduction="mul")],
        {"D": randn(3, 2), "U": randn(1, 2)}, inputs={"I": np.array([[2, 0]])})
    with pytest.raises(NotImplementedError, match="constant indices"):
        build_gradient(model, wrt=["U"])


@pytest.mark.parametrize("batch_dims, dshape, idx", [
    (0, (3, 4), np.array([[1], [1], [-1]])),  # rows, repeated
    (0, (3, 4), np.array([[1, 2], [1, 2], [0, -1]])),  # elements, repeated
    (1, (2, 3, 4), np.array([[[1, 2], [1, 2]], [[0, 0], [2, -1]]])),
    (1, (2, 3, 4), np.array([[1], [2]])),
    (2, (2, 3, 4), np.array([[[1], [1], [3]], [[0], [2], [2]]])),
])
@pytest.mark.parametrize("opset", [13, 18])
def test_gather_nd(batch_dims, dshape, idx, opset):
    check_op([node("GatherND", ["D", "I"], batch_dims=batch_dims)], {"D": randn(*dshape)},
             consts={"I": idx}, opset=opset, float32=opset == 18)


def test_gather_nd_torch():
    idx = np.array([[1, 2], [1, 2], [0, 3]])
    _torch_check([node("GatherND", ["D", "Ix"])], {"D": randn(3, 4)}, {"Ix": idx},
                 lambda D, Ix: D[Ix[:, 0], Ix[:, 1]])


# ---------------------------------------------------------------- CumSum, Trilu, TopK
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis, shape", [(0, (4,)), (1, (2, 3, 2)), (-1, (3, 4))])
def test_cumsum(exclusive, reverse, axis, shape):
    check_op([node("CumSum", ["X", "A"], exclusive=exclusive, reverse=reverse)],
             {"X": randn(*shape)}, consts={"A": np.array(axis, dtype=I64)})


@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_torch(reverse):
    def fn(X, A):
        return torch.flip(torch.cumsum(torch.flip(X, [1]), 1), [1]) if reverse else \
            torch.cumsum(X, 1)
    _torch_check([node("CumSum", ["X", "A"], reverse=reverse)], {"X": randn(3, 4)},
                 {"A": np.array(1, dtype=I64)}, fn)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 0, 2])
@pytest.mark.parametrize("shape", [(3, 4), (2, 4, 3)])
def test_trilu(upper, k, shape):
    consts = None if k is None else {"K": np.array(k, dtype=I64)}
    inputs = ["X"] if k is None else ["X", "K"]
    check_op([node("Trilu", inputs, upper=upper)], {"X": randn(*shape)}, consts=consts,
             float32=shape == (3, 4))


@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_torch(upper):
    _torch_check([node("Trilu", ["X", "K"], upper=upper)], {"X": randn(2, 3, 4)},
                 {"K": np.array(1, dtype=I64)},
                 lambda X, K: torch.triu(X, 1) if upper else torch.tril(X, 1))


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("axis, shape", [(0, (4, 3)), (-1, (2, 5)), (1, (2, 4, 3))])
def test_topk(largest, sorted_, axis, shape):
    check_op([node("TopK", ["X", "K"], out=["Y", "Ind"], axis=axis, largest=largest,
                   sorted=sorted_)], {"X": randn(*shape)}, consts={"K": np.array([2])})


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_torch(largest):
    _torch_check([node("TopK", ["X", "K"], out=["Y", "Ind"], axis=1, largest=largest)],
                 {"X": randn(3, 5)}, {"K": np.array([3])},
                 lambda X, K: torch.topk(X, 3, dim=1, largest=bool(largest)).values)


def test_topk_indices_output_used_downstream():
    """The indices output (int64) carries no gradient, even when it is used."""
    nodes = [node("TopK", ["X", "K"], out=["V", "Ind"], axis=1),
             node("GatherElements", ["W", "Ind"], "G", axis=1),
             node("Mul", ["V", "G"])]
    check_op(nodes, {"X": randn(2, 5), "W": randn(2, 5)}, consts={"K": np.array([2])})


# ---------------------------------------------------------------- ReduceProd
def _with_zeros():
    x = away(3, 4)
    x[0, 1] = 0  # one zero in row 0 and in column 1 ...
    x[1, 1] = x[1, 2] = 0  # ... two in row 1, three in column 1 with x[2, 1]
    x[2, 1] = 0
    return x


@pytest.mark.parametrize("axes", [None, [0], [1], [-1, 0]])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_prod(axes, keepdims, opset):
    if axes is None:
        nodes, consts = [node("ReduceProd", ["X"], keepdims=keepdims)], None
    elif opset < 18:
        nodes, consts = [node("ReduceProd", ["X"], keepdims=keepdims, axes=axes)], None
    else:
        nodes = [node("ReduceProd", ["X", "A"], keepdims=keepdims)]
        consts = {"A": np.array(axes, dtype=I64)}
    for x in (away(3, 4), _with_zeros()):
        check_op(nodes, {"X": x}, consts=consts, opset=opset, float32=axes == [1])


def test_reduce_prod_noop_and_single_zero():
    check_op([node("ReduceProd", ["X"], noop_with_empty_axes=1)], {"X": _with_zeros()})
    x = away(5)
    x[2] = 0
    grads = check_op([node("ReduceProd", ["X"], keepdims=0)], {"X": x}, float32=False)
    # the gradient at a single zero is the product of the others; 0 elsewhere
    np.testing.assert_allclose(grads["X"] / random_r(x), np.where(
        np.arange(5) == 2, np.prod(np.delete(x, 2)), 0.0))


def random_r(x):
    """The R check_op multiplies a scalar output with (seed 1)."""
    return np.random.default_rng(1).standard_normal(())


@pytest.mark.parametrize("dim", [0, 1])
def test_reduce_prod_torch(dim):
    _torch_check([node("ReduceProd", ["X", "A"], keepdims=0)], {"X": _with_zeros()},
                 {"A": np.array([dim], dtype=I64)}, lambda X, A: torch.prod(X, dim))


# ---------------------------------------------------------------- batched MatMul
@pytest.mark.parametrize("sa, sb", [
    ((2, 3, 4, 5), (2, 3, 5, 4)),  # q @ k^T per batch and head
    ((2, 1, 4, 5), (1, 3, 5, 2)),  # broadcast batch and head
    ((2, 3, 4, 5), (5, 2)),  # shared projection
    ((3, 4, 5), (2, 1, 5, 4)),  # a rank-3 operand against a rank-4 one
])
def test_batched_matmul_torch(sa, sb):
    _torch_check([node("MatMul", ["A", "B"])], {"A": randn(*sa), "B": randn(*sb)}, None,
                 lambda A, B: A @ B)


def test_batched_matmul_dynamic_batch():
    _dynamic_check([node("MatMul", ["X", "W"])], {"W": randn(1, 2, 5, 3)},
                   {"X": randn(3, 2, 4, 5)}, {"X": ["N", 2, "T", 5]}, lambda W, X: X @ W)


# ---------------------------------------------------------------- torch exports
def _export(module, args, dynamo, dynamic):
    """ONNX model (float64) of ``module`` by one of torch's exporters."""
    buf = io.BytesIO()
    names = [f"in{k}" for k in range(len(args))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            shapes = tuple({d: torch.export.Dim(f"d{k}_{d}") for d in dyn}
                           for k, dyn in enumerate(dynamic))
            prog = torch.onnx.export(module, args, dynamo=True, optimize=False,
                                     input_names=names, output_names=["Y"],
                                     dynamic_shapes=shapes, verbose=False)
            return prog.model_proto
        torch.onnx.export(module, args, buf, dynamo=False, input_names=names,
                          output_names=["Y"], opset_version=18, do_constant_folding=False,
                          dynamic_axes={n: list(d) for n, d in zip(names, dynamic)})
    return onnx.load_from_string(buf.getvalue())


def _grads_vs_torch(module, args, dynamo, dynamic, more_args=()):
    """ortlearn's gradients of sum(Y * R) of the exported model vs torch autograd.

    ``more_args``: other inputs of other shapes run on the same exported model
    (dynamic axes).
    """
    module = module.double()
    model = _export(module, args, dynamo, dynamic)
    params = dict(module.named_parameters())
    inits = {i.name for i in model.graph.initializer}
    assert set(params) <= inits, (set(params), inits)
    r_info = onnx.ValueInfoProto()
    r_info.CopyFrom(model.graph.output[0])  # R has the (dynamic) shape of Y
    r_info.name = "R"
    model.graph.input.append(r_info)
    model.graph.node.extend([helper.make_node("Mul", ["Y", "R"], ["YR"]),
                             helper.make_node("ReduceSum", ["YR"], ["loss"], keepdims=0)])
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("loss", TensorProto.DOUBLE, []))
    grad_model = build_gradient(finalize_model(model, check=False), wrt=list(params))
    sess = session(grad_model)
    rng = np.random.default_rng(3)
    for batch in (args,) + tuple(more_args):
        y = module(*batch)
        r = torch.tensor(rng.standard_normal(tuple(y.shape)))
        module.zero_grad()
        (y * r).sum().backward()
        feeds = {f"in{k}": a.numpy() for k, a in enumerate(batch)}
        feeds["R"] = r.numpy()
        out = dict(zip([o.name for o in grad_model.graph.output], sess.run(None, feeds)))
        for name, p in params.items():
            np.testing.assert_allclose(out[f"{name}_grad"], p.grad.numpy(), rtol=1e-6,
                                       atol=1e-9, err_msg=name)
    return model


class _Embed(torch.nn.Module):
    def __init__(self, padding_idx):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(7, 3, padding_idx=padding_idx)

    def forward(self, ids):
        return self.emb(ids)


EMBED_IDS = torch.tensor([[0, 3, 3, 1], [3, 0, 6, 0]])  # repeated indices, padding rows


def test_embedding_repeated_indices():
    _grads_vs_torch(_Embed(None), (EMBED_IDS,), False, [(0, 1)],
                    more_args=[(torch.tensor([[5, 5, 5]]),)])


def test_embedding_padding_idx_torchscript_needs_the_caller():
    """The TorchScript exporter writes a bare Gather: padding_idx is lost, the padding
    row gets a gradient, unless the caller marks the node (``mark_padding_idx``)."""
    module = _Embed(0).double()
    with pytest.raises(AssertionError, match="emb.weight"):
        _grads_vs_torch(module, (EMBED_IDS,), False, [(0, 1)])
    model = _export(module, (EMBED_IDS,), False, [(0, 1)])
    gather = next(n for n in model.graph.node if n.op_type == "Gather")
    assert not gather.metadata_props
    assert mark_padding_idx(model, gather.input[0], 0) == [gather.name or gather.output[0]]
    model.graph.node.extend([helper.make_node("ReduceSum", ["Y"], ["loss"], keepdims=0)])
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("loss", TensorProto.DOUBLE, []))
    grad_model = build_gradient(model, wrt=["emb.weight"])
    grad = session(grad_model).run(None, {"in0": EMBED_IDS.numpy()})[1]
    module.zero_grad()
    module.emb(EMBED_IDS).sum().backward()
    np.testing.assert_allclose(grad, module.emb.weight.grad.numpy())
    assert not grad[0].any() and grad[3].all()


def test_embedding_scale_grad_by_freq_refused():
    from gradcheck import loss_model
    model, _ = loss_model([node("Gather", ["W", "I"])], {"W": randn(4, 2)},
                          {"I": np.array([1, 1])})
    gather = next(n for n in model.graph.node if n.op_type == "Gather")
    gather.metadata_props.add(key="pkg.torch.onnx.fx_node", value=(
        "%embedding : [num_users=1] = call_function[target=torch.ops.aten.embedding.default]"
        "(args = (%p_emb_weight, %x, 1, True), kwargs = {})"))
    with pytest.raises(NotImplementedError, match="scale_grad_by_freq"):
        build_gradient(model, wrt=["W"])


class _Heads(torch.nn.Module):
    """``x.view(b, t, h, d)`` with b and t read from the input, as attention does."""

    def __init__(self, heads=2, dim=4):
        super().__init__()
        torch.manual_seed(0)
        self.heads = heads
        self.q = torch.nn.Linear(heads * dim, heads * dim)
        self.k = torch.nn.Linear(heads * dim, heads * dim)
        self.v = torch.nn.Parameter(torch.randn(heads * dim, heads * dim))

    def split(self, x):
        b, t, c = x.shape
        return x.view(b, t, self.heads, c // self.heads).transpose(1, 2)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(x @ self.v)
        scores = q @ k.transpose(-1, -2)  # (b, h, t, t)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)  # causal, from the sequence length
        # (masked_fill exports a CastLike of the fill value like the scores, which has
        # no gradient rule yet: an additive mask instead)
        att = torch.softmax(scores - 1e9 * mask.to(x.dtype), dim=-1)
        out = (att @ v).transpose(1, 2).reshape(b, t, c)
        positions = torch.arange(t, dtype=x.dtype).unsqueeze(-1)  # Range from Shape
        return torch.cat([out, out[:, : t // 2] * positions[: t // 2]], dim=1)


class _Encoder(torch.nn.Module):
    """Token embedding with a padding row, then the attention heads."""

    def __init__(self, padding_idx=0):
        super().__init__()
        torch.manual_seed(1)
        self.emb = torch.nn.Embedding(7, 8, padding_idx=padding_idx)
        self.heads = _Heads()

    def forward(self, ids):
        return self.heads(self.emb(ids))


def _check_views(model):
    ops = {n.op_type for n in model.graph.node}
    assert {"Shape", "Reshape", "Range"} <= ops


def test_dynamic_view_attention_torchscript():
    """Reshape/Expand/Slice/Concat/Gather fed by Shape->Gather->Concat chains."""
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    _check_views(_grads_vs_torch(
        _Heads(), (x,), False, [(0, 1)],
        more_args=[(torch.randn(3, 6, 8, dtype=torch.float64),),
                   (torch.randn(1, 3, 8, dtype=torch.float64),)]))


def test_dynamo_embedding_padding_idx_and_dynamic_views():
    """One dynamo export (they are slow): the exporter keeps padding_idx in the Gather
    node's metadata, so row 0 gets no gradient, as in torch (repeated indices add up);
    the views read the batch and sequence lengths at run time."""
    ids = torch.tensor([[0, 3, 3, 1], [3, 0, 6, 0]])
    model = _grads_vs_torch(_Encoder(), (ids,), True, [(0, 1)],
                            more_args=[(torch.tensor([[5, 0, 5, 2, 0, 1]]),)])
    _check_views(model)
    gather = next(n for n in model.graph.node if n.op_type == "Gather")
    assert "aten.embedding" in {p.key: p.value for p in gather.metadata_props}.get(
        "pkg.torch.onnx.fx_node", "")


# ---------------------------------------------------------------- CastLike (masked_fill)
def test_cast_like_finite_differences():
    """CastLike(x, like): x gets the gradient, like none (only its type counts)."""
    nodes = [node("CastLike", ["X", "L"], "C"), node("Mul", ["C", "L"])]
    check_op(nodes, {"X": randn(2, 3), "L": randn(2, 3)}, opset=15)


@pytest.mark.parametrize("opset", [15, 21])
def test_cast_like_gradient_has_the_input_type(opset):
    """A float32 X cast like a float64 value gets a float32 gradient: R, cast back."""
    from gradcheck import make_model
    r = randn(2, 3)
    nodes = [node("Constant", [], "D", value=helper.make_tensor("D", TensorProto.DOUBLE, [], [0.])),
             node("CastLike", ["X", "D"], "C"), node("Constant", [], "R", value=helper.make_tensor(
                 "R", TensorProto.DOUBLE, [2, 3], r.ravel())),
             node("Mul", ["C", "R"], "CR"), node("ReduceSum", ["CR"], "loss", keepdims=0)]
    model = make_model(nodes, [], [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])],
                       [onnx.numpy_helper.from_array(randn(2, 3).astype(np.float32), "X")],
                       opset=opset)
    grad = session(build_gradient(model, wrt=["X"])).run(None, {})[1]
    assert grad.dtype == np.float32
    np.testing.assert_array_equal(grad, r.astype(np.float32))


class _MaskedScores(torch.nn.Module):
    """Causal attention scores with ``masked_fill``, as transformers write them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.q = torch.nn.Linear(4, 4)

    def forward(self, x):
        t = x.shape[1]
        scores = self.q(x) @ x.transpose(-1, -2)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        return torch.softmax(scores.masked_fill(mask, -1e9), dim=-1)


def test_dynamo_masked_fill_matches_autograd():
    """The dynamo exporter writes masked_fill's value as CastLike(fill, scores)."""
    model = _grads_vs_torch(_MaskedScores(), (torch.randn(2, 3, 4, dtype=torch.float64),),
                            True, [(0, 1)],
                            more_args=[(torch.randn(1, 5, 4, dtype=torch.float64),)])
    assert "CastLike" in {n.op_type for n in model.graph.node}
