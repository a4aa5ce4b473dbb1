"""The plan of a time-budgeted run (issue 52): the parts of the schedule on the wall clock, the
tokens and steps a rate buys (a batch ramp buys more steps), where a step clock is cut by the
budget; the dry run prints it from a step timed here, the doctor from the GPUs' peak."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
from helpers.commands import REPO

from bertforge.pretrain.config.batching import BatchPlan
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.schedule.budget_plan import PLANNED_MFU, budget_plan, format_plan

RECIPE = REPO / "recipes" / "budget.yaml"


def _cfg(**sections) -> TrainConfig:
    cfg = TrainConfig()
    for name, values in sections.items():
        cfg = dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **values)})
    return cfg


def test_time_clock_plan_names_each_part_and_when_the_decay_starts():
    cfg = _cfg(
        run={"max_time_hours": 4.0},
        optim={"schedule_clock": "time", "schedule": "wsd", "warmup_ratio": 0.06},
        batch={"batch_ramp_start": 512, "batch_ramp_fraction": 0.6},
    )
    plan = budget_plan(cfg, 4096, 128, 128, 1e6, "measured")
    parts = {p["part"]: (p["start"], p["end"]) for p in plan["parts"]}
    assert parts["lr warmup"] == (0.0, 0.06)
    assert parts["lr stable (peak)"] == (0.06, 0.8)
    assert parts["lr decay (1-sqrt)"] == (0.8, 1.0)
    assert parts["batch ramp 512 -> 4096"] == (0.0, 0.6)
    assert plan["decay_starts_s"] == pytest.approx(0.8 * 4 * 3600)
    assert plan["tokens_expected"] == pytest.approx(1e6 * 4 * 3600)
    flat = budget_plan(
        _cfg(run={"max_time_hours": 4.0}, optim={"schedule_clock": "time"}),
        4096,
        128,
        128,
        1e6,
        "measured",
    )
    assert plan["steps_expected"] > flat["steps_expected"] == int(1e6 * 4 * 3600 / (4096 * 128))
    text = "\n".join(format_plan(plan))
    assert "3:12 - 4:00  lr decay (1-sqrt)" in text and "the decay starts at 3:12" in text
    assert "0:00 - 2:24  batch ramp 512 -> 4096" in text
    assert budget_plan(TrainConfig(), 64, 16, 128, 1e6, "x") is None  # no budget, no plan


def test_step_clock_plan_says_where_the_budget_cuts_the_decay():
    cfg = _cfg(run={"max_time_hours": 1.0, "max_steps": 10_000})
    plan = budget_plan(cfg, 256, 32, 128, 256 * 128, "measured")  # one step a second
    assert plan["steps_expected"] == 3600
    assert "near step 3600 of --max_steps 10000" in plan["note"] and "cut short" in plan["note"]
    enough = budget_plan(
        _cfg(run={"max_time_hours": 1.0, "max_steps": 100}), 256, 32, 128, 256 * 128, "measured"
    )
    assert "ends the run before the budget" in enough["note"]
    unknown = budget_plan(cfg, 256, 32, 128, None, "no rate")
    assert "tokens_expected" not in unknown and "--schedule_clock time" in unknown["note"]


def test_doctor_plans_tokens_from_the_gpus_peak():
    from bertforge.pretrain.doctor.budget_rows import budget_rows, flops_per_token

    cfg = _cfg(run={"max_time_hours": 2.0}, optim={"schedule_clock": "time"})
    shape = SimpleNamespace(params=110_000_000, layers=12, hidden=768, seq_len=128)
    probes = {"node1": {"gpus": 8, "gpu_name": "NVIDIA H100 80GB HBM3"}}
    ds = {"bf16": {"enabled": True}}
    rows = budget_rows(cfg, BatchPlan(4096, 128, 4, 8), shape, probes, {"node1": 8}, ds)
    rate = 8 * 989e12 * PLANNED_MFU / flops_per_token(shape)
    assert rows[0].check == "budget" and f"{rate:,.0f} tokens/s" in rows[0].detail
    assert f"{rate * 7200:.3g} tokens" in rows[0].detail
    cpu = budget_rows(cfg, BatchPlan(64, 16, 4, 1), shape, {"l": {"gpus": 0}}, {"l": 1}, {})
    assert "tokens: unknown" in cpu[0].detail and "--dry-run times a step" in cpu[0].detail
    assert budget_rows(TrainConfig(), BatchPlan(64, 16, 4, 1), shape, probes, {}, ds) == []


def test_dry_run_of_the_budget_recipe_shows_the_plan_for_this_machine(english_shards, capsys):
    from bertforge.pretrain.main import main

    argv = ["--recipe", str(RECIPE), "--data", str(english_shards), "--model", "tiny"]
    argv += ["--ds_config", str(REPO / "ds_configs" / "cpu.json"), "--max_time_hours", "0.5"]
    argv += ["--global_batch_size", "64", "--micro_batch_size", "8", "--batch_ramp_start", "16"]
    assert main([*argv, "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    plan = report["budget"]
    assert plan["clock"] == "time" and plan["tokens_per_s"] > 0 and plan["steps_expected"] > 0
    assert plan["tokens_expected"] == pytest.approx(plan["tokens_per_s"] * 1800, rel=1e-3)
    assert plan["decay_starts_s"] == pytest.approx(0.8 * 1800)
    assert [p["part"] for p in plan["parts"]][-1] == "batch ramp 16 -> 64"
    assert "this CPU" in plan["rate_source"]
    assert main([*argv, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "budget  0.5 h (30m00s) on the time clock" in text
    assert "the decay starts at 24m00s and ends with the budget" in text
