"""experiments.schedules: the quick form prints one row per arm of every comparison
(the phase plan's and the anneal's included) and writes a summary with no absolute path of this
machine.

The experiment runs in this process (``main``, what ``python -m experiments.schedules`` runs): its
trainer runs are still processes of their own, and a fresh interpreter for the experiment itself
would only add seconds of imports."""

from __future__ import annotations

import json

import pytest

from experiments.schedules import SCHEDULE_ARMS, main

pytestmark = pytest.mark.slow


def _rows(table: str, title: str) -> dict[str, str]:
    """{arm: its row} of the markdown table under `title`."""
    block = table.split(f"**{title}**", 1)[1].split("**", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ")][1:]
    return {r.split(" | ")[0][2:]: r for r in rows}


def test_quick_reports_every_arm_and_writes_portable_json(tmp_path, capsys):
    out = tmp_path / "sched"
    assert main(["--out", str(out), "--quick"]) == 0
    table = capsys.readouterr().out
    arms = _rows(table, "(a)-(d): validation loss at the last step")
    assert list(arms) == list(SCHEDULE_ARMS)
    for arm, row in arms.items():
        assert ("(reference)" in row) == (arm == "wsd")
    assert list(_rows(table, "(e): averaged checkpoints vs the last (one evaluator)")) == [
        "wsd_last",
        "wsd_avg_last2",
    ]
    for src in ("domain", "general"):
        assert list(_rows(table, f"annealing, {src} validation")) == ["anneal", "rewarm"]

    text = (out / "summary.json").read_text(encoding="utf-8")
    summary = json.loads(text)
    assert str(tmp_path) not in text and "/work/" not in text and '"/' not in text
    assert summary["plan"]["steps"] == 8 and summary["plan"]["seeds"] == [1]
    # the evaluator of (e) scores the last checkpoint as the run's own validation did
    assert abs(summary["averaging"]["evaluator_minus_run_val_loss"][0]) < 1e-3
    assert (out / "schedules.png").stat().st_size > 0
