"""A stop signal at any moment of a run: start-up, a save, a validation pass (and Ctrl-C twice).

SIGTERM reaches every process of a 2-rank ZeRO-2 job (two DataLoader workers per rank), sent by
rank 0 itself part-way through the phase (``term_in_PHASE@STEP@0``, pretrain/stability/faults.py)
as a scheduler sends it, with the job in a session of its own (SIGUSR1 too during the save, with
--preemption_signals TERM,INT,USR1). The run validates and saves every
2 steps; one run folder takes four launches: SIGTERM during the validation pass at step 2, during
the start-up of its resume, during the interval save at step 4, then a resume to step 6. After
each signal every rank exits 0 and the run stopped where it should (the signal save at step 2;
no step after the save at step 4; nothing at all after the start-up), and the losses the four
launches logged are bit-identical to those of one uninterrupted run. A second Ctrl-C stops at
once, in one line naming the newest complete checkpoint, which stays intact.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers.commands import REPO
from helpers.launch import COMMON, losses
from helpers.preemption import run_job_in_own_session

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config import command_line
from bertforge.pretrain.distributed.startup import free_port
from bertforge.pretrain.run_folder.run_checkpoints import (
    STATE_FILE,
    find_latest,
    is_complete,
    tag_for,
    verify,
)
from bertforge.pretrain.stability.faults import ENV_VAR

pytestmark = pytest.mark.slow

RANKS, STEPS, EVERY = 2, 6, 2  # validation and a checkpoint every EVERY steps


def train_cmd(shards: Path, run: Path, *extra: str) -> list[str]:
    """ZeRO-2 on CPU, tiny model, two loader workers per rank, validation and a checkpoint every
    2 steps, a constant lr after warmup."""
    return [
        *command_line.trainer(
            ds_config=REPO / "ds_configs" / "cpu.json",
            data=shards,
            output_dir=run,
            max_steps=STEPS,
            save_interval=EVERY,
            eval_interval=EVERY,
            eval_batches=2,
            decay="constant",
        ),
        *COMMON,
        *("--num_workers", "2", *extra),
    ]


def job(cmd: list[str], logs: Path, faults: str = "") -> list[tuple[int, str]]:
    """The 2-rank job in a session of its own, with ``faults`` planned; each rank's (exit
    status, output)."""
    return run_job_in_own_session(cmd, RANKS, free_port(), logs, env={ENV_VAR: faults})


def all_exit_0(results: list[tuple[int, str]]) -> None:
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{out[-4000:]}"
        assert "is killed by signal" not in out and "Traceback" not in out, out[-4000:]


# The launches of one run, in order: (moment of the signal or None, step it stops at). Each
# resumes from the checkpoint the one before left; the last one trains to STEPS.
CHAIN = [("validation", 2), ("startup", 2), ("save", 4), (None, STEPS)]
# SLURM's --signal=USR1@120 warning arrives with the SIGTERM during the save, when the training
# loader's workers are up: the ranks stop on it, the workers ignore it (USR1's default kills).
USR1 = ("--preemption_signals", "TERM,INT,USR1")


def left_by(run: Path, results: list[tuple[int, str]]) -> dict:
    """What a launch left: its ranks' results, the steps logged, the checkpoints and reasons."""
    ckpts = sorted((run / "checkpoints").glob("step_*"))
    return {
        "results": results,
        "steps": [r["step"] for r in read_metrics(run / "metrics.jsonl")],
        "checkpoints": [p.name for p in ckpts],
        "reasons": [json.loads((p / STATE_FILE).read_text())["reason"] for p in ckpts],
        "rng_files": sorted(p.name for p in (ckpts[-1] / "rng").iterdir()) if ckpts else [],
    }


@pytest.fixture(scope="module")
def chain(english_shards, tmp_path_factory) -> dict:
    """The uninterrupted reference's losses, and what each launch of :data:`CHAIN` left, by
    moment ("end" for the last); one run folder for the chain, so the losses it logged over its
    four launches compare with the reference's at once."""
    tmp = tmp_path_factory.mktemp("signal_any_moment")
    ref, run = tmp / "ref", tmp / "run"
    all_exit_0(job(train_cmd(english_shards, ref), tmp / "logs_ref"))
    out: dict = {"ref": losses(ref)}
    for i, (moment, stop) in enumerate(CHAIN):
        resume = ("--resume", "auto") if i else ()
        faults = f"term_in_{moment}@{stop}@0" if moment else ""  # rank 0 signals the whole job
        if moment == "save":
            faults += f",usr1_in_save@{stop}@0"
        cmd = train_cmd(english_shards, run, *resume, *USR1)
        results = job(cmd, tmp / f"logs_{i}", faults)
        out[moment or "end"] = {**left_by(run, results), "stop": stop}
        if i:  # the launch after a stop: where it resumed from
            out[CHAIN[i - 1][0]]["resumed"] = results[0][1]
    out["losses"] = losses(run)
    return out


MOMENTS = [moment for moment, _ in CHAIN if moment]


@pytest.mark.parametrize("moment", MOMENTS)
def test_sigterm_to_the_job_at_any_moment_stops_every_rank_with_exit_0(chain, moment):
    got = chain[moment]
    stop, out = got["stop"], got["results"][0][1]
    all_exit_0(got["results"])
    # The stop's checkpoint, written by every rank, and none after it; no step after the save
    # or the validation pass, none at all after the start-up.
    assert got["checkpoints"][-1] == tag_for(stop)
    assert got["rng_files"] == [f"rank_{r:05d}.pt" for r in range(RANKS)]
    assert got["steps"] == list(range(1, stop + 1))
    if moment == "startup":
        assert f"stopped by a signal during start-up, before step {stop + 1}" in out
        assert got["checkpoints"] == [tag_for(stop)]  # nothing saved: nothing was lost
    else:
        assert f"stopped by a signal after step {stop}" in out
        # During an interval save: that save, completed. During validation: the signal save.
        assert got["reasons"][-1] == ("interval" if moment == "save" else "signal")


@pytest.mark.parametrize("moment", MOMENTS)
def test_resume_after_the_signal_matches_the_uninterrupted_run(chain, moment):
    stop = chain[moment]["stop"]
    assert f"checkpoints/{tag_for(stop)} at step {stop}" in chain[moment]["resumed"]
    assert sorted(chain["losses"]) == list(range(1, STEPS + 1))
    assert chain["losses"] == chain["ref"]  # bit-identical, before and after every stop


def test_second_ctrl_c_stops_at_once_naming_the_newest_complete_checkpoint(
    english_shards, tmp_path
):
    """Ctrl-C during the final validation (the pass completes, the final save begins), then
    Ctrl-C again part-way through that save: one line, exit 130, the step-2 checkpoint intact
    and the one cut short without COMPLETE, so --resume auto takes step 2."""
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", ENV_VAR: "int_in_validation@3,int_in_save@3"}
    proc = subprocess.run(
        train_cmd(english_shards, run, "--max_steps", "3"),  # final validation and save at 3
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        start_new_session=True,  # the planned SIGINTs reach this job's group only, like a tty's
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 130, out[-4000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-4000:]
    kept = run / "checkpoints" / tag_for(2)
    lines = [line for line in out.splitlines() if "interrupted twice" in line]
    assert len(lines) == 1 and f"the newest complete checkpoint is {kept}" in lines[0], out
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl", "validation")] == [2, 3]
    partial = run / "checkpoints" / tag_for(3)
    assert partial.is_dir() and not is_complete(partial)  # cut short: no COMPLETE
    assert find_latest(run / "checkpoints") == kept and verify(kept) == []
