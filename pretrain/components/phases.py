"""``--phases FILE`` in a run: the resolved plan (pretrain.config.phase_plan), checked against
the other flags before any rendezvous, and the :class:`PhaseTracker` that gives the trainer each
step's batch plan (changing DeepSpeed's accumulation when the batch changes) and phase name.

A phase's ``mask_prob`` replaces the run's masking (constant, --mask_prob_end dropped) from its
first step; the trainer builds a new loader there at the same consumed samples (masks depend on
(seed, epoch, sample, position) only, so a resume inside the phase draws the same ones). What the
trainer does not do yet is refused here, naming the key: a phase's own ``data`` or
``rope_theta`` (the plan format and its checker accept them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from bertforge.logs import get_logger
from pretrain.config.batching import BatchPlan, apply_batch
from pretrain.config.phase_plan import (
    PhasePlanError,
    PhaseSchedule,
    ResolvedPhase,
    batch_at,
    load_phase_file,
    phase_at,
    plan_dict,
    resolve,
)

log = get_logger(__name__)
NOT_IN_TRAINING = ("data", "rope_theta")  # accepted by the format, not trained yet


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


@dataclass
class PhaseTracker:
    """The run's resolved plan, its target batch plan (the run's global batch) and the batch
    plan of the step being trained."""

    plan: list[ResolvedPhase]
    target: BatchPlan

    @classmethod
    def for_run(cls, cfg, setup, seq_len: int, arch: str) -> PhaseTracker:
        """Load, check and resolve ``cfg.run.phases`` for this launch's batch plan ``setup``."""
        path = cfg.run.phases
        phases = load_phase_file(path)
        for ph in phases:
            for key in NOT_IN_TRAINING:
                if getattr(ph, key) is not None:
                    raise PhasePlanError(
                        f"{path}: phase {ph.index} ({ph.name!r}), key {key!r}: the trainer does "
                        "not switch data or rope theta at a phase yet; train that "
                        "phase as a separate run (--init_from) or drop the key"
                    )
        target = setup.batch
        plan = resolve(
            phases,
            path=path,
            global_batch=target.global_batch,
            micro_batch=target.micro_batch,
            world_size=target.world_size,
            seq_len=lambda data: seq_len,
            min_lr_ratio=cfg.optim.min_lr_ratio,
            arch=arch,
        )
        check_flags(cfg, plan[-1].end_step)
        cfg.run.max_steps = plan[-1].end_step
        return cls(plan, target)

    def batch_plan(self, step: int, consumed: int) -> BatchPlan:
        """The batch plan of 0-based ``step`` starting at ``consumed`` samples."""
        g, t = batch_at(self.plan, step, consumed, self.target.global_batch), self.target
        return BatchPlan(g, t.micro_batch, g // (t.micro_batch * t.world_size), t.world_size)

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

    def schedule(self) -> PhaseSchedule:
        return PhaseSchedule.for_plan(self.plan)

    def as_dict(self) -> dict[str, Any]:
        return plan_dict(self.plan)

    def apply(self, engine, current: BatchPlan, step: int, consumed: int) -> BatchPlan:
        """This step's batch plan; when its global batch differs from ``current``, DeepSpeed's
        accumulation changes with it (the micro-batch stays)."""
        new = self.batch_plan(step, consumed)
        if new.global_batch != current.global_batch:
            engine.set_train_batch_size(new.global_batch)
            if hasattr(engine.optimizer, "gradient_accumulation_steps"):  # ZeRO's offload reads it
                engine.optimizer.gradient_accumulation_steps = new.grad_accum
        return new

    def masking(self, step: int, base):
        """The masking config of 0-based ``step``: ``base`` (the run's) with the phase's rate."""
        ph = phase_at(self.plan, step)
        if ph.mask_prob is None:
            return base
        return dataclasses.replace(base, mask_prob=ph.mask_prob, mask_prob_end=None)

    def masking_changes_at(self, step: int, base) -> bool:
        """True at the first step of a phase whose masking differs from the previous phase's."""
        ph = phase_at(self.plan, step)
        return 0 < step == ph.start_step and self.masking(step, base) != self.masking(
            step - 1, base
        )

    def phase_name(self, step: int) -> str:
        return phase_at(self.plan, step).name


def tracker_for_run(cfg, setup, seq_len: int) -> PhaseTracker | None:
    """The run's tracker, or None without --phases; a bad plan raises a UserError."""
    if not cfg.run.phases:
        return None
    return PhaseTracker.for_run(cfg, setup, seq_len, cfg.model_cfg.arch)
