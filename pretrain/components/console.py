"""What rank 0's console says of a step record (the progress line's fields) and of a validation
record (one line), from the records :mod:`.step_records` builds; what an objective shows is its
own (:mod:`pretrain.objectives`).

A masked-LM run shows ``loss``; a replaced-token-detection run its two networks apart, the
discriminator beside its prior (:mod:`pretrain.objectives` says why).
"""

from __future__ import annotations

from typing import Any

from bertforge.pretrain.objectives.registry import objective_of_record


def progress_fields(record: dict[str, Any], loss_scaling: bool = False) -> dict[str, Any]:
    """The fields of the training progress line (a tqdm bar's postfix, or a plain line): the
    objective's (:mod:`pretrain.objectives`), the lr and the rate; the loss scale only for a run
    that scales its loss (fp16): elsewhere it is always 1 and says nothing."""
    fields = objective_of_record(record).progress_fields(record)
    fields |= {"lr": record["lr"], "tok_s": round(record["tokens_per_s"])}
    if loss_scaling:
        fields["scale"] = record.get("loss_scale")
    return fields


def validation_line(record: dict[str, Any]) -> str:
    """The console line of a validation record (``source``: one source of a mixture)."""
    source = record.get("source")
    where = f" [{source}]" if source else ""
    scores = (
        f"loss {record['val_loss']:.4f} accuracy {record['val_accuracy']:.4f} "
        f"perplexity {record['val_perplexity']:.2f}"
    )
    objective = objective_of_record(record, prefix="val_")
    return objective.validation_line(record, f"validation step {record['step']}{where}", scores)
