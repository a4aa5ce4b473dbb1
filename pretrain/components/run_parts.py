"""The groups a :class:`~pretrain.trainer.Trainer` is built from (:func:`pretrain.build.
build_training` fills them): a run's checked inputs, what a step runs on, the data, where the
results go, the clock. They live below the trainer so that the parts it drives (the guard's
:class:`~pretrain.components.guarded_step.GuardedStep`) name them without importing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from bertforge.pretrain.checkpoints.checkpoint import CheckpointManager
from bertforge.pretrain.checkpoints.resume import ResumePoint
from bertforge.pretrain.components.metrics import MetricsWriter
from bertforge.pretrain.config.batching import BatchPlan
from bertforge.pretrain.config.ds_config import DeepSpeedSetup
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.distributed.startup import init_distributed
from bertforge.pretrain.model.specs import ObjectiveSpec
from bertforge.pretrain.schedule.anneal import AnnealPlan
from bertforge.pretrain.schedule.budget import TimeBudget, TimeClockLR
from bertforge.pretrain.schedule.phases import PhaseTracker


@dataclass
class Resolved:
    """A run's inputs, all checked before any rendezvous: the resolved config, shards, resume
    point, DeepSpeed dict."""

    train_reader: Any  # ShardReader, or MixtureReader for a weighted mixture
    val_readers: list  # [(source name, validation reader)]
    point: ResumePoint | None  # the checkpoint to continue from, or None for a fresh start
    setup: DeepSpeedSetup  # final dict, batch plan, precision, checkpointing
    accel: str  # DeepSpeed's accelerator name ("cuda", "cpu", ...)
    anneal: AnnealPlan | None = None  # --anneal_from's plan
    phases: PhaseTracker | None = None  # --phases: the resolved plan
    cfg: TrainConfig | None = None  # the config as it runs (nothing edits it after this)
    objective: ObjectiveSpec | None = None  # what it trains (--objective and the shards)


@dataclass
class StepSetup:
    """What a step runs on: the DeepSpeed engine, the batch plan, this rank's device and place."""

    engine: Any  # deepspeed.DeepSpeedEngine
    plan: BatchPlan  # micro-batch, gradient accumulation, global batch
    device: torch.device
    rank: int = 0
    world: int = 1


@dataclass
class TrainData:
    """The training loader (at the run's data position), the validation readers and, for a
    phase plan, the training reader of each phase's data (by its --data values; None: --data)."""

    loader: Any  # torch DataLoader over a ShardReader or MixtureReader
    val_readers: list = field(default_factory=list)  # [(source name, validation reader)]
    readers: dict = field(default_factory=dict)  # {data values or None: training reader}


@dataclass
class RunOutputs:
    """Where the run's results go: metrics (console, metrics.jsonl, TensorBoard), checkpoints
    and what every checkpoint records besides the step and the data position."""

    metrics: MetricsWriter
    ckpts: CheckpointManager
    base_state: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunClock:
    """The run's time budget over all launches, and the lr clock of --schedule_clock time."""

    budget: TimeBudget
    lr_clock: TimeClockLR | None = None


def join_ranks(cfg: TrainConfig, run: Resolved) -> StepSetup:
    """The rendezvous, and this rank's device; the engine is filled in by the caller."""
    info = init_distributed(cfg.run.dist_timeout_s, cfg.run.heartbeat_timeout_s, run.setup.config)
    device = torch.device(run.accel, info.local_rank) if run.accel != "cpu" else torch.device("cpu")
    return StepSetup(None, run.setup.batch, device, rank=info.rank, world=info.world_size)
