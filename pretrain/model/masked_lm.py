"""The encode and masked-LM surface every pretraining network here shares, written once.

Each arch writes how its encoder runs (``_hidden_states``: document attention, ModernBERT's
attention paths), the head before the decoder (``_mlm_head``) and the decoder (``mlm_decoder``),
once for every network of the arch: its masked-LM model, and the generator and discriminator of
replaced-token detection (:mod:`pretrain.model.rtd`). :class:`EncoderSurface` and
:class:`MaskedLMSurface` turn those into what the rest of the trainer calls (``encode``,
``predict_masked``, ``register_zero3_external_parameters``): the masked rows gathered before the
head, every masked-LM loss in the fused kernel on those rows only (``mlm_loss``);
:func:`mlm_outputs` is the output dict every forward returns (``PretrainingModel`` in
:mod:`pretrain.model.specs`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bertforge.kernels import api as kernels
from bertforge.kernels.constants import IGNORE_INDEX


def masked_positions(labels: torch.Tensor) -> torch.Tensor:
    """Flat indices [N] of the predicted positions of ``labels`` [B, T] (row-major order, the
    order of the masked rows the heads compute on)."""
    return (labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)


def gather_masked(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows [N_m, H] of ``hidden`` [B, T, H] at the predicted positions of ``labels``
    [B, T], and their labels [N_m] (row-major)."""
    idx = masked_positions(labels)
    rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, idx)
    return rows, labels.reshape(-1).index_select(0, idx)


def mlm_outputs(mlm, like: torch.Tensor) -> dict:
    """A forward's outputs of its masked-LM loss ``mlm`` (the fused kernel's result): ``loss``
    (the MLM's; an objective adds its own term), ``mlm_loss``, ``num_masked``, ``num_correct``,
    and NSP's none (``nsp_loss`` None, its counts 0 on ``like``'s device)."""
    zero = torch.zeros((), dtype=torch.int64, device=like.device)
    return {
        "loss": mlm.loss,
        "mlm_loss": mlm.loss,
        "nsp_loss": None,
        "num_masked": mlm.num_masked,
        "num_correct": mlm.num_correct,
        "nsp_correct": zero,
        "nsp_count": zero,
    }


class EncoderSurface:
    """``encode``, what the trainer, evaluation and export call, over the arch's
    ``_hidden_states(input_ids, attention_mask, token_type_ids, document_ids, position_ids)``
    (the last hidden states [B, T, H]; an RTD pair's: its discriminator's)."""

    def encode(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        document_ids=None,
        position_ids=None,
    ) -> torch.Tensor:
        """The encoder's last hidden states [B, T, H] (document attention with document_ids,
        else full attention within each row's real tokens): the encoder a user fine-tunes."""
        return self._hidden_states(
            input_ids, attention_mask, token_type_ids, document_ids, position_ids
        )


class MaskedLMSurface(EncoderSurface):
    """A network with a masked-LM head on masked rows only: ``masked_rows``, the fused loss
    (``mlm_loss``) and ``predict_masked`` over what the arch supplies: ``_mlm_head(rows)`` (the
    head before the decoder), ``mlm_decoder()`` (the output layer's weight [V, E], tied to the
    token table, and its bias [V]) and, where the hidden states of the masked rows come another
    way than through ``_hidden_states`` (ModernBERT's unpadded path), ``_masked_hidden``;
    ``true_vocab_size`` and ``loss_impl`` are set by the model."""

    true_vocab_size: int
    loss_impl: str

    def _masked_hidden(
        self, input_ids, attention_mask, token_type_ids, labels, document_ids, position_ids
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states [B, T, H], labels [B, T]) from which the masked rows are gathered."""
        hidden = self._hidden_states(
            input_ids, attention_mask, token_type_ids, document_ids, position_ids
        )
        return hidden, labels

    def _head_rows(
        self, hidden: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's outputs [N_m, E] and labels [N_m] of the predicted positions."""
        rows, row_labels = gather_masked(hidden, labels)
        return self._mlm_head(rows), row_labels

    def masked_rows(
        self,
        input_ids,
        attention_mask,
        token_type_ids,
        labels,
        document_ids=None,
        position_ids=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's outputs [N_m, E] and labels [N_m] of the positions where labels !=
        IGNORE_INDEX (row-major; the head runs on those rows only)."""
        hidden, labels = self._masked_hidden(
            input_ids, attention_mask, token_type_ids, labels, document_ids, position_ids
        )
        return self._head_rows(hidden, labels)

    def mlm_loss(
        self,
        rows: torch.Tensor,
        row_labels: torch.Tensor,
        normalizer: torch.Tensor | float | None = None,
    ):
        """The fused masked-LM loss of the head's ``rows`` against ``row_labels`` (sum /
        ``normalizer``, the global batch's masked count; default: these rows' count); the
        vocabulary's padding columns take no part."""
        weight, bias = self.mlm_decoder()
        return kernels.masked_lm_loss_rows(
            rows,
            weight,
            bias,
            row_labels,
            ignore_index=IGNORE_INDEX,
            vocab_size=self.true_vocab_size,
            normalizer=normalizer,
            impl=self.loss_impl,
        )

    def register_zero3_external_parameters(self) -> None:
        """Tell ZeRO-3 that the forward uses the output layer's weight (the token table's) and
        bias outside their module's own forward (the fused loss; RTD's sampling), so it gathers
        them. The trainer calls it before ``deepspeed.initialize``; harmless without ZeRO-3."""
        # Lazy: deepspeed takes seconds to import; the commands that import this module without
        # running a job (--help, the doctor) do without it.
        from deepspeed.runtime.zero.partition_parameters import register_external_parameter

        for param in self.mlm_decoder():
            register_external_parameter(self, param)

    def masked_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """The head's ``rows`` [N, E] decoded over the true vocabulary [N, true_vocab_size]."""
        weight, bias = self.mlm_decoder()
        v = self.true_vocab_size
        return F.linear(rows, weight[:v], bias[:v])

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
        rows, _ = self.masked_rows(
            input_ids, attention_mask, token_type_ids, labels, document_ids, position_ids
        )
        return self.masked_logits(rows)
