"""The optimizer-step loop: step, record, evaluate when due, save when due.

:class:`Trainer` owns the loop and the two things it computes itself (a training step over one
global batch and a validation pass). Everything else decides for itself when it is due: the
:class:`~pretrain.checkpoints.checkpoint.CheckpointManager` (interval, minutes, signals, agreed
across ranks), the :class:`~pretrain.components.metrics.MetricsWriter` (what goes to the console,
metrics.jsonl and TensorBoard), the guard (:class:`~pretrain.components.guarded_step.GuardedStep`).
Built by :func:`pretrain.build.build_training` from the groups of
:mod:`pretrain.components.run_parts` (StepSetup, TrainData, RunOutputs, RunClock).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist

from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.preemption import PreemptionHandler
from bertforge.pretrain.checkpoints.checkpoint import CheckpointSaveError
from bertforge.pretrain.components.downstream_jobs import DownstreamJobs
from bertforge.pretrain.components.guarded_step import GuardedStep
from bertforge.pretrain.components.metrics import StepTimer
from bertforge.pretrain.components.run_parts import RunClock, RunOutputs, StepSetup, TrainData
from bertforge.pretrain.components.step_records import (
    STEP_SUMS,
    engine_record,
    loss_record,
    validation_record,
)
from bertforge.pretrain.config.schedule import Schedule
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.data.loader import build_loader
from bertforge.pretrain.data.masking import at_mask_prob, merge_stats
from bertforge.pretrain.distributed.startup import sum_across_ranks
from bertforge.pretrain.model import compiled
from bertforge.pretrain.model.registry import resolve_attention
from bertforge.pretrain.model.specs import resolve_objective
from bertforge.pretrain.objectives.registry import objective_for
from bertforge.pretrain.schedule.budget import BatchRamp, TimeBudget
from bertforge.pretrain.schedule.phases import set_batch, set_rope_theta
from bertforge.pretrain.stability.faults import SPIKE_FACTOR
from bertforge.pretrain.stability.guard import EXIT_GAVE_UP, Verdict

EXIT_MIN_LOSS_SCALE = 4  # fp16 kept overflowing at the minimum loss scale
EXIT_SAVE_FAILED = 5  # a final, signal or budget save failed (the previous checkpoint is intact)
# A failed one warns; the run retries at the next interval ("guard": the guard's anchor).
PERIODIC_SAVES = ("interval", "time", "guard")


def fp16_gave_up(error: BaseException) -> bool:
    """True for DeepSpeed's exception when fp16 overflowed again at the minimum loss scale."""
    return "loss scale already at minimum" in str(error)


def fp16_give_up_message(loss_scale: float, step: int) -> str:
    """What to tell the user when fp16 gave up (see :func:`fp16_gave_up`)."""
    return (
        f"fp16 gradients kept overflowing at the minimum loss scale "
        f"({loss_scale}) at step {step}; training stopped and nothing was saved after the last "
        "checkpoint. Lower the learning rate, use bf16, or raise min_loss_scale."
    )


def _source_names(reader) -> list[str]:
    """A mixture's source names in id order (a step's per-source shares); [] for one folder."""
    sources = getattr(reader, "sources", None)
    return [src.name for src in sources] if sources else []


def _iterate(loader):
    """``iter(loader)`` without touching the global RNG (DataLoader draws a base seed from it,
    which would shift dropout after a resume relative to the uninterrupted run)."""
    with torch.random.fork_rng(devices=[]):
        return iter(loader)


class Trainer:
    """The optimizer-step loop with validation, metrics, checkpoints and preemption."""

    def __init__(
        self,
        cfg: TrainConfig,
        place: StepSetup,
        data: TrainData,
        outputs: RunOutputs,
        clock: RunClock | None = None,
        *,
        downstream: DownstreamJobs | None = None,
        guard: GuardedStep | None = None,
        preempt: PreemptionHandler | None = None,
        schedule: Schedule | None = None,
    ):
        self.cfg, self.place, self.data, self.outputs = cfg, place, data, outputs
        # main's handler, installed before the rendezvous (bertforge.preemption); None:
        # run() installs one of its own for the loop (a trainer built by a test or a benchmark).
        self.preempt = preempt
        self.clock = clock or RunClock(TimeBudget(cfg.run.max_time_hours))
        self.downstream, self.guard = downstream, guard
        # the run's schedule; with a phase plan the trainer asks it each step's batch, masking,
        # rope theta and data (the lr is the engine's scheduler's, or the time clock's)
        self.schedule = schedule
        self.phased = bool(schedule and schedule.plan)
        # validation: one fixed size, the run's global batch
        self.eval_plan = (
            place.plan.with_global(schedule.global_batch) if self.phased else place.plan
        )
        # --batch_ramp_start: each step's global batch on the run's clock (not with a phase plan)
        self.ramp = None if self.phased else BatchRamp.for_run(cfg, place.plan)
        # Shorthands the step and the loop use on every line.
        self.engine, self.plan, self.device = place.engine, place.plan, place.device
        self.rank, self.world = place.rank, place.world
        self.metrics, self.ckpts, self.budget = outputs.metrics, outputs.ckpts, self.clock.budget
        self.source_names = _source_names(data.loader.dataset.reader)
        self.faults = self.ckpts.faults  # one plan per launch: the save faults fire in the manager
        spec = resolve_objective(cfg.objective_cfg, data.loader.dataset.reader.format)
        # what the objective adds to the MLM loss, its weights and normalizers, its sums
        self.objective = objective_for(spec)
        self.loss_weights = self.objective.loss_weights(spec.settings)
        if self.faults:
            self.metrics.warning(self.faults.describe())

    def run(self, step: int, consumed: int) -> int:
        """Train from ``step`` to ``max_steps``; returns the exit status."""
        max_steps, eval_interval = self.cfg.run.max_steps, self.cfg.log.eval_interval
        own = self.preempt is None
        preempt = PreemptionHandler(self.cfg.checkpoint.preemption_signals) if own else self.preempt
        try:
            if self._signalled_in_startup(step, preempt):
                return 0
            timer, batches = StepTimer(), _iterate(self.data.loader)
            while step < max_steps:
                timer.restart()
                if self.phased:
                    batches = self._enter_phase_step(step, consumed, batches)
                elif self.ramp is not None:  # the ramp's batch for this step
                    batch = self.ramp.batch(step, max_steps, self.budget)
                    self.plan = self.place.plan = set_batch(self.engine, self.plan, batch)
                try:
                    rec, verdict = self.train_step(batches, timer)
                except Exception as e:  # DeepSpeed raises a bare Exception at the minimum scale
                    if not fp16_gave_up(e):
                        raise
                    scale = self.engine.optimizer.cur_scale
                    self.metrics.error(fp16_give_up_message(scale, step + 1))
                    return EXIT_MIN_LOSS_SCALE
                if self.ckpts.ema is not None:  # --ema: after an applied update only
                    self.ckpts.ema.after_step(self.engine, verdict)
                step, consumed = step + 1, consumed + self.plan.global_batch
                rec.update(engine_record(self.engine, consumed, timer, self.budget))
                if self.ramp is not None:
                    rec["global_batch"] = self.plan.global_batch
                if self.phased:
                    rec["phase"] = self.schedule.phase_at(step - 1).name
                self.metrics.step(rec, timer.elapsed(), self.engine.global_samples)
                if self.guard:
                    action, step = self.guard.judge(verdict, rec, step, consumed)
                    if action == "give_up":
                        return EXIT_GAVE_UP
                    if action == "rollback":
                        continue  # back at the checkpoint's step, data position kept
                if self.downstream:
                    self.downstream.poll()  # finished background evaluations into the metrics
                # Validation at an interval step; the end of training always validates below.
                if eval_interval and step % eval_interval == 0 and step < max_steps:
                    self.evaluate(step)
                reason = self._due_save(step, preempt)
                if reason == "budget":
                    break
                if (status := self._save_when_due(step, consumed, reason, preempt)) is not None:
                    return status
            self.evaluate(step)
            if self.cfg.checkpoint.save_final and self.ckpts.last_saved_step != step:
                if not self.save(step, consumed, "budget" if reason == "budget" else "final"):
                    return EXIT_SAVE_FAILED
            # A signal after training leaves the final checkpoint: do not wait long for more.
            self._finish_downstream(timeout_s=30.0 if preempt.signal is not None else None)
            return 0
        finally:
            if own:
                preempt.restore()

    def _signalled_in_startup(self, step: int, preempt: PreemptionHandler) -> bool:
        """Whether a signal came during start-up (any rank): the run stops with nothing to save."""
        if self.faults:  # a planned crash or preemption at the end of start-up
            self.faults.signal_if_due("startup", step, self.rank)
        if not self.ckpts.signalled(preempt):
            return False
        self.metrics.info(
            f"stopped by a signal during start-up, before step {step + 1}: nothing to save (the "
            "run starts from a complete checkpoint or from step 0); continue with --resume auto"
        )
        return True

    def _enter_phase_step(self, step: int, consumed: int, batches):
        """--phases: the schedule's batch of ``step`` (the guard reads it from place.plan too),
        its loader when its data or masking changes, its rope theta; returns the batches."""
        sched = self.schedule
        self.plan = set_batch(self.engine, self.plan, sched.batch_at(step, consumed))
        self.place.plan = self.plan
        if sched.loader_changes_at(step, self.cfg.masking):  # data or masking
            batches = _iterate(self._train_loader(step, consumed))
        theta = sched.rope_theta_at(step, self.cfg.model_cfg.global_rope_theta)
        if set_rope_theta(self.engine.module, theta):
            self.metrics.info(f"step {step + 1}: global rope theta {theta:g}")
        return batches

    def _due_save(self, step: int, preempt: PreemptionHandler) -> str | None:
        """Why a save is due after ``step`` (None: none); a used-up budget is announced here."""
        reason = self.ckpts.save_due(step, preempt, self.budget)
        if reason is None and self.guard and self.guard.anchor_due(step):
            reason = "guard"  # the guard's first rollback target, after warmup
        if reason == "budget":
            self.metrics.info(
                f"time budget of {self.cfg.run.max_time_hours} "
                f"h used up after step {step}: final validation and save"
            )
        return reason

    def _save_when_due(
        self, step: int, consumed: int, reason: str | None, preempt: PreemptionHandler
    ) -> int | None:
        """Take the save ``reason`` asks for; the exit status if the run stops here, else None."""
        if reason and not self.save(step, consumed, reason):
            return EXIT_SAVE_FAILED
        if reason in PERIODIC_SAVES and self.ckpts.signalled(preempt):
            # A signal during that save: stop now, without another step. Had the save
            # failed (a periodic one only warns), take the signal save in its place.
            reason = "signal"
            if self.ckpts.last_saved_step != step and not self.save(step, consumed, reason):
                return EXIT_SAVE_FAILED
        if reason == "signal":
            self.metrics.info(f"stopped by a signal after step {step}; continue with --resume auto")
            self._finish_downstream(timeout_s=30.0)  # a preempted job cannot wait long
            return 0
        return None

    def _train_loader(self, step: int, consumed: int):
        """The training loader of ``step``'s phase (its data, at ``consumed`` less the samples
        before that data's stream began, and its masking)."""
        data, stream_start = self.schedule.data_at(step)
        reader = self.data.readers[data]
        self.data.loader = build_loader(
            reader,
            self.cfg.data_cfg,
            self.schedule.masking_at(step, self.cfg.masking),
            rank=self.rank,
            world_size=self.world,
            micro_batch_size=self.plan.micro_batch,
            consumed_samples=consumed - stream_start,
            train=True,
            attention=resolve_attention(self.cfg.model_cfg.attention, self.cfg.model_cfg.arch),
            sentence_order=self.objective.spec.sentence_order,
        )
        self.source_names = _source_names(reader)  # a step's per-source shares name these
        return self.data.loader

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self, batches, timer: StepTimer) -> tuple[dict[str, Any], Verdict | None]:
        """Gradient accumulation over one global batch; returns the step's (global) numbers and
        the guard's verdict on its loss (None without the guard), judged before the update."""
        eng, accum = self.engine, self.plan.grad_accum
        if self.clock.lr_clock is not None:  # a time-clock schedule: this step's lr from the clock
            self.clock.lr_clock.apply(eng.optimizer)
        t0 = time.perf_counter()
        micro = [
            next(batches) for _ in range(accum)
        ]  # the whole window, to count its masked tokens
        timer.waited(time.perf_counter() - t0)
        masking = [s for mb in micro if (s := mb.pop("masking_stats", None))]
        sources = [src for mb in micro if (src := mb.pop("source", None)) is not None]
        n_src = len(self.source_names)
        per_source = torch.bincount(torch.cat(sources), minlength=n_src).tolist() if sources else []
        n_masked, n_tokens, *per_source = sum_across_ranks(
            [
                float(sum(int((mb["labels"] != IGNORE_INDEX).sum()) for mb in micro)),
                float(sum(int(mb["attention_mask"].sum()) for mb in micro)),
                *per_source,
            ],
            self.device,
        )
        # Each masked token of the global batch weighs 1/n_masked. DeepSpeed divides by the
        # accumulation steps (backward) and the world size (gradient averaging): undo both.
        scale = float(accum * self.world)
        sums = {k: torch.zeros((), dtype=torch.float64, device=self.device) for k in STEP_SUMS}
        fault = self._planned_fault(eng.global_steps + 1)
        normalizers = {"mlm_normalizer": max(n_masked, 1.0), **self.objective.normalizers(n_tokens)}
        for i, mb in enumerate(micro):
            out = eng(**self._to_device(mb), **normalizers)
            mlm = out["mlm_loss"] if fault is None else out["mlm_loss"] * fault
            loss = mlm * scale
            extra = self.objective.step_loss(out, sums, scale, accum, self.loss_weights)
            if extra is not None:
                loss = loss + extra
            eng.backward(loss)
            if i < accum - 1:
                eng.step()  # inside the window: no update; the boundary step comes below
            sums["mlm_loss"] += mlm.detach().double()
            sums["mlm_correct"] += out["num_correct"].double()
        # The step's global loss is known before the update (one all-reduce, as before).
        stacked = torch.stack([sums[k] for k in STEP_SUMS])
        if self.world > 1:
            dist.all_reduce(stacked)
        rec = {
            "step": eng.global_steps + 1,
            **loss_record(
                dict(zip(STEP_SUMS, stacked.tolist())), n_masked, self.world, **self.loss_weights
            ),
            "tokens": n_tokens,
            "masked": n_masked,
            "samples": self.plan.global_batch,
        }
        if per_source:  # the realised share of each source of a mixture in this step
            total = max(sum(per_source), 1.0)
            rec.update(
                {f"share_{name}": n / total for name, n in zip(self.source_names, per_source)}
            )
        if masking:  # realised masking of this rank's micro-batches, fractions from the counts
            rec.update({f"mask_{k}": v for k, v in merge_stats(masking).items()})
        if self.guard is not None:  # the guard may veto the update
            return rec, self.guard.step(rec)
        eng.step()
        return rec, None

    def _planned_fault(self, step: int) -> float | None:
        """The loss multiplier a planned fault (pretrain.stability.faults) sets for ``step``, or
        None."""
        if not self.faults:
            return None
        if self.faults.due("loss_nan", step, self.rank):
            return math.nan
        if self.faults.due("loss_spike", step, self.rank):
            return SPIKE_FACTOR
        return None

    def evaluate(self, step: int) -> list[dict]:
        """MLM loss, accuracy and perplexity (RTD: the generator's, and the discriminator's
        scores) on each source's validation split (all ranks take part); with several sources,
        per-source records plus the overall one (no "source")."""
        sums = {name: self._validation_sums(reader, step) for name, reader in self.data.val_readers}
        records = []
        if len(sums) > 1:
            records = [{"source": name, **validation_record(step, *s)} for name, s in sums.items()]
        if sums:
            overall = [
                sum(s[k] for s in sums.values()) for k in range(len(next(iter(sums.values()))))
            ]
            records.append(validation_record(step, *overall))
        for rec in records:
            rec["elapsed_s"] = self.budget.elapsed_s()  # plots compare runs by time as well
            self.metrics.eval(rec, self.engine.global_samples)
        return records

    def _validation_sums(self, reader, step: int) -> tuple[float, ...]:
        """(summed token loss, correct, masked, then the objective's ``validation_sums``: RTD's
        discriminator loss and counts) over the first ``--eval_batches`` global batches
        of ``reader`` (eval_batches x the global batch size of sequences, in index order), all
        ranks together: the same sequences and masks on any world size and at every evaluation.
        Each rank runs grad_accum micro-batches per global batch, as a training step does."""

        def loader(rank: int, world: int):
            return build_loader(
                reader,
                self.cfg.data_cfg,
                at_mask_prob(self.cfg.masking, self.cfg.log.eval_mask_prob),
                rank=rank,
                world_size=world,
                micro_batch_size=self.eval_plan.micro_batch,
                consumed_samples=0,
                train=False,
                attention=resolve_attention(self.cfg.model_cfg.attention, self.cfg.model_cfg.arch),
                sentence_order=self.objective.spec.sentence_order,
            )

        mine = loader(self.rank, self.world)
        block = (
            self.eval_plan.micro_batch * self.world
        )  # sequences of one micro-batch of every rank
        rounds = min(
            self.cfg.log.eval_batches * self.eval_plan.grad_accum, -(-len(reader) // block)
        )
        batches = _iterate(mine)
        # The split's last block may leave this rank fewer (or no) sequences than the others; it
        # still runs each forward (ZeRO-3 gathers weights collectively) on a stand-in batch whose
        # sums it leaves out, so every rank runs `rounds` forwards and no sequence is dropped.
        stand_in = None if len(mine.batch_sampler) else next(_iterate(loader(0, 1)))
        keys = ("mlm_loss", "num_correct", "num_masked", *self.objective.validation_sums)
        # normaliser 1: sums
        normalizers = {"mlm_normalizer": 1.0, **self.objective.normalizers(1.0)}
        totals = [0.0] * len(keys)
        self.engine.eval()
        # RTD's generator samples from a stream of the validation's own (the same at every
        # evaluation), never the training's: an exact resume needs that one untouched
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices), compiled.eager():
            torch.manual_seed(self.cfg.run.seed + self.rank)
            for _ in range(rounds):
                mb = next(batches, None)
                real, mb = mb is not None, stand_in if mb is None else mb
                stand_in = mb
                mb.pop("masking_stats", None)
                mb.pop("source", None)
                out = self.engine(**self._to_device(mb), **normalizers)
                if real:
                    totals = [t + float(out[k]) for t, k in zip(totals, keys)]
                if self.faults:  # a planned crash or preemption mid-validation
                    self.faults.signal_if_due("validation", step, self.rank)
        self.engine.train()
        return tuple(sum_across_ranks(totals, self.device))

    def save(self, step: int, consumed: int, reason: str) -> bool:
        """A checkpoint after ``step`` (all ranks), with the data position and the run's state.

        False when a final, signal or budget save failed (the run must stop with
        :data:`EXIT_SAVE_FAILED`); a failed periodic save warns and returns True.
        """
        state = {
            **self.outputs.base_state,
            "consumed_samples": consumed,
            "reason": reason,
            "elapsed_s": self.budget.elapsed_s(),
            **({"guard": self.guard.state_dict()} if self.guard else {}),
        }
        try:
            path = self.ckpts.save(self.engine, step, state)
        except CheckpointSaveError as e:
            if reason in PERIODIC_SAVES:
                self.metrics.warning(
                    f"{e}. Training continues and will retry at the next interval."
                )
                return True
            self.metrics.error(
                f"the {reason} save after step {step} failed: {e}. Free space "
                f"or fix the disk, then continue with --resume auto (exit status "
                f"{EXIT_SAVE_FAILED})."
            )
            return False
        self.metrics.print(f"checkpoint ({reason}) step {step}: {path}")
        if self.downstream:
            self.downstream.after_save(step)
        return True

    def _finish_downstream(self, timeout_s: float | None = None) -> None:
        if self.downstream and self.downstream.active:
            self.downstream.finish(timeout_s)
            self.ckpts.prune()  # what was kept for the jobs, beyond --keep_last
