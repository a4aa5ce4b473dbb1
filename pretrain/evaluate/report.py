"""The comparison table (markdown), the results file (JSON) and the score-vs-step plot.

Table: one row per model, one column per task and metric, each cell ``median [min, max]`` of the
test scores over the seeds at the chosen learning rate; then the reference rows (majority class,
classical model: one value each), then each task's split sizes and label count, the chosen
learning rates, the long-document strategy where it is not ``first`` and any note (a dev split
too small to choose on). Plot: for each run of which more than one checkpoint was evaluated, the
primary metric of every task against the step (median, with the min-max range as error bars),
and the HF folders as horizontal reference lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.files import write_bytes_atomic, write_json_atomic


def write_results(out_dir: Path, results: dict[str, Any]) -> tuple[Path, Path]:
    """results.json and results.md in ``out_dir`` (each written atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "results.json", results)
    write_bytes_atomic(out_dir / "results.md", markdown_table(results).encode("utf-8"))
    return out_dir / "results.json", out_dir / "results.md"


def _cell(stats: dict[str, Any]) -> str:
    return f"{stats['median']:.3f} [{stats['min']:.3f}, {stats['max']:.3f}]"


def _columns(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(task, metric) pairs, the task's primary metric first."""
    columns: list[tuple[str, str]] = []
    rows = results["results"] + results.get("references", [])
    for task in results["tasks"]:
        metrics = sorted(
            {m for r in rows if r["task"] == task["name"] for m in r["test"]},
            key=lambda m: (m != task["primary"], m),
        )
        columns += [(task["name"], m) for m in metrics]
    return columns


def _row(label: str, rows: list[dict[str, Any]], columns: list[tuple[str, str]], cell) -> str:
    cells = [label]
    for task, metric in columns:
        hit = [r for r in rows if r["task"] == task]
        cells.append(cell(hit[0]["test"][metric]) if hit and metric in hit[0]["test"] else "-")
    return "| " + " | ".join(cells) + " |"


def markdown_table(results: dict[str, Any]) -> str:
    """The comparison table of an evaluation's results (see the module doc)."""
    columns = _columns(results)
    head = ["model"] + [f"{t} {m}" for t, m in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in results["models"]:
        rows = [r for r in results["results"] if r["model"] == model["label"]]
        lines.append(_row(model["label"], rows, columns, _cell))
    references = results.get("references", [])
    for name in dict.fromkeys(r["model"] for r in references):
        rows = [r for r in references if r["model"] == name]
        lines.append(_row(f"*{name}* (reference)", rows, columns, lambda st: f"{st['median']:.3f}"))
    lrs = "; ".join(f"{r['model']}/{r['task']}: {r['lr']:g}" for r in results["results"])
    sizes = "; ".join(
        f"{t['name']}: {len(t['labels'])} labels, train {t['train']}, dev {t['dev']}, "
        f"test {t['test']}"
        for t in results["tasks"]
    )
    lines += [
        "",
        f"Test scores: median [min, max] over {len(results['seeds'])} seed(s) at the learning "
        f"rate with the best median dev score ({lrs}). The majority-class row is the chance "
        "level; the classical row is a linear model over n-grams or window features, fitted on "
        "the same splits.",
        "",
        f"Examples: {sizes}.",
    ]
    longdoc = [
        f"{r['model']}/{r['task']}: {r['recipe']['long_documents']}"
        + (f" (stride {r['recipe']['window_stride'] or 'half a window'})" if k == "windows" else "")
        for r in results["results"]
        if (k := r.get("recipe", {}).get("long_documents", "first")) != "first"
    ]
    if longdoc:
        lines += ["", f"Texts over max_length: {'; '.join(longdoc)} (not their first tokens)."]
    lines += [f"\nNote: {n}." for n in results.get("notes", [])]
    return "\n".join(lines) + "\n"


def _result(results: dict[str, Any], model: str, task: str) -> dict[str, Any] | None:
    hit = [r for r in results["results"] if r["model"] == model and r["task"] == task]
    return hit[0] if hit else None


def _draw_task(ax, results: dict[str, Any], models: list[dict[str, Any]], task: dict) -> None:
    """One task's median (min-max bars) against step, and each HF folder as a dashed line."""
    primary = task["primary"]
    pts = sorted(
        (m["step"], r["test"][primary])
        for m in models
        if (r := _result(results, m["label"], task["name"])) is not None
    )
    err = [[st["median"] - st["min"] for _, st in pts], [st["max"] - st["median"] for _, st in pts]]
    line = ax.errorbar(
        [s for s, _ in pts],
        [st["median"] for _, st in pts],
        yerr=err,
        fmt="o-",
        capsize=3,
        label=f"{task['name']} {primary}",
    )
    for base in (m for m in results["models"] if m["run"] is None):
        hit = _result(results, base["label"], task["name"])
        if hit is not None:
            ax.axhline(
                hit["test"][primary]["median"],
                linestyle="--",
                alpha=0.6,
                color=line[0].get_color(),
                label=f"{base['label']} {task['name']}",
            )


def checkpoints_by_run(models: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The evaluated checkpoints grouped by their run folder (Hugging Face folders left out)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for m in models:
        if m["run"] is not None:
            runs.setdefault(m["run"], []).append(m)
    return runs


def plot_steps(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """One PNG per run with several checkpoints: primary test metric of each task against step."""
    # Lazy: matplotlib (pyplot) only when a figure is drawn.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = checkpoints_by_run(results["models"])
    written = []
    for run, models in runs.items():
        if len(models) < 2:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for task in results["tasks"]:
            _draw_task(ax, results, models, task)
        title = f"downstream scores of {Path(run).name}"
        path = out_dir / f"score_vs_step_{Path(run).name}.png"
        written.append(save_step_figure(fig, ax, "test score (median over seeds)", title, path))
    return written


def save_step_figure(fig, ax, ylabel: str, title: str, path: Path) -> Path:
    """A score-against-pretraining-step figure labelled, written to ``path`` and closed."""
    import matplotlib.pyplot as plt

    ax.set_xlabel("pretraining step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
