"""Gradients of pooling and resampling: finite differences, and torch autograd in float64."""

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from gradcheck import (
    analytic_gradient,
    assert_close,
    check_op,
    const_node,
    loss_model,
    node,
    numeric_gradient,
    randn,
    random_weights_of,
    session,
)
from onnx import TensorProto, helper, numpy_helper

from ortlearn.autodiff import build_gradient


def _ints(values):
    return np.asarray(values, dtype=np.int64)


def _scales(values):
    """A float32 Constant node (check_op would cast float constants to float64)."""
    return const_node("scales", np.asarray(values, dtype=np.float32))


def ortlearn_grad(nodes, x, consts=None, opset=18, input_dims=None, reference=False):
    """Gradient of ``sum(Y * R)`` w.r.t. the graph input X, and R."""
    model, feeds = loss_model(nodes, {}, consts, {"X": x}, opset=opset,
                              input_dims=input_dims, reference=reference)
    grads, _ = analytic_gradient(model, feeds, ["X"], reference=reference)
    return grads["X"], random_weights_of(model), model, feeds


def torch_grad(fn, x, r):
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    (fn(t) * torch.tensor(r)).sum().backward()
    return t.grad.numpy()


def compare_torch(nodes, fn, x, consts=None, opset=18, reference=False):
    grad, r, _, _ = ortlearn_grad(nodes, x, consts, opset, reference=reference)
    assert_close(grad, torch_grad(fn, x, r))
    return grad


def check_dynamic(nodes, x, dims, consts=None, opset=18, reference=False):
    """Gradient w.r.t. a graph input declared with symbolic ``dims``, against FD."""
    grad, _, model, feeds = ortlearn_grad(nodes, x, consts, opset, {"X": dims}, reference)
    assert_close(grad, numeric_gradient(model, feeds, ["X"], reference=reference)["X"])


def exported(module, x, opset=17):
    """The ONNX graph torch's TorchScript exporter writes for ``module`` (batch dynamic)."""
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated
        torch.onnx.export(module, torch.tensor(x), f, dynamo=False, opset_version=opset,
                          input_names=["X"], output_names=["Y"], dynamic_axes={"X": {0: "N"}})
    return onnx.load_from_string(f.getvalue())


def compare_exported(module, x, opset=17, reference=False):
    """Export ``module`` (float64), differentiate ``sum(Y * R)`` and compare with torch."""
    module = module.double()
    model = exported(module, x, opset)
    r = np.random.default_rng(3).standard_normal(module(torch.tensor(x)).shape)
    graph = model.graph
    graph.node.extend([
        helper.make_node("Constant", [], ["R"], value=numpy_helper.from_array(r, "R")),
        helper.make_node("Mul", ["Y", "R"], ["YR"]),
        helper.make_node("ReduceSum", ["YR"], ["loss"], keepdims=0)])
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("loss", TensorProto.DOUBLE, []))
    grad_model = build_gradient(model, wrt=["X"])
    got = session(grad_model, reference).run(None, {"X": x})[1]
    assert_close(got, torch_grad(module, x, r))
    return grad_model


# ---------------------------------------------------------------- MaxPool
MAXPOOL_CASES = [
    ((2, 3, 7), dict(kernel_shape=[3])),
    ((1, 2, 8), dict(kernel_shape=[2], strides=[2], pads=[1, 1])),
    ((1, 2, 9), dict(kernel_shape=[3], dilations=[2], ceil_mode=1, strides=[2])),
    ((2, 2, 5, 6), dict(kernel_shape=[2, 2])),
    ((1, 2, 5, 6), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])),
    ((1, 2, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ((1, 1, 7, 7), dict(kernel_shape=[2, 3], dilations=[2, 2], strides=[1, 2])),
    ((1, 2, 5, 6), dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 2, 5, 6), dict(kernel_shape=[2, 3], auto_pad="SAME_LOWER")),
    ((1, 2, 5, 6), dict(kernel_shape=[2, 2], auto_pad="VALID", strides=[2, 2])),
    ((1, 2, 4, 5, 4), dict(kernel_shape=[2, 2, 2])),
    ((1, 1, 5, 5, 4), dict(kernel_shape=[3, 2, 2], strides=[2, 2, 1], pads=[1, 0, 0, 1, 1, 1],
                           ceil_mode=1)),
]


@pytest.mark.parametrize("shape, attrs", MAXPOOL_CASES)
@pytest.mark.parametrize("indices", [False, True])
def test_max_pool(shape, attrs, indices):
    out = ["Y", "I"] if indices else "Y"
    check_op([node("MaxPool", ["X"], out=out, **attrs)], {"X": randn(*shape)},
             float32=not indices)


@pytest.mark.parametrize("shape, kernel", [((1, 2, 5, 6), [2, 2]), ((2, 1, 5, 4), [3, 2]),
                                           ((1, 2, 3, 4, 5), [2, 2, 2])])
def test_max_pool_storage_order(shape, kernel):
    # column-major Indices, exposed by the model: the gradient converts them
    check_op([node("MaxPool", ["X"], out=["Y", "I"], kernel_shape=kernel, storage_order=1)],
             {"X": randn(*shape)})


@pytest.mark.parametrize("opset", [13, 22])
@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 2], strides=[1, 2], pads=[1, 0, 1, 1]),
                                   dict(kernel_shape=[2, 2], strides=[2, 2])])
def test_max_pool_opsets(opset, attrs):
    # opset 13: repeated Indices (overlapping windows) add up without ScatterElements' reduction
    check_op([node("MaxPool", ["X"], **attrs)], {"X": randn(1, 2, 5, 4)}, opset=opset)


def test_max_pool_adds_indices_output():
    model, _ = loss_model([node("MaxPool", ["X"], kernel_shape=[2, 2])], {"X": randn(1, 1, 4, 4)})
    grad_model = build_gradient(model, wrt=["X"])
    pool = next(n for n in grad_model.graph.node if n.op_type == "MaxPool")
    assert len(pool.output) == 2 and pool.output[1]


def test_max_pool_dynamic_batch():
    check_dynamic([node("MaxPool", ["X"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
                  randn(2, 3, 5, 5), ["N", 3, "H", "W"])


@pytest.mark.parametrize("fn, attrs, shape", [
    (lambda t: F.max_pool1d(t, 3, 2, 1, ceil_mode=True),
     dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1), (2, 2, 8)),
    (lambda t: F.max_pool2d(t, 2), dict(kernel_shape=[2, 2], strides=[2, 2]), (2, 3, 6, 5)),
    (lambda t: F.max_pool2d(t, 3, 1, 1), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
     (1, 2, 5, 5)),
    (lambda t: F.max_pool2d(t, 3, 2, 1, dilation=2, ceil_mode=True),
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], dilations=[2, 2], ceil_mode=1),
     (1, 2, 8, 7)),
    (lambda t: F.max_pool2d(t, (2, 3), (1, 2)), dict(kernel_shape=[2, 3], strides=[1, 2]),
     (1, 1, 5, 7)),
    (lambda t: F.max_pool3d(t, 2, 1, 1, ceil_mode=True),
     dict(kernel_shape=[2, 2, 2], pads=[1] * 6, ceil_mode=1), (1, 2, 3, 4, 3)),
    (lambda t: F.max_pool3d(t, 2, 2, dilation=(1, 2, 1)),
     dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2], dilations=[1, 2, 1]), (1, 1, 4, 6, 4)),
])
@pytest.mark.parametrize("ties", [False, True])
def test_max_pool_torch(fn, attrs, shape, ties):
    # small integers: many ties; torch and onnxruntime both pick the first maximum
    x = np.random.default_rng(5).integers(0, 3, shape).astype(float) if ties else randn(*shape)
    compare_torch([node("MaxPool", ["X"], **attrs)], fn, x)


# ---------------------------------------------------------------- AveragePool
AVGPOOL_CASES = [
    ((2, 2, 7), dict(kernel_shape=[3])),
    ((1, 2, 8), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((1, 2, 8), dict(kernel_shape=[3], strides=[2], pads=[1, 2], ceil_mode=1)),
    ((1, 2, 5, 6), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 2, 5, 6), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])),
    ((1, 1, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ((1, 2, 5, 6), dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 2, 5, 6), dict(kernel_shape=[2, 3], auto_pad="SAME_LOWER")),
    ((1, 2, 5, 6), dict(kernel_shape=[2, 2], auto_pad="VALID", strides=[2, 1])),
    ((1, 1, 4, 5, 4), dict(kernel_shape=[2, 3, 2], pads=[0, 1, 1, 1, 1, 0])),
    ((1, 1, 5, 4, 3), dict(kernel_shape=[3, 2, 2], strides=[2, 2, 1], ceil_mode=1)),
]


@pytest.mark.parametrize("shape, attrs", AVGPOOL_CASES)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(shape, attrs, include_pad):
    nodes = [node("AveragePool", ["X"], count_include_pad=include_pad, **attrs)]
    # float64 in onnx's reference evaluator; float32 against onnxruntime's own
    # forward (the op is linear: finite differences are exact up to rounding)
    check_op(nodes, {"X": randn(*shape)}, reference=True, float32=False)
    check_op(nodes, {"X": randn(*shape)}, dtype=np.float32)


@pytest.mark.parametrize("shape, attrs", [
    ((1, 2, 9), dict(kernel_shape=[3], dilations=[2])),
    ((1, 1, 7, 8), dict(kernel_shape=[2, 3], dilations=[2, 2], strides=[2, 1], pads=[1, 1, 0, 2])),
])
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_dilations(shape, attrs, include_pad):
    nodes = [node("AveragePool", ["X"], count_include_pad=include_pad, **attrs)]
    check_op(nodes, {"X": randn(*shape)}, opset=19, dtype=np.float32)


def test_average_pool_dynamic_batch():
    check_dynamic([node("AveragePool", ["X"], kernel_shape=[3, 3], strides=[2, 2],
                        pads=[1, 1, 1, 1], count_include_pad=1)],
                  randn(2, 3, 5, 5), ["N", "C", 5, 5], reference=True)


@pytest.mark.parametrize("kernel, stride, pad, ceil", [
    (2, 2, 0, False), (3, 2, 1, False), (3, 2, 1, True), ((3, 2), (2, 1), (1, 0), True)])
@pytest.mark.parametrize("include_pad", [False, True])
def test_average_pool_torch(kernel, stride, pad, ceil, include_pad):
    x = randn(2, 2, 7, 6)
    model = torch.nn.AvgPool2d(kernel, stride, pad, ceil_mode=ceil, count_include_pad=include_pad)
    compare_exported(model, x, reference=True)


# ---------------------------------------------------------------- global pools
@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 2, 3, 4), (2, 1, 2, 3, 2)])
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(shape, op):
    if op == "GlobalMaxPool" and len(shape) != 4:
        # onnx's reference evaluator reduces the wrong axes of a 1-D or 3-D
        # GlobalMaxPool: float32 in onnxruntime, on values far apart for the large step
        x = np.random.default_rng(4).permutation(np.prod(shape)).reshape(shape) * 0.1
        check_op([node(op, ["X"])], {"X": x}, dtype=np.float32)
        return
    check_op([node(op, ["X"])], {"X": randn(*shape)}, reference=True)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool_dynamic(op):
    check_dynamic([node(op, ["X"])], randn(2, 3, 3, 4), ["N", "C", "H", "W"], reference=True)


def test_global_pools_torch():
    x = randn(2, 3, 4, 5)
    compare_exported(torch.nn.AdaptiveAvgPool2d(1), x, reference=True)
    compare_torch([node("GlobalAveragePool", ["X"])], lambda t: F.adaptive_avg_pool2d(t, 1), x,
                  reference=True)


def test_global_max_pool_ties_torch():
    # ties: the first maximum gets the gradient, as torch's adaptive_max_pool2d(x, 1)
    x = np.random.default_rng(2).integers(0, 2, (2, 3, 3, 4)).astype(float)
    grad = compare_torch([node("GlobalMaxPool", ["X"])],
                         lambda t: F.adaptive_max_pool2d(t, 1), x, reference=True)
    assert np.count_nonzero(grad) == 6


# ---------------------------------------------------------------- Pad
PADS = [[1, 2, 0, 1], [0, 0, 2, 1], [1, 1, 1, 1], [-1, 1, 0, -1], [1, -1, -1, 2]]


@pytest.mark.parametrize("pads", PADS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("opset", [13, 18])
def test_pad(pads, mode, opset):
    x = randn(4, 5)
    check_op([node("Pad", ["X", "pads"], mode=mode)], {"X": x}, {"pads": _ints(pads)},
             opset=opset, float32=opset == 18)


@pytest.mark.parametrize("pads", [[1, 2, 0, 1], [3, 0, 2, 4], [-1, 1, 0, -1]])
def test_pad_wrap(pads):
    check_op([node("Pad", ["X", "pads"], mode="wrap")], {"X": randn(3, 4)},
             {"pads": _ints(pads)}, opset=19)


@pytest.mark.parametrize("pads", [[1, 2, 0, 1], [-1, 1, 2, 0]])
@pytest.mark.parametrize("opset", [13, 18])
def test_pad_constant_value(pads, opset):
    # a trainable constant: it gets the sum of the gradient of the padding
    check_op([node("Pad", ["X", "pads", "V"], mode="constant")],
             {"X": randn(3, 4), "V": randn()}, {"pads": _ints(pads)}, opset=opset)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("axes", [[1], [-1, 0], [2, 1]])
def test_pad_axes(mode, axes):
    pads = _ints([1, 0, -1, 1] if len(axes) == 2 else [2, 1])
    check_op([node("Pad", ["X", "pads", "", "axes"], mode=mode)], {"X": randn(2, 3, 4)},
             {"pads": pads, "axes": _ints(axes)}, opset=19)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_dynamic(mode):
    # pads computed at run time, batch dynamic
    nodes = [node("Pad", ["X", "pads"], mode=mode)]
    check_dynamic(nodes, randn(2, 3, 4), ["N", 3, "W"], {"pads": _ints([0, 0, 1, 0, 0, 2])})


@pytest.mark.parametrize("mode, pads", [
    ("constant", (1, 2, 0, 1)), ("reflect", (2, 1, 1, 2)), ("replicate", (1, 2, 2, 0)),
    ("constant", (-1, 2, 1, -1))])
def test_pad_torch(mode, pads):
    class Pad(torch.nn.Module):
        def forward(self, t):
            return F.pad(t, pads, mode=mode)
    compare_exported(Pad(), randn(2, 2, 4, 5))


# ---------------------------------------------------------------- Resize
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
TRANSFORMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]


@pytest.mark.parametrize("nearest_mode", NEAREST)
@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.5, 1.5]])
def test_resize_nearest(nearest_mode, transform, scales):
    # onnx's reference evaluator takes length * scale, not the output length, as
    # align_corners' resized length: scales here keep that product an integer
    check_op([_scales(scales),
              node("Resize", ["X", "", "scales"], mode="nearest", nearest_mode=nearest_mode,
                   coordinate_transformation_mode=transform)],
             {"X": randn(1, 2, 4, 4)}, reference=True, float32=False)


@pytest.mark.parametrize("transform", TRANSFORMS + ["half_pixel_symmetric"])
@pytest.mark.parametrize("shape, scales", [
    ((1, 2, 3, 4), [1, 1, 2, 2]), ((1, 1, 4, 4), [1, 1, 0.75, 1.5]), ((2, 1, 6), [1, 1, 1.5]),
    ((1, 1, 2, 4, 2), [1, 1, 2, 1.5, 2])])
def test_resize_linear(transform, shape, scales):
    check_op([_scales(scales), node("Resize", ["X", "", "scales"], mode="linear",
                                    coordinate_transformation_mode=transform)],
             {"X": randn(*shape)}, opset=19, reference=True, float32=False)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("transform", TRANSFORMS + ["half_pixel_symmetric"])
@pytest.mark.parametrize("shape, sizes", [((1, 2, 3, 4), [1, 2, 7, 5]),
                                          ((2, 1, 5, 4), [2, 1, 3, 4])])
def test_resize_onnxruntime(mode, transform, shape, sizes):
    # onnxruntime's own float32 forward (linear: finite differences are exact)
    check_op([node("Resize", ["X", "", "", "sizes"], mode=mode,
                   coordinate_transformation_mode=transform)],
             {"X": randn(*shape)}, {"sizes": _ints(sizes)}, opset=19, dtype=np.float32)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("transform", TRANSFORMS + ["half_pixel_symmetric"])
def test_resize_scales_onnxruntime(mode, transform):
    # scales whose product with the length is no integer: onnxruntime's output lengths
    check_op([_scales([1, 1, 1.5, 0.6]), node("Resize", ["X", "", "scales"], mode=mode,
                                              coordinate_transformation_mode=transform)],
             {"X": randn(2, 1, 3, 5)}, opset=19, dtype=np.float32)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_sizes_axes(policy, mode):
    check_op([node("Resize", ["X", "", "", "sizes"], mode=mode, axes=[3, 2],
                   keep_aspect_ratio_policy=policy)],
             {"X": randn(1, 2, 3, 4)}, {"sizes": _ints([6, 5])}, opset=19, dtype=np.float32)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_dynamic_batch(mode):
    check_dynamic([_scales([1, 1, 2, 1.5]), node("Resize", ["X", "", "scales"], mode=mode)],
                  randn(2, 2, 3, 3), ["N", "C", 3, 3], reference=True)


@pytest.mark.parametrize("kwargs", [
    dict(scale_factor=2, mode="nearest"), dict(size=(5, 7), mode="nearest"),
    dict(scale_factor=2, mode="bilinear", align_corners=False),
    dict(scale_factor=(1.5, 2), mode="bilinear", align_corners=True),
    dict(size=(5, 3), mode="bilinear", align_corners=False),
    dict(size=(2, 7), mode="bilinear", align_corners=True)])
def test_resize_torch(kwargs):
    class Up(torch.nn.Module):
        def forward(self, t):
            return F.interpolate(t, **kwargs)
    compare_exported(Up(), randn(2, 2, 3, 4), reference=True)


@pytest.mark.parametrize("align", [False, True])
def test_resize_trilinear_torch(align):
    class Up(torch.nn.Module):
        def forward(self, t):
            return F.interpolate(t, scale_factor=2, mode="trilinear", align_corners=align)
    compare_exported(Up(), randn(1, 2, 2, 3, 2), reference=True)


@pytest.mark.parametrize("transform", ["half_pixel", "pytorch_half_pixel", "asymmetric",
                                       "half_pixel_symmetric"])
@pytest.mark.parametrize("attrs", [{}, dict(cubic_coeff_a=-0.5), dict(exclude_outside=1)])
@pytest.mark.parametrize("shape, scales", [((1, 2, 4, 5), [1, 1, 2, 0.5]),
                                           ((1, 1, 3, 4), [1, 1, 4, 2])])
def test_resize_cubic(transform, attrs, shape, scales):
    """Keys' cubic convolution: the four inputs around each source coordinate, the edges
    read past the border or, with exclude_outside, dropped and the weights renormalised.
    onnx's reference evaluator computes the source coordinates in float32: scales and
    transformations here keep them exact (align_corners: the test below)."""
    check_op([_scales(scales), node("Resize", ["X", "", "scales"], mode="cubic",
                                    coordinate_transformation_mode=transform, **attrs)],
             {"X": randn(*shape)}, opset=19, reference=True, float32=False)


@pytest.mark.parametrize("transform", TRANSFORMS + ["half_pixel_symmetric"])
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_cubic_onnxruntime(transform, exclude_outside):
    # onnxruntime's own float32 bicubic forward, to sizes whose ratio is no simple fraction
    check_op([node("Resize", ["X", "", "", "sizes"], mode="cubic",
                   coordinate_transformation_mode=transform, exclude_outside=exclude_outside)],
             {"X": randn(2, 1, 5, 4)}, {"sizes": _ints([2, 1, 7, 3])}, opset=19,
             dtype=np.float32)


@pytest.mark.parametrize("align", [False, True])
def test_resize_bicubic_torch(align):
    class Up(torch.nn.Module):
        def forward(self, t):
            return F.interpolate(t, scale_factor=(2, 1.5), mode="bicubic", align_corners=align)
    compare_exported(Up(), randn(2, 2, 3, 4), reference=True)


@pytest.mark.parametrize("attrs, match", [
    (dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize"),
     "tf_crop_and_resize"),
    (dict(mode="linear", antialias=1), "antialias"),
    (dict(mode="cubic", antialias=1), "antialias"),
])
def test_resize_refused(attrs, match):
    roi = const_node("roi", np.asarray([0, 0, 0, 0, 1, 1, 1, 1], np.float32))
    model, _ = loss_model([_scales([1, 1, 0.5, 0.5]), roi,
                           node("Resize", ["X", "roi", "scales"], **attrs)],
                          {"X": randn(1, 1, 4, 4)}, opset=19, reference=True)
    with pytest.raises(NotImplementedError, match=match):
        build_gradient(model, wrt=["X"])


def test_average_pool_dynamic_spatial_refused():
    model, _ = loss_model([node("AveragePool", ["X"], kernel_shape=[2, 2])], {},
                          inputs={"X": randn(1, 1, 4, 4)}, input_dims={"X": ["N", 1, "H", 4]},
                          reference=True)
    with pytest.raises(ValueError, match="AveragePool.*static lengths"):
        build_gradient(model, wrt=["X"])


def test_resize_to_a_dynamic_spatial_size_refused():
    """``interpolate(x, size=skip.shape[-2:])`` on symbolic shapes: the length of a resized
    axis is unknown, and assuming it kept gave a gradient of the wrong shape at run time."""
    sizes = node("Shape", ["S"], out="sizes")
    model, _ = loss_model([sizes, node("Resize", ["X", "", "", "sizes"], mode="linear")], {},
                          inputs={"X": randn(1, 1, 2, 2), "S": randn(1, 1, 4, 4)},
                          input_dims={"X": ["N", 1, "H", "W"], "S": ["N", 1, "H2", "W2"]},
                          opset=19, reference=True)
    with pytest.raises(ValueError, match="Resize.*static length.*axis 2"):
        build_gradient(model, wrt=["X"])


# ---------------------------------------------------------------- DepthToSpace / SpaceToDepth
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("shape, block", [((1, 4, 2, 3), 2), ((2, 18, 2, 1), 3)])
def test_depth_to_space(mode, shape, block):
    check_op([node("DepthToSpace", ["X"], blocksize=block, mode=mode)], {"X": randn(*shape)})


@pytest.mark.parametrize("shape, block", [((1, 2, 4, 6), 2), ((2, 1, 3, 6), 3)])
def test_space_to_depth(shape, block):
    check_op([node("SpaceToDepth", ["X"], blocksize=block)], {"X": randn(*shape)})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_dynamic(mode):
    check_dynamic([node("DepthToSpace", ["X"], blocksize=2, mode=mode)], randn(2, 8, 2, 3),
                  ["N", 8, "H", "W"])


def test_pixel_shuffle_torch():
    x = randn(2, 8, 2, 3)
    compare_exported(torch.nn.PixelShuffle(2), x)
    compare_torch([node("DepthToSpace", ["X"], blocksize=2, mode="CRD")],
                  lambda t: F.pixel_shuffle(t, 2), x)
    y = randn(2, 2, 4, 6)
    compare_exported(torch.nn.PixelUnshuffle(2), y)
    compare_torch([node("SpaceToDepth", ["X"], blocksize=2)],
                  lambda t: F.pixel_unshuffle(t, 2).reshape(2, 2, 4, 2, 3).transpose(1, 2)
                  .reshape(2, 8, 2, 3), y)

