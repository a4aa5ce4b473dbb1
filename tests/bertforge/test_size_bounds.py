"""The size bounds of issue 35: no ``sys.path`` edits anywhere (scripts run as ``python -m`` or get
PYTHONPATH from their parent), at most 40 ``print(`` calls in pretrain/ + data_prep/ (messages
go through ``bertforge.logs``; plain stdout is for reports a user reads), and no product module
over 500 lines, no function over 80."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("pretrain", "data_prep", "kernels", "bertforge")
MAX_PRINTS = 40
MAX_LINES = 500
MAX_FUNCTION_LINES = 80
SYS_PATH_EDIT = re.compile(r"sys\.path(\.insert|\.append|\.extend|\s*\[[^\]]*\]\s*=|\s*\+?=)")


def _python_files(*folders: str) -> list[Path]:
    return [
        p
        for folder in folders
        for p in (REPO / folder).rglob("*.py")
        if "__pycache__" not in p.parts and ".git" not in p.parts
    ]


def test_no_sys_path_edits():
    folders = (*PRODUCT, "benchmarks", "experiments", "tests", "scripts")
    found = [
        f"{p.relative_to(REPO)}:{i}"
        for p in _python_files(*folders)
        if p != Path(__file__)
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if SYS_PATH_EDIT.search(line)
    ]
    assert not found, f"sys.path edited (run as `python -m`, or pass PYTHONPATH): {found}"


def test_print_calls_in_pretrain_and_data_prep_are_few():
    count = sum(
        p.read_text(encoding="utf-8").count("print(")
        for p in _python_files("pretrain", "data_prep")
    )  # what `grep -rn "print(" pretrain data_prep | wc -l` counts, one per line in practice
    assert count <= MAX_PRINTS, (
        f"{count} print( calls in pretrain/ + data_prep/ (bound {MAX_PRINTS})"
    )


def test_no_product_module_over_500_lines():
    long = {
        str(p.relative_to(REPO))
        for p in _python_files(*PRODUCT)
        if len(p.read_text(encoding="utf-8").splitlines()) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {sorted(long)}"


def test_no_product_function_over_80_lines():
    long = [
        f"{p.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
        for p in _python_files(*PRODUCT)
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (decorators aside): {long}"
