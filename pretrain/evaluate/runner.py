"""Fine-tune every (model, task) pair over the learning-rate grid and K seeds, and aggregate.

For each (model, task): every lr of the grid x every seed is one fine-tuning run scored on dev and
test. The lr with the best median dev score (primary metric) is chosen; the reported numbers are
the test scores of that lr over the seeds: median, min, max, standard deviation and each value.
The test split never takes part in the choice. Each task also gets its two reference rows
(references.py: the majority class and a classical model), fitted on the same splits.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch

from bertforge.logs import get_logger
from bertforge.pretrain.data.downstream_tasks import TaskData
from bertforge.pretrain.evaluate.finetune import (
    encode_for,
    recipe_dict,
    recipe_for,
    run_once,
    total_steps,
)
from bertforge.pretrain.evaluate.metrics import PRIMARY
from bertforge.pretrain.evaluate.models import ModelSource, materialize, resolve_all
from bertforge.pretrain.evaluate.references import reference_rows


def default_device() -> torch.device:
    """The GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min, max, population standard deviation and the values."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "std": statistics.pstdev(values),
        "values": values,
    }


def choose_lr(runs: list[dict[str, Any]], primary: str) -> float:
    """The lr of ``runs`` with the best median dev score (the lower lr on a tie)."""
    by_lr: dict[float, list[float]] = {}
    for r in runs:
        by_lr.setdefault(r["lr"], []).append(r["dev"][primary])
    return max(by_lr, key=lambda lr: (statistics.median(by_lr[lr]), -lr))


def evaluate_pair(
    source: ModelSource,
    data: TaskData,
    seeds: list[int],
    overrides: dict[str, Any] | None = None,
    device: torch.device | None = None,
    log=None,
    progress=None,
) -> dict[str, Any]:
    """All runs of one model on one task, and their aggregate (see the module doc).
    ``progress``: a tqdm bar that counts optimizer steps (``planned_steps`` planned them)."""
    device = device or default_device()
    recipe = recipe_for(data, overrides)
    start = time.perf_counter()
    encoded = encode_for(source.tokenizer, data, recipe)
    if progress is not None and len(encoded.train) != len(data.train):  # windows: more sequences
        extra = total_steps(len(encoded.train), recipe) - total_steps(len(data.train), recipe)
        progress.total += extra * len(recipe.lrs) * len(seeds)
        progress.refresh()
    runs = []
    for lr in recipe.lrs:
        for seed in seeds:
            r = run_once(source, data, encoded, recipe, lr, seed, device, progress)
            runs.append(r)
            if log:
                log(
                    f"  {data.spec.name}: lr {lr:g} seed {seed}: dev {r['dev']} "
                    f"test {r['test']} ({r['seconds']:.1f} s)"
                )
    primary = PRIMARY[data.scheme]
    lr = choose_lr(runs, primary)
    chosen = [r for r in runs if r["lr"] == lr]
    metrics = sorted(chosen[0]["test"])
    return {
        "task": data.spec.name,
        "primary": primary,
        "lr": lr,
        "dev_median_by_lr": {
            str(x): statistics.median(r["dev"][primary] for r in runs if r["lr"] == x)
            for x in recipe.lrs
        },
        "test": {m: spread([r["test"][m] for r in chosen]) for m in metrics},
        "recipe": recipe_dict(recipe),
        # sequences the model saw per split: one per example, or its windows (long_documents)
        "train_sequences": len(encoded.train),
        "test_sequences": len(encoded.test),
        "seeds": seeds,
        "runs": runs,
        "seconds": time.perf_counter() - start,
    }


SMALL_DEV = 100  # below this many dev examples, the lr choice and early stopping are noisy


def reference_results(data: TaskData) -> list[dict[str, Any]]:
    """The task's reference rows in the shape of a model's result (one value, no seeds)."""
    out = []
    for row in reference_rows(data):
        test = {m: spread([v]) for m, v in row.pop("test").items()}
        out.append({**row, "task": data.spec.name, "primary": PRIMARY[data.scheme], "test": test})
    return out


def small_dev_note(data: TaskData) -> str | None:
    """A warning when the dev split is too small to choose the lr and stop on (None: fine)."""
    if len(data.dev) >= SMALL_DEV:
        return None
    return (
        f"{data.spec.name}: the dev split holds {len(data.dev)} examples, so the learning-rate "
        "choice and early stopping rest on few examples; give more training data or a larger "
        '"dev_fraction" in the task'
    )


def describe_task(data: TaskData) -> dict[str, Any]:
    """Sizes and labels of a loaded task, for the results file."""
    spec = data.spec
    return {
        "name": spec.name,
        "type": spec.type,
        "scheme": data.scheme,
        "labels": data.labels,
        "train_file": spec.train,
        "test_file": spec.test,
        "train": len(data.train),
        "dev": len(data.dev),
        "test": len(data.test),
        "primary": PRIMARY[data.scheme],
    }


def planned_steps(tasks: list[TaskData], seeds: list[int], overrides: dict[str, Any] | None) -> int:
    """Optimizer steps of one model's runs: every task's lrs x seeds at its planned length (early
    stopping may end a run sooner)."""
    total = 0
    for data in tasks:
        recipe = recipe_for(data, overrides)
        total += total_steps(len(data.train), recipe) * len(recipe.lrs) * len(seeds)
    return total


def stderr_log(msg: str) -> None:
    """Progress lines go to stderr, the table to stdout."""
    print(msg, file=sys.stderr, flush=True)


def evaluate_models(
    model_specs: list[str],
    tasks: list[TaskData],
    seeds: list[int],
    overrides: dict[str, Any] | None = None,
    device: torch.device | None = None,
    workdir: str | None = None,
    log=stderr_log,
    progress_bar: bool = True,
) -> dict[str, Any]:
    """Evaluate every model (``PATH``, ``RUN@STEP``, ``RUN@all``) on every loaded task."""
    # Lazy: tqdm only when a run starts.
    from tqdm import tqdm

    refs = resolve_all(model_specs)
    device = device or default_device()
    steps = planned_steps(tasks, seeds, overrides)
    runs = sum(len(recipe_for(d, overrides).lrs) * len(seeds) for d in tasks)
    log(
        f"{len(refs)} model(s) x {len(tasks)} task(s): {runs} fine-tuning run(s) and at most "
        f"{steps:,} optimizer steps per model on {device}; the bar's rate after a few steps "
        "gives the time left (fewer runs: --seeds 1, one lr in --lrs, --min_steps 0)"
    )
    notes = [n for n in map(small_dev_note, tasks) if n]
    for note in notes:
        get_logger(__name__).warning(note)
    references = []
    for data in tasks:
        log(f"{data.spec.name}: reference rows (majority class, classical model)")
        references += reference_results(data)
    results = []
    bar = tqdm(total=steps * len(refs), unit="step", disable=not progress_bar, dynamic_ncols=True)
    try:
        for ref in refs:
            log(f"{ref.label}: {ref.checkpoint or ref.path}")
            source = ModelSource.from_hf_dir(materialize(ref, workdir))
            for data in tasks:
                bar.set_description(f"{ref.label} {data.spec.name}")
                res = evaluate_pair(source, data, seeds, overrides, device, log, bar)
                results.append({"model": ref.label, "step": ref.step, **res})
    finally:
        bar.close()
    return {
        "models": [r.as_record() for r in refs],
        "tasks": [describe_task(d) for d in tasks],
        "seeds": seeds,
        "device": str(device),
        "results": results,
        "references": references,
        "notes": notes,
    }
