"""Summaries, the markdown table, the JSON result file and the chart."""

from __future__ import annotations

import json
import math
import statistics


def summarize(raw: list[dict]) -> dict:
    """Median of each numeric key over the repetitions (None values left out)."""
    keys = sorted({k for r in raw for k, v in r.items() if _is_number(v)})
    out = {}
    for key in keys:
        values = [r[key] for r in raw if _is_number(r.get(key))]
        out[key] = statistics.median(values) if values else None
    return out


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def ratio(a, b):
    """``a / b`` (None when either is missing or ``b`` is 0)."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def paired_ratio(raw_a: list[dict], raw_b: list[dict], key: str = "time"):
    """Median over the repetitions of ``a / b`` within each repetition (None without a pair).

    A repetition times every contender back to back, so the ratio of one
    repetition sees the machine in one state: on a shared machine whose
    speed drifts within a run, the median of these ratios is steadier than
    the ratio of the medians.
    """
    b_by_rep = {r["rep"]: r.get(key) for r in raw_b}
    ratios = [r[key] / b_by_rep[r["rep"]] for r in raw_a
              if _is_number(r.get(key)) and _is_number(b_by_rep.get(r["rep"]))
              and b_by_rep[r["rep"]] != 0]
    return statistics.median(ratios) if ratios else None


def format_number(value, digits=3) -> str:
    """``value`` to ``digits`` significant digits, ``-`` for None."""
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}g}"


def markdown_table(result: dict) -> str:
    """One row per (workload, contender): median time, ratios, quality, setup.

    ``/ sklearn`` and ``/ torch`` are ratios of the medians, the ``paired``
    columns medians of the per-repetition ratios (:func:`paired_ratio`).
    """
    lines = ["| workload | contender | time | unit | / sklearn | / torch | paired / sklearn "
             "| paired / torch | quality | setup s |",
             "|---|---|---:|---|---:|---:|---:|---:|---|---:|"]
    notes = []
    for key, wl in result["workloads"].items():
        for name, c in wl["contenders"].items():
            if "error" in c:
                lines.append(f"| {key} | {name} | failed | | | | | | | |")
                notes.append(f"{key} {name}: {c['error']}")
                continue
            if "unavailable" in c:
                lines.append(f"| {key} | {name} | unavailable | | | | | | | |")
                notes.append(f"{key} {name} unavailable: {c['unavailable']}")
                continue
            med = c["median"]
            quality = f"{wl['quality']}={format_number(med.get(wl['quality']), 4)}" \
                if med.get(wl["quality"]) is not None else "-"
            cells = [med.get("time"), c["ratio_to_sklearn"], c["ratio_to_torch"],
                     c.get("paired_to_sklearn"), c.get("paired_to_torch")]
            time_, *ratios = (format_number(v) for v in cells)
            lines.append(f"| {key} | {name} | {time_} | {c['unit']} | {' | '.join(ratios)} | "
                         f"{quality} | {format_number(med.get('setup_s'))} |")
            if c.get("note"):
                notes.append(f"{key} {name}: {c['note']}")
        notes += [f"{key}: {n}" for n in wl.get("notes", [])]
    table = "\n".join(lines)
    if result.get("memory"):
        mem = result["memory"]
        notes.append(f"memory: a W2 fit of {mem['rows']} rows (Adam, 2 epochs) adds "
                     f"{mem['overhead_bytes'] / 1e6:.1f} MB of resident memory to a process "
                     f"holding {mem['data_bytes'] / 1e6:.1f} MB of data "
                     f"({'after' if mem.get('warm') else 'without'} a warm-up fit)")
    if notes:
        table += "\n\n" + "\n".join(f"- {n}" for n in notes)
    return table


def write_json(result: dict, path) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=_jsonable)
        f.write("\n")


def _jsonable(value):
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _timed(contender: dict) -> bool:
    """Whether a contender ran to the end (not failed, not unavailable)."""
    return "error" not in contender and contender.get("median", {}).get("time") is not None


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, None where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi: int = 110) -> bool:
    """Lay ``fig`` out, write it to ``path`` and release it; True (what the writers return)."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return True


def finish_figure(fig, ax, path, *, ylabel: str, title: str) -> None:
    """Label ``ax``, show its legend, write ``fig`` to ``path`` and say where."""
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)
    print(f"plot written to {path}")


def write_chart(result: dict, path) -> bool:
    """Bar chart of the median times, one panel per workload (False without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return False

    workloads = {k: w for k, w in result["workloads"].items()
                 if any(_timed(c) for c in w["contenders"].values())}
    if not workloads:
        return False
    fig, axes = plt.subplots(len(workloads), 1, squeeze=False,
                             figsize=(7, 1.0 + 1.1 * sum(len(w["contenders"])
                                                          for w in workloads.values()) / 2))
    colors = {"ortlearn": "tab:blue", "sklearn": "tab:orange", "torch": "tab:red",
              "onnxruntime": "tab:gray", "jax": "tab:purple"}
    for ax, (key, wl) in zip(axes[:, 0], workloads.items()):
        rows = [(n, c) for n, c in wl["contenders"].items() if _timed(c)]
        names = [n if c["unit"] == wl["unit"] else f"{n} ({c['unit']})" for n, c in rows]
        times = [c["median"]["time"] for _, c in rows]
        bars = ax.barh(names, times,
                       color=[colors.get(c["library"], "tab:green") for _, c in rows])
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
        ax.margins(x=0.15)  # room for the labels
        ax.invert_yaxis()
        ax.set_title(f"{key}: {wl['title']}", fontsize=9, loc="left")
        ax.set_xlabel(wl["unit"], fontsize=8)
        ax.tick_params(labelsize=8)
    meta = result["meta"]
    fig.suptitle(f"ortlearn benchmark, {meta['threads']} threads, {meta['machine']['device']}, "
                 f"median of {meta['reps']}", fontsize=9)
    return save_figure(fig, path)
