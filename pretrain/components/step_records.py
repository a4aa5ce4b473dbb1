"""What a training step and a validation pass write to metrics.jsonl, from the numbers the
trainer gathered: the per-rank sums all-reduced once per step (:data:`STEP_SUMS`), the
optimizer's side (:func:`engine_record`), the objective's losses and accuracies
(:func:`loss_record`) and a validation record (:func:`validation_record`); what each objective
adds to them is its own (:mod:`pretrain.objectives`)."""

from __future__ import annotations

import math
from typing import Any

from bertforge.pretrain.components.metrics import StepTimer
from bertforge.pretrain.objectives.registry import OBJECTIVES, step_sums, validation_objective
from bertforge.pretrain.schedule.budget import TimeBudget
from bertforge.pretrain.schedule.optim import current_lr

# Per-rank sums over one optimizer step, all-reduced together (one collective, no host sync per
# micro-batch): MLM loss (already normalised by the global masked count), correct predictions,
# and each objective's own (pretrain.objectives: NSP's loss, correct and count; replaced-token
# detection's discriminator loss and counts).
STEP_SUMS = step_sums()


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


def loss_record(
    sums: dict[str, float], n_masked: float, world: int, **weights: float
) -> dict[str, Any]:
    """Loss and accuracy of a step from the all-reduced :data:`STEP_SUMS` (``loss`` is what the
    step minimised: MLM, plus each objective's terms whose sums the step holds, at ``weights``:
    the objective's ``loss_weights``)."""
    rec = {
        "loss": sums["mlm_loss"],
        "mlm_loss": sums["mlm_loss"],
        "mlm_accuracy": sums["mlm_correct"] / max(n_masked, 1.0),
    }
    for objective in OBJECTIVES.values():
        if objective.owns(sums):
            terms, loss = objective.step_terms(sums, world, weights)
            rec.update(terms)
            rec["loss"] += loss
    return rec


def validation_record(
    step: int, loss_sum: float, correct: float, masked: float, *extra: float
) -> dict:
    """A ``split: "validation"`` record from summed token loss, correct and masked counts (for
    replaced-token detection, the generator's), and the objective's own summed
    ``validation_sums`` (the discriminator's loss and counts)."""
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
    rec.update(validation_objective(extra).validation_scores(extra))
    return rec
