"""Near-duplicate detection across the train/validation boundary (MinHash + LSH, `datasketch`).

A document is the set of its shingles: runs of SHINGLE consecutive words, where a word is a run of
letters/digits or a single CJK character (so Chinese, which has no spaces, is shingled by
characters and English by words). Text is normalised first (NFKD, combining marks removed,
casefolded), so a cased and an uncased tokenizer's decoded text shingle alike. Each document gets
a MinHash signature of NUM_PERM 32-bit values; `datasketch.MinHashLSH` finds candidate pairs whose
estimated Jaccard similarity may exceed the threshold, and a candidate counts when its estimated
similarity (the share of equal signature values) really does.

`build` uses it to drop training documents that near-duplicate a validation document (the index
of the validation documents is built once, before the work units, and saved under OUT/.work);
`check-overlap A B` uses it on two finished builds by decoding their sequences (see
`overlap_report`).
"""

from __future__ import annotations

import pickle
import re
import unicodedata
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertforge.files import write_bytes_atomic

NUM_PERM = 128  # signature length: the standard error of a Jaccard estimate is ~0.04 at 0.5
SHINGLE = 5  # words (or CJK characters) per shingle
SEED = 1  # datasketch permutation seed: fixed, so signatures of two builds are comparable
_WORD = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]|[^\W_]+")
_MASK32 = np.uint64(0xFFFFFFFF)
# The combining-mark blocks (accents left by NFKD): diacritics, extended, supplement, symbols, half.
_COMBINING = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")


def normalise(text: str) -> str:
    """NFKD, combining marks removed, casefolded: what shingling sees."""
    if text.isascii():
        return text.lower()
    return _COMBINING.sub("", unicodedata.normalize("NFKD", text)).casefold()


def shingle_hashes(text: str, k: int = SHINGLE) -> np.ndarray:
    """Unique 32-bit hashes of the document's k-word shingles (one shingle for shorter texts)."""
    words = _WORD.findall(normalise(text))
    if not words:
        return np.zeros(0, dtype=np.uint64)
    h = np.fromiter(map(zlib.crc32, map(str.encode, words)), dtype=np.uint64, count=len(words))
    k = min(k, len(h))
    acc = np.zeros(len(h) - k + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):  # a polynomial hash of each window of k word hashes
            acc = acc * np.uint64(0x100000001B3) + h[j : len(h) - k + 1 + j]
        acc ^= acc >> np.uint64(29)
        acc *= np.uint64(0xBF58476D1CE4E5B9)
        acc ^= acc >> np.uint64(32)
    return np.unique(acc & _MASK32)


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer, which datasketch applies before its permutations."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


class Signer:
    """MinHash signatures equal to datasketch's MinHash (scheme affine32) updated with the
    shingle hashes, computed in one numpy pass per document instead of a MinHash object each
    (tests/data_prep/test_decontam.py checks the equality)."""

    def __init__(self, num_perm: int = NUM_PERM, seed: int = SEED):
        # Imports inside functions here: datasketch (two seconds to import), only when a build
        # decontaminates or checks overlap.
        from datasketch import MinHash

        proto = MinHash(num_perm=num_perm, seed=seed, scheme="affine32")
        self.num_perm, self.seed, self.scheme = num_perm, seed, proto.scheme
        a, b = (np.asarray(x, dtype=np.uint32) for x in proto.permutations)
        self._a, self._b = a[None, :], b[None, :]
        self._empty = np.asarray(proto.hashvalues, dtype=np.uint32)

    def signature(self, text: str) -> np.ndarray:
        """uint32 [num_perm]: the MinHash values of the text's shingle set."""
        hv = shingle_hashes(text)
        if not len(hv):
            return self._empty.copy()
        with np.errstate(over="ignore"):
            mixed = _fmix32(hv.astype(np.uint32))[:, None]
            return (mixed * self._a + self._b).min(axis=0)

    def lean(self, sig: np.ndarray):
        """A datasketch LeanMinHash over a signature (what MinHashLSH stores and queries)."""
        # Lazy: datasketch (see NearDuplicateIndex.__init__).
        from datasketch import LeanMinHash

        return LeanMinHash(seed=self.seed, hashvalues=sig, scheme=self.scheme)


@dataclass
class NearDuplicateIndex:
    """Signatures of a set of reference documents and their LSH index."""

    threshold: float
    signatures: np.ndarray  # [n, num_perm] (datasketch's hash dtype)
    previews: list[str]  # the first 80 characters of each reference document
    lsh: object  # datasketch.MinHashLSH, keys = row numbers

    @classmethod
    def build(cls, texts: Iterable[str], threshold: float, signer: Signer) -> NearDuplicateIndex:
        """Index every text of `texts` (streamed)."""
        # Lazy: datasketch (see NearDuplicateIndex.__init__).
        from datasketch import MinHashLSH

        lsh = MinHashLSH(threshold=threshold, num_perm=signer.num_perm)
        sigs, previews = [], []
        for text in texts:
            sig = signer.signature(text)
            lsh.insert(len(sigs), signer.lean(sig), check_duplication=False)
            sigs.append(sig)
            previews.append(text[:80])
        array = np.array(sigs).reshape(-1, signer.num_perm)
        return cls(threshold, array, previews, lsh)

    def __len__(self) -> int:
        return len(self.signatures)

    def match(self, sig: np.ndarray, signer: Signer) -> tuple[int, float] | None:
        """(row, estimated Jaccard) of the most similar indexed document at or above the
        threshold, or None."""
        if not len(self.signatures):
            return None
        rows = self.lsh.query(signer.lean(sig))
        if not rows:
            return None
        rows = np.array(sorted(rows), dtype=np.int64)
        sim = (self.signatures[rows] == sig[None, :]).mean(axis=1)
        best = int(np.argmax(sim))
        return (int(rows[best]), float(sim[best])) if sim[best] >= self.threshold else None

    def save(self, path: Path) -> None:
        """Pickle next to the build (written under a temporary name, then renamed)."""
        write_bytes_atomic(path, pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))

    @staticmethod
    def load(path: Path) -> NearDuplicateIndex:
        """The index `save` wrote."""
        with open(path, "rb") as f:
            return pickle.load(f)


class Decontaminator:
    """Per worker: is a training document a near-duplicate of a validation document?"""

    def __init__(self, index_path: Path, max_examples: int = 3):
        self.index = NearDuplicateIndex.load(index_path)
        self.signer = Signer(self.index.signatures.shape[1] if len(self.index) else NUM_PERM)
        self.max_examples = max_examples

    def filter(self, texts: list[str]) -> tuple[list[str], dict]:
        """The texts that are not near-duplicates, and counts + a few examples of the others."""
        kept, examples, dropped_chars = [], [], 0
        for t in texts:
            hit = self.index.match(self.signer.signature(t), self.signer)
            if hit is None:
                kept.append(t)
                continue
            dropped_chars += len(t)
            if len(examples) < self.max_examples:
                examples.append(
                    {
                        "train": t[:80],
                        "validation": self.index.previews[hit[0]],
                        "jaccard": round(hit[1], 3),
                    }
                )
        stats = {
            "checked": len(texts),
            "dropped": len(texts) - len(kept),
            "dropped_characters": dropped_chars,
            "examples": examples,
        }
        return kept, stats


def sum_stats(parts: Iterable[dict], max_examples: int = 10) -> dict:
    """Totals of several `Decontaminator.filter` stats (examples: the first `max_examples`)."""
    total = {"checked": 0, "dropped": 0, "dropped_characters": 0, "examples": []}
    for p in parts:
        for k in ("checked", "dropped", "dropped_characters"):
            total[k] += int(p[k])
        total["examples"].extend(p["examples"][: max_examples - len(total["examples"])])
    return total
