#!/usr/bin/env python
"""Pretrain a BERT-style masked LM on DeepSpeed (ZeRO-2/3, fp16/bf16/fp32, exact resume).

    deepspeed pretrain/main.py --ds_config ds_configs/zero2.json --data SHARDS --model base \
        --output_dir RUN [--max_steps N --save_interval N --eval_interval N --resume auto ...]

Also runs under ``torchrun`` and as a plain ``python pretrain/main.py`` (one process).
``python pretrain/main.py --help`` lists every flag.

The entry point reads parse -> resolve -> build -> run: flags into a TrainConfig
(:mod:`pretrain.config.train_config`), the DeepSpeed dict for this world size
(:mod:`pretrain.config.ds_config`),
data, model, engine and the resume point (:mod:`pretrain.components.checkpoint`), then the loop
(:class:`pretrain.trainer.Trainer`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `pretrain`, `kernels`, `data_prep` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pretrain.config.train_config import TrainConfig, parse_args


def launch_rank() -> int:
    """This process's global rank as the launcher set it (before any rendezvous); 0 alone."""
    return int(os.environ.get("RANK", "0"))


def launch_clock() -> float:
    """``time.monotonic()`` of this launch's start. A wrapper that started the launcher may set
    BERTFORGE_LAUNCHED_AT (its ``time.time()`` then) so that a --max_time_hours budget also
    counts the launcher's and the imports' seconds (benchmarks/bench_learning.py does)."""
    from pretrain.config.ds_config import ConfigError

    now = time.monotonic()
    value = os.environ.get("BERTFORGE_LAUNCHED_AT")
    if not value:
        return now
    try:
        ago = time.time() - float(value)
    except ValueError:
        raise ConfigError(
            f"BERTFORGE_LAUNCHED_AT={value!r}: expected a Unix time in seconds"
        ) from None
    if not 0.0 <= ago < 86400.0:
        raise ConfigError(f"BERTFORGE_LAUNCHED_AT={value!r} is {ago:.0f} s ago: not this launch's")
    return now - ago


def take_run_lock(cfg: TrainConfig):
    """Rank 0's lock on --output_dir (one job per run folder), taken before anything is written
    there; None on the other ranks (they stop at the rendezvous when rank 0 is refused)."""
    from data_prep.lock import FolderLock

    if launch_rank() != 0:
        return None
    run = Path(cfg.run.output_dir).resolve()
    return FolderLock(run / ".lock", f"run folder {run}").acquire()


def open_shards(cfg: TrainConfig):
    """(training reader, [(source name, validation reader)]) of --data: one shard folder or a
    weighted mixture (pretrain.data.mixture); a source without validation data is warned about."""
    from pretrain.data.mixture import open_training, parse_mixture, validation_readers

    sources = parse_mixture(cfg.run.data_sources)
    verify = cfg.data_cfg.verify
    return open_training(sources, verify=verify), validation_readers(sources, verify=verify)


def verify_shards_once(cfg: TrainConfig, rank: int, world: int, device) -> None:
    """With verify "size" (the default), every shard file's sha256 is checked once per shard
    folder and run folder, split across the ranks after the rendezvous (pretrain.data.shard_check);
    "full" checks them at every launch on every rank, "none" not at all."""
    from pretrain.components.distributed import sum_across_ranks
    from pretrain.data.mixture import parse_mixture
    from pretrain.data.shard_check import verify_once

    if cfg.data_cfg.verify != "size":
        return
    folders = [s.path for s in parse_mixture(cfg.run.data_sources)]
    verify_once(
        folders,
        Path(cfg.run.output_dir),
        rank,
        world,
        agree=lambda failed: sum_across_ranks([float(failed)], device)[0],
    )


def build_model(cfg: TrainConfig, reader, setup, *, init_from: str | None = None):
    """(model, --init_from report or None): the model, identical on every rank (seeded or
    loaded from ``init_from`` before DeepSpeed partitions it), ready for deepspeed.initialize."""
    import deepspeed
    import torch

    from pretrain.model.bert import build_model as build
    from pretrain.model.init_from import load_initial_weights

    torch.manual_seed(cfg.run.seed)
    model = build(
        cfg.model_cfg,
        vocab_size=reader.vocab_size,
        nsp=reader.format == "nsp",
        max_seq_len=reader.max_seq_len,
    )
    report = None
    if init_from:
        report = load_initial_weights(
            model,
            init_from,
            tokenizer_dir_of_shards=reader.tokenizer_path,
            max_seq_len=reader.max_seq_len,
        )
    model.register_zero3_external_parameters()
    if setup.activation_checkpointing == "deepspeed":
        deepspeed.checkpointing.configure(None, deepspeed_config=setup.config)
    model.set_activation_checkpointing(setup.activation_checkpointing)
    return model, report


def run_state(cfg: TrainConfig, reader, setup, init_report: dict | None) -> dict:
    """What every checkpoint of this run records besides the step and data position."""
    return {
        "config": cfg.to_dict(),
        "vocab_size": reader.vocab_size,
        "tokenizer_fingerprint": reader.manifest["tokenizer"]["fingerprint"],
        "precision": setup.precision,
        "nsp": reader.format == "nsp",
        "init_from": init_report,
        "data_mixture": describe_data(reader),
    }


def describe_data(reader) -> list[dict]:
    """The training data's sources (name, path, weight, mask rate, sequences), for checkpoints."""
    if hasattr(reader, "describe"):
        return reader.describe()
    return [
        {
            "name": Path(reader.root).name,
            "path": str(reader.root),
            "weight": 1.0,
            "mask_prob": None,
            "sequences": len(reader),
        }
    ]


def warn_if_data_changed(point, reader, main_rank: bool) -> None:
    """The data position is one number of consumed samples: under other sources or weights it
    points into another stream. Say so (the run goes on: changing a mixture is allowed)."""
    keys = ("name", "path", "weight", "mask_prob")
    saved = [{k: s.get(k) for k in keys} for s in point.state.get("data_mixture") or []]
    now = [{k: s.get(k) for k in keys} for s in describe_data(reader)]
    if main_rank and saved and saved != now:
        print(
            f"[pretrain] WARNING: --data differs from the checkpoint's ({saved} -> {now}); the "
            "resumed run continues at the same sample count of the new stream",
            flush=True,
        )


def build_engine(cfg: TrainConfig, model, ds_config: dict):
    """The DeepSpeed engine and our LR schedule (None when the config brings its scheduler).
    A time-clock schedule is not given to DeepSpeed: the trainer's TimeClockLR applies it."""
    import deepspeed

    from pretrain.components.optim import build_schedule, lr_scheduler_factory, param_groups

    schedule = None if "scheduler" in ds_config else build_schedule(cfg.optim, cfg.run.max_steps)
    by_steps = schedule is not None and cfg.optim.schedule_clock == "steps"  # else TimeClockLR
    wd = float(ds_config["optimizer"]["params"].get("weight_decay", 0.0))
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=param_groups(model, wd),
        config=ds_config,
        lr_scheduler=lr_scheduler_factory(schedule) if by_steps else None,
    )
    return engine, schedule


def announce_init(cfg: TrainConfig, init, point, main_rank: bool) -> dict | None:
    """Print what --init_from did (or that a resume took precedence); the report for config.json
    and the checkpoints (a resumed run keeps the one its first launch made)."""
    if main_rank and cfg.run.init_from:
        print(
            init.summary()
            if init
            else f"[pretrain] --init_from {cfg.run.init_from} not "
            f"applied: resuming from {point.path}",
            flush=True,
        )
    if init is not None:
        return init.to_dict()
    return point.state.get("init_from") if point is not None else None


def open_metrics(
    cfg: TrainConfig, rank: int, world: int, start_step: int, model, reader, setup, engine
):
    """The metrics writer of this rank (rank 0 writes; DeepSpeed's monitor gets the records)."""
    from pretrain.components.metrics import MetricsWriter, device_peak_tflops

    return MetricsWriter(
        cfg.run.output_dir,
        rank=rank,
        max_steps=cfg.run.max_steps,
        start_step=start_step,
        log_interval=cfg.log.log_interval,
        flops_per_token=model.flops_per_token(reader.max_seq_len),
        peak_tflops=device_peak_tflops(setup.precision),
        world_size=world,
        monitor=engine.monitor if rank == 0 else None,
        progress=cfg.log.progress,
        progress_interval_s=cfg.log.progress_interval_s,
    )


def write_run_files(cfg: TrainConfig, setup, reader, world: int, init_report: dict | None) -> None:
    """The run folder's config.json (everything resolved) and a copy of the tokenizer, so that
    export does not need the shard folder."""
    import shutil

    from bertforge.files import write_json_atomic

    run = Path(cfg.run.output_dir)
    if not (run / "tokenizer").is_dir():
        tmp = run / "tokenizer.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(reader.tokenizer_path, tmp)
        os.replace(tmp, run / "tokenizer")
    write_json_atomic(
        run / "config.json",
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
        },
        indent=2,
        sort_keys=True,
    )


@dataclass
class Resolved:
    """A run's inputs, all checked before any rendezvous: shards, resume point, DeepSpeed dict."""

    train_reader: Any  # ShardReader, or MixtureReader for a weighted mixture
    val_readers: list  # [(source name, validation reader)]
    point: Any  # checkpoint.ResumePoint, or None for a fresh start
    setup: Any  # ds_config.DeepSpeedSetup: final dict, batch plan, precision, checkpointing
    accel: str  # DeepSpeed's accelerator name ("cuda", "cpu", ...)


def resolve_run(cfg: TrainConfig) -> Resolved:
    """Everything that can fail on the user's input fails here, before any rendezvous."""
    from deepspeed.accelerator import get_accelerator

    from pretrain.components import checkpoint as ck
    from pretrain.config.ds_config import resolve_deepspeed_config
    from pretrain.model.init_from import init_architecture

    world, accel = int(os.environ.get("WORLD_SIZE", "1")), get_accelerator().device_name()
    train_reader, val_readers = open_shards(cfg)
    if cfg.run.init_from:  # the architecture is the checkpoint's
        cfg.model_cfg = init_architecture(cfg, train_reader.max_seq_len)
    fingerprint = train_reader.manifest["tokenizer"]["fingerprint"]
    point = ck.find_resume(
        cfg.run.resume,
        cfg.run.output_dir,
        vocab_size=train_reader.vocab_size,
        tokenizer_fingerprint=fingerprint,
        model_config=dataclasses.asdict(cfg.model_cfg),
    )
    changed = point is not None and point.world_size_changed(world)
    setup = resolve_deepspeed_config(cfg, world, accel, load_universal=changed)
    return Resolved(train_reader, val_readers, point, setup, accel)


def start_position(
    cfg: TrainConfig, run: Resolved, engine, ckpts, schedule, main_rank: bool
) -> tuple[int, int]:
    """(step, consumed samples) to start from: the resume point restored into the engine, or 0."""
    if run.point is not None:
        start = ckpts.restore(engine, run.point, schedule=schedule, seed=cfg.run.seed)
        warn_if_data_changed(run.point, run.train_reader, main_rank)
        return start
    if main_rank and cfg.run.resume == "auto":
        print(
            f"[pretrain] no complete checkpoint in {cfg.run.output_dir}: starting fresh", flush=True
        )
    return 0, 0


def train(cfg: TrainConfig) -> int:
    """Resolve, build data, model and engine, resume, run the loop; returns the exit status.
    Refused at once (LockError) while another job holds --output_dir."""
    launched = launch_clock()  # a time budget counts start-up too
    lock = take_run_lock(cfg)
    try:
        return _train_locked(cfg, launched)
    finally:
        if lock is not None:
            lock.release()


def _train_locked(cfg: TrainConfig, launched: float) -> int:
    """:func:`train` while rank 0 holds the run folder's lock."""
    import torch

    from pretrain.components import checkpoint as ck
    from pretrain.components.budget import TimeBudget, TimeClockLR
    from pretrain.components.distributed import init_distributed
    from pretrain.components.downstream_jobs import DownstreamJobs
    from pretrain.data.loader import build_loader
    from pretrain.trainer import Trainer

    run = resolve_run(cfg)
    info = init_distributed(cfg.run.dist_timeout_s)
    rank, world, main_rank = info.rank, info.world_size, info.rank == 0
    device = torch.device(run.accel, info.local_rank) if run.accel != "cpu" else torch.device("cpu")
    if run.setup.precision_note and main_rank:
        print(f"[pretrain] WARNING: {run.setup.precision_note}", flush=True)
    verify_shards_once(cfg, rank, world, device)

    init_from = cfg.run.init_from if run.point is None else None  # a resume wins over it
    model, init = build_model(cfg, run.train_reader, run.setup, init_from=init_from)
    init_report = announce_init(cfg, init, run.point, main_rank)
    engine, schedule = build_engine(cfg, model, run.setup.config)
    ckpts = ck.CheckpointManager(cfg.run.output_dir, cfg.checkpoint, rank, world, device)
    start_step, consumed = start_position(cfg, run, engine, ckpts, schedule, main_rank)
    if main_rank:
        write_run_files(cfg, run.setup, run.train_reader, world, init_report)
    elapsed = run.point.state.get("elapsed_s", 0.0) if run.point else 0.0
    budget = TimeBudget(cfg.run.max_time_hours, elapsed, start=launched)

    loader = build_loader(
        run.train_reader,
        cfg.data_cfg,
        cfg.masking,
        rank=rank,
        world_size=world,
        micro_batch_size=run.setup.batch.micro_batch,
        consumed_samples=consumed,
        train=True,
    )
    metrics = open_metrics(cfg, rank, world, start_step, model, run.train_reader, run.setup, engine)
    trainer = Trainer(
        cfg,
        engine,
        run.setup.batch,
        loader,
        run.val_readers,
        device,
        metrics,
        ckpts,
        base_state=run_state(cfg, run.train_reader, run.setup, init_report),
        rank=rank,
        world=world,
        budget=budget,
        lr_clock=TimeClockLR.for_run(cfg.optim, schedule, run.setup.config, budget),
        downstream=DownstreamJobs.for_run(cfg, rank, metrics),
        guard_state=run.point.state.get("guard") if run.point else None,
    )
    try:
        return trainer.run(start_step, consumed)
    finally:
        metrics.close()


def _shutdown() -> None:
    """Leave the process group together (otherwise ranks linger in teardown for seconds)."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python pretrain/main.py`` and the launchers."""
    cfg = parse_args(argv)
    from data_prep.lock import LockError
    from data_prep.reader import ShardError
    from pretrain.components.checkpoint import CheckpointError
    from pretrain.components.optim import OptimizerConfigError
    from pretrain.config.batching import BatchSizeError
    from pretrain.config.ds_config import ConfigError
    from pretrain.config.precision import PrecisionError
    from pretrain.data.mixture import MixtureError

    if cfg.run.dry_run:
        from pretrain.dry_run import main as dry_run_main

        return dry_run_main(cfg)
    try:
        status = train(cfg)
        _shutdown()
        return status
    except (
        ConfigError,
        BatchSizeError,
        PrecisionError,
        OptimizerConfigError,
        CheckpointError,
        ShardError,
        MixtureError,
        LockError,
    ) as e:
        print(f"[pretrain] ERROR: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    code = main()
    # Everything is written and closed by now. Skip the interpreter's native teardown: with a
    # multi-rank gloo group it takes ~7 s per run on CPU (measured, no Python frame running).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
