"""SIGTERM to every process of a job, DataLoader workers included, as SLURM sends it on scancel
and preemption: the same step-boundary save and exit 0 as a SIGTERM to one rank.

Two ranks started as srun starts a job step's tasks (no launcher in between, all in one process
group), ZeRO-2, two loader workers per rank. Before the workers ignored the job's signals, they
died first and each rank stopped with "DataLoader worker (pid N) is killed by signal" (exit 1),
so the run fell back to its previous interval checkpoint. The resume is then bit-identical to a
run that was never stopped, and no job left its shared-memory all-reduce buffers in /dev/shm.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import pytest
from helpers.commands import REPO
from helpers.launch import COMMON, launch, losses
from helpers.preemption import run_tasks_and_signal_group
from helpers.shm import left_in_shm, port_of

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.distributed.startup import free_port
from bertforge.pretrain.run_folder.run_checkpoints import STATE_FILE, find_latest, tag_for

pytestmark = pytest.mark.slow

RANKS = 2


def train_args(shards: Path, run: Path) -> list[str]:
    """ZeRO-2 on CPU, tiny model, two loader workers per rank; a constant lr after warmup, so
    the signalled run's --max_steps 400 does not change the schedule of its first steps."""
    return [
        "--ds_config",
        str(REPO / "ds_configs" / "cpu.json"),
        "--data",
        str(shards),
        "--output_dir",
        str(run),
        *COMMON,
        "--num_workers",
        "2",
        "--decay",
        "constant",
        "--eval_batches",
        "2",
    ]


def steps_logged(run: Path) -> int:
    path = run / "metrics.jsonl"
    return len(read_metrics(path)) if path.is_file() else 0


@pytest.fixture(scope="module")
def group_sigterm(english_shards, tmp_path_factory) -> dict:
    """The signalled run (SIGTERM to its process group after 3 logged steps), its resume to 2
    steps past the stop, and an uninterrupted reference of the same length."""
    tmp = tmp_path_factory.mktemp("group_sigterm")
    run, ref = tmp / "run", tmp / "ref"
    port = free_port()
    task = [sys.executable, "pretrain/main.py", *train_args(english_shards, run)]
    results = run_tasks_and_signal_group(
        task + ["--max_steps", "400"],
        RANKS,
        port,
        tmp,
        ready=lambda: steps_logged(run) >= 3,
        sig=signal.SIGTERM,
    )
    out = results[0][1]
    found = re.search(r"stopped by a signal after step (\d+)", out)
    assert found, "\n".join(o[-3000:] for _, o in results)
    stop = int(found.group(1))
    resumed = launch(
        train_args(english_shards, run) + ["--max_steps", str(stop + 2), "--resume", "auto"]
    )
    reference = launch(train_args(english_shards, ref) + ["--max_steps", str(stop + 2)])
    return {
        "results": results,
        "stop": stop,
        "run": run,
        "ref": ref,
        "resumed": resumed.stdout + resumed.stderr,
        "ports": [port, port_of(resumed.args), port_of(reference.args)],
    }


def test_sigterm_to_the_whole_group_saves_at_the_step_boundary_and_exits_0(group_sigterm):
    stop, run = group_sigterm["stop"], group_sigterm["run"]
    for rank, (code, out) in enumerate(group_sigterm["results"]):
        assert code == 0, f"rank {rank} exited {code}:\n{out[-4000:]}"
        assert "is killed by signal" not in out
    ckpt = run / "checkpoints" / tag_for(stop)
    assert json.loads((ckpt / STATE_FILE).read_text())["reason"] == "signal"
    assert (ckpt / "rng" / "rank_00001.pt").is_file()  # every rank saved
    assert f"resumed from {ckpt}" in group_sigterm["resumed"]


def test_resume_after_group_sigterm_matches_the_uninterrupted_run(group_sigterm):
    stop = group_sigterm["stop"]
    got, ref = losses(group_sigterm["run"]), losses(group_sigterm["ref"])
    assert sorted(got) == list(range(1, stop + 3))
    assert got == ref  # bit-identical, before and after the stop
    assert find_latest(group_sigterm["run"] / "checkpoints").name == tag_for(stop + 2)


def test_no_job_leaves_its_shared_memory_buffers(group_sigterm):
    # The signalled job (srun-style, LOCAL_SIZE set) and the two launcher runs.
    for port in group_sigterm["ports"]:
        assert left_in_shm(port) == [], port
