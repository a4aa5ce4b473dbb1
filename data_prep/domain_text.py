"""A domain corpus that ships with Python: the docstrings of some standard-library packages.

    python -m data_prep.domain_text --packages email http urllib --output domain.txt

The README's continued-pretraining recipe and experiments.continued use it as the
"domain" next to the demo's general corpus (the pydoc topic pages): email, HTTP and URL handling
have their own vocabulary (MIME, multipart, charset, header, payload, ...), written by the same
kind of authors. The contract:
- sources are read with `ast` (nothing is imported, so no package code runs); each module,
  class and function docstring is one document, with its blank lines dropped (documents are
  separated by one blank line, the `data_prep build` text format);
- docstrings shorter than --min_chars and repeated docstrings are left out; the order is the
  sorted file order, so the same Python version writes the same file.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from bertforge.files import write_text_atomic
from bertforge.logs import get_logger

log = get_logger(__name__)

DEFAULT_PACKAGES = ("email", "http", "urllib")
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def package_files(name: str) -> list[Path]:
    """The .py files of an importable package or module (found, not imported)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise SystemExit(f"error: --packages {name}: not a pure-Python module or package here")
    if spec.submodule_search_locations:
        return sorted(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.py"))
    return [Path(spec.origin)]


def docstrings(files: Iterable[Path]) -> Iterator[str]:
    """Every module/class/function docstring of `files`, blank lines dropped."""
    for f in files:
        try:  # utf-8-sig: a byte-order mark is legal at the top of a Python source file
            tree = ast.parse(f.read_text(encoding="utf-8-sig"), filename=str(f))
        except (SyntaxError, UnicodeDecodeError) as err:  # e.g. lib2to3's test data
            log.warning(
                f"{f}: not parsed as this Python's source ({err}); its docstrings are skipped"
            )
            continue
        for node in ast.walk(tree):
            if isinstance(node, _DOC_NODES) and (doc := ast.get_docstring(node)):
                yield "\n".join(line for line in doc.splitlines() if line.strip())


def write_domain_text(packages: Iterable[str], output: Path, min_chars: int = 40) -> dict:
    """Write the docstrings of `packages` to `output`; returns counts for the user."""
    seen: set[str] = set()
    docs = []
    for name in packages:
        for doc in docstrings(package_files(name)):
            if len(doc) >= min_chars and doc not in seen:
                seen.add(doc)
                docs.append(doc)
    if not docs:
        raise SystemExit(f"error: no docstrings of at least {min_chars} characters found")
    text = "".join(d + "\n\n" for d in docs)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output, text)
    return {"documents": len(docs), "characters": len(text), "output": str(output)}


def main(argv: list[str] | None = None) -> int:
    """Command line: write the corpus and say how big it is."""
    p = argparse.ArgumentParser(
        prog="python -m data_prep.domain_text",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument(
        "--packages",
        nargs="+",
        default=list(DEFAULT_PACKAGES),
        help="standard-library (or any pure-Python) packages to read",
    )
    p.add_argument("--output", type=Path, required=True, help="text file to write")
    p.add_argument("--min_chars", type=int, default=40, help="shorter docstrings are left out")
    args = p.parse_args(argv)
    info = write_domain_text(args.packages, args.output, args.min_chars)
    print(
        f"{info['documents']} docstrings of {', '.join(args.packages)}: "
        f"{info['characters'] / 1e3:.0f} K characters -> {info['output']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
