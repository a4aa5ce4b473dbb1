"""The walk-throughs stay true (issue 54, item 7): docs/design.md's "How to add an objective" and
docs/extending.md's "Adding one" (an architecture) name files that exist, every architecture has
the four files the page says each has, and every objective is where the walk-through puts it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from bertforge.pretrain.model.registry import ARCHES
from bertforge.pretrain.model.specs import OBJECTIVES as SPECS
from bertforge.pretrain.objectives.registry import OBJECTIVES

REPO = Path(__file__).resolve().parents[2]
ARCH_FILES = ("arch.py", "model.py", "adapter.py", "spec.py")


def section(page: str, heading: str) -> str:
    """The text of ``page`` from ``heading`` to the next heading of its level or above."""
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    start = text.index(heading) + len(heading)
    level = len(heading.split(" ", 1)[0])
    end = re.search(rf"^#{{1,{level}}} ", text[start:], re.M)
    return text[start : start + end.start() if end else None]


def named_files(text: str) -> set[str]:
    return set(re.findall(r"`((?:pretrain|data_prep|tests)/[\w/]+\.py)`", text))


def test_the_objective_walkthrough_names_real_files():
    steps = section("design.md", "## 8. How to add an objective")
    files = named_files(steps)
    assert len(files) >= 10, files  # the walk-through names the files, not just the idea
    missing = sorted(f for f in files if not (REPO / f).is_file())
    assert not missing, f"design.md section 8 names files that are not there: {missing}"


def test_every_objective_is_where_the_walkthrough_puts_it():
    assert list(OBJECTIVES) == list(SPECS)
    # one module of pretrain/objectives/ per objective, its OBJECTIVE the registry's
    modules = [
        importlib.import_module(f"bertforge.pretrain.objectives.{p.stem}")
        for p in sorted((REPO / "pretrain" / "objectives").glob("*.py"))
        if p.stem not in ("__init__", "base", "registry")
    ]
    found = {m.OBJECTIVE.name: m.OBJECTIVE for m in modules}
    assert found.keys() == OBJECTIVES.keys()
    assert all(found[name] is objective for name, objective in OBJECTIVES.items())
    pair_tasks = [o for o in OBJECTIVES.values() if o.spec.pair_head]
    assert {o.name for o in pair_tasks} == {"mlm+nsp", "mlm+sop"}
    assert all(o.pooler_task for o in pair_tasks)  # the export's card says what trained it


def test_every_architecture_has_the_four_files_and_the_walkthrough_names_real_ones():
    for name in ARCHES:
        folder = REPO / "pretrain" / "model" / name.replace("-", "_")
        assert sorted(p.name for p in folder.glob("*.py") if p.name in ARCH_FILES) == sorted(
            ARCH_FILES
        ), name
    steps = section("extending.md", "### Adding one")  # the first: an architecture
    for path in named_files(steps.replace("NAME", "bert")):
        assert (REPO / path).is_file(), path
    for text in re.findall(r"`(pretrain/model/NAME/\w+\.py)`", steps):
        assert text.rsplit("/", 1)[1] in ARCH_FILES, text
