"""W8, W9, W21: training steps through ``ortlearn.torch.ORTModule``, torch eager and torch.compile.

The same torch module, initial weights, batches, loss and optimizer go
through three contenders, on the CPU:

* ``ortmodule_*``: the module wrapped in :class:`ortlearn.torch.ORTModule`
  (strict: a fallback to torch would time torch, so it raises instead; the
  exporter of ``--exporter``, by default ORTModule's own choice);
* ``torch_*``: torch eager (the reference of the ``/ torch`` ratios);
* ``torch_compile_*``: ``torch.compile(module)`` with the backend of
  ``--compile-backend`` (inductor by default, which compiles C++ and needs a
  compiler: when compiling fails the contender is reported unavailable, with
  the reason, and the run goes on).

Only the module is wrapped or compiled; the loss, ``backward()``, the torch
optimizer's step and the gradient reset run in torch eager for all three,
as in a user's script. ``time`` is milliseconds per training step
(``zero_grad``, forward, loss, backward, optimizer step, the loss read back),
the median of the steps of one repetition after :data:`WARMUP_STEPS` warm-up
steps. The wrapped (or compiled) module is built once per run, in the
warm-up repetition, which pays the export or the compilation (``setup_s``,
the time of that first step); every repetition then loads the repetition's
initial weights into it in place and makes a new optimizer. ``final_loss``
is the mean loss of the last ten steps. The ratio of ORTModule to
torch.compile is printed under the table (``pairs`` in ``results.json``).

* W8: W2's MLP regressor 100-100(relu)-1 on W2's data (scikit-learn's
  Glorot initialisation, half mean squared error), ``torch.optim.Adam``,
  batches of 256 random rows.
* W9: W6's LeNet-style CNN on digits 8x8 (BatchNorm, Dropout), cross-entropy,
  ``torch.optim.AdamW``, batches of 64.
* W21: W7's transformer encoder layer on padded token sequences (an embedding,
  ``nn.TransformerEncoderLayer`` with a padding mask, masked mean pooling, a
  linear head), cross-entropy, ``torch.optim.AdamW``, batches of 32.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.networks import LR, WARMUP_STEPS, run_steps


def _mlp_setup(opts):
    from benchmarks._harness import half_mse, regression_data, torch_mlp

    torch = opts.torch
    X, y = regression_data(opts)
    y = y.reshape(-1, 1)

    def make(seed):
        return torch_mlp(torch, X.shape[1], (100,), 1, torch.Generator().manual_seed(seed))

    def batches(batch, steps, seed):
        rng = np.random.default_rng(seed)
        picks = [rng.choice(len(X), batch, replace=False) for _ in range(steps)]
        return [(X[p], y[p]) for p in picks]

    params = {"n_samples": len(X), "n_features": X.shape[1], "hidden_layer_sizes": (100,),
              "activation": "relu"}
    return make, batches, half_mse(torch), torch.optim.Adam, params


def _network_setup(key: str):
    """The setup of W6's or W7's network (:data:`benchmarks.networks.NETWORKS`):
    cross-entropy, ``torch.optim.AdamW``."""
    def setup(opts):
        from benchmarks.networks import NETWORKS

        _, network, batches, _ = NETWORKS[key]
        torch = opts.torch

        def make(seed):
            torch.manual_seed(seed)
            return network(torch)

        return make, batches, torch.nn.CrossEntropyLoss(), torch.optim.AdamW, {}
    return setup


#: key -> (title, setup, batch size, optimizer label, what the module is)
MODELS = {
    "W8": ("W2's MLP through ORTModule", _mlp_setup, 256, "adam",
           "Linear-ReLU-Linear, half MSE, optim.Adam"),
    "W9": ("W6's CNN through ORTModule", _network_setup("W6"), 64, "adamw",
           "LeNet-style CNN (BatchNorm, Dropout), cross-entropy, optim.AdamW"),
    "W21": ("W7's transformer layer through ORTModule", _network_setup("W7"), 32, "adamw",
            "embedding, transformer encoder layer (padding mask, GELU, dropout), masked "
            "mean pooling, linear head; cross-entropy, optim.AdamW"),
}


def _stepper(torch, module, optimizer, loss_fn):
    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(module(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def build_ortmodule_workload(key: str, opts):
    """The workload ``key`` (W8, W9 or W21): ORTModule, torch eager and torch.compile."""
    from benchmarks._harness import Contender, Unavailable, Workload

    title, setup, batch, opt_label, what = MODELS[key]
    steps = max(int(round(200 * opts.scale)), 2 * WARMUP_STEPS + 10)
    params = {"batch_size": batch, "steps": steps, "learning_rate": LR,
              "optimizer": {"adam": "Adam", "adamw": "AdamW"}[opt_label],
              "exporter": opts.exporter, "compile_backend": opts.compile_backend}
    eager, ours, compiled = (f"{p}_{opt_label}" for p in ("torch", "ortmodule", "torch_compile"))
    w = Workload(key, title, "ms/step", "final_loss", params, torch_ref=eager,
                 pairs=[(ours, compiled)])
    torch = opts.torch
    if torch is None:
        w.notes.append(f"{key} needs torch (the network is a torch module): skipped")
        return w
    if opts.device != "cpu":
        w.notes.append(f"{key} runs on the CPU whatever --device says")
    make, batches_of, loss_fn, optimizer_cls, extra = setup(opts)
    w.params.update(extra)

    def contender(wrap):
        """``run(seed, warmup)`` training the module ``wrap`` returns (built at the first
        call, its first step timed as ``setup_s``), reset to ``seed``'s weights each call."""
        held = {}

        def run(seed, warmup):
            data = batches_of(batch, WARMUP_STEPS + 2 if warmup else steps, seed)
            fresh = make(seed)
            if "module" not in held:
                held["original"] = fresh
                held["module"] = wrap(fresh)
                first = _stepper(torch, held["module"],
                                 optimizer_cls(fresh.parameters(), lr=LR), loss_fn)
                start = time.perf_counter()
                first(*data[0])
                held["setup_s"] = time.perf_counter() - start
            original = held["original"]
            # in place: the wrapped module and its sessions or compiled code hold these tensors
            original.load_state_dict(fresh.state_dict())
            original.train()
            step = _stepper(torch, held["module"],
                            optimizer_cls(original.parameters(), lr=LR), loss_fn)
            return {**run_steps(step, data), "steps": len(data), "setup_s": held["setup_s"]}

        return run, held

    def wrap_ortmodule(module):
        from ortlearn.torch import DebugOptions, ORTModule

        return ORTModule(module, DebugOptions(strict=True), exporter=opts.exporter)

    ort_run, ort_held = contender(wrap_ortmodule)

    def ortmodule(seed, warmup):
        out = ort_run(seed, warmup)
        exports = ort_held["module"].export_count
        if exports != 1:
            raise RuntimeError(f"ORTModule exported {exports} times, once expected")
        return {**out, "export_count": exports}

    compile_run, compile_held = contender(
        lambda module: torch.compile(module, backend=opts.compile_backend))

    def torch_compile(seed, warmup):
        if "module" in compile_held:
            return compile_run(seed, warmup)
        if not hasattr(torch, "compile"):
            raise Unavailable(f"torch {torch.__version__} has no torch.compile")
        try:
            return compile_run(seed, warmup)
        except Exception as exc:  # noqa: BLE001  eager runs the same step: compiling failed
            compile_held.clear()
            raise Unavailable(f"torch.compile(backend={opts.compile_backend!r}) failed: "
                              f"{_first_line(exc)}") from exc

    def torch_eager(seed, warmup):
        module = make(seed).train()
        data = batches_of(batch, WARMUP_STEPS + 2 if warmup else steps, seed)
        step = _stepper(torch, module, optimizer_cls(module.parameters(), lr=LR), loss_fn)
        return {**run_steps(step, data), "steps": len(data)}

    w.contenders += [
        Contender(ours, "ortlearn", ortmodule,
                  f"ORTModule({what}), exporter {opts.exporter}; setup_s: the first step "
                  "(export, autodiff, sessions)"),
        Contender(eager, "torch", torch_eager, f"{what}, eager"),
        Contender(compiled, "torch", torch_compile,
                  f"torch.compile(module, backend={opts.compile_backend!r}); setup_s: the first "
                  "step (compilation)"),
    ]
    return w


# --------------------------------------------------------------------------- profile
PIECES = ("zero_grad", "module call", "loss", "backward", "optimizer step")


def profile_step(key: str, steps: int = 200, blocks: int = 5, threads: int = 1,
                 clock: str = "thread", exporter: str = "auto", top: int = 25) -> dict:
    """Where a training step of W8, W9 or W21 goes, ORTModule against torch eager.

    Both train the workload's module from the same weights on the same batches,
    in interleaved blocks of ``steps`` steps (after a warm-up block). Each step
    is cut at the calls a training script makes: ``zero_grad``, the module's
    call (ORTModule: its Python, the forward session), the loss, ``backward()``
    (ORTModule: torch autograd, its backward Python, the backward session) and
    the optimizer's step. Then ``cProfile`` runs ``steps`` more ORTModule steps:
    the functions with the most own time, where the onnxruntime calls show as
    built-in methods.

    Parameters
    ----------
    key : {'W8', 'W9', 'W21'}
    steps, blocks : int
        Steps per block, blocks per contender.
    threads : int
        torch's and onnxruntime's threads (``ORTLEARN_NUM_THREADS``).
    clock : {'thread', 'wall'}
        ``thread``: CPU time of the calling thread (``time.thread_time_ns``), which
        other processes on a shared machine do not inflate; it counts the work of
        that thread only, so use it with ``threads=1``. ``wall``: ``perf_counter``.
    exporter : {'auto', 'dynamo', 'torchscript'}
    top : int
        Rows of the cProfile table.

    Returns
    -------
    dict
        ``{'step_us': {contender: median}, 'pieces_us': {contender: {piece: median}},
        'blocks_us': {contender: [median of each block]}, 'cprofile': str}``.
    """
    import cProfile
    import io
    import os
    import pstats
    import statistics

    import torch

    from benchmarks._harness import Options
    from ortlearn.torch import DebugOptions, ORTModule
    from ortlearn.training.device import NUM_THREADS_ENV

    now = time.thread_time_ns if clock == "thread" else time.perf_counter_ns
    previous, torch_threads = os.environ.get(NUM_THREADS_ENV), torch.get_num_threads()
    os.environ[NUM_THREADS_ENV] = str(threads)
    torch.set_num_threads(threads)
    try:
        title, setup, batch, _, _ = MODELS[key]
        make, batches_of, loss_fn, optimizer_cls, _ = setup(Options(torch=torch))
        data = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches_of(batch, 64, 0)]
        pieces: dict = {}

        def stepper(name, module, params):
            optimizer = optimizer_cls(params, lr=LR)
            rows = pieces.setdefault(name, [])

            def step(x, y):
                t0 = now()
                optimizer.zero_grad(set_to_none=True)
                t1 = now()
                out = module(x)
                t2 = now()
                loss = loss_fn(out, y)
                t3 = now()
                loss.backward()
                t4 = now()
                optimizer.step()
                t5 = now()
                rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4))
                return loss.item()
            return step

        eager = make(0).train()
        original = make(0).train()
        wrapped = ORTModule(original, DebugOptions(strict=True), exporter=exporter)
        runs = {"torch_eager": stepper("torch_eager", eager, eager.parameters()),
                "ortmodule": stepper("ortmodule", wrapped, original.parameters())}
        for step in runs.values():  # warm-up: ORTModule exports here
            for i in range(max(steps // 4, 10)):
                step(*data[i % len(data)])
        for rows in pieces.values():
            rows.clear()
        for _ in range(blocks):
            for step in runs.values():
                for i in range(steps):
                    step(*data[i % len(data)])
        result = {"key": key, "title": title, "threads": threads, "clock": clock,
                  "steps": steps, "blocks": blocks, "step_us": {}, "pieces_us": {},
                  "blocks_us": {}}
        for name, rows in pieces.items():
            totals = [sum(r) / 1e3 for r in rows]
            result["blocks_us"][name] = [statistics.median(totals[b * steps:(b + 1) * steps])
                                         for b in range(blocks)]
            result["step_us"][name] = statistics.median(result["blocks_us"][name])
            result["pieces_us"][name] = {p: statistics.median(c) / 1e3
                                         for p, c in zip(PIECES, zip(*rows))}
        profiler = cProfile.Profile()
        step = runs["ortmodule"]
        profiler.enable()
        for i in range(steps):
            step(*data[i % len(data)])
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        calls = sum(v[1] for v in stats.stats.values())  # primitive + recursive calls
        text.write(f"{calls / steps:.0f} Python-level function calls per ORTModule step "
                   "(cProfile inflates the short ones)\n")
        stats.sort_stats("tottime").print_stats(top)
        result["cprofile"] = text.getvalue()
        return result
    finally:
        torch.set_num_threads(torch_threads)
        if previous is None:
            os.environ.pop(NUM_THREADS_ENV, None)
        else:
            os.environ[NUM_THREADS_ENV] = previous


def format_profile(result: dict) -> str:
    """The text ``python -m benchmarks.ortmodule`` prints."""
    eager, ours = result["step_us"]["torch_eager"], result["step_us"]["ortmodule"]
    lines = [f"{result['key']} ({result['title']}), {result['threads']} thread(s), "
             f"{result['clock']} clock: us per step, median of {result['blocks']} interleaved "
             f"blocks of {result['steps']} steps",
             f"  torch eager {eager:9.1f}  (blocks {_span(result['blocks_us']['torch_eager'])})",
             f"  ORTModule   {ours:9.1f}  (blocks {_span(result['blocks_us']['ortmodule'])})"
             f"  / torch eager {ours / eager:.3f}",
             "", f"  {'piece':16s} {'torch eager':>12s} {'ORTModule':>12s} {'difference':>12s}"]
    for piece in PIECES:
        a = result["pieces_us"]["torch_eager"][piece]
        b = result["pieces_us"]["ortmodule"][piece]
        lines.append(f"  {piece:16s} {a:12.1f} {b:12.1f} {b - a:+12.1f}")
    return "\n".join(lines) + "\n\n" + result["cprofile"]


def _span(values) -> str:
    return f"{min(values):.0f}-{max(values):.0f}"


def main(argv=None) -> int:
    """``python -m benchmarks.ortmodule W8|W9|W21 [...]``: :func:`profile_step`, printed."""
    import argparse
    import warnings

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ortmodule",
        description="Where an ORTModule training step goes, against torch eager.")
    parser.add_argument("workload", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("thread", "wall"), default="thread")
    parser.add_argument("--exporter", choices=("auto", "dynamo", "torchscript"), default="auto")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = profile_step(args.workload, args.steps, args.blocks, args.threads,
                              args.clock, args.exporter, args.top)
    print(format_profile(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
