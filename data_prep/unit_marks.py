"""Whole-word units and protected-term occurrences made visible in stored sequences (``inspect``).

A sequence is shown token by token; a masking unit of several tokens (from the shards' word-start
bits) is wrapped in ``⟦ ⟧`` and each occurrence of a protected term in ``« »``. A term kept whole
reads ``«hyper ##param ##eter»`` or ``«floating point»``; one the build split over several units
shows where each further unit starts with ``¦``: ``«floating ¦point»``, the sign that the
lexicon did not match that occurrence (whole-word masking may take "floating" without "point").

An occurrence is the term's own token ids (tokenized alone) at a position where the next token
does not continue the word (a ``##`` piece): "data" does not occur inside "database". It is
*whole* when it starts a unit and no unit starts inside it, which is what whole-word masking
needs. The build matches terms on the text (case-insensitively when the tokenizer lowercases);
counting on tokens finds the same occurrences wherever the term's tokenization does not depend
on its neighbours (WordPiece splits words on whitespace and punctuation first).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data_prep.wordstart import read_protected_terms

UNIT_OPEN, UNIT_CLOSE = "⟦", "⟧"
TERM_OPEN, TERM_CLOSE = "«", "»"
UNIT_SPLIT = "¦"  # a unit starts inside a term occurrence: the term is not kept whole


class TermMatcher:
    """Finds protected-term occurrences in token id sequences."""

    def __init__(self, terms: list[str], tokenizer) -> None:
        self.terms = terms
        self.ids = [
            np.array(tokenizer.encode(t, add_special_tokens=False).ids, dtype=np.int64)
            for t in terms
        ]
        vocab = tokenizer.get_vocab()
        self.continuation = np.zeros(max(vocab.values()) + 1, dtype=bool)
        for tok, i in vocab.items():
            self.continuation[i] = tok.startswith("##")
        self.by_first: dict[int, list[int]] = {}
        for k, ids in enumerate(self.ids):
            if len(ids):
                self.by_first.setdefault(int(ids[0]), []).append(k)
        self._firsts = np.array(sorted(self.by_first), dtype=np.int64)

    def find(self, ids: np.ndarray) -> list[tuple[int, int, int]]:
        """(term index, start, end) of each occurrence in ``ids``; the longest term wins."""
        out: list[tuple[int, int, int]] = []
        n, covered = len(ids), -1
        for i in np.nonzero(np.isin(ids, self._firsts))[0]:
            if i < covered:
                continue
            best = None
            for k in self.by_first[int(ids[i])]:
                t = self.ids[k]
                j = i + len(t)
                if (
                    j <= n
                    and np.array_equal(ids[i:j], t)
                    and (j == n or not self.continuation[ids[j]])
                ):
                    if best is None or len(t) > best[2] - best[1]:
                        best = (k, int(i), int(j))
            if best is not None:
                out.append(best)
                covered = best[2]
        return out


def is_whole(word_start: np.ndarray, start: int, end: int) -> bool:
    """True when [start, end) is exactly one masking unit's start with no unit starting inside."""
    return bool(word_start[start]) and not word_start[start + 1 : end].any()


def mark_tokens(
    tokens: list[str], word_start: np.ndarray, occurrences: list[tuple[int, int, int]]
) -> str:
    """``tokens`` joined with units in ``⟦ ⟧`` and term occurrences in ``« »``."""
    n = len(tokens)
    pre, post = [""] * n, [""] * n
    exact = {(a, b) for _, a, b in occurrences}
    a = 0
    while a < n:
        b = a + 1
        while b < n and not word_start[b]:
            b += 1
        if b - a > 1 and (a, b) not in exact:
            pre[a], post[b - 1] = UNIT_OPEN, UNIT_CLOSE
        a = b
    for _, s, e in occurrences:
        pre[s] = TERM_OPEN + pre[s]
        post[e - 1] += TERM_CLOSE
        for i in range(s + 1, e):
            if word_start[i]:
                pre[i] = UNIT_SPLIT + pre[i]
    return " ".join(f"{p}{t}{q}" for p, t, q in zip(pre, tokens, post))


def terms_hash(terms: list[str]) -> str:
    """The build key's fingerprint of a protected-terms list (data_prep.build)."""
    return hashlib.sha256("\n".join(terms).encode()).hexdigest()


def count_terms(
    matcher: TermMatcher, readers: dict[str, Any], max_sequences: int
) -> dict[str, Any]:
    """Occurrences and whole occurrences of each term over the first ``max_sequences`` of each
    split; terms never found are listed so a lexicon that did not match shows at once."""
    counts = {t: {"occurrences": 0, "whole": 0} for t in matcher.terms}
    scanned = {}
    for split, reader in readers.items():
        m = min(len(reader), max_sequences)
        for i in range(m):
            s = reader[i]
            ids = s.input_ids.astype(np.int64)
            for k, a, b in matcher.find(ids):
                c = counts[matcher.terms[k]]
                c["occurrences"] += 1
                c["whole"] += is_whole(s.word_start, a, b)
        scanned[split] = m
    return {
        "scanned_sequences": scanned,
        "terms": counts,
        "not_found": [t for t, c in counts.items() if c["occurrences"] == 0],
    }


def resolve_terms_file(
    root: Path, manifest: dict[str, Any], given: Path | None
) -> tuple[Path | None, str | None]:
    """The protected-terms file to use (``given``, else the build's own ``--protected_terms`` if
    it is still there) and a warning when it is missing or differs from the one built with."""
    built_hash = manifest.get("build_key", {}).get("protected_terms")
    path = given
    if path is None:
        recorded = (manifest.get("args") or {}).get("protected_terms")
        if not recorded:
            return None, None
        path = Path(recorded)
        if not path.is_file():
            return None, (
                f"{root}: built with --protected_terms {recorded}, which is no longer "
                "there; give it with --protected_terms to count its terms"
            )

    terms = read_protected_terms(path)
    if built_hash and terms_hash(terms) != built_hash:
        return path, (
            f"{path} differs from the protected terms {root} was built with: the "
            "counts show how this file's terms were treated by that build"
        )
    if not built_hash:
        return path, (
            f"{root} was built without protected terms: no term is kept whole by the "
            "build; the counts show where this file's terms occur"
        )
    return path, None
