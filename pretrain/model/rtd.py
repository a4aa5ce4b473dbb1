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

from bertforge.kernels.constants import IGNORE_INDEX
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
    logits: torch.Tensor,
    replaced: torch.Tensor,
    attention_mask: torch.Tensor,
    normalizer: torch.Tensor | float | None = None,
) -> dict[str, torch.Tensor]:
    """Binary cross-entropy of ``logits`` [B, T] against ``replaced`` over the real tokens
    (``attention_mask`` 1), summed and divided by ``normalizer`` (the global batch's real
    tokens; default this batch's), and the counts of :data:`RTD_COUNTS`."""
    real = attention_mask.reshape(-1).bool()
    z = logits.reshape(-1)[real].float()
    target = replaced.reshape(-1)[real]
    total = F.binary_cross_entropy_with_logits(z, target.float(), reduction="sum")
    denom = normalizer if normalizer is not None else max(int(real.sum()), 1)
    predicted = z > 0
    return {
        "rtd_loss": total / denom,
        "rtd_correct": (predicted == target).sum(),
        "rtd_tokens": real.sum(),
        "rtd_replaced": target.sum(),
        "rtd_true_positive": (predicted & target).sum(),
        "rtd_predicted": predicted.sum(),
    }


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
