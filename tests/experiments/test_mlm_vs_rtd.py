"""experiments.mlm_vs_rtd: the quick form pretrains the three arms (equal time, equal FLOPs),
fine-tunes them beside random weights and prints both tables; the equal-FLOPs arm's steps follow
the trainer's own FLOPs count; a finished experiment is not redone."""

from __future__ import annotations

import json

import pytest

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
    # equal training time: both arms stopped at the same budget (start-up aside)
    assert abs(pre["mlm"]["training_s"] - pre["rtd"]["training_s"]) < 5
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
