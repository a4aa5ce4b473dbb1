"""The built-in sample corpora: text that ships with CPython, so the demo, the benchmarks and the
tests run without a download.

- English: the pydoc topic pages of this Python (`pydoc_data.topics`, 79 documents, ~460 KB of
  prose about the language), written blank-line separated, one document per topic;
- a domain corpus: the docstrings of some standard-library packages, in
  `data_prep.domain_text` (``python -m data_prep.domain_text``).
"""

from __future__ import annotations

from pathlib import Path

from bertforge.files import write_text_atomic


def pydoc_documents() -> list[str]:
    """The pydoc topic pages, sorted by topic, each stripped; empty ones left out."""
    # Lazy: pydoc_data.topics is a 700 KB module, read only when the pydoc corpus is asked for.
    from pydoc_data.topics import topics

    return [topics[k].strip() for k in sorted(topics) if topics[k].strip()]


def english_documents(max_docs: int | None = None) -> list[str]:
    """The first `max_docs` pydoc topic pages (all by default) with their blank lines removed, so
    that a blank line can separate documents in a text file."""
    docs = pydoc_documents()[:max_docs]
    return ["\n".join(line for line in d.splitlines() if line.strip()) for d in docs]


def write_english_corpus(path: Path, max_docs: int | None = None) -> Path:
    """`english_documents` into `path` (atomically), each followed by one blank line; `path`."""
    path = Path(path)
    write_text_atomic(path, "".join(d + "\n\n" for d in english_documents(max_docs)))
    return path
