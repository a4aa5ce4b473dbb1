"""benchmarks.learning.domain_gain (experiment B): the quick form runs the stages of the arms it
is given from a small base model the test writes, prints the main table (every arm against the
base) and the tips table (the tips whose two arms ran), and a finished experiment is not redone."""

from __future__ import annotations

import json

import pytest
from helpers.commands import run_cli
from helpers.tiny_bert import build_tiny_bert

from benchmarks.learning.domain_gain import REFERENCE, TIPS

pytestmark = pytest.mark.slow

ARMS = ("b_mask15", "d_vocab_mean", "e_vocab_random")  # plain, new vocabulary, random rows


def _table_rows(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if line.startswith("| ")]


def test_quick_experiment_prints_both_tables_and_resumes(tmp_path):
    base = build_tiny_bert(tmp_path / "base")
    out = tmp_path / "gain"
    cmd = ("-m", "benchmarks.learning.domain_gain", "--out", str(out), "--base", str(base))
    cmd += ("--quick", "--arms", REFERENCE, *ARMS)
    rows = _table_rows(run_cli(*cmd).stdout)
    assert [r.split(" | ")[0][2:] for r in rows[1:5]] == [REFERENCE, *ARMS]
    assert rows[1].count("; ") == 0  # the reference row has no difference to itself
    assert all(r.count("; ") == 1 for r in rows[2:5])
    tips = [r for r in rows if " - " in r.split(" | ")[1] and not r.startswith("| tip |")]
    ran = {REFERENCE, *ARMS}
    assert len(tips) == sum(arm in ran and other in ran for _, arm, other in TIPS) == 2

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["reference"] == REFERENCE and len(summary["tips"]) == 2
    assert set(summary["pretraining"]) == set(ARMS)
    assert {r["steps"] for r in summary["pretraining"].values()} == {4}
    assert summary["terms"] and (out / "gain.png").stat().st_size > 0
    # the extended vocabulary changes the token count, nothing else does
    tokens = {arm: r["tokens"] for arm, r in summary["pretraining"].items()}
    assert tokens["d_vocab_mean"] == tokens["e_vocab_random"]

    run_cli(*cmd)  # finished: nothing runs again, the same tables come out
    again = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert again["seconds"] == {} and again["tasks"] == summary["tasks"]
