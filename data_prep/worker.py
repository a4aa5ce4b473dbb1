"""One work unit (a run of consecutive documents) -> one shard per split, plus a done record.

Runs in pool processes: imports stay light (numpy, tokenizers), the tokenizer is loaded once per
process by `init_worker`. Every file is written under a temporary name and renamed; the done
record, written last, is what lets a resumed build skip the unit.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bertforge.data_prep.decontam import Decontaminator
from bertforge.data_prep.key_sentences import KeptCounts, cut_tokens, joined, key_spans
from bertforge.data_prep.layout import (
    NSP_DTYPE,
    SPLITS,
    WORK_DIR,
    offsets_dtype_for,
    shard_name,
    write_array_atomic,
)
from bertforge.data_prep.sequences import SequenceConfig, Sequences, nsp_instances, pack
from bertforge.data_prep.tokenizer import continuation_flags, plain_encoding
from bertforge.data_prep.wordstart import WordStarts
from bertforge.files import write_json_atomic

# Sentence ends for nsp segments: line breaks, and ./!/? + space or CJK full stops.
_SENTENCE_END = re.compile(r"\n+|(?<=[.!?;])\s+|(?<=[。！？；…])")
_ENCODE_BATCH = 512
_BAD_EXAMPLES = 5  # no-token documents named (file and line) per unit record


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a pool process needs (picklable)."""

    tokenizer_json: str  # OUT/tokenizer/tokenizer.json
    output: str  # OUT
    sequences: SequenceConfig
    validation_fraction: float  # share of documents (by text hash) sent to validation
    seed: int  # seeds the nsp random choices of each unit
    special_tokens: dict[str, int]  # cls, sep, pad, mask, unk -> id
    token_dtype: str  # "<u2" or "<u4"
    protected_terms: tuple[str, ...] | None
    lowercase: bool  # protected terms match case-insensitively when the tokenizer lowercases
    decontam_index: str | None = None  # OUT/.work/decontam-index.pkl: drop train near-duplicates
    key_sentences: float | None = None  # documents over max_seq_len keep this share of sentences


def is_validation(text: str, fraction: float) -> bool:
    """Deterministic document split: the first 8 bytes of blake2b(text) as a fraction of 2^64."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
    return h < fraction * 2.0**64


def done_record_path(output: Path, unit: int) -> Path:
    """Where unit `unit` records that its shards are complete."""
    return output / WORK_DIR / f"unit-{unit:05d}.json"


class _Worker:
    def __init__(self, spec: WorkerSpec, pooled: bool = False):
        self.spec = spec
        self.one_blas_thread = not pooled  # pooled: limited at the first key-sentence cut
        self.tok = Tokenizer.from_file(spec.tokenizer_json)
        plain_encoding(self.tok)  # the build's own copy has none; never cut or pad a document
        self.words = WordStarts(
            continuation_flags(self.tok), list(spec.protected_terms or ()), spec.lowercase
        )
        self.out = Path(spec.output)
        self.decontam = Decontaminator(Path(spec.decontam_index)) if spec.decontam_index else None

    def _encode(self, texts: list[str], need_offsets: bool):
        """Per text: (ids uint32, word-start bool, char offsets [n,2] or None)."""
        result = []
        for b in range(0, len(texts), _ENCODE_BATCH):
            batch = texts[b : b + _ENCODE_BATCH]
            flags = [need_offsets or self.words.needs_offsets(t) for t in batch]
            slow = [t for t, f in zip(batch, flags) if f]
            fast = [t for t, f in zip(batch, flags) if not f]
            # encode_batch_fast skips offset tracking: most English documents need no offsets.
            enc_fast = iter(self.tok.encode_batch_fast(fast, add_special_tokens=False))
            enc_slow = iter(self.tok.encode_batch(slow, add_special_tokens=False))
            for text, f in zip(batch, flags):
                enc = next(enc_slow) if f else next(enc_fast)
                ids = np.array(enc.ids, dtype=np.uint32)
                offsets = np.array(enc.offsets, dtype=np.int64).reshape(-1, 2) if f else None
                result.append((ids, self.words.compute(text, ids, offsets), offsets))
        return result

    def _segments(self, text: str, ids: np.ndarray, ws: np.ndarray, offsets: np.ndarray):
        """Split a document's tokens into sentences (nsp segments) by character offsets."""
        ends = [m.end() for m in _SENTENCE_END.finditer(text)]
        sentence = np.searchsorted(np.array(ends, dtype=np.int64), offsets[:, 0], side="right")
        cuts = np.flatnonzero(np.diff(sentence)) + 1
        return [(i, w) for i, w in zip(np.split(ids, cuts), np.split(ws, cuts)) if len(i)]

    def _key_sentences(self, encoded: list, nsp: bool) -> dict[str, int]:
        """Cut each (text, encoding) whose tokens exceed max_seq_len to its key sentences
        (data_prep.key_sentences), in place; returns the counts. An encoding with offsets (nsp,
        Chinese, protected terms) is cut at its tokens; the others are encoded again."""
        if not self.one_blas_thread:
            # As with the tokenizer, the pool is the parallelism: 2 workers x 2 OpenBLAS threads
            # on 2 loaded cores made the small products and solves 10-25x slower. Here, not in
            # init_worker: there it made test_a_killed_worker_ends_the_build_instead_of_hanging
            # hang 3 times in 15 (CPython 3.11's ProcessPoolExecutor; never in 14 without it).
            from threadpoolctl import threadpool_limits

            threadpool_limits(1)
            self.one_blas_thread = True
        counts = KeptCounts()
        limit, share = self.spec.sequences.max_seq_len, self.spec.key_sentences
        cut, again = {}, {}
        for k, (text, (ids, ws, offsets)) in enumerate(encoded):
            if len(ids) <= limit:
                continue
            counts.documents_over_length += 1
            spans, n = key_spans(text, share)
            if len(spans) == n:
                continue
            short = joined(text, spans)
            if offsets is None:
                again[k] = (short, n, len(spans))
            else:
                cut[k] = (short, n, len(spans), cut_tokens(ids, ws, offsets, spans))
        encodings = self._encode([short for short, _, _ in again.values()], need_offsets=nsp)
        for (k, (short, n, kept)), enc in zip(again.items(), encodings):
            cut[k] = (short, n, kept, enc)
        for k, (short, n, kept, enc) in sorted(cut.items()):
            if len(enc[0]) == 0:
                continue  # the sentences kept hold no token: the document stays whole
            counts.add(
                {
                    "documents_shortened": 1,
                    "sentences_before": n,
                    "sentences_kept": kept,
                    "tokens_before": len(encoded[k][1][0]),
                    "tokens_kept": len(enc[0]),
                }
            )
            encoded[k] = (short, enc)
        return asdict(counts)

    def _sequences(
        self, unit: int, split: str, texts: list[str], no_tokens: list[str]
    ) -> tuple[Sequences, int, int, dict[str, int] | None]:
        """The split's sequences, its document and token counts (after any key-sentence cut)
        and the key-sentence counts (None without --key_sentences)."""
        spec = self.spec
        nsp = spec.sequences.format == "nsp"
        cls, sep = spec.special_tokens["cls"], spec.special_tokens["sep"]
        pairs = list(zip(texts, self._encode(texts, need_offsets=nsp)))
        kept = None if spec.key_sentences is None else self._key_sentences(pairs, nsp)
        encoded = []
        for text, (ids, ws, offsets) in pairs:
            if len(ids) == 0:
                no_tokens.append(text)  # only characters the normalizer removes
                continue
            encoded.append((text, ids, ws, offsets))
        corpus_tokens = sum(len(e[1]) for e in encoded)
        if nsp:
            docs = [self._segments(t, i, w, o) for t, i, w, o in encoded]
            rng = random.Random(f"{spec.seed}-{unit}-{split}")
            seqs = nsp_instances(docs, spec.sequences, cls, sep, rng)
        else:
            seqs = pack([e[1] for e in encoded], [e[2] for e in encoded], spec.sequences, cls, sep)
        return seqs, len(encoded), corpus_tokens, kept

    def _write(self, split: str, name: str, seqs: Sequences) -> dict[str, Any]:
        folder = self.out / split
        folder.mkdir(parents=True, exist_ok=True)
        offsets_dtype = offsets_dtype_for(len(seqs.tokens))
        files = {
            f"{name}.tokens": write_array_atomic(
                folder / f"{name}.tokens", seqs.tokens.astype(self.spec.token_dtype)
            ),
            f"{name}.offsets": write_array_atomic(
                folder / f"{name}.offsets", seqs.offsets.astype(offsets_dtype)
            ),
            f"{name}.wordstart": write_array_atomic(
                folder / f"{name}.wordstart", np.packbits(seqs.word_start, bitorder="little")
            ),
        }
        if seqs.segment_a_len is not None:
            rec = np.empty(len(seqs.segment_a_len), dtype=NSP_DTYPE)
            rec["segment_a_len"] = seqs.segment_a_len
            rec["is_random_next"] = seqs.is_random_next
            files[f"{name}.nsp"] = write_array_atomic(folder / f"{name}.nsp", rec)
        return {
            "name": name,
            "sequences": len(seqs.offsets) - 1,
            "tokens": len(seqs.tokens),
            "offsets_dtype": offsets_dtype.name,
            "files": files,
        }

    def process(
        self, unit: int, texts: list[str], wheres: list[str] | None = None
    ) -> dict[str, Any]:
        """Write unit `unit`'s shards; `wheres[i]` ("FILE:LINE") names texts[i] in reports."""
        by_split: dict[str, list[str]] = {s: [] for s in SPLITS}
        for t in texts:
            by_split[
                "validation" if is_validation(t, self.spec.validation_fraction) else "train"
            ].append(t)
        no_tokens: list[str] = []
        record: dict[str, Any] = {"unit": unit, "splits": {}, "dropped": {}}
        if self.decontam is not None:  # training copies of validation documents are dropped
            by_split["train"], record["decontamination"] = self.decontam.filter(by_split["train"])
        for split, docs in by_split.items():
            seqs, n_docs, corpus_tokens, kept = self._sequences(unit, split, docs, no_tokens)
            shard = self._write(split, shard_name(unit), seqs) if len(seqs.offsets) > 1 else None
            record["splits"][split] = {
                "documents": n_docs,
                "corpus_tokens": corpus_tokens,
                "shard": shard,
                **({"key_sentences": kept} if kept is not None else {}),
            }
        if no_tokens:
            record["dropped"] = {"no_tokens": len(no_tokens)}
            where = dict(zip(texts, wheres or ()))
            record["bad_examples"] = [
                {
                    "where": where.get(t, f"work unit {unit}"),
                    "reason": "no_tokens",
                    "detail": f"no token left after the tokenizer's normalisation ({t[:40]!r})",
                }
                for t in no_tokens[:_BAD_EXAMPLES]
            ]
        write_json_atomic(done_record_path(self.out, unit), record)
        return record


_WORKER: _Worker | None = None


def init_worker(spec: WorkerSpec, pooled: bool = True) -> None:
    """Pool initializer: load the tokenizer once per process. Pooled workers encode on one
    thread each (the pool is the parallelism; N workers x N Rust threads would oversubscribe)."""
    global _WORKER
    if pooled:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = _Worker(spec, pooled)


def run_unit(job: tuple[int, list[str], list[str]]) -> dict[str, Any]:
    """Process one work unit (unit number, its documents, where each comes from) in this
    process; returns its record."""
    assert _WORKER is not None, "init_worker was not called"
    unit, texts, wheres = job
    return _WORKER.process(unit, texts, wheres)
