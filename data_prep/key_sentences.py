"""Key sentences (`data_prep build --key_sentences R`): a document longer than the sequence length
keeps the share R of its sentences, chosen by TextRank and kept in document order.

TextRank (Mihalcea & Tarau, 2004, section 4) ranks a document's sentences by PageRank over a graph
whose nodes are the sentences and whose edge weights are their overlap: |words in both| /
(log |S_i| + log |S_j|), |S| the sentence's length in words (0 where the denominator is 0, as
gensim's and summa's implementations do). Words are lower-cased `\\w+` runs; in text with CJK
characters, rjieba's words (the segmenter the build already uses for word starts) without the
punctuation. The top ceil(R * n) sentences (at least 1) are kept, ties going to the earlier
sentence; the result is deterministic.

Library: none beyond numpy (and scipy for very long documents). PageRank here is networkx's (same
damping, dangling sentences and fixed point), computed in a few lines: for most documents the
similarity is a dense numpy matrix and the fixed point one linear solve; when sentences x distinct
words exceeds _DENSE_CELLS the matrix is scipy sparse (one sparse product counts the common words
of every pair) and the fixed point comes by power iteration. `networkx.pagerank` itself
(maintained, installed with torch) gives the same scores but needs the graph as networkx's Python
dicts first, which made it 23x slower on the pydoc topics than the same iteration on a scipy matrix
(2.26 s against 0.10 s for 4,307 sentences; English sentences share "the" and "a", so the graphs
are nearly complete): it is the tests' oracle instead. The TextRank packages were not taken: sumy
pulls nltk, requests and lxml and splits sentences with nltk's punkt data (a download); summa and
textrank4zh are unmaintained; pytextrank needs spaCy and its models.

Sentences (:func:`split_sentences`): spans that cover the text end to end, each with the
whitespace after it, so that the kept spans joined give the document without the others.
- English: after `.`, `!` or `?` (closing quotes or brackets kept with the sentence) followed by
  whitespace and an upper-case letter, a digit or an opening quote or bracket; not after a
  single letter (an initial) or a few common abbreviations (Mr., Dr., e.g., ...);
- Chinese: after 。！？； (and the half-width ｡), closing quotes 」”』’ and brackets ）》 kept with
  the sentence, whatever follows;
- a blank line always ends a sentence (a paragraph).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from bertforge.data_prep.wordstart import _CJK_RE

METHOD = "textrank-mihalcea-tarau/pagerank-0.85"  # recorded in the build key
DAMPING = 0.85
_DENSE_CELLS = 1 << 21  # sentences x distinct words up to which the similarity is a numpy array

_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs etc e.g i.e cf fig no vol ch sec approx"
    " jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_OPENERS = "\"'“‘([«"
_EN_END = re.compile(r"[.!?]+[\"'”’)\]»]*(\s+)")
_ZH_END = re.compile(r"[。｡！？；]+[」”』’）》]*\s*")
_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_WORD = re.compile(r"\w+")
_LAST_WORD = re.compile(r"(\S+)\.$")


def _english_end(text: str, m: re.Match) -> bool:
    """Whether the match of _EN_END ends an English sentence (see the module docstring)."""
    nxt = text[m.end()] if m.end() < len(text) else ""
    if not (nxt.isupper() or nxt.isdigit() or nxt in _OPENERS):
        return False
    head = text[: m.start(1)]
    if not head.endswith("."):
        return True
    word = _LAST_WORD.search(head[-24:])
    if word is None:
        return True
    w = word.group(1).lstrip(_OPENERS).lower()
    return not ((len(w) == 1 and w.isalpha()) or w in _ABBREVIATIONS)


def split_sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of `text`'s sentences, back to back from 0 to len(text)."""
    cuts = {m.end() for m in _PARAGRAPH.finditer(text)}
    cuts.update(m.end() for m in _ZH_END.finditer(text))
    cuts.update(m.end() for m in _EN_END.finditer(text) if _english_end(text, m))
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(text)), len(text)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if a < b] or [(0, len(text))]


def sentences(text: str) -> list[str]:
    """`text`'s sentences (:func:`split_sentences`), each stripped."""
    return [text[a:b].strip() for a, b in split_sentences(text)]


_JIEBA = None


def sentence_words(sentence: str) -> list[str]:
    """The words the similarity counts: lower-cased `\\w+` runs, rjieba words in CJK text."""
    global _JIEBA
    sentence = sentence.lower()
    if not _CJK_RE.search(sentence):
        return _WORD.findall(sentence)
    if _JIEBA is None:
        import rjieba  # Lazy: its dictionary loads on import, only for CJK text.

        _JIEBA = rjieba
    return [w for w in _JIEBA.cut(sentence) if _WORD.search(w)]


def similarity(words: list[list[str]]):
    """The sentences' TextRank similarity (zero diagonal): a numpy array when the sentence-word
    incidence has at most _DENSE_CELLS cells (most documents), else a scipy sparse matrix."""
    vocab: dict[str, int] = {}
    rows, cols = [], []
    for i, ws in enumerate(words):
        for w in set(ws):
            rows.append(i)
            cols.append(vocab.setdefault(w, len(vocab)))
    n = len(words)
    logs = np.log(np.maximum([len(ws) for ws in words], 1))
    if n * len(vocab) <= _DENSE_CELLS:
        incidence = np.zeros((n, len(vocab)))
        incidence[rows, cols] = 1.0
        common = incidence @ incidence.T  # |words in both| for every pair
        denom = logs[:, None] + logs[None, :]
        weights = np.divide(common, denom, out=np.zeros_like(common), where=denom > 0)
        np.fill_diagonal(weights, 0.0)
        return weights
    from scipy import sparse  # Lazy: a long document only (0.3 s to import in each worker)

    incidence = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, len(vocab)))
    common = (incidence @ incidence.T).tocoo()
    denom = logs[common.row] + logs[common.col]
    keep = (common.row != common.col) & (denom > 0)
    r, c = common.row[keep], common.col[keep]
    return sparse.csr_matrix((common.data[keep] / denom[keep], (r, c)), shape=(n, n))


def textrank(weights, tol: float = 1e-12, max_iter: int = 1000) -> np.ndarray:
    """PageRank scores (damping d = 0.85, summing to 1) over a symmetric weight matrix: the
    fixed point of x = d * (P^T x + dangling mass / n) + (1 - d) / n, P the row-normalised
    weights, a sentence sharing no word (dangling) spreading its rank evenly, as
    networkx.pagerank. A numpy matrix is solved exactly (one n x n linear solve); a scipy sparse
    one by power iteration until the L1 change is below n * tol (networkx's stopping rule)."""
    n = weights.shape[0]
    out = np.asarray(weights.sum(axis=1)).ravel()
    dangling = out == 0
    scale = (1.0 / np.where(dangling, 1.0, out))[:, None]
    if isinstance(weights, np.ndarray):
        step = (weights * scale).T + dangling[None, :] / n  # column-stochastic
        x = np.linalg.solve(np.eye(n) - DAMPING * step, np.full(n, (1.0 - DAMPING) / n))
        return x / x.sum()
    transition = weights.multiply(scale).T.tocsr()
    x = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        new = DAMPING * (transition @ x + x[dangling].sum() / n) + (1.0 - DAMPING) / n
        done = np.abs(new - x).sum() < n * tol
        x = new
        if done:
            break
    return x


def rank_order(scores: np.ndarray) -> list[int]:
    """Indices from the highest score to the lowest, ties to the earlier one. Scores are rounded
    to 9 significant digits first, so that float noise is no rank."""
    n = len(scores)
    rounded = np.round(np.asarray(scores, dtype=np.float64) * n, 9)
    return sorted(range(n), key=lambda i: (-rounded[i], i))


def top_share(scores: np.ndarray, share: float) -> list[int]:
    """Indices of the ceil(share * n) (at least 1) highest scores (:func:`rank_order`), in
    order."""
    n = len(scores)
    k = min(n, max(1, math.ceil(share * n - 1e-9)))
    return sorted(rank_order(scores)[:k])


@dataclass
class KeptCounts:
    """What selection did to the documents over the length (summed over a split or a build)."""

    documents_over_length: int = 0  # documents longer than max_seq_len tokens
    documents_shortened: int = 0  # of those, the ones that lost a sentence
    sentences_before: int = 0  # sentences of the shortened documents
    sentences_kept: int = 0
    tokens_before: int = 0  # tokens of the shortened documents
    tokens_kept: int = 0

    def add(self, other: dict) -> None:
        for k, v in other.items():
            setattr(self, k, getattr(self, k) + v)


def _keep_count(n: int, share: float) -> int:
    return min(n, max(1, math.ceil(share * n - 1e-9)))  # 0.3 * 10 is 3.0000000000000004


def key_spans(text: str, share: float) -> tuple[list[tuple[int, int]], int]:
    """The spans of `text`'s key sentences in document order, and its number of sentences (all
    the spans, unranked, when every sentence is kept)."""
    spans = split_sentences(text)
    n = len(spans)
    if _keep_count(n, share) == n:
        return spans, n
    scores = textrank(similarity([sentence_words(text[a:b]) for a, b in spans]))
    return [spans[i] for i in top_share(scores, share)], n


def joined(text: str, spans: list[tuple[int, int]]) -> str:
    """The text of `spans` back to back (each keeps the whitespace after it), right-stripped."""
    return "".join(text[a:b] for a, b in spans).rstrip()


def select(text: str, share: float) -> tuple[str, int, int]:
    """(the text of `text`'s key sentences in document order, sentences before, kept). The
    text is `text` itself when every sentence is kept."""
    spans, n = key_spans(text, share)
    return (text if len(spans) == n else joined(text, spans)), n, len(spans)


def cut_tokens(
    ids: np.ndarray, word_start: np.ndarray, offsets: np.ndarray, spans: list[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A document's tokens (ids, word-start bits, character offsets [n, 2]) restricted to the
    sentences `spans`, with the offsets moved into :func:`joined`'s text and the first token of
    each span starting a word. For a tokenizer whose tokens end at whitespace and punctuation
    (BERT's WordPiece, CJK characters alone) this is what encoding the joined text gives, without
    encoding it again."""
    starts = offsets[:, 0]
    keep = np.zeros(len(ids), dtype=bool)
    shift = np.zeros(len(ids), dtype=np.int64)
    ws = word_start.copy()
    pos = 0
    for a, b in spans:
        inside = (starts >= a) & (starts < b)
        keep |= inside
        shift[inside] = pos - a
        first = np.flatnonzero(inside)[:1]
        ws[first] = True
        pos += b - a
    return ids[keep], ws[keep], offsets[keep] + shift[keep][:, None]
