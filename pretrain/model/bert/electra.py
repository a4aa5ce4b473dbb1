"""``--arch bert --objective rtd``: ELECTRA's generator and discriminator on transformers' own
Electra classes, the generator's head on masked rows only (:mod:`pretrain.model.rtd` has the
objective's shared parts).

The discriminator is a ``transformers.ElectraForPreTraining`` and the generator an
``ElectraForMaskedLM`` (narrower, ``embedding_size`` = the discriminator's width, projected to its
own), so export writes their state dicts as they are. Embeddings: ``plain`` sharing gives both
networks one embedding module (word, position, token type, LayerNorm), as ELECTRA does;
``disentangled`` gives the discriminator its own position, token-type and LayerNorm and token
embeddings that are the generator's, gradient stopped, plus a zero-initialised difference
(DeBERTa-v3). The generator's output layer is tied to the token embeddings in both.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining
from transformers.models.electra.modeling_electra import ElectraPreTrainedModel

from bertforge.pretrain.model.bert.adapter import ADAPTER
from bertforge.pretrain.model.bert.arch import ARCH_FIELDS, resolve_config
from bertforge.pretrain.model.document_attention import document_mask
from bertforge.pretrain.model.model_config import ModelConfig, export_config, padded_vocab
from bertforge.pretrain.model.objective_config import ObjectiveConfig
from bertforge.pretrain.model.rtd import (
    DisentangledEmbedding,
    ReplacedTokenDetection,
    generator_config,
    masked_positions,
)
from bertforge.pretrain.model.specs import StateDictAdapter

#: the discriminator's keys that hold vocabulary rows (sliced on export without padding)
_VOCAB_KEYS = ("electra.embeddings.word_embeddings.weight",)
_GEN_VOCAB_KEYS = (
    "electra.embeddings.word_embeddings.weight",
    "generator_lm_head.weight",
    "generator_lm_head.bias",
)


def electra_config(cfg: ModelConfig, vocab_size: int, embedding_size: int) -> ElectraConfig:
    """transformers.ElectraConfig for `cfg` (vocabulary padded to cfg.vocab_multiple)."""
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError(
            f"hidden_size {cfg.hidden_size} is not divisible by num_attention_heads "
            f"{cfg.num_attention_heads}"
        )
    arch = {k: getattr(cfg, k) for k in ARCH_FIELDS}
    conf = ElectraConfig(
        vocab_size=padded_vocab(vocab_size, cfg.vocab_multiple),
        embedding_size=embedding_size,
        **arch,
    )
    conf._attn_implementation = "sdpa"
    return conf


class BertElectraForRtd(ReplacedTokenDetection, ElectraPreTrainedModel):
    """The generator and the discriminator trained together (see module doc); the trainer's
    PretrainingModel with ``hf_architecture`` the discriminator's class."""

    arch = "bert"
    hf_architecture = "ElectraForPreTraining"

    def __init__(
        self,
        disc_conf: ElectraConfig,
        gen_conf: ElectraConfig,
        true_vocab_size: int,
        settings: ObjectiveConfig,
        loss_impl: str = "auto",
    ):
        super().__init__(disc_conf)
        self.discriminator = ElectraForPreTraining(disc_conf)
        self.generator = ElectraForMaskedLM(gen_conf)
        self._set_objective(true_vocab_size, settings, loss_impl)
        self.post_init()
        shared = self.generator.electra.embeddings
        if self.embedding_sharing == "plain":
            self.discriminator.electra.embeddings = shared
        else:
            emb = self.discriminator.electra.embeddings
            emb.word_embeddings = DisentangledEmbedding(shared.word_embeddings)
        self.generator.generator_lm_head.weight = shared.word_embeddings.weight
        self.generator_from = settings.generator_from  # --init_from: the generator's folder

    @property
    def init_adapter(self) -> StateDictAdapter:
        """What ``--init_from`` loads specially (pretrain.model.init_from): the token table
        (vocabulary rows; the generator's under disentangled sharing, the discriminator's
        otherwise), the generator's output bias, the names tied to others."""
        disc, gen = "discriminator.electra.embeddings", "generator.electra.embeddings"
        if self.embedding_sharing == "plain":
            table = f"{disc}.word_embeddings.weight"
            names = self.generator.electra.embeddings.state_dict()
            tied = {f"{gen}.{k}": f"{disc}.{k}" for k in names}
        else:
            table = f"{gen}.word_embeddings.weight"
            tied = {f"{disc}.word_embeddings.weight": table}
        tied["generator.generator_lm_head.weight"] = table
        return dataclasses.replace(
            ADAPTER,
            to_ours=lambda key: key,
            word_emb=table,
            mlm_bias="generator.generator_lm_head.bias",
            tied=tied,
            pos_emb=f"{disc}.position_embeddings.weight",
        )

    def _mask(self, attention_mask, document_ids):
        return document_mask(document_ids) if document_ids is not None else attention_mask

    def _generator_rows(
        self, input_ids, attention_mask, token_type_ids, labels, document_ids, position_ids
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The generator's transformed hidden states [N_m, E] and labels [N_m] of the masked
        positions."""
        gen = self.generator
        out = gen.electra(
            input_ids=input_ids,
            attention_mask=self._mask(attention_mask, document_ids),
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            return_dict=True,
        ).last_hidden_state
        idx = masked_positions(labels)
        rows = out.reshape(-1, out.shape[-1]).index_select(0, idx)
        return gen.generator_predictions(rows), labels.reshape(-1).index_select(0, idx)

    def _generator_decoder(self) -> tuple[torch.Tensor, torch.Tensor]:
        head = self.generator.generator_lm_head
        return head.weight, head.bias

    def _discriminator_logits(
        self, input_ids, attention_mask, token_type_ids, document_ids, position_ids
    ) -> torch.Tensor:
        """ElectraForPreTraining's logit of each real token [N_real] (row-major)."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids, document_ids, position_ids)
        logits = self.discriminator.discriminator_predictions(hidden)
        return logits[attention_mask.bool()]

    def encode(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        document_ids=None,
        position_ids=None,
    ) -> torch.Tensor:
        """The discriminator's last hidden states [B, T, H] (the encoder a user fine-tunes)."""
        return self.discriminator.electra(
            input_ids=input_ids,
            attention_mask=self._mask(attention_mask, document_ids),
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            return_dict=True,
        ).last_hidden_state

    def flops_per_token(self, seq_len: int, masked_fraction: float = 0.15) -> float:
        """Training FLOPs per input token (forward + backward = 3x forward): both encoders'
        matmuls and attention, the discriminator's head on every token, the generator's input
        projection on every token and its head (transform + decoder over the true vocabulary)
        on the masked fraction (the sampling's logits are counted once more, forward only)."""

        def layers(c) -> float:
            h, i = c.hidden_size, c.intermediate_size
            return c.num_hidden_layers * (2 * (4 * h * h + 2 * h * i) + 4 * seq_len * h)

        d, g = self.discriminator.config, self.generator.config
        e, v = g.embedding_size, self.true_vocab_size
        disc = layers(d) + 2 * (d.hidden_size * d.hidden_size + d.hidden_size)
        gen = layers(g) + (2 * e * g.hidden_size if e != g.hidden_size else 0)
        gen_head = masked_fraction * 2 * (g.hidden_size * e + e * v)
        return 3.0 * (disc + gen + gen_head) + masked_fraction * 2 * e * v

    def _vocab_slice(self, sd: dict, keys: tuple[str, ...]) -> dict:
        v = self.true_vocab_size
        return {k: (t[:v] if k in keys else t) for k, t in sd.items()}

    def hf_config(self, unpad_vocab: bool = False) -> ElectraConfig:
        """The discriminator's transformers config (ElectraForPreTraining)."""
        return export_config(
            self.discriminator.config,
            self.hf_architecture,
            self.true_vocab_size if unpad_vocab else None,
        )

    def hf_state_dict(self, unpad_vocab: bool = False) -> dict[str, torch.Tensor]:
        """The discriminator's state dict with ElectraForPreTraining's names (the
        disentangled token embeddings as the discriminator uses them: shared + difference)."""
        sd = {k: t.detach() for k, t in self.discriminator.state_dict().items()}
        word = "electra.embeddings.word_embeddings"
        if f"{word}.delta" in sd:
            del sd[f"{word}.delta"]
            sd[f"{word}.weight"] = self.discriminator.electra.embeddings.word_embeddings.weight
            sd[f"{word}.weight"] = sd[f"{word}.weight"].detach()
        return self._vocab_slice(sd, _VOCAB_KEYS) if unpad_vocab else sd

    def generator_hf(self, unpad_vocab: bool = True) -> tuple[ElectraConfig, dict]:
        """(config, state dict) of the generator as ElectraForMaskedLM."""
        conf = export_config(
            self.generator.config,
            "ElectraForMaskedLM",
            self.true_vocab_size if unpad_vocab else None,
        )
        sd = {k: t.detach() for k, t in self.generator.state_dict().items()}
        return conf, self._vocab_slice(sd, _GEN_VOCAB_KEYS) if unpad_vocab else sd


def build_bert_rtd(
    model_cfg: ModelConfig, vocab_size: int, settings: ObjectiveConfig, max_seq_len: int | None
) -> BertElectraForRtd:
    """The ELECTRA pair for BERT's architecture: the discriminator of ``model_cfg``, the
    generator of :func:`pretrain.model.rtd.generator_config`."""
    cfg = resolve_config(model_cfg, vocab_size)
    if max_seq_len is not None and max_seq_len > cfg.max_position_embeddings:
        raise ValueError(
            f"the shards' max_seq_len {max_seq_len} exceeds the position table "
            f"(--max_position_embeddings {cfg.max_position_embeddings})"
        )
    gen = generator_config(cfg, settings)
    return BertElectraForRtd(
        electra_config(cfg, vocab_size, cfg.hidden_size),
        electra_config(gen, vocab_size, cfg.hidden_size),
        vocab_size,
        settings,
        cfg.loss_impl,
    )
