"""The one lr schedule (pretrain.config.schedule). --schedule wsd: the lr the optimizer really
gets, against the closed form computed here in float64, on both clocks, and every combination of
flags it refuses, with the flag named. Checkpoints written before the one schedule: the
per-kind fields they saved give the values the classes that wrote them gave, bit for bit (the
values recorded from those classes in data/legacy_schedules.json). A phase plan's batch ramp, mask
rate, rope theta and data: the schedule answers each step as the PhaseTracker did before they
moved into it, and a checkpoint of then reads back (data/phase_plan_before_one_schedule.json)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from bertforge.errors import UserError
from bertforge.pretrain.config.schedule import (
    TICKS_PER_BUDGET,
    Schedule,
    ScheduleError,
    build_schedule,
    check_schedule_flags,
    warmup_decay,
    wsd,
)
from bertforge.pretrain.config.train_config import OptimConfig
from bertforge.pretrain.data.masking import MaskingConfig
from bertforge.pretrain.schedule.optim import ScheduleLR, lr_scheduler_factory

PEAK, FLOOR_RATIO = 1e-3, 0.1


def closed_form(s: int, *, warmup: int, total: int, decay: int, shape: str) -> float:
    """The lr after ``s`` scheduler steps, written from the definition (not the module's code)."""
    peak, floor = PEAK, PEAK * FLOOR_RATIO
    if s < warmup:
        return peak * (s + 1) / warmup
    start = total - decay
    if s < start:
        return peak
    t = min(1.0, (s - start) / decay)
    left = {"linear": 1 - t, "cosine": (1 + math.cos(math.pi * t)) / 2, "1-sqrt": 1 - t**0.5}
    return floor + (peak - floor) * left[shape]


def lrs_in_effect(schedule, steps: int) -> list[float]:
    """The lr of the optimizer at positions 0..steps-1, through the trainer's own LambdaLR."""
    param = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([param], lr=PEAK)
    sched = lr_scheduler_factory(schedule)(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_lr_matches_the_closed_form_at_every_step(shape):
    cfg = OptimConfig(
        schedule="wsd", warmup_steps=10, decay_fraction=0.2, decay_shape=shape,
        min_lr_ratio=FLOOR_RATIO,
    )  # fmt: skip
    schedule = build_schedule(cfg, max_steps=100)
    assert schedule.kind == "wsd" and schedule.settings()["decay steps"] == 20
    assert schedule.phases() == [("warmup", 0, 10), ("stable", 10, 80), ("decay", 80, 100)]
    got = lrs_in_effect(schedule, 110)  # and beyond the end: the floor stays
    for s in (0, 5, 9, 10, 42, 79, 80, 81, 85, 90, 99, 100, 109):
        want = closed_form(s, warmup=10, total=100, decay=20, shape=shape)
        assert got[s] == pytest.approx(want, rel=1e-12, abs=1e-18), (shape, s)
    assert got[100] == pytest.approx(PEAK * FLOOR_RATIO, rel=1e-12)


def test_decay_steps_win_over_the_fraction_and_fractions_round():
    cfg = OptimConfig(schedule="wsd", warmup_steps=0, decay_steps=30)
    assert build_schedule(cfg, 100).phases()[-1] == ("decay", 70, 100)
    cfg = OptimConfig(schedule="wsd", warmup_steps=0, decay_fraction=0.29)
    assert build_schedule(cfg, 100).settings()["decay steps"] == 29  # int(0.29 x 100): 28


def test_wsd_on_the_time_clock_spans_fractions_of_the_budget():
    cfg = OptimConfig(
        schedule="wsd", schedule_clock="time", warmup_ratio=0.1, decay_fraction=0.25,
        decay_shape="cosine", min_lr_ratio=FLOOR_RATIO,
    )  # fmt: skip
    s = build_schedule(cfg, max_steps=7)  # the step count plays no part
    assert s.phases() == [
        ("warmup", 0, 1000), ("stable", 1000, 7500), ("decay", 7500, TICKS_PER_BUDGET)
    ]  # fmt: skip
    at = 0.875 * TICKS_PER_BUDGET  # half-way through the decay: cos(pi/2) = 0
    want = closed_form(int(at), warmup=1000, total=TICKS_PER_BUDGET, decay=2500, shape="cosine")
    assert PEAK * s(int(at)) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(PEAK * (FLOOR_RATIO + (1 - FLOOR_RATIO) / 2))


def test_a_saved_schedule_is_rebuilt_as_it_was_saved():
    # What a resume relies on: LambdaLR keeps only the object's fields (plain values).
    for schedule in (
        wsd(warmup_steps=2, total_steps=10, decay_steps=3, shape="cosine"),
        warmup_decay(warmup_steps=2, total_steps=10, decay="poly", power=2.0),
    ):
        fields = dict(vars(schedule))
        assert json.loads(json.dumps(fields)) == fields  # nothing but builtins to unpickle
        assert Schedule.from_saved(fields) == schedule
    with pytest.raises(ScheduleError, match="--override_lr_schedule"):
        Schedule.from_saved({"warmup_steps": 2, "phases": []})


LEGACY = json.loads((Path(__file__).parent / "data" / "legacy_schedules.json").read_text())


@pytest.mark.parametrize("case", LEGACY, ids=lambda c: "-".join(sorted(c["fields"]))[:40])
def test_a_checkpoint_of_an_earlier_schedule_class_resumes_with_its_exact_lrs(case):
    """A LambdaLR state as DeepSpeed saved it before the one schedule (warmup_decay, wsd, anneal
    and phase-plan classes, each its own field set): loaded by this version's ScheduleLR, every
    lr is the one the earlier class gave, to the last bit (equality, not approx)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], lr=1.0)
    sched = ScheduleLR(opt, build_schedule(OptimConfig(), 3))  # this launch's flags' schedule
    state = sched.state_dict()
    state["lr_lambdas"] = [dict(case["fields"])]
    sched.load_state_dict(state)
    restored = sched.lr_lambdas[0]
    assert isinstance(restored, Schedule)
    assert [restored(s) for s in range(len(case["values"]))] == case["values"]


def _refused(argv: list[str], capsys) -> str:
    from bertforge.pretrain.config.cli import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["--data", "unused", "--max_steps", "100", *argv])
    assert e.value.code == 2
    return capsys.readouterr().err


WSD, TIME = "--schedule wsd", "--schedule_clock time --max_time_hours 1"
REFUSED = [
    (f"{WSD} --decay poly", "with --schedule wsd the decay's shape is --decay_shape"),
    (f"{WSD} --warmup_steps 10 --decay_steps 95", "do not fit in --max_steps 100"),
    (f"{WSD} --decay_fraction 1.5", "--decay_fraction must be in (0, 1]"),
    (f"{WSD} --decay_shape exp", "--decay_shape must be one of linear, cosine, 1-sqrt"),
    (f"{WSD} {TIME} --decay_steps 5", "with --schedule_clock time give the decay as --decay_fr"),
    (f"{WSD} {TIME} --warmup_ratio 0.9", "add up to more than the whole time budget"),
    ("--decay_shape cosine", "add --schedule wsd"),
    ("--schedule stepwise", "--schedule must be warmup_decay or wsd"),
    ("--override_lr_schedule", "goes with --resume auto or --resume PATH"),
    (f"--override_lr_schedule --resume auto {TIME}", "not needed with --schedule_clock time"),
]


@pytest.mark.parametrize("argv, message", REFUSED)
def test_schedule_flags_that_cannot_work_are_refused_naming_the_flag(argv, message, capsys):
    assert message in _refused(argv.split(), capsys)


def test_the_refusals_are_user_errors_and_a_scheduler_block_is_refused(tmp_path):
    from helpers.launch import ds_config

    from bertforge.pretrain.config.ds_config import ConfigError, resolve_deepspeed_config
    from bertforge.pretrain.config.train_config import RunConfig, TrainConfig

    with pytest.raises(UserError):
        check_schedule_flags(OptimConfig(schedule="wsd", decay="constant"))
    sched = {"type": "WarmupLR", "params": {"warmup_num_steps": 1}}
    path = ds_config(tmp_path, "sched.json", scheduler=sched)
    cfg = TrainConfig(run=RunConfig(ds_config=str(path)), optim=OptimConfig(schedule="wsd"))
    with pytest.raises(ConfigError, match='"scheduler" block .* remove it to use --schedule wsd'):
        resolve_deepspeed_config(cfg, 1, "cpu")


def test_dry_run_shows_the_lr_at_the_phase_boundaries(english_shards, capsys):
    from bertforge.pretrain.config.cli import parse_args
    from bertforge.pretrain.dry_run import main as dry_run_main

    flags = "--schedule wsd --max_steps 100 --warmup_steps 10 --lr 1e-3 --min_lr_ratio 0.1"
    cfg = parse_args(["--data", str(english_shards), "--dry-run", *flags.split()])
    assert dry_run_main(cfg) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("lr "))
    assert line == (
        "lr      wsd (1-sqrt), peak 0.001, by steps: warmup 0-10 1.00e-04 -> 1.00e-03 | "
        "stable 10-80 1.00e-03 | decay 80-100 1.00e-03 -> 1.00e-04"
    )


BEFORE = json.loads(
    (Path(__file__).parent / "data" / "phase_plan_before_one_schedule.json").read_text()
)


def test_a_plans_schedule_answers_every_step_as_before_and_reads_its_checkpoints():
    """Every value of every step (lr, batch ramp, mask rate with the run's own ramp under it, rope
    theta, data) equals what the code before the move gave, exactly; a checkpoint of then holds
    the same plan (a resume compares it) and the same scheduler state, which loads as it was."""
    from bertforge.pretrain.config.phase_plan import parse_phases, plan_dict, plan_schedule, resolve

    plan = resolve(
        parse_phases(BEFORE["plan_file"], "plan.json"),
        path="plan.json",
        global_batch=16,
        micro_batch=4,
        world_size=2,
        seq_len=lambda data: 128,
        arch="modernbert",
    )
    assert plan_dict(plan) == BEFORE["checkpoint_phases"]
    schedule, base = plan_schedule(plan, 16), MaskingConfig(**BEFORE["masking"])
    for want in BEFORE["steps"]:
        s, c = want["step"], want["consumed"]
        data, start = schedule.data_at(s)
        got = {
            "step": s,
            "consumed": c,
            "phase": schedule.phase_at(s).name,
            "lr": schedule(s),
            "batch": schedule.batch_at(s, c),
            "mask_prob": schedule.mask_rate(s, c, base),
            "masking": asdict(schedule.masking_at(s, base)),
            "rope_theta": schedule.rope_theta_at(s, 10000.0),
            "data": list(data) if data else None,
            "data_start": start,
        }
        assert got == want
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], lr=1.0)
    sched = ScheduleLR(opt, schedule)
    for _ in range(5):
        opt.step()
        sched.step()
    state = sched.state_dict()  # the lr curve only: the plan is the trainer state's
    assert json.loads(json.dumps(state["lr_lambdas"])) == BEFORE["lr_scheduler"]["lr_lambdas"]
    later = ScheduleLR(opt, build_schedule(OptimConfig(), 3))
    later.load_state_dict({**state, "lr_lambdas": BEFORE["lr_scheduler"]["lr_lambdas"]})
    assert [later.lr_lambdas[0](s) for s in range(14)] == [w["lr"] for w in BEFORE["steps"]]


def test_without_a_plan_the_run_is_one_phase():
    schedule = build_schedule(OptimConfig(), 10)
    schedule.global_batch = 32
    base = MaskingConfig(mask_prob=0.3, mask_prob_end=0.15, schedule_samples=100)
    assert schedule.phase_at(3) is None and schedule.batch_at(3, 96) == 32
    assert schedule.masking_at(3, base) is base and schedule.mask_rate(
        3, 50, base
    ) == pytest.approx(0.225)
    assert schedule.data_at(3) == (None, 0) and schedule.rope_theta_at(3, 1e4) == 1e4
    assert not any(schedule.loader_changes_at(s, base) for s in range(12))
