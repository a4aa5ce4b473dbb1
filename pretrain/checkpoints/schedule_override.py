"""The lr schedule across a resume: the checkpoint's, or this launch's with --override_lr_schedule.

By default a resumed run continues the schedule saved in the checkpoint (DeepSpeed restores the
``LambdaLR`` state: the schedule's fields, its base lr and its position), so a changed --lr,
--max_steps or --schedule on the resume line does nothing; a warning names each flag ignored and
the flag that would apply it. With ``--override_lr_schedule`` the schedule and peak lr come from
the flags instead, at the scheduler's saved position, and a warning lists old -> new for every
setting that changed (Megatron's ``--override-opt_param-scheduler``). The override stays in force
for the whole launch: a stability-guard rollback to a checkpoint written before it keeps the
new schedule too. The guard's lr cut (``--guard_lr_factor``) carried by the checkpoint is kept.

A checkpoint of a ``--schedule_clock time`` run has no step schedule to continue: resuming it on
the step clock needs --override_lr_schedule (the time clock itself always follows the flags).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from bertforge.errors import UserError
from bertforge.logs import get_logger
from bertforge.pretrain.config.schedule import Schedule

log = get_logger(__name__)

# What the warnings call a setting of Schedule.settings(), and the flags that set it.
_FLAGS = {
    "schedule": "--schedule",
    "peak lr": "--lr",
    "warmup steps": "--warmup_steps/--warmup_ratio",
    "total steps": "--max_steps",
    "decay": "--decay",
    "poly power": "--poly_power",
    "decay steps": "--decay_steps/--decay_fraction",
    "decay shape": "--decay_shape",
    "floor (min lr ratio)": "--min_lr_ratio",
    "phases": "--phases",
}


class ScheduleResumeError(UserError, ValueError):
    """A resume whose checkpoint holds no schedule this launch could continue."""


def schedule_settings(schedule: Schedule, peak_lr: float) -> dict[str, Any]:
    """What a schedule is, as the warnings name it: kind, peak lr and its settings."""
    settings = schedule.settings()
    return {"schedule": settings.pop("schedule"), "peak lr": peak_lr, **settings}


def changed_settings(old: dict[str, Any], new: dict[str, Any]) -> dict[str, str]:
    """{setting: "old -> new"} for every setting of the new schedule that differs ("-": the old
    one had no such setting; the old kind's own settings go with the kind's change)."""
    return {k: f"{old.get(k, '-')} -> {v}" for k, v in new.items() if not _same(old.get(k, "-"), v)}


def _same(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-9 (a saved peak lr is recovered by dividing out the guard's cut)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def check_resume_clock(optim_cfg, state: dict[str, Any]) -> None:
    """Before the rendezvous: a checkpoint of a time-clock run has no step schedule, so a
    step-clock resume of it must say which schedule to take."""
    saved = state.get("config", {}).get("optim", {}).get("schedule_clock", "steps")
    if (
        saved == "time"
        and optim_cfg.schedule_clock == "steps"
        and not optim_cfg.override_lr_schedule
    ):
        raise ScheduleResumeError(_NO_STEP_SCHEDULE)


_NO_STEP_SCHEDULE = (
    "the checkpoint's run followed --schedule_clock time, so it holds no step schedule to "
    "continue: pass --override_lr_schedule to start this launch's step schedule at the "
    "checkpoint's step, or keep --schedule_clock time"
)


@dataclass
class ScheduleOverride:
    """This launch's schedule and peak lr, put in place of the one a checkpoint load restored."""

    schedule: Schedule
    peak_lr: float

    def apply(self, scheduler, state: dict[str, Any]) -> list[float]:
        """Replace the schedule a load of the checkpoint whose trainer ``state`` is given put
        into ``scheduler``, at its position (the checkpoint's step when it held no step
        schedule), keeping the guard's lr cut it carries. Returns the lrs now in the optimizer."""
        if getattr(scheduler, "loaded_from_none", False):
            scheduler.last_epoch = int(state["step"])
        n = len(scheduler.lr_lambdas)
        scheduler.lr_lambdas = [copy.deepcopy(self.schedule) for _ in range(n)]
        scheduler.base_lrs = [self.peak_lr * guard_factor(state)] * n
        lrs = [
            b * fn(scheduler.last_epoch) for b, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)
        ]
        for group, lr in zip(scheduler.optimizer.param_groups, lrs):
            group["lr"] = lr  # the next optimizer step uses it (the scheduler steps after it)
        scheduler._last_lr = lrs
        return lrs


def guard_factor(state: dict[str, Any]) -> float:
    """The guard's lr cut saved with a checkpoint (1.0: none)."""
    return float(state.get("guard", {}).get("lr_factor", 1.0))


def steps_origin(run: Any, sources: dict[str, str]) -> str:
    """Where this launch's ``run.max_steps`` (the flags' schedule length) came from, for the
    warnings: the command line, the recipe, the phase plan, the anneal or the default."""
    if run.phases:
        return f"the length of the phase plan --phases {run.phases}"
    if run.anneal_from:
        return "the anneal's length (--anneal_tokens)"
    given = sources.get("run.max_steps", "")
    if given.startswith("flag"):
        recipe = any(v.startswith("recipe ") for v in sources.values())
        return "given on the command line" + (", where a flag wins over the recipe" * recipe)
    if given.startswith("recipe "):
        return f"run.max_steps of the {given}"
    return "the default, as no flag or recipe gives it"


def _kept_warning(
    changes: dict[str, str], listed: str, where: str, steps: Any, steps_from: str
) -> str:
    """The warning of a resume that keeps the checkpoint's schedule: which flags it ignores for
    the lr; --max_steps is not among them (it still ends the run), only the schedule's length,
    whose change the warning explains (``steps_from``: where this launch's --max_steps came
    from)."""
    ignored = [flag for name, flag in _FLAGS.items() if name in changes and name != "total steps"]
    parts = [f"the learning-rate schedule continues as saved in {where} ({listed})"]
    if ignored:
        verb = "is" if len(ignored) == 1 else "are"
        parts.append(f"this launch's {', '.join(ignored)} {verb} ignored for the lr")
    if "total steps" in changes:
        old = changes["total steps"].split(" -> ")[0]
        why = f" (this launch's --max_steps: {steps_from})" if steps_from else ""
        length = f" of {old} steps" if old != "-" else ""
        parts.append(
            f"--max_steps {steps} still ends this run at step {steps}{why}, but the lr keeps "
            f"the checkpoint's schedule length{length}"
        )
    return "; ".join(parts) + ". Pass --override_lr_schedule to take the schedule from the flags."


def resume_schedule(
    scheduler,
    state: dict[str, Any],
    flags: Any,
    flags_peak: float,
    *,
    override: bool,
    where: str,
    steps_from: str = "",
) -> ScheduleOverride | None:
    """After a checkpoint load: keep its schedule (warning which flags that ignores) or, with
    ``override``, put the flags' in place (warning what changed). ``steps_from``: where the
    flags' length (--max_steps) came from (:func:`steps_origin`), named where it changed.
    Returns the override to re-apply after later loads of the launch (rollbacks), or None."""
    factor = guard_factor(state)
    new = schedule_settings(flags, flags_peak)
    if getattr(scheduler, "loaded_from_none", False):  # a time-clock checkpoint
        if not override:
            raise ScheduleResumeError(_NO_STEP_SCHEDULE)
        old = {"schedule": "the time clock (--schedule_clock time)"}
    else:
        old = schedule_settings(scheduler.lr_lambdas[0], scheduler.base_lrs[0] / factor)
    changes = changed_settings(old, new)
    listed = "; ".join(f"{k} {v}" for k, v in changes.items())
    if not override:
        if changes:
            steps = new.get("total steps")
            log.warning(_kept_warning(changes, listed, where, steps, steps_from))
        return None
    if "total steps" in changes and steps_from:
        changes["total steps"] += f" (--max_steps: {steps_from})"
        listed = "; ".join(f"{k} {v}" for k, v in changes.items())
    plan = ScheduleOverride(copy.deepcopy(flags), flags_peak)
    lrs = plan.apply(scheduler, state)
    kept = f"; the guard's lr cut x{factor:g} is kept" if factor != 1.0 else ""
    log.warning(
        f"--override_lr_schedule: the learning-rate schedule comes from this launch's flags, not "
        f"{where}: {listed or 'no setting changed'}. At scheduler step "
        f"{scheduler.last_epoch} the lr is now {lrs[0]:.4g}{kept}."
    )
    return plan
