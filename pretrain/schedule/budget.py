"""A wall-clock budget for a run ("the best model in 24 hours"), carried across launches.

``--max_time_hours H`` ends the run once H hours of training time have passed, counted from the
start of each launch (start-up included) and added up over resumes: a checkpoint stores the time
spent so far, so a run stopped after 10 of 24 hours gets 14 more after ``--resume auto``. The end
of the budget ends the run like the last step does: a final validation and a final checkpoint.

With ``--schedule_clock time`` the learning rate follows the elapsed fraction of the budget
instead of the step count (warmup over ``--warmup_ratio`` of the budget, then ``--decay``), as
academic-budget-bert's time-based schedule does: no step arithmetic for a time-boxed run.

``--batch_ramp_start B0`` ramps the global batch from B0 up to ``--global_batch_size`` over the
first ``--batch_ramp_fraction`` of the run (:class:`BatchRamp`), as Cramming does over 60% of its
budget: on the time clock, of the budget (the fraction rank 0's clock measured at the end of the
previous step, shared with every rank by the all-reduce the save decision makes anyway, so all
ranks take the same batch); on the step clock, of ``--max_steps``. The batch is a pure function
of that fraction, so a resume takes, at its first step, the batch of the elapsed time its
checkpoint stored, and the data position (consumed samples) continues exactly.
"""

from __future__ import annotations

import os
import time

from bertforge.pretrain.config.ds_config import ConfigError
from bertforge.pretrain.config.schedule import TICKS_PER_BUDGET


class TimeBudget:
    """Training time of the run (this launch plus earlier ones) against an optional limit."""

    def __init__(self, hours: float, elapsed_before_s: float = 0.0, start: float | None = None):
        self.limit_s = max(0.0, hours) * 3600.0  # 0: no budget, elapsed time is still counted
        self.elapsed_before_s = elapsed_before_s
        self.start = time.monotonic() if start is None else start
        # rank 0's fraction at the end of the last step, the same on every rank (set by
        # CheckpointManager.save_due); None before this launch's first step
        self.agreed: float | None = None

    def elapsed_s(self) -> float:
        """Seconds of training time over all launches of this run so far."""
        return self.elapsed_before_s + (time.monotonic() - self.start)

    def fraction(self) -> float:
        """Elapsed share of the budget, 0..1 (0 when there is no budget)."""
        return min(1.0, self.elapsed_s() / self.limit_s) if self.limit_s > 0 else 0.0

    def agreed_fraction(self) -> float:
        """The share of the budget every rank agrees on: rank 0's at the end of the last step,
        or before this launch's first step the checkpoint's (the same on every rank)."""
        if self.agreed is not None:
            return self.agreed
        return min(1.0, self.elapsed_before_s / self.limit_s) if self.limit_s > 0 else 0.0

    def exhausted(self) -> bool:
        """True once the budget (if any) is used up."""
        return self.limit_s > 0 and self.elapsed_s() >= self.limit_s


class TimeClockLR:
    """Sets the learning rate from the elapsed fraction of the budget before each optimizer step.

    In this mode DeepSpeed gets no LR scheduler, so nothing else touches the lr; after a resume
    the lr follows from the restored elapsed time.
    """

    def __init__(self, schedule, peak_lr: float, budget: TimeBudget):
        self.schedule, self.peak_lr, self.budget = schedule, peak_lr, budget

    @classmethod
    def for_run(
        cls, optim_cfg, schedule, ds_config: dict, budget: TimeBudget
    ) -> TimeClockLR | None:
        """The clock of a run with ``--schedule_clock time`` (peak lr from the DeepSpeed
        optimizer block), else None (the step schedule is DeepSpeed's LR scheduler)."""
        if schedule is None or optim_cfg.schedule_clock != "time":
            return None
        return cls(schedule, float(ds_config["optimizer"]["params"]["lr"]), budget)

    def multiplier(self) -> float:
        """The schedule's value at the current elapsed fraction of the budget."""
        return self.schedule(int(self.budget.fraction() * TICKS_PER_BUDGET))

    def apply(self, optimizer) -> None:
        """Write the lr into every parameter group of ``optimizer``."""
        lr = self.peak_lr * self.multiplier()
        for group in optimizer.param_groups:
            group["lr"] = lr


def launch_clock() -> float:
    """``time.monotonic()`` of this launch's start. A wrapper that started the launcher may set
    BERTFORGE_LAUNCHED_AT (its ``time.time()`` then) so that a --max_time_hours budget also
    counts the launcher's and the imports' seconds (the learning benchmark does)."""
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


def ramp_batch_at(fraction: float, start: int, target: int, ramp_fraction: float, unit: int) -> int:
    """The global batch at ``fraction`` (0..1) of the run: linear from ``start`` to ``target``
    over the first ``ramp_fraction``, rounded down to a multiple of ``unit`` (micro-batch x
    world size) and never below ``start``; ``target`` from there on."""
    if fraction >= ramp_fraction:
        return target
    raw = start + (target - start) * max(0.0, fraction) / ramp_fraction
    return min(target, max(start, int(raw) // unit * unit))


class BatchRamp:
    """``--batch_ramp_start``: the global batch of each step on the run's clock (module
    docstring). ``start`` is rounded up to a whole micro-batch on every rank."""

    def __init__(self, start: int, target: int, ramp_fraction: float, unit: int, clock: str):
        if not 0.0 < ramp_fraction <= 1.0:
            raise ConfigError(f"--batch_ramp_fraction must be in (0, 1], got {ramp_fraction}")
        start = -(-start // unit) * unit
        if start >= target:
            raise ConfigError(
                f"--batch_ramp_start {start} (in micro-batches of {unit} sequences over all "
                f"ranks) is not below --global_batch_size {target}: lower it, or give 0 for no "
                "ramp"
            )
        if target % unit:
            raise ConfigError(
                f"--global_batch_size {target} is not a multiple of micro batch x world size "
                f"({unit}): a ramp changes the accumulation, so it must be"
            )
        self.start, self.target, self.ramp_fraction, self.unit = start, target, ramp_fraction, unit
        self.clock = clock

    @classmethod
    def for_run(cls, cfg, plan) -> BatchRamp | None:
        """The ramp of ``cfg`` (a TrainConfig) for the batch ``plan`` (the target), or None."""
        if cfg.batch.batch_ramp_start <= 0:
            return None
        unit = plan.micro_batch * plan.world_size
        return cls(
            cfg.batch.batch_ramp_start,
            plan.global_batch,
            cfg.batch.batch_ramp_fraction,
            unit,
            cfg.optim.schedule_clock,
        )

    def batch(self, step: int, max_steps: int, budget: TimeBudget) -> int:
        """The global batch of 0-based ``step``."""
        if self.clock == "time":
            fraction = budget.agreed_fraction()
        else:
            fraction = step / max(1, max_steps)
        return ramp_batch_at(fraction, self.start, self.target, self.ramp_fraction, self.unit)

    def describe(self) -> str:
        unit = "of the time budget" if self.clock == "time" else "of the steps"
        return (
            f"batch ramp {self.start} -> {self.target} sequences over the first "
            f"{100 * self.ramp_fraction:g}% {unit}"
        )
