"""``--arch modernbert``: transformers' ModernBERT block with our masked-rows-only MLM head.

The encoder, prediction head and decoder are transformers' own (``ModernBertModel``,
``ModernBertPredictionHead``, the tied decoder of ``ModernBertForMaskedLM``), configured as
``ModernBertConfig`` defines the architecture: rotary positions with a global and a local theta
(``rope_parameters``), GeGLU feed-forward, pre-norm with a final norm, no biases in the linear
and norm layers (the decoder keeps its bias, as in the released models), sliding-window attention
of ``local_attention`` tokens with a global layer every ``global_attn_every_n_layers`` layers.
The parameter names are those of ``ModernBertForMaskedLM``, so a state dict loads into it
strictly; the forward pass gathers the masked rows before the head and ends in
``kernels.masked_lm_loss_rows``, as the BERT arch does. The vocabulary is padded (to 64 in the
presets); the padding columns take no part in the softmax.

What only the BERT arch has is refused with :class:`ArchError` (exit status 2) before any
rendezvous: ``arch.unsupported`` lists it for the registry's ``check_supported``.

Replaced-token detection (``--objective rtd``, :mod:`pretrain.model.rtd`): the discriminator is
``ModernBertForTokenClassification`` with one label, the generator this masked-LM model reading
and predicting the discriminator's token table through projections
(:class:`ModernBertElectraForRtd`). Every network here runs its encoder the one way
:class:`ModernBertEncoding` writes (our attention paths, the unpadded path included).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import ModernBertConfig
from transformers.models.modernbert.modeling_modernbert import (
    ModernBertForMaskedLM,
    ModernBertForTokenClassification,
    ModernBertPreTrainedModel,
)

from bertforge.pretrain.model.attention_paths import (
    ATTN_IMPLEMENTATION,
    DocumentLayout,
    log_path_once,
    use_varlen,
)
from bertforge.pretrain.model.checkpointing import apply_activation_checkpointing
from bertforge.pretrain.model.document_attention import document_mask, unpad
from bertforge.pretrain.model.errors import ArchError
from bertforge.pretrain.model.masked_lm import EncoderSurface, MaskedLMSurface, mlm_outputs
from bertforge.pretrain.model.model_config import ModelConfig, export_config, padded_vocab
from bertforge.pretrain.model.modernbert.arch import VOCAB_KEYS, layer_types
from bertforge.pretrain.model.rtd import ReplacedTokenDetection
from bertforge.pretrain.model.sharing import LayerSharingMixin
from bertforge.pretrain.model.specs import ObjectiveSpec


def modernbert_config(cfg: ModelConfig, vocab_size: int) -> ModernBertConfig:
    """transformers.ModernBertConfig for `cfg`, the vocabulary padded to cfg.vocab_multiple.
    The special-token ids are set from the tokenizer on export (the adapter's
    ``set_tokenizer_ids``); training only needs a pad id inside the vocabulary (our tokenizers
    put [PAD] at 0)."""
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ArchError(
            f"hidden_size {cfg.hidden_size} is not divisible by num_attention_heads "
            f"{cfg.num_attention_heads}"
        )
    if cfg.local_attention < 2 or cfg.local_attention % 2:
        raise ArchError(f"--local_attention must be an even number >= 2, got {cfg.local_attention}")
    conf = ModernBertConfig(
        vocab_size=padded_vocab(vocab_size, cfg.vocab_multiple),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        hidden_activation=cfg.hidden_act,
        max_position_embeddings=cfg.max_position_embeddings,
        initializer_range=cfg.initializer_range,
        norm_eps=cfg.layer_norm_eps,
        norm_bias=False,
        attention_bias=False,
        mlp_bias=False,
        decoder_bias=True,
        attention_dropout=cfg.attention_probs_dropout_prob,
        embedding_dropout=cfg.hidden_dropout_prob,
        mlp_dropout=cfg.hidden_dropout_prob,
        layer_types=layer_types(cfg.num_hidden_layers, cfg.global_attn_every_n_layers),
        local_attention=cfg.local_attention,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": cfg.global_rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.local_rope_theta},
        },
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
        cls_token_id=None,
        sep_token_id=None,
        tie_word_embeddings=True,
    )
    # Our attention paths (pretrain.model.attention_paths); an export does not carry the name.
    conf._attn_implementation = ATTN_IMPLEMENTATION
    return conf


class ModernBertEncoding(EncoderSurface):
    """How every ModernBERT network here runs its encoder (``self.model``: transformers'
    ModernBertModel) through our attention paths (document attention, sliding windows, the
    unpadded varlen path), and its global layers' rotary base: the masked-LM model and
    replaced-token detection's discriminator and generator alike."""

    #: "auto" (unpadded varlen on CUDA in half precision, else padded), "padded" or "varlen".
    attention_path = "auto"

    def set_global_rope_theta(self, theta: float) -> None:
        """Re-base the global layers' rotary frequencies on ``theta`` (a phase plan's
        ``rope_theta``: ModernBERT's context extension raises it); the config follows, so an
        export and a later phase see it. The local layers keep their theta."""
        self.config.rope_parameters["full_attention"]["rope_theta"] = float(theta)
        rot = self.model.rotary_emb
        inv, _ = rot.compute_default_rope_parameters(self.config, layer_type="full_attention")
        with torch.no_grad():
            rot.full_attention_inv_freq.copy_(inv)
            rot.full_attention_original_inv_freq.copy_(inv)

    def global_rope_theta(self) -> float:
        return float(self.config.rope_parameters["full_attention"]["rope_theta"])

    def _hidden_states(
        self, input_ids, attention_mask, token_type_ids, document_ids, position_ids
    ) -> torch.Tensor:
        """The last hidden states [B, T, H], after the final norm (``encode``)."""
        if self.config._attn_implementation == ATTN_IMPLEMENTATION:
            if document_ids is None:  # full attention: one document per row, padding -1
                real = torch.ones_like(input_ids) if attention_mask is None else attention_mask
                document_ids = torch.where(real.bool(), 0, -1)
            return self._encode_layout(input_ids, DocumentLayout(document_ids), position_ids)
        if document_ids is not None:
            # transformers' own implementations (sdpa, eager) with prepared dense masks, one
            # per layer type: the local layers keep |q - k| <= sliding_window in the document.
            attention_mask = {
                "full_attention": document_mask(document_ids),
                "sliding_attention": document_mask(document_ids, self.config.sliding_window),
            }
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state

    def _encode_layout(self, input_ids, layout: DocumentLayout, position_ids) -> torch.Tensor:
        """Hidden states under our attention function (every layer type reads ``layout``)."""
        masks = {"full_attention": layout, "sliding_attention": layout}
        return self.model(
            input_ids=input_ids, attention_mask=masks, position_ids=position_ids
        ).last_hidden_state

    def _encode_unpadded(
        self, input_ids, attention_mask, document_ids, position_ids, **more
    ) -> tuple[torch.Tensor, dict]:
        """Hidden states [1, N_real, H] of the batch's real tokens in one row (each row's in
        turn) on the unpadded path, and the unpadded batch (``more`` tensors unpadded too)."""
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, **more}
        if document_ids is not None:
            batch["document_ids"] = document_ids
        if position_ids is not None:
            batch["position_ids"] = position_ids
        flat = unpad(batch)
        layout = DocumentLayout.unpadded(flat["document_ids"])
        return self._encode_layout(flat["input_ids"], layout, flat["position_ids"]), flat

    def _runs_unpadded(self, input_ids) -> bool:
        """Whether this forward takes the unpadded varlen path (``attention_path``; "auto":
        CUDA in half precision without attention dropout), logged once."""
        if self.config._attn_implementation != ATTN_IMPLEMENTATION:
            return False
        if self.attention_path not in ("auto", "padded", "varlen"):
            raise ValueError(f"attention_path {self.attention_path!r}: auto, padded or varlen")
        if self.attention_path != "auto":
            varlen, why = self.attention_path == "varlen", "chosen"
        else:
            dev = input_ids.device
            dtype = self.model.embeddings.tok_embeddings.weight.dtype
            if torch.is_autocast_enabled(dev.type):
                dtype = torch.get_autocast_dtype(dev.type)
            varlen, why = use_varlen(dev, dtype, self.config.attention_dropout)
        log_path_once(varlen, why)
        return varlen


class ModernBertForPretrainingMasked(
    ModernBertEncoding, MaskedLMSurface, LayerSharingMixin, ModernBertForMaskedLM
):
    """transformers' ModernBertForMaskedLM whose forward runs the head on masked rows only and
    ends in our fused loss; the same interface as the BERT arch's model (see module doc)."""

    arch = "modernbert"
    hf_architecture = "ModernBertForMaskedLM"
    nsp = False
    #: Keys a consolidated checkpoint may omit: the decoder weight is the embedding's.
    tied_keys = ("decoder.weight",)

    def __init__(
        self,
        config: ModernBertConfig,
        true_vocab_size: int,
        loss_impl: str = "auto",
        share_layers: str = "none",
    ):
        super().__init__(config)
        self.true_vocab_size = int(true_vocab_size)
        self.loss_impl = loss_impl
        self.checkpointing = "none"
        # --share_layers: a layer keeps its own attention type (global or sliding window) and
        # rotary base; only the weights are shared (layer 0 has no attn_norm: the group's
        # next layer holds the one the others share, pretrain.model.sharing).
        self.share_layers_of(self.model.layers, share_layers, "model.layers.")

    def _masked_hidden(
        self, input_ids, attention_mask, token_type_ids, labels, document_ids, position_ids
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """On the unpadded path the batch's real tokens in one row [1, N_real, H] and their
        labels (each row's in turn: the masked rows keep their row-major order)."""
        if not self._runs_unpadded(input_ids):
            return super()._masked_hidden(
                input_ids, attention_mask, token_type_ids, labels, document_ids, position_ids
            )
        if attention_mask is None:
            ones = torch.ones_like(input_ids)
            attention_mask = ones if document_ids is None else (document_ids >= 0).long()
        hidden, flat = self._encode_unpadded(
            input_ids, attention_mask, document_ids, position_ids, labels=labels
        )
        return hidden, flat["labels"]

    def _mlm_head(self, rows: torch.Tensor) -> torch.Tensor:
        return self.head(rows)

    def mlm_decoder(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.decoder.weight, self.decoder.bias

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # the loader's; ModernBERT has no segments
        labels: torch.Tensor | None = None,
        mlm_normalizer: torch.Tensor | float | None = None,
        document_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **_: object,
    ) -> dict:
        """Pretraining loss and counts, as BertForPretrainingMasked.forward returns them
        (nsp_loss None, NSP counts 0). mlm_normalizer: masked tokens of the global batch.
        document_ids, position_ids [B, T]: document attention (replaces attention_mask; rotary
        positions from position_ids; :mod:`pretrain.model.document_attention`)."""
        if labels is None:
            raise ValueError("labels are required: the model computes the MLM loss on masked rows")
        rows, row_labels = self.masked_rows(
            input_ids, attention_mask, token_type_ids, labels, document_ids, position_ids
        )
        return mlm_outputs(self.mlm_loss(rows, row_labels, mlm_normalizer), input_ids)

    def encoders(self) -> list[torch.nn.Module]:
        """The encoder stack (what ``--compile`` compiles): transformers' ModernBertModel."""
        return [self.model]

    def set_activation_checkpointing(self, mode: str) -> None:
        """Recompute encoder layers in backward: "none", "torch" or "deepspeed"."""
        apply_activation_checkpointing(self, mode, shares_layers=self.shares_layers)

    def flops_per_token(self, seq_len: int, masked_fraction: float = 0.15) -> float:
        """Training FLOPs (3x forward) per input token: Wqkv and Wo (4h^2), GeGLU (3hi), the
        attention scores and weighted sum over the tokens each layer sees (all of them in a
        global layer, at most the window in a local one), the head on the masked rows only."""
        h = self.config.hidden_size
        head = masked_fraction * 2 * (h * h + h * self.true_vocab_size)
        return 3.0 * (encoder_flops(self.config, seq_len) + head)

    def hf_config(self, unpad_vocab: bool = False) -> ModernBertConfig:
        """A transformers config for export (architectures set; vocab unpadded on request)."""
        return export_config(
            self.config, self.hf_architecture, self.true_vocab_size if unpad_vocab else None
        )

    def hf_state_dict(self, unpad_vocab: bool = False) -> dict[str, torch.Tensor]:
        """State dict with ModernBertForMaskedLM's names; unpad_vocab slices the padding rows."""
        sd = {k: v.detach() for k, v in self.state_dict().items()}
        if unpad_vocab:
            for k in VOCAB_KEYS:
                sd[k] = sd[k][: self.true_vocab_size]
        return sd


def encoder_flops(c: ModernBertConfig, seq_len: int) -> float:
    """Forward FLOPs per token of ModernBERT's layers: Wqkv and Wo (4h^2), GeGLU (3hi), the
    attention scores and weighted sum over the tokens each layer sees (all of them in a global
    layer, at most the window in a local one)."""
    h, i = c.hidden_size, c.intermediate_size
    dense = 2 * (4 * h * h + 3 * h * i)
    seen = {"full_attention": seq_len, "sliding_attention": min(seq_len, c.local_attention)}
    return c.num_hidden_layers * dense + sum(4 * seen[t] * h for t in c.layer_types)


class ProjectedEmbedding(nn.Module):
    """A token table [V, E] shared with the discriminator, projected to the generator's width."""

    def __init__(self, table: nn.Embedding, width: int):
        super().__init__()
        self.table = table
        self.project = nn.Linear(table.embedding_dim, width, bias=False)

    @property
    def weight(self) -> torch.Tensor:  # what ModernBERT reads its dtype from
        return self.table.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.project(self.table(input_ids))


class ModernBertDiscriminator(ModernBertEncoding, ModernBertForTokenClassification):
    """Replaced-token detection's discriminator: ModernBertForTokenClassification with one label
    (what export writes; its head scores each token as replaced) through our attention paths."""

    def real_logits(
        self, input_ids, attention_mask, token_type_ids=None, document_ids=None, position_ids=None
    ) -> torch.Tensor:
        """The replaced-token logit of each real token [N_real], row-major."""
        if self._runs_unpadded(input_ids):
            hidden = self._encode_unpadded(input_ids, attention_mask, document_ids, position_ids)
            hidden = hidden[0][0]
        else:
            hidden = self._hidden_states(
                input_ids, attention_mask, None, document_ids, position_ids
            )
            hidden = hidden[attention_mask.bool()]
        return self.classifier(self.drop(self.head(hidden))).squeeze(-1)


class ModernBertElectraForRtd(ReplacedTokenDetection, ModernBertPreTrainedModel):
    """``--arch modernbert --objective rtd`` (:class:`~pretrain.model.rtd.ReplacedTokenDetection`
    is the pair). transformers has no ELECTRA class for ModernBERT, so the discriminator takes
    the form of one it has, :class:`ModernBertDiscriminator`: an export is that class as it is
    (``from_pretrained`` loads it, its logit is the replaced-token logit, ``pretrain.evaluate``
    fine-tunes its encoder). The generator is the masked-LM model, narrower, reading and
    predicting the discriminator's token table as ELECTRA's does through ``embedding_size``
    (:meth:`_token_table`); no transformers class holds it, so export writes none."""

    arch = "modernbert"
    hf_architecture = "ModernBertForTokenClassification"
    discriminator_class = ModernBertDiscriminator
    generator_class = ModernBertForPretrainingMasked
    table_key = VOCAB_KEYS[0]
    encoder_flops = staticmethod(encoder_flops)

    @staticmethod
    def configs(
        cfg: ModelConfig, vocab_size: int, generator_cfg: ModelConfig
    ) -> tuple[ModernBertConfig, ModernBertConfig]:
        """The discriminator's config with one label ("replaced"), the generator's."""
        disc = modernbert_config(cfg, vocab_size)
        disc.num_labels = 1
        disc.id2label, disc.label2id = {0: "replaced"}, {"replaced": 0}
        return disc, modernbert_config(generator_cfg, vocab_size)

    def _token_table(self) -> nn.Embedding:
        """ELECTRA's ``embedding_size``, which ModernBERT's classes lack: the generator's input
        embedding is the discriminator's table projected to its width (:class:`ProjectedEmbedding`),
        its head projects back to the table's width, and its decoder is the table (tied) with a
        bias of its own."""
        disc, gen = self.discriminator.config, self.generator
        width, gen_conf = disc.hidden_size, gen.config
        table = nn.Embedding(disc.vocab_size, width, padding_idx=disc.pad_token_id)
        table.weight = self.discriminator.model.embeddings.tok_embeddings.weight
        gen.model.embeddings.tok_embeddings = ProjectedEmbedding(table, gen_conf.hidden_size)
        gen.head.dense = nn.Linear(gen_conf.hidden_size, width, bias=False)
        gen.head.norm = nn.LayerNorm(width, eps=gen_conf.norm_eps, bias=False)
        decoder = nn.Linear(width, disc.vocab_size, bias=True)
        decoder.weight, decoder.bias = table.weight, gen.decoder.bias
        gen.decoder = decoder
        self._init_weights(gen.model.embeddings.tok_embeddings.project)
        self._init_weights(gen.head.dense)
        return table

    def set_global_rope_theta(self, theta: float) -> None:
        """A phase's rope theta, for both networks' global layers."""
        self.discriminator.set_global_rope_theta(theta)
        self.generator.set_global_rope_theta(theta)

    def global_rope_theta(self) -> float:
        return self.generator.global_rope_theta()


def build_modernbert(
    cfg: ModelConfig, vocab_size: int, objective: ObjectiveSpec, max_seq_len: int | None
) -> ModernBertForPretrainingMasked | ModernBertElectraForRtd:
    """The ModernBERT pretraining model for a tokenizer of `vocab_size` entries, or the pair of
    replaced-token detection (what the arch does not support, ``arch.unsupported``, the
    registry's ``build_model`` refused already)."""
    if vocab_size < 5:
        raise ValueError(f"vocab_size {vocab_size} is too small for a tokenizer")
    if max_seq_len is not None and max_seq_len > cfg.max_position_embeddings:
        raise ValueError(
            f"the shards' max_seq_len {max_seq_len} exceeds the model's "
            f"max_position_embeddings {cfg.max_position_embeddings}"
        )
    if cfg.loss_impl not in ("auto", "triton", "torch"):
        raise ValueError(f"loss_impl {cfg.loss_impl!r}: choose auto, triton or torch")
    if objective.name == "rtd":
        return ModernBertElectraForRtd.build(cfg, vocab_size, objective.settings)
    return ModernBertForPretrainingMasked(
        modernbert_config(cfg, vocab_size), vocab_size, cfg.loss_impl, cfg.share_layers
    )
