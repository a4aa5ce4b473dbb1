"""Which standard-library package a docstring comes from: an English domain task whose labels are
true by construction of real text, and the domain corpus that goes with it.

    python -m benchmarks.tasks.stdlib_tasks --out DIR [--packages asyncio email ...]
        [--per_package 60] [--corpus domain.txt]

Writes DIR/stdlib_module.jsonl (``text``: a docstring, whitespace collapsed; ``label``: its
top-level package) and DIR/tasks.json. Docstrings are read with ``ast`` (nothing is imported) by
:mod:`data_prep.domain_text`; those under ``MIN_CHARS`` and those that occur in two packages (their
label would be ambiguous) are left out; each package gives ``--per_package`` docstrings spread
evenly over its sorted file order. ``--corpus FILE`` also writes every other docstring of the
packages, or of ``--corpus_packages`` (the text a user would continue pretraining on), so no
docstring of the task is pretrained on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.tasks.pydoc_tasks import _jsonl
from bertforge.cli import ArgumentParser
from bertforge.data_prep.domain_text import docstrings, package_files
from bertforge.files import write_bytes_atomic, write_json_atomic, write_text_atomic

PACKAGES = (
    "asyncio",
    "email",
    "http",
    "importlib",
    "logging",
    "multiprocessing",
    "unittest",
    "xml",
)
MIN_CHARS = 80
TASK_NAME = "stdlib_module"


def _collapse(text: str) -> str:
    return " ".join(text.split())


def package_docstrings(packages: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
    """{package: its distinct docstrings of MIN_CHARS or more (whitespace collapsed) that no
    other of `packages` has}, in sorted file order."""
    found = {
        p: list(dict.fromkeys(_collapse(d) for d in docstrings(package_files(p)))) for p in packages
    }
    owners: dict[str, set[str]] = {}
    for package, docs in found.items():
        for doc in docs:
            owners.setdefault(doc, set()).add(package)
    return {
        p: [d for d in docs if len(d) >= MIN_CHARS and len(owners[d]) == 1]
        for p, docs in found.items()
    }


def _evenly(items: list[str], n: int) -> list[str]:
    """`n` items spread evenly over `items` (all of them when there are fewer)."""
    if len(items) <= n:
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def write_tasks(
    out: str | Path,
    packages: tuple[str, ...] | list[str] = PACKAGES,
    per_package: int = 60,
    corpus: Path | None = None,
    corpus_packages: tuple[str, ...] | list[str] | None = None,
) -> Path:
    """DIR/stdlib_module.jsonl, DIR/tasks.json and, with `corpus`, the docstrings of
    `corpus_packages` (default: `packages`) without the task's; returns the tasks.json path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    by_package = package_docstrings(packages)
    short = [p for p, docs in by_package.items() if len(docs) < 10]
    if short:
        raise SystemExit(
            f"error: --packages {' '.join(short)}: fewer than 10 docstrings of {MIN_CHARS}+ "
            "characters; choose larger packages"
        )
    chosen = {p: _evenly(docs, per_package) for p, docs in by_package.items()}
    rows = [{"text": d, "label": p} for p in sorted(chosen) for d in chosen[p]]
    write_bytes_atomic(out / f"{TASK_NAME}.jsonl", _jsonl(rows))
    task = {
        "name": TASK_NAME,
        "type": "classification",
        "train": f"{TASK_NAME}.jsonl",
        "text_column": "text",
        "label_column": "label",
        "max_length": 128,
    }
    write_json_atomic(out / "tasks.json", {"tasks": [task]})
    if corpus is not None:
        used = {d for docs in chosen.values() for d in docs}
        names = sorted(corpus_packages or packages)
        rest = [d for p in names for d in docstrings(package_files(p))]
        rest = list(dict.fromkeys(d for d in rest if len(d) >= 40 and _collapse(d) not in used))
        write_text_atomic(corpus, "".join(d + "\n\n" for d in rest))
    return out / "tasks.json"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = ArgumentParser(
        prog="python -m benchmarks.tasks.stdlib_tasks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="folder for the task file and tasks.json")
    p.add_argument("--packages", nargs="+", default=list(PACKAGES), help="the classes")
    p.add_argument("--per_package", type=int, default=60, help="docstrings per package at most")
    p.add_argument("--corpus", type=Path, help="also write the packages' other docstrings here")
    p.add_argument("--corpus_packages", nargs="+", help="the corpus's packages (default: same)")
    args = p.parse_args(argv)
    print(write_tasks(args.out, args.packages, args.per_package, args.corpus, args.corpus_packages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
