"""``BENCH_vs_tokens.png``: a run's GLUE (or CLUE) while it trains, against the tokens it had
trained on and, when its checkpoints record it, against its training hours.

Each background job of ``--downstream_eval glue:...`` redraws it after appending its records
(:mod:`pretrain.evaluate.glue.checkpoint_job`), from every ``split: "downstream"`` record of the
benchmark in the ``*.jsonl`` files of one folder (``RUN/downstream/``; a record repeated, e.g.
in a copy, counts once): one panel per x-axis, each task's first metric (the one its lr would be
chosen by) x 100 and the benchmark score. Jobs that finish together take turns (a lock file), so
the last drawing holds every record. Here and not in ``pretrain.plot``: the job draws it.
"""

from __future__ import annotations

import fcntl
import io
import json
from pathlib import Path
from typing import Any

from bertforge.files import write_bytes_atomic
from bertforge.logs import get_logger
from bertforge.pretrain.data.glue.tasks import BENCHMARKS

log = get_logger(__name__)

_AXES = (("tokens", "tokens trained on"), ("hours", "training hours (h)"))


def read_records(folder: Path, benchmark: str) -> list[dict[str, Any]]:
    """The benchmark's downstream records of the folder's JSONL files, one per (step, task,
    metric): the last one read."""
    seen: dict[tuple, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line still being written
            if r.get("split") == "downstream" and r.get("benchmark") == benchmark:
                seen[(r.get("step"), r["task"], r["metric"])] = r
    return list(seen.values())


def first_metrics(benchmark: str) -> dict[str, str]:
    """Reported name ("RTE", "MNLI-m", "GLUE") -> the metric drawn for it."""
    out = {
        task.reported_name(split): task.metrics[0]
        for task in BENCHMARKS[benchmark].values()
        for split in task.evals
    }
    out[benchmark.upper()] = "score"
    return out


def _token_scale(top: float) -> tuple[float, str]:
    for scale, unit in ((1e9, "billions"), (1e6, "millions"), (1e3, "thousands")):
        if top >= scale:
            return scale, unit
    return 1.0, "tokens"


def draw(records: list[dict[str, Any]], benchmark: str, path: Path) -> Path | None:
    """The figure of ``records`` at ``path`` (None, and nothing drawn: no record has tokens or
    hours)."""
    # Lazy: matplotlib (pyplot) only when a figure is drawn.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = [(key, label) for key, label in _AXES if any(key in r for r in records)]
    if not axes:
        return None
    drawn = first_metrics(benchmark)
    names = [n for n in drawn if any(r["task"] == n for r in records)]
    fig, panels = plt.subplots(1, len(axes), figsize=(6.5 * len(axes), 4.5), squeeze=False)
    for ax, (key, label) in zip(panels[0], axes):
        top = max(r[key] for r in records if key in r)
        scale, unit = _token_scale(top) if key == "tokens" else (1.0, "")
        for name in names:
            points = sorted(
                (r[key] / scale, 100 * r["value"])
                for r in records
                if r["task"] == name and r["metric"] == drawn[name] and key in r
            )
            if not points:
                continue
            style = {"color": "k", "lw": 2.5} if name == benchmark.upper() else {}
            ax.plot(*zip(*points), "o-", label=f"{name} {drawn[name]}", markersize=3, **style)
        ax.set_xlabel(f"{label} ({unit})" if unit else label)
        ax.set_ylabel("dev score x 100")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{benchmark.upper()} during pretraining (run_glue, one seed, capped train)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())
    return path


def redraw(folder: Path, benchmark: str) -> Path | None:
    """Redraw ``folder/BENCH_vs_tokens.png`` from every record of the folder, one job at a time."""
    path = folder / f"{benchmark}_vs_tokens.png"
    with open(folder / f".{benchmark}_plot.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        drawn = draw(read_records(folder, benchmark), benchmark, path)
    if drawn is None:
        log.warning(f"no {benchmark.upper()} record in {folder} has tokens or hours: no plot")
    return drawn
