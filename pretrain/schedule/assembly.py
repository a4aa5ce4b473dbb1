"""The schedule's part of a run, for :mod:`pretrain.build`: a --phases plan or an --anneal_from
plan resolved into the config, the run's one schedule and its LambdaLR, where the run starts on
it, and the wall clock it runs on."""

from __future__ import annotations

import dataclasses

from bertforge.logs import get_logger
from bertforge.pretrain.checkpoints.checkpoint import CheckpointManager
from bertforge.pretrain.checkpoints.resume import ResumePoint
from bertforge.pretrain.checkpoints.schedule_override import steps_origin
from bertforge.pretrain.config.ds_config import DeepSpeedSetup
from bertforge.pretrain.config.schedule import Schedule, build_schedule
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.data.mixture import describe_data, warn_if_data_changed
from bertforge.pretrain.model.bert import resolve_config
from bertforge.pretrain.model.init_source import extend_context
from bertforge.pretrain.schedule import anneal
from bertforge.pretrain.schedule.budget import BatchRamp, TimeBudget, TimeClockLR
from bertforge.pretrain.schedule.optim import lr_scheduler_factory
from bertforge.pretrain.schedule.phases import PhaseTracker, tracker_for_run

log = get_logger(__name__)


def with_steps(cfg: TrainConfig, steps: int) -> TrainConfig:
    """A copy of ``cfg`` whose run lasts ``steps`` optimizer steps."""
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, max_steps=steps))


def resolve_phases(
    cfg: TrainConfig, setup: DeepSpeedSetup, train_reader, point: ResumePoint | None, val_readers
) -> tuple[TrainConfig, DeepSpeedSetup, list, PhaseTracker | None]:
    """(config, DeepSpeed setup, validation readers, tracker) of a --phases run, each as the plan
    makes it (its length, its longest context, its first batch, its phases' validation data);
    unchanged, with no tracker, without a plan."""
    phases = tracker_for_run(cfg, setup, train_reader)
    if phases is None:
        return cfg, setup, val_readers, None
    if cfg.run.init_from and point is None:  # ModernBERT: the longest phase's context
        cfg = dataclasses.replace(cfg, model_cfg=extend_context(cfg.model_cfg, phases.max_seq_len))
    cfg = with_steps(cfg, phases.plan[-1].end_step)  # the run's length is the plan's
    val_readers = phases.validation(val_readers, cfg.data_cfg.verify)
    phases.check_positions(resolve_config(cfg.model_cfg, train_reader.vocab_size))
    phases.check_resume(point, cfg.optim.override_lr_schedule)
    setup = phases.first_setup(setup, point)  # DeepSpeed checks the first step's batch
    return cfg, setup, val_readers, phases


def resolve_anneal(
    cfg: TrainConfig, train_reader, point: ResumePoint | None, setup: DeepSpeedSetup
) -> tuple[TrainConfig, anneal.AnnealPlan | None]:
    """(config, plan) of an --anneal_from run, which lasts the anneal's tokens; else (cfg, None)."""
    described = describe_data(train_reader)
    plan = anneal.resolve(
        cfg, train_reader, described, point, setup.batch.global_batch, setup.config
    )
    if plan is not None:
        cfg = with_steps(cfg, plan.steps)  # the anneal's length is its tokens'
    return cfg, plan


def check_batch_ramp(cfg: TrainConfig, setup: DeepSpeedSetup) -> None:
    """A --batch_ramp_start that cannot run fails here, before the rendezvous."""
    BatchRamp.for_run(cfg, setup.batch)


def run_schedule(
    cfg: TrainConfig, plan: anneal.AnnealPlan | None, phases: PhaseTracker | None, ds_config: dict
) -> Schedule:
    """The run's one schedule, as one of its writers gives it: --phases (the plan: lr, batch,
    masking, rope theta and data of each phase), --anneal_from (the two are refused together),
    else the schedule flags (a DeepSpeed "scheduler" block is refused); without a plan, the
    run's global batch throughout."""
    if phases is not None:
        return phases.schedule
    schedule = plan.schedule() if plan is not None else build_schedule(cfg.optim, cfg.run.max_steps)
    return dataclasses.replace(schedule, global_batch=int(ds_config["train_batch_size"]))


def lr_scheduler_for(cfg: TrainConfig, schedule: Schedule):
    """The LambdaLR factory DeepSpeed steps, or None on the time clock (the trainer's TimeClockLR
    applies the schedule there)."""
    return lr_scheduler_factory(schedule) if cfg.optim.schedule_clock == "steps" else None


def start_position(
    cfg: TrainConfig,
    point: ResumePoint | None,
    plan: anneal.AnnealPlan | None,
    train_reader,
    engine,
    ckpts: CheckpointManager,
    schedule: Schedule,
) -> tuple[int, int]:
    """(step, consumed samples) to start from: the resume point restored into the engine, the
    anneal's source loaded, or 0."""
    if point is None and plan is not None:
        return anneal.start_anneal(plan, engine, ckpts, seed=cfg.run.seed, rank=ckpts.rank)
    if point is not None:
        start = ckpts.restore(
            engine,
            point,
            schedule=schedule,
            seed=cfg.run.seed,
            override_lr=cfg.optim.override_lr_schedule,
            steps_from=steps_origin(cfg.run, cfg.sources),
        )
        warn_if_data_changed(point, train_reader)
        return start
    if cfg.run.resume == "auto":
        log.info(f"no complete checkpoint in {cfg.run.output_dir}: starting fresh")
    return 0, 0


def run_clock(
    cfg: TrainConfig,
    point: ResumePoint | None,
    launched: float,
    schedule: Schedule,
    ds_config: dict,
) -> tuple[TimeBudget, TimeClockLR | None]:
    """The wall-clock budget carried over launches (``launched``: budget.launch_clock of this
    launch) and the time-clock lr on it (None on the step clock)."""
    elapsed = point.state.get("elapsed_s", 0.0) if point else 0.0
    budget = TimeBudget(cfg.run.max_time_hours, elapsed, start=launched)
    return budget, TimeClockLR.for_run(cfg.optim, schedule, ds_config, budget)
