"""Run a benchmark (GLUE or CLUE) for several models: every task, learning rate and seed.

Per model and task: each (lr, seed) of the task's settings is one fine-tuning run (finetune.py)
scored on every reported split. The lr with the best median score on the first reported split's
first metric is chosen; its median, min and max over the seeds are reported per split and metric
(protocols.py). MNLI runs first when a task starts from the MNLI fine-tuned model (the model of
MNLI's chosen lr and first seed). An estimate of the work is logged before the first step, and a
progress bar counts the optimizer steps of every run.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bertforge.errors import UserError
from bertforge.logs import get_logger
from bertforge.pretrain.data.glue.readers import BenchmarkData
from bertforge.pretrain.data.glue.tasks import benchmark_score, score_definition
from bertforge.pretrain.evaluate.glue.finetune import total_steps
from bertforge.pretrain.evaluate.glue.parallel import run_side_by_side
from bertforge.pretrain.evaluate.glue.protocols import PROTOCOLS, Settings, task_settings
from bertforge.pretrain.evaluate.glue.task_runs import choose_lr, task_runs
from bertforge.pretrain.evaluate.models import ModelSource, materialize, resolve_all
from bertforge.pretrain.evaluate.runner import default_device, spread

log = get_logger(__name__)

MNLI = "MNLI"


def plan(
    datas: list[BenchmarkData], protocol: str, overrides: dict[str, Any]
) -> list[tuple[BenchmarkData, Settings]]:
    """Each task with its settings, MNLI first when another task starts from it."""
    planned = [(d, task_settings(protocol, d.task.name, overrides)) for d in datas]
    starters = [d.task.name for d, s in planned if s.from_mnli]
    if starters and MNLI not in [d.task.name for d in datas]:
        raise UserError(
            f"--protocol {protocol} starts {', '.join(starters)} from the MNLI fine-tuned model, "
            "and MNLI is not among the tasks: add MNLI (to the folder or to --only), or pass "
            "--from_mnli off to start every task from the pretrained model"
        )
    return sorted(planned, key=lambda p: p[0].task.name != MNLI)


def planned_steps(tasks: list[tuple[BenchmarkData, Settings]]) -> int:
    """Optimizer steps of every run of one model."""
    return sum(total_steps(len(d.train), s) * len(s.lrs) * len(s.seeds) for d, s in tasks)


def _aggregate(data: BenchmarkData, settings: Settings, runs: list[dict[str, Any]]) -> dict:
    task = data.task
    first = next(iter(task.evals))
    lr = choose_lr(runs, first, task.metrics[0])
    chosen = [r for r in runs if r["lr"] == lr]
    return {
        "task": task.name,
        "lr": lr,
        # by reported name ("CoLA", "MNLI-m"): the table's columns, glue.json's keys
        "evals": {
            task.reported_name(split): {
                m: spread([r["scores"][split][m] for r in chosen]) for m in task.metrics
            }
            for split in task.evals
        },
        "settings": settings_dict(settings),
        "train": len(data.train),
        "eval_sizes": {task.reported_name(s): len(part) for s, part in data.evals.items()},
        "runs": runs,
    }


def settings_dict(settings: Settings) -> dict[str, Any]:
    """Settings as JSON-ready values."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in settings.__dict__.items()}


def default_devices() -> list[torch.device]:
    """Every GPU, one task on each (MosaicBERT's glue.py does the same); else the CPU."""
    n = torch.cuda.device_count()
    return [torch.device(f"cuda:{i}") for i in range(n)] if n else [default_device()]


def _serial(
    hf_dir, tasks: list[tuple[BenchmarkData, Settings]], device, progress, label: str
) -> dict[str, list[dict[str, Any]]]:
    """Every task's runs on one device, in order (MNLI first)."""
    source = ModelSource.from_hf_dir(hf_dir)
    mnli_source, done = None, {}
    for data, settings in tasks:
        if progress is not None:
            progress.set_description(f"{label} {data.task.name}")
        start = mnli_source if settings.from_mnli else source
        runs, models = task_runs(start, data, settings, device, progress)
        if models:
            lr = choose_lr(runs, next(iter(data.task.evals)), data.task.metrics[0])
            mnli_source = source.with_encoder_of(models[lr], f"{label} fine-tuned on MNLI")
        done[data.task.name] = runs
    return done


def evaluate_benchmark(
    benchmark: str,
    model_specs: list[str],
    datas: list[BenchmarkData],
    protocol: str,
    overrides: dict[str, Any],
    devices: list[torch.device] | None = None,
    workdir: str | None = None,
    progress_bar: bool = True,
) -> dict[str, Any]:
    """Fine-tune and score every model on every task (see the module doc); the results. With
    several ``devices`` the tasks run side by side, one per device (parallel.py)."""
    # Lazy: tqdm only when a run starts.
    from tqdm import tqdm

    devices = devices or default_devices()
    where = ", ".join(map(str, devices))
    tasks = plan(datas, protocol, overrides)
    refs = resolve_all(model_specs)
    steps = planned_steps(tasks)
    n_runs = sum(len(s.lrs) * len(s.seeds) for _, s in tasks)
    log.info(
        f"{benchmark.upper()} ({protocol}): {len(refs)} model(s) x {len(tasks)} task(s) "
        f"({', '.join(d.task.name for d, _ in tasks)}), {n_runs} run(s) and {steps:,} optimizer "
        f"steps per model on {where}; the bar's rate after a few steps gives the time left"
    )
    results, started = [], time.perf_counter()
    bar = tqdm(total=steps * len(refs), unit="step", disable=not progress_bar, dynamic_ncols=True)
    try:
        for ref in refs:
            log.info(f"{ref.label}: {ref.checkpoint or ref.path}")
            hf_dir = materialize(ref, workdir)
            if len(devices) > 1:
                with tempfile.TemporaryDirectory(prefix="glue-") as scratch:
                    done = run_side_by_side(hf_dir, tasks, devices, Path(scratch), bar)
            else:
                done = _serial(hf_dir, tasks, devices[0], bar, ref.label)
            for data, settings in tasks:
                agg = _aggregate(data, settings, done[data.task.name])
                agg["start"] = "MNLI fine-tuned" if settings.from_mnli else "pretrained"
                results.append({"model": ref.label, "step": ref.step, **agg})
    finally:
        bar.close()
    out = {
        "benchmark": benchmark,
        "protocol": protocol,
        "protocol_source": PROTOCOLS[protocol].source,
        "reported": reported_rule(tasks),
        "score": score_definition(benchmark),
        "sources": [r.as_record() for r in refs],
        "tasks": [
            {"name": d.task.name, "layout": d.layout, "path": str(d.path), "metrics": m}
            for d, _ in tasks
            if (m := list(d.task.metrics))
        ],
        "results": results,
        "device": where,
        "seconds": time.perf_counter() - started,
    }
    out["summary"] = summary(out)
    return out


def reported_rule(tasks: list[tuple[BenchmarkData, Settings]]) -> str:
    """Which number is reported, in words (tables, JSON, model cards)."""
    grid = any(len(s.lrs) > 1 for _, s in tasks)
    seeds = sorted({len(s.seeds) for _, s in tasks})
    counts = "/".join(map(str, seeds))
    rule = f"median [min, max] over {counts} seed(s) of each task"
    if grid:
        rule += (
            "; the lr with the best median dev score, chosen on the dev split that is reported "
            "(as BERT's paper chose its dev numbers: optimistic)"
        )
    return rule


def summary(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{model: {split: {metric: median}, ..., benchmark: score}}`` (medians, fractions)."""
    out: dict[str, dict[str, Any]] = {}
    for r in results["results"]:
        row = out.setdefault(r["model"], {})
        for name, metrics in r["evals"].items():
            row[name] = {m: st["median"] for m, st in metrics.items()}
    for row in out.values():
        row[results["benchmark"]] = benchmark_score(results["benchmark"], row)
    return out
