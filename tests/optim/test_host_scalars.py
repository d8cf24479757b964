"""Per-step optimizer scalars computed on the host (fed to the fused step once per epoch)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from sklearn.neural_network._stochastic_optimizers import AdamOptimizer

from ortlearn.estimators import OrtMLPRegressor
from ortlearn.estimators._objective import input_names
from ortlearn.graph import DEFAULT_OPSET, GraphBuilder, finalize_model
from ortlearn.optim import SGD, Adam, AdamW
from ortlearn.training.fused import build_fused_epoch, build_fused_step

OPTIMIZERS = [SGD(momentum=0.9), Adam(beta_1=0.8, beta_2=0.99), AdamW(weight_decay=0.1),
              AdamW(bias_correction=False)]
vi = helper.make_tensor_value_info


def _session(b, inputs, outputs):
    graph = helper.make_graph(b.nodes, "g", inputs, outputs)
    model = finalize_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)]))
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=repr)
def test_host_scalars_equal_the_graph_scalars(optimizer):
    """Bit for bit on every CPU: the same IEEE operations (Sqrt, Mul, Div, Sub) on the same
    float64 values, and ``beta**t`` from the C library's ``pow`` on both sides (onnxruntime's
    Pow kernel and Python's float power). numpy's SIMD ``power`` (SVML on AVX-512) differs
    from ``pow`` in the last bit for about 5 % of these steps, which the training API's
    continuation of an estimator's fit would see."""
    b = GraphBuilder(prefix="s_")
    scalars = optimizer.scalar_nodes(b, b.cast("lr", TensorProto.DOUBLE),
                                      b.cast("t", TensorProto.DOUBLE))
    assert tuple(scalars) == optimizer.scalar_names
    sess = _session(b, [vi("lr", TensorProto.DOUBLE, []), vi("t", TensorProto.INT64, [])],
                    [vi(n, TensorProto.DOUBLE, []) for n in scalars.values()])
    steps = np.arange(1, 400)
    lrs = 0.003 / np.sqrt(steps)
    host = optimizer.host_scalars(lrs, steps)
    for i, (lr, t) in enumerate(zip(lrs, steps)):
        graph = sess.run(None, {"lr": np.array(lr), "t": np.array(t)})
        for name, value in zip(scalars, graph):
            assert host[name].dtype == np.float64 and host[name].shape == steps.shape
            assert host[name][i] == float(value), (name, int(t))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_adam_with_host_scalars_matches_sklearn(rng, dtype):
    """``build(scalars=...)`` fed ``host_scalars`` is scikit-learn's AdamOptimizer."""
    opt = Adam(beta_1=0.8, beta_2=0.99, epsilon=1e-6)
    shape, lr, n_steps = (4, 3), 1e-3, 12  # lr not representable in float32: kept in float64
    b = GraphBuilder(prefix="fused_")
    states = {"W": {s: f"W_{s}" for s in opt.state_names}}
    new_params, new_states = opt.build(b, ["W"], ["W_grad"], states, None, None,
                                       elem_types=[TensorProto.FLOAT if dtype == np.float32
                                                   else TensorProto.DOUBLE],
                                       scalars={"lr_t": "lr_t"})
    assert not {"Pow", "Sqrt"} & {n.op_type for n in b.nodes if "lr_t" in n.input}
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    names = ["W", "W_grad", *states["W"].values()]
    outs = [new_params[0], new_states["W"]["exp_avg"], new_states["W"]["exp_avg_sq"]]
    sess = _session(b, [vi("lr_t", TensorProto.DOUBLE, [])] + [vi(n, elem, shape) for n in names],
                    [vi(n, elem, shape) for n in outs])
    w = rng.standard_normal(shape)
    ref_params = [w.copy()]
    ref = AdamOptimizer(ref_params, learning_rate_init=lr, beta_1=0.8, beta_2=0.99,
                        epsilon=1e-6)
    host = opt.host_scalars([lr] * n_steps, np.arange(1, n_steps + 1))["lr_t"]
    p, m, v = w.astype(dtype), np.zeros(shape, dtype), np.zeros(shape, dtype)
    for t in range(n_steps):
        g = rng.standard_normal(shape)
        ref.update_params(ref_params, [g])
        p, m, v = sess.run(None, {"lr_t": host[t:t + 1].reshape(()), "W": p,
                                  "W_grad": g.astype(dtype), "W_exp_avg": m, "W_exp_avg_sq": v})
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(p, ref_params[0], **tol)
    np.testing.assert_allclose(m, ref.ms[0], **tol)
    np.testing.assert_allclose(v, ref.vs[0], **tol)


def test_build_checks_the_scalar_names():
    b = GraphBuilder(prefix="fused_")
    states = {"W": {s: f"W_{s}" for s in Adam.state_names}}
    with pytest.raises(ValueError, match=r"Adam needs the scalars \['lr_t'\], got \['lr'\]"):
        Adam().build(b, ["W"], ["W_grad"], states, None, None, scalars={"lr": "lr"})


@pytest.mark.parametrize("build", [build_fused_step, build_fused_epoch])
def test_fused_adam_step_gathers_its_scalars(build):
    """The step reads one fed value per scalar: no step counter, no Pow, no Sqrt of scalars."""
    rs = np.random.RandomState(0)
    X = rs.randn(40, 4)
    est = OrtMLPRegressor(hidden_layer_sizes=(5,), random_state=0).partial_fit(
        X, X @ rs.randn(4))
    loss, trainable = est._loss_model(weighted=False, values=True)
    model, layout = build(loss, trainable, input_names(False), Adam())
    assert layout.scalars == {"lr_t": "fused.scalar.lr_t"}
    assert layout.epoch_inputs == ("fused.order", "fused.starts", "fused.ends", "fused.rows",
                                   "fused.scalar.lr_t")
    graph = model.graph
    if build is build_fused_epoch:
        graph = next(a.g for n in graph.node if n.op_type == "Loop" for a in n.attribute)
    ops = [n.op_type for n in graph.node]
    assert "Pow" not in ops
    readers = [n.op_type for n in graph.node if "fused.scalar.lr_t" in n.input]
    assert readers == ["Gather"]
