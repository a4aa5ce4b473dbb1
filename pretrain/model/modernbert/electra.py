"""``--arch modernbert --objective rtd``: replaced-token detection on ModernBERT's block
(:mod:`pretrain.model.rtd` has the objective's shared parts).

transformers has no ELECTRA class for ModernBERT, so the discriminator takes the form of one it
has: ``ModernBertForTokenClassification`` with one label, whose head (``head``: dense, activation,
norm; ``classifier``: one logit) scores each token as replaced. An export is that class as it is:
``from_pretrained`` loads it, its logit is the replaced-token logit, and ``pretrain.evaluate``
fine-tunes its encoder. The discriminator runs through our attention paths, as the MLM model
does (document attention, sliding windows, the unpadded varlen path on a GPU).

The generator is our ModernBERT masked-LM model, narrower (``generator_width``), sharing the
discriminator's token table as ELECTRA's generator does through ``embedding_size``: its input
embedding is the shared table projected to its width (:class:`ProjectedEmbedding`), its head
projects back to the table's width, and its decoder is the table (tied) with a bias of its own.
``disentangled`` sharing gives the discriminator the table with the gradient stopped plus a
zero-initialised difference (DeBERTa-v3).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import ModernBertConfig
from transformers.models.modernbert.modeling_modernbert import (
    ModernBertForTokenClassification,
    ModernBertPreTrainedModel,
)

from bertforge.pretrain.model.model_config import ModelConfig, export_config
from bertforge.pretrain.model.modernbert.model import (
    ModernBertForPretrainingMasked,
    encoder_flops,
    modernbert_config,
)
from bertforge.pretrain.model.objective_config import ObjectiveConfig
from bertforge.pretrain.model.rtd import (
    DisentangledEmbedding,
    ReplacedTokenDetection,
    generator_config,
)

_TABLE = "model.embeddings.tok_embeddings.weight"


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


class ModernBertDiscriminator(ModernBertForTokenClassification):
    """ModernBertForTokenClassification (one label) through our attention paths."""

    encode = ModernBertForPretrainingMasked.encode
    _encode_layout = ModernBertForPretrainingMasked._encode_layout
    _runs_unpadded = ModernBertForPretrainingMasked._runs_unpadded
    _encode_unpadded = ModernBertForPretrainingMasked._encode_unpadded

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.attention_path = "auto"

    def real_logits(
        self, input_ids, attention_mask, document_ids=None, position_ids=None
    ) -> torch.Tensor:
        """The replaced-token logit of each real token [N_real], row-major."""
        if self._runs_unpadded(input_ids):
            hidden = self._encode_unpadded(input_ids, attention_mask, document_ids, position_ids)
            hidden = hidden[0][0]
        else:
            hidden = self.encode(input_ids, attention_mask, None, document_ids, position_ids)
            hidden = hidden[attention_mask.bool()]
        return self.classifier(self.drop(self.head(hidden))).squeeze(-1)


class ModernBertElectraForRtd(ReplacedTokenDetection, ModernBertPreTrainedModel):
    """The ModernBERT generator and discriminator trained together (see module doc)."""

    arch = "modernbert"
    hf_architecture = "ModernBertForTokenClassification"

    def __init__(
        self,
        disc_conf: ModernBertConfig,
        gen_conf: ModernBertConfig,
        true_vocab_size: int,
        settings: ObjectiveConfig,
        loss_impl: str = "auto",
    ):
        super().__init__(disc_conf)
        self.discriminator = ModernBertDiscriminator(disc_conf)
        self.generator = ModernBertForPretrainingMasked(gen_conf, true_vocab_size, loss_impl)
        self._set_objective(true_vocab_size, settings, loss_impl)
        self.post_init()
        # ELECTRA's embedding_size: the generator reads and predicts the discriminator's table
        table_width, gen = disc_conf.hidden_size, self.generator
        table = nn.Embedding(disc_conf.vocab_size, table_width, padding_idx=disc_conf.pad_token_id)
        table.weight = self.discriminator.model.embeddings.tok_embeddings.weight
        gen.model.embeddings.tok_embeddings = ProjectedEmbedding(table, gen_conf.hidden_size)
        gen.head.dense = nn.Linear(gen_conf.hidden_size, table_width, bias=False)
        gen.head.norm = nn.LayerNorm(table_width, eps=gen_conf.norm_eps, bias=False)
        decoder = nn.Linear(table_width, disc_conf.vocab_size, bias=True)
        decoder.weight, decoder.bias = table.weight, gen.decoder.bias
        gen.decoder = decoder
        self._init_weights(gen.model.embeddings.tok_embeddings.project)
        self._init_weights(gen.head.dense)
        if self.embedding_sharing == "disentangled":
            self.discriminator.model.embeddings.tok_embeddings = DisentangledEmbedding(table)
        else:
            self.discriminator.model.embeddings.tok_embeddings = table

    def _generator_rows(
        self, input_ids, attention_mask, token_type_ids, labels, document_ids, position_ids
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.generator._masked_rows(
            input_ids, attention_mask, labels, document_ids, position_ids
        )

    def _generator_decoder(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.generator.decoder.weight, self.generator.decoder.bias

    def _discriminator_logits(
        self, input_ids, attention_mask, token_type_ids, document_ids, position_ids
    ) -> torch.Tensor:
        return self.discriminator.real_logits(input_ids, attention_mask, document_ids, position_ids)

    def encode(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        document_ids=None,
        position_ids=None,
    ) -> torch.Tensor:
        """The discriminator's last hidden states [B, T, H] (the encoder a user fine-tunes)."""
        return self.discriminator.encode(
            input_ids, attention_mask, token_type_ids, document_ids, position_ids
        )

    def set_global_rope_theta(self, theta: float) -> None:
        """A phase's rope theta, for both networks' global layers."""
        ModernBertForPretrainingMasked.set_global_rope_theta(self.discriminator, theta)
        self.generator.set_global_rope_theta(theta)

    def global_rope_theta(self) -> float:
        return self.generator.global_rope_theta()

    def flops_per_token(self, seq_len: int, masked_fraction: float = 0.15) -> float:
        """Training FLOPs per input token (3x forward): both encoders' layers (ModernBERT's
        count), the discriminator's head on every token, the generator's projections (in: every
        token; out: the masked rows) and its decoder on the masked rows (the sampling's logits
        once more, forward only)."""
        e, v = self.config.hidden_size, self.true_vocab_size
        g = self.generator.config.hidden_size
        layers = encoder_flops(self.discriminator.config, seq_len)
        layers += encoder_flops(self.generator.config, seq_len)
        head = 2 * (e * e + e)  # dense and the one logit, every token
        project = 2 * e * g * (1 + masked_fraction)
        decoder = masked_fraction * 2 * (g * g + e * v)
        return 3.0 * (layers + head + project + decoder) + masked_fraction * 2 * e * v

    def hf_config(self, unpad_vocab: bool = False) -> ModernBertConfig:
        """The discriminator's config as ModernBertForTokenClassification (one label)."""
        conf = export_config(
            self.discriminator.config,
            self.hf_architecture,
            self.true_vocab_size if unpad_vocab else None,
        )
        conf.num_labels = 1
        conf.id2label, conf.label2id = {0: "replaced"}, {"replaced": 0}
        return conf

    def hf_state_dict(self, unpad_vocab: bool = False) -> dict[str, torch.Tensor]:
        """The discriminator's state dict with ModernBertForTokenClassification's names (the
        disentangled table as the discriminator uses it: shared + difference)."""
        emb = self.discriminator.model.embeddings.tok_embeddings
        sd = {
            k: t.detach()
            for k, t in self.discriminator.state_dict().items()
            if not k.startswith("model.embeddings.tok_embeddings.")
        }
        sd[_TABLE] = emb.weight.detach()
        if unpad_vocab:
            sd[_TABLE] = sd[_TABLE][: self.true_vocab_size]
        return sd


def build_modernbert_rtd(
    cfg: ModelConfig, vocab_size: int, settings: ObjectiveConfig, max_seq_len: int | None
) -> ModernBertElectraForRtd:
    """The pair for ModernBERT: the discriminator of ``cfg`` (one label), the generator of
    :func:`pretrain.model.rtd.generator_config`."""
    if max_seq_len is not None and max_seq_len > cfg.max_position_embeddings:
        raise ValueError(
            f"the shards' max_seq_len {max_seq_len} exceeds the model's "
            f"max_position_embeddings {cfg.max_position_embeddings}"
        )
    disc = modernbert_config(cfg, vocab_size)
    disc.num_labels = 1
    gen = modernbert_config(generator_config(cfg, settings), vocab_size)
    return ModernBertElectraForRtd(disc, gen, vocab_size, settings, cfg.loss_impl)
