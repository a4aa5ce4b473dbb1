"""The run folder's layout has one definition (issue 54, item 3): every name a run folder holds
comes from RunFolder and no product module spells one as a path (tests/e2e/test_launch_checks.py
finds a real run's files where RunFolder says)."""

from __future__ import annotations

import re
from pathlib import Path

from bertforge.pretrain.run_folder.layout import RunFolder

REPO = Path(__file__).resolve().parents[3]
LAYOUT = REPO / "pretrain" / "run_folder" / "layout.py"
# names only a run folder holds (a shard folder has its own tokenizer/ and .lock)
SPELLED = re.compile(
    r'/ "checkpoints"|, "checkpoints"\)|"(metrics\.jsonl|recipe\.yaml|verified_shards\.json|'
    r'phases\.json)"'
)


def test_no_product_module_spells_a_run_folder_name():
    found = [
        f"{f.relative_to(REPO)}:{n}"
        for package in ("pretrain", "bertforge", "data_prep", "kernels")
        for f in sorted((REPO / package).rglob("*.py"))
        if f != LAYOUT
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if SPELLED.search(line)
    ]
    assert not found, f"name these through pretrain.run_folder.layout.RunFolder: {found}"


def test_the_layout_is_what_the_module_doc_draws():
    run = RunFolder("runs/x")
    doc = LAYOUT.read_text(encoding="utf-8")
    for name in (
        "checkpoints",
        "metrics",
        "config",
        "recipe",
        "phases",
        "tokenizer",
        "verified_shards",
        "tensorboard",
        "downstream",
        "plots",
        "lock",
    ):
        path = getattr(run, name)
        assert path.parent == Path("runs/x") and f"  {path.name}" in doc, name
