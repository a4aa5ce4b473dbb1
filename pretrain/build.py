"""What a training run is made of, built in order for :mod:`pretrain.main`.

:func:`resolve_run` checks everything that can fail on the user's input, before any rendezvous
(the dry run calls it too): the shards, the resume point, the DeepSpeed config for this world
size. :func:`build_training` then joins the process group and builds the model, the engine, the
resume position, the loader and the outputs into the grouped parts of a
:class:`~pretrain.trainer.Trainer`.

DeepSpeed is imported inside the functions that use it: ``import deepspeed`` costs about half a
second and prints an accelerator line, which ``--help`` and ``--dry-run`` need neither of.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge.data_prep.lock import FolderLock
from bertforge.data_prep.object_store import is_url
from bertforge.data_prep.sources import parse_mixture
from bertforge.files import publish_dir, write_json_atomic, write_text_atomic
from bertforge.logs import get_logger, process_rank
from bertforge.preemption import PreemptionHandler
from bertforge.pretrain.checkpoints.checkpoint import CheckpointManager
from bertforge.pretrain.checkpoints.resume import ResumePoint, find_resume
from bertforge.pretrain.checkpoints.schedule_override import check_resume_clock, steps_origin
from bertforge.pretrain.components.data_order import configure_cache, resolve_order
from bertforge.pretrain.components.downstream_jobs import DownstreamJobs
from bertforge.pretrain.components.ema import EMA
from bertforge.pretrain.components.guarded_step import GuardedStep
from bertforge.pretrain.components.metrics import MetricsWriter, device_peak_tflops
from bertforge.pretrain.components.run_parts import RunClock, RunOutputs, StepSetup, TrainData
from bertforge.pretrain.config.ds_config import (
    ConfigError,
    DeepSpeedSetup,
    resolve_deepspeed_config,
    with_derived_batch,
)
from bertforge.pretrain.config.recipe import resolved_flags, resolved_recipe
from bertforge.pretrain.config.schedule import build_schedule
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.data.cached_plans import keep_validation_shards
from bertforge.pretrain.data.loader import build_loader
from bertforge.pretrain.data.mixture import (
    describe_data,
    open_training,
    validation_readers,
    warn_if_data_changed,
)
from bertforge.pretrain.data.shard_check import verify_once
from bertforge.pretrain.distributed import watchdog
from bertforge.pretrain.distributed.startup import init_distributed, sum_across_ranks
from bertforge.pretrain.model.bert import resolve_config
from bertforge.pretrain.model.compiled import check_compile, compile_encoders
from bertforge.pretrain.model.init_from import load_initial_weights
from bertforge.pretrain.model.init_source import extend_context, init_architecture
from bertforge.pretrain.model.registry import (
    build_model,
    check_engine,
    check_supported,
    resolve_attention,
)
from bertforge.pretrain.model.specs import ObjectiveSpec, check_resume_objective, resolve_objective
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.schedule import anneal
from bertforge.pretrain.schedule.budget import BatchRamp, TimeBudget, TimeClockLR
from bertforge.pretrain.schedule.optim import lr_scheduler_factory, param_groups
from bertforge.pretrain.schedule.phases import PhaseTracker, tracker_for_run
from bertforge.pretrain.trainer import Trainer

log = get_logger(__name__)


def take_run_lock(cfg: TrainConfig) -> FolderLock | None:
    """Rank 0's lock on --output_dir (one job per run folder), taken before anything is written
    there; None on the other ranks (they stop at the rendezvous when rank 0 is refused)."""
    if process_rank() != 0:
        return None
    run = Path(cfg.run.output_dir).resolve()
    lock = FolderLock(RunFolder(run).lock, f"run folder {run}").acquire()
    watchdog.at_exit(lock.release)  # its exit 3 skips main's finally: leave no lock behind
    return lock


def open_shards(cfg: TrainConfig):
    """(training reader, [(source name, validation reader)]) of --data: one shard folder or a
    weighted mixture (pretrain.data.mixture); a source without validation data is warned about."""
    sources = parse_mixture(cfg.run.data_sources)
    verify = cfg.data_cfg.verify
    return open_training(sources, verify=verify), validation_readers(sources, verify=verify)


def verify_shards_once(
    cfg: TrainConfig, rank: int, world: int, device, phases: PhaseTracker | None = None
) -> None:
    """With verify "size" (the default), every shard file's sha256 is checked once per shard
    folder and run folder, split across the ranks after the rendezvous (pretrain.data.shard_check);
    "full" checks them at every launch on every rank, "none" not at all. The folders are --data's
    and those of every phase's own data."""
    if cfg.data_cfg.verify != "size":
        return
    folders = [s.path for s in parse_mixture(cfg.run.data_sources)]
    if phases is not None:
        folders += [s.path for s in phases.phase_sources() if s.path not in folders]
    folders = [f for f in folders if not is_url(f)]  # fetched shards: checked on arrival
    verify_once(
        folders,
        Path(cfg.run.output_dir),
        rank,
        world,
        agree=lambda failed: sum_across_ranks([float(failed)], device)[0],
    )


@dataclass
class Resolved:
    """A run's inputs, all checked before any rendezvous: the resolved config, shards, resume
    point, DeepSpeed dict."""

    train_reader: Any  # ShardReader, or MixtureReader for a weighted mixture
    val_readers: list  # [(source name, validation reader)]
    point: ResumePoint | None  # the checkpoint to continue from, or None for a fresh start
    setup: DeepSpeedSetup  # final dict, batch plan, precision, checkpointing
    accel: str  # DeepSpeed's accelerator name ("cuda", "cpu", ...)
    anneal: anneal.AnnealPlan | None = None  # --anneal_from's plan
    phases: PhaseTracker | None = None  # --phases: the resolved plan
    cfg: TrainConfig | None = None  # the config as it runs (nothing edits it after this)
    objective: ObjectiveSpec | None = None  # what it trains (--objective and the shards)


def _model_for_shards(cfg: TrainConfig, max_seq_len: int):
    """The architecture this run builds: --init_from's, or ModernBERT's positions grown to
    longer shards (rotary positions: no table to grow)."""
    if cfg.run.init_from:  # the architecture is the checkpoint's
        return init_architecture(cfg, max_seq_len)
    longer = extend_context(cfg.model_cfg, max_seq_len)
    if longer is not cfg.model_cfg:
        log.info(
            "--arch %s: max_position_embeddings %d -> %d, the shards' max_seq_len "
            "(rotary positions: nothing to grow)",
            cfg.model_cfg.arch,
            cfg.model_cfg.max_position_embeddings,
            longer.max_position_embeddings,
        )
    return longer


def resolve_run(cfg: TrainConfig) -> Resolved:
    """Everything that can fail on the user's input fails here, before any rendezvous (the dry
    run calls this too, so it fails the same way). ``cfg`` is not edited: the config as it will
    run (architecture from --init_from, length from --phases or --anneal_from) is ``.cfg``."""
    from deepspeed.accelerator import get_accelerator  # lazy: see the module docstring

    world, accel = int(os.environ.get("WORLD_SIZE", "1")), get_accelerator().device_name()
    configure_cache(cfg)  # before a shard folder in object storage opens
    train_reader, val_readers = open_shards(cfg)
    cfg = dataclasses.replace(cfg, model_cfg=_model_for_shards(cfg, train_reader.max_seq_len))
    # what the arch cannot train (the shards' objective, a flag), before any rendezvous
    objective = resolve_objective(cfg.objective_cfg, train_reader.format)
    check_supported(cfg.model_cfg, objective)
    fingerprint = train_reader.manifest["tokenizer"]["fingerprint"]
    point = find_resume(
        cfg.run.resume,
        cfg.run.output_dir,
        vocab_size=train_reader.vocab_size,
        tokenizer_fingerprint=fingerprint,
        model_config=dataclasses.asdict(cfg.model_cfg),
    )
    cfg = resolve_order(cfg, train_reader, point)  # the checkpoint's order, the window's size
    if point is not None:
        check_resume_clock(cfg.optim, point.state)
        check_resume_objective(point.state.get("config", {}), objective)
        cfg = _override_peak(cfg, point)
    changed = point is not None and point.world_size_changed(world)
    setup = resolve_deepspeed_config(cfg, world, accel, load_universal=changed)
    cfg = with_derived_batch(cfg, setup.batch)  # a recipe's accumulation for another world size
    stage = int(setup.config.get("zero_optimization", {}).get("stage", 0))
    check_engine(cfg.model_cfg, stage, setup.activation_checkpointing)
    check_compile(cfg.speed.compile, stage)
    phases = tracker_for_run(cfg, setup, train_reader)
    if phases is not None:
        if cfg.run.init_from and point is None:  # ModernBERT: the longest phase's context
            cfg = dataclasses.replace(
                cfg, model_cfg=extend_context(cfg.model_cfg, phases.max_seq_len)
            )
        cfg = _with_steps(cfg, phases.plan[-1].end_step)  # the run's length is the plan's
        val_readers = phases.validation(val_readers, cfg.data_cfg.verify)
        phases.check_positions(resolve_config(cfg.model_cfg, train_reader.vocab_size))
        phases.check_resume(point, cfg.optim.override_lr_schedule)
        setup = phases.first_setup(setup, point)  # DeepSpeed checks the first step's batch
    described = describe_data(train_reader)
    plan = anneal.resolve(
        cfg, train_reader, described, point, setup.batch.global_batch, setup.config
    )
    if plan is not None:
        cfg = _with_steps(cfg, plan.steps)  # the anneal's length is its tokens'
    return Resolved(train_reader, val_readers, point, setup, accel, plan, phases, cfg, objective)


def _override_peak(cfg: TrainConfig, point: ResumePoint) -> TrainConfig:
    """--override_lr_schedule without a peak lr of its own keeps the checkpoint's peak (not the
    DeepSpeed JSON's placeholder lr): the override changes the schedule's shape."""
    if not cfg.optim.override_lr_schedule or cfg.optim.lr is not None:
        return cfg
    saved = point.state.get("config", {}).get("optim", {}).get("lr")
    if saved is None:
        raise ConfigError(
            f"--override_lr_schedule: {point.path} does not record its peak lr (written by an "
            "older version); give the peak with --lr (recipe optim.lr)"
        )
    sources = {**cfg.sources, "optim.lr": f"checkpoint {point.path}"}
    optim = dataclasses.replace(cfg.optim, lr=float(saved))
    return dataclasses.replace(cfg, optim=optim, sources=sources)


def _with_steps(cfg: TrainConfig, steps: int) -> TrainConfig:
    """A copy of ``cfg`` whose run lasts ``steps`` optimizer steps."""
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, max_steps=steps))


def build_encoder(
    cfg: TrainConfig,
    reader,
    setup: DeepSpeedSetup,
    *,
    init_from: str | None = None,
    max_seq_len: int | None = None,
):
    """(model, --init_from report or None): the model, identical on every rank (seeded or
    loaded from ``init_from`` before DeepSpeed partitions it), ready for deepspeed.initialize.
    ``max_seq_len``: the longest sequence it must take (default the reader's; a phase plan's
    longest phase)."""
    import deepspeed  # lazy: see the module docstring

    max_seq_len = max_seq_len or reader.max_seq_len
    torch.manual_seed(cfg.run.seed)
    model = build_model(
        cfg.model_cfg,
        vocab_size=reader.vocab_size,
        objective=resolve_objective(cfg.objective_cfg, reader.format),
        max_seq_len=max_seq_len,
    )
    report = None
    if init_from:
        report = load_initial_weights(
            model,
            init_from,
            tokenizer_dir_of_shards=reader.tokenizer_path,
            max_seq_len=max_seq_len,
        )
    model.register_zero3_external_parameters()
    if setup.activation_checkpointing == "deepspeed":
        deepspeed.checkpointing.configure(None, deepspeed_config=setup.config)
    model.set_activation_checkpointing(setup.activation_checkpointing)
    if cfg.speed.compile:
        compile_encoders(model)
    return model, report


def run_schedule(
    cfg: TrainConfig, plan: anneal.AnnealPlan | None, phases: PhaseTracker | None, ds_config: dict
):
    """The run's one schedule, as one of its writers gives it: --phases (the plan: lr, batch,
    masking, rope theta and data of each phase), --anneal_from (the two are refused together),
    else the schedule flags (a DeepSpeed "scheduler" block is refused); without a plan, the
    run's global batch throughout."""
    if phases is not None:
        return phases.schedule
    schedule = plan.schedule() if plan is not None else build_schedule(cfg.optim, cfg.run.max_steps)
    return dataclasses.replace(schedule, global_batch=int(ds_config["train_batch_size"]))


def build_engine(
    cfg: TrainConfig,
    model,
    ds_config: dict,
    plan: anneal.AnnealPlan | None = None,
    phases: PhaseTracker | None = None,
):
    """The DeepSpeed engine and the run's LR schedule (:func:`run_schedule`). A time-clock
    schedule is not given to DeepSpeed: the trainer's TimeClockLR applies it."""
    import deepspeed  # lazy: see the module docstring

    schedule = run_schedule(cfg, plan, phases, ds_config)
    by_steps = cfg.optim.schedule_clock == "steps"  # else TimeClockLR
    wd = float(ds_config["optimizer"]["params"].get("weight_decay", 0.0))
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=param_groups(model, wd),
        config=ds_config,
        lr_scheduler=lr_scheduler_factory(schedule) if by_steps else None,
    )
    return engine, schedule


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


def announce_init(cfg: TrainConfig, init, point: ResumePoint | None) -> dict | None:
    """Say what --init_from did (or that a resume took precedence); the report for config.json
    and the checkpoints (a resumed run keeps the one its first launch made)."""
    if cfg.run.init_from:
        if init is not None:
            for line in init.summary().splitlines():
                log.info(line)
        else:
            log.info(f"--init_from {cfg.run.init_from} not applied: resuming from {point.path}")
    if init is not None:
        return init.to_dict()
    return point.state.get("init_from") if point is not None else None


def start_position(
    cfg: TrainConfig, run: Resolved, engine, ckpts: CheckpointManager, schedule
) -> tuple[int, int]:
    """(step, consumed samples) to start from: the resume point restored into the engine, or 0."""
    if run.point is None and run.anneal is not None:
        return anneal.start_anneal(run.anneal, engine, ckpts, seed=cfg.run.seed, rank=ckpts.rank)
    if run.point is not None:
        start = ckpts.restore(
            engine,
            run.point,
            schedule=schedule,
            seed=cfg.run.seed,
            override_lr=cfg.optim.override_lr_schedule,
            steps_from=steps_origin(cfg.run, cfg.sources),
        )
        warn_if_data_changed(run.point, run.train_reader)
        return start
    if cfg.run.resume == "auto":
        log.info(f"no complete checkpoint in {cfg.run.output_dir}: starting fresh")
    return 0, 0


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


@dataclass
class Training:
    """A built run: the trainer and where it starts (step, consumed samples)."""

    trainer: Trainer
    start_step: int
    consumed: int


def join_ranks(cfg: TrainConfig, run: Resolved) -> StepSetup:
    """The rendezvous, and this rank's device; the engine is filled in by :func:`build_training`."""
    info = init_distributed(cfg.run.dist_timeout_s, cfg.run.heartbeat_timeout_s, run.setup.config)
    device = torch.device(run.accel, info.local_rank) if run.accel != "cpu" else torch.device("cpu")
    return StepSetup(None, run.setup.batch, device, rank=info.rank, world=info.world_size)


def build_training(
    cfg: TrainConfig, run: Resolved, launched: float, preempt: PreemptionHandler | None = None
) -> Training:
    """Join the ranks, build model, engine, resume position, loader and outputs into a Trainer.
    ``launched``: budget.launch_clock of this launch (a time budget counts start-up too);
    ``preempt``: main's stop-signal flag, installed before the rendezvous (the trainer acts on a
    signal that arrived during this start-up before its first step)."""
    BatchRamp.for_run(cfg, run.setup.batch)  # a ramp that cannot run fails before the rendezvous
    place = join_ranks(cfg, run)
    if run.setup.precision_note:
        log.warning(run.setup.precision_note)
    if run.setup.batch.note:
        log.info(run.setup.batch.note)
    verify_shards_once(cfg, place.rank, place.world, place.device, run.phases)
    init_from = cfg.run.init_from if run.point is None else None  # a resume wins over it
    longest = run.phases.max_seq_len if run.phases else None
    model, init = build_encoder(
        cfg, run.train_reader, run.setup, init_from=init_from, max_seq_len=longest
    )
    init_report = announce_init(cfg, init, run.point)
    place.engine, schedule = build_engine(cfg, model, run.setup.config, run.anneal, run.phases)
    ckpts = CheckpointManager(
        cfg.run.output_dir, cfg.checkpoint, place.rank, place.world, place.device
    )
    ckpts.ema = EMA(cfg.optim.ema, place.rank) if cfg.optim.ema else None
    start_step, consumed = start_position(cfg, run, place.engine, ckpts, schedule)
    if place.rank == 0:
        write_run_files(cfg, run, place.world, init_report)
    elapsed = run.point.state.get("elapsed_s", 0.0) if run.point else 0.0
    budget = TimeBudget(cfg.run.max_time_hours, elapsed, start=launched)
    keep_validation_shards(run.val_readers, cfg.log.eval_batches * schedule.global_batch)
    readers = {None: run.train_reader, **(run.phases.readers if run.phases else {})}
    data, stream_start = schedule.data_at(start_step)  # the step's phase's data and masking
    loader = build_loader(
        readers[data],
        cfg.data_cfg,
        schedule.masking_at(start_step, cfg.masking),
        rank=place.rank,
        world_size=place.world,
        micro_batch_size=run.setup.batch.micro_batch,
        consumed_samples=consumed - stream_start,
        train=True,
        attention=resolve_attention(cfg.model_cfg.attention, cfg.model_cfg.arch),
        sentence_order=run.objective.sentence_order,
    )
    metrics = open_metrics(cfg, place, start_step, model, run)
    if run.point is not None:  # metrics.jsonl marks where this launch continued
        metrics.resumed(start_step, str(run.point.path), elapsed)
    outputs = RunOutputs(
        metrics, ckpts, run_state(cfg, run.train_reader, run.setup, init_report, run.anneal)
    )
    if run.phases:  # every checkpoint records the plan it was trained under
        outputs.base_state["phases"] = run.phases.as_dict()
    clock = RunClock(budget, TimeClockLR.for_run(cfg.optim, schedule, run.setup.config, budget))
    guard_state = run.point.state.get("guard") if run.point else None
    trainer = Trainer(
        cfg,
        place,
        TrainData(loader, run.val_readers, readers),
        outputs,
        clock,
        downstream=DownstreamJobs.for_run(cfg, place.rank, metrics),
        guard=GuardedStep.for_run(cfg, place, outputs, clock, guard_state),
        preempt=preempt,
        schedule=schedule,
    )
    return Training(trainer, start_step, consumed)
