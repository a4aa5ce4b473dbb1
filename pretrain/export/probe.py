"""The text the export's check predicts on: by default a passage of the run's own held-out data,
so that a Chinese, legal or medical model is probed in its language and domain (before, every
export was probed on one English sentence about functions); ``--probe_text`` gives another.

- :func:`held_out_text`: a passage of the run's first data source's validation split (else its
  training split): of the first :data:`CANDIDATES` sequences, the first document of each cut to
  :data:`PROBE_PIECES` word pieces that start on a whole word, the one most of whose pieces are
  words (not punctuation or markup), decoded to text (CJK characters joined without the spaces
  WordPiece's decoder puts between them). A run whose data is not readable here (a
  folder moved away) falls back to :data:`FALLBACK_TEXT` and says so in the report.
- :func:`mask_one_word`: the text with one word of a single word piece, the nearest to the
  middle, replaced by the tokenizer's mask token, and that word (what fill-mask should find).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.data_prep.reader import ShardError, ShardReader
from bertforge.data_prep.sources import parse_mixture
from bertforge.pretrain.run_folder.run_checkpoints import CheckpointError

#: the probe when the run's data cannot be read (and the tests' sentence before held-out text)
FALLBACK_TEXT = "The function returns a list of values."
#: word pieces of held-out text in a probe: a sentence or two, one report line
PROBE_PIECES = 24
#: held-out sequences a probe is chosen from
CANDIDATES = 16
# between two CJK characters or full-width marks, a decoded space is the decoder's, not the text's
_CJK_SPACE = re.compile(
    r"(?<=[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef\u3000-\u303f])\s+"
    r"(?=[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef\u3000-\u303f])"
)


@dataclass(frozen=True)
class ProbeText:
    text: str
    source: str  # for the report: "held-out text of DATA", "--probe_text", or why the fallback


def held_out_text(state: dict[str, Any], tokenizer) -> ProbeText:
    """A passage of the run's held-out data (``state``: a checkpoint's trainer state) decoded
    with ``tokenizer`` (the run's), or :data:`FALLBACK_TEXT` with the reason."""
    run_cfg = state.get("config", {}).get("run", {})
    sources = run_cfg.get("data_sources") or [run_cfg.get("data")]  # "data": before mixtures
    data = parse_mixture(sources)[0].path if sources and sources[0] else None
    if not data or not Path(data, "manifest.json").is_file():
        why = f"the run's data {data} is not readable here" if data else "the run names no data"
        return ProbeText(FALLBACK_TEXT, f"a fixed sentence: {why}")
    for split in ("validation", "train"):
        try:
            reader = ShardReader(data, split, verify="none")
        except ShardError:  # a split the build has not got
            continue
        passages = []
        for i in range(min(len(reader), CANDIDATES)):
            ids = _passage(reader[i].input_ids.tolist(), reader[i].word_start.tolist(), reader)
            pieces = tokenizer.convert_ids_to_tokens(ids)
            words = sum(any(c.isalnum() for c in p) for p in pieces)
            passages.append((words / max(len(pieces), 1), -i, ids))
        if passages:
            text = tokenizer.decode(max(passages)[2], skip_special_tokens=True)
            text = _CJK_SPACE.sub("", text).strip()
            if text:
                return ProbeText(text, f"{split} text of {data}")
    return ProbeText(FALLBACK_TEXT, f"a fixed sentence: {data} holds no sequence")


def _passage(ids: list[int], word_start: list[bool], reader: ShardReader) -> list[int]:
    """Up to PROBE_PIECES pieces of the first document of a stored sequence ([CLS] ... [SEP]),
    from its first whole-word start to the last one that keeps the passage within bounds."""
    special = set(reader.special_tokens.values())
    body = []
    for token, starts in zip(ids[1:], word_start[1:], strict=True):
        if token in special:  # [SEP]: the first document ends here
            break
        body.append((token, starts))
    first = next((i for i, (_, starts) in enumerate(body) if starts), 0)
    body = body[first:]
    if len(body) > PROBE_PIECES:
        ends = [i for i, (_, starts) in enumerate(body[: PROBE_PIECES + 1]) if starts and i]
        body = body[: ends[-1] if ends else PROBE_PIECES]
    return [token for token, _ in body]


def mask_one_word(tokenizer, text: str) -> tuple[str, str]:
    """(``text`` with one single-piece word replaced by the mask token, that word): of the words
    that are one piece and hold a letter or digit, the one nearest the middle."""
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    words = enc.word_ids()
    pieces = {}
    for i, w in enumerate(words):
        if w is not None:
            pieces.setdefault(w, []).append(i)
    single = [ix[0] for ix in pieces.values() if len(ix) == 1]
    single = [i for i in single if any(c.isalnum() for c in _span(text, enc, i))]
    if not single:
        raise CheckpointError(
            f"no word of {text!r} is a single piece of this tokenizer to mask; give "
            "--probe_text a sentence with a common word"
        )
    middle = len(words) / 2
    at = min(single, key=lambda i: abs(i - middle))
    start, end = enc["offset_mapping"][at]
    return text[:start] + tokenizer.mask_token + text[end:], text[start:end]


def _span(text: str, enc, i: int) -> str:
    start, end = enc["offset_mapping"][i]
    return text[start:end]
