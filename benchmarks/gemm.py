"""W20: a GEMM-bound MLP, and the float32 GEMM peak of the machine at its shapes.

W20 trains an MLP regressor 200-512-512-1 (relu) by Adam, batch 512, on
``make_regression(200 000, 200)`` (``--scale`` shrinks the rows, not the
shapes of a step). A step computes, per dense layer ``in -> out``, three
products of ``2 * batch * in * out`` flops: the forward ``X @ W``, the weight
gradient ``X.T @ dZ`` and the input gradient ``dZ @ W.T``, so
``6 * batch * sum(in * out)`` flops a step (the first layer's input gradient
is not needed: the count is the usual one, slightly above what is computed).
Every contender's ``gflops`` is those flops per epoch over its time per epoch.

The peak is measured in the same run, interleaved with the contenders
(contender ``gemm_peak``): each of those products, at its shape and
transposition, timed (best of 3 loops) on preallocated operands with numpy (OpenBLAS, through
threadpoolctl's thread limit) and with onnxruntime (a one-node ``Gemm`` with
ortlearn's session options and ``--threads`` threads); the faster of the two
per product. Its ``time`` is the epoch's products at those speeds (the GEMM
floor of an epoch), its ``gflops`` the peak; ``gemm_peak / <contender>``
under the table is then the fraction of the peak a contender reaches.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks._harness import (
    ADAM_LR,
    Contender,
    Workload,
    device_pair,
    mlp_adam_contenders,
    mse,
    rows,
    torch_adam_contenders,
)
from benchmarks.xla import add_jax

HIDDEN = (512, 512)
BATCH = 512
ROWS = 200_000
FEATURES = 200


def gemm_shapes(sizes, batch: int) -> list[tuple]:
    """``(label, m, k, n, trans_a, trans_b)`` of the products of a step of an MLP with
    layer widths ``sizes`` (input first): forward, weight gradient, input gradient."""
    shapes = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        shapes += [(f"L{i + 1} forward X@W", batch, fan_in, fan_out, False, False),
                   (f"L{i + 1} grad W: X.T@dZ", fan_in, batch, fan_out, True, False),
                   (f"L{i + 1} grad X: dZ@W.T", batch, fan_out, fan_in, False, True)]
    return shapes


def step_flops(sizes, batch: int) -> float:
    """``6 * batch * sum(in * out)``: the forward and backward products of one step."""
    return 6.0 * batch * sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))


def _time_loop(fn, target_s: float) -> float:
    """Seconds per call of ``fn``, calibrated to about ``target_s`` of calls."""
    fn()
    calls, spent = 1, 0.0
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        spent = time.perf_counter() - start
        if spent > target_s / 4:
            break
        calls *= 4
    calls = max(1, int(calls * target_s / spent))
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _ort_gemm(m, k, n, trans_a, trans_b, threads):
    from onnx import TensorProto, helper

    from ortlearn.training.device import make_session, make_session_options

    a_shape = [k, m] if trans_a else [m, k]
    b_shape = [n, k] if trans_b else [k, n]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["A", "B"], ["C"], transA=int(trans_a), transB=int(trans_b))],
        "gemm", [helper.make_tensor_value_info("A", TensorProto.FLOAT, a_shape),
                 helper.make_tensor_value_info("B", TensorProto.FLOAT, b_shape)],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, [m, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return make_session(model, "cpu", make_session_options(threads)), a_shape, b_shape


def measure_peak(sizes, batch: int, threads: int, target_s: float = 0.05, tries: int = 3
                 ) -> dict:
    """The float32 GEMM speed of a step's products, numpy and onnxruntime, per product.

    Returns
    -------
    dict
        ``products``: per product its flops and GFLOP/s with each library;
        ``step_s``: a step's products at the faster library's speed each;
        ``gflops``: the step's flops over ``step_s`` (the peak at these shapes).
    """
    from onnxruntime import OrtValue
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    products, step_s = [], 0.0
    for label, m, k, n, trans_a, trans_b in gemm_shapes(sizes, batch):
        session, a_shape, b_shape = _ort_gemm(m, k, n, trans_a, trans_b, threads)
        A = rng.standard_normal(a_shape, dtype=np.float32)
        B = rng.standard_normal(b_shape, dtype=np.float32)
        C = np.empty((m, n), np.float32)
        a, b = (A.T if trans_a else A), (B.T if trans_b else B)
        binding = session.io_binding()
        binding.bind_ortvalue_input("A", OrtValue.ortvalue_from_numpy(A))
        binding.bind_ortvalue_input("B", OrtValue.ortvalue_from_numpy(B))
        binding.bind_ortvalue_output("C", OrtValue.ortvalue_from_numpy(C))
        # a peak: the best of a few loops (a busy machine only ever slows a loop down)
        with threadpool_limits(limits=threads):
            numpy_s = min(_time_loop(lambda: np.matmul(a, b, out=C), target_s)
                          for _ in range(tries))
        ort_s = min(_time_loop(lambda: session.run_with_iobinding(binding), target_s)
                    for _ in range(tries))
        flops = 2.0 * m * k * n
        products.append({"product": label, "m": m, "k": k, "n": n, "flops": flops,
                         "numpy_gflops": flops / numpy_s / 1e9,
                         "onnxruntime_gflops": flops / ort_s / 1e9})
        step_s += min(numpy_s, ort_s)
    return {"products": products, "step_s": step_s,
            "gflops": step_flops(sizes, batch) / step_s / 1e9}


def build_w20(opts):
    """W20: MLP regressor 200-512-512-1, Adam, batch 512: GFLOP/s against the GEMM peak."""
    from sklearn.datasets import make_regression

    n = rows(ROWS, opts.scale, 4 * BATCH)
    X, y = make_regression(n_samples=n, n_features=FEATURES, noise=1.0, random_state=0)
    X, y = X.astype(np.float32), y.astype(np.float32)
    epochs, batch = opts.epochs or 2, BATCH
    sizes = (FEATURES, *HIDDEN, 1)
    steps = -(-n // batch)
    epoch_flops = step_flops(sizes, batch) * n / batch
    w = Workload("W20", "GEMM-bound MLP regressor 200-512-512-1, Adam", "s/epoch", "train_mse",
                 {"n_samples": n, "n_features": FEATURES, "hidden_layer_sizes": HIDDEN,
                  "activation": "relu", "epochs": epochs, "batch_size": batch,
                  "learning_rate": ADAM_LR, "alpha": 0.0, "steps_per_epoch": steps,
                  "gflop_per_step": step_flops(sizes, batch) / 1e9,
                  "gflop_per_epoch": epoch_flops / 1e9},
                 sklearn_ref="sklearn_adam", torch_ref="torch_adam",
                 device_pair=device_pair(opts, "ortlearn_adam"))

    def quality(predict):
        return {"train_mse": mse(predict(X), y)}

    contenders = mlp_adam_contenders(opts, X, y, HIDDEN, epochs, batch, False, quality)
    if opts.torch is not None:
        contenders += torch_adam_contenders(opts, X, y.reshape(-1, 1), HIDDEN, epochs, batch,
                                             regression=True)
    w.contenders = contenders
    add_jax(w, opts, X, y, HIDDEN, epochs, batch, False, quality, rtol=0.05)
    for c in w.contenders:
        c.run = _with_gflops(c.run, epoch_flops)
        w.pairs.append(("gemm_peak", c.name))

    def gemm_peak(seed, warmup):
        peak = measure_peak(sizes, batch, _threads(), target_s=0.01 if warmup else 0.05)
        # the epoch's flops at the peak speed: the GEMM floor of an epoch
        return {"time": epoch_flops / peak["gflops"] / 1e9, "gflops": peak["gflops"],
                "products": peak["products"]}

    w.contenders.insert(0, Contender(
        "gemm_peak", "numpy", gemm_peak,
        "the epoch's GEMM flops at the measured float32 peak of a step's products (faster "
        "of numpy and onnxruntime Gemm per product, --threads threads)"))
    w.notes.append("gemm_peak / <contender>: the fraction of the measured GEMM peak the "
                   "contender reaches (its gflops over the peak's)")
    return w


def _threads() -> int:
    # run.py sets it to --threads; onnxruntime's default otherwise (one per core)
    import os

    from ortlearn.training.device import default_num_threads

    return default_num_threads() or os.cpu_count() or 1


def _with_gflops(run, epoch_flops: float):
    def timed(seed, warmup):
        out = run(seed, warmup)
        return {**out, "gflops": epoch_flops / out["time"] / 1e9}
    return timed
