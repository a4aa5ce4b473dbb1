"""The product, the benchmarks and the experiments stay apart: experiments may import benchmarks,
benchmarks never import experiments, and the product (what the wheel installs) imports neither;
every experiment module is listed in experiments/README.md with the command that reproduces it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _imported_tops(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            tops.add(node.module.split(".")[0])
    return tops


def _offenders(folders: tuple[str, ...], forbidden: set[str]) -> list[str]:
    return sorted(
        f"{path.relative_to(REPO)} imports {sorted(_imported_tops(path) & forbidden)}"
        for folder in folders
        for path in (REPO / folder).rglob("*.py")
        if _imported_tops(path) & forbidden
    )


def test_benchmarks_never_import_experiments():
    assert not _offenders(("benchmarks",), {"experiments"})


def test_the_product_imports_neither_benchmarks_nor_experiments():
    product = ("bertforge", "pretrain", "data_prep", "kernels")
    assert not _offenders(product, {"benchmarks", "experiments"})


def test_every_experiment_is_in_the_readme_with_its_command():
    readme = (REPO / "experiments" / "README.md").read_text()
    for path in sorted((REPO / "experiments").glob("*.py")):
        if path.name == "__init__.py":
            continue
        assert f"`{path.stem}`" in readme, f"experiments/README.md does not name {path.name}"
        text = path.read_text()
        if "def main(" in text:  # an entry point: its command is in the README
            assert re.search(rf"python -m experiments\.{path.stem}\b", readme), path.name
