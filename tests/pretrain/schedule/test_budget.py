"""--max_time_hours: the run ends at its time budget (final validation and checkpoint), a resume
carries the time already spent, and --schedule_clock time follows the elapsed fraction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.commands import train_cli

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config.schedule import TICKS_PER_BUDGET, build_schedule
from bertforge.pretrain.config.train_config import OptimConfig
from bertforge.pretrain.schedule.budget import TimeBudget, TimeClockLR


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_budget_adds_up_launches_and_ends_at_the_limit(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr("bertforge.pretrain.schedule.budget.time.monotonic", clock)
    first = TimeBudget(hours=1.0)
    clock.now += 1800
    assert first.elapsed_s() == 1800 and first.fraction() == 0.5 and not first.exhausted()
    second = TimeBudget(hours=1.0, elapsed_before_s=first.elapsed_s())  # a resumed launch
    clock.now += 1799
    assert not second.exhausted()
    clock.now += 1
    assert second.exhausted() and second.fraction() == 1.0
    unlimited = TimeBudget(hours=0.0, elapsed_before_s=5.0)
    assert unlimited.fraction() == 0.0 and not unlimited.exhausted() and unlimited.elapsed_s() == 5


def test_time_clock_schedule_warms_up_then_decays_over_the_budget(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr("bertforge.pretrain.schedule.budget.time.monotonic", clock)
    schedule = build_schedule(OptimConfig(schedule_clock="time", warmup_ratio=0.1), max_steps=7)
    assert schedule.total_steps == TICKS_PER_BUDGET  # the step count plays no part
    budget = TimeBudget(hours=1.0)
    lr = TimeClockLR(schedule, peak_lr=1e-3, budget=budget)

    class Opt:
        param_groups = [{"lr": 0.0}, {"lr": 0.0}]

    seen = []
    for minutes in (0, 3, 6, 15, 33, 60):
        clock.now = 1000.0 + 60 * minutes
        lr.apply(Opt)
        assert Opt.param_groups[0]["lr"] == Opt.param_groups[1]["lr"]
        seen.append(Opt.param_groups[0]["lr"])
    assert seen[0] < seen[1] < seen[2] == pytest.approx(1e-3)  # warmup: the first 6 minutes
    assert seen[2] > seen[3] > seen[4] > seen[5] == 0.0  # linear decay to the end of the budget
    assert seen[4] == pytest.approx(1e-3 * (1 - (0.55 - 0.1) / 0.9), rel=1e-3)


def test_time_clock_needs_a_budget_and_no_step_warmup(english_shards, tmp_path, capsys):
    from bertforge.pretrain.config.cli import parse_args

    base = [
        "--data",
        str(english_shards),
        "--output_dir",
        str(tmp_path / "run"),
        "--schedule_clock",
        "time",
    ]
    for extra, message in (
        ([], "--schedule_clock time needs a budget"),
        (["--max_time_hours", "1", "--warmup_steps", "5"], "--warmup_ratio"),
    ):
        with pytest.raises(SystemExit) as e:
            parse_args(base + extra)
        assert e.value.code == 2 and message in capsys.readouterr().err


def _train(shards: Path, run: Path, *extra: str):
    return train_cli(
        run,
        "--data",
        str(shards),
        "--model",
        "tiny",
        "--global_batch_size",
        "8",
        "--micro_batch_size",
        "8",
        *extra,
        env={"PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.slow
def test_run_stops_at_its_budget_and_a_resume_spends_only_the_rest(english_shards, tmp_path):
    run = tmp_path / "run"
    _train(english_shards, run, "--max_steps", "3")
    state = json.loads(next((run / "checkpoints").glob("step_*/trainer_state.json")).read_text())
    spent = state["elapsed_s"]
    assert spent > 0

    # Resume with a budget 12 s beyond what was spent and far more steps than it allows.
    hours = (spent + 12.0) / 3600
    proc = _train(
        english_shards,
        run,
        "--max_steps",
        "100000",
        "--resume",
        "auto",
        "--max_time_hours",
        f"{hours:.8f}",
        "--schedule_clock",
        "time",
        "--warmup_ratio",
        "0.0",
        "--lr",
        "1e-3",
    )
    assert "time budget" in proc.stdout + proc.stderr
    train = read_metrics(run / "metrics.jsonl")
    resumed = [r for r in train if r["step"] > 3]
    assert resumed and resumed[0]["elapsed_s"] > spent  # the clock went on from the checkpoint
    last = max(r["step"] for r in train)
    assert 3 < last < 100000
    final = run / "checkpoints" / f"step_{last:08d}"
    saved = json.loads((final / "trainer_state.json").read_text())
    assert saved["reason"] == "budget" and saved["step"] == last
    assert hours * 3600 <= saved["elapsed_s"] < hours * 3600 + 60  # stopped at the budget (a step)
    val = read_metrics(run / "metrics.jsonl", "validation")
    assert val[-1]["step"] == last  # a final validation at the budget
    # validation records carry the training time too (python -m pretrain.plot draws by time)
    assert resumed[-1]["elapsed_s"] <= val[-1]["elapsed_s"] <= saved["elapsed_s"]
    lrs = [r["lr"] for r in resumed]  # the time clock: lr falls with the elapsed fraction
    assert lrs == sorted(lrs, reverse=True) and lrs[0] < 1e-3 * (1 - spent / (hours * 3600)) + 1e-6


def test_launch_clock_counts_from_the_wrappers_launch_time(monkeypatch):
    """BERTFORGE_LAUNCHED_AT moves the budget's start back to when the launcher was started."""
    import time

    from bertforge.pretrain.config.ds_config import ConfigError
    from bertforge.pretrain.schedule.budget import launch_clock

    monkeypatch.delenv("BERTFORGE_LAUNCHED_AT", raising=False)
    assert abs(launch_clock() - time.monotonic()) < 1.0
    monkeypatch.setenv("BERTFORGE_LAUNCHED_AT", repr(time.time() - 40.0))
    assert TimeBudget(1.0, start=launch_clock()).elapsed_s() == pytest.approx(40.0, abs=1.0)
    for bad in ("soon", repr(time.time() + 3600), repr(time.time() - 2 * 86400)):
        monkeypatch.setenv("BERTFORGE_LAUNCHED_AT", bad)
        with pytest.raises(ConfigError, match="BERTFORGE_LAUNCHED_AT"):
            launch_clock()
