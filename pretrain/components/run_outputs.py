"""What a run writes, for :mod:`pretrain.build`: rank 0's lock on the run folder, the folder's
config.json, recipe and tokenizer, the metrics writer, and the checkpoints (with the EMA they
carry) and what each records besides the step and data position."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from bertforge.data_prep.lock import FolderLock
from bertforge.files import publish_dir, write_json_atomic, write_text_atomic
from bertforge.logs import process_rank
from bertforge.pretrain.checkpoints.checkpoint import CheckpointManager
from bertforge.pretrain.components.ema import EMA
from bertforge.pretrain.components.metrics import MetricsWriter, device_peak_tflops
from bertforge.pretrain.components.run_parts import Resolved, RunOutputs, StepSetup
from bertforge.pretrain.config.ds_config import DeepSpeedSetup
from bertforge.pretrain.config.recipe import resolved_flags, resolved_recipe
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.data.mixture import describe_data
from bertforge.pretrain.distributed import watchdog
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.schedule import anneal


def take_run_lock(cfg: TrainConfig) -> FolderLock | None:
    """Rank 0's lock on --output_dir (one job per run folder), taken before anything is written
    there; None on the other ranks (they stop at the rendezvous when rank 0 is refused)."""
    if process_rank() != 0:
        return None
    run = Path(cfg.run.output_dir).resolve()
    lock = FolderLock(RunFolder(run).lock, f"run folder {run}").acquire()
    watchdog.at_exit(lock.release)  # its exit 3 skips main's finally: leave no lock behind
    return lock


def write_run_files(cfg: TrainConfig, run: Resolved, world: int, init_report: dict | None) -> None:
    """The run folder's config.json (everything resolved) and a copy of the tokenizer, so that
    export does not need the shard folder."""
    folder, setup, reader = RunFolder(cfg.run.output_dir), run.setup, run.train_reader
    if not folder.tokenizer.is_dir():
        with publish_dir(folder.tokenizer) as tmp:
            shutil.copytree(reader.tokenizer_path, tmp, dirs_exist_ok=True)
    write_json_atomic(
        folder.config,
        {
            **cfg.to_dict(),
            "deepspeed": setup.config,
            "batch_plan": setup.batch.as_dict(),
            "precision_resolved": setup.precision,
            "activation_checkpointing": setup.activation_checkpointing,
            "world_size": world,
            "tokenizer_fingerprint": reader.manifest["tokenizer"]["fingerprint"],
            "precision_note": setup.precision_note,
            "argv": list(sys.argv),  # the exact command (the model card quotes it)
            **({"init_from": init_report} if init_report else {}),
            **({"anneal_from": run.anneal.to_dict()} if run.anneal else {}),
            **({"phases": run.phases.as_dict()} if run.phases else {}),
        },
        indent=2,
        sort_keys=True,
    )
    if run.phases:
        write_json_atomic(folder.phases, run.phases.as_dict(), indent=2)
    write_text_atomic(folder.recipe, resolved_recipe(cfg, setup))


def run_state(
    cfg: TrainConfig,
    reader,
    setup: DeepSpeedSetup,
    init_report: dict | None,
    plan: anneal.AnnealPlan | None = None,
) -> dict:
    """What every checkpoint of this run records besides the step and data position."""
    return {
        **({"anneal_from": plan.to_dict()} if plan else {}),
        "config": resolved_flags(cfg, setup),  # the lr and batch as they ran (a dry run reads it)
        "vocab_size": reader.vocab_size,
        "tokenizer_fingerprint": reader.manifest["tokenizer"]["fingerprint"],
        "precision": setup.precision,
        "nsp": reader.format == "nsp",
        "init_from": init_report,
        "data_mixture": describe_data(reader),
    }


def open_checkpoints(cfg: TrainConfig, place: StepSetup) -> CheckpointManager:
    """This rank's checkpoint manager, with --ema's moving average (rank 0's) to save along."""
    ckpts = CheckpointManager(
        cfg.run.output_dir, cfg.checkpoint, place.rank, place.world, place.device
    )
    ckpts.ema = EMA(cfg.optim.ema, place.rank) if cfg.optim.ema else None
    return ckpts


def open_metrics(cfg: TrainConfig, place: StepSetup, start_step: int, model, run: Resolved):
    """The metrics writer of this rank (rank 0 writes; DeepSpeed's monitor gets the records)."""
    return MetricsWriter(
        cfg.run.output_dir,
        rank=place.rank,
        max_steps=cfg.run.max_steps,
        start_step=start_step,
        log_interval=cfg.log.log_interval,
        flops_per_token=model.flops_per_token(run.train_reader.max_seq_len),
        peak_tflops=device_peak_tflops(run.setup.precision),
        world_size=place.world,
        monitor=place.engine.monitor if place.rank == 0 else None,
        progress=cfg.log.progress,
        progress_interval_s=cfg.log.progress_interval_s,
        loss_scaling=run.setup.precision == "fp16",
    )


def open_outputs(
    cfg: TrainConfig,
    run: Resolved,
    place: StepSetup,
    model,
    ckpts: CheckpointManager,
    start_step: int,
    elapsed_s: float,
    init_report: dict | None,
) -> RunOutputs:
    """The metrics (a resumed launch's record says where it continued, after ``elapsed_s`` of
    earlier launches), the checkpoints, and what every checkpoint records (a phase plan too)."""
    metrics = open_metrics(cfg, place, start_step, model, run)
    if run.point is not None:  # metrics.jsonl marks where this launch continued
        metrics.resumed(start_step, str(run.point.path), elapsed_s)
    outputs = RunOutputs(
        metrics, ckpts, run_state(cfg, run.train_reader, run.setup, init_report, run.anneal)
    )
    if run.phases:  # every checkpoint records the plan it was trained under
        outputs.base_state["phases"] = run.phases.as_dict()
    return outputs
