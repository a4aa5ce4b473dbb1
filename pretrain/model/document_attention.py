"""Document-aware attention for packed sequences (``--attention document|full``).

Packed shards (RoBERTa FULL-SENTENCES, :mod:`data_prep.sequences`) hold several documents in one
``[CLS] doc0 [SEP] doc1 [SEP] ... [SEP]`` sequence. With ``document`` attention a token attends
only to the tokens of its own document and the position ids restart at 0 with every document, so
a document packed behind others is encoded as if it were alone: ``[CLS] doc0 [SEP]`` for the
first, ``docK [SEP]`` for the later ones (tested to 1e-5 against running each alone).

The boundary rule. The document index of token t is the number of [SEP]s strictly before t:
- the [CLS] at position 0 belongs to the first document (it opens the sequence, as in a
  one-document sequence, so the first document sees exactly BERT's ``[CLS] ... [SEP]``);
- every [SEP] closes the document before it (the last token of that document; the final [SEP]
  closes the last one). A [SEP] attached to the document it ends is what BERT sees at the end of
  every sequence, and a document cut at the end of a sequence still ends with a [SEP];
- every [SEP] counts. The shards cannot tell a separator from a literal "[SEP]" in the text: the
  tokenizer matches its special tokens inside raw text, so both are the sep id (data_prep keeps
  them apart only in its build-time stream, to decide which separators to drop at sequence
  edges). A text holding "[SEP]" is therefore split there.
- NSP shards: ``[CLS] A [SEP] B [SEP]`` is one document pair, so the whole sequence is document
  0 (document attention = today's full attention within the pair, positions 0..n-1).
Padding is document -1: it attends only to padding, and no real token attends to it.

In a batch (:mod:`pretrain.data.loader`, ``attention="document"``) this is ``document_ids`` and
``position_ids`` ([B, T] int64, computed in numpy without a loop over tokens); the models turn
``document_ids`` into a block-diagonal boolean [B, 1, T, T] mask for PyTorch SDPA
(:func:`document_mask`; ModernBERT's attention paths use it in their global layers and as the
oracle of their blocked sliding-window path).

The unpadded form (:func:`unpad`): a batch's real tokens concatenated into one row [1, N], the
document ids made unique across the sequences, so the same mask keeps sequences and documents
apart and no padding is computed; ``sequence_starts`` [B] gives each sequence's [CLS] for the NSP
head. Its loss equals the padded batch's (tested to 1e-5, fp32). With a dense [N, N] mask it is a
correctness form only (it costs (B T)^2 where the padded batch costs B T^2); ModernBERT runs it
on CUDA through flash-attention's varlen kernel fed ``cu_seqlens``
(:mod:`pretrain.model.attention_paths`).
"""

from __future__ import annotations

import numpy as np
import torch

from bertforge.errors import UserError

ATTENTION_MODES = ("auto", "document", "full")


class AttentionError(UserError, ValueError):
    """A bad ``--attention`` value; the message names the flag."""


def document_index(
    ids: np.ndarray, lengths: np.ndarray, sep_id: int, *, nsp: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(document_ids, position_ids), both int64 [B, T], of a padded batch of packed sequences
    (``ids`` [B, T], ``lengths`` [B]; see the module doc for the rule). Padding: document -1,
    position 0. ``nsp``: each sequence is one document (0)."""
    B, T = ids.shape
    cols = np.arange(T, dtype=np.int64)[None, :]
    in_seq = cols < np.asarray(lengths, dtype=np.int64)[:, None]
    if nsp:
        docs = np.zeros((B, T), dtype=np.int64)
        positions = np.broadcast_to(cols, (B, T)).copy()
    else:
        is_sep = (ids == sep_id) & in_seq
        seps_through = np.cumsum(is_sep, axis=1, dtype=np.int64)
        docs = seps_through - is_sep  # [SEP]s strictly before t
        starts = np.zeros((B, T), dtype=bool)  # t opens a document: t == 0 or a [SEP] at t-1
        starts[:, 0] = True
        starts[:, 1:] = is_sep[:, :-1]
        first = np.maximum.accumulate(np.where(starts, cols, 0), axis=1)
        positions = cols - first
    docs[~in_seq] = -1
    positions[~in_seq] = 0
    return docs, positions


def document_mask(document_ids: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Boolean [B, 1, T, T] mask for SDPA (True = may attend): query and key in the same
    document; with ``window``, also at most ``window`` tokens apart (ModernBERT's sliding
    window: transformers' ``|q - k| <= config.sliding_window``)."""
    mask = document_ids[:, None, :, None] == document_ids[:, None, None, :]
    if window is not None:
        idx = torch.arange(document_ids.shape[1], device=document_ids.device)
        mask = mask & ((idx[:, None] - idx[None, :]).abs() <= window)
    return mask


def unpad(batch: dict) -> dict:
    """The unpadded form of a padded batch (see the module doc): every [B, T] tensor's real
    tokens (``attention_mask`` 1) in one row [1, N]; ``document_ids`` unique across sequences
    (each row one document when the batch has none, i.e. full attention within each sequence);
    ``position_ids`` (0.. per sequence when absent); ``sequence_starts`` [B]; ``attention_mask``
    dropped (the document ids carry it); per-sequence entries (``next_sentence_label``) and
    anything else that is not [B, T] are kept as they are."""
    real = batch["attention_mask"].bool()
    B, T = real.shape
    lengths = real.sum(1)
    docs = batch.get("document_ids")
    if docs is None:
        docs = torch.where(real, 0, -1)
    positions = batch.get("position_ids")
    if positions is None:
        positions = torch.arange(T, device=real.device).expand(B, T)
    # Row b's documents move past every document of the rows before it.
    per_row = torch.where(real, docs, -1).amax(1) + 1
    offset = torch.cumsum(per_row, 0) - per_row
    out = {}
    for key, value in batch.items():
        if key == "attention_mask":
            continue
        if isinstance(value, torch.Tensor) and value.shape[:2] == (B, T) and value.dim() == 2:
            out[key] = value[real][None]
        else:
            out[key] = value
    out["document_ids"] = (docs + offset[:, None])[real][None]
    out["position_ids"] = positions[real][None]
    out["sequence_starts"] = torch.cumsum(lengths, 0) - lengths
    return out
