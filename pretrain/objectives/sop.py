"""Masked language modelling and sentence-order prediction, ALBERT 2020 (``--objective
mlm+sop``; NSP shards): the loader swaps half of the consecutive pairs
(:mod:`pretrain.data.sentence_order`) and BERT's pair head tells in order from swapped; the SOP
loss (a mean over the micro-batch's labelled pairs: random-next pairs have no order and train
the masked LM only) is added unscaled, as NSP's is. The export is ``BertForPreTraining``: its
``seq_relationship`` head holds SOP's classifier (logit 0: in order, 1: swapped; transformers'
``sentence_order_label`` convention)."""

from __future__ import annotations

from bertforge.pretrain.model.specs import MLM_SOP as SPEC
from bertforge.pretrain.objectives.nsp import PairTask


class SentenceOrder(PairTask):
    """MLM + SOP (see the module doc)."""

    prefix = "sop"
    loss_label = "loss (nats: MLM per masked token + SOP per consecutive pair)"
    pooler_task = (
        "sentence-order prediction, ALBERT's SOP: seq_relationship logit 0 in order, 1 swapped"
    )


OBJECTIVE = SentenceOrder(SPEC)
