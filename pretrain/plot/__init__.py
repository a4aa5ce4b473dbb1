"""PNG curves of RUN/metrics.jsonl: ``python -m pretrain.plot RUN/metrics.jsonl [--out DIR]``.

Each panel is drawn against the optimizer step; loss_vs_time.png draws the training and
validation loss against the run's wall-clock training time (``elapsed_s``, start-up included and
added up over resumes), so that runs of different speed compare by time. The phases of a run
(its step records' ``phase``: a ``--phases`` plan, or warmup/stable/decay...) are shaded and named
in every panel drawn against the step.
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

log = get_logger(__name__)

# (file stem, title, [(split, key), ...]) — one PNG per panel, plus one overview.
PANELS = [
    ("loss", "loss", [("train", "loss"), ("validation", "val_loss")]),
    ("accuracy", "MLM accuracy", [("train", "mlm_accuracy"), ("validation", "val_accuracy")]),
    ("lr", "learning rate", [("train", "lr")]),
    ("loss_scale", "loss scale", [("train", "loss_scale")]),
    ("grad_norm", "gradient norm", [("train", "grad_norm")]),
    ("throughput", "tokens/s", [("train", "tokens_per_s")]),
]


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


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


def phase_spans(records: list[dict]) -> list[tuple[str, int, int]]:
    """(phase, first step, last step) of each run of consecutive training records with the same
    ``phase``; [] when no record names one (a run without phases)."""
    spans: list[list] = []
    for r in records:
        name = r.get("phase")
        if name is None:
            continue
        if spans and spans[-1][0] == name:
            spans[-1][2] = r["step"]
        else:
            spans.append([name, r["step"], r["step"]])
    return [tuple(span) for span in spans]


def shade_phases(ax, spans: list[tuple[str, int, int]]) -> None:
    """Alternate grey bands over the steps of each phase, the phase's name at the top."""
    for i, (name, first, last) in enumerate(spans):
        # A band covers its steps from half a step before the first to half after the last.
        ax.axvspan(first - 0.5, last + 0.5, color="0.5", alpha=0.12 if i % 2 == 0 else 0.04, lw=0)
        ax.text(
            (first + last) / 2,
            1.0,
            name,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=7,
            color="0.3",
        )


class PlotError(UserError, ValueError):
    """A metrics file that is missing or holds nothing to plot."""


def plot_loss_vs_time(data: dict[str, list[dict]], out: Path) -> list[Path]:
    """loss_vs_time.png: training and validation loss against elapsed seconds (none: [])."""
    # Imports inside functions here: matplotlib (pyplot), only when a figure is drawn.
    import matplotlib.pyplot as plt

    elapsed = {r["step"]: r["elapsed_s"] for r in data["train"] if "elapsed_s" in r}
    series = [
        (split, key, *_time_series(data[split], key, elapsed))
        for split, key in (("train", "loss"), ("validation", "val_loss"))
    ]
    if not any(xs for *_, xs, _ in series):
        return []
    span = max(max(xs) for *_, xs, _ in series if xs)
    unit, div = ("h", 3600.0) if span > 3 * 3600 else ("min", 60.0) if span > 300 else ("s", 1.0)
    fig, ax = plt.subplots(figsize=(6, 4))
    for split, key, xs, ys in series:
        if xs:
            style = "-" if split == "train" else "o-"
            ax.plot([x / div for x in xs], ys, style, label=f"{split} {key}", markersize=3)
    ax.set_title("loss against wall-clock time")
    ax.set_xlabel(f"training time ({unit}, start-up included)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "loss_vs_time.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def plot(metrics_path: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write one PNG per panel (and overview.png); returns the paths written."""
    # Lazy: matplotlib (pyplot) only when a figure is drawn.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics_path = Path(metrics_path)
    if not metrics_path.is_file():
        raise PlotError(
            f"{metrics_path}: no such metrics file (give RUN/metrics.jsonl of a training run)"
        )
    # A mixture's per-source validation records have "source"; the overall one has none.
    data = {
        "train": read_metrics(metrics_path, "train"),
        "validation": [r for r in read_metrics(metrics_path, "validation") if "source" not in r],
    }
    if not data["train"]:
        raise PlotError(f"{metrics_path}: no training records")
    out = Path(out_dir) if out_dir else metrics_path.parent / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written, spans = [], phase_spans(data["train"])
    fig_all, axes = plt.subplots(2, 3, figsize=(15, 8))
    for (stem, title, keys), ax_all in zip(PANELS, axes.flat):
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = False
        for split, key in keys:
            xs, ys = _series(data[split], key)
            if xs:
                style = "-" if split == "train" else "o-"
                for a in (ax, ax_all):
                    a.plot(xs, ys, style, label=f"{split} {key}", markersize=3)
                drawn = True
        for a in (ax, ax_all):
            a.set_title(title, pad=12 if spans else 6)
            a.set_xlabel("step")
            a.grid(alpha=0.3)
            if drawn:
                shade_phases(a, spans)
                a.legend()
        if stem in ("loss_scale",) and drawn:
            ax.set_yscale("log")
            ax_all.set_yscale("log")
        if drawn:
            path = out / f"{stem}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=100)
            written.append(path)
        plt.close(fig)
    fig_all.tight_layout()
    fig_all.savefig(out / "overview.png", dpi=80)
    plt.close(fig_all)
    written.append(out / "overview.png")
    return written + plot_loss_vs_time(data, out) + plot_rtd(data, out)


def plot_rtd(data: dict[str, list[dict]], out: Path) -> list[Path]:
    """rtd.png for a replaced-token-detection run (``--objective rtd``): the discriminator's
    loss, and its accuracy, precision, recall and the replaced share, against the step; [] for
    another objective."""
    if not data["train"] or "rtd_loss" not in data["train"][0]:
        return []
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    for ax, keys in (
        (left, [("train", "rtd_loss"), ("validation", "val_rtd_loss")]),
        (right, [("train", k) for k in ("rtd_accuracy", "rtd_precision", "rtd_recall")]
         + [("train", "rtd_replaced_share"), ("validation", "val_rtd_accuracy")]),
    ):  # fmt: skip
        for split, key in keys:
            xs, ys = _series(data[split], key)
            ax.plot(xs, ys, "-" if split == "train" else "o-", label=key, markersize=3)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_title("discriminator loss (replaced-token detection)")
    right.set_title("discriminator: accuracy, precision and recall of replaced")
    fig.tight_layout()
    path = out / "rtd.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


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
    out = Path(out_dir) if out_dir else metrics_path.parent / "plots"
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in sorted(series.items()):
        points.sort()
        ax.plot([s for s, _ in points], [v for _, v in points], "o-", label=name, markersize=3)
    ax.set_title("downstream evaluation (test split, one seed)")
    ax.set_xlabel("step")
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
        xs, ys = _series([r for r in val if r["source"] == source], "val_loss")
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
    for ax, title in (
        (ax_val, "validation loss per source"),
        (ax_share, "share of the training samples so far"),
    ):
        ax.set_title(title, pad=12 if spans else 6)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        shade_phases(ax, spans)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out_dir) if out_dir else metrics_path.parent / "plots"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sources.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = ArgumentParser(prog="python -m pretrain.plot", description=__doc__)
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
