"""GLUE fine-tuning throughput: ours (``pretrain.evaluate.glue.finetune``) vs transformers' Trainer.

One task, one model (all-MiniLM-L6-v2 unless ``--model``), the same settings and examples on both
sides (``glue_trainer``: the same reader, tokenization, hyper-parameters and seed; the Trainer
with length-grouped batches padded to their longest example). Each side first trains
``--warmup`` batches untimed (a process's first training pays one-time costs). Then the sides
alternate (ours first in even repeats, the Trainer first in odd ones), each repeat with a new
seed, so a slow spell of a shared machine falls on both. Measured: train examples per second
over the training span only (first batch to last optimizer step: no model load, no evaluation).
Printed: per side the median [min, max] over the repeats and the ratio of the medians; the ratio
within each repeat, by the wall clock and by the process's CPU time (steadier on a shared
machine); the padded tokens per second (each side draws its own length-grouped order, so a run's
padding, and with it its examples/s, differs by chance). ``--out`` writes every run as JSON.

    python -m benchmarks.evaluation.glue_throughput --task SST-2 --repeats 3
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import REPO
from benchmarks.evaluation.glue_trainer import load_task, minilm_dir, run_ours, run_trainer
from bertforge.pretrain.evaluate.glue.protocols import task_settings

SIDES = ("ours", "trainer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.evaluation.glue_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--glue", type=Path, default=REPO / "tests" / "data" / "glue")
    p.add_argument("--task", default="SST-2")
    p.add_argument("--model", type=Path, default=None, help="HF folder (default: all-MiniLM-L6-v2)")
    p.add_argument("--repeats", type=int, default=3, help="runs per side, alternating")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_length", type=int, default=128)
    p.add_argument("--max_train_examples", type=int, default=None, help="first N of train")
    p.add_argument(
        "--max_dev_examples", type=int, default=64, help="first N of dev (scored, not timed)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the first repeat (then +1 each)")
    p.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="batches each side trains once, untimed, before the repeats (a process's first "
        "training pays one-time costs: kernel set-up, memory growth); 0: none",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", type=Path, default=None, help="write every run as JSON here")
    return p.parse_args(argv)


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Per side: train examples/s median, min, max (and the Trainer's own figure)."""
    out = {}
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side]
        out[side] = {"runs": len(mine), **_spread([r["train_examples_per_second"] for r in mine])}
        out[side]["tokens_per_second"] = _spread(
            [r["train_tokens"] / r["train_seconds"] for r in mine]
        )
        out[side]["per_cpu_second"] = _spread(
            [r["train_examples"] / r["train_cpu_seconds"] for r in mine]
        )
        if side == "trainer":
            out[side]["hf_own"] = _spread([r["hf_train_samples_per_second"] for r in mine])
    out["ratio"] = out["ours"]["median"] / out["trainer"]["median"]
    # the two runs of one repeat ran back to back: their ratio is steadier than the medians' on
    # a machine whose other jobs come and go
    by_repeat: dict[int, dict[str, dict]] = {}
    for r in runs:
        by_repeat.setdefault(r["repeat"], {})[r["side"]] = r
    pairs = [(v["ours"], v["trainer"]) for v in by_repeat.values() if len(v) == 2]
    out["paired_ratio"] = _spread(
        [o["train_examples_per_second"] / t["train_examples_per_second"] for o, t in pairs]
    )
    # CPU time: what the process itself spent, less swayed by other jobs than the wall clock
    out["paired_cpu_ratio"] = _spread(
        [t["train_cpu_seconds"] / o["train_cpu_seconds"] for o, t in pairs]
    )
    return out


def table(summary: dict, runs: list[dict]) -> str:
    """The Markdown table docs/benchmarks.md quotes."""
    lines = [
        "| side | runs | train examples/s median [min, max] | vs Trainer "
        "| padded tokens/s median [min, max] | examples per CPU-second | dev score (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for side in SIDES:
        s = summary[side]
        first = next(r for r in runs if r["side"] == side)["scores"]
        split = next(iter(first))
        metric = next(iter(first[split]))
        score = statistics.median(r["scores"][split][metric] for r in runs if r["side"] == side)
        ratio = s["median"] / summary["trainer"]["median"]
        tok, cpu = s["tokens_per_second"], s["per_cpu_second"]
        lines.append(
            f"| {side} | {s['runs']} | {s['median']:.2f} [{s['min']:.2f}, {s['max']:.2f}] | "
            f"{ratio:.2f}x | {tok['median']:.0f} [{tok['min']:.0f}, {tok['max']:.0f}] | "
            f"{cpu['median']:.2f} [{cpu['min']:.2f}, {cpu['max']:.2f}] | {metric} {score:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    # Lazy: the model source imports transformers (seconds).
    from bertforge.pretrain.evaluate.models import ModelSource

    hf_dir = args.model or minilm_dir()
    data = load_task(args.glue, args.task, args.max_train_examples, args.max_dev_examples)
    overrides = {
        "lrs": (args.lr,),
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
    }
    settings = task_settings("run_glue", data.task.name, overrides)
    source = ModelSource.from_hf_dir(hf_dir)
    print(
        f"{data.task.name}: {len(data.train)} train examples from {data.path}; model {hf_dir}; "
        f"lr {args.lr:g}, {args.epochs:g} epoch(s), batch {args.batch_size}, max_length "
        f"{args.max_length}; {torch.get_num_threads()} torch thread(s), {os.cpu_count()} CPU(s)"
        f"; {args.repeats} repeat(s) per side, alternating",
        flush=True,
    )
    if args.warmup:
        warm = copy.copy(data)
        warm.train = data.train.head(args.warmup * args.batch_size)
        warm.evals = {k: p.head(4) for k, p in data.evals.items()}  # Pearson needs 2+
        one_epoch = dataclasses.replace(settings, epochs=1.0)
        run_ours(source, warm, one_epoch, args.lr, args.seed)
        run_trainer(hf_dir, warm, one_epoch, args.lr, args.seed)
    runs = []
    for r in range(args.repeats):
        seed = args.seed + r
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            if side == "ours":
                run = run_ours(source, data, settings, args.lr, seed)
            else:
                run = run_trainer(hf_dir, data, settings, args.lr, seed)
            run["repeat"] = r
            runs.append(run)
            print(
                f"repeat {r} {side:7s} seed {seed}: {run['train_examples']} examples "
                f"({run['train_tokens']} tokens padded) in {run['train_seconds']:.2f} s = "
                f"{run['train_examples_per_second']:.2f}/s, {run['train_cpu_seconds']:.2f} CPU-s "
                f"({run['steps']} steps); dev {run['scores']}",
                flush=True,
            )
    summary = summarize(runs)
    print(table(summary, runs))
    own = summary["trainer"]["hf_own"]
    paired, cpu = summary["paired_ratio"], summary["paired_cpu_ratio"]
    print(
        f"ours / Trainer: {summary['ratio']:.2f}x (medians); per repeat {paired['median']:.2f}x "
        f"[{paired['min']:.2f}, {paired['max']:.2f}]; per repeat in CPU time "
        f"{cpu['median']:.2f}x [{cpu['min']:.2f}, {cpu['max']:.2f}]. "
        "The Trainer's own train_samples_per_second "
        f"(its clock starts before its set-up): median {own['median']:.2f} "
        f"[{own['min']:.2f}, {own['max']:.2f}]"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "task": data.task.name,
            "train_examples": len(data.train),
            "settings": {**overrides, "lrs": list(overrides["lrs"])},
            "threads": torch.get_num_threads(),
            "date": time.strftime("%Y-%m-%d"),
            "summary": summary,
            "runs": runs,
        }
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
