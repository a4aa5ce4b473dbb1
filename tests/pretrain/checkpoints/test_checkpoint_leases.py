"""A checkpoint a background job is reading is not pruned until the job has read it, and no
dead job keeps one forever (pretrain/checkpoints/leases.py; the job side is exercised by
tests/e2e/test_downstream_during_training.py with --keep_last 1)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertforge.pretrain.checkpoints import leases
from bertforge.pretrain.checkpoints.checkpoint import CheckpointManager
from bertforge.pretrain.checkpoints.checkpoint_files import write_marker
from bertforge.pretrain.config.train_config import CheckpointConfig
from bertforge.pretrain.run_folder.run_checkpoints import list_complete, tag_for


def fake_checkpoints(run: Path, steps: list[int]) -> None:
    """Complete checkpoint folders with one weight file each (the prune reads only markers)."""
    for step in steps:
        folder = run / "checkpoints" / tag_for(step)
        folder.mkdir(parents=True)
        (folder / "weights.pt").write_bytes(b"w" * 10)
        write_marker(folder, {"weights.pt": 10})


def steps_on_disk(run: Path) -> list[int]:
    return [s for s, _ in list_complete(run / "checkpoints")]


@pytest.fixture
def sleeper():
    """A live process of this host that a test can end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_leased_checkpoint_outlives_keep_last_until_its_job_ends(tmp_path, sleeper, capsys):
    run = tmp_path / "run"
    fake_checkpoints(run, [2, 4])
    ckpts = CheckpointManager(run, CheckpointConfig(keep_last=1), rank=0, world_size=1)
    lease = leases.take(run / "checkpoints" / tag_for(2), sleeper.pid, "downstream evaluation")
    assert json.loads(lease.read_text())["start"] is not None  # Linux: the pid's start time

    fake_checkpoints(run, [6])
    ckpts._prune(keep=run / "checkpoints" / tag_for(6))
    assert steps_on_disk(run) == [2, 6]  # 4 pruned; 2 kept: its reader is alive
    assert f"downstream evaluation (pid {sleeper.pid} on" in capsys.readouterr().out
    ckpt_2 = run / "checkpoints" / tag_for(2)

    sleeper.kill()
    sleeper.wait()  # dead and reaped, its lease left behind (a crashed job)
    ckpts.prune()  # the end of a run, or the next save
    assert steps_on_disk(run) == [6] and not ckpt_2.exists()


def test_a_released_lease_lets_the_next_prune_go(tmp_path, sleeper):
    run = tmp_path / "run"
    fake_checkpoints(run, [2, 4])
    ckpt = run / "checkpoints" / tag_for(2)
    lease = leases.take(ckpt, sleeper.pid, "downstream evaluation")
    ckpts = CheckpointManager(run, CheckpointConfig(keep_last=1), rank=0, world_size=1)
    ckpts.prune()
    assert steps_on_disk(run) == [2, 4]
    leases.release(lease)  # the job has read it
    assert not (ckpt / leases.LEASE_DIR).exists()  # the last one out removed the folder
    ckpts.prune()
    assert steps_on_disk(run) == [4]


def test_leases_that_no_longer_count_are_removed(tmp_path, sleeper, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    leases.take(ckpt, gone.pid, "a job that crashed")  # a dead pid
    reused = leases.take(ckpt, sleeper.pid, "a pid reused since")
    info = json.loads(reused.read_text())
    reused.write_text(json.dumps({**info, "start": str(int(info["start"]) - 1)}))
    assert leases.live_leases(ckpt) == []
    assert not list((ckpt / leases.LEASE_DIR).glob("*.json"))

    # Another host's lease cannot be checked from here: it counts for FOREIGN_LEASE_S.
    now = time.time()
    foreign = {"host": "other-node", "pid": 1, "start": None, "what": "x", "taken": now - 60}
    assert leases.counts(foreign, now)
    assert not leases.counts({**foreign, "taken": now - leases.FOREIGN_LEASE_S - 1}, now)
    # A live one on this host counts; damaged lease files do not.
    live = leases.take(ckpt, sleeper.pid, "downstream evaluation")
    (ckpt / leases.LEASE_DIR / "broken.json").write_text("{")
    assert [h["pid"] for h in leases.live_leases(ckpt)] == [sleeper.pid] and live.is_file()
    assert not (ckpt / leases.LEASE_DIR / "broken.json").exists()
