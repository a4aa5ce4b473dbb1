"""Replaced-token detection (ELECTRA), the parts every architecture shares.

A small generator (a masked-LM encoder of the same architecture) predicts the masked positions;
a token is sampled from its softmax at temperature 1 for each of them, with no gradient through
the sample; the discriminator (the encoder we export) reads the corrupted sequence and predicts,
for every real token, whether it was replaced. A sample equal to the original token counts as
original. Loss = generator MLM loss + lambda x discriminator binary cross-entropy (Clark et al.
2020; ../shared/notes/rtd.md has what the open implementations do).

Here: the generator's size from the encoder's (:func:`generator_config`), the sampling
(:func:`sample_replacements`), the corruption (:func:`corrupt`), the discriminator's loss and the
counts its metrics need (:func:`discriminator_loss`), and DeBERTa-v3's gradient-disentangled
embedding (:class:`DisentangledEmbedding`). Each arch's folder composes them into its model.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.kernels import api as kernels
from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.pretrain.model.checkpointing import apply_activation_checkpointing
from bertforge.pretrain.model.model_config import ModelConfig
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


def masked_positions(labels: torch.Tensor) -> torch.Tensor:
    """Flat indices [N] of the predicted positions of ``labels`` [B, T] (row-major order, the
    order of the masked rows the heads compute on)."""
    return (labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)


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


class ReplacedTokenDetection:
    """The objective's forward over an arch's pair (a mixin of each arch's RTD model), which
    supplies ``_generator_rows`` (the generator's head outputs [N_m, E] and labels of the masked
    positions, row-major), ``_generator_decoder`` (its output layer's weight [V, E] and bias,
    tied to the token embeddings) and ``_discriminator_logits`` (the discriminator's logit of
    each real token [N_real], row-major), and sets ``rtd_weight``, ``true_vocab_size`` and
    ``loss_impl``."""

    objective = "rtd"  # export writes the discriminator (and a generator it can write)
    nsp = False
    share_layers = "none"  # --share_layers is refused with rtd (the specs' unsupported)
    shares_layers = False
    shared_keys = ()

    def _set_objective(self, true_vocab_size: int, settings: ObjectiveConfig, loss_impl: str):
        """What the forward reads of the run's settings."""
        self.true_vocab_size = int(true_vocab_size)
        self.rtd_weight = float(settings.rtd_weight)
        self.embedding_sharing = settings.embedding_sharing
        self.loss_impl = loss_impl
        self.checkpointing = "none"

    def register_zero3_external_parameters(self) -> None:
        """ZeRO-3: the generator's output layer (the shared token table and its bias) is used
        outside its module's forward (the fused loss, the sampling), so ZeRO gathers it."""
        from deepspeed.runtime.zero.partition_parameters import register_external_parameter

        for param in self._generator_decoder():
            register_external_parameter(self, param)

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
        rows, row_labels = self._generator_rows(
            input_ids, attention_mask, token_type_ids, labels, **where
        )
        weight, bias = self._generator_decoder()
        mlm = kernels.masked_lm_loss_rows(
            rows,
            weight,
            bias,
            row_labels,
            ignore_index=IGNORE_INDEX,
            vocab_size=self.true_vocab_size,
            normalizer=mlm_normalizer,
            impl=self.loss_impl,
        )
        v = self.true_vocab_size
        with torch.no_grad():  # no gradient through the sample (ELECTRA)
            sampled = sample_replacements(F.linear(rows, weight[:v], bias[:v]))
        corrupted, replaced = corrupt(input_ids, labels, sampled)
        logits = self._discriminator_logits(corrupted, attention_mask, token_type_ids, **where)
        real = replaced[attention_mask.bool()]
        rtd = discriminator_loss(logits, real, token_normalizer)
        zero = torch.zeros((), dtype=torch.int64, device=input_ids.device)
        return {
            "loss": mlm.loss + self.rtd_weight * rtd["rtd_loss"],
            "mlm_loss": mlm.loss,
            "nsp_loss": None,
            "num_masked": mlm.num_masked,
            "num_correct": mlm.num_correct,
            "nsp_correct": zero,
            "nsp_count": zero,
            **rtd,
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
        """The generator's MLM logits [N_m, true_vocab_size] where labels != IGNORE_INDEX."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        rows, _ = self._generator_rows(
            input_ids, attention_mask, token_type_ids, labels, document_ids, position_ids
        )
        weight, bias = self._generator_decoder()
        v = self.true_vocab_size
        return F.linear(rows, weight[:v], bias[:v])

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
        real = self._discriminator_logits(input_ids, attention_mask, token_type_ids, None, None)
        out = torch.zeros(input_ids.shape, dtype=real.dtype, device=real.device)
        out[attention_mask.bool()] = real
        return out


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
