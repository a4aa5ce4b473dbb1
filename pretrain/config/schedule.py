"""The one learning-rate schedule: a declarative list of segments on one clock.

A :class:`Schedule` is what every way of writing a run's lr resolves to: ``--schedule
warmup_decay`` (warmup, then a linear, polynomial or constant tail), ``--schedule wsd``
(warmup, a stable peak, a ``--decay_shape`` decay; ModernBERT's recipe), ``--anneal_from`` (one
decay from the source's lr), ``--phases`` (one segment per phase) and ``--override_lr_schedule``
(this launch's schedule put in place of the checkpoint's). The clock is optimizer steps, or ticks
of the time budget with ``--schedule_clock time`` (:data:`TICKS_PER_BUDGET` per budget).

Each segment covers steps ``[start, end)`` with a shape: ``warmup`` rises to the peak (1.0),
``constant`` holds it, and a decay (``linear``, ``poly``, ``cosine``, ``1-sqrt``) goes from
``top`` to ``floor``. ``offset`` says when a segment reaches its target: 1, on its own last step
(warmups, and every segment of a phase plan); 0, on the step after it (the warmup_decay, wsd and
anneal tails, as Megatron and the HF schedulers count). Past the last segment the last one's
value holds. The values are computed by the same float operations the earlier per-kind classes
used, so checkpoints written before this module resume bit-identically (:meth:`Schedule.from_saved`
reads their saved fields).

A checkpoint stores a schedule as ``LambdaLR`` stores a callable object: its ``__dict__`` (the kind
and the segments as plain dicts, nothing to unpickle but builtins).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

from bertforge.errors import UserError

SCHEDULES = ("warmup_decay", "wsd")
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")
SHAPES = ("warmup", "constant", "poly", *DECAY_SHAPES)

# A time-clock schedule is a step schedule over this many ticks of the budget (1e-4 resolution).
TICKS_PER_BUDGET = 10_000


class ScheduleError(UserError, ValueError):
    """Schedule settings that contradict each other, cannot be honoured by this clock, or a
    checkpoint's schedule this version cannot read."""


def decay_curve(shape: str, t: float, power: float = 1.0) -> float:
    """The share of (top - floor) left at fraction ``t`` (0..1) of a decay."""
    if shape == "linear":
        return 1.0 - t
    if shape == "poly":
        return (1.0 - t) ** power
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * t))
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(t)
    raise ScheduleError(f"--decay_shape must be one of {', '.join(DECAY_SHAPES)}, got {shape!r}")


@dataclass(frozen=True)
class Segment:
    """Steps ``[start, end)`` of a schedule: its lr multiplier at any step (module docstring)."""

    name: str
    shape: str
    start: int
    end: int
    top: float = 1.0  # a decay's multiplier where it starts
    floor: float = 0.0  # ... and where it ends
    power: float = 1.0  # "poly"'s exponent
    offset: int = 0  # 1: the segment's last step trains at its target; 0: the step after it

    def value(self, step: int) -> float:
        if self.shape == "constant":
            return 1.0
        t = min(1.0, max(0.0, (step - self.start + self.offset) / max(1, self.end - self.start)))
        if self.shape == "warmup":
            return t
        return self.floor + (self.top - self.floor) * decay_curve(self.shape, t, self.power)


@dataclass
class Schedule:
    """The lr multiplier (x the peak lr) at any point of the clock: the first segment whose end is
    past the step, or the last. ``kind`` names how it was written (warmup_decay, wsd, anneal,
    phases); the warnings and the dry run show it."""

    kind: str
    segments: list[dict[str, Any]]  # Segment fields: plain values a checkpoint stores

    def _segments(self) -> list[Segment]:
        return [Segment(**s) for s in self.segments]

    def __call__(self, step: int) -> float:
        segs = self._segments()
        if not segs:
            raise ScheduleError(f"a {self.kind} schedule without segments")
        return next((s for s in segs if step < s.end), segs[-1]).value(step)

    @property
    def total_steps(self) -> int:
        """Where the last segment ends (its value holds after)."""
        return int(self.segments[-1]["end"])

    @property
    def decay_shape(self) -> str:
        """The shape of the tail: the last segment's (per phase for a phase plan)."""
        return "per phase" if self.kind == "phases" else self.segments[-1]["shape"]

    def phases(self) -> list[tuple[str, int, int]]:
        """(name, first step, end step) of each non-empty segment (the dry run's table)."""
        return [(s.name, s.start, s.end) for s in self._segments() if s.end > s.start]

    def settings(self) -> dict[str, Any]:
        """What the resume warnings compare, by the names users know from the flags."""
        segs = self._segments()
        tail = segs[-1]
        out: dict[str, Any] = {"schedule": self.kind}
        if segs[0].name == "warmup":
            out["warmup steps"] = segs[0].end
        out["total steps"] = tail.end
        if self.kind == "warmup_decay":
            out["decay"], out["poly power"] = tail.shape, tail.power
        elif self.kind in ("wsd", "anneal"):
            if self.kind == "wsd":
                out["decay steps"] = tail.end - tail.start
            out["decay shape"] = tail.shape
        elif self.kind == "phases":
            out["phases"] = ", ".join(f"{s.name} {s.shape} [{s.start}, {s.end})" for s in segs)
        if self.kind != "phases":
            out["floor (min lr ratio)"] = tail.floor
        return out

    @classmethod
    def from_saved(cls, fields: dict[str, Any]) -> Schedule:
        """The schedule a checkpoint saved (``LambdaLR`` keeps its ``__dict__``); the field sets
        of the per-kind classes earlier versions saved are read as the same schedule."""
        keys = set(fields)
        if keys == {"kind", "segments"}:
            return cls(str(fields["kind"]), [dict(s) for s in fields["segments"]])
        for names, build in _EARLIER_FORMS:
            if keys == names:
                return build(**fields)
        raise ScheduleError(
            f"the checkpoint's lr schedule has the fields {sorted(fields)}, which no schedule of "
            "this version has; resume it with the version that wrote it, or pass "
            "--override_lr_schedule to take the schedule from the flags"
        )


def _schedule(kind: str, *segments: Segment) -> Schedule:
    return Schedule(kind, [asdict(s) for s in segments])


def warmup_decay(
    warmup_steps: int,
    total_steps: int,
    decay: str = "linear",
    power: float = 1.0,
    min_ratio: float = 0.0,
) -> Schedule:
    """Linear warmup to the peak, then ``decay`` (linear, poly with ``power``, or constant) to
    ``min_ratio`` at ``total_steps``."""
    shape = decay if decay in ("linear", "constant") else "poly"
    return _schedule(
        "warmup_decay",
        Segment("warmup", "warmup", 0, warmup_steps, offset=1),
        Segment(decay, shape, warmup_steps, total_steps, floor=min_ratio, power=power),
    )


def wsd(
    warmup_steps: int,
    total_steps: int,
    decay_steps: int,
    shape: str = "1-sqrt",
    min_ratio: float = 0.0,
) -> Schedule:
    """Warmup, the peak held, then a ``shape`` decay over the last ``decay_steps`` steps."""
    decay_start = total_steps - decay_steps
    return _schedule(
        "wsd",
        Segment("warmup", "warmup", 0, warmup_steps, offset=1),
        Segment("stable", "constant", warmup_steps, decay_start),
        Segment("decay", shape, decay_start, total_steps, floor=min_ratio),
    )


def anneal(
    start_ratio: float, total_steps: int, shape: str = "1-sqrt", min_ratio: float = 0.0
) -> Schedule:
    """One decay from ``start_ratio`` (the source run's lr) to ``min_ratio``."""
    return _schedule(
        "anneal", Segment("anneal", shape, 0, total_steps, top=start_ratio, floor=min_ratio)
    )


def phases(
    phase_shapes: list[str],
    phase_ends: list[int],
    phase_floors: list[float],
    names: list[str] | None = None,
) -> Schedule:
    """One segment per phase of a plan, each reaching its target on its own last step; a decay
    starts where the phase before it ended."""
    names = names or [f"phase {i + 1}" for i in range(len(phase_shapes))]
    segs, start, prev = [], 0, 1.0
    for name, shape, end, floor in zip(names, phase_shapes, phase_ends, phase_floors):
        seg = Segment(name, shape, start, end, top=prev, floor=floor, offset=1)
        segs.append(seg)
        start, prev = end, seg.value(end - 1)
    return _schedule("phases", *segs)


# The fields each earlier per-kind class saved, read as the same schedule (exact resume).
_EARLIER_FORMS = (
    ({"warmup_steps", "total_steps", "decay", "power", "min_ratio"}, warmup_decay),
    ({"warmup_steps", "total_steps", "decay_steps", "shape", "min_ratio"}, wsd),
    ({"start_ratio", "total_steps", "shape", "min_ratio"}, anneal),
    ({"phase_shapes", "phase_ends", "phase_floors"}, phases),
)


def decay_length(total: int, fraction: float, steps: int | None) -> int:
    """Decay steps of a run of ``total`` steps (or ticks): ``steps`` when given, else the
    fraction rounded (0.29 x 100 is 29, not int()'s 28)."""
    return int(steps) if steps is not None else int(round(fraction * total))


def check_schedule_flags(cfg) -> None:
    """Raise :class:`ScheduleError` for schedule flags that cannot work together (``cfg``: the
    :class:`~pretrain.config.train_config.OptimConfig`); :func:`build_schedule` checks lengths."""
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


def _wsd_for(cfg, warmup: int, total: int) -> Schedule:
    """The wsd schedule of ``cfg`` over ``total`` steps (or ticks); a ScheduleError when warmup
    and decay do not fit in the run."""
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
    return wsd(warmup, total, decay, cfg.decay_shape, cfg.min_lr_ratio)


def build_schedule(cfg, max_steps: int) -> Schedule:
    """The schedule the flags write (``cfg``: OptimConfig) for a run of ``max_steps`` optimizer
    steps; with ``schedule_clock`` "time", over :data:`TICKS_PER_BUDGET` ticks instead."""
    check_schedule_flags(cfg)
    if cfg.schedule_clock == "time":
        total, warmup = TICKS_PER_BUDGET, int(cfg.warmup_ratio * TICKS_PER_BUDGET)
    else:
        total = max_steps
        warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(cfg.warmup_ratio * total)
    if cfg.schedule == "wsd":
        return _wsd_for(cfg, warmup, total)
    return warmup_decay(warmup, total, cfg.decay, cfg.poly_power, cfg.min_lr_ratio)
