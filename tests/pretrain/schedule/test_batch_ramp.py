"""--batch_ramp_start (issue 52): the global batch ramps on the run's clock, the same on every
rank, a resume continues it exactly, and --eval_mask_prob compares runs of two mask rates at one
rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.commands import train_cli
from helpers.launch import losses

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config.batching import BatchPlan
from bertforge.pretrain.config.ds_config import ConfigError
from bertforge.pretrain.run_folder.run_checkpoints import find_latest, tag_for
from bertforge.pretrain.schedule.budget import BatchRamp, TimeBudget, ramp_batch_at


def test_ramp_rises_in_whole_micro_batches_to_the_target_at_its_fraction():
    seen = [ramp_batch_at(f / 100, 16, 64, 0.6, 16) for f in range(0, 101)]
    assert seen[0] == 16 and seen[100] == 64
    assert seen == sorted(seen)  # never falls
    assert all(b % 16 == 0 for b in seen)
    assert seen[59] < 64 and seen[60] == 64  # the target from 60% of the run on
    assert ramp_batch_at(0.3, 16, 64, 0.6, 16) == 32  # halfway up: 16 + 48 / 2 = 40 -> 32
    assert ramp_batch_at(-1.0, 16, 64, 0.6, 16) == 16


def test_a_ramp_that_cannot_run_is_refused_naming_the_flag():
    with pytest.raises(ConfigError, match="--batch_ramp_start"):
        BatchRamp(64, 64, 0.6, 16, "time")
    with pytest.raises(ConfigError, match="--global_batch_size 60"):
        BatchRamp(16, 60, 0.6, 16, "time")
    with pytest.raises(ConfigError, match="--batch_ramp_fraction"):
        BatchRamp(16, 64, 0.0, 16, "time")
    assert BatchRamp(10, 64, 0.6, 16, "time").start == 16  # rounded up to a micro-batch


def test_time_ramp_follows_the_fraction_every_rank_agreed_on(monkeypatch):
    ramp = BatchRamp(16, 64, 0.5, 16, "time")
    budget = TimeBudget(hours=1.0, elapsed_before_s=900.0)  # a resume a quarter in
    # before this launch's first step: the checkpoint's fraction, the same on every rank
    assert budget.agreed_fraction() == 0.25
    assert ramp.batch(0, 10**9, budget) == ramp_batch_at(0.25, 16, 64, 0.5, 16) == 32
    budget.agreed = 0.55  # rank 0's clock after a step (CheckpointManager.save_due)
    assert ramp.batch(5, 10**9, budget) == 64
    steps = BatchRamp(16, 64, 0.5, 16, "steps")  # the step clock: a fraction of --max_steps
    assert [steps.batch(s, 100, budget) for s in (0, 25, 50)] == [16, 32, 64]
    assert "16 -> 64" in ramp.describe() and "time budget" in ramp.describe()


def test_for_run_uses_the_batch_plan_of_the_launch():
    from bertforge.pretrain.config.train_config import TrainConfig

    cfg = TrainConfig()
    assert BatchRamp.for_run(cfg, BatchPlan(64, 8, 4, 2)) is None  # no ramp by default
    import dataclasses

    cfg = dataclasses.replace(
        cfg, batch=dataclasses.replace(cfg.batch, batch_ramp_start=20, batch_ramp_fraction=0.4)
    )
    ramp = BatchRamp.for_run(cfg, BatchPlan(64, 8, 4, 2))
    assert (ramp.start, ramp.target, ramp.unit, ramp.ramp_fraction) == (32, 64, 16, 0.4)


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--batch_ramp_start", "-1"], "--batch_ramp_start must be >= 0"),
        (["--batch_ramp_start", "8", "--batch_ramp_fraction", "1.5"], "--batch_ramp_fraction"),
        (["--batch_ramp_start", "8", "--phases", "p.json"], "--phases"),
        (["--eval_mask_prob", "2"], "--eval_mask_prob"),
    ],
)
def test_ramp_flags_that_contradict_are_refused(english_shards, tmp_path, capsys, extra, message):
    from bertforge.pretrain.config.cli import parse_args

    base = ["--data", str(english_shards), "--output_dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as e:
        parse_args(base + extra)
    assert e.value.code == 2 and message in capsys.readouterr().err


def _train(shards: Path, run: Path, *extra: str, lr: str = "1e-3"):
    return train_cli(
        run,
        "--data",
        str(shards),
        "--model",
        "tiny",
        "--global_batch_size",
        "16",
        "--micro_batch_size",
        "4",
        "--lr",
        lr,
        *extra,
    )


@pytest.mark.slow
def test_step_clock_ramp_resumes_exactly(english_shards, tmp_path):
    ramp = ("--batch_ramp_start", "4", "--batch_ramp_fraction", "0.5", "--max_steps", "8")
    whole = tmp_path / "whole"
    _train(english_shards, whole, *ramp, "--warmup_steps", "1", "--save_interval", "3")
    recs = {r["step"]: r for r in read_metrics(whole / "metrics.jsonl")}
    batches = [recs[s]["global_batch"] for s in sorted(recs)]
    assert batches == [ramp_batch_at((s - 1) / 8, 4, 16, 0.5, 4) for s in sorted(recs)]
    assert batches[0] == 4 and batches[-1] == 16 and batches == sorted(batches)
    assert [recs[s]["samples"] for s in sorted(recs)] == batches  # the batch really trained

    # a resume from step 3 (inside the ramp): the same batches and losses, bit for bit
    split = tmp_path / "split"
    start = whole / "checkpoints" / "step_00000003"
    _train(english_shards, split, *ramp, "--warmup_steps", "1", "--resume", str(start))
    resumed = losses(split)
    assert sorted(resumed) == [4, 5, 6, 7, 8]
    assert resumed == {s: v for s, v in losses(whole).items() if s > 3}
    again = {r["step"]: r["global_batch"] for r in read_metrics(split / "metrics.jsonl")}
    assert [again[s] for s in sorted(again)] == batches[3:]
    state = json.loads((split / "checkpoints" / "step_00000008" / "trainer_state.json").read_text())
    assert state["consumed_samples"] == sum(batches)


@pytest.mark.slow
def test_time_clock_ramp_reaches_the_target_and_a_resume_starts_where_it_stopped(
    english_shards, tmp_path
):
    run = tmp_path / "run"
    ramp = ("--batch_ramp_start", "4", "--batch_ramp_fraction", "0.7", "--max_steps", "100000")
    clock = ("--schedule_clock", "time", "--warmup_ratio", "0.0")
    # the budget counts from launch, start-up included (20 s and more on a loaded 2-core machine)
    _train(english_shards, run, "--max_time_hours", f"{40 / 3600:.8f}", *clock, *ramp)
    recs = sorted(read_metrics(run / "metrics.jsonl"), key=lambda r: r["step"])
    batches = [r["global_batch"] for r in recs]
    assert batches == sorted(batches) and batches[-1] == 16  # the target by 70% of the budget
    assert batches[0] < 16 and all(b % 4 == 0 for b in batches)
    # the last checkpoint (a periodic save may sit beside it), which --resume auto takes below
    last = find_latest(run / "checkpoints")
    assert last.name == tag_for(recs[-1]["step"])
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["consumed_samples"] == sum(batches)

    # A resume with a longer budget: its first step takes the batch of the checkpoint's fraction
    longer = 3 * state["elapsed_s"]
    hours = f"{longer / 3600:.8f}"
    _train(english_shards, run, "--max_time_hours", hours, *clock, *ramp, "--resume", "auto")
    after = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > recs[-1]["step"]]
    fraction = state["elapsed_s"] / longer
    assert after[0]["global_batch"] == ramp_batch_at(fraction, 4, 16, 0.7, 4)
    assert after[-1]["global_batch"] == 16


@pytest.mark.slow
def test_eval_mask_prob_scores_two_mask_rates_on_the_same_masks(english_shards, tmp_path):
    """Two runs that differ only in their training mask rate, at an lr too small to move the
    weights: the same validation loss at --eval_mask_prob 0.15, different without it."""
    out = {}
    for rate in ("0.15", "0.3"):
        for fixed in (True, False):
            run = tmp_path / f"{rate}_{fixed}"
            extra = ("--eval_mask_prob", "0.15") if fixed else ()
            _train(english_shards, run, "--mask_prob", rate, "--max_steps", "1", *extra, lr="1e-9")
            out[(rate, fixed)] = read_metrics(run / "metrics.jsonl", "validation")[-1]
    masked = {k: r["val_masked_tokens"] for k, r in out.items()}
    # the same masks at 15% whatever the run trained at; the run's own rate without the flag
    assert masked[("0.15", True)] == masked[("0.3", True)] == masked[("0.15", False)]
    assert masked[("0.3", False)] > 1.6 * masked[("0.3", True)]
    assert out[("0.15", True)]["val_loss"] == pytest.approx(out[("0.3", True)]["val_loss"], 1e-4)
