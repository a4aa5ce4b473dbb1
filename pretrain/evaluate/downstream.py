"""Downstream evaluation during pretraining: one seed, the task's lr grid, capped examples.

The trainer calls, on rank 0 after a checkpoint of every Nth step::

    from bertforge.pretrain.data.downstream_tasks import load_downstream_tasks
    from bertforge.pretrain.evaluate.downstream import evaluate_state_dict
    tasks = load_downstream_tasks("TASKS.json", max_examples=2000)       # once, at start-up
    records = evaluate_state_dict(model.hf_state_dict(unpad_vocab=True),
                                  model.hf_config(unpad_vocab=True), tokenizer_dir, tasks,
                                  seed=0)
    for rec in records: metrics_writer.write({"step": step, **rec})

Each record is ``{"split": "downstream", "task", "metric", "value", "lr", "seed", "train",
"test", "seconds"}``: every metric of the task's test split after fine-tuning a copy of the
weights with the task's recipe at the learning rate of its grid with the best dev score (one run
per lr: a fixed rate that suits an early checkpoint can be wrong for a late one). The weights
passed in are copied and never modified; the global torch/numpy/python RNG states are restored
afterwards, so calling this does not change the training that follows.

Or, so that no rank waits: after the checkpoint of step N is complete, rank 0 starts
``python -m pretrain.evaluate.downstream RUN@N --tasks TASKS.json --out RUN/downstream.jsonl``
in the background (``subprocess.Popen``); that process appends the same records, with ``"step":
N``, and the trainer copies finished ones into metrics.jsonl / TensorBoard. ``--tasks
glue:DIR[:TASKS]`` (or ``clue:``) scores a GLUE or CLUE folder instead, with the run_glue protocol
(:mod:`pretrain.evaluate.glue.checkpoint_job`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.cli import ArgumentParser
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.logs import get_logger
from bertforge.pretrain.checkpoints import leases
from bertforge.pretrain.data.downstream_tasks import TaskData, load_downstream_tasks
from bertforge.pretrain.data.glue.spec import is_benchmark_spec
from bertforge.pretrain.evaluate.finetune import encode_for, recipe_for, run_once
from bertforge.pretrain.evaluate.glue.checkpoint_job import (
    checkpoint_progress,
    load_capped,
    score_checkpoint,
)
from bertforge.pretrain.evaluate.glue.progress_plot import redraw
from bertforge.pretrain.evaluate.metrics import PRIMARY
from bertforge.pretrain.evaluate.models import ModelSource, materialize, resolve
from bertforge.pretrain.evaluate.runner import choose_lr, default_device

log = get_logger(__name__)


@contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore python, numpy, torch (and CUDA) RNG states on exit."""
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def evaluate_source(
    source: ModelSource, tasks: list[TaskData], seed: int = 0, device: torch.device | None = None
) -> list[dict[str, Any]]:
    """Per task, one run per lr of its grid (``seed``), the best on dev reported as
    ``split: downstream`` records."""
    device = device or default_device()
    records = []
    with preserved_rng():
        for data in tasks:
            recipe = recipe_for(data)
            encoded = encode_for(source.tokenizer, data, recipe)
            runs = [run_once(source, data, encoded, recipe, lr, seed, device) for lr in recipe.lrs]
            lr = choose_lr(runs, PRIMARY[data.scheme])  # the evaluator's own rule
            best = next(r for r in runs if r["lr"] == lr)
            for metric, value in sorted(best["test"].items()):
                records.append(
                    {
                        "split": "downstream",
                        "task": data.spec.name,
                        "metric": metric,
                        "value": value,
                        "lr": best["lr"],
                        "seed": seed,
                        "train": len(data.train),
                        "test": len(data.test),
                        "seconds": sum(r["seconds"] for r in runs),
                    }
                )
    return records


def evaluate_state_dict(
    hf_state_dict: dict[str, Any],
    hf_config,
    tokenizer_dir: str | Path,
    tasks: list[TaskData],
    seed: int = 0,
    device: torch.device | None = None,
) -> list[dict[str, Any]]:
    """Fine-tune a copy of the weights on each task once; returns ``split: downstream``
    records."""
    cpu_sd = {
        k: v.detach().to("cpu", copy=True)
        if not v.is_floating_point()
        else v.detach().to("cpu", torch.float32, copy=True)
        for k, v in hf_state_dict.items()
    }  # an fp32 copy on the CPU: training goes on with the original weights
    source = ModelSource.from_state_dict(cpu_sd, hf_config, tokenizer_dir)
    return evaluate_source(source, tasks, seed, device)


def main(argv: list[str] | None = None) -> int:
    """Command line: evaluate one checkpoint the downstream way and append its records.

    Lets the trainer run the evaluation in a background process after a checkpoint (no rank
    waits for it) and read the records back when the process has finished.
    """
    p = ArgumentParser(prog="python -m pretrain.evaluate.downstream", description=main.__doc__)
    p.add_argument("model", help="RUN@STEP, a run folder or an HF folder")
    p.add_argument(
        "--tasks",
        required=True,
        help="tasks JSON file, or glue:DIR[:TASK,...] / clue:DIR[:TASK,...] (a GLUE or CLUE "
        "folder, fine-tuned with the run_glue protocol: pretrain.evaluate.glue.checkpoint_job)",
    )
    p.add_argument("--out", required=True, help="JSONL file the records are appended to")
    p.add_argument(
        "--max_examples", type=int, default=2000, help="per task (glue:/clue: train examples)"
    )
    p.add_argument("--seed", type=int, default=None, help="default 0 (glue:/clue: 42, run_glue's)")
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    try:
        ref = resolve(args.model)[-1]
        glue = is_benchmark_spec(args.tasks)  # glue:DIR / clue:DIR (checkpoint_job), or a file
        bench = load_capped(args.tasks, args.max_examples) if glue else None
        tasks = None if bench else load_downstream_tasks(args.tasks, args.max_examples)
        workdir = Path(tempfile.mkdtemp(prefix="bertforge_downstream_"))
        hf_dir = materialize(ref, workdir)
        source = None if bench else ModelSource.from_hf_dir(hf_dir)
        extra = {"step": ref.step, **(checkpoint_progress(ref) if bench else {})}
        if ref.checkpoint is not None:  # read: the trainer's --keep_last may prune it now
            leases.release(leases.lease_path(ref.checkpoint, os.getpid()))
    except UserError as e:
        log.error(str(e))
        return USER_ERROR_EXIT
    device = torch.device(args.device) if args.device else None
    if bench:
        records = score_checkpoint(hf_dir, *bench, args.seed, device, extra)
    else:
        seed = 0 if args.seed is None else args.seed
        records = [{**extra, **r} for r in evaluate_source(source, tasks, seed, device)]
    shutil.rmtree(workdir, ignore_errors=True)
    with open(args.out, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    log.info(f"{len(records)} records appended to {args.out}")
    if bench and (plot := redraw(Path(args.out).parent, bench[0].benchmark)):
        log.info(f"redrew {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
