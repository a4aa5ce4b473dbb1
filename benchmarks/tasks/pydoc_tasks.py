"""English tasks whose labels are true by construction, from the pydoc topic pages of CPython.

    python -m benchmarks.tasks.pydoc_tasks --out DIR [--topics 8] [--per_topic 40]

Writes DIR/pydoc_topic.jsonl (``text``, ``label``: which topic page a paragraph comes from, among
the ``--topics`` pages with the most paragraphs), DIR/pydoc_same_topic.jsonl (``text_a``,
``text_b``, ``label`` "same" or "different": whether two paragraphs come from the same page, half
of each) and DIR/tasks.json describing both. Paragraphs are the pages' blank-line-separated blocks
of at least 80 characters, whitespace collapsed; the selection is deterministic.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from bertforge.cli import ArgumentParser
from bertforge.files import write_bytes_atomic, write_json_atomic

MIN_CHARS = 80


def topic_paragraphs(topics: int = 8, per_topic: int = 40) -> dict[str, list[str]]:
    """The first ``per_topic`` paragraphs of the ``topics`` pages with the most paragraphs."""
    from pydoc_data.topics import topics as pages

    paragraphs = {}
    for key in sorted(pages):
        blocks = [" ".join(b.split()) for b in pages[key].split("\n\n")]
        paragraphs[key] = list(dict.fromkeys(b for b in blocks if len(b) >= MIN_CHARS))
    largest = sorted(paragraphs, key=lambda k: (-len(paragraphs[k]), k))[:topics]
    return {k: paragraphs[k][:per_topic] for k in sorted(largest)}


def same_topic_pairs(paragraphs: dict[str, list[str]], seed: int = 0) -> list[dict[str, str]]:
    """One pair per paragraph: alternately with another of its page or of another page."""
    rng = random.Random(seed)
    keys = sorted(paragraphs)
    pairs = []
    for n, (key, text) in enumerate((k, t) for k in keys for t in paragraphs[k]):
        if n % 2 == 0 and len(paragraphs[key]) > 1:
            other = rng.choice([t for t in paragraphs[key] if t != text])
            label = "same"
        else:
            other = rng.choice(paragraphs[rng.choice([k for k in keys if k != key])])
            label = "different"
        pairs.append({"text_a": text, "text_b": other, "label": label})
    return pairs


def _jsonl(rows: list[dict[str, str]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def write_tasks(out: str | Path, topics: int = 8, per_topic: int = 40) -> Path:
    """Write both task files and DIR/tasks.json; returns the tasks.json path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paragraphs = topic_paragraphs(topics, per_topic)
    rows = [{"text": t, "label": k} for k in sorted(paragraphs) for t in paragraphs[k]]
    write_bytes_atomic(out / "pydoc_topic.jsonl", _jsonl(rows))
    write_bytes_atomic(out / "pydoc_same_topic.jsonl", _jsonl(same_topic_pairs(paragraphs)))
    tasks = {
        "tasks": [
            {
                "name": "pydoc_topic",
                "type": "classification",
                "train": "pydoc_topic.jsonl",
                "text_column": "text",
                "label_column": "label",
                "max_length": 128,
            },
            {
                "name": "pydoc_same_topic",
                "type": "classification",
                "train": "pydoc_same_topic.jsonl",
                "text_column": "text_a",
                "text_pair_column": "text_b",
                "label_column": "label",
                "max_length": 256,
            },
        ]
    }
    write_json_atomic(out / "tasks.json", tasks)
    return out / "tasks.json"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = ArgumentParser(
        prog="python -m benchmarks.tasks.pydoc_tasks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True)
    p.add_argument("--topics", type=int, default=8, help="number of topic pages (classes)")
    p.add_argument("--per_topic", type=int, default=40, help="paragraphs per page at most")
    args = p.parse_args(argv)
    print(write_tasks(args.out, args.topics, args.per_topic))
    return 0


if __name__ == "__main__":
    sys.exit(main())
