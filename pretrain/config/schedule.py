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

A phase plan (``--phases``, :mod:`pretrain.config.phase_plan`) also gives each phase a global
batch (fixed, or Megatron's ramp over consumed samples), a mask rate, a rope theta and data; the
schedule holds the resolved phases (:class:`ResolvedPhase`) and the run's global batch, and
answers for any point of the clock (step, consumed samples): :meth:`Schedule.batch_at`,
:meth:`Schedule.masking_at` / :meth:`Schedule.mask_rate`, :meth:`Schedule.rope_theta_at`,
:meth:`Schedule.data_at`, :meth:`Schedule.phase_at`. Without a plan the run is one phase: the
run's batch, masking, theta and data throughout.

A checkpoint stores the lr curve as ``LambdaLR`` stores a callable object: the kind and the
segments as plain dicts (:meth:`Schedule.lr_state`, the form every checkpoint has held; nothing to
unpickle but builtins). The plan itself goes into the trainer state (``phases``), which a resume
compares with this launch's plan (pretrain.schedule.phases).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from bertforge.errors import UserError
from bertforge.pretrain.data.masking import mask_prob_at

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


@dataclass(frozen=True)
class ResolvedPhase:
    """A phase in steps and samples: [start_step, end_step), [start_consumed, end_consumed)."""

    name: str
    start_step: int
    end_step: int
    start_consumed: int
    end_consumed: int
    tokens: int  # nominal: samples x the phase data's sequence length
    seq_len: int
    lr_shape: str
    lr_start: float  # lr multiplier (x --lr) of the phase's first step
    lr_end: float  # ... and of its last step
    min_lr_ratio: float
    batch_start: int
    batch_end: int
    batch_fixed: int | None  # the phase's global batch, or None for a ramp
    ramp: dict | None  # start, increment, ramp_samples (within the phase)
    data: list[str] | None  # None: the run's --data
    own_data: bool  # the phase names its own data (its loader starts at its own beginning)
    data_start: int  # consumed samples where this phase's data stream began (0: the run's start)
    mask_prob: float | None  # None: the run's --mask_prob
    rope_theta: float | None


def ramp_batch(ramp: dict, global_batch: int, consumed_in_phase: int) -> int:
    """Megatron's RampupBatchsizeNumMicroBatches: ``start + increment x floor(consumed /
    samples_per_increment)`` while consumed <= ramp_samples, then the target ``global_batch``."""
    start, inc, samples = ramp["start"], ramp["increment"], ramp["ramp_samples"]
    if consumed_in_phase > samples:
        return global_batch
    n_increments = (global_batch - start) // inc
    if n_increments == 0:
        return global_batch
    per_increment = samples / n_increments
    return min(global_batch, start + inc * int(consumed_in_phase / per_increment))


@dataclass
class Schedule:
    """What the run trains with at any point of the clock. The lr multiplier (x the peak lr): the
    first segment whose end is past the step, or the last. ``kind`` names how it was written
    (warmup_decay, wsd, anneal, phases); the warnings and the dry run show it. With a phase plan,
    each step's batch, masking, rope theta and data are its phase's (module docstring)."""

    kind: str
    segments: list[dict[str, Any]]  # Segment fields: plain values a checkpoint stores
    plan: list[dict[str, Any]] = field(default_factory=list)  # ResolvedPhase fields; []: no plan
    global_batch: int | None = None  # the run's global batch (a ramp's target); None: not known

    def _segments(self) -> list[Segment]:
        return [Segment(**s) for s in self.segments]

    def phases_resolved(self) -> list[ResolvedPhase]:
        """The plan's phases, in order ([] without a plan)."""
        return [ResolvedPhase(**p) for p in self.plan]

    def lr_state(self) -> dict[str, Any]:
        """The lr curve as a checkpoint stores it (what :meth:`from_saved` reads back)."""
        return {"kind": self.kind, "segments": self.segments}

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

    def phase_at(self, step: int) -> ResolvedPhase | None:
        """The phase that trains 0-based ``step`` (the last one past the plan); None: no plan."""
        plan = self.phases_resolved()
        return next((ph for ph in plan if step < ph.end_step), plan[-1] if plan else None)

    def batch_at(self, step: int, consumed: int) -> int | None:
        """The global batch of 0-based ``step`` starting at ``consumed`` samples: a pure function
        of the position, so a resume anywhere takes the same batch."""
        ph = self.phase_at(step)
        if ph is None:
            return self.global_batch
        if ph.ramp is None:
            return ph.batch_fixed
        return ramp_batch(ph.ramp, self.global_batch, consumed - ph.start_consumed)

    def masking_at(self, step: int, base):
        """The masking config of 0-based ``step``: ``base`` (the run's MaskingConfig, with its own
        ramp mask_prob -> mask_prob_end over samples) or, from a phase that sets a mask rate on,
        that rate (constant)."""
        ph = self.phase_at(step)
        if ph is None or ph.mask_prob is None:
            return base
        return dataclasses.replace(base, mask_prob=ph.mask_prob, mask_prob_end=None)

    def mask_rate(self, step: int, consumed: int, base) -> float:
        """The mask rate of the sample at ``consumed`` in 0-based ``step`` (its position in the
        stream of the step's data); the masker draws each row at this rate."""
        _, stream_start = self.data_at(step)
        return mask_prob_at(self.masking_at(step, base), consumed - stream_start)

    def rope_theta_at(self, step: int, default: float) -> float:
        """The global rope theta of 0-based ``step`` (``default``: the model's, until a phase sets
        one)."""
        ph = self.phase_at(step)
        return default if ph is None or ph.rope_theta is None else ph.rope_theta

    def data_at(self, step: int) -> tuple[tuple[str, ...] | None, int]:
        """(the ``--data`` values of 0-based ``step``'s phase, None for the run's own --data;
        the consumed samples where that data's stream began)."""
        ph = self.phase_at(step)
        if ph is None or ph.data is None:
            return None, 0
        return tuple(ph.data), ph.data_start

    def loader_changes_at(self, step: int, base) -> bool:
        """True at the first step of a phase with data of its own or whose masking differs from
        the previous phase's (the trainer opens a new loader there)."""
        ph = self.phase_at(step)
        if ph is None or not 0 < step == ph.start_step:
            return False
        return ph.own_data or self.masking_at(step, base) != self.masking_at(step - 1, base)

    @classmethod
    def from_saved(cls, fields: dict[str, Any]) -> Schedule:
        """The schedule a checkpoint saved (``LambdaLR`` keeps its ``__dict__``); the field sets
        of the per-kind classes earlier versions saved are read as the same schedule."""
        keys = set(fields)
        if {"kind", "segments"} <= keys <= {"kind", "segments", "plan", "global_batch"}:
            segments = [dict(s) for s in fields["segments"]]
            plan = [dict(p) for p in fields.get("plan", [])]
            return cls(str(fields["kind"]), segments, plan, fields.get("global_batch"))
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
