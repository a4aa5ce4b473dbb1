"""A long-document task from the standard library's docstrings: which package a run of
consecutive docstrings comes from, each document many times longer than the sequence.

    python -m benchmarks.tasks.long_doc_tasks --out DIR [--packages asyncio email ...]
        [--per_package 25] [--min_chars 1200] [--max_chars 3000] [--max_length 64]

Writes DIR/stdlib_long.jsonl (``text``, ``label``: the top-level package) and DIR/tasks.json.
A document is the docstrings of one package in its sorted file order (read with ``ast`` by
:mod:`data_prep.domain_text`, nothing imported; a docstring's whitespace collapsed, docstrings
one paragraph each), taken one after another until it holds ``--min_chars`` characters, cut at
the last word before ``--max_chars`` when the last docstring took it over. The package's name is
deleted wherever it appears as a word (case-insensitive: ``asyncio.Future`` -> ``.Future``, "the
email package" -> "the package"), so no single word states the label, least of all in the first
tokens. Each package gives ``--per_package`` documents spread evenly over its file order. At
~4.2 characters a token (all-MiniLM-L6-v2's WordPiece) the documents hold 250-900 tokens (median
311): 4 to 15 times a 64-token sequence. The split keeps 30% of the documents for test
(``test_fraction``: ~58 documents, ~7 per class). Deterministic.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from benchmarks.tasks.pydoc_tasks import _jsonl
from benchmarks.tasks.stdlib_tasks import _collapse, _evenly
from bertforge.cli import ArgumentParser
from bertforge.data_prep.domain_text import docstrings, package_files
from bertforge.files import write_bytes_atomic, write_json_atomic

PACKAGES = ("asyncio", "email", "http", "importlib", "logging", "tkinter", "unittest", "xml")
TASK_NAME = "stdlib_long"
_TEST_DIRS = {"test", "tests", "idle_test"}  # a package's own tests are not its documentation


def _without_name(text: str, package: str) -> str:
    """`text` with `package` deleted wherever it is a word, spaces collapsed."""
    return _collapse(re.sub(rf"\b{re.escape(package)}\b", "", text, flags=re.IGNORECASE))


def package_documents(package: str, min_chars: int, max_chars: int) -> list[str]:
    """The package's docstrings as documents of `min_chars` to `max_chars` characters (see the
    module doc); the rest under `min_chars` at the end is dropped."""
    files = [f for f in package_files(package) if not _TEST_DIRS & set(f.parts)]
    docs = list(dict.fromkeys(_without_name(d, package) for d in docstrings(files)))
    out, current = [], ""
    for doc in (d for d in docs if d):
        current = f"{current}\n\n{doc}" if current else doc
        if len(current) >= min_chars:  # over max_chars: cut at the last word before it
            out.append(
                current if len(current) <= max_chars else current[:max_chars].rsplit(" ", 1)[0]
            )
            current = ""
    return out


def write_tasks(
    out: str | Path,
    packages: tuple[str, ...] | list[str] = PACKAGES,
    per_package: int = 25,
    min_chars: int = 1200,
    max_chars: int = 3000,
    max_length: int = 64,
) -> Path:
    """DIR/stdlib_long.jsonl and DIR/tasks.json; returns the tasks.json path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = {p: package_documents(p, min_chars, max_chars) for p in sorted(packages)}
    short = [p for p, docs in chosen.items() if len(docs) < 2]
    if short:
        raise SystemExit(
            f"error: --packages {' '.join(short)}: fewer than 2 documents of {min_chars}+ "
            "characters; choose larger packages or a smaller --min_chars"
        )
    rows = [
        {"text": d, "label": p} for p, docs in chosen.items() for d in _evenly(docs, per_package)
    ]
    write_bytes_atomic(out / f"{TASK_NAME}.jsonl", _jsonl(rows))
    task = {
        "name": TASK_NAME,
        "type": "classification",
        "train": f"{TASK_NAME}.jsonl",
        "text_column": "text",
        "label_column": "label",
        "max_length": max_length,
        "test_fraction": 0.3,
    }
    write_json_atomic(out / "tasks.json", {"tasks": [task]})
    return out / "tasks.json"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = ArgumentParser(
        prog="python -m benchmarks.tasks.long_doc_tasks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="folder for the task file and tasks.json")
    p.add_argument("--packages", nargs="+", default=list(PACKAGES), help="the classes")
    p.add_argument("--per_package", type=int, default=25, help="documents per package at most")
    p.add_argument("--min_chars", type=int, default=1200, help="characters a document at least")
    p.add_argument("--max_chars", type=int, default=3000, help="characters a document at most")
    p.add_argument("--max_length", type=int, default=64, help="the task's tokens per example")
    a = p.parse_args(argv)
    print(write_tasks(a.out, a.packages, a.per_package, a.min_chars, a.max_chars, a.max_length))
    return 0


if __name__ == "__main__":
    sys.exit(main())
