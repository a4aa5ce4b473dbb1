"""A benchmark's outputs: the markdown table, ``OUT/glue.json`` (or ``clue.json``) and the
score-against-step plot of a run whose checkpoints were scored.

Table: one row per model, one column per reported split and metric and one for the benchmark
score; each cell ``median [min, max]`` over the seeds, x 100 as papers print them; below it, the
protocol, which number is reported, how the score averages, and each task's lr, seeds, epochs and
start. ``glue.json``: ``{"models": {model: {task: {metric: median}, ..., "glue": score}}}`` in
fractions (as Hugging Face ``evaluate`` returns them), and beside it every run (lr, seed, epochs,
steps, seconds, scores), the settings of each task and the rules above.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.files import write_bytes_atomic, write_json_atomic
from bertforge.pretrain.evaluate.report import checkpoints_by_run, save_step_figure

_SHORT = {
    "matthews_correlation": "mcc",
    "accuracy": "acc",
    "f1": "f1",
    "pearson": "pearson",
    "spearmanr": "spearman",
}


def _columns(results: dict[str, Any]) -> list[tuple[str, str]]:
    cols: list[tuple[str, str]] = []
    for r in results["results"]:
        for name, metrics in r["evals"].items():
            cols += [(name, m) for m in metrics if (name, m) not in cols]
    return cols


def _cell(stats: dict[str, Any] | None) -> str:
    if stats is None:
        return "-"
    if stats["min"] == stats["max"]:
        return f"{100 * stats['median']:.1f}"
    return f"{100 * stats['median']:.1f} [{100 * stats['min']:.1f}, {100 * stats['max']:.1f}]"


def markdown_table(results: dict[str, Any]) -> str:
    """The table and its notes (module doc)."""
    bench = results["benchmark"]
    cols = _columns(results)
    head = ["model", *(f"{n} {_SHORT.get(m, m)}" for n, m in cols), bench.upper()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in results["sources"]:
        label = model["label"]
        rows = [r for r in results["results"] if r["model"] == label]
        cells = [label]
        for name, metric in cols:
            hit = [r["evals"][name][metric] for r in rows if name in r["evals"]]
            cells.append(_cell(hit[0] if hit else None))
        score = results["summary"][label][bench]
        cells.append("-" if score is None else f"{100 * score:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    per_task = "; ".join(
        f"{r['task']}: lr {r['lr']:g}, {r['settings']['epochs']:g} epochs, batch "
        f"{r['settings']['batch_size']}, {len(r['settings']['seeds'])} seed(s)"
        + (", from MNLI" if r["start"] != "pretrained" else "")
        for r in results["results"]
        if r["model"] == results["sources"][0]["label"]
    )
    lines += [
        "",
        f"Dev scores x 100, {results['reported']}. Protocol `{results['protocol']}` "
        f"({results['protocol_source']}). {bench.upper()} = {results['score']} (- where a task "
        f"of the average was not run). Per task: {per_task}.",
    ]
    return "\n".join(lines) + "\n"


def write_results(out_dir: Path, results: dict[str, Any]) -> list[Path]:
    """``BENCH.json`` and ``BENCH.md`` in ``out_dir``, each written atomically."""
    bench = results["benchmark"]
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"models": results["summary"], **{k: v for k, v in results.items() if k != "summary"}}
    json_path, md_path = out_dir / f"{bench}.json", out_dir / f"{bench}.md"
    write_json_atomic(json_path, doc)
    write_bytes_atomic(md_path, markdown_table(results).encode("utf-8"))
    return [json_path, md_path]


def plot_steps(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """One PNG per run with several scored checkpoints: the benchmark score and each task's
    first metric against the pretraining step (median over seeds)."""
    # Lazy: matplotlib (pyplot) only when a figure is drawn.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bench, written = results["benchmark"], []
    for run, models in checkpoints_by_run(results["sources"]).items():
        if len(models) < 2:
            continue
        models = sorted(models, key=lambda m: m["step"])
        steps = [m["step"] for m in models]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, metric in _columns(results):
            if metric != next(iter(_first_metrics(results, name))):
                continue
            ys = [results["summary"][m["label"]].get(name, {}).get(metric) for m in models]
            ax.plot(steps, [None if y is None else 100 * y for y in ys], "o-", label=name)
        scores = [results["summary"][m["label"]][bench] for m in models]
        if all(s is not None for s in scores):
            ax.plot(steps, [100 * s for s in scores], "k-", lw=2.5, label=bench.upper())
        title = f"{bench.upper()} of {Path(run).name} ({results['protocol']})"
        path = out_dir / f"{bench}_vs_step_{Path(run).name}.png"
        ylabel = "dev score x 100 (median over seeds)"
        written.append(save_step_figure(fig, ax, ylabel, title, path))
    return written


def _first_metrics(results: dict[str, Any], name: str):
    for r in results["results"]:
        if name in r["evals"]:
            return r["evals"][name]
    return {}
