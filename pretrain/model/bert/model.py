"""``--arch bert`` for pretraining: transformers' BertModel (SDPA) + heads on masked rows only.

Parameter names are exactly those of `transformers.BertForPreTraining` (with NSP) or
`BertForMaskedLM` (MLM only: no pooler, no NSP head), so `model.state_dict()` loads into them with
strict checking. The MLM head gathers the masked rows first (as MosaicBERT does) and computes the
decoder matmul and softmax cross-entropy on them only, through `kernels.masked_lm_loss`. The
vocabulary is padded to a multiple of 8 for fast matmuls; the padding columns take no part in the
softmax, loss or argmax (the kernel receives `vocab_size=true_vocab_size`).

Cross-layer sharing (``ModelConfig.share_layers``, ALBERT-style): the layers of a group hold the
same ``nn.Parameter`` objects (:mod:`pretrain.model.sharing`, shared with the ModernBERT arch).

Replaced-token detection (``--objective rtd``, :mod:`pretrain.model.rtd`) trains BERT's encoder
as ELECTRA on transformers' own Electra classes, whose encoder is BERT's: the discriminator an
``ElectraForPreTraining``, the generator an ``ElectraForMaskedLM`` (narrower, ``embedding_size``
= the discriminator's width, projected to its own), so export writes their state dicts as they
are. ``plain`` sharing gives both networks one embedding module (word, position, token type,
LayerNorm), as ELECTRA does; ``disentangled`` gives the discriminator its own position,
token-type and LayerNorm. Every network here runs its encoder the one way :class:`BertEncoding`
writes (document attention included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from transformers import ElectraConfig
from transformers.models.bert.modeling_bert import (
    BertModel,
    BertOnlyMLMHead,
    BertPreTrainedModel,
    BertPreTrainingHeads,
)
from transformers.models.electra.modeling_electra import (
    ElectraForMaskedLM,
    ElectraForPreTraining,
    ElectraPreTrainedModel,
)

from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.pretrain.model.bert.adapter import pair_adapter
from bertforge.pretrain.model.bert.arch import bert_config, resolve_config
from bertforge.pretrain.model.checkpointing import apply_activation_checkpointing
from bertforge.pretrain.model.document_attention import document_mask
from bertforge.pretrain.model.masked_lm import EncoderSurface, MaskedLMSurface, mlm_outputs
from bertforge.pretrain.model.model_config import ModelConfig, export_config
from bertforge.pretrain.model.rtd import ReplacedTokenDetection
from bertforge.pretrain.model.sharing import LayerSharingMixin, layer_groups
from bertforge.pretrain.model.specs import ObjectiveSpec, StateDictAdapter

if TYPE_CHECKING:
    from transformers import BertConfig


class BertEncoding(EncoderSurface):
    """How every BERT network here runs its encoder (``base_model``: transformers' BertModel,
    or the ElectraModel of replaced-token detection's two networks)."""

    def _encode(self, input_ids, attention_mask, token_type_ids, document_ids, position_ids):
        """The encoder's output; with document_ids, under the block-diagonal document mask."""
        if document_ids is not None:
            attention_mask = document_mask(document_ids)
        return self.base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            return_dict=True,
        )

    def _hidden_states(self, *args) -> torch.Tensor:
        return self._encode(*args).last_hidden_state


def encoder_flops(c, seq_len: int) -> float:
    """Forward FLOPs per token of a BERT encoder's layers: dense matmuls 2 per weight (QKV,
    attention output, feed-forward), the attention scores and weighted sum 4 * seq_len * hidden."""
    h, i = c.hidden_size, c.intermediate_size
    return c.num_hidden_layers * (2 * (4 * h * h + 2 * h * i) + 4 * seq_len * h)


class BertForPretrainingMasked(
    BertEncoding, MaskedLMSurface, LayerSharingMixin, BertPreTrainedModel
):
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

    def _mlm_head(self, rows: torch.Tensor) -> torch.Tensor:
        return self.cls.predictions.transform(rows)

    def mlm_decoder(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cls.predictions.decoder.weight, self.cls.predictions.bias

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
        rows, row_labels = self._head_rows(out.last_hidden_state, labels)
        mlm = self.mlm_loss(rows, row_labels, mlm_normalizer)
        result = mlm_outputs(mlm, input_ids)
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
        h = self.config.hidden_size
        head = masked_fraction * 2 * (h * h + h * self.true_vocab_size)
        nsp = (2 * (h * h + 2 * h) / seq_len) if self.nsp else 0.0
        return 3.0 * (encoder_flops(self.config, seq_len) + head + nsp)

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


class BertDiscriminator(BertEncoding, ElectraForPreTraining):
    """Replaced-token detection's discriminator: transformers' ElectraForPreTraining (what
    export writes) through BERT's encoder surface."""

    def real_logits(
        self, input_ids, attention_mask, token_type_ids=None, document_ids=None, position_ids=None
    ) -> torch.Tensor:
        """ElectraForPreTraining's logit of each real token [N_real] (row-major)."""
        hidden = self._hidden_states(
            input_ids, attention_mask, token_type_ids, document_ids, position_ids
        )
        return self.discriminator_predictions(hidden)[attention_mask.bool()]


class BertGenerator(BertEncoding, MaskedLMSurface, ElectraForMaskedLM):
    """Replaced-token detection's generator: transformers' ElectraForMaskedLM (what export
    writes beside the discriminator) with its head on masked rows only."""

    def __init__(self, config: ElectraConfig, true_vocab_size: int, loss_impl: str = "auto"):
        super().__init__(config)
        self.true_vocab_size = int(true_vocab_size)
        self.loss_impl = loss_impl

    def _mlm_head(self, rows: torch.Tensor) -> torch.Tensor:
        return self.generator_predictions(rows)

    def mlm_decoder(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.generator_lm_head.weight, self.generator_lm_head.bias


class BertElectraForRtd(ReplacedTokenDetection, ElectraPreTrainedModel):
    """``--arch bert --objective rtd``: ELECTRA's pair over BERT's encoder (the module doc;
    :class:`~pretrain.model.rtd.ReplacedTokenDetection` is the pair)."""

    arch = "bert"
    hf_architecture = "ElectraForPreTraining"
    discriminator_class = BertDiscriminator
    generator_class = BertGenerator
    table_key = "electra.embeddings.word_embeddings.weight"
    generator_architecture = "ElectraForMaskedLM"
    generator_vocab_keys = (table_key, "generator_lm_head.weight", "generator_lm_head.bias")
    encoder_flops = staticmethod(encoder_flops)

    @staticmethod
    def configs(
        cfg: ModelConfig, vocab_size: int, generator_cfg: ModelConfig
    ) -> tuple[ElectraConfig, ElectraConfig]:
        """Both networks' ElectraConfig: the generator reads the discriminator's embeddings
        (``embedding_size`` = the discriminator's width)."""
        width = {"embedding_size": cfg.hidden_size}
        return (
            bert_config(cfg, vocab_size, ElectraConfig, **width),
            bert_config(generator_cfg, vocab_size, ElectraConfig, **width),
        )

    def _token_table(self) -> torch.nn.Embedding:
        return self.generator.get_input_embeddings()

    def _share_plainly(self, table: torch.nn.Embedding) -> None:
        """ELECTRA's plain sharing: one embedding module (word, position, token type,
        LayerNorm) for both networks."""
        self.discriminator.electra.embeddings = self.generator.electra.embeddings

    @property
    def projects_generator_input(self) -> bool:
        """ELECTRA projects the embeddings only where the generator is narrower."""
        conf = self.generator.config
        return conf.embedding_size != conf.hidden_size

    @property
    def init_adapter(self) -> StateDictAdapter:
        """What ``--init_from`` loads specially (``adapter.pair_adapter``: the pair's names)."""
        return pair_adapter(self.embedding_sharing, self.generator.electra.embeddings.state_dict())


def build_bert(
    model_cfg: ModelConfig, vocab_size: int, objective: ObjectiveSpec, max_seq_len: int | None
) -> BertForPretrainingMasked | BertElectraForRtd:
    """The BERT pretraining model for a tokenizer of `vocab_size` entries (from the manifest),
    with the NSP head when the objective has one, or ELECTRA's pair for replaced-token detection
    (:class:`BertElectraForRtd`); max_seq_len (the shards'): checked against
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
    if objective.name == "rtd":
        return BertElectraForRtd.build(cfg, vocab_size, objective.settings)
    conf = bert_config(cfg, vocab_size)
    layer_groups(cfg.share_layers, conf.num_hidden_layers)  # a bad spec fails before any allocation
    return BertForPretrainingMasked(
        conf, vocab_size, objective.pair_head, cfg.loss_impl, cfg.share_layers
    )
