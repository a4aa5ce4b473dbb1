"""Tasks side by side, one per device, as MosaicBERT's glue.py runs one task per GPU.

Each device gets a process of its own (spawned: CUDA cannot be forked) that runs one task at a
time; a free device takes the next ready task, the largest first, so the long tasks do not end
up last. A task that starts from the MNLI fine-tuned model is ready once MNLI is done: the MNLI
job saves the encoder of its chosen run (the chosen lr, first seed) to ``scratch`` and the later
jobs load it. A job is the same code as the serial path (suite.task_runs), so its scores are the
serial run's on the same kind of device and thread count; a CPU worker gets an equal share of the
parent's threads.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import torch

from bertforge.pretrain.data.glue.readers import BenchmarkData
from bertforge.pretrain.evaluate.glue.finetune import total_steps
from bertforge.pretrain.evaluate.glue.protocols import Settings

MNLI = "MNLI"


def _job(
    hf_dir: str,
    start_state: str | None,
    data: BenchmarkData,
    settings: Settings,
    device: str,
    keep_mnli: str | None,
    threads: int,
) -> list[dict[str, Any]]:
    """One task's runs in a worker process (module doc)."""
    # Lazy: a spawned worker imports the fine-tuning code itself; the parent has it already.
    from bertforge.pretrain.evaluate.glue.task_runs import choose_lr, task_runs
    from bertforge.pretrain.evaluate.models import ModelSource

    torch.set_num_threads(threads)
    source = ModelSource.from_hf_dir(hf_dir)
    if start_state is not None:
        state = torch.load(start_state, map_location="cpu", weights_only=True)
        source = ModelSource(source.config, state, source.tokenizer, "MNLI fine-tuned")
    runs, models = task_runs(source, data, settings, torch.device(device), None)
    if keep_mnli is not None:
        lr = choose_lr(runs, next(iter(data.task.evals)), data.task.metrics[0])
        torch.save(source.with_encoder_of(models[lr], "MNLI").state_dict, keep_mnli)
    return runs


def run_side_by_side(
    hf_dir: str | Path,
    tasks: list[tuple[BenchmarkData, Settings]],
    devices: list[torch.device],
    scratch: Path,
    progress=None,
) -> dict[str, list[dict[str, Any]]]:
    """Every task's runs (name -> runs), each task on one of ``devices`` (module doc)."""
    scratch.mkdir(parents=True, exist_ok=True)
    mnli_state = scratch / "mnli_encoder.pt"
    needs_mnli = any(s.from_mnli for _, s in tasks)
    cpu_threads = max(1, torch.get_num_threads() // len(devices))
    ctx = multiprocessing.get_context("spawn")
    pools = {i: ProcessPoolExecutor(1, mp_context=ctx) for i in range(len(devices))}
    waiting = sorted(tasks, key=lambda t: -total_steps(len(t[0].train), t[1]) * len(t[1].seeds))
    running: dict[Future, tuple[int, BenchmarkData, Settings]] = {}
    done: dict[str, list[dict[str, Any]]] = {}
    try:
        while waiting or running:
            busy = {slot for slot, _, _ in running.values()}
            for slot in (i for i in pools if i not in busy):
                ready = [t for t in waiting if not t[1].from_mnli or MNLI in done]
                if not ready:
                    break
                data, settings = ready[0]
                waiting.remove(ready[0])
                device = devices[slot]
                keep = data.task.name == MNLI and needs_mnli
                fut = pools[slot].submit(
                    _job,
                    str(hf_dir),
                    str(mnli_state) if settings.from_mnli else None,
                    data,
                    settings,
                    str(device),
                    str(mnli_state) if keep else None,
                    cpu_threads if device.type == "cpu" else torch.get_num_threads(),
                )
                running[fut] = (slot, data, settings)
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                _, data, settings = running.pop(fut)
                done[data.task.name] = fut.result()  # a worker's exception surfaces here
                if progress is not None:
                    runs = len(settings.lrs) * len(settings.seeds)
                    progress.update(total_steps(len(data.train), settings) * runs)
    finally:
        for pool in pools.values():
            pool.shutdown(cancel_futures=True)
    return done
