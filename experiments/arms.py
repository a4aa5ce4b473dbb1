"""The machinery of a side-by-side experiment: arms that each pretrain (or not) and are each
fine-tuned by ``pretrain.evaluate`` over the same seeds and lr grid, then a table of every arm's
median [min, max] per task with the paired difference to a reference arm (bootstrap 95% interval
over seeds), and a plot. Used by ``downstream_gain`` (experiment A) and ``domain_gain`` (B).

Every stage leaves its result in OUT and is skipped when it is there, so a killed experiment
continues where it stopped.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, one_thread_env
from bertforge.logs import get_logger

log = get_logger(__name__)

BOOTSTRAP = 10_000  # resamples of the seeds for the interval of the mean paired difference


def paired_difference(arm: list[float], ref: list[float], seed: int = 0) -> dict:
    """Mean of ``arm[i] - ref[i]`` over seeds and its bootstrap 95% interval (percentile)."""
    diffs = [a - b for a, b in zip(arm, ref, strict=True)]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(BOOTSTRAP))
    low, high = means[int(0.025 * BOOTSTRAP)], means[int(0.975 * BOOTSTRAP) - 1]
    return {"mean": statistics.fmean(diffs), "low": low, "high": high, "values": diffs}


class Stages:
    """The subprocess stages of one experiment in OUT (logs in OUT/logs/, one thread each)."""

    def __init__(self, out: Path):
        self.out = out.absolute()
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self.seconds: dict[str, float] = {}

    def run(self, name: str, cmd: list[str]) -> None:
        log_file = self.out / "logs" / f"{name}.log"
        log.info(f"{name}: {' '.join(map(str, cmd))}  (log: {log_file})")
        start = time.monotonic()
        with open(log_file, "a", encoding="utf-8") as f:
            code = subprocess.run(
                [str(c) for c in cmd], cwd=REPO, env=one_thread_env(), stdout=f, stderr=f
            ).returncode
        self.seconds[name] = round(time.monotonic() - start, 1)
        if code != 0:
            tail = log_file.read_text(encoding="utf-8")[-3000:]
            raise SystemExit(f"{name} failed (exit {code}); end of {log_file}:\n{tail}")

    def evaluate(
        self,
        name: str,
        models: list[str],
        tasks: Path,
        only: tuple[str, ...],
        seeds: int,
        recipe: list[str],
    ) -> dict:
        """``pretrain.evaluate`` of `models` into OUT/eval/NAME (skipped when done there)."""
        out = self.out / "eval" / name
        if not (out / "results.json").is_file():
            cmd = [sys.executable, "-m", "bertforge.pretrain.evaluate", "--models", *models]
            cmd += ["--tasks", str(tasks), "--only", *only, "--out", str(out)]
            cmd += ["--seeds", str(seeds), "--device", "cpu", *recipe]
            self.run(f"evaluate_{name}", cmd)
        return json.loads((out / "results.json").read_text(encoding="utf-8"))


def scores(results: dict) -> dict[str, list[float]]:
    """{task: the test primary metric per seed} of the one model of a results.json."""
    return {r["task"]: r["test"][r["primary"]]["values"] for r in results["results"]}


def pretraining_record(run: Path) -> dict:
    """What a pretraining run spent, from its metrics.jsonl: optimizer steps, tokens (the last
    record of each step, so redone steps after a resume count once) and training time over all
    its launches."""
    from bertforge.pretrain.components.metrics import read_metrics

    by_step = {r["step"]: r for r in read_metrics(run / "metrics.jsonl", "train")}
    last = by_step[max(by_step)]
    return {
        "steps": max(by_step),
        "tokens": int(sum(r["tokens"] for r in by_step.values())),
        "training_s": round(last["elapsed_s"], 1),
    }


def summarise(
    arms: dict[str, dict[str, list[float]]],
    refs: list[dict],
    seeds: int,
    tasks: tuple[str, ...],
    reference: str,
) -> dict:
    """Per task: each arm's median [min, max], its paired difference to the reference arm, and
    the reference rows (majority class, classical model)."""
    out = {}
    for task in tasks:
        ref = arms[reference][task]
        out[task] = {
            "arms": {
                arm: {
                    "median": statistics.median(v[task]),
                    "min": min(v[task]),
                    "max": max(v[task]),
                    "values": v[task],
                    **(
                        {"vs_" + reference: paired_difference(v[task], ref)}
                        if arm != reference
                        else {}
                    ),
                }
                for arm, v in arms.items()
            },
            "references": {
                r["model"]: r["test"][r["primary"]]["median"] for r in refs if r["task"] == task
            },
        }
    return {"seeds": seeds, "reference": reference, "tasks": out}


def markdown(summary: dict) -> str:
    """The table: one row per arm and reference, one column per task."""
    reference = summary["reference"]
    head = "| arm | " + " | ".join(summary["tasks"]) + " |"
    lines = [head, "|---" * (len(summary["tasks"]) + 1) + "|"]
    arms = next(iter(summary["tasks"].values()))["arms"]
    for arm in arms:
        cells = []
        for t in summary["tasks"].values():
            s = t["arms"][arm]
            cell = f"{s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]"
            if (d := s.get("vs_" + reference)) is not None:
                cell += f"; {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
            cells.append(cell)
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    refs = dict.fromkeys(r for t in summary["tasks"].values() for r in t["references"])
    for ref in refs:
        row = [
            f"{t['references'][ref]:.3f}" if ref in t["references"] else "-"
            for t in summary["tasks"].values()
        ]
        lines.append(f"| *{ref}* (reference) | " + " | ".join(row) + " |")
    note = (
        f"\nTest score median [min, max] over {summary['seeds']} fine-tuning seeds; after the "
        f"semicolon, the mean paired difference to `{reference}` (same seed) with its bootstrap "
        "95% interval."
    )
    return "\n".join(lines) + "\n" + note + "\n"


def plot(summary: dict, path: Path) -> None:
    """One panel per task: each arm's seeds as points, the median as a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = summary["tasks"]
    names = list(next(iter(tasks.values()))["arms"])
    width = max(4, 0.7 * len(names) + 1)
    fig, axes = plt.subplots(1, len(tasks), figsize=(width * len(tasks), 3.4), squeeze=False)
    for ax, (task, t) in zip(axes[0], tasks.items()):
        ax.bar(names, [t["arms"][n]["median"] for n in names], color="#cfd8e3")
        for i, n in enumerate(names):
            ax.plot([i] * len(t["arms"][n]["values"]), t["arms"][n]["values"], "k.", ms=5)
        for ref, v in t["references"].items():
            ax.axhline(v, ls="--", lw=0.8, color="#999")
            ax.annotate(ref, (len(names) - 0.5, v), fontsize=7, ha="right", va="bottom")
        ax.set_title(task)
        ax.tick_params(axis="x", labelrotation=30 if len(names) > 3 else 0, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
