"""experiments.downstream_gain: the quick form runs every stage and prints the table of
arms x tasks; a finished or half-finished experiment is continued, not redone; the paired
difference's interval is the bootstrap of the seeds' differences.

The experiment runs in this process (``main``, what ``python -m experiments.downstream_gain``
runs): its stages are still processes of their own, and a fresh interpreter for the experiment
itself would only add seconds of imports."""

from __future__ import annotations

import json
import shutil

import pytest

from experiments.arms import paired_difference
from experiments.downstream_gain import TASKS, main

pytestmark = pytest.mark.slow


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))


def test_quick_experiment_prints_the_table_and_resumes(tmp_path, capsys):
    out = tmp_path / "gain"
    cmd = ["--out", str(out), "--quick"]
    assert main(cmd) == 0
    first = capsys.readouterr().out
    rows = [line for line in first.splitlines() if line.startswith("| ")]
    assert rows[0] == "| arm | " + " | ".join(TASKS) + " |"
    assert rows[1].startswith("| random | ") and rows[2].startswith("| pretrained | ")
    assert rows[2].count("; ") == len(TASKS)  # the paired difference to random, per task
    assert any("majority class" in r for r in rows[3:])
    summary = _summary(out)
    assert summary["pretraining"]["steps"] == 6 and summary["pretraining"]["tokens"] > 0
    for task in TASKS:
        arms = summary["tasks"][task]["arms"]
        assert len(arms["random"]["values"]) == len(arms["pretrained"]["values"]) == 2
        assert "vs_random" in arms["pretrained"]
    assert (out / "gain.png").stat().st_size > 0
    assert set(summary["seconds"]) == {"pretrain", "evaluate_random", "evaluate_pretrained"}

    assert main(cmd) == 0  # finished: nothing is run again, the same table comes out
    again = _summary(out)
    assert again["seconds"] == {} and again["tasks"] == summary["tasks"]

    shutil.rmtree(out / "eval" / "pretrained")  # half-finished: only the missing stage runs
    assert main(cmd) == 0
    assert set(_summary(out)["seconds"]) == {"evaluate_pretrained"}


def test_paired_difference_interval():
    same = paired_difference([0.8, 0.7, 0.9], [0.6, 0.5, 0.7])
    assert same["mean"] == pytest.approx(0.2) and same["low"] == pytest.approx(0.2)
    assert same["high"] == pytest.approx(0.2)  # every seed gained 0.2: no spread
    mixed = paired_difference([0.9, 0.5, 0.7, 0.6, 0.8], [0.5, 0.6, 0.6, 0.6, 0.6])
    assert mixed["mean"] == pytest.approx(0.12)
    assert min(mixed["values"]) <= mixed["low"] < mixed["mean"] < mixed["high"] <= 0.4
