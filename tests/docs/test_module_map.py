"""docs/design.md's module map names every module of the tree, and nothing that is not there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("bertforge", "data_prep", "kernels", "pretrain", "benchmarks", "experiments")


def _module_map() -> str:
    text = (REPO / "docs" / "design.md").read_text()
    start = text.index(". Module map")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _tree_modules() -> set[str]:
    return {
        str(f.relative_to(REPO))
        for package in PACKAGES
        for f in (REPO / package).rglob("*.py")
        if f.name not in ("__init__.py", "__main__.py") and "__pycache__" not in f.parts
    }


def test_module_map_names_every_module_and_only_real_ones():
    named = {
        m for m in re.findall(r"`([\w/]+\.py)`", _module_map()) if m.split("/", 1)[0] in PACKAGES
    }
    tree = _tree_modules()
    missing = sorted(tree - named)
    assert not missing, f"modules missing from docs/design.md's module map: {missing}"
    unreal = sorted(m for m in named - tree if not (REPO / m).is_file())
    assert not unreal, f"the module map names modules that do not exist: {unreal}"
