"""docs/reliability.md and the README's count of it stay true: every test the fault table names
exists, and the README's numbers are the table's row counts."""

from __future__ import annotations

import re

from helpers.commands import REPO

DOC = REPO / "docs" / "reliability.md"


def _rows(section_heading: str) -> list[str]:
    """The body rows of the tables under each heading starting with ``section_heading``."""
    rows, inside = [], False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            inside = line.lstrip("#").strip().startswith(section_heading)
        elif inside and line.startswith("| ") and not re.match(r"\| (Fault|Input class) \|", line):
            rows.append(line)
    return rows


def test_every_named_test_exists():
    text = DOC.read_text(encoding="utf-8")
    named = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", text)
    assert len(named) > 20
    # "::test_x" right after a named file refers to the same file
    for file, first in named:
        source = (REPO / file).read_text(encoding="utf-8")
        assert f"def {first}(" in source, f"{file}::{first} named in {DOC.name} does not exist"
    for cell in re.findall(r"`tests/[\w/]+\.py::test_\w+`(?:, `::test_\w+`)+", text):
        file = re.match(r"`(tests/[\w/]+\.py)", cell).group(1)
        source = (REPO / file).read_text(encoding="utf-8")
        for name in re.findall(r"`::(test_\w+)`", cell):
            assert f"def {name}(" in source, f"{file}::{name} named in {DOC.name} does not exist"


def test_readme_counts_are_the_tables_counts():
    faults = sum(len(_rows(h)) for h in ("Training", "Processes", "Checkpoints", "Data"))
    fuzz_doc = DOC.read_text(encoding="utf-8")
    classes = int(re.search(r"one of the (\d+) bad-input classes", fuzz_doc).group(1))
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert f"{faults} injected faults survived and {classes} classes of bad input" in readme
    assert len(_rows("Fuzzed inputs")) >= 10
