"""``--arch bert`` for pretraining: transformers' BertModel (SDPA) + heads on masked rows only.

Parameter names are exactly those of `transformers.BertForPreTraining` (with NSP) or
`BertForMaskedLM` (MLM only: no pooler, no NSP head), so `model.state_dict()` loads into them with
strict checking. The MLM head gathers the masked rows first (as MosaicBERT does) and computes the
decoder matmul and softmax cross-entropy on them only, through `kernels.masked_lm_loss`. The
vocabulary is padded to a multiple of 8 for fast matmuls; the padding columns take no part in the
softmax, loss or argmax (the kernel receives `vocab_size=true_vocab_size`).

Cross-layer sharing (``ModelConfig.share_layers``, ALBERT-style): the layers of a group hold the
same ``nn.Parameter`` objects (:mod:`pretrain.model.sharing`, shared with the ModernBERT arch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from transformers.models.bert.modeling_bert import (
    BertModel,
    BertOnlyMLMHead,
    BertPreTrainedModel,
    BertPreTrainingHeads,
)

from bertforge.kernels import api as kernels
from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.pretrain.model.bert.arch import bert_config, resolve_config
from bertforge.pretrain.model.checkpointing import apply_activation_checkpointing
from bertforge.pretrain.model.document_attention import document_mask
from bertforge.pretrain.model.model_config import ModelConfig, export_config
from bertforge.pretrain.model.sharing import LayerSharingMixin, layer_groups
from bertforge.pretrain.model.specs import ObjectiveSpec

if TYPE_CHECKING:
    from transformers import BertConfig


class BertForPretrainingMasked(LayerSharingMixin, BertPreTrainedModel):
    """BERT with the MLM head on masked rows only and an optional NSP head (see module doc)."""

    arch = "bert"
    #: Keys a consolidated checkpoint may omit: tied to the word embeddings and the MLM bias.
    tied_keys = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")

    _tied_weights_keys: ClassVar[dict[str, str]] = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(
        self,
        config: BertConfig,
        true_vocab_size: int,
        nsp: bool,
        loss_impl: str = "auto",
        share_layers: str = "none",
    ):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=nsp)
        self.cls = BertPreTrainingHeads(config) if nsp else BertOnlyMLMHead(config)
        self.nsp = nsp
        self.true_vocab_size = int(true_vocab_size)
        self.loss_impl = loss_impl
        self.checkpointing = "none"
        self.post_init()
        self.share_layers_of(self.bert.encoder.layer, share_layers, "bert.encoder.layer.")

    def register_zero3_external_parameters(self) -> None:
        """Tell ZeRO-3 that forward() uses the decoder weight (tied to the word embeddings) and the
        MLM bias outside their modules' own forward, so it gathers them for the MLM loss.
        The trainer calls it before ``deepspeed.initialize``; harmless without ZeRO-3."""
        # Lazy: deepspeed takes seconds to import; the commands that import this module without
        # running a job (--help, the doctor) do without it.
        from deepspeed.runtime.zero.partition_parameters import register_external_parameter

        register_external_parameter(self, self.cls.predictions.decoder.weight)
        register_external_parameter(self, self.cls.predictions.bias)

    @property
    def bert_config(self) -> BertConfig:
        """The transformers config (vocab padded to a multiple of 8)."""
        return self.config

    @property
    def hf_architecture(self) -> str:
        """The transformers class whose state dict this model's matches."""
        return "BertForPreTraining" if self.nsp else "BertForMaskedLM"

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias

    def _encode(self, input_ids, attention_mask, token_type_ids, document_ids, position_ids):
        """BertModel's output; with document_ids, under the block-diagonal document mask."""
        if document_ids is not None:
            attention_mask = document_mask(document_ids)
        return self.bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            return_dict=True,
        )

    def encode(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        document_ids=None,
        position_ids=None,
    ) -> torch.Tensor:
        """The encoder's last hidden states [B, T, H] (document attention with document_ids)."""
        out = self._encode(input_ids, attention_mask, token_type_ids, document_ids, position_ids)
        return out.last_hidden_state

    def _masked_rows(
        self, sequence_output: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Transformed hidden states [N_m, H] and labels [N_m] of the predicted positions."""
        flat_labels = labels.reshape(-1)
        idx = (flat_labels != IGNORE_INDEX).nonzero().squeeze(1)
        rows = sequence_output.reshape(-1, sequence_output.shape[-1]).index_select(0, idx)
        return self.cls.predictions.transform(rows), flat_labels.index_select(0, idx)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        mlm_normalizer: torch.Tensor | float | None = None,
        nsp_normalizer: torch.Tensor | float | None = None,
        document_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        sequence_starts: torch.Tensor | None = None,
        sentence_order_label: torch.Tensor | None = None,
    ) -> dict:
        """Pretraining losses and counts.

        labels: [B, T] with IGNORE_INDEX where not predicted. mlm_normalizer: masked tokens of the
        whole global batch (the MLM loss is sum / mlm_normalizer; default: this batch's count).
        nsp_normalizer: sequences of the global batch (NSP loss is sum / nsp_normalizer; default
        this batch's size). document_ids, position_ids [B, T]: document attention (a token sees
        its own document only; :mod:`pretrain.model.document_attention`), which replaces
        attention_mask; sequence_starts [S]: the unpadded form's sequence starts in its one row
        (the NSP head reads each sequence's [CLS] there). sentence_order_label [B] (ALBERT's SOP,
        instead of next_sentence_label: 0 in order, 1 swapped, IGNORE_INDEX for a pair that is
        not consecutive) trains the same pair head; its loss is the mean over the labelled pairs.
        Returns {loss, mlm_loss, nsp_loss (None without NSP), num_masked, num_correct,
        nsp_correct, nsp_count}, with sop_* instead of nsp_* for SOP.
        """
        if labels is None:
            raise ValueError("labels are required: the model computes the MLM loss on masked rows")
        out = self._encode(input_ids, attention_mask, token_type_ids, document_ids, position_ids)
        if sequence_starts is not None and out.pooler_output is not None:
            cls_rows = out.last_hidden_state[0].index_select(0, sequence_starts)
            out.pooler_output = self.bert.pooler(cls_rows[:, None])
        hidden, row_labels = self._masked_rows(out.last_hidden_state, labels)
        mlm = kernels.masked_lm_loss_rows(
            hidden,
            self.cls.predictions.decoder.weight,
            self.cls.predictions.bias,
            row_labels,
            ignore_index=IGNORE_INDEX,
            vocab_size=self.true_vocab_size,
            normalizer=mlm_normalizer,
            impl=self.loss_impl,
        )
        result = {
            "loss": mlm.loss,
            "mlm_loss": mlm.loss,
            "nsp_loss": None,
            "num_masked": mlm.num_masked,
            "num_correct": mlm.num_correct,
        }
        zero = torch.zeros((), dtype=torch.int64, device=input_ids.device)
        result["nsp_correct"] = result["nsp_count"] = zero
        # the pair head's task: NSP, or SOP (whose non-consecutive pairs carry IGNORE_INDEX)
        task, label, normalizer = (
            ("nsp", next_sentence_label, nsp_normalizer)
            if next_sentence_label is not None
            else ("sop", sentence_order_label, None)
        )
        if self.nsp and label is not None:
            result.update(self._pair_task(task, out.pooler_output, label, normalizer))
            result["loss"] = mlm.loss + result[f"{task}_loss"]
        return result

    def _pair_task(
        self,
        task: str,
        pooled: torch.Tensor,
        label: torch.Tensor,
        normalizer: torch.Tensor | float | None,
    ) -> dict:
        """``task``'s loss (its sum over the labelled pairs / ``normalizer``, default their
        count, 0 with none), correct and labelled counts, as ``<task>_loss`` ... ."""
        logits = self.cls.seq_relationship(pooled).float()
        label = label.long()
        labelled = label != IGNORE_INDEX
        total = F.cross_entropy(logits, label, ignore_index=IGNORE_INDEX, reduction="sum")
        count = labelled.sum()
        return {
            f"{task}_loss": total / (normalizer if normalizer is not None else count.clamp(min=1)),
            f"{task}_correct": ((logits.argmax(-1) == label) & labelled).sum(),
            f"{task}_count": count,
        }

    @torch.no_grad()
    def predict_masked(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        labels: torch.Tensor,
        document_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """MLM logits [N_m, true_vocab_size] where labels != IGNORE_INDEX (row-major order)."""
        out = self._encode(input_ids, attention_mask, token_type_ids, document_ids, position_ids)
        hidden, _ = self._masked_rows(out.last_hidden_state, labels)
        v = self.true_vocab_size
        return F.linear(
            hidden, self.cls.predictions.decoder.weight[:v], self.cls.predictions.bias[:v]
        )

    def encoders(self) -> list[torch.nn.Module]:
        """The encoder stack (what ``--compile`` compiles): transformers' BertModel."""
        return [self.bert]

    def set_activation_checkpointing(self, mode: str) -> None:
        """Recompute encoder layers in backward (see :func:`apply_activation_checkpointing`)."""
        apply_activation_checkpointing(self, mode, shares_layers=self.shares_layers)

    def flops_per_token(self, seq_len: int, masked_fraction: float = 0.15) -> float:
        """Training FLOPs (forward + backward = 3x forward) per input token.

        Dense matmuls 2 FLOPs per weight per token (QKV, attention output, feed-forward), attention
        scores and weighted sum 4 * seq_len * hidden per layer, the MLM head (transform + decoder
        over the true vocabulary) on the masked fraction of tokens only, the NSP pooler and
        classifier once per sequence. Embedding lookups, LayerNorm, softmax are not counted.
        """
        c = self.config
        h, i, n_layers = c.hidden_size, c.intermediate_size, c.num_hidden_layers
        layer = 2 * (4 * h * h + 2 * h * i) + 4 * seq_len * h
        head = masked_fraction * 2 * (h * h + h * self.true_vocab_size)
        nsp = (2 * (h * h + 2 * h) / seq_len) if self.nsp else 0.0
        return 3.0 * (n_layers * layer + head + nsp)

    def hf_config(self, unpad_vocab: bool = False) -> BertConfig:
        """A transformers config for export (architectures set; vocab unpadded on request)."""
        return export_config(
            self.config, self.hf_architecture, self.true_vocab_size if unpad_vocab else None
        )

    def hf_state_dict(self, unpad_vocab: bool = False) -> dict[str, torch.Tensor]:
        """State dict with transformers' names (BertForPreTraining / BertForMaskedLM).

        unpad_vocab=True slices the padding rows off word_embeddings, decoder weight and bias so
        the tensors match `hf_config(unpad_vocab=True)` (vocab_size = the tokenizer's).
        """
        sd = {k: v.detach() for k, v in self.state_dict().items()}
        if unpad_vocab:
            v = self.true_vocab_size
            for k in (
                "bert.embeddings.word_embeddings.weight",
                "cls.predictions.decoder.weight",
                "cls.predictions.decoder.bias",
                "cls.predictions.bias",
            ):
                sd[k] = sd[k][:v]
        return sd


def build_bert(
    model_cfg: ModelConfig, vocab_size: int, objective: ObjectiveSpec, max_seq_len: int | None
) -> BertForPretrainingMasked:
    """The BERT pretraining model for a tokenizer of `vocab_size` entries (from the manifest),
    with the NSP head when the objective has one; max_seq_len (the shards'): checked against
    max_position_embeddings."""
    if vocab_size < 5:
        raise ValueError(f"vocab_size {vocab_size} is too small for a BERT tokenizer")
    cfg = resolve_config(model_cfg, vocab_size)
    if max_seq_len is not None and max_seq_len > cfg.max_position_embeddings:
        raise ValueError(
            f"the shards' max_seq_len {max_seq_len} exceeds BERT's learned position table "
            f"(--max_position_embeddings {cfg.max_position_embeddings}): rebuild the shards with "
            f"--max_seq_len {cfg.max_position_embeddings} or less, train from scratch with "
            f"--max_position_embeddings {max_seq_len}, or use --arch modernbert (rotary "
            "positions, no table: a checkpoint extends to any length)"
        )
    if cfg.loss_impl not in ("auto", "triton", "torch"):
        raise ValueError(f"loss_impl {cfg.loss_impl!r}: choose auto, triton or torch")
    conf = bert_config(cfg, vocab_size)
    layer_groups(cfg.share_layers, conf.num_hidden_layers)  # a bad spec fails before any allocation
    return BertForPretrainingMasked(
        conf, vocab_size, objective.pair_head, cfg.loss_impl, cfg.share_layers
    )
