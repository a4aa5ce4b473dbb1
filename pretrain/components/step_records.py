"""What a training step and a validation pass write to metrics.jsonl, from the numbers the
trainer gathered: the per-rank sums all-reduced once per step (:data:`STEP_SUMS`), the
optimizer's side (:func:`engine_record`), the objective's losses and accuracies
(:func:`loss_record`) and a validation record (:func:`validation_record`)."""

from __future__ import annotations

import math
from typing import Any

from bertforge.pretrain.components.budget import TimeBudget
from bertforge.pretrain.components.metrics import StepTimer
from bertforge.pretrain.components.optim import current_lr
from bertforge.pretrain.model.rtd import RTD_COUNTS

# Per-rank sums over one optimizer step, all-reduced together (one collective, no host sync per
# micro-batch): MLM loss (already normalised by the global masked count), correct predictions,
# for NSP shards the NSP loss (mean over micro-batches), correct and count, and for replaced-token
# detection the discriminator's loss (normalised by the global real-token count) and its counts.
STEP_SUMS = (
    "mlm_loss",
    "mlm_correct",
    "nsp_loss",
    "nsp_correct",
    "nsp_count",
    "rtd_loss",
    *RTD_COUNTS,
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


def prior_loss(share: float) -> float:
    """The discriminator loss (binary cross-entropy, nats per token) of the prior: the constant
    prediction ``share`` (the replaced share) for every token, H(p) = -p ln p - (1-p) ln(1-p).
    A discriminator that learned nothing about the tokens sits there, its accuracy at
    1 - share and its recall of replaced tokens at 0."""
    if share <= 0.0 or share >= 1.0:
        return 0.0
    return -(share * math.log(share) + (1.0 - share) * math.log1p(-share))


def rtd_scores(loss: float, *counts: float, prefix: str = "rtd_") -> dict[str, float]:
    """The discriminator's scores from its ``loss`` (normalised already) and its summed
    ``counts`` in :data:`RTD_COUNTS`' order (correct, real tokens, replaced, true positives,
    predicted replaced): loss, the prior's loss, accuracy, precision and recall of replaced
    tokens, and the replaced share; keys start with ``prefix``."""
    correct, tokens, replaced, true_positive, predicted = counts
    tokens = max(tokens, 1.0)
    share = replaced / tokens
    return {
        f"{prefix}loss": loss,
        f"{prefix}prior_loss": prior_loss(share),
        f"{prefix}accuracy": correct / tokens,
        f"{prefix}precision": true_positive / max(predicted, 1.0),
        f"{prefix}recall": true_positive / max(replaced, 1.0),
        f"{prefix}replaced_share": share,
    }


def loss_record(
    sums: dict[str, float], n_masked: float, world: int, rtd_weight: float = 0.0
) -> dict[str, Any]:
    """Loss and accuracy of a step from the all-reduced :data:`STEP_SUMS` (``loss`` is what the
    step minimised: MLM, + NSP, + rtd_weight x the discriminator's loss)."""
    rec = {
        "loss": sums["mlm_loss"],
        "mlm_loss": sums["mlm_loss"],
        "mlm_accuracy": sums["mlm_correct"] / max(n_masked, 1.0),
    }
    if sums["nsp_count"] > 0:
        rec["nsp_loss"] = sums["nsp_loss"] / world
        rec["nsp_accuracy"] = sums["nsp_correct"] / sums["nsp_count"]
        rec["loss"] += rec["nsp_loss"]
    if sums["rtd_tokens"] > 0:
        rec.update(rtd_scores(sums["rtd_loss"], *(sums[k] for k in RTD_COUNTS)))
        rec["loss"] += rtd_weight * rec["rtd_loss"]
    return rec


def validation_record(
    step: int, loss_sum: float, correct: float, masked: float, *rtd: float
) -> dict:
    """A ``split: "validation"`` record from summed token loss, correct and masked counts (for
    RTD, the generator's), and for RTD the discriminator's summed loss and its
    :data:`~pretrain.model.rtd.RTD_COUNTS` (correct, real tokens, replaced, true positives,
    predicted replaced)."""
    if masked == 0:  # nothing was predicted (e.g. a source of [UNK]s): no score, not zero
        loss_sum = correct = float("nan")
    loss = loss_sum / max(masked, 1.0)
    rec = {
        "step": step,
        "split": "validation",
        "val_loss": loss,
        "val_accuracy": correct / max(masked, 1.0),
        "val_perplexity": math.exp(min(loss, 50.0)),
        "val_masked_tokens": masked,
    }
    if rtd:
        rtd_loss, *counts = rtd
        tokens = counts[RTD_COUNTS.index("rtd_tokens")]
        rec.update(rtd_scores(rtd_loss / max(tokens, 1.0), *counts, prefix="val_rtd_"))
    return rec
