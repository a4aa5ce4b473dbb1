"""Every (lr, seed) run of one task on one device: the unit the serial path and the side-by-side
path (parallel.py) both run, and the choice of the reported lr."""

from __future__ import annotations

import statistics
from typing import Any

from bertforge.logs import get_logger
from bertforge.pretrain.data.glue.readers import BenchmarkData
from bertforge.pretrain.evaluate.glue.finetune import encode, fine_tune
from bertforge.pretrain.evaluate.glue.protocols import Settings

log = get_logger(__name__)

MNLI = "MNLI"


def choose_lr(runs: list[dict[str, Any]], split: str, metric: str) -> float:
    """The lr with the best median score over its seeds (the lower lr on a tie)."""
    by_lr: dict[float, list[float]] = {}
    for r in runs:
        by_lr.setdefault(r["lr"], []).append(r["scores"][split][metric])
    return max(by_lr, key=lambda lr: (statistics.median(by_lr[lr]), -lr))


def task_runs(source, data: BenchmarkData, settings: Settings, device, progress):
    """Every (lr, seed) run of one task; the runs, and each run's model kept while MNLI needs it."""
    tok = source.tokenizer
    train = encode(tok, data.train, settings.max_length)
    evals = {
        name: (encode(tok, part, settings.max_length), part.labels)
        for name, part in data.evals.items()
    }
    runs, models = [], {}
    for lr in settings.lrs:
        for seed in settings.seeds:
            result, model = fine_tune(
                source,
                data.task,
                train,
                data.train.labels,
                evals,
                settings,
                lr,
                seed,
                device,
                progress,
            )
            runs.append(result)
            if data.task.name == MNLI and seed == settings.seeds[0]:
                models[lr] = model.to("cpu")
            del model
            log.info(
                f"{data.task.name}: lr {lr:g} seed {seed}: "
                + "; ".join(
                    f"{split} " + ", ".join(f"{m} {v:.4f}" for m, v in sc.items())
                    for split, sc in result["scores"].items()
                )
                + f" ({result['seconds']:.1f} s)"
            )
    return runs, models
