"""Warmup-stable-decay (``--schedule wsd``): warm up, hold the peak lr, then decay to a floor.

The recipe of ModernBERT, mmBERT and Ettin: most of the run at a constant lr, then a short last
phase (``--decay_fraction`` of the run, default 0.2, or ``--decay_steps``) whose shape is
``--decay_shape``: ``linear``, ``cosine`` or ``1-sqrt`` (lr = floor + (peak - floor)(1 - sqrt(t)),
t going 0 -> 1 over the decay). The floor is ``--min_lr_ratio`` of the peak. A checkpoint of the
stable phase holds the peak lr, so a run can be stopped, extended (``--override_lr_schedule``)
or decayed later from any of them.

With ``--schedule_clock time`` the phases are fractions of the time budget (warmup
``--warmup_ratio``, decay ``--decay_fraction``); step counts (``--warmup_steps``,
``--decay_steps``) are refused there.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from bertforge.errors import UserError

SCHEDULES = ("warmup_decay", "wsd")
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


class ScheduleError(UserError, ValueError):
    """Schedule flags that contradict each other or cannot be honoured by this clock."""


def decay_curve(shape: str, t: float) -> float:
    """The share of (peak - floor) left at fraction ``t`` (0..1) of the decay."""
    if shape == "linear":
        return 1.0 - t
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * t))
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(t)
    raise ScheduleError(f"--decay_shape must be one of {', '.join(DECAY_SHAPES)}, got {shape!r}")


@dataclass
class WarmupStableDecay:
    """lr multiplier at step s: linear warmup to 1, 1 until the decay starts, then ``shape``
    down to ``min_ratio``, reached at ``total_steps`` (and kept after).

    A callable object (not a lambda) so ``LambdaLR.state_dict`` saves its settings; the field
    names differ from :class:`~pretrain.components.optim.WarmupDecay`'s so a checkpoint's schedule
    can be rebuilt as the class that saved it.
    """

    warmup_steps: int
    total_steps: int
    decay_steps: int
    shape: str = "1-sqrt"
    min_ratio: float = 0.0

    @property
    def decay_start(self) -> int:
        """The first step of the decay phase (the stable phase ends here)."""
        return self.total_steps - self.decay_steps

    def __call__(self, step: int) -> float:
        if self.warmup_steps > 0 and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if step < self.decay_start:
            return 1.0
        t = min(1.0, (step - self.decay_start) / max(1, self.decay_steps))
        return self.min_ratio + (1.0 - self.min_ratio) * decay_curve(self.shape, t)

    def phases(self) -> list[tuple[str, int, int]]:
        """(name, first step, end step) of warmup, stable and decay (an empty phase left out)."""
        spans = [
            ("warmup", 0, self.warmup_steps),
            ("stable", self.warmup_steps, self.decay_start),
            ("decay", self.decay_start, self.total_steps),
        ]
        return [p for p in spans if p[2] > p[1]]


def decay_length(total: int, fraction: float, steps: int | None) -> int:
    """Decay steps of a run of ``total`` steps (or ticks): ``steps`` when given, else the
    fraction rounded (0.29 x 100 is 29, not int()'s 28)."""
    return int(steps) if steps is not None else int(round(fraction * total))


def check_schedule_flags(cfg) -> None:
    """Raise :class:`ScheduleError` for schedule flags that cannot work together (``cfg``: the
    :class:`~pretrain.config.train_config.OptimConfig`); :func:`build_wsd` checks the lengths."""
    if cfg.schedule not in SCHEDULES:
        raise ScheduleError(f"--schedule must be warmup_decay or wsd, got {cfg.schedule!r}")
    if cfg.decay_shape not in DECAY_SHAPES:
        raise ScheduleError(
            f"--decay_shape must be one of {', '.join(DECAY_SHAPES)}, got {cfg.decay_shape!r}"
        )
    if cfg.schedule == "wsd":
        if cfg.decay != "linear" or cfg.poly_power != 1.0:
            raise ScheduleError(
                "--decay and --poly_power shape the warmup_decay schedule; with --schedule wsd "
                "the decay's shape is --decay_shape (linear, cosine or 1-sqrt)"
            )
        if not 0.0 < cfg.decay_fraction <= 1.0:
            raise ScheduleError(f"--decay_fraction must be in (0, 1], got {cfg.decay_fraction}")
        if cfg.decay_steps is not None and cfg.decay_steps < 1:
            raise ScheduleError(f"--decay_steps must be at least 1, got {cfg.decay_steps}")
        if cfg.decay_steps is not None and cfg.schedule_clock == "time":
            raise ScheduleError(
                "--decay_steps counts steps; with --schedule_clock time give the decay as "
                "--decay_fraction (a fraction of the time budget)"
            )
    elif any(
        getattr(cfg, f) != _default(cfg, f)
        for f in ("decay_steps", "decay_shape", "decay_fraction")
    ):
        raise ScheduleError(
            "--decay_steps, --decay_fraction and --decay_shape shape the wsd schedule; add "
            "--schedule wsd, or use --decay for the warmup_decay schedule"
        )


def _default(cfg, name: str):
    """The default of one of the config dataclass's fields (one definition: train_config)."""
    return next(f.default for f in dataclasses.fields(cfg) if f.name == name)


def build_wsd(cfg, warmup: int, total: int) -> WarmupStableDecay:
    """The wsd schedule of ``cfg`` (OptimConfig) over ``total`` steps (or time ticks) with
    ``warmup`` warmup steps; a ScheduleError when warmup and decay do not fit in the run."""
    decay = decay_length(total, cfg.decay_fraction, cfg.decay_steps)
    if decay < 1:
        raise ScheduleError(
            f"--decay_fraction {cfg.decay_fraction} of {total} steps is no step of decay; "
            "raise it or give --decay_steps"
        )
    if warmup + decay > total:
        what = "--decay_steps" if cfg.decay_steps is not None else "--decay_fraction"
        raise ScheduleError(
            f"warmup ({warmup} steps) and decay ({decay} steps, {what}) do not fit in "
            f"--max_steps {total}: shorten one or raise --max_steps"
            if cfg.schedule_clock == "steps"
            else f"--warmup_ratio {cfg.warmup_ratio} and --decay_fraction {cfg.decay_fraction} "
            "add up to more than the whole time budget: lower one"
        )
    return WarmupStableDecay(
        warmup_steps=warmup,
        total_steps=total,
        decay_steps=decay,
        shape=cfg.decay_shape,
        min_ratio=cfg.min_lr_ratio,
    )
