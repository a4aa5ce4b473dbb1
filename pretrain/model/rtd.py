"""Replaced-token detection (ELECTRA), written once over any architecture's networks.

A small generator (a masked-LM network of the same architecture) predicts the masked positions;
a token is sampled from its softmax at temperature 1 for each of them, with no gradient through
the sample; the discriminator (the encoder we export) reads the corrupted sequence and predicts,
for every real token, whether it was replaced. A sample equal to the original token counts as
original. Loss = generator MLM loss + lambda x discriminator binary cross-entropy (Clark et al.
2020; ../shared/notes/rtd.md has what the open implementations do).

Here: the generator's size from the encoder's (:func:`generator_config`), the sampling
(:func:`sample_replacements`), the corruption (:func:`corrupt`), the discriminator's loss and the
counts its metrics need (:func:`discriminator_loss`), DeBERTa-v3's gradient-disentangled
embedding (:class:`DisentangledEmbedding`), and the pair itself (:class:`ReplacedTokenDetection`):
the two networks built, their token table shared, the forward, the FLOPs, and what export writes
of both. An arch's ``model.py`` names only what is its own (:class:`ReplacedTokenDetection` lists
it): which transformers classes and configs the networks are, how its generator reads the shared
table, and the export's names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.pretrain.model.checkpointing import apply_activation_checkpointing
from bertforge.pretrain.model.masked_lm import (
    MaskedLMSurface,
    masked_positions,
    mlm_outputs,
)
from bertforge.pretrain.model.model_config import ModelConfig, export_config
from bertforge.pretrain.model.objective_config import ObjectiveConfig

#: The output keys an RTD model adds to the MLM ones (all summed over the global batch's tokens,
#: the loss divided by its real-token count).
RTD_COUNTS = ("rtd_correct", "rtd_tokens", "rtd_replaced", "rtd_true_positive", "rtd_predicted")


def generator_config(cfg: ModelConfig, settings: ObjectiveConfig) -> ModelConfig:
    """The generator's architecture: the encoder's, ``generator_width`` as wide (whole heads of
    the encoder's head size, at least one) and ``generator_depth`` as deep (at least 1 layer),
    without cross-layer sharing. ELECTRA keeps the head size and scales the head count."""
    head = cfg.hidden_size // cfg.num_attention_heads
    heads = max(1, round(cfg.num_attention_heads * settings.generator_width))
    width = heads * head / cfg.hidden_size  # the realised fraction, applied to the FFN too
    return dataclasses.replace(
        cfg,
        name=f"{cfg.name}-generator",
        hidden_size=heads * head,
        num_attention_heads=heads,
        intermediate_size=max(1, round(cfg.intermediate_size * width)),
        num_hidden_layers=max(1, round(cfg.num_hidden_layers * settings.generator_depth)),
        share_layers="none",
    )


@torch.no_grad()
def sample_replacements(logits: torch.Tensor) -> torch.Tensor:
    """One token per row [N] sampled from softmax(logits [N, V]) at temperature 1 (float32)."""
    if logits.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=logits.device)
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, 1).squeeze(1)


def corrupt(
    input_ids: torch.Tensor, labels: torch.Tensor, sampled: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(corrupted ids [B, T], replaced [B, T] bool): the masked positions hold the samples; a
    position is replaced where its sample differs from the original token (``labels``)."""
    idx = masked_positions(labels)
    ids = input_ids.reshape(-1).clone()
    ids[idx] = sampled.to(ids.dtype)
    replaced = torch.zeros_like(ids, dtype=torch.bool)
    replaced[idx] = sampled.to(labels.dtype) != labels.reshape(-1).index_select(0, idx)
    return ids.view_as(input_ids), replaced.view_as(input_ids)


def discriminator_loss(
    logits: torch.Tensor, replaced: torch.Tensor, normalizer: torch.Tensor | float | None = None
) -> dict[str, torch.Tensor]:
    """Binary cross-entropy of the real tokens' ``logits`` [N] against ``replaced`` [N] (bool),
    summed and divided by ``normalizer`` (the global batch's real tokens; default N), and the
    counts of :data:`RTD_COUNTS`."""
    z = logits.float()
    total = F.binary_cross_entropy_with_logits(z, replaced.float(), reduction="sum")
    denom = normalizer if normalizer is not None else max(len(z), 1)
    predicted = z > 0
    return {
        "rtd_loss": total / denom,
        "rtd_correct": (predicted == replaced).sum(),
        "rtd_tokens": torch.tensor(len(z), device=z.device),
        "rtd_replaced": replaced.sum(),
        "rtd_true_positive": (predicted & replaced).sum(),
        "rtd_predicted": predicted.sum(),
    }


class ReplacedTokenDetection(MaskedLMSurface):
    """The generator and the discriminator trained together: the trainer's PretrainingModel,
    whose ``hf_architecture`` is the discriminator's class. Each arch's pair is this class
    before its transformers ``PreTrainedModel`` family (weight init, checkpointing), naming
    what is its own:

    - ``discriminator_class(config)``: the discriminator, the transformers class export writes
      (``hf_architecture``) with the arch's encode surface and ``real_logits(input_ids,
      attention_mask, token_type_ids, document_ids, position_ids)``: the replaced-token logit
      of each real token [N_real], row-major;
    - ``generator_class(config, true_vocab_size, loss_impl)``: the arch's masked-LM network
      (:class:`~pretrain.model.masked_lm.MaskedLMSurface`);
    - ``configs(cfg, vocab_size, generator_cfg)``: the two networks' transformers configs;
    - ``_token_table()``: once both are built, the token table they share (an ``nn.Embedding``
      as wide as the discriminator), the generator wired to read it; ``_share_plainly(table)``
      where plain sharing shares more than the table;
    - ``encoder_flops(config, seq_len)`` and ``projects_generator_input``: the FLOPs count;
    - ``table_key``: the discriminator's token table in the export's names; a transformers class
      that holds the generator (``generator_architecture``, with ``generator_vocab_keys``) where
      there is one.

    The state dict is the two networks' under ``discriminator.`` and ``generator.``; the
    generator's output layer is tied to the shared table, and ``disentangled`` sharing gives the
    discriminator that table with the gradient stopped plus a zero-initialised difference
    (:class:`DisentangledEmbedding`)."""

    objective = "rtd"  # export writes the discriminator (and a generator it can write)
    nsp = False
    share_layers = "none"  # --share_layers is refused with rtd (the specs' unsupported)
    shares_layers = False
    shared_keys = ()
    discriminator_class: type
    generator_class: type
    table_key: str
    #: the transformers class export writes the generator as (None: no class holds it)
    generator_architecture: str | None = None
    generator_vocab_keys: tuple[str, ...] = ()  # the generator's keys that hold vocabulary rows

    def __init__(
        self,
        disc_conf: Any,
        gen_conf: Any,
        true_vocab_size: int,
        settings: ObjectiveConfig,
        loss_impl: str = "auto",
    ):
        super().__init__(disc_conf)
        self.discriminator = self.discriminator_class(disc_conf)
        self.generator = self.generator_class(gen_conf, true_vocab_size, loss_impl)
        self.true_vocab_size = int(true_vocab_size)
        self.rtd_weight = float(settings.rtd_weight)
        self.embedding_sharing = settings.embedding_sharing
        self.generator_from = settings.generator_from  # --init_from: the generator's folder
        self.loss_impl = loss_impl
        self.checkpointing = "none"
        self.post_init()
        table = self._token_table()
        if self.embedding_sharing == "disentangled":
            self.discriminator.set_input_embeddings(DisentangledEmbedding(table))
        else:
            self._share_plainly(table)
        self.generator.get_output_embeddings().weight = table.weight

    @classmethod
    def build(cls, cfg: ModelConfig, vocab_size: int, settings: ObjectiveConfig):
        """The pair for ``cfg`` (the discriminator's architecture) and a tokenizer of
        ``vocab_size`` entries, the generator of :func:`generator_config`."""
        disc, gen = cls.configs(cfg, vocab_size, generator_config(cfg, settings))
        return cls(disc, gen, vocab_size, settings, cfg.loss_impl)

    def _share_plainly(self, table: nn.Embedding) -> None:
        """Plain sharing: the discriminator reads the table itself (an arch may share more)."""
        self.discriminator.set_input_embeddings(table)

    def _hidden_states(self, *args) -> torch.Tensor:  # encode: the encoder a user fine-tunes
        return self.discriminator.encode(*args)

    def masked_rows(self, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """The generator's head outputs and labels of the masked positions."""
        return self.generator.masked_rows(*args, **kwargs)

    def mlm_decoder(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The generator's output layer (tied to the shared table) and its bias."""
        return self.generator.mlm_decoder()

    def encoders(self) -> list[torch.nn.Module]:
        """Both encoder stacks (what ``--compile`` compiles): the discriminator's and the
        generator's transformers base models."""
        return [self.discriminator.base_model, self.generator.base_model]

    def set_activation_checkpointing(self, mode: str) -> None:
        """Recompute both networks' layers in backward."""
        apply_activation_checkpointing(self, mode)

    @property
    def tied_keys(self) -> tuple[str, ...]:
        """Keys a consolidated checkpoint may omit: every later name of a tensor the two
        networks share (the token table, the generator's tied output layer)."""
        seen, later = set(), []
        for name, param in self.named_parameters(remove_duplicate=False):
            (later.append(name) if id(param) in seen else seen.add(id(param)))
        return tuple(later)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        mlm_normalizer: torch.Tensor | float | None = None,
        token_normalizer: torch.Tensor | float | None = None,
        document_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **_: object,
    ) -> dict:
        """The generator's MLM loss (sum / mlm_normalizer, the global masked count), the
        discriminator's (sum / token_normalizer, the global real-token count), ``loss`` = MLM +
        rtd_weight x RTD, and the counts of both (:data:`RTD_COUNTS`)."""
        if labels is None:
            raise ValueError("labels are required: the generator predicts the masked positions")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        where = {"document_ids": document_ids, "position_ids": position_ids}
        rows, row_labels = self.masked_rows(
            input_ids, attention_mask, token_type_ids, labels, **where
        )
        mlm = self.mlm_loss(rows, row_labels, mlm_normalizer)
        with torch.no_grad():  # no gradient through the sample (ELECTRA)
            sampled = sample_replacements(self.masked_logits(rows))
        corrupted, replaced = corrupt(input_ids, labels, sampled)
        logits = self.discriminator.real_logits(corrupted, attention_mask, token_type_ids, **where)
        rtd = discriminator_loss(logits, replaced[attention_mask.bool()], token_normalizer)
        loss = mlm.loss + self.rtd_weight * rtd["rtd_loss"]
        return {**mlm_outputs(mlm, input_ids), "loss": loss, **rtd}

    @torch.no_grad()
    def predict_masked(self, input_ids, attention_mask, *args, **kwargs) -> torch.Tensor:
        """The generator's MLM logits [N_m, true_vocab_size] where labels != IGNORE_INDEX."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return super().predict_masked(input_ids, attention_mask, *args, **kwargs)

    @torch.no_grad()
    def discriminator_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The discriminator's replaced-token logits [B, T] (0 at padding)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        real = self.discriminator.real_logits(input_ids, attention_mask, token_type_ids)
        out = torch.zeros(input_ids.shape, dtype=real.dtype, device=real.device)
        out[attention_mask.bool()] = real
        return out

    @property
    def projects_generator_input(self) -> bool:
        """Whether the generator projects the shared table to its own width on every token."""
        return True

    def flops_per_token(self, seq_len: int, masked_fraction: float = 0.15) -> float:
        """Training FLOPs per input token (forward + backward = 3x forward): both encoders'
        layers (the arch's count, ``encoder_flops``), the discriminator's head on every token
        (dense and one logit), the generator's projection from the table's width to its own on
        every token (where it has one) and back on the masked rows, and its decoder over the
        true vocabulary on the masked rows (the sampling's logits once more, forward only)."""
        d, g = self.discriminator.config, self.generator.config
        e, h, v, m = d.hidden_size, g.hidden_size, self.true_vocab_size, masked_fraction
        disc = self.encoder_flops(d, seq_len) + 2 * (e * e + e)
        gen = self.encoder_flops(g, seq_len) + (2 * e * h if self.projects_generator_input else 0)
        gen_head = m * 2 * (h * e + e * v)  # back to the table's width, then the decoder
        return 3.0 * (disc + gen + gen_head) + m * 2 * e * v

    def _vocab_slice(self, sd: dict, keys: tuple[str, ...]) -> dict:
        v = self.true_vocab_size
        return {k: (t[:v] if k in keys else t) for k, t in sd.items()}

    def hf_config(self, unpad_vocab: bool = False):
        """The discriminator's transformers config (``hf_architecture``)."""
        v = self.true_vocab_size if unpad_vocab else None
        return export_config(self.discriminator.config, self.hf_architecture, v)

    def hf_state_dict(self, unpad_vocab: bool = False) -> dict[str, torch.Tensor]:
        """The discriminator's state dict with its export class's names, its token table as it
        uses it (disentangled: the shared table + the difference) under ``table_key``."""
        module = self.table_key.rsplit(".", 1)[0] + "."
        sd = {
            k: t.detach()
            for k, t in self.discriminator.state_dict().items()
            if not k.startswith(module)
        }
        sd[self.table_key] = self.discriminator.get_input_embeddings().weight.detach()
        return self._vocab_slice(sd, (self.table_key,)) if unpad_vocab else sd

    def generator_hf(self, unpad_vocab: bool = True) -> tuple[Any, dict] | None:
        """(config, state dict) of the generator as ``generator_architecture``, or None where
        no transformers class holds this arch's generator."""
        if self.generator_architecture is None:
            return None
        v = self.true_vocab_size if unpad_vocab else None
        conf = export_config(self.generator.config, self.generator_architecture, v)
        sd = {k: t.detach() for k, t in self.generator.state_dict().items()}
        return conf, self._vocab_slice(sd, self.generator_vocab_keys) if unpad_vocab else sd


class DisentangledEmbedding(nn.Module):
    """DeBERTa-v3's gradient-disentangled embedding sharing: the discriminator's token
    embeddings are the generator's with the gradient stopped, plus a difference of its own
    (initialised at zero), so the discriminator's loss never pulls the generator's embeddings
    (the "tug-of-war" of plain sharing) while both start from the same table."""

    def __init__(self, shared: nn.Embedding):
        super().__init__()
        # held in a list: the shared table is the generator's parameter, not a second copy here
        self._shared = [shared]
        self.delta = nn.Parameter(torch.zeros_like(shared.weight))
        self.padding_idx = shared.padding_idx

    @property
    def weight(self) -> torch.Tensor:
        """The discriminator's table as it is used (what export writes)."""
        return self._shared[0].weight.detach() + self.delta

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight, self.padding_idx)
