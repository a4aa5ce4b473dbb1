"""Benchmark results name no path of the machine they ran on: the committed docs/bench/*.json
hold only paths relative to the repository (or ``$OUT/...`` for the benchmark's output folder),
and ``benchmarks.common.portable`` is what every results writer passes its JSON through."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from benchmarks.common import REPO, portable

# A slash that starts a path (not one inside a word or a ratio such as ZeRO-2/3 or loss/dh),
# followed by a name and another slash: /home/x/..., /tmp/run/..., C:\ is not a concern here.
ABSOLUTE = re.compile(r"(?<![\w.~$-])/[\w.+-]+/")
COMMITTED = sorted((REPO / "docs" / "bench").glob("*.json"))


def strings(obj, where=""):
    """Every string value (and key) of a JSON document, with where it is."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{where}.{k} (key)", k
            yield from strings(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from strings(v, f"{where}[{i}]")
    elif isinstance(obj, str):
        yield where, obj


def test_there_are_committed_results():
    assert COMMITTED, "docs/bench/*.json: none found (the glob is wrong, or they moved)"


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_no_committed_result_holds_an_absolute_path(path: Path):
    found = [
        f"{where}: {s[:120]!r}"
        for where, s in strings(json.loads(path.read_text()))
        if ABSOLUTE.search(s) or s.startswith("/")
    ]
    assert not found, f"{path.relative_to(REPO)} holds absolute paths: " + "; ".join(found)


def test_portable_rewrites_repository_run_and_interpreter_paths(tmp_path: Path):
    run = tmp_path / "out"
    doc = {
        "results": str(REPO / "docs" / "bench" / "x.json"),
        "repo": REPO,
        "cmd": [sys.executable, "-m", "x", "--out", str(run / "logs"), str(REPO / "ds_configs")],
        "error": f"FileNotFoundError: {run / 'train' / 'config.json'} missing",
        "out": str(run),
        "sibling": str(run) + "2/x",  # a longer name is not the run folder
        "n": 3,
        "none": None,
    }
    got = portable(doc, run)
    assert got == {
        "results": "docs/bench/x.json",
        "repo": ".",
        "cmd": ["python", "-m", "x", "--out", "$OUT/logs", "ds_configs"],
        "error": "FileNotFoundError: $OUT/train/config.json missing",
        "out": "$OUT",
        "sibling": str(run) + "2/x",
        "n": 3,
        "none": None,
    }
    # A run folder inside the repository is written relative to the repository.
    assert portable({"p": str(REPO / "runs" / "b" / "x")}, REPO / "runs" / "b") == {"p": "runs/b/x"}
    # The check of the committed files would catch what portable leaves.
    assert ABSOLUTE.search(got["sibling"]) and not ABSOLUTE.search(json.dumps(got["cmd"]))
