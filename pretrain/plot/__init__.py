"""PNG curves of RUN/metrics.jsonl: ``bertforge plot RUN/metrics.jsonl [--out DIR]``.

Each panel is drawn against the optimizer step, with its unit on the y axis; loss_vs_time.png
draws the training and validation loss against the run's wall-clock training time
(``elapsed_s``, start-up included and added up over resumes), so that runs of different speed
compare by time. The phases of a run (its step records' ``phase``: a ``--phases`` plan, or
warmup/stable/decay...) are shaded and named in every panel drawn against the step, and the steps
a launch resumed after are marked. Which panels a run gets (the loss scale for fp16 only, an
objective's own, a replaced-token-detection discriminator's apart) is :mod:`.panels`'.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from bertforge.cli import ArgumentParser
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.logs import get_logger
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.objectives.base import MLM_LOSS
from bertforge.pretrain.objectives.registry import OBJECTIVES
from bertforge.pretrain.plot.panels import (
    STEP_LABEL,
    Marks,
    draw,
    objective_of,
    phase_spans,
    series,
    shade_phases,
    step_panels,
)
from bertforge.pretrain.run_folder.layout import RunFolder

log = get_logger(__name__)


def _time_series(records: list[dict], key: str, elapsed_by_step: dict[int, float]):
    """(seconds, values) of ``key``; a record without ``elapsed_s`` (validation records of runs
    before it was recorded) takes the time of the training step it follows."""
    xs, ys = [], []
    for r in records:
        v, t = r.get(key), r.get("elapsed_s", elapsed_by_step.get(r.get("step")))
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            if isinstance(t, (int, float)):
                xs.append(float(t))
                ys.append(float(v))
    return xs, ys


class PlotError(UserError, ValueError):
    """A metrics file that is missing or holds nothing to plot."""


def load(metrics_path: Path) -> dict[str, list[dict]]:
    """The records to plot: training steps (with what their objective's panels read that runs
    before it was recorded lack), the overall validation records (a mixture's per-source ones
    have "source"), and the resume records."""
    if not metrics_path.is_file():
        raise PlotError(
            f"{metrics_path}: no such metrics file (give RUN/metrics.jsonl of a training run)"
        )
    data = {
        "train": read_metrics(metrics_path, "train"),
        "validation": [r for r in read_metrics(metrics_path, "validation") if "source" not in r],
        "resume": read_metrics(metrics_path, "resume"),
    }
    if not data["train"]:
        raise PlotError(f"{metrics_path}: no training records")
    for objective in OBJECTIVES.values():
        objective.complete_records(data)
    return data


def plot_loss_vs_time(data: dict[str, list[dict]], out: Path) -> list[Path]:
    """loss_vs_time.png: training and validation loss (the objective's ``train_loss_key``) against
    elapsed seconds (none: [])."""
    # Imports inside functions here: matplotlib (pyplot), only when a figure is drawn.
    import matplotlib.pyplot as plt

    elapsed = {r["step"]: r["elapsed_s"] for r in data["train"] if "elapsed_s" in r}
    train_key = objective_of(data["train"]).train_loss_key
    series_ = [
        (split, key, *_time_series(data[split], key, elapsed))
        for split, key in (("train", train_key), ("validation", "val_loss"))
    ]
    if not any(xs for *_, xs, _ in series_):
        return []
    span = max(max(xs) for *_, xs, _ in series_ if xs)
    unit, div = ("h", 3600.0) if span > 3 * 3600 else ("min", 60.0) if span > 300 else ("s", 1.0)
    fig, ax = plt.subplots(figsize=(6, 4))
    for split, key, xs, ys in series_:
        if xs:
            style = "-" if split == "train" else "o-"
            ax.plot([x / div for x in xs], ys, style, label=f"{split} {key}", markersize=3)
    resumed = [r["elapsed_s"] / div for r in data["resume"] if "elapsed_s" in r]
    for x in resumed:
        ax.axvline(x, color="C3", ls=":", lw=1.2, label="_resumed")
    ax.set_title("loss against wall-clock time" + (" (dotted: a resume)" if resumed else ""))
    ax.set_xlabel(f"training time ({unit}, start-up included)")
    ax.set_ylabel(MLM_LOSS if train_key == "mlm_loss" else "loss (nats)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "loss_vs_time.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def figures(data: dict[str, list[dict]]) -> dict[str, object]:
    """The figures of a run's step panels by file stem (a panel without data has none), the
    overview (every panel, an objective's panels apart too) and those apart (under the
    objective's ``apart_stem``)."""
    # Lazy: matplotlib (pyplot) only when a figure is drawn.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    marks = Marks(phase_spans(data["train"]), [r["step"] for r in data["resume"]])
    objective = objective_of(data["train"])
    panels, disc = step_panels(data["train"]), list(objective.panels_apart)
    out = {}
    for panel in panels:
        fig, ax = plt.subplots(figsize=(6, 4))
        if draw(ax, panel, data, marks):
            fig.tight_layout()
            out[panel.stem] = fig
        else:
            plt.close(fig)
    if disc:
        fig, axes = plt.subplots(1, len(disc), figsize=(6 * len(disc), 4))
        for ax, panel in zip(axes, disc):
            draw(ax, panel, data, marks)
        fig.tight_layout()
        out[objective.apart_stem] = fig
    every = panels + disc
    rows = math.ceil(len(every) / 3)
    fig, axes = plt.subplots(rows, 3, figsize=(15, 4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, every):
        draw(ax, panel, data, marks)
    for ax in list(axes.flat)[len(every) :]:
        ax.axis("off")
    fig.tight_layout()
    out["overview"] = fig
    return out


def plot(metrics_path: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write one PNG per step panel, overview.png, loss_vs_time.png and a PNG of an objective's
    panels apart; returns the paths written."""
    import matplotlib.pyplot as plt

    metrics_path = Path(metrics_path)
    data = load(metrics_path)
    out = Path(out_dir) if out_dir else RunFolder(metrics_path.parent).plots
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, fig in figures(data).items():
        path = out / f"{stem}.png"
        fig.savefig(path, dpi=80 if stem == "overview" else 100)
        plt.close(fig)
        written.append(path)
    return written + plot_loss_vs_time(data, out)


def plot_downstream(
    metrics_path: str | os.PathLike, out_dir: str | os.PathLike | None = None
) -> list[Path]:
    """downstream.png: each ``split: "downstream"`` task metric against the step (none: [])."""
    # Lazy: matplotlib (pyplot) only when a figure is drawn.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics_path = Path(metrics_path)
    series: dict[str, list[tuple[int, float]]] = {}
    for r in read_metrics(metrics_path, "downstream"):
        value = r.get("value")
        if isinstance(value, (int, float)) and math.isfinite(value) and "step" in r:
            series.setdefault(f"{r.get('task')} {r.get('metric')}", []).append((r["step"], value))
    if not series:
        return []
    out = Path(out_dir) if out_dir else RunFolder(metrics_path.parent).plots
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in sorted(series.items()):
        points.sort()
        ax.plot([s for s, _ in points], [v for _, v in points], "o-", label=name, markersize=3)
    ax.set_title("downstream evaluation (test split, one seed)")
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel("score (each task's metric)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "downstream.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def plot_sources(
    metrics_path: str | os.PathLike, out_dir: str | os.PathLike | None = None
) -> list[Path]:
    """sources.png for a mixture: validation loss per source, and each source's share of the
    training samples so far, against the step (no mixture: [])."""
    # Lazy: matplotlib (pyplot) only when a figure is drawn.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics_path = Path(metrics_path)
    val = [r for r in read_metrics(metrics_path, "validation") if "source" in r]
    train = read_metrics(metrics_path, "train")
    names = sorted({k.removeprefix("share_") for r in train for k in r if k.startswith("share_")})
    if not val and not names:
        return []
    fig, (ax_val, ax_share) = plt.subplots(1, 2, figsize=(12, 4.5))
    for source in sorted({r["source"] for r in val}):
        xs, ys = series([r for r in val if r["source"] == source], "val_loss")
        ax_val.plot(xs, ys, "o-", label=source, markersize=3)
    seen = {n: 0.0 for n in names}  # samples so far, weighted by each step's share
    for n in names:
        xs, shares = [], []
        total = 0.0
        for r in train:
            if isinstance(r.get(f"share_{n}"), (int, float)):
                seen[n] += r[f"share_{n}"] * r.get("samples", 1)
                total += r.get("samples", 1)
                xs.append(r["step"])
                shares.append(seen[n] / total)
        ax_share.plot(xs, shares, "-", label=n)
    spans = phase_spans(train)
    for ax, title, ylabel in (
        (ax_val, "validation loss per source", MLM_LOSS),
        (ax_share, "share of the training samples so far", "fraction of the samples"),
    ):
        ax.set_title(title, pad=12 if spans else 6)
        ax.set_xlabel(STEP_LABEL)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        shade_phases(ax, spans)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out_dir) if out_dir else RunFolder(metrics_path.parent).plots
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sources.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = ArgumentParser(prog="bertforge plot", description=__doc__)
    p.add_argument("metrics", help="RUN/metrics.jsonl")
    p.add_argument("--out", default=None, help="output folder (default: RUN/plots)")
    args = p.parse_args(argv)
    try:
        paths = (
            plot(args.metrics, args.out)
            + plot_downstream(args.metrics, args.out)
            + plot_sources(args.metrics, args.out)
        )
    except UserError as e:
        log.error(str(e))
        return USER_ERROR_EXIT
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
