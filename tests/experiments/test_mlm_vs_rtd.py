"""experiments.mlm_vs_rtd: the quick form pretrains the three arms (equal time, equal FLOPs),
fine-tunes them beside random weights and prints both tables; the equal-FLOPs arm's steps follow
the trainer's own FLOPs count; a finished experiment is not redone."""

from __future__ import annotations

import json

import pytest

from bertforge.pretrain.components.metrics import read_metrics
from experiments.mlm_vs_rtd import TASKS, main, training_flops

pytestmark = pytest.mark.slow


def test_quick_experiment_trains_equal_compute_arms_and_prints_the_tables(tmp_path, capsys):
    out = tmp_path / "mlm_vs_rtd"
    cmd = ["--out", str(out), "--quick"]
    assert main(cmd) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    arms = [r.split(" | ")[0][2:] for r in rows[1:5]]
    assert rows[0] == "| arm | " + " | ".join(TASKS) + " |" and arms[0] == "random"
    assert arms[1:] == ["mlm", "rtd", "rtd_flops"]
    assert any(r.startswith("| rtd - mlm | ") for r in rows)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    pre = summary["pretraining"]
    # equal training time: each time arm trained until its budget was used, then stopped (no
    # step began past it; start-up counts, and under load may use the whole tiny budget)
    budget_s = 0.15 * 60
    for arm in ("mlm", "rtd"):
        metrics = out / f"{arm}_run" / "metrics.jsonl"
        ends = [r["elapsed_s"] for r in read_metrics(metrics, "train")]
        assert all(e < budget_s for e in ends[:-1]), (arm, ends)
        assert read_metrics(metrics, "validation")[-1]["elapsed_s"] >= budget_s, arm
        assert pre[arm]["training_s"] == pytest.approx(ends[-1], abs=0.1)
    assert "rtd_accuracy" in pre["rtd"] and "rtd_accuracy" not in pre["mlm"]
    # equal FLOPs, by the trainer's count: within a step or two (a step's tokens vary a little)
    per_step = pre["rtd_flops"]["flops"] / pre["rtd_flops"]["steps"]
    assert abs(pre["rtd_flops"]["flops"] - pre["mlm"]["flops"]) <= 2 * per_step
    assert training_flops(out / "rtd_flops_run") == pytest.approx(pre["rtd_flops"]["flops"])
    for task in TASKS:
        assert set(summary["rtd_vs_mlm"][task]) == {"rtd - mlm", "rtd_flops - mlm"}
        assert len(summary["tasks"][task]["arms"]["rtd"]["values"]) == 2
    assert (out / "gain.png").stat().st_size > 0 and (out / "curves.png").stat().st_size > 0

    assert main(cmd) == 0  # finished: nothing runs again
    assert json.loads((out / "summary.json").read_text(encoding="utf-8"))["seconds"] == {}
