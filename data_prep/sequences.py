"""Turning tokenized documents into training sequences ([CLS] ... [SEP], word-start bits).

`packed` (RoBERTa FULL-SENTENCES): documents concatenated with a [SEP] between documents and
cut every `max_seq_len - 2` tokens; every token lands in exactly one sequence, in order (a
document separator that would open or close a sequence is left out). With a stride, each
document is instead covered by overlapping windows and documents are not mixed.

`nsp` (BERT's create_pretraining_data.py): segments of a document gathered up to a target
length, split at a random segment into A and B; half the time B is replaced by segments from a
random other document and the segments not used are put back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from bertforge.cli import opt


@dataclass
class Sequences:
    """Sequences of one shard, back to back."""

    tokens: np.ndarray  # uint32, [CLS]/[SEP] included
    offsets: np.ndarray  # uint64, n + 1 entries
    word_start: np.ndarray  # bool per token
    segment_a_len: np.ndarray | None = None  # nsp: uint16 per sequence
    is_random_next: np.ndarray | None = None  # nsp: uint8 per sequence


@dataclass(frozen=True)
class SequenceConfig:
    """How sequences are built."""

    format: str = opt(
        "packed",
        "packed: documents concatenated; nsp: BERT's sentence pairs",
        choices=("packed", "nsp"),
    )
    max_seq_len: int = opt(128, "tokens per sequence including [CLS]/[SEP]")
    stride: int | None = opt(
        None,
        "packed: sliding windows of max_seq_len-2 tokens over each document "
        "with this stride (documents are then not concatenated)",
    )
    short_seq_prob: float = opt(0.1, "nsp: as BERT")  # probability of a shorter target length
    random_next_prob: float = opt(
        0.5,
        "nsp: share of pairs whose second segment comes from another document (BERT: 0.5; "
        "0 gives only consecutive pairs, all of which --objective mlm+sop trains on)",
    )


def _assemble(
    pieces_ids: list[np.ndarray], pieces_ws: list[np.ndarray], cls: int, sep: int
) -> Sequences:
    """Wrap each piece as [CLS] piece [SEP]; the first token of a piece always starts a unit."""
    n = len(pieces_ids)
    lens = np.array([len(p) for p in pieces_ids], dtype=np.int64) + 2
    offsets = np.zeros(n + 1, dtype=np.uint64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    tokens = np.empty(total, dtype=np.uint32)
    ws = np.ones(total, dtype=bool)
    starts = offsets[:-1].astype(np.int64)
    body = np.ones(total, dtype=bool)
    body[starts] = False
    body[starts + lens - 1] = False
    if n:
        tokens[body] = np.concatenate(pieces_ids)
        ws[body] = np.concatenate(pieces_ws)
    tokens[starts] = cls
    tokens[starts + lens - 1] = sep
    ws[starts + 1] = True  # a piece cut mid-word starts its own unit
    ws[starts] = True
    ws[starts + lens - 1] = True
    return Sequences(tokens, offsets, ws)


def pack(
    docs_ids: list[np.ndarray], docs_ws: list[np.ndarray], cfg: SequenceConfig, cls: int, sep: int
) -> Sequences:
    """Packed sequences from the documents of one shard (see the module docstring)."""
    width = cfg.max_seq_len - 2
    if cfg.stride:
        ids_pieces, ws_pieces = [], []
        for ids, ws in zip(docs_ids, docs_ws):
            n = len(ids)
            starts = list(range(0, max(n - width, 0) + 1, cfg.stride))
            if starts[-1] + width < n:
                starts.append(n - width)
            for s in starts:
                ids_pieces.append(ids[s : s + width])
                ws_pieces.append(ws[s : s + width])
        return _assemble(ids_pieces, ws_pieces, cls, sep)
    if not docs_ids:
        return _assemble([], [], cls, sep)
    # One stream: doc0 [SEP] doc1 [SEP] ... ; is_sep marks the document separators by position
    # (a literal "[SEP]" inside a document is text, not a separator).
    seps = np.full(1, sep, dtype=np.uint32)
    stream_parts, ws_parts, sep_parts = [], [], []
    for k, (ids, ws) in enumerate(zip(docs_ids, docs_ws)):
        if k:
            stream_parts.append(seps)
            ws_parts.append(np.ones(1, dtype=bool))
            sep_parts.append(np.ones(1, dtype=bool))
        stream_parts.append(ids.astype(np.uint32, copy=False))
        ws_parts.append(ws)
        sep_parts.append(np.zeros(len(ids), dtype=bool))
    stream = np.concatenate(stream_parts)
    stream_ws = np.concatenate(ws_parts)
    is_sep = np.concatenate(sep_parts)
    pos = np.arange(len(stream)) % width
    chunk_last = (pos == width - 1) | (np.arange(len(stream)) == len(stream) - 1)
    keep = ~(is_sep & ((pos == 0) | chunk_last))
    chunk = np.arange(len(stream)) // width
    n_chunks = int(chunk[-1]) + 1
    counts = np.bincount(chunk[keep], minlength=n_chunks)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    kept, kept_ws = stream[keep], stream_ws[keep]
    ids_pieces = [kept[bounds[c] : bounds[c + 1]] for c in range(n_chunks) if counts[c]]
    ws_pieces = [kept_ws[bounds[c] : bounds[c + 1]] for c in range(n_chunks) if counts[c]]
    return _assemble(ids_pieces, ws_pieces, cls, sep)


def _truncate_pair(a: list, b: list, max_tokens: int, rng: random.Random) -> None:
    """BERT's truncate_seq_pair on (ids, ws) lists of tokens: trim the longer side at a random
    end until the pair fits."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def nsp_instances(
    docs_segments: list[list[tuple[np.ndarray, np.ndarray]]],
    cfg: SequenceConfig,
    cls: int,
    sep: int,
    rng: random.Random,
) -> Sequences:
    """NSP sequences from documents given as lists of segments (sentences) of (ids, ws)."""
    max_tokens = cfg.max_seq_len - 3
    pieces_ids, pieces_ws, a_lens, randoms = [], [], [], []
    n_docs = len(docs_segments)
    for d, segments in enumerate(docs_segments):
        target = max_tokens
        if rng.random() < cfg.short_seq_prob:
            target = rng.randint(2, max_tokens)
        chunk: list[tuple[np.ndarray, np.ndarray]] = []
        length = 0
        i = 0
        while i < len(segments):
            chunk.append(segments[i])
            length += len(segments[i][0])
            if i == len(segments) - 1 or length >= target:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for seg in chunk[:a_end] for t in zip(*seg)]
                b: list = []
                take_random = rng.random() < cfg.random_next_prob
                if len(chunk) == 1 and not take_random:
                    # One segment only: split it inside so that "actual next" stays possible and
                    # the labels stay balanced (BERT forces a random B here).
                    if len(a) >= 2:
                        cut = rng.randint(1, len(a) - 1)
                        a, b = a[:cut], a[cut:]
                    else:
                        take_random = True
                if take_random:
                    target_b = max(1, target - len(a))
                    other = d
                    for _ in range(10):
                        other = rng.randint(0, n_docs - 1)
                        if other != d:
                            break
                    other_segments = docs_segments[other]
                    for j in range(rng.randint(0, len(other_segments) - 1), len(other_segments)):
                        b.extend(zip(*other_segments[j]))
                        if len(b) >= target_b:
                            break
                    i -= len(chunk) - a_end  # put the unused segments back
                elif not b:
                    b = [t for seg in chunk[a_end:] for t in zip(*seg)]
                _truncate_pair(a, b, max_tokens, rng)
                if a and b:
                    a_ids, a_ws = (np.array(x) for x in zip(*a))
                    b_ids, b_ws = (np.array(x) for x in zip(*b))
                    a_ws[0] = b_ws[0] = True  # a trimmed segment starts its own unit
                    pieces_ids.append(np.concatenate([a_ids, [sep], b_ids]).astype(np.uint32))
                    pieces_ws.append(np.concatenate([a_ws, [True], b_ws]).astype(bool))
                    a_lens.append(len(a_ids) + 2)
                    randoms.append(int(take_random))
                chunk, length = [], 0
            i += 1
    seqs = _assemble(pieces_ids, pieces_ws, cls, sep)
    seqs.segment_a_len = np.array(a_lens, dtype=np.uint16)
    seqs.is_random_next = np.array(randoms, dtype=np.uint8)
    return seqs
