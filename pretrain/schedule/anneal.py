"""Annealing from a checkpoint (``--anneal_from RUN@STEP --anneal_tokens N``): the decay phase of
warmup-stable-decay, started later, from any complete checkpoint of another run.

A new run folder takes the source checkpoint's module, optimizer state (Adam moments and step
counts) and fp32 master weights, but not its lr schedule: its schedule (an ``anneal`` one of
:mod:`pretrain.config.schedule`) starts at the lr
the source had after STEP (its scheduler's lr, the guard's cut included) and decays over the
anneal steps (``ceil(N / (global batch x seq len))``) to ``--min_lr_ratio`` x the source's peak
lr, shaped by ``--decay_shape``. The anneal run counts its steps from 0; its data position is the
source's consumed samples when ``--data`` is the source's, else 0 (a new mixture: domain
annealing). The source run folder is only read; while it is loaded, a lease
(:mod:`pretrain.checkpoints.leases`) keeps the source's pruning from deleting the checkpoint.

Everything about the source is checked by :func:`plan_anneal` before any rendezvous.
``--resume auto`` of an anneal run takes the plan from its own checkpoint (``anneal_from`` in
the trainer state) and continues it like any resume.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge.logs import get_logger
from bertforge.pretrain.checkpoints import leases
from bertforge.pretrain.checkpoints.resume import check_compatible
from bertforge.pretrain.checkpoints.schedule_override import ScheduleOverride, guard_factor
from bertforge.pretrain.config.flag_checks import AnnealError
from bertforge.pretrain.config.schedule import Schedule, anneal
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.run_folder.run_checkpoints import (
    MARKER,
    CheckpointError,
    list_complete,
    read_state,
    resolve_resume,
    tag_for,
)

log = get_logger(__name__)

LATEST = "latest"  # RUN@latest: the source's newest verified checkpoint


@dataclass
class AnnealPlan:
    """What an anneal run starts from and how it decays (recorded as ``anneal_from``)."""

    source_run: str  # the source run folder
    source_step: int  # the checkpoint's step
    checkpoint: str  # its folder
    source_lr: float  # the lr the source would have used for its next step
    peak_lr: float  # the source's peak lr (its base lr without the guard's cut)
    guard_factor: float  # the guard's lr cut the source carried (1.0: none)
    consumed_samples: int  # the source's data position
    start_samples: int  # the anneal run's data position: the source's, or 0 for other data
    same_data: bool
    data: list[str]  # this run's --data
    tokens: int  # --anneal_tokens
    steps: int  # anneal steps
    shape: str
    min_lr_ratio: float

    def schedule(self) -> Schedule:
        """The anneal run's schedule, relative to the base lr peak x guard cut."""
        base = self.peak_lr * self.guard_factor
        return anneal(
            start_ratio=self.source_lr / base,
            total_steps=self.steps,
            shape=self.shape,
            min_ratio=self.min_lr_ratio / self.guard_factor,
        )

    @property
    def floor_lr(self) -> float:
        return self.min_lr_ratio * self.peak_lr

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line for the log and the dry run."""
        data = "the source's data" if self.same_data else f"new data {', '.join(self.data)}"
        return (
            f"anneal from {self.source_run} step {self.source_step}: {self.steps} steps "
            f"({self.tokens:,} tokens), lr {self.source_lr:.4g} -> {self.floor_lr:.4g} "
            f"({self.shape}), on {data}, starting at sample {self.start_samples}"
        )


def parse_anneal_from(spec: str) -> tuple[Path, str]:
    """``RUN@STEP`` or ``RUN@latest`` -> (run folder, step text)."""
    run, sep, step = spec.rpartition("@")
    if not sep or not run or not (step == LATEST or step.isdigit()):
        raise AnnealError(
            f"--anneal_from {spec!r}: expected RUN@STEP (a run folder and the step of one of "
            f"its complete checkpoints) or RUN@{LATEST}"
        )
    return Path(run), step


def source_checkpoint(spec: str) -> Path:
    """The verified checkpoint folder ``--anneal_from`` names (errors name the flag)."""
    run, step = parse_anneal_from(spec)
    ckpts = RunFolder(run).checkpoints
    if not ckpts.is_dir():
        raise AnnealError(f"--anneal_from {spec}: {run} is not a run folder (no {ckpts})")
    if step == LATEST:
        return resolve_resume(str(run), "", flag="--anneal_from")
    path = ckpts / tag_for(int(step))
    if not path.is_dir():
        have = [s for s, _ in list_complete(ckpts)]
        raise AnnealError(
            f"--anneal_from {spec}: {run} has no checkpoint of step {int(step)}; its complete "
            f"checkpoints are at steps {have or 'none'}"
        )
    if not (path / MARKER).exists():
        raise AnnealError(
            f"--anneal_from {spec}: the checkpoint {path} is incomplete (no {MARKER}; its run "
            "stopped while saving): name another step"
        )
    return resolve_resume(str(path), "", flag="--anneal_from")


def source_schedule_state(path: Path) -> dict[str, Any]:
    """The lr scheduler's saved state of a checkpoint (DeepSpeed's mp_rank_00 model states)."""
    files = sorted(path.glob("mp_rank_*_model_states.pt"))
    if not files:
        raise CheckpointError(f"--anneal_from: {path} holds no DeepSpeed model states file")
    states = torch.load(files[0], map_location="cpu", weights_only=False, mmap=True)
    sched = states.get("lr_scheduler")
    if not sched or not sched.get("_last_lr"):
        raise AnnealError(
            f"--anneal_from: {path} holds no step lr schedule (its run used --schedule_clock "
            "time or a DeepSpeed scheduler); anneal from a run of the step clock"
        )
    return sched


def _same_data(state: dict[str, Any], described: list[dict[str, Any]]) -> bool:
    keys = ("name", "weight", "mask_prob")

    def norm(sources):
        return [
            {**{k: s.get(k) for k in keys}, "path": os.path.realpath(str(s.get("path")))}
            for s in sources
        ]

    saved = state.get("data_mixture") or []
    return bool(saved) and norm(saved) == norm(described)


def plan_anneal(
    cfg, reader, described: list[dict[str, Any]], global_batch: int, resumed: dict | None
) -> AnnealPlan:
    """The anneal plan, checked before any rendezvous. ``resumed``: the ``anneal_from`` record
    of this run's own checkpoint (``--resume auto`` of an anneal run), which wins."""
    if resumed is not None:
        plan = AnnealPlan(**resumed)
        run, step = parse_anneal_from(cfg.run.anneal_from)
        if os.path.realpath(run) != os.path.realpath(plan.source_run) or (
            step != LATEST and int(step) != plan.source_step
        ):
            raise AnnealError(
                f"--anneal_from {cfg.run.anneal_from}: {cfg.run.output_dir} is an anneal of "
                f"{plan.source_run}@{plan.source_step}; resume it with that --anneal_from, or "
                "use another --output_dir"
            )
        return plan
    path = source_checkpoint(cfg.run.anneal_from)
    state = read_state(path)
    check_compatible(
        state,
        vocab_size=reader.vocab_size,
        tokenizer_fingerprint=reader.manifest["tokenizer"]["fingerprint"],
        model_config=asdict(cfg.model_cfg),
        path=path,
    )
    sched = source_schedule_state(path)
    factor = guard_factor(state)
    same = _same_data(state, described)
    consumed = int(state["consumed_samples"])
    steps = math.ceil(cfg.run.anneal_tokens / (global_batch * reader.max_seq_len))
    return AnnealPlan(
        source_run=str(path.parent.parent),
        source_step=int(state["step"]),
        checkpoint=str(path),
        source_lr=float(sched["_last_lr"][0]),
        peak_lr=float(sched["base_lrs"][0]) / factor,
        guard_factor=factor,
        consumed_samples=consumed,
        start_samples=consumed if same else 0,
        same_data=same,
        data=list(cfg.run.data_sources),
        tokens=int(cfg.run.anneal_tokens),
        steps=steps,
        shape=cfg.optim.decay_shape,
        min_lr_ratio=cfg.optim.min_lr_ratio,
    )


def start_anneal(plan: AnnealPlan, engine, ckpts, *, seed: int, rank: int) -> tuple[int, int]:
    """Load the source checkpoint into ``engine`` (any world size: the universal conversion goes
    into this run's folder), put the anneal schedule in place of its own, and start at step 0
    at the plan's data position. Collective. Returns (step, consumed samples)."""
    path = Path(plan.checkpoint)
    lease = leases.take(path, os.getpid(), "anneal load") if rank == 0 else None
    try:
        state = ckpts.load_any(engine, path, seed=seed)
    finally:
        if lease is not None:
            leases.release(lease)
    if ckpts.ema is not None:  # --ema of the anneal averages the anneal's own steps
        ckpts.ema.shadow = None
    scheduler = engine.lr_scheduler
    scheduler.last_epoch = 0  # the anneal counts its own steps
    ScheduleOverride(plan.schedule(), plan.peak_lr).apply(scheduler, state)
    engine.global_steps, engine.global_samples = 0, plan.start_samples
    ckpts.last_saved_step = None
    log.info(plan.summary())
    if not plan.same_data:
        log.info(
            "--data differs from the source's: the anneal reads its data from sample 0 "
            f"(the source had consumed {plan.consumed_samples})"
        )
    return 0, plan.start_samples


def resolve(
    cfg, reader, described: list[dict[str, Any]], point, global_batch: int, ds_config: dict
):
    """The anneal plan of this launch (None without --anneal_from), before any rendezvous; sets
    ``ds_config``'s optimizer lr to the source's (the run's length, ``plan.steps``, replaces
    ``cfg.run.max_steps`` in pretrain.build.resolve_run). A
    fresh anneal needs an --output_dir without checkpoints; ``--resume auto`` of an anneal run
    continues the plan its checkpoint records."""
    if not cfg.run.anneal_from:
        return None
    resumed = None
    if point is not None:
        resumed = point.state.get("anneal_from")
        if resumed is None:
            raise AnnealError(
                f"--anneal_from: {cfg.run.output_dir} holds checkpoints of another run "
                f"({point.path}); give the anneal a new --output_dir"
            )
    plan = plan_anneal(cfg, reader, described, global_batch, resumed)
    params = ds_config["optimizer"]["params"]
    if cfg.optim.lr is not None and not math.isclose(cfg.optim.lr, plan.peak_lr, rel_tol=1e-9):
        log.warning(
            f"--lr {cfg.optim.lr} is ignored with --anneal_from: the anneal starts at the "
            f"source's lr {plan.source_lr:.4g} (its peak {plan.peak_lr:.4g})"
        )
    # The optimizer's base lr is the source's (peak x the guard's cut), as its checkpoint holds.
    params["lr"] = plan.peak_lr * plan.guard_factor
    return plan
