"""The stability guard rolls back onto a checkpoint written on another number of ranks: a run
saved on 2 ranks, resumed on 1, meets a planned NaN loss; the guard loads the 2-rank checkpoint
through its universal conversion (as ``--resume`` does) instead of taking it for "no checkpoint"
(which skipped the NaN step and went on from the bad weights' neighbourhood)."""

from __future__ import annotations

import pytest
from helpers.commands import REPO
from helpers.launch import COMMON, guard_actions, launch

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config import command_line
from bertforge.pretrain.run_folder.run_checkpoints import list_complete, read_state, tag_for

pytestmark = pytest.mark.slow


def test_nan_on_one_rank_rolls_back_onto_the_two_rank_checkpoint(english_shards, tmp_path):
    run = tmp_path / "run"
    args = command_line.flags(
        {
            "ds_config": REPO / "ds_configs" / "cpu.json",
            "data": english_shards,
            "output_dir": run,
            "eval_batches": 1,
            "decay": "constant",
            "guard_min_history": 3,
        },
        switches=False,
    )
    args += COMMON
    launch(args + ["--max_steps", "4", "--save_interval", "4"], nproc=2)
    assert read_state(run / "checkpoints" / tag_for(4))["world_size"] == 2

    proc = launch(
        args + ["--max_steps", "8", "--save_interval", "100", "--resume", "auto"],
        nproc=1,
        env={"BERTFORGE_FAULTS": "loss_nan@6"},
    )
    out = proc.stdout + proc.stderr
    assert "saved on 2 ranks, now 1" in out  # the resume converted it once
    assert "back to step 4 (rollback 1)" in out, out[-3000:]
    assert "written on 2 ranks, through its universal conversion" in out
    (event,) = guard_actions(run)
    assert event["action"] == "rollback" and event["to_step"] == 4
    assert event["converted_from_world_size"] == 2
    assert event["skipped_samples"] == [64, 96]  # the checkpoint's position .. the NaN step's end
    train = read_metrics(run / "metrics.jsonl")
    after = train[[r["step"] for r in train].index(6) + 1 :]
    assert [r["step"] for r in after] == [5, 6, 7, 8]  # the step counter went back to 4
    assert [r["consumed_samples"] for r in after] == [112, 128, 144, 160]  # data went on
    assert all(r["loss"] == r["loss"] and r["loss"] < 20 for r in after)  # finite, sane
    first_5 = next(r for r in train if r["step"] == 5)
    assert after[0]["lr"] == pytest.approx(first_5["lr"])  # the schedule came back with it
    # The universal load was switched off again: the final save is an ordinary 1-rank one.
    assert [s for s, _ in list_complete(run / "checkpoints")] == [4, 8]
    final = run / "checkpoints" / tag_for(8)
    assert read_state(final)["world_size"] == 1 and (final / "mp_rank_00_model_states.pt").is_file()
