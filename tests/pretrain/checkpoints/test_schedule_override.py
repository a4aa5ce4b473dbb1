"""--override_lr_schedule on --resume, as a user runs it: after a real resume the lr of every step
is the flags' schedule (not the checkpoint's), and the warning lists old -> new. Without the flag
the ignored flags are named (tests/pretrain/checkpoints/test_checkpoint_restore.py)."""

from __future__ import annotations

import pytest
from helpers.commands import train_cli

from bertforge.pretrain.checkpoints.schedule_override import ScheduleResumeError, check_resume_clock
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config.train_config import OptimConfig


def _train(shards, run, *extra: str):
    sizes = ("--global_batch_size", "4", "--micro_batch_size", "4", "--eval_batches", "1")
    return train_cli(run, "--data", str(shards), "--model", "tiny", *sizes, *extra)


@pytest.mark.slow
def test_a_resume_with_override_trains_on_the_flags_schedule(english_shards, tmp_path):
    first = tmp_path / "first"
    _train(english_shards, first, "--max_steps", "2", "--lr", "1e-3", "--warmup_steps", "1")
    ckpt = first / "checkpoints" / "step_00000002"
    # Extend the run from 2 to 6 steps with a wsd tail: decay over steps 4..6 to 0.25 x peak.
    flags = "--max_steps 6 --lr 2e-3 --warmup_steps 1 --schedule wsd --decay_steps 2 "
    flags += "--decay_shape linear --min_lr_ratio 0.25 --override_lr_schedule"
    proc = _train(english_shards, tmp_path / "resumed", "--resume", str(ckpt), *flags.split())

    warning = next(x for x in proc.stdout.splitlines() if "WARNING: --override_lr_schedule" in x)
    for change in (
        f"not the checkpoint {ckpt}",
        "schedule warmup_decay -> wsd",
        "peak lr 0.001 -> 0.002",
        "total steps 2 -> 6",
        "decay steps - -> 2",
        "decay shape - -> linear",
        "floor (min lr ratio) 0.0 -> 0.25",
        "At scheduler step 2 the lr is now 0.002",
    ):
        assert change in warning, (change, warning)
    # A step record's lr is the one set for the next step: peak x schedule(step), in float64.
    peak, floor = 2e-3, 0.25 * 2e-3
    want = {3: peak, 4: peak, 5: floor + (peak - floor) * 0.5, 6: floor}
    got = {r["step"]: r["lr"] for r in read_metrics(tmp_path / "resumed" / "metrics.jsonl")}
    assert got == pytest.approx(want, rel=1e-12)


def test_a_time_clock_checkpoint_resumed_on_the_step_clock_needs_the_override():
    state = {"config": {"optim": {"schedule_clock": "time"}}, "step": 5}
    with pytest.raises(ScheduleResumeError, match="pass --override_lr_schedule"):
        check_resume_clock(OptimConfig(), state)
    check_resume_clock(OptimConfig(override_lr_schedule=True), state)
    check_resume_clock(OptimConfig(schedule_clock="time"), state)  # the clock follows the flags


def test_an_override_of_a_time_clock_checkpoint_starts_at_its_step_with_the_guards_cut():
    import torch

    from bertforge.pretrain.checkpoints.schedule_override import ScheduleOverride, resume_schedule
    from bertforge.pretrain.config.schedule import warmup_decay, wsd
    from bertforge.pretrain.schedule.optim import lr_scheduler_factory

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-3)
    sched = lr_scheduler_factory(warmup_decay(warmup_steps=1, total_steps=10))(opt)
    sched.load_state_dict(None)  # what DeepSpeed hands over from a time-clock checkpoint
    state = {"step": 5, "guard": {"lr_factor": 0.5}}
    with pytest.raises(ScheduleResumeError, match="pass --override_lr_schedule"):
        resume_schedule(sched, state, sched.lr_lambdas[0], 2e-3, override=False, where="it")
    new = wsd(warmup_steps=0, total_steps=8, decay_steps=4, shape="linear")
    assert ScheduleOverride(new, 2e-3).apply(sched, state) == [1e-3 * new(5)]
    assert sched.last_epoch == 5 and opt.param_groups[0]["lr"] == 1e-3 * 0.75
    assert "loaded_from_none" not in sched.state_dict()  # about the load, not saved
    sched.load_state_dict(sched.state_dict())
    assert not sched.loaded_from_none and sched.lr_lambdas == [new]


def test_a_longer_max_steps_on_a_resume_says_where_it_came_from(capsys):
    """Issue 55: "total steps 600 -> 1215" was warned without saying why; the warning now names
    where this launch's --max_steps came from (here the command line, over the run's recipe)."""
    import torch

    from bertforge.pretrain.checkpoints.schedule_override import resume_schedule, steps_origin
    from bertforge.pretrain.config.schedule import warmup_decay
    from bertforge.pretrain.config.train_config import RunConfig
    from bertforge.pretrain.schedule.optim import lr_scheduler_factory

    sources = {"run.max_steps": "flag --max_steps", "batch.grad_accum": "recipe RUN/recipe.yaml"}
    why = steps_origin(RunConfig(max_steps=1215), sources)
    assert why == "given on the command line, where a flag wins over the recipe"
    recipe = {"run.max_steps": "recipe RUN/recipe.yaml"}
    assert steps_origin(RunConfig(), recipe) == "run.max_steps of the recipe RUN/recipe.yaml"
    assert steps_origin(RunConfig(), {}) == "the default, as no flag or recipe gives it"
    assert steps_origin(RunConfig(phases="plan.json"), sources).startswith("the length of the")

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-3)
    sched = lr_scheduler_factory(warmup_decay(warmup_steps=30, total_steps=600))(opt)
    flags = warmup_decay(warmup_steps=30, total_steps=1215)
    resume_schedule(sched, {"step": 600}, flags, 2e-3, override=False, where="C", steps_from=why)
    out = capsys.readouterr().out
    assert "(total steps 600 -> 1215)" in out
    assert (
        "--max_steps 1215 still ends this run at step 1215 (this launch's --max_steps: given on "
        "the command line, where a flag wins over the recipe), but the lr keeps the checkpoint's "
        "schedule length of 600 steps"
    ) in out
    resume_schedule(sched, {"step": 600}, flags, 2e-3, override=True, where="C", steps_from=why)
    assert (
        "total steps 600 -> 1215 (--max_steps: given on the command line" in capsys.readouterr().out
    )
