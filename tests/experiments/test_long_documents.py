"""experiments.long_documents: the quick form fine-tunes every arm (first N tokens, windows, key
sentences) through ``pretrain.evaluate``, prints the arms' table and the paired differences, and
a finished experiment is not redone.

The experiment runs in this process (``main``, what ``python -m experiments.long_documents``
runs): its evaluations are processes of their own."""

from __future__ import annotations

import json

import pytest
from helpers.tiny_bert import build_tiny_bert

from experiments.long_documents import ARMS, PAIRS, main

pytestmark = pytest.mark.slow


def test_quick_experiment_prints_both_tables_and_resumes(tmp_path, capsys):
    base = build_tiny_bert(tmp_path / "base", hidden=16, layers=1)
    out = tmp_path / "long"
    cmd = ["--out", str(out), "--base", str(base), "--quick", "--jobs", "3"]
    cmd += ["--results", str(tmp_path / "long.json"), "--plot", str(tmp_path / "long.png")]
    assert main(cmd) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0][2:] for r in rows[1:4]] == list(ARMS)
    assert rows[1].count("; ") == 0 and all(r.count("; ") == 2 for r in rows[2:4])
    pairs = [c for r in rows if " - " in (c := r.split(" | ")[0][2:]) and c != "arm - against"]
    assert pairs == [f"{a} - {b}" for a, b in PAIRS for _metric in ("macro_f1", "accuracy")]

    summary = json.loads((tmp_path / "long.json").read_text(encoding="utf-8"))
    costs = summary["costs"]
    assert costs["windows"]["train_sequences"] > costs["first"]["train_sequences"]
    assert costs["key_sentences"]["train_sequences"] == costs["first"]["train_sequences"]
    lengths = summary["documents_tokens"]
    assert lengths["min"] > 64 and lengths["share_in_first"] < 0.5, "documents are long"
    assert (tmp_path / "long.png").stat().st_size > 0
    assert set(summary["seconds"]) == {f"evaluate_{arm}" for arm in ARMS}

    assert main(cmd) == 0  # finished: nothing runs again, the same numbers come out
    again = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert again["seconds"] == {} and again["tasks"] == summary["tasks"]
