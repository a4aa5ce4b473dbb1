"""`bertforge prep check-overlap A B`: near-duplicates between two finished builds.

Shards hold token ids, not text, so both builds are decoded with their own tokenizers and compared
as text (data_prep.decontam normalises case and accents, so a cased and an uncased build compare
alike). The unit compared is the document where the shards keep document boundaries: packed
builds without --stride join each shard's sequences and cut them at the [SEP]s that separate
documents (a document whose separator fell on a sequence boundary stays glued to the next one,
which only lowers its similarity); --stride and nsp builds are compared sequence by sequence.
A's units are indexed (give the smaller build, e.g. an eval set, as A) and B's are queried.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bertforge.data_prep.decontam import NearDuplicateIndex, Signer
from bertforge.data_prep.layout import TOKENIZER_DIR
from bertforge.data_prep.reader import ShardReader, load_manifest


def _units_of_shard(reader: ShardReader, lo: int, hi: int, by_document: bool) -> list[list[int]]:
    """Token ids of the units of sequences [lo, hi) of one shard (see the module doc)."""
    cls, sep = reader.special_tokens["cls"], reader.special_tokens["sep"]
    seqs = [reader[i].input_ids for i in range(lo, hi)]
    if not by_document:
        return [[t for t in s.tolist() if t not in (cls, sep)] for s in seqs]
    stream = np.concatenate([s[1:-1] for s in seqs]) if seqs else np.zeros(0, dtype=np.int64)
    cuts = np.flatnonzero(stream == sep)
    pieces = [p[1:] if k else p for k, p in enumerate(np.split(stream, cuts))]  # drop the [SEP]
    return [p.tolist() for p in pieces if len(p)]


def iter_texts(root: Path, splits: tuple[str, ...]) -> Iterator[str]:
    """Decoded text of every unit of the given splits of a finished build."""
    manifest = load_manifest(root)
    tok = Tokenizer.from_file(str(root / TOKENIZER_DIR / "tokenizer.json"))
    stride = (manifest.get("build_key") or {}).get("sequences", {}).get("stride")
    by_document = manifest["format"] == "packed" and not stride
    for split in splits:
        if split not in manifest["splits"]:
            continue
        reader = ShardReader(root, split)
        starts = reader._starts_list
        for lo, hi in pairwise(starts):
            units = _units_of_shard(reader, lo, hi, by_document)
            yield from tok.decode_batch(units, skip_special_tokens=True)


def overlap_report(
    a: Path,
    b: Path,
    threshold: float = 0.8,
    splits_a: tuple[str, ...] = ("train", "validation"),
    splits_b: tuple[str, ...] = ("train", "validation"),
    max_examples: int = 10,
) -> dict[str, Any]:
    """Counts (and a few examples) of B's units that near-duplicate one of A's."""
    signer = Signer()
    t0 = time.perf_counter()
    a_texts = list(iter_texts(a, splits_a))
    index = NearDuplicateIndex.build(a_texts, threshold, signer)
    matched_a: set[int] = set()
    checked = hits = chars = 0
    examples = []
    for text in iter_texts(b, splits_b):
        checked += 1
        chars += len(text.encode())
        hit = index.match(signer.signature(text), signer)
        if hit is None:
            continue
        hits += 1
        matched_a.add(hit[0])
        if len(examples) < max_examples:
            examples.append(
                {"a": index.previews[hit[0]], "b": text[:80], "jaccard": round(hit[1], 3)}
            )
    seconds = time.perf_counter() - t0
    a_bytes = sum(len(t.encode()) for t in a_texts)
    return {
        "a": str(a),
        "b": str(b),
        "splits_a": list(splits_a),
        "splits_b": list(splits_b),
        "threshold": threshold,
        "a_units": len(a_texts),
        "b_units": checked,
        "b_units_near_duplicate": hits,
        "a_units_with_a_near_duplicate": len(matched_a),
        "seconds": round(seconds, 3),
        "mb_per_s": round((a_bytes + chars) / 1e6 / max(seconds, 1e-9), 2),
        "examples": examples,
    }


def overlap_lines(r: dict[str, Any]) -> list[str]:
    """Human-readable form of `overlap_report`, one string per line."""
    return [
        f"A {r['a']} ({'+'.join(r['splits_a'])}): {r['a_units']:,} units; "
        f"B {r['b']} ({'+'.join(r['splits_b'])}): {r['b_units']:,} units",
        f"near-duplicates (estimated Jaccard >= {r['threshold']}): {r['b_units_near_duplicate']:,}"
        f" of B's units match {r['a_units_with_a_near_duplicate']:,} of A's "
        f"({r['seconds']} s, {r['mb_per_s']} MB/s of decoded text)",
        *(f"  {e['jaccard']:.2f}  A: {e['a']!r}\n        B: {e['b']!r}" for e in r["examples"]),
    ]
