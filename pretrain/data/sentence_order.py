"""Sentence-order pairs for ALBERT's SOP (``--objective mlm+sop``) from NSP shards.

An NSP sequence is ``[CLS] A [SEP] B [SEP]`` where B either follows A in its document or (about
half of them, ``is_random_next``) comes from another document. SOP (Lan et al. 2020, ALBERT)
asks which of two consecutive segments comes first: half of the consecutive pairs are swapped to
``[CLS] B [SEP] A [SEP]`` (label 1; in order: 0, as transformers' ``sentence_order_label``). A
random-next pair has no order to tell: it keeps its tokens and trains the masked LM only (label
IGNORE_INDEX). The swap is a pure function of (masking seed, epoch, sample index), like the
masks, so a resume and any world size see the same pairs; it happens before masking, which then
masks the swapped sequence.
"""

from __future__ import annotations

import numpy as np

from bertforge.pretrain.data.masking import IGNORE_INDEX, token_hashes

# Salts the masking seed so the swap coin is not the hash of a masked position.
_SALT = 0x5E17E0CE


def require_pair_shards(reader) -> None:
    """A ValueError naming the shards and the fix unless they hold sentence pairs (NSP's)."""
    if reader.format != "nsp":
        raise ValueError(
            f"{getattr(reader, 'root', 'the shards')}: sentence-order prediction needs "
            f"sentence-pair shards (format nsp), these are {reader.format}: build them with "
            "`bertforge prep build --format nsp`"
        )


def swap_coins(seed: int, epochs: np.ndarray, sample_index: np.ndarray) -> np.ndarray:
    """bool [B]: whether each sample's pair is swapped (a fair coin per (seed, epoch, index))."""
    h = token_hashes(seed ^ _SALT, epochs, sample_index, 1)[:, 0]
    return (h >> np.uint64(63)).astype(bool)


def order_pairs(
    ids: np.ndarray,
    word_start: np.ndarray | None,
    lengths: np.ndarray,
    segment_a_len: np.ndarray,
    is_random_next: np.ndarray,
    swap: np.ndarray,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """(ids, word_start, first segment's length with [CLS] and its [SEP], labels [B]) after
    swapping the consecutive pairs where ``swap`` is set; inputs are not changed."""
    ids = ids.copy()
    word_start = None if word_start is None else word_start.copy()
    a_len = segment_a_len.astype(np.int64).copy()
    consecutive = np.asarray(is_random_next) == 0
    labels = np.where(consecutive, swap.astype(np.int64), IGNORE_INDEX)
    for row in np.flatnonzero(consecutive & swap):
        n, a = int(lengths[row]), int(a_len[row])
        # [CLS] A [SEP] B [SEP] -> [CLS] B [SEP] A [SEP]: rotate the span between [CLS] and the
        # last [SEP] so that B, its [SEP] (A's old one) and A change places.
        order = np.concatenate([np.arange(a, n - 1), [a - 1], np.arange(1, a - 1)])
        ids[row, 1 : n - 1] = ids[row, order]
        if word_start is not None:
            word_start[row, 1 : n - 1] = word_start[row, order]
        a_len[row] = n - a + 1
    return ids, word_start, a_len, labels
