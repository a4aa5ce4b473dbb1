"""A phase plan (issue 25): a JSON file of training phases, parsed, checked and resolved to steps.

A phase has a length (``steps``, or nominal ``tokens`` = samples x the phase data's sequence
length) and any of: an lr shape, a global batch (fixed, or Megatron's ``--rampup-batch-size``
ramp), its data (``--data`` syntax), a mask rate and (a rotary ``--arch``) a rope theta.
:func:`load_phase_file` parses and checks a file; :func:`resolve` turns the phases into step
boundaries by simulating consumed samples, and :func:`plan_schedule` makes them the run's one
:class:`~pretrain.config.schedule.Schedule`, which answers each step's lr, batch (a pure function
of step and consumed samples, so a resume anywhere is exact), masking, rope theta and data.

YAML or JSON (by the file's suffix). Pure Python (no torch, no DeepSpeed), so
the check runs before any rendezvous and as ``bertforge phases FILE``; only a
plan with a ``rope_theta`` asks the model registry (which imports torch) whether the arch has one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.pretrain.config.batching import BatchPlan
from bertforge.pretrain.config.schedule import (
    DECAY_SHAPES,
    ResolvedPhase,
    Schedule,
    Segment,
    ramp_batch,
)
from bertforge.pretrain.config.schedule import phases as phases_schedule

LR_SHAPES = ("warmup", "constant", *DECAY_SHAPES)
PHASE_KEYS = (
    "name",
    "tokens",
    "steps",
    "lr",
    "batch",
    "min_lr_ratio",
    "data",
    "mask_prob",
    "rope_theta",
)
RAMP_KEYS = ("start", "increment", "ramp_tokens")


class PhasePlanError(UserError, ValueError):
    """A phase file that cannot be parsed or run; the message names file, phase and key."""


@dataclass(frozen=True)
class Ramp:
    """Megatron's batch-size ramp: ``start``, +``increment`` every ramp/(n increments) samples,
    up to the run's global batch; ``ramp_tokens`` None: over the whole phase."""

    start: int
    increment: int
    ramp_tokens: int | None = None


@dataclass(frozen=True)
class Phase:
    """One phase as the file gives it (unset values None: inherited when resolved)."""

    name: str
    index: int  # 1-based, as error messages name it
    steps: int | None = None
    tokens: int | None = None
    lr: str = "constant"
    batch: int | Ramp | None = None
    min_lr_ratio: float | None = None
    data: list[str] | None = None
    mask_prob: float | None = None
    rope_theta: float | None = None


def _where(path: str, phase: Phase | int | None, key: str | None = None) -> str:
    text = f"{path}"
    if isinstance(phase, Phase):
        text += f": phase {phase.index} ({phase.name!r})"
    elif isinstance(phase, int):
        text += f": phase {phase}"
    if key is not None:
        text += f", key {key!r}"
    return text


def _int(value: Any, where: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PhasePlanError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _ratio(value: Any, where: str, *, positive: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not ok or not (0.0 < value if positive else 0.0 <= value) or value > 1.0:
        bound = "in (0, 1]" if positive else "in [0, 1]"
        raise PhasePlanError(f"{where}: expected a number {bound}, got {value!r}")
    return float(value)


def _batch(value: Any, where: str) -> int | Ramp:
    if not isinstance(value, dict):
        return _int(value, where)
    unknown = sorted(set(value) - set(RAMP_KEYS))
    if unknown:
        raise PhasePlanError(f"{where}: unknown key {unknown[0]!r}; a ramp has {list(RAMP_KEYS)}")
    for key in ("start", "increment"):
        if key not in value:
            raise PhasePlanError(f"{where}.{key}: missing (a ramp needs start and increment)")
    tokens = value.get("ramp_tokens")
    return Ramp(
        start=_int(value["start"], f"{where}.start"),
        increment=_int(value["increment"], f"{where}.increment"),
        ramp_tokens=None if tokens is None else _int(tokens, f"{where}.ramp_tokens"),
    )


def _data(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise PhasePlanError(
            f"{where}: expected a shard folder or a list in --data syntax "
            f'(["general=0.3", "domain=0.7"]), got {value!r}'
        )
    return list(value)


def parse_phases(doc: Any, path: str) -> list[Phase]:
    """The phases of a parsed file (``{"phases": [...]}``), every value checked."""
    if not isinstance(doc, dict) or set(doc) != {"phases"}:
        raise PhasePlanError(f'{path}: expected an object with one key "phases" (a list)')
    items = doc["phases"]
    if not isinstance(items, list) or not items:
        raise PhasePlanError(f"{_where(path, None, 'phases')}: expected a non-empty list")
    phases, names = [], set()
    for i, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise PhasePlanError(f"{_where(path, i)}: expected an object, got {item!r}")
        name = item.get("name", f"phase{i}")
        if not isinstance(name, str) or not name:
            raise PhasePlanError(f"{_where(path, i, 'name')}: expected a non-empty string")
        label = Phase(name=name, index=i)
        unknown = [k for k in item if k not in PHASE_KEYS]
        if unknown:
            raise PhasePlanError(
                f"{_where(path, label, unknown[0])}: unknown key; a phase has {list(PHASE_KEYS)}"
            )
        if name in names:
            raise PhasePlanError(f"{_where(path, label, 'name')}: {name!r} is used twice")
        names.add(name)
        if ("steps" in item) == ("tokens" in item):
            raise PhasePlanError(
                f"{_where(path, label, 'steps')}: give exactly one of `steps` or `tokens`"
            )

        def at(key: str) -> str:
            return _where(path, label, key)  # noqa: B023 - used within this iteration only

        lr = item.get("lr", "constant")
        if lr not in LR_SHAPES:
            raise PhasePlanError(f"{at('lr')}: expected one of {list(LR_SHAPES)}, got {lr!r}")
        if lr in DECAY_SHAPES and i == 1:
            raise PhasePlanError(
                f"{at('lr')}: a {lr!r} decay in the first phase has no lr to decay from; "
                'start with "warmup" or "constant"'
            )
        if "min_lr_ratio" in item and lr not in DECAY_SHAPES:
            raise PhasePlanError(f"{at('min_lr_ratio')}: only a decay phase has a floor")
        theta = item.get("rope_theta")
        if theta is not None and (
            isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0
        ):
            raise PhasePlanError(f"{at('rope_theta')}: expected a positive number, got {theta!r}")
        phases.append(
            Phase(
                name=name,
                index=i,
                steps=_int(item["steps"], at("steps")) if "steps" in item else None,
                tokens=_int(item["tokens"], at("tokens")) if "tokens" in item else None,
                lr=lr,
                batch=_batch(item["batch"], at("batch")) if "batch" in item else None,
                min_lr_ratio=(
                    _ratio(item["min_lr_ratio"], at("min_lr_ratio"))
                    if "min_lr_ratio" in item
                    else None
                ),
                data=_data(item["data"], at("data")) if "data" in item else None,
                mask_prob=(
                    _ratio(item["mask_prob"], at("mask_prob"), positive=True)
                    if "mask_prob" in item
                    else None
                ),
                rope_theta=None if theta is None else float(theta),
            )
        )
    return phases


def load_phase_file(path: str | Path) -> list[Phase]:
    """Parse and check a phase file: YAML (``.yaml``/``.yml``, safe_load) or JSON (any other
    name); a syntax error names the line and column."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PhasePlanError(f"--phases {path}: cannot read it ({e.strerror})") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml  # lazy: only YAML plans need it

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            problem = getattr(e, "problem", None) or str(e)
            raise PhasePlanError(f"{path}: {at}not valid YAML ({problem})") from None
        return parse_phases(doc, str(path))
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise PhasePlanError(
            f"{path}: line {e.lineno}, column {e.colno}: not valid JSON ({e.msg})"
        ) from None
    return parse_phases(doc, str(path))


def _check_divisible(value: int, block: int, where: str) -> None:
    if value < block:
        raise PhasePlanError(
            f"{where}: {value} is smaller than micro batch x world size = {block}; every "
            f"global batch of the plan must be a multiple of {block} (the micro-batch stays fixed)"
        )
    if value % block:
        raise PhasePlanError(
            f"{where}: {value} is not divisible by micro batch x world size = {block}; every "
            "global batch of the plan must be (the micro-batch stays fixed)"
        )


def _check_rotary(arch: str, where: str) -> None:
    """A phase's rope_theta needs an arch with rotary positions (its spec says so)."""
    from bertforge.pretrain.model.registry import ARCHES  # lazy: torch, only for a rope_theta

    rotary = [name for name, spec in ARCHES.items() if spec.rotary]
    if arch not in rotary:
        raise PhasePlanError(
            f"{where}: only --arch {' or '.join(rotary)} has a rope theta "
            f"(this run is --arch {arch})"
        )


def resolve(
    phases: list[Phase],
    *,
    path: str,
    global_batch: int,
    micro_batch: int,
    world_size: int,
    seq_len: Callable[[list[str] | None], int],
    min_lr_ratio: float = 0.0,
    arch: str = "bert",
) -> list[ResolvedPhase]:
    """The phases in steps and samples. ``global_batch``: the run's (a ramp's target and the
    default of a phase); ``seq_len(data)``: the sequence length of a phase's data (None: the
    run's --data). Boundaries depend on the world size only through the divisibility checks."""
    accum = global_batch // (micro_batch * world_size)
    batch = BatchPlan(global_batch, micro_batch, accum, world_size)
    return resolve_for_batch(phases, path, batch, seq_len, min_lr_ratio, arch)


def resolve_for_batch(
    phases: list[Phase],
    path: str,
    batch: BatchPlan,
    seq_len: Callable[[list[str] | None], int],
    min_lr_ratio: float,
    arch: str,
) -> list[ResolvedPhase]:
    """:func:`resolve` at a job's batch plan (the trainer's and the doctor's)."""
    block, glob = batch.micro_batch * batch.world_size, batch.global_batch
    _check_divisible(glob, block, f"{path}: the run's global batch")
    out: list[ResolvedPhase] = []
    for ph in phases:
        prev = out[-1] if out else None
        out.append(_resolve_phase(ph, prev, path, glob, block, seq_len, min_lr_ratio, arch))
    return out


def _resolve_phase(
    ph: Phase,
    prev: ResolvedPhase | None,
    path: str,
    global_batch: int,
    block: int,
    seq_len: Callable[[list[str] | None], int],
    min_lr_ratio: float,
    arch: str,
) -> ResolvedPhase:
    """One phase, starting where ``prev`` (None: the first phase) ended and inheriting its data,
    mask rate, rope theta and closing lr where it sets none of its own."""
    if ph.rope_theta is not None:
        _check_rotary(arch, _where(path, ph, "rope_theta"))
    start_step, start_consumed = (prev.end_step, prev.end_consumed) if prev else (0, 0)
    own = ph.data is not None
    data = ph.data if own else (prev.data if prev else None)
    data_start = start_consumed if own else (prev.data_start if prev else 0)
    mask = ph.mask_prob if ph.mask_prob is not None else (prev.mask_prob if prev else None)
    theta = ph.rope_theta if ph.rope_theta is not None else (prev.rope_theta if prev else None)
    length = seq_len(data)
    fixed, ramp = _phase_batch(ph, global_batch, block, length, path)
    target = None if ph.tokens is None else -(-ph.tokens // length)  # samples
    batches = _phase_batches(ph, fixed, ramp, global_batch, target)
    step, consumed = start_step + len(batches), start_consumed + sum(batches)
    floor = ph.min_lr_ratio if ph.min_lr_ratio is not None else min_lr_ratio
    top = prev.lr_end if prev else 1.0
    shape = Segment(ph.name, ph.lr, start_step, step, top=top, floor=floor, offset=1)
    return ResolvedPhase(
        name=ph.name,
        start_step=start_step,
        end_step=step,
        start_consumed=start_consumed,
        end_consumed=consumed,
        tokens=(consumed - start_consumed) * length,
        seq_len=length,
        lr_shape=ph.lr,
        lr_start=shape.value(start_step),
        lr_end=shape.value(step - 1),
        min_lr_ratio=floor,
        batch_start=batches[0],
        batch_end=batches[-1],
        batch_fixed=fixed,
        ramp=ramp,
        data=data,
        own_data=own,
        data_start=data_start,
        mask_prob=mask,
        rope_theta=theta,
    )


def _phase_batch(
    ph: Phase, global_batch: int, block: int, length: int, path: str
) -> tuple[int | None, dict | None]:
    """A phase's batch, checked: (its fixed global batch, None) or (None, its ramp in samples)."""
    if not isinstance(ph.batch, Ramp):
        fixed = global_batch if ph.batch is None else ph.batch
        _check_divisible(fixed, block, _where(path, ph, "batch"))
        return fixed, None
    r = ph.batch
    for key, value in (("start", r.start), ("increment", r.increment)):
        _check_divisible(value, block, _where(path, ph, f"batch.{key}"))
    if r.start >= global_batch or (global_batch - r.start) % r.increment:
        raise PhasePlanError(
            f"{_where(path, ph, 'batch.start')}: a ramp goes from start {r.start} by "
            f"increments of {r.increment} to the run's global batch {global_batch}; "
            "start must be below it and the difference a multiple of the increment"
        )
    if r.ramp_tokens is None and ph.tokens is None:  # the phase's samples depend on the ramp
        raise PhasePlanError(
            f"{_where(path, ph, 'batch.ramp_tokens')}: a ramp in a phase measured in "
            "`steps` needs ramp_tokens (or give the phase's length in `tokens`)"
        )
    samples = -(-ph.tokens // length) if r.ramp_tokens is None else r.ramp_tokens // length
    return None, {"start": r.start, "increment": r.increment, "ramp_samples": samples}


def _phase_batches(
    ph: Phase, fixed: int | None, ramp: dict | None, global_batch: int, target: int | None
) -> list[int]:
    """The global batch of each step of a phase (``ph.steps`` of them, or up to ``target``)."""
    consumed, batches = 0, []  # samples within the phase
    while (ph.steps is not None and len(batches) < ph.steps) or (
        target is not None and consumed < target
    ):
        b = fixed if ramp is None else ramp_batch(ramp, global_batch, consumed)
        batches.append(b)
        consumed += b
        if ramp is None and ph.tokens is not None:  # a fixed batch: the rest directly
            rest = max(-(-(target - consumed) // b), 0)
            batches += [b] * rest
            consumed += b * rest
    return batches


def plan_schedule(plan: list[ResolvedPhase], global_batch: int | None = None) -> Schedule:
    """The plan as the run's one schedule: an lr segment per phase, and the phases themselves
    (each step's batch, masking, rope theta and data); ``global_batch``: the run's, a ramp's
    target."""
    lr = phases_schedule(
        [ph.lr_shape for ph in plan],
        [ph.end_step for ph in plan],
        [ph.min_lr_ratio for ph in plan],
        names=[ph.name for ph in plan],
    )
    return dataclasses.replace(lr, plan=[asdict(ph) for ph in plan], global_batch=global_batch)


def plan_table(plan: list[ResolvedPhase]) -> str:
    """The plan as the dry run prints it: one row per phase."""
    rope = any(ph.rope_theta is not None for ph in plan)  # a column only when a phase sets it
    head = ("phase", "steps", "tokens", "lr (x peak)", "batch", "data", "mask")
    head += ("global rope theta",) if rope else ()
    rows = [head]
    for ph in plan:
        row = (
            ph.name,
            f"[{ph.start_step}, {ph.end_step})",
            f"{ph.tokens:,}",
            f"{ph.lr_start:.4g} -> {ph.lr_end:.4g}",
            f"{ph.batch_start} -> {ph.batch_end}",
            " ".join(ph.data) if ph.data else "--data",
            "--mask_prob" if ph.mask_prob is None else f"{ph.mask_prob:g}",
        )
        theta = "--global_rope_theta" if ph.rope_theta is None else f"{ph.rope_theta:g}"
        rows.append(row + ((theta,) if rope else ()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def plan_dict(plan: list[ResolvedPhase]) -> dict[str, Any]:
    """The resolved plan as JSON (what a run folder's phases.json holds)."""
    return {"total_steps": plan[-1].end_step, "phases": [asdict(ph) for ph in plan]}


def main(argv: list[str] | None = None) -> int:
    """``bertforge phases FILE ...``: check a phase file and print its plan."""
    p = argparse.ArgumentParser(
        prog="bertforge phases",
        description="Check a phase file and print its resolved plan (steps, tokens, lr, batch).",
    )
    p.add_argument("file", help="the phase file (YAML or JSON)")
    p.add_argument("--global_batch_size", type=int, required=True, help="the run's global batch")
    p.add_argument("--micro_batch_size", type=int, required=True, help="per rank")
    p.add_argument("--world_size", type=int, default=1, help="data-parallel ranks")
    p.add_argument("--seq_len", type=int, required=True, help="sequence length of the shards")
    p.add_argument("--min_lr_ratio", type=float, default=0.0, help="a decay's floor, x --lr")
    p.add_argument(
        "--arch", default="bert", help="the run's --arch (a rope_theta needs a rotary one)"
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = p.parse_args(argv)
    try:
        plan = resolve(
            load_phase_file(args.file),
            path=args.file,
            global_batch=args.global_batch_size,
            micro_batch=args.micro_batch_size,
            world_size=args.world_size,
            seq_len=lambda data: args.seq_len,
            min_lr_ratio=args.min_lr_ratio,
            arch=args.arch,
        )
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    print(json.dumps(plan_dict(plan), indent=2) if args.json else plan_table(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
