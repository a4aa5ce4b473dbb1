"""``--phases FILE`` in a run: the plan resolved into the run's one schedule
(:func:`pretrain.config.phase_plan.plan_schedule`), checked against the other flags, the
checkpoint and the model before any rendezvous; the training readers of the phases' own data and
their validation readers (:class:`PhaseTracker`); and what applies a step's values to the engine
and the model (:func:`set_batch`, :func:`set_rope_theta`). Each step's lr, batch, masking, rope
theta and data are the schedule's answers (:class:`~pretrain.config.schedule.Schedule`); nothing
here computes them.

A phase's ``mask_prob`` replaces the run's masking (constant, --mask_prob_end dropped) from its
first step; the trainer builds a new loader there at the same consumed samples (masks depend on
(seed, epoch, sample, position) only, so a resume inside the phase draws the same ones).

A phase's ``data`` (``--data`` syntax: one shard folder or ``name=DIR:weight`` sources) is opened
and checked before any rendezvous, like --data: the same tokenizer and format as the run's data
(a longer sequence length is fine: the model is built for the longest of any phase). The phase's
loader starts at the beginning of its data, at position consumed - the phase's first consumed
samples; a later phase without ``data`` continues that stream. Validation covers every distinct
source of the run and of its phases (records per source name), so the forgetting of the general
text in a domain phase shows.

A phase's ``rope_theta`` (a rotary ``--arch``: ModernBERT) is the global layers' rotary base
from its first step on (the local layers keep --local_rope_theta), as ModernBERT raised it for
its 8k context extension; later phases inherit it, and a resume sets the theta of the phase it
starts in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.data_prep.object_store import is_url
from bertforge.data_prep.sources import MixtureError, Source, parse_mixture
from bertforge.logs import get_logger
from bertforge.pretrain.config.batching import BatchPlan, apply_batch
from bertforge.pretrain.config.phase_plan import (
    PhasePlanError,
    ResolvedPhase,
    load_phase_file,
    plan_dict,
    plan_schedule,
    resolve_for_batch,
)
from bertforge.pretrain.config.schedule import Schedule
from bertforge.pretrain.data.mixture import open_training, validation_readers

log = get_logger(__name__)


def check_flags(cfg, total_steps: int) -> None:
    """Refuse flags that contradict a phase plan (the plan owns the lr shape and the length)."""
    optim = cfg.optim
    clash = []
    if optim.schedule != "warmup_decay":
        clash.append("--schedule")
    if optim.warmup_steps is not None:
        clash.append("--warmup_steps")
    if optim.decay != "linear":
        clash.append("--decay")
    if optim.schedule_clock != "steps":
        clash.append("--schedule_clock")
    if clash:
        raise PhasePlanError(
            f"--phases {cfg.run.phases}: the plan gives the lr shape of every phase; drop "
            f"{', '.join(clash)}"
        )
    if cfg.run.max_steps not in (100, total_steps):  # 100: the flag's default, replaced
        raise PhasePlanError(
            f"--phases {cfg.run.phases} trains {total_steps} steps; --max_steps "
            f"{cfg.run.max_steps} disagrees: drop --max_steps"
        )


def _signature(reader) -> dict[str, Any]:
    return {"tokenizer": reader.manifest["tokenizer"]["fingerprint"], "format": reader.format}


def _where(path) -> Path | str:
    """A source's folder, resolved; a URL as it is."""
    return path if is_url(path) else Path(path).resolve()


def open_phase_data(phases, path: str, run_reader, verify: str) -> dict[tuple[str, ...], Any]:
    """{the phase's data values: its training reader} for every phase that names ``data``,
    each checked against the run's data (tokenizer fingerprint, format); errors name the phase."""
    readers: dict[tuple[str, ...], Any] = {}
    for ph in phases:
        if ph.data is None or tuple(ph.data) in readers:
            continue
        where = f"{path}: phase {ph.index} ({ph.name!r}), key 'data'"
        try:
            reader = open_training(parse_mixture(ph.data), verify=verify)
        except (MixtureError, OSError, ValueError) as e:
            raise PhasePlanError(f"{where}: {e}") from None
        if run_reader is not None and _signature(reader) != _signature(run_reader):
            raise PhasePlanError(
                f"{where}: {' '.join(ph.data)} was built with another tokenizer or format "
                f"({_signature(reader)}) than --data ({_signature(run_reader)}); rebuild it "
                "with `bertforge prep build --tokenizer RUN_DATA/tokenizer ...`"
            )
        readers[tuple(ph.data)] = reader
    return readers


@dataclass
class PhaseTracker:
    """The run's plan as its schedule, the target batch plan (the run's global batch), the
    training readers of the phases' own data (by their ``--data`` values) and the phase file."""

    schedule: Schedule  # the plan's: each step's lr, batch, masking, rope theta and data
    target: BatchPlan
    readers: dict[tuple[str, ...], Any] = dataclasses.field(default_factory=dict)
    path: str = ""  # the phase file, for messages

    @classmethod
    def for_run(cls, cfg, setup, seq_len: int, arch: str, run_reader=None) -> PhaseTracker:
        """Load, check and resolve ``cfg.run.phases`` for this launch's batch plan ``setup``;
        ``seq_len``: --data's, ``run_reader``: its training reader (phases' data is checked
        against it)."""
        path = cfg.run.phases
        phases = load_phase_file(path)
        readers = open_phase_data(phases, path, run_reader, cfg.data_cfg.verify)
        target = setup.batch
        plan = resolve_for_batch(
            phases,
            path,
            target,
            lambda data: seq_len if data is None else readers[tuple(data)].max_seq_len,
            cfg.optim.min_lr_ratio,
            arch,
        )
        check_flags(cfg, plan[-1].end_step)  # the run's length is the plan's (build.resolve_run)
        return cls(plan_schedule(plan, target.global_batch), target, readers, path)

    @property
    def plan(self) -> list[ResolvedPhase]:
        """The resolved phases, in order."""
        return self.schedule.phases_resolved()

    @property
    def max_seq_len(self) -> int:
        """The longest sequence of any phase (the model's positions and memory are sized by it)."""
        return max(ph.seq_len for ph in self.plan)

    def check_positions(self, model_cfg) -> None:
        """Refuse a phase whose sequences are longer than the model's position table."""
        limit = model_cfg.max_position_embeddings
        for ph in self.plan:
            if ph.seq_len > limit:
                raise PhasePlanError(
                    f"{self.path}: phase {ph.name!r}, key 'data': sequences of {ph.seq_len} "
                    f"tokens exceed the model's max_position_embeddings {limit}; build that "
                    "data with a shorter --max_seq_len or choose a model with more positions"
                )

    def phase_sources(self) -> list[Source]:
        """Every source the phases' own data names, in plan order (one per distinct data)."""
        seen: list[Source] = []
        for data in self.readers:
            seen += [s for s in parse_mixture(list(data)) if s not in seen]
        return seen

    def validation(self, run_val: list, verify: str) -> list:
        """``run_val`` ([(name, reader)] of --data) and the validation readers of every phase
        source not among them; a name that two sources with different folders share is refused."""
        out, paths = list(run_val), {}
        for name, reader in run_val:
            paths[name] = _where(reader.sources[0].path)
        extra = []
        for src in self.phase_sources():
            where = _where(src.path)
            if src.name in paths and paths[src.name] != where:
                raise PhasePlanError(
                    f"{self.path}: source name {src.name!r} stands for {paths[src.name]} "
                    f"and {where}; give the phases' sources distinct names"
                )
            if where in paths.values():  # validated already (under this or another name)
                continue
            paths[src.name] = where
            extra.append(src)
        if extra:
            out += validation_readers(extra, verify=verify)
        return out

    def batch_plan(self, step: int, consumed: int) -> BatchPlan:
        """The batch plan of 0-based ``step`` starting at ``consumed`` samples."""
        return self.target.with_global(self.schedule.batch_at(step, consumed))

    def first_setup(self, setup, point) -> Any:
        """``setup`` with the batch of the step this launch starts at (DeepSpeed checks its
        config's batch at initialize; a resume's step may be inside a ramp)."""
        step = int(point.state["step"]) if point is not None else 0
        consumed = int(point.state["consumed_samples"]) if point is not None else 0
        first = self.batch_plan(step, consumed)
        return dataclasses.replace(setup, config=apply_batch(setup.config, first), batch=first)

    def check_resume(self, point, override: bool) -> None:
        """A resume under a changed plan is refused, naming what changed, unless
        --override_lr_schedule (then warned: the new plan applies from the checkpoint's step)."""
        saved = point.state.get("phases") if point is not None else None
        if saved is None or saved == self.as_dict():
            return
        new = self.as_dict()
        diff = [
            f"{a.get('name')}: {k} {a.get(k)} -> {b.get(k)}"
            for a, b in zip(saved["phases"], new["phases"])
            for k in a
            if a.get(k) != b.get(k)
        ]
        if len(saved["phases"]) != len(new["phases"]):
            diff.insert(0, f"{len(saved['phases'])} phases -> {len(new['phases'])}")
        text = "; ".join(diff[:6])
        if not override:
            raise PhasePlanError(
                f"--phases: the plan differs from the checkpoint's ({text}); pass "
                "--override_lr_schedule to continue under the new plan at the checkpoint's step"
            )
        log.warning(f"--override_lr_schedule: the new phase plan applies from here ({text})")

    def as_dict(self) -> dict[str, Any]:
        return plan_dict(self.plan)


def set_batch(engine, current: BatchPlan, global_batch: int) -> BatchPlan:
    """``current`` at the step's ``global_batch`` (the schedule's); when it differs, DeepSpeed's
    accumulation changes with it (the micro-batch stays)."""
    new = current.with_global(global_batch)
    if new.global_batch != current.global_batch:
        engine.set_train_batch_size(new.global_batch)
        if hasattr(engine.optimizer, "gradient_accumulation_steps"):  # ZeRO's offload reads it
            engine.optimizer.gradient_accumulation_steps = new.grad_accum
    # DeepSpeed finds the window's last micro-batch by (micro_steps + 1) % accumulation: after
    # the accumulation changed, its counter must restart at a multiple of the new one, or the
    # update lands mid-window (seen: a ramp 8 -> 12 stepped after 2 of 3 micro-batches)
    engine.micro_steps -= engine.micro_steps % new.grad_accum
    return new


def set_rope_theta(model, theta: float) -> bool:
    """Give ``model`` (a ModernBERT) the global rope ``theta`` when it differs from the model's;
    False when nothing changed (or the arch has none)."""
    if not hasattr(model, "set_global_rope_theta") or theta == model.global_rope_theta():
        return False
    model.set_global_rope_theta(theta)
    return True


def tracker_for_run(cfg, setup, run_reader) -> PhaseTracker | None:
    """The run's tracker, or None without --phases; a bad plan raises a UserError."""
    if not cfg.run.phases:
        return None
    arch = cfg.model_cfg.arch
    return PhaseTracker.for_run(cfg, setup, run_reader.max_seq_len, arch, run_reader)
