"""A wall-clock budget for a run ("the best model in 24 hours"), carried across launches.

``--max_time_hours H`` ends the run once H hours of training time have passed, counted from the
start of each launch (start-up included) and added up over resumes: a checkpoint stores the time
spent so far, so a run stopped after 10 of 24 hours gets 14 more after ``--resume auto``. The end
of the budget ends the run like the last step does: a final validation and a final checkpoint.

With ``--schedule_clock time`` the learning rate follows the elapsed fraction of the budget
instead of the step count (warmup over ``--warmup_ratio`` of the budget, then ``--decay``), as
academic-budget-bert's time-based schedule does: no step arithmetic for a time-boxed run.
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

    def elapsed_s(self) -> float:
        """Seconds of training time over all launches of this run so far."""
        return self.elapsed_before_s + (time.monotonic() - self.start)

    def fraction(self) -> float:
        """Elapsed share of the budget, 0..1 (0 when there is no budget)."""
        return min(1.0, self.elapsed_s() / self.limit_s) if self.limit_s > 0 else 0.0

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
