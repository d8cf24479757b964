"""ORTModule's first call against the exporter alone, on transformers' models.

Usage::

    python -m benchmarks.first_call [--models llama,gpt2,bert,convnext,resnet] [--reps 2]
                                    [--out benchmark_results]

What a user waits for at the first step of ``ORTModule(model)``: the probe run, the export,
the graph passes, autodiff and the sessions, then the step itself. Each model is built from
transformers' own modeling code on a small seeded configuration (:data:`TRANSFORMERS`, the
models ``tests/torch/test_ortmodule_models.py`` trains) and timed, ``--reps`` times and
alternately, in one process:

* ``ortmodule``: the first forward and backward of a fresh ``ORTModule`` (its default
  exporter choice, for the shapes of the call), then, for reference, its second step;
* ``other_shape``: its first step on a batch of one row more, where it exports again with
  every input dimension symbolic (the export that serves every shape after);
* ``dynamo`` and ``torchscript``: ``torch.onnx.export`` of the same call alone
  (``dynamo=True``, then ``dynamo=False`` in training mode), the exporter's own time;
* ``dynamic``: the dynamo export with every input dimension symbolic (``Dim.AUTO``).

The ratio is ORTModule's first step over the plain export of the exporter it used (the target
is at most 2); ``/ dynamic`` its step at the other shape over the dynamic export. Prints a
table; writes ``first_call.json`` and ``first_call.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import logging
import statistics
import time
import warnings
from pathlib import Path

from benchmarks.report import finish_figure, pyplot


def _tokens(torch, seed):
    generator = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, 64, (2, 8), generator=generator)}


def _pixels(torch, seed):
    return {"pixel_values": torch.randn(2, 3, 32, 32,
                                        generator=torch.Generator().manual_seed(seed))}


#: name -> (make the model, make its inputs ``(torch, seed)``): small configurations of
#: transformers' modeling code, random weights (nothing is downloaded)
TRANSFORMERS = {
    # RMSNorm, rotary position embeddings, grouped-query attention, SwiGLU
    "llama": (lambda tf: tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        use_cache=False)), _tokens),
    # a fused QKV projection split in three
    "gpt2": (lambda tf: tf.GPT2LMHeadModel(tf.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)), _tokens),
    "bert": (lambda tf: tf.BertForSequenceClassification(tf.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)), _tokens),
    # depthwise convolutions, LayerNorm over the channels, mean pooling
    "convnext": (lambda tf: tf.ConvNextForImageClassification(tf.ConvNextConfig(
        num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3,
        image_size=32)), _pixels),
    # BatchNorm, residual blocks, adaptive average pooling
    "resnet": (lambda tf: tf.ResNetForImageClassification(tf.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3,
        layer_type="basic")), _pixels),
}


def _loss(out):
    """The sum of the mean squares of every tensor the model returns."""
    import torch

    values = out.values() if isinstance(out, dict) else out
    tensors = [values] if isinstance(values, torch.Tensor) else list(values)
    return sum((t ** 2).mean() for t in tensors if isinstance(t, torch.Tensor))


def _exporter_seconds(model, inputs, how: str) -> float | None:
    """Seconds of one ``torch.onnx.export`` of the call (None where the exporter fails)."""
    import torch

    start = time.perf_counter()
    try:
        if how == "dynamo":
            torch.onnx.export(model, (), kwargs=inputs, dynamo=True, verbose=False)
        elif how == "dynamic":
            auto = torch.export.Dim.AUTO
            shapes = {k: dict.fromkeys(range(v.dim()), auto) for k, v in inputs.items()}
            torch.onnx.export(model, (), kwargs=inputs, dynamo=True, verbose=False,
                              optimize=False, dynamic_shapes=shapes)
        else:
            torch.onnx.export(model, (), io.BytesIO(), kwargs=inputs, dynamo=False,
                              training=torch.onnx.TrainingMode.TRAINING)
    except Exception:  # noqa: BLE001 - an exporter that cannot export the model: no time
        return None
    return time.perf_counter() - start


def _ortmodule_seconds(model, inputs) -> dict:
    import torch

    from ortlearn.torch import ORTModule

    records = []

    class Exporters:  # the exporter ORTModule's log names
        def write(self, text):
            records.append(text)

    handler = logging.StreamHandler(Exporters())
    logger = logging.getLogger("ortlearn.torch")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        from ortlearn.torch import DebugOptions, LogLevel

        wrapped = ORTModule(model, DebugOptions(log_level=LogLevel.INFO))
        start = time.perf_counter()
        _loss(wrapped(**inputs)).backward()
        first = time.perf_counter() - start
        start = time.perf_counter()
        _loss(wrapped(**inputs)).backward()
        second = time.perf_counter() - start
        start = time.perf_counter()
        _loss(wrapped(**{k: torch.cat([v, v[:1]]) for k, v in inputs.items()})).backward()
        other = time.perf_counter() - start
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    used = "dynamo" if any("with the dynamo exporter" in r for r in records) else "torchscript"
    return {"ortmodule": first, "second_step": second, "other_shape": other, "exporter": used,
            "export_count": wrapped.export_count}


def measure(name: str, reps: int) -> dict:
    """The medians over ``reps`` alternate repetitions for model ``name``."""
    import torch
    import transformers

    make, make_inputs = TRANSFORMERS[name]
    torch.manual_seed(0)
    reference = make(transformers)
    inputs = make_inputs(torch, 0)
    runs = []
    for _ in range(reps):
        run = _ortmodule_seconds(copy.deepcopy(reference), inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for how in ("dynamo", "dynamic", "torchscript"):
                run[how] = _exporter_seconds(copy.deepcopy(reference), inputs, how)
        runs.append(run)
    out = {}
    for key in ("ortmodule", "second_step", "other_shape", "dynamo", "dynamic", "torchscript"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = statistics.median(values) if values else None
    out["exporter"] = runs[-1]["exporter"]
    out["export_count"] = runs[-1]["export_count"]
    alone = out[out["exporter"]]
    out["ratio"] = out["ortmodule"] / alone if alone else None
    out["ratio_dynamic"] = (out["other_shape"] / out["dynamic"]
                            if out["exporter"] == "dynamo" and out["dynamic"] else None)
    return out


def _cell(value, width: int, digits: int = 2) -> str:
    return f"{'failed':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.first_call", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(TRANSFORMERS))
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", default="benchmark_results")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(TRANSFORMERS))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {sorted(TRANSFORMERS)}")
    results = {name: measure(name, args.reps) for name in names}
    print(f"{'model':<10}{'ORTModule s':>12}{'dynamo s':>10}{'torchscript s':>15}{'used':>13}"
          f"{'ratio':>7}{'other shape s':>15}{'dynamic s':>11}{'/ dynamic':>11}"
          f"{'2nd step s':>12}")
    for name, r in results.items():
        print(f"{name:<10}{_cell(r['ortmodule'], 12)}{_cell(r['dynamo'], 10)}"
              f"{_cell(r['torchscript'], 15)}{r['exporter']:>13}{_cell(r['ratio'], 7)}"
              f"{_cell(r['other_shape'], 15)}{_cell(r['dynamic'], 11)}"
              f"{_cell(r['ratio_dynamic'], 11)}{_cell(r['second_step'], 12, 4)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_call.json").write_text(json.dumps(results, indent=2))
    plt = pyplot()
    if plt is None:
        print("matplotlib is not installed: no plot")
        return 0
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = range(len(results))
    width = 0.16
    keys = ("ortmodule", "dynamo", "other_shape", "dynamic", "torchscript")
    for i, key in enumerate(keys):
        ax.bar([v + (i - 2) * width for v in x], [r[key] or 0 for r in results.values()],
               width, label=key)
    ax.set_xticks(list(x), list(results))
    finish_figure(fig, ax, out / "first_call.png", ylabel="seconds",
                  title="ORTModule's first step against the exporter alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
