"""Whole-file problems a build names with their fix (issue 55): a file in another encoding than
UTF-8 fails the build above --max_invalid_utf8_share of its lines and is warned about below it,
both naming the iconv command; a text file of one paragraph a line built without
--one_doc_per_line, and the empty validation split it leads to, are warned about.

Each runs `python -m data_prep build`'s entry point with the user's arguments, in-process as
tests/data_prep/test_inputs.py does (a process of its own costs 8-16 s of imports per build here).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bertforge.data_prep.__main__ import main
from bertforge.data_prep.sample_corpus import pydoc_documents


@pytest.fixture(scope="module")
def tok(english_shards) -> str:
    """A trained tokenizer folder (the builds below skip training one)."""
    return str(english_shards / "tokenizer")


@pytest.fixture(scope="module")
def prose() -> list[str]:
    """200 lines of English prose, ASCII only."""
    lines = [ln.strip() for d in pydoc_documents() for ln in d.splitlines()]
    return [ln for ln in lines if len(ln) >= 40 and ln.isascii()][:200]


@dataclass
class Result:
    returncode: int
    stdout: str  # info and warnings
    stderr: str  # errors


@pytest.fixture
def build(capsys, tok):
    """`python -m data_prep build --input SRC --output OUT --tokenizer TOK ...`: its exit status
    and output."""

    def run(src: Path, out: Path, *extra: str) -> Result:
        args = ["build", "--input", str(src), "--output", str(out), "--tokenizer", tok]
        code = main([*args, "--workers", "1", "--progress", "off", *extra])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def documents(out: Path) -> dict[str, int]:
    m = json.loads((out / "manifest.json").read_text())
    return {split: s["documents"] for split, s in m["splits"].items()}


def latin1_file(path: Path, prose: list[str], every: int) -> Path:
    """Blank-line-separated paragraphs in Latin-1; every `every`-th line has an accent."""
    lines = [ln + (" Voilà, un café." if i % every == 0 else "") for i, ln in enumerate(prose)]
    path.write_bytes("\n\n".join(lines).encode("latin-1") + b"\n")
    return path


def test_a_latin1_file_fails_the_build_naming_iconv_and_leaves_nothing(tmp_path, build, prose):
    src = latin1_file(tmp_path / "corpus.txt", prose, every=5)  # 40 of 200 lines: 20%
    out = tmp_path / "shards"
    proc = build(src, out)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith(f"[data_prep] ERROR: {src}: 40 of its 200 lines (20.0%) are not UTF-8")
    assert "more than --max_invalid_utf8_share 0.01 allows" in error
    assert f"`iconv -f latin1 -t utf-8 {src} > {src}.utf8`" in error
    assert not out.exists()  # the shards it had written are removed with the folder it made
    # The fix it names works: converted, every line is kept.
    if shutil.which("iconv"):
        subprocess.run(f"iconv -f latin1 -t utf-8 {src} > {src}.utf8", shell=True, check=True)
    else:  # the same conversion
        Path(f"{src}.utf8").write_text(src.read_bytes().decode("latin-1"), encoding="utf-8")
    proc = build(Path(f"{src}.utf8"), out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not UTF-8" not in proc.stdout and sum(documents(out).values()) == 200


def test_below_the_share_the_lines_are_skipped_with_a_warning_naming_iconv(tmp_path, build, prose):
    src = latin1_file(tmp_path / "one_bad.txt", prose, every=1000)  # line 1 only: 0.5%
    proc = build(src, tmp_path / "shards")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warning = (
        f"[data_prep] WARNING: {src}: 1 of its 200 lines (0.5%) are not UTF-8 and were skipped"
    )
    assert warning in proc.stdout
    assert f"`iconv -f latin1 -t utf-8 {src} > {src}.utf8`" in proc.stdout
    assert sum(documents(tmp_path / "shards").values()) == 199
    # A share raised above the file's builds it too, without its 40 lines, and says so.
    src = latin1_file(tmp_path / "corpus.txt", prose, every=5)
    proc = build(src, tmp_path / "raised", "--max_invalid_utf8_share", "0.25")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{src}: 40 of its 200 lines (20.0%) are not UTF-8 and were skipped" in proc.stdout
    assert f"iconv -f latin1 -t utf-8 {src}" in proc.stdout
    assert sum(documents(tmp_path / "raised").values()) == 160


def test_one_paragraph_a_line_without_the_flag_is_named_at_build_time(tmp_path, build, prose):
    src = tmp_path / "corpus.txt"
    src.write_text("\n".join(prose) + "\n", encoding="utf-8")  # no blank line between them
    proc = build(src, tmp_path / "shards")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the shards are usable: a warning
    assert documents(tmp_path / "shards") == {"train": 1, "validation": 0}
    out = proc.stdout
    assert f"[data_prep] WARNING: {src}: its 200 lines made one document" in out
    assert (
        "If each line is a document (one paragraph a line), rebuild with --one_doc_per_line" in out
    )
    assert "[data_prep] WARNING: validation: 0 documents (--validation_fraction 0.01 of 1 " in out
    assert "the trainer will have no validation data" in out
    # With the flag: one document a line, a validation split, no warning.
    proc = build(src, tmp_path / "per_line", "--one_doc_per_line")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stdout
    counts = documents(tmp_path / "per_line")
    assert counts["train"] + counts["validation"] == 200 and counts["validation"] > 0


def test_the_one_document_hint_leaves_blank_line_corpora_alone():
    from bertforge.data_prep.input_checks import one_document_hint

    assert one_document_hint("f.txt", 79, 1).startswith("f.txt: its 79 lines made one document")
    assert "only 2 documents" in one_document_hint("f.txt", 2000, 2)
    assert one_document_hint("f.txt", 49, 1) is None  # a short file may be one document
    assert one_document_hint("pydoc_topics.txt", 8716, 79) is None  # the tests' corpus
    assert one_document_hint("f.txt", 2000, 3) is None  # three long documents
