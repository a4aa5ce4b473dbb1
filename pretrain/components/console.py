"""What rank 0's console says of a step record (the progress line's fields) and of a validation
record (one line), from the records :mod:`.step_records` builds.

A masked-LM run shows ``loss``. A replaced-token-detection run (``--objective rtd``) shows its two
networks apart, since the step's ``loss`` (generator MLM + ``--rtd_weight`` x discriminator, 38
where the MLM loss is 7) says nothing about either: the generator's MLM loss, and the
discriminator's loss beside the prior's (the loss of a discriminator that predicts the replaced
share for every token: one at or above it has learned nothing about the tokens), its accuracy,
and its precision and recall of replaced tokens (recall 0 at the prior).
"""

from __future__ import annotations

from typing import Any


def progress_fields(record: dict[str, Any], loss_scaling: bool = False) -> dict[str, Any]:
    """The fields of the training progress line (a tqdm bar's postfix, or a plain line); the loss
    scale only for a run that scales its loss (fp16): elsewhere it is always 1 and says nothing."""
    if "rtd_loss" in record:
        fields = {
            "gen_mlm_loss": record["mlm_loss"],
            "disc_loss": record["rtd_loss"],
            "prior_loss": record["rtd_prior_loss"],
            "disc_acc": record["rtd_accuracy"],
            "disc_prec": record["rtd_precision"],
            "disc_rec": record["rtd_recall"],
        }
    else:
        fields = {"loss": record["loss"]}
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
    if "val_rtd_loss" not in record:
        return f"validation step {record['step']}{where}: {scores}"
    return (
        f"validation step {record['step']}{where}: generator MLM {scores}; discriminator loss "
        f"{record['val_rtd_loss']:.4f} (prior {record['val_rtd_prior_loss']:.4f}) accuracy "
        f"{record['val_rtd_accuracy']:.4f} precision {record['val_rtd_precision']:.4f} "
        f"recall {record['val_rtd_recall']:.4f}"
    )
