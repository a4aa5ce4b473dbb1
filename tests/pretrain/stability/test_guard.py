"""The stability guard (pretrain.stability.guard): the detector on its own, then faults planned
with
BERTFORGE_FAULTS in one-process CPU runs (fp32, ZeRO-2, tiny model): a loss spike is skipped
without touching the weights, a NaN rolls back to the newest checkpoint and skips the exact sample
range, NaN after NaN gives up with exit status 6, and --no_stability_guard trains as before."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers.commands import train_cli
from helpers.launch import guard_actions

from bertforge.pretrain.components.metrics import read_metrics

# --- the detector ---------------------------------------------------------------------------
from bertforge.pretrain.config.cli import parse_args
from bertforge.pretrain.config.train_config import GuardConfig
from bertforge.pretrain.run_folder.run_checkpoints import list_complete, read_state, tag_for
from bertforge.pretrain.stability.guard import EXIT_GAVE_UP, StabilityGuard, robust_z


def _guard(**over) -> StabilityGuard:
    return StabilityGuard(GuardConfig(**{"guard_min_history": 5, **over}))


def _feed(guard: StabilityGuard, losses, norm: float = 1.0, first_step: int = 1) -> list[str]:
    """Healthy-looking steps through both checks; the actions taken."""
    actions = []
    for i, loss in enumerate(losses):
        v = guard.check_loss(first_step + i, loss)
        if v.action == "ok":
            v = guard.check_grad_norm(first_step + i, norm)
        actions.append(v.action)
    return actions


def test_robust_z_against_hand_computed_median_and_mad():
    median, z = robust_z(10.0, [1.0, 2.0, 3.0, 4.0, 5.0])  # median 3, MAD 1
    assert median == 3.0 and z == pytest.approx(7.0 / 1.4826)
    assert robust_z(3.0, [3.0, 3.0, 3.0]) == (3.0, 0.0)
    assert robust_z(3.5, [3.0, 3.0, 3.0]) == (3.0, math.inf)


def test_spike_is_skipped_only_after_the_minimum_history():
    guard = _guard()
    assert guard.check_loss(1, 1000.0).action == "ok"  # no history yet: nothing to judge by
    guard = _guard()
    assert _feed(guard, [7.0, 6.9, 7.1, 6.8, 7.0]) == ["ok"] * 5
    verdict = guard.check_loss(6, 70.0)
    assert verdict.action == "skip"
    assert verdict.event["event"] == "loss_spike" and verdict.event["median"] == 7.0
    assert verdict.event["z"] > 6.0
    assert len(guard.losses) == 5  # the spike does not join the window of healthy values


def test_flat_curve_with_zero_mad_needs_the_relative_floor():
    guard = _guard()
    _feed(guard, [7.0] * 6)
    assert guard.check_loss(7, 7.01).action == "ok"  # z is inf, but only 1.001x the median
    guard.check_grad_norm(7, 1.0)
    assert guard.check_loss(8, 11.0).action == "skip"  # above 1.5x the median
    assert guard.check_loss(9, 6.0).action == "ok"  # a drop is never a spike


def test_spikes_in_a_window_roll_back_and_rollbacks_run_out():
    guard = _guard(guard_spikes=3, guard_spike_window=20, guard_max_rollbacks=1)
    _feed(guard, [7.0, 6.9, 7.1, 6.8, 7.0])
    assert guard.check_loss(6, 70.0).action == "skip"
    assert guard.check_loss(7, 70.0).action == "ok"  # right after a skip: applied, counted
    verdict = guard.check_loss(8, 70.0)
    assert verdict.action == "rollback" and verdict.event["event"] == "spikes_in_window"
    guard.rolled_back(verdict.event, 4, 64, 128)
    assert guard.rollbacks == 1 and not guard.spike_steps
    assert guard.check_loss(5, math.nan).action == "give_up"  # one rollback allowed, spent


def test_a_spike_right_after_a_skipped_one_is_applied_and_recorded():
    """Measured (docs/guard.md): ModernBERT small at lr 2e-3 spiked once (10.4 against a median
    of 6.4) and, without the guard, was back at 6.2 the next step; with the guard, skipping that
    update kept the weights that spiked, every following batch spiked too, and the guard gave
    up on a healthy run. A spike on the step after a skipped one blames the weights: its update
    is applied."""
    guard = _guard(guard_spikes=4, guard_spike_window=20)
    _feed(guard, [6.1, 6.2, 6.0, 6.4, 6.3])
    assert guard.check_loss(36, 10.4).action == "skip"  # the batch may be to blame: skip
    verdict = guard.check_loss(37, 11.3)
    assert verdict.action == "ok" and verdict.event["event"] == "loss_spike_after_skip"
    assert "weights" in verdict.event["reason"] and list(guard.spike_steps) == [36, 37]
    assert guard.check_grad_norm(37, 41.0).action == "ok"  # its loss never joins the window
    assert len(guard.losses) == 5
    assert _feed(guard, [6.2, 6.3], first_step=38) == ["ok", "ok"]  # the update mended it
    assert guard.check_loss(40, 10.0).action == "skip"  # a later lone spike: skipped again
    assert guard.state_dict()["last_skipped"] == 40
    resumed = StabilityGuard(guard.cfg, guard.state_dict())
    assert resumed.last_skipped == 40  # a resume judges its next step as the run would have
    verdict = resumed.check_loss(41, 10.0)
    assert verdict.action == "rollback" and verdict.event["event"] == "spikes_in_window"


def test_spikes_further_apart_than_the_window_are_only_skipped():
    guard = _guard(guard_spikes=2, guard_spike_window=3)
    _feed(guard, [7.0, 6.9, 7.1, 6.8, 7.0])
    assert guard.check_loss(6, 70.0).action == "skip"
    _feed(guard, [7.0, 7.0, 7.0], first_step=7)
    assert guard.check_loss(10, 70.0).action == "skip"  # step 6 left the 3-step window


def test_nonfinite_values_roll_back_except_under_fp16():
    guard = _guard()
    assert guard.check_loss(1, math.inf).action == "rollback"
    assert guard.check_loss(2, 7.0).action == "ok"
    verdict = guard.check_grad_norm(2, math.nan)
    assert verdict.action == "rollback" and verdict.event["event"] == "grad_norm_nonfinite"
    fp16 = StabilityGuard(GuardConfig(), fp16=True)  # the loss scaler owns non-finite values
    assert fp16.check_loss(1, math.nan).action == "ok"
    assert fp16.check_loss(2, 7.0).action == "ok"
    assert fp16.check_grad_norm(2, math.inf).action == "ok"


def test_grad_norm_spike_is_counted_not_skipped():
    guard = _guard(guard_spikes=2)
    _feed(guard, [7.0, 6.9, 7.1, 6.8, 7.0], norm=1.0)
    assert guard.check_loss(6, 7.0).action == "ok"
    verdict = guard.check_grad_norm(6, 50.0)  # the update is applied already (and clipped)
    assert verdict.action == "ok" and verdict.event["event"] == "grad_norm_spike"
    assert guard.check_loss(7, 7.0).action == "ok"
    assert guard.check_grad_norm(7, 50.0).action == "rollback"  # the second spike in the window


def test_clipped_grad_norm_spikes_are_recorded_and_never_escalate():
    """Issue 36: grad-norm spikes of 2-25x the median on healthy runs (updates clipped at 1.0)
    piled up into "spikes_in_window" and ended runs whose loss was falling."""
    guard = _guard(guard_spikes=2)
    guard.clipping = 1.0
    _feed(guard, [7.0, 6.9, 7.1, 6.8, 7.0], norm=0.58)
    for step, norm in enumerate([5.5, 14.0, 3.0, 9.0, 20.0], start=6):
        assert guard.check_loss(step, 6.5).action == "ok"
        verdict = guard.check_grad_norm(step, norm)
        assert verdict.action == "ok" and verdict.event["event"] == "grad_norm_spike"
        assert verdict.event["clipped_at"] == 1.0
    assert not guard.spike_steps and guard.rollbacks == 0
    assert guard.check_loss(11, 70.0).action == "skip"  # a loss spike is still skipped
    assert guard.check_loss(12, 6.4).action == "ok"
    assert guard.check_grad_norm(12, math.nan).action == "rollback"  # non-finite: still caught


def _console_line(tmp_path, capsys, event: dict) -> str:
    """The line MetricsWriter.guard prints for ``event`` (rank 0, no progress bar)."""
    from bertforge.pretrain.components.metrics import MetricsWriter

    writer = MetricsWriter(
        tmp_path, rank=0, max_steps=10, start_step=0, log_interval=1, flops_per_token=None,
        peak_tflops=None, world_size=1, progress=False,
    )  # fmt: skip
    writer.guard(event)
    writer.close()
    return capsys.readouterr().out.strip()


def test_the_console_line_says_whether_the_step_was_kept(tmp_path, capsys):
    """Issue 55: "grad_norm_spike ... -> ok" did not say what became of the step."""
    guard = _guard(guard_spikes=2)
    guard.clipping = 1.0
    _feed(guard, [7.0, 6.9, 7.1, 6.8, 7.0], norm=0.58)
    guard.check_loss(6, 6.5)
    clipped = guard.check_grad_norm(6, 14.0).event
    line = _console_line(tmp_path, capsys, clipped)
    assert line.startswith("[pretrain] guard step 6: grad_norm_spike 14")
    assert line.endswith("-> kept (update clipped to norm 1)")
    unclipped = _guard(guard_spikes=3)
    _feed(unclipped, [7.0, 6.9, 7.1, 6.8, 7.0], norm=0.58)
    unclipped.check_loss(6, 6.5)
    line = _console_line(tmp_path, capsys, unclipped.check_grad_norm(6, 14.0).event)
    assert line.endswith("-> kept")
    skip = guard.check_loss(7, 70.0).event
    guard.skipped(skip, 96, 112)
    line = _console_line(tmp_path, capsys, skip)
    assert "loss_spike 70 " in line
    assert line.endswith("-> skipped (update dropped), samples [96, 112) skipped")
    rollback = {**guard.check_loss(8, math.nan).event, "to_step": 4, "rollbacks": 1}
    line = _console_line(tmp_path, capsys, rollback)
    assert line.endswith("-> rolled back to step 4 (rollback 1)")
    give_up = {**rollback, "action": "give_up"}
    assert _console_line(tmp_path, capsys, give_up).endswith("-> gave up")


def test_a_loss_that_climbs_rolls_back_a_falling_or_noisy_one_never():
    """A divergence whose every step is too small to be a spike (+2% a step, as an absurd lr
    gave: 8.5 -> 10.3 in 20 steps) is caught by the recent median against the run's best; a
    falling curve with noise and a level shift at a new phase are not."""
    guard = _guard(guard_min_history=5, guard_climb=1.2)
    falling = [8.6 - 0.01 * i + (0.15 if i % 3 == 0 else -0.1) for i in range(240)]
    assert set(_feed(guard, falling, norm=0.6)) == {"ok"}
    assert guard.best_loss == pytest.approx(min(falling), abs=0.3)
    actions, loss, step = [], falling[-1], 241
    while "rollback" not in actions:
        loss *= 1.02
        actions += _feed(guard, [loss], norm=0.6, first_step=step)
        step += 1
    assert actions[:-1] == ["ok"] * (len(actions) - 1) and loss < 1.5 * falling[-1]
    verdict = guard.check_loss(step, loss * 1.02)
    assert verdict.event["event"] == "loss_climb" and verdict.event["median"] == guard.best_loss
    guard.new_phase()  # a new --phases phase: its own level
    assert guard.check_loss(step + 1, loss).action == "ok"
    off = _guard(guard_min_history=5, guard_climb=0.0)
    assert set(_feed(off, [7.0 * 1.02**i for i in range(20)])) == {"ok"}


def test_without_a_checkpoint_the_step_is_skipped_in_place_lr_cut_counted_as_rollback():
    guard = _guard(guard_spikes=2, guard_max_rollbacks=2, guard_lr_factor=0.5)
    verdict = guard.check_loss(1, math.nan)
    assert verdict.action == "rollback"
    assert guard.in_place(verdict.event, 0, 16) == 0.5
    assert verdict.event["action"] == "skip" and verdict.event["rollbacks"] == 1
    assert "skipped in place, rollback 1 of 2, lr x 0.5" in verdict.event["reason"]
    assert guard.events[-1]["skipped_samples"] == [0, 16]
    verdict = guard.check_loss(2, math.nan)
    assert guard.in_place(verdict.event, 16, 32) == 0.25 and guard.rollbacks == 2
    assert guard.check_loss(3, math.nan).action == "give_up"  # a divergence that persists


def test_the_anchor_waits_for_a_calm_step_and_is_taken_once():
    from types import SimpleNamespace

    from bertforge.pretrain.components.guarded_step import GuardedStep

    guard = _guard(guard_window=10)
    ckpts = SimpleNamespace(last_saved_step=None)
    step = GuardedStep(guard, None, SimpleNamespace(ckpts=ckpts), None, anchor_step=5)
    assert not step.anchor_due(4)
    guard.in_place(guard.check_loss(3, math.nan).event, 32, 48)  # a rollback in place at 3
    assert [s for s in range(5, 20) if step.anchor_due(s)] == [13]  # 10 steps after it, once
    with_ckpt = GuardedStep(guard, None, SimpleNamespace(ckpts=SimpleNamespace(last_saved_step=4)),
                            None, anchor_step=5)  # fmt: skip
    assert not any(with_ckpt.anchor_due(s) for s in range(5, 30))


def test_state_round_trip_keeps_counts_factor_and_windows():
    guard = _guard(guard_lr_factor=0.5)
    _feed(guard, [7.0, 6.9, 7.1, 6.8, 7.0])
    verdict = guard.check_loss(6, math.nan)
    assert guard.rolled_back(verdict.event, 4, 64, 96) == 0.5
    again = StabilityGuard(guard.cfg, json.loads(json.dumps(guard.state_dict())))
    assert again.state_dict() == guard.state_dict()
    assert again.rollbacks == 1 and again.lr_factor == 0.5
    assert again.events[-1]["skipped_samples"] == [64, 96]
    assert again.check_loss(7, 70.0).action == "skip"  # the restored window judges at once


def test_flags_turn_the_guard_off_and_reject_bad_thresholds(english_shards, capsys):
    base = ["--data", str(english_shards)]
    assert parse_args(base).guard.stability_guard is True
    assert parse_args(base + ["--no_stability_guard"]).guard.stability_guard is False
    assert parse_args(base + ["--stability_guard", "false"]).guard.stability_guard is False
    with pytest.raises(SystemExit):
        parse_args(base + ["--guard_lr_factor", "2"])
    assert "--guard_lr_factor must be in (0, 1]" in capsys.readouterr().err


def test_a_config_without_zero_is_refused_before_launch_unless_the_guard_is_off(
    english_shards, tmp_path
):
    from helpers.commands import REPO

    from bertforge.pretrain.config.ds_config import ConfigError, resolve_deepspeed_config

    ds = json.loads((REPO / "ds_configs" / "cpu.json").read_text())
    ds["zero_optimization"] = {"stage": 0}
    path = tmp_path / "stage0.json"
    path.write_text(json.dumps(ds))
    base = ["--data", str(english_shards), "--ds_config", str(path)]
    with pytest.raises(ConfigError, match="needs ZeRO stage 1, 2 or 3.*--no_stability_guard"):
        resolve_deepspeed_config(parse_args(base), 1, "cpu")
    setup = resolve_deepspeed_config(parse_args(base + ["--no_stability_guard"]), 1, "cpu")
    assert setup.config["zero_optimization"]["stage"] == 0


# --- fault injection in real runs ------------------------------------------------------------

RUN_FLAGS = [
    "--model",
    "tiny",
    "--global_batch_size",
    "16",
    "--micro_batch_size",
    "8",
    "--lr",
    "1e-3",
    "--warmup_steps",
    "1",
    "--decay",
    "constant",
    "--guard_min_history",
    "3",
]


def _run(run: Path, shards: Path, faults: str, *args: str, check: bool = True):
    return train_cli(
        run, "--data", str(shards), *RUN_FLAGS, *args, env={"BERTFORGE_FAULTS": faults}, check=check
    )


def _records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _model_and_moments(ckpt: Path) -> list[torch.Tensor]:
    """Every weight and Adam moment of a ZeRO-2 checkpoint (one rank)."""
    module = torch.load(ckpt / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    optim = torch.load(ckpt / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=False)
    state = optim["optimizer_state_dict"]["base_optimizer_state"]["state"]
    moments = [t for s in state.values() for k, t in sorted(s.items()) if k != "step"]
    return [module[k] for k in sorted(module)] + moments


@pytest.fixture(scope="module")
def spike_run(english_shards, tmp_path_factory) -> Path:
    """A NaN loss at step 1 (no checkpoint yet) and a loss spike (x1000) at step 6; a checkpoint
    after every step."""
    run = tmp_path_factory.mktemp("guard_spike") / "run"
    _run(run, english_shards, "loss_nan@1,loss_spike@6", "--max_steps", "7", "--save_interval", "1",
         "--keep_last", "10")  # fmt: skip
    return run


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_loss_spike_is_skipped_without_touching_the_weights(spike_run):
    first, event = guard_actions(spike_run)
    # A NaN before the first checkpoint: nothing to roll back to, so the step is skipped.
    assert (first["step"], first["event"], first["action"]) == (1, "loss_nonfinite", "skip")
    assert first["reason"].startswith("no complete checkpoint to roll back to: skipped in place")
    assert first["rollbacks"] == 1 and first["lr_factor"] == 1.0  # --guard_lr_factor 1.0
    assert (event["step"], event["event"], event["action"]) == (6, "loss_spike", "skip")
    assert event["skipped_samples"] == [80, 96] and event["loss"] > 100 * event["median"]
    train = {r["step"]: r for r in read_metrics(spike_run / "metrics.jsonl")}
    assert sorted(train) == list(range(1, 8))
    assert train[1]["skipped"] and train[6]["skipped"] and not train[7]["skipped"]
    assert train[6]["skipped_total"] == 2
    assert train[7]["consumed_samples"] == 112  # the skipped batch still counts as consumed
    assert train[7]["loss"] < 1.2 * event["median"]  # training goes on from unharmed weights
    ckpts = spike_run / "checkpoints"
    before, after, next_ = (_model_and_moments(ckpts / tag_for(s)) for s in (5, 6, 7))
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # nothing applied
    assert not all(torch.equal(a, b) for a, b in zip(after, next_, strict=True))
    state = json.loads((ckpts / tag_for(7) / "trainer_state.json").read_text())
    assert state["guard"]["events"] == [
        {"step": 1, "event": "loss_nonfinite", "action": "skip", "skipped_samples": [0, 16]},
        {"step": 6, "event": "loss_spike", "action": "skip", "skipped_samples": [80, 96]},
    ]


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_without_the_guard_training_is_as_before(spike_run, english_shards, tmp_path):
    """--no_stability_guard: no guard records; a NaN loss's non-finite gradients are skipped
    by DeepSpeed's own overflow check and training goes on. Between the events (a NaN at step 1,
    skipped by DeepSpeed here and by the guard there) the runs are bit-identical."""
    run = tmp_path / "run"
    faults = "loss_nan@1,loss_nan@6"
    proc = _run(run, english_shards, faults, "--max_steps", "7", "--no_stability_guard")
    assert "guard step" not in proc.stdout + proc.stderr
    assert read_metrics(run / "metrics.jsonl", "guard") == []
    got = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    ref = {r["step"]: r for r in read_metrics(spike_run / "metrics.jsonl")}
    assert [got[s]["loss"] for s in range(2, 6)] == [ref[s]["loss"] for s in range(2, 6)]
    assert got[1]["skipped"] and got[6]["skipped"]  # DeepSpeed's skips, not the guard's
    assert got[6]["loss"] == "nan" and got[6]["skipped_total"] == 2
    assert math.isfinite(got[7]["loss"]) and sorted(got) == list(range(1, 8))


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_nan_rolls_back_skips_the_exact_range_and_resumes(english_shards, tmp_path):
    run = tmp_path / "run"
    args = ["--save_interval", "4", "--keep_last", "5", "--guard_lr_factor", "0.5"]
    proc = _run(run, english_shards, "loss_nan@6", "--max_steps", "8", *args)
    out = proc.stdout + proc.stderr
    assert "guard step 6: loss_nonfinite nan" in out and "back to step 4 (rollback 1)" in out
    records = _records(run)
    guard = [r for r in records if r.get("split") == "guard"]
    # One intervention; the guard may also note a spike whose update it let through ("ok": the
    # test's shards come from a tokenizer trained per session, and tokenizers' WordPiece trainer
    # is not deterministic, huggingface/tokenizers#1794, so such notes come and go).
    (event,) = [r for r in guard if r["action"] != "ok"]
    assert event["action"] == "rollback" and event["to_step"] == 4 and event["rollbacks"] == 1
    assert event["skipped_samples"] == [64, 96]  # checkpoint's position .. the NaN step's end
    after = [r for r in records[records.index(event) + 1 :] if r.get("split", "train") == "train"]
    assert [r["step"] for r in after] == [5, 6, 7, 8]  # the step counter went back to 4
    assert [r["consumed_samples"] for r in after] == [112, 128, 144, 160]  # data went on
    assert all(r["lr"] == pytest.approx(5e-4) for r in after)  # --guard_lr_factor 0.5
    assert [s for s, _ in list_complete(run / "checkpoints")] == [4, 8]
    state = json.loads((run / "checkpoints" / tag_for(8) / "trainer_state.json").read_text())
    assert state["guard"]["rollbacks"] == 1 and state["guard"]["lr_factor"] == 0.5
    # A later launch resumes the run with the guard's state and the lowered lr.
    proc = _run(run, english_shards, "", "--max_steps", "10", "--resume", "auto", *args)
    assert f"resumed from {run / 'checkpoints' / tag_for(8)} at step 8" in proc.stdout
    train = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in train if r["consumed_samples"] > 160] == [9, 10]
    assert train[-1]["lr"] == pytest.approx(5e-4)
    state = json.loads((run / "checkpoints" / tag_for(10) / "trainer_state.json").read_text())
    assert state["guard"]["rollbacks"] == 1 and state["guard"]["events"][0]["to_step"] == 4


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_nan_after_every_rollback_gives_up(english_shards, tmp_path):
    run = tmp_path / "run"
    proc = _run(run, english_shards, "loss_nan@6,loss_nan@6,loss_nan@6", "--max_steps", "8",
                "--save_interval", "4", "--guard_max_rollbacks", "2", check=False)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_GAVE_UP, out[-3000:]
    assert "the stability guard gave up at step 6" in out and "--guard_max_rollbacks 2" in out
    actions = [r["action"] for r in guard_actions(run)]
    assert actions == ["rollback", "rollback", "give_up"]
    assert [s for s, _ in list_complete(run / "checkpoints")] == [4]  # nothing saved after


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_without_save_interval_the_anchor_checkpoint_gives_a_nan_its_rollback(
    english_shards, tmp_path
):
    """No --save_interval: the guard saves one checkpoint after warmup and --guard_window steps
    (here 4), and a NaN at step 6 rolls back to it instead of being skipped in place."""
    run = tmp_path / "run"
    proc = _run(run, english_shards, "loss_nan@6", "--max_steps", "7", "--guard_window", "4")
    assert f"checkpoint (guard) step 4: {run / 'checkpoints' / tag_for(4)}" in proc.stdout
    (event,) = guard_actions(run)
    assert (event["event"], event["action"], event["to_step"]) == ("loss_nonfinite", "rollback", 4)
    assert event["skipped_samples"] == [64, 96]
    assert [s for s, _ in list_complete(run / "checkpoints")] == [4, 7]
    assert read_state(run / "checkpoints" / tag_for(4))["reason"] == "guard"
