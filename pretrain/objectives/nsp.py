"""Masked language modelling and next-sentence prediction, BERT 2018 (``--objective mlm+nsp``;
NSP shards): the NSP loss (a mean over the micro-batch's pairs) is added to the step's loss
unscaled, and its loss and accuracy are recorded beside the MLM's."""

from __future__ import annotations

from bertforge.pretrain.model.specs import MLM_NSP as SPEC
from bertforge.pretrain.objectives.base import MLM_LOSS, Objective, Panel


class NextSentence(Objective):
    """MLM + NSP (see the module doc)."""

    # the NSP loss (mean over micro-batches), correct and count
    step_sums = ("nsp_loss", "nsp_correct", "nsp_count")
    record_key = "nsp_loss"
    # the export: BERT's pooler trained by the NSP head, reloaded as BertForPreTraining
    trains_pooler = True
    export_auto_class = "AutoModelForPreTraining"

    def step_loss(self, out, sums, scale, accum, weights):
        if out.get("nsp_loss") is None:
            return None
        sums["nsp_loss"] += out["nsp_loss"].detach().double() / accum
        sums["nsp_correct"] += out["nsp_correct"].double()
        sums["nsp_count"] += out["nsp_count"].double()
        return out["nsp_loss"]

    def owns(self, sums: dict[str, float]) -> bool:
        return sums["nsp_count"] > 0

    def step_terms(self, sums, world, weights):
        loss = sums["nsp_loss"] / world
        return {"nsp_loss": loss, "nsp_accuracy": sums["nsp_correct"] / sums["nsp_count"]}, loss

    def loss_panels(self, loss_ylabel: str = MLM_LOSS) -> list[Panel]:
        return super().loss_panels("loss (nats: MLM per masked token + NSP per pair)")


OBJECTIVE = NextSentence(SPEC)
