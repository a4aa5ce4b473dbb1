"""The groups a :class:`~pretrain.trainer.Trainer` is built from (:func:`pretrain.build.
build_training` fills them): what a step runs on, the data, where the results go, the clock.
They live below the trainer so that the parts it drives (the guard's
:class:`~pretrain.components.guarded_step.GuardedStep`) name them without importing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from bertforge.pretrain.checkpoints.checkpoint import CheckpointManager
from bertforge.pretrain.components.metrics import MetricsWriter
from bertforge.pretrain.config.batching import BatchPlan
from bertforge.pretrain.schedule.budget import TimeBudget, TimeClockLR


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
