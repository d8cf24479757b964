"""Gradients of Conv and ConvTranspose: finite differences, torch autograd, onnxruntime.

onnxruntime has no float64 Conv or ConvTranspose: float64 runs in onnx's
reference evaluator, whose ConvTranspose is wrong for ``group`` > 1 with
more than one output channel per group and refuses ``output_shape`` with
explicit pads; ``gradcheck`` gives it ``reference_ops.ConvTranspose``, computed
by torch in float64 with onnxruntime's padding rules (checked against
onnxruntime in float32 below).
"""


import gradcheck
import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from gradcheck import (
    analytic_gradient,
    assert_close,
    check_op,
    loss_model,
    node,
    randn,
    random_weights_of,
    session,
)
from onnx import TensorProto, helper
from reference_ops import torch_conv_transpose

from ortlearn.autodiff import build_gradient

_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _weights(x_shape, w_shape, bias_channels):
    weights = {"X": randn(*x_shape), "W": randn(*w_shape)}
    if bias_channels:
        weights["B"] = randn(bias_channels)
    return weights


# ---------------------------------------------------------------- Conv: grid
# (x shape, w shape, attributes): strides that do not divide, SAME padding
# with odd totals, dilation with stride, asymmetric pads, groups.
CONV_CASES = [
    ((2, 2, 7), (3, 2, 3), {}),
    ((2, 2, 7), (3, 2, 3), {"strides": [2], "pads": [1, 0]}),
    ((1, 2, 8), (2, 2, 2), {"strides": [3], "pads": [0, 2]}),
    ((2, 2, 9), (2, 1, 3), {"strides": [2], "dilations": [2], "group": 2}),
    ((1, 3, 7), (3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2]}),
    ((1, 3, 7), (3, 3, 2), {"auto_pad": "SAME_LOWER", "strides": [2]}),
    ((1, 2, 6), (4, 1, 3), {"auto_pad": "SAME_LOWER", "dilations": [2], "group": 2}),
    ((1, 2, 8), (2, 2, 3), {"auto_pad": "VALID", "strides": [3]}),
    ((2, 2, 5, 6), (2, 2, 3, 2), {"strides": [2, 1], "pads": [1, 0, 0, 1]}),
    ((1, 4, 5, 6), (4, 2, 2, 2), {"strides": [2, 3], "dilations": [1, 2], "group": 2,
                                  "pads": [1, 0, 0, 1]}),
    ((1, 3, 5, 5), (3, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),  # depthwise
    ((1, 2, 5, 4), (6, 1, 2, 2), {"group": 2, "strides": [2, 2]}),  # channel multiplier
    ((1, 2, 5, 5), (2, 2, 2, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 3],
                                  "dilations": [2, 1]}),
    ((1, 2, 6, 5), (2, 1, 3, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 2], "group": 2}),
    ((1, 2, 5, 4), (3, 2, 2, 2), {"auto_pad": "VALID", "strides": [2, 1]}),
    ((1, 2, 4, 3, 5), (2, 2, 2, 2, 2), {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]}),
    ((1, 2, 4, 4, 3), (2, 1, 2, 1, 2), {"group": 2, "dilations": [2, 1, 1],
                                        "auto_pad": "SAME_UPPER", "strides": [1, 2, 1]}),
]


def _id(case):
    x_shape, _, attrs = case
    return f"{len(x_shape) - 2}d-" + "-".join(f"{k}{v}" for k, v in attrs.items())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CONV_CASES, ids=_id)
def test_conv_finite_differences(case, bias):
    x_shape, w_shape, attrs = case
    weights = _weights(x_shape, w_shape, w_shape[0] if bias else 0)
    # onnxruntime refuses SAME padding with dilations: float64 only there.
    ort_runs = not (attrs.get("auto_pad", "").startswith("SAME")
                    and max(attrs.get("dilations", [1])) > 1)
    check_op([node("Conv", list(weights), **attrs)], weights, reference=True,
             float32=ort_runs)


# ---------------------------------------------------------------- ConvTranspose: grid
CONV_T_CASES = [
    ((2, 2, 4), (2, 3, 3), {}),
    ((1, 2, 4), (2, 2, 3), {"strides": [2], "pads": [1, 2]}),
    ((1, 2, 3), (2, 2, 2), {"strides": [3], "output_padding": [2], "pads": [0, 1]}),
    ((1, 2, 4), (2, 1, 3), {"strides": [2], "dilations": [2], "group": 2,
                            "output_padding": [1]}),
    ((1, 2, 3), (2, 2, 2), {"strides": [2], "dilations": [3], "output_padding": [1]}),
    ((1, 2, 4), (2, 2, 3), {"strides": [2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 4), (2, 2, 2), {"strides": [3], "auto_pad": "SAME_LOWER", "output_padding": [1]}),
    ((1, 2, 4), (2, 2, 3), {"strides": [2], "auto_pad": "VALID"}),
    ((1, 2, 4), (2, 2, 3), {"strides": [2], "output_shape": [8]}),
    ((1, 2, 4), (2, 2, 3), {"strides": [2], "output_shape": [7], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 4), (2, 2, 3), {"strides": [3], "output_shape": [14]}),  # past full: zeros
    ((1, 2, 3, 4), (2, 2, 2, 3), {"strides": [2, 1], "pads": [1, 0, 0, 2],
                                  "output_padding": [1, 0]}),
    ((1, 4, 3, 3), (4, 2, 2, 2), {"strides": [2, 2], "dilations": [1, 2], "group": 2}),
    ((1, 3, 3, 4), (3, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1], "strides": [2, 1]}),
    ((1, 2, 3, 3), (2, 2, 3, 2), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 3, 3), (2, 2, 3, 2), {"strides": [2, 2], "output_shape": [6, 7],
                                  "auto_pad": "SAME_UPPER"}),
    ((1, 2, 2, 3, 2), (2, 2, 2, 2, 2), {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1],
                                        "output_padding": [1, 0, 0]}),
    ((1, 2, 2, 2, 3), (2, 1, 2, 1, 2), {"group": 2, "strides": [2, 1, 1],
                                        "auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CONV_T_CASES, ids=_id)
def test_conv_transpose_finite_differences(case, bias):
    x_shape, w_shape, attrs = case
    weights = _weights(x_shape, w_shape, w_shape[1] * attrs.get("group", 1) if bias else 0)
    check_op([node("ConvTranspose", list(weights), **attrs)], weights, reference=True)


def _run(op, attrs, feeds, reference=False):
    nodes = [node(op, list(feeds), **attrs)]
    elem = TensorProto.DOUBLE if reference else TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(k, elem, v.shape) for k, v in feeds.items()]
    model = gradcheck.make_model(nodes, inputs, [helper.make_tensor_value_info(
        "Y", elem, None)])
    return session(model, reference).run(None, feeds)[0]


@pytest.mark.parametrize("case", CONV_T_CASES, ids=_id)
def test_torch_conv_transpose_follows_onnxruntime(case):
    """The float64 ConvTranspose the tests use computes what onnxruntime does."""
    x_shape, w_shape, attrs = case
    feeds = _weights(x_shape, w_shape, w_shape[1] * attrs.get("group", 1))
    expected = _run("ConvTranspose", attrs, {k: v.astype(np.float32) for k, v in feeds.items()})
    got = _run("ConvTranspose", attrs, feeds, reference=True)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- torch autograd
def _torch_grads(fn, weights, r):
    tensors = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
               for k, v in weights.items()}
    loss = (fn(tensors) * torch.from_numpy(r)).sum()
    loss.backward()
    return {k: t.grad.numpy() for k, t in tensors.items()}


def _compare_with_torch(op, attrs, weights, fn):
    model, feeds = loss_model([node(op, list(weights), **attrs)], weights, reference=True)
    grads, _ = analytic_gradient(model, feeds, list(weights), reference=True)
    expected = _torch_grads(fn, weights, random_weights_of(model))
    for name in weights:
        assert_close(grads[name], expected[name])


def _torch_pad(x, begins, ends):
    widths = []
    for b, e in zip(reversed(begins), reversed(ends)):
        widths += [b, e]
    return F.pad(x, widths)


TORCH_CONV_CASES = [
    ((2, 3, 9), (4, 3, 3), [2], [1], [1, 2], 1),
    ((2, 4, 8), (4, 1, 3), [3], [2], [2, 0], 4),  # depthwise
    ((2, 4, 6, 7), (6, 2, 3, 2), [2, 1], [1, 2], [1, 0, 2, 1], 2),
    ((1, 3, 7, 6), (6, 1, 3, 3), [2, 2], [1, 1], [1, 1, 1, 1], 3),  # channel multiplier
    ((1, 2, 5, 4, 6), (4, 2, 2, 3, 2), [2, 1, 3], [1, 2, 1], [0, 1, 1, 1, 0, 0], 1),
]


@pytest.mark.parametrize("x_shape, w_shape, strides, dilations, pads, group",
                         TORCH_CONV_CASES)
def test_conv_matches_torch(x_shape, w_shape, strides, dilations, pads, group):
    k = len(strides)
    weights = _weights(x_shape, w_shape, w_shape[0])
    attrs = {"strides": strides, "dilations": dilations, "pads": pads, "group": group}

    def fn(t):
        x = _torch_pad(t["X"], pads[:k], pads[k:])
        return _CONV[k](x, t["W"], t["B"], stride=strides, dilation=dilations, groups=group)

    _compare_with_torch("Conv", attrs, weights, fn)


def test_conv_same_upper_matches_torch_same():
    """torch's padding='same' (stride 1) puts the odd pad at the end: SAME_UPPER."""
    weights = _weights((2, 2, 6, 5), (3, 2, 2, 3), 3)
    attrs = {"auto_pad": "SAME_UPPER", "dilations": [3, 1]}
    _compare_with_torch("Conv", attrs, weights, lambda t: F.conv2d(
        t["X"], t["W"], t["B"], padding="same", dilation=(3, 1)))


TORCH_CONV_T_CASES = [
    ((2, 3, 4), (3, 2, 3), [2], [1], [1], [1], 1),
    ((2, 4, 3, 4), (4, 3, 3, 2), [2, 3], [1, 2], [1, 0], [1, 2], 2),
    ((1, 3, 3, 3), (3, 1, 3, 3), [2, 2], [1, 1], [1, 1], [1, 0], 3),  # depthwise
    ((1, 2, 2, 3, 2), (2, 2, 2, 2, 3), [2, 1, 2], [1, 2, 1], [0, 1, 1], [1, 0, 1], 1),
]


@pytest.mark.parametrize("x_shape, w_shape, strides, dilations, padding, out_pad, group",
                         TORCH_CONV_T_CASES)
def test_conv_transpose_matches_torch(x_shape, w_shape, strides, dilations, padding, out_pad,
                                      group):
    k = len(strides)
    weights = _weights(x_shape, w_shape, w_shape[1] * group)
    attrs = {"strides": strides, "dilations": dilations, "pads": padding * 2,
             "output_padding": out_pad, "group": group}
    _compare_with_torch("ConvTranspose", attrs, weights, lambda t: _CONV_T[k](
        t["X"], t["W"], t["B"], stride=strides, padding=padding, output_padding=out_pad,
        groups=group, dilation=dilations))


# ---------------------------------------------------------------- symbolic dimensions
def _square_loss_model(op, attrs, x_dims, weights):
    """``loss = ReduceSum(Y * Y) / 2`` of one node, X a float32 input of ``x_dims``."""
    nodes = [node(op, ["X"] + list(weights), **attrs), node("Mul", ["Y", "Y"], "YY"),
             node("ReduceSum", ["YY"], "S", keepdims=0),
             helper.make_node("Constant", [], ["half"], value=onnx.numpy_helper.from_array(
                 np.array(0.5, dtype=np.float32))),
             node("Mul", ["S", "half"], "loss")]
    inits = [onnx.numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    return gradcheck.make_model(
        nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_dims)],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)


SYMBOLIC_CASES = [
    ("Conv", {"strides": [2, 2], "pads": [1, 0, 1, 1], "group": 2, "dilations": [1, 2]},
     (4, 2, 3, 2), ["N", 4, 7, 6], [(2, 4, 7, 6), (3, 4, 7, 6)]),
    ("Conv", {"auto_pad": "SAME_LOWER", "strides": [2, 3], "group": 4},
     (8, 1, 2, 3), ["N", 4, 5, 7], [(1, 4, 5, 7), (3, 4, 5, 7)]),
    # Dynamic spatial dimensions: which rows the last window leaves out is
    # only known at run time.
    ("Conv", {"strides": [3, 2], "pads": [1, 2, 0, 1], "dilations": [2, 1], "group": 2},
     (4, 2, 2, 3), ["N", 4, "H", "W"], [(2, 4, 7, 6), (3, 4, 9, 5), (1, 4, 8, 8)]),
    ("ConvTranspose", {"strides": [2, 3], "pads": [1, 0, 0, 2], "output_padding": [1, 2],
                       "group": 2}, (4, 3, 3, 2), ["N", 4, "H", "W"],
     [(2, 4, 3, 4), (3, 4, 4, 2)]),
    ("ConvTranspose", {"strides": [2, 2], "output_shape": [9, 8], "group": 2},
     (4, 1, 3, 2), ["N", 4, 4, 4], [(2, 4, 4, 4), (1, 4, 4, 4)]),
]


@pytest.mark.parametrize("op, attrs, w_shape, x_dims, x_shapes", SYMBOLIC_CASES)
def test_symbolic_dimensions_in_onnxruntime(op, attrs, w_shape, x_dims, x_shapes):
    """One float32 gradient model, several batch (and spatial) sizes, against torch."""
    group = attrs.get("group", 1)
    out_channels = w_shape[0] if op == "Conv" else w_shape[1] * group
    weights = {"W": randn(*w_shape), "B": randn(out_channels)}
    grad_model = build_gradient(_square_loss_model(op, attrs, x_dims, weights),
                                wrt=["W", "B", "X"])
    onnx.checker.check_model(grad_model, full_check=True)
    sess = session(grad_model)
    k = len(w_shape) - 2
    for x_shape in x_shapes:
        x = randn(*x_shape)
        got = sess.run(None, {"X": x.astype(np.float32)})

        def fn(t, x_shape=x_shape):
            if op == "ConvTranspose":
                return torch_conv_transpose(
                    t["X"], t["W"], t["B"], attrs.get("strides"), None, group,
                    attrs.get("output_padding"), attrs.get("pads"), "NOTSET",
                    attrs.get("output_shape"))
            pads = attrs.get("pads")
            if pads is None:  # SAME_LOWER: the odd pad first
                pads = [0] * (2 * k)
                for i, (n, s, kk) in enumerate(zip(x_shape[2:], attrs["strides"],
                                                   w_shape[2:])):
                    total = max(0, (-(-n // s) - 1) * s + kk - n)
                    pads[i], pads[i + k] = total - total // 2, total // 2
            return _CONV[k](_torch_pad(t["X"], pads[:k], pads[k:]), t["W"], t["B"],
                            stride=attrs["strides"], dilation=attrs.get("dilations", 1),
                            groups=group)

        tensors = {"X": x, **weights}
        tw = {k_: torch.tensor(v, requires_grad=True) for k_, v in tensors.items()}
        y = fn(tw)
        loss = (y * y).sum() / 2
        loss.backward()
        np.testing.assert_allclose(got[0], loss.item(), rtol=1e-4)
        for name, grad in zip(["W", "B", "X"], got[1:]):
            assert grad.shape == tensors[name].shape
            expected = tw[name].grad.numpy()
            assert_close(grad, expected, rtol=1e-4)


# ---------------------------------------------------------------- refusals, needs, opsets
@pytest.mark.parametrize("op, attrs, word", [
    ("Conv", {"auto_pad": "SAME_UPPER"}, "auto_pad='SAME_UPPER'"),
    ("ConvTranspose", {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, "auto_pad='SAME_LOWER'"),
    ("ConvTranspose", {"output_shape": [9, 9], "strides": [2, 2]}, "output_shape"),
])
def test_padding_that_needs_spatial_dimensions_is_refused_when_they_are_dynamic(op, attrs,
                                                                                word):
    model = _square_loss_model(op, attrs, ["N", 2, "H", "W"], {"W": randn(2, 2, 3, 3)})
    model.graph.node[0].name = "conv7"
    with pytest.raises(ValueError, match=rf"{op} node 'conv7'.*{word}.*static spatial"):
        build_gradient(model, wrt=["W"])


@pytest.mark.parametrize("op, wrt, convs, transposes", [
    ("Conv", ["W"], 1, 0), ("Conv", ["X"], 0, 1), ("Conv", ["B"], 0, 0),
    ("ConvTranspose", ["W"], 1, 0), ("ConvTranspose", ["X"], 1, 0),
    ("ConvTranspose", ["B"], 0, 0),
])
def test_only_the_gradients_needed_are_built(op, wrt, convs, transposes):
    weights = {"W": randn(2, 2, 3, 3), "B": randn(2)}
    grad_model = build_gradient(_square_loss_model(op, {"strides": [2, 2]}, ["N", 2, 5, 5],
                                                   weights), wrt=wrt)
    backward = [n.op_type for n in grad_model.graph.node[5:]]
    assert (backward.count("Conv"), backward.count("ConvTranspose")) == (convs, transposes)


@pytest.mark.parametrize("opset", [13, 22])
@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_opsets(op, opset):
    attrs = {"strides": [2], "pads": [1, 0], "group": 2}
    weights = _weights((1, 4, 5), (4, 2, 3), 4)
    check_op([node(op, list(weights), **attrs)], weights, reference=True, opset=opset)
