"""Word-start bits for whole-word masking: one bool per token, True where a masking unit starts.

- Space-delimited text: a WordPiece `##` continuation piece continues the word before it.
- Chinese: BERT splits every CJK character into its own token, so words come from a real word
  segmenter (rjieba, Rust jieba) run on the document: a CJK token starts a unit only where the
  segmenter starts a word.
- Protected terms (domain terms, English multi-word or Chinese): every occurrence is one unit.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from bertforge.errors import UserError

# The CJK Unicode blocks BERT treats as Chinese characters (BasicTokenizer._is_chinese_char).
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
_CJK_RE = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in _CJK_RANGES) + "]")


class ProtectedTermsError(UserError, ValueError):
    """A protected-terms file that cannot be used; the message names the file and line."""


def read_protected_terms(path: Path) -> list[str]:
    """Terms from a UTF-8 file, one per line (blank lines ignored; inner whitespace collapsed)."""
    if not path.is_file():
        raise ProtectedTermsError(f"--protected_terms {path} does not exist.")
    terms = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ProtectedTermsError(
                    f"{path}:{lineno}: not UTF-8 ({e.reason}); save the file as UTF-8."
                ) from e
            term = " ".join(line.split())
            if term:
                terms.append(term)
    if not terms:
        raise ProtectedTermsError(f"--protected_terms {path} holds no term (one per line).")
    return sorted(set(terms))


def _term_pattern(term: str) -> str:
    body = r"\s+".join(re.escape(w) for w in term.split(" "))
    # Latin-script terms match whole words only ("data" must not match inside "database").
    head = r"(?<![0-9A-Za-z])" if term[0].isascii() and term[0].isalnum() else ""
    tail = r"(?![0-9A-Za-z])" if term[-1].isascii() and term[-1].isalnum() else ""
    return head + body + tail


def _cjk_codepoints(text: str) -> np.ndarray:
    """Boolean per character of `text`: True for a CJK character."""
    cp = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    mask = np.zeros(cp.shape, dtype=bool)
    for a, b in _CJK_RANGES:
        mask |= (cp >= a) & (cp <= b)
    return mask


class WordStarts:
    """Computes the word-start bits of one document's tokens."""

    def __init__(
        self,
        continuation: np.ndarray,
        protected_terms: list[str] | None = None,
        lowercase: bool = True,
    ):
        self.continuation = continuation  # bool per vocabulary id: `##` piece
        self.terms = None
        if protected_terms:
            # Longest first, so that the longest overlapping term wins.
            alternatives = sorted(protected_terms, key=len, reverse=True)
            self.terms = re.compile(
                "|".join(_term_pattern(t) for t in alternatives), re.IGNORECASE if lowercase else 0
            )
        self._jieba = None

    def needs_offsets(self, text: str) -> bool:
        """True when the document's bits depend on character offsets (Chinese, terms)."""
        return bool(_CJK_RE.search(text)) or bool(self.terms and self.terms.search(text))

    def _segment_starts(self, text: str) -> np.ndarray:
        if self._jieba is None:
            # Lazy: rjieba (its dictionary loads on import) only for CJK text.
            import rjieba

            self._jieba = rjieba
        starts = np.zeros(len(text) + 1, dtype=bool)
        for _, s, _ in self._jieba.tokenize(text):
            starts[s] = True
        return starts

    def compute(self, text: str, ids: np.ndarray, offsets: np.ndarray | None) -> np.ndarray:
        """Bits for `ids` (the document's tokens, no specials); `offsets` [n, 2] char spans are
        required when `needs_offsets(text)`."""
        ws = ~self.continuation[ids]
        if offsets is None or len(ids) == 0:
            return ws
        starts = offsets[:, 0]
        cjk_chars = _cjk_codepoints(text)
        if cjk_chars.any():
            safe = np.minimum(starts, len(text) - 1)
            cjk_tok = cjk_chars[safe] & (offsets[:, 1] - offsets[:, 0] == 1)
            if cjk_tok.any():
                word_start_char = self._segment_starts(text)
                ws[cjk_tok] = word_start_char[starts[cjk_tok]]
        else:
            cjk_tok = np.zeros(len(ids), dtype=bool)
        if self.terms is not None:
            for m in self.terms.finditer(text):
                i0 = int(np.searchsorted(starts, m.start(), side="left"))
                i1 = int(np.searchsorted(starts, m.end(), side="left"))
                if i0 >= i1:
                    continue
                ws[i0] = True
                ws[i0 + 1 : i1] = False
                # A term ending inside a segmenter word: what follows starts a new unit.
                if i1 < len(ids) and cjk_tok[i1]:
                    ws[i1] = True
        return ws
