"""The optimizer-step loop: step, record, evaluate when due, save when due.

:class:`Trainer` owns the loop and the two things it computes itself (a training step over one
global batch and a validation pass). Everything else decides for itself when it is due: the
:class:`~pretrain.checkpoint.CheckpointManager` (interval, minutes, signals, agreed across ranks),
the :class:`~pretrain.metrics.MetricsWriter` (what goes to the console, metrics.jsonl and
TensorBoard). Built by :func:`pretrain.main.train`.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist

from kernels import IGNORE_INDEX
from pretrain.budget import TimeBudget, TimeClockLR
from pretrain.checkpoint import CheckpointManager, PreemptionHandler
from pretrain.config import TrainConfig
from pretrain.data import build_loader
from pretrain.distributed import sum_across_ranks
from pretrain.downstream_jobs import DownstreamJobs
from pretrain.masking import merge_stats
from pretrain.metrics import MetricsWriter, StepTimer
from pretrain.optim import current_lr

EXIT_MIN_LOSS_SCALE = 4  # fp16 kept overflowing at the minimum loss scale

# Per-rank sums over one optimizer step, all-reduced together (one collective, no host sync per
# micro-batch): MLM loss (already normalised by the global masked count), correct predictions,
# and for NSP shards the NSP loss (mean over micro-batches), correct and count.
STEP_SUMS = ("mlm_loss", "mlm_correct", "nsp_loss", "nsp_correct", "nsp_count")


def fp16_gave_up(error: BaseException) -> bool:
    """True for DeepSpeed's exception when fp16 overflowed again at the minimum loss scale."""
    return "loss scale already at minimum" in str(error)


def fp16_give_up_message(loss_scale: float, step: int) -> str:
    """What to tell the user when fp16 gave up (see :func:`fp16_gave_up`)."""
    return (
        f"[pretrain] ERROR: fp16 gradients kept overflowing at the minimum loss scale "
        f"({loss_scale}) at step {step}; training stopped and nothing was saved after the last "
        "checkpoint. Lower the learning rate, use bf16, or raise min_loss_scale."
    )


def engine_record(engine, consumed: int, timer: StepTimer, budget: TimeBudget) -> dict[str, Any]:
    """The optimizer's side of a step record (lr, loss scale, grad norm, skipped steps) and where
    the run stands (samples consumed, training time over all launches)."""
    norm = engine.get_global_grad_norm()
    return {
        "lr": current_lr(engine.optimizer),
        "skipped": not engine.was_step_applied(),
        "skipped_total": int(engine.skipped_steps),
        "loss_scale": float(getattr(engine.optimizer, "cur_scale", 1.0)),
        "grad_norm": float(norm) if norm is not None else None,
        "data_wait_s": timer.data_wait,
        "consumed_samples": consumed,
        "elapsed_s": budget.elapsed_s(),
    }


def loss_record(sums: dict[str, float], n_masked: float, world: int) -> dict[str, Any]:
    """Loss and accuracy of a step from the all-reduced :data:`STEP_SUMS`."""
    rec = {
        "loss": sums["mlm_loss"],
        "mlm_loss": sums["mlm_loss"],
        "mlm_accuracy": sums["mlm_correct"] / max(n_masked, 1.0),
    }
    if sums["nsp_count"] > 0:
        rec["nsp_loss"] = sums["nsp_loss"] / world
        rec["nsp_accuracy"] = sums["nsp_correct"] / sums["nsp_count"]
        rec["loss"] += rec["nsp_loss"]
    return rec


def validation_record(step: int, loss_sum: float, correct: float, masked: float) -> dict:
    """A ``split: "validation"`` record from summed token loss, correct and masked counts."""
    if masked == 0:  # nothing was predicted (e.g. a source of [UNK]s): no score, not zero
        loss_sum = correct = float("nan")
    loss = loss_sum / max(masked, 1.0)
    return {
        "step": step,
        "split": "validation",
        "val_loss": loss,
        "val_accuracy": correct / max(masked, 1.0),
        "val_perplexity": math.exp(min(loss, 50.0)),
        "val_masked_tokens": masked,
    }


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
        engine,
        plan,
        loader,
        val_readers: list,
        device: torch.device,
        metrics: MetricsWriter,
        ckpts: CheckpointManager,
        *,
        base_state: dict[str, Any],
        rank: int,
        world: int,
        budget: TimeBudget | None = None,
        lr_clock: TimeClockLR | None = None,
        downstream: DownstreamJobs | None = None,
    ):
        self.cfg, self.engine, self.plan, self.device = cfg, engine, plan, device
        self.loader, self.val_readers = loader, val_readers  # [(source name, reader)]
        self.metrics, self.ckpts, self.base_state = metrics, ckpts, base_state
        self.rank, self.world = rank, world
        self.budget = budget or TimeBudget(cfg.run.max_time_hours)
        sources = getattr(loader.dataset.reader, "sources", None)  # a mixture's, in id order
        self.source_names = [src.name for src in sources] if sources else []
        self.lr_clock = lr_clock
        self.downstream = downstream

    def run(self, step: int, consumed: int) -> int:
        """Train from ``step`` to ``max_steps``; returns the exit status."""
        max_steps, eval_interval = self.cfg.run.max_steps, self.cfg.log.eval_interval
        preempt, timer, batches = PreemptionHandler(), StepTimer(), _iterate(self.loader)
        try:
            while step < max_steps:
                timer.restart()
                try:
                    rec = self.train_step(batches, timer)
                except Exception as e:  # DeepSpeed raises a bare Exception at the minimum scale
                    if not fp16_gave_up(e):
                        raise
                    scale = self.engine.optimizer.cur_scale
                    self.metrics.print(fp16_give_up_message(scale, step + 1))
                    return EXIT_MIN_LOSS_SCALE
                step, consumed = step + 1, consumed + self.plan.global_batch
                rec.update(engine_record(self.engine, consumed, timer, self.budget))
                self.metrics.step(rec, timer.elapsed(), self.engine.global_samples)
                if self.downstream:
                    self.downstream.poll()  # finished background evaluations into the metrics
                # Validation at an interval step; the end of training always validates below.
                if eval_interval and step % eval_interval == 0 and step < max_steps:
                    self.evaluate(step)
                reason = self.ckpts.save_due(step, preempt, self.budget)
                if reason == "budget":
                    self.metrics.print(
                        f"[pretrain] time budget of {self.cfg.run.max_time_hours} "
                        f"h used up after step {step}: final validation and save"
                    )
                    break
                if reason:
                    self.save(step, consumed, reason)
                if reason == "signal":
                    self.metrics.print(
                        f"[pretrain] stopped by a signal after step {step}; "
                        "continue with --resume auto"
                    )
                    self._finish_downstream(timeout_s=30.0)  # a preempted job cannot wait long
                    return 0
            self.evaluate(step)
            if self.cfg.checkpoint.save_final and self.ckpts.last_saved_step != step:
                self.save(step, consumed, "budget" if reason == "budget" else "final")
            self._finish_downstream()
            return 0
        finally:
            preempt.restore()

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self, batches, timer: StepTimer) -> dict[str, Any]:
        """Gradient accumulation over one global batch; returns the step's (global) numbers."""
        eng, accum = self.engine, self.plan.grad_accum
        if self.lr_clock is not None:  # a time-clock schedule: the lr of this step from the clock
            self.lr_clock.apply(eng.optimizer)
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
        for mb in micro:
            out = eng(**self._to_device(mb), mlm_normalizer=max(n_masked, 1.0))
            loss = out["mlm_loss"] * scale
            if out.get("nsp_loss") is not None:
                loss = loss + out["nsp_loss"]
                sums["nsp_loss"] += out["nsp_loss"].detach().double() / accum
                sums["nsp_correct"] += out["nsp_correct"].double()
                sums["nsp_count"] += out["nsp_count"].double()
            eng.backward(loss)
            eng.step()
            sums["mlm_loss"] += out["mlm_loss"].detach().double()
            sums["mlm_correct"] += out["num_correct"].double()
        stacked = torch.stack([sums[k] for k in STEP_SUMS])
        if self.world > 1:
            dist.all_reduce(stacked)
        rec = {
            "step": eng.global_steps,
            **loss_record(dict(zip(STEP_SUMS, stacked.tolist())), n_masked, self.world),
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
        return rec

    def evaluate(self, step: int) -> list[dict]:
        """MLM loss, accuracy and perplexity on each source's validation split (all ranks take
        part); with several sources, per-source records plus the overall one (no "source")."""
        sums = {name: self._validation_sums(reader) for name, reader in self.val_readers}
        records = []
        if len(sums) > 1:
            records = [{"source": name, **validation_record(step, *s)} for name, s in sums.items()]
        if sums:
            overall = [sum(s[k] for s in sums.values()) for k in range(3)]
            records.append(validation_record(step, *overall))
        for rec in records:
            rec["elapsed_s"] = self.budget.elapsed_s()  # plots compare runs by time as well
            self.metrics.eval(rec, self.engine.global_samples)
        return records

    def _validation_sums(self, reader) -> tuple[float, float, float]:
        """(summed token loss, correct, masked) over the first eval_batches of ``reader``,
        all ranks together (the masks are the same at every evaluation)."""
        loader = build_loader(
            reader,
            self.cfg.data_cfg,
            self.cfg.masking,
            rank=self.rank,
            world_size=self.world,
            micro_batch_size=self.plan.micro_batch,
            consumed_samples=0,
            train=False,
        )
        batches = _iterate(loader)
        loss_sum = correct = masked = 0.0
        self.engine.eval()
        with torch.no_grad():
            for _ in range(self.cfg.log.eval_batches):
                mb = next(batches, None)
                # ZeRO-3 gathers weights collectively: stop when any rank runs out of batches.
                if sum_across_ranks([0.0 if mb is not None else 1.0], self.device)[0] > 0:
                    break
                mb.pop("masking_stats", None)
                mb.pop("source", None)
                out = self.engine(**self._to_device(mb), mlm_normalizer=1.0)  # normaliser 1: sums
                loss_sum += float(out["mlm_loss"])
                correct += float(out["num_correct"])
                masked += float(out["num_masked"])
        self.engine.train()
        return tuple(sum_across_ranks([loss_sum, correct, masked], self.device))

    def save(self, step: int, consumed: int, reason: str) -> None:
        """A checkpoint after ``step`` (all ranks), with the data position and the run's state."""
        state = {
            **self.base_state,
            "consumed_samples": consumed,
            "reason": reason,
            "elapsed_s": self.budget.elapsed_s(),
        }
        path = self.ckpts.save(self.engine, step, state)
        self.metrics.print(f"checkpoint ({reason}) step {step}: {path}")
        if self.downstream:
            self.downstream.after_save(step)

    def _finish_downstream(self, timeout_s: float | None = None) -> None:
        if self.downstream:
            self.downstream.finish(timeout_s)
