"""Masked language modelling and next-sentence prediction, BERT 2018 (``--objective mlm+nsp``;
NSP shards): the NSP loss (a mean over the micro-batch's pairs) is added to the step's loss
unscaled, and its loss and accuracy are recorded beside the MLM's. :class:`PairTask` is what
any task of BERT's pair head (NSP, ALBERT's SOP) answers, under its own key prefix."""

from __future__ import annotations

from bertforge.pretrain.model.specs import MLM_NSP as SPEC
from bertforge.pretrain.objectives.base import MLM_LOSS, Objective, Panel


class PairTask(Objective):
    """MLM + a two-way task of BERT's pooler (see the module doc); its model outputs, step sums
    and record keys are ``<prefix>_loss``, ``<prefix>_correct`` and ``<prefix>_count``."""

    prefix = "nsp"
    #: the loss panel's axis label
    loss_label = "loss (nats: MLM per masked token + NSP per pair)"
    # the export: BERT's pooler trained by the pair head, reloaded as BertForPreTraining
    pooler_task = "next-sentence prediction"
    export_auto_class = "AutoModelForPreTraining"

    def __init__(self, spec) -> None:
        super().__init__(spec)
        p = self.prefix
        # the task's loss (mean over micro-batches), correct and count
        self.step_sums = (f"{p}_loss", f"{p}_correct", f"{p}_count")
        self.record_key = f"{p}_loss"

    def step_loss(self, out, sums, scale, accum, weights):
        loss, correct, count = self.step_sums
        if out.get(loss) is None:
            return None
        sums[loss] += out[loss].detach().double() / accum
        sums[correct] += out[correct].double()
        sums[count] += out[count].double()
        return out[loss]

    def owns(self, sums: dict[str, float]) -> bool:
        return sums[self.step_sums[2]] > 0

    def step_terms(self, sums, world, weights):
        loss_key, correct, count = self.step_sums
        loss = sums[loss_key] / world
        return {loss_key: loss, f"{self.prefix}_accuracy": sums[correct] / sums[count]}, loss

    def loss_panels(self, loss_ylabel: str = MLM_LOSS) -> list[Panel]:
        return super().loss_panels(self.loss_label)


OBJECTIVE = PairTask(SPEC)
