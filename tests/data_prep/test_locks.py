"""One job per folder: a busy run folder or build output is refused with the holder's host and
pid; a crashed holder's lock is taken over; another host's lock is refused with its age."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.commands import REPO

from bertforge.data_prep.lock import FolderLock, LockError

HOST = socket.gethostname()


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _plant(path: Path, host: str, pid: int, age_s: float = 0.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"host": host, "pid": pid, "started": time.time() - age_s, "command": ["x"]}
    path.write_text(json.dumps(record))


def test_second_holder_refused_with_host_and_pid(tmp_path):
    path = tmp_path / ".lock"
    with FolderLock(path, "run folder X") as first:
        assert first.held and json.loads(path.read_text())["pid"] == os.getpid()
        _plant(path, HOST, os.getppid())  # a live process on this host holds it
        with pytest.raises(LockError, match=rf"held by pid {os.getppid()} on this host \({HOST}"):
            FolderLock(path, "run folder X").acquire()
    assert path.exists()  # release leaves a lock that is no longer ours alone


def test_release_removes_the_lock_and_it_can_be_taken_again(tmp_path):
    path = tmp_path / "sub" / ".lock"
    with FolderLock(path, "run folder X"):
        assert path.is_file()
    assert not path.exists()
    with FolderLock(path, "run folder X") as again:
        assert again.held


def test_crashed_holder_on_this_host_is_taken_over_with_a_warning(tmp_path, capsys):
    path = tmp_path / ".lock"
    dead = _dead_pid()
    _plant(path, HOST, dead)
    lock = FolderLock(path, "run folder X").acquire()
    assert lock.held and json.loads(path.read_text())["pid"] == os.getpid()
    out = capsys.readouterr().out  # a warning: stdout, as every log line below ERROR
    said = f"[data_prep] WARNING: {path}: taking over the lock of run folder X from pid {dead}"
    assert said in out
    lock.release()


def test_another_hosts_lock_is_refused_with_its_age_and_how_to_remove_it(tmp_path):
    path = tmp_path / ".lock"
    _plant(path, "node-b", 4242, age_s=2 * 3600 + 5 * 60)
    with pytest.raises(LockError) as e:
        FolderLock(path, "run folder X").acquire()
    msg = str(e.value)
    assert "pid 4242 on host node-b" in msg and "taken 2 h 5 min" in msg
    assert f"remove {path}" in msg
    assert json.loads(path.read_text())["host"] == "node-b"  # never taken


def test_second_trainer_on_a_busy_run_folder_is_refused(english_shards, tmp_path):
    run = tmp_path / "run"
    with FolderLock(run / ".lock", "test"):
        proc = subprocess.run(
            [sys.executable, "pretrain/main.py", "--data", str(english_shards)]
            + ["--output_dir", str(run), "--model", "tiny", "--max_steps", "1"],
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 2, proc.stderr
    assert f"held by pid {os.getpid()} on this host ({HOST}" in proc.stderr
    assert not (run / "config.json").exists()  # refused before writing anything
    assert not (run / "verified_shards.json").exists()


def test_second_build_on_an_output_being_built_is_refused(english_corpus, tmp_path):
    out = tmp_path / "shards"
    cmd = [sys.executable, "-m", "data_prep", "build", "--input", str(english_corpus)]
    cmd += ["--output", str(out), "--vocab_size", "300", "--max_seq_len", "64"]
    with FolderLock(tmp_path / ".shards.part-0-of-1.lock", "test"):  # a build in progress
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert f"data_prep build of {out.resolve()} is in use" in proc.stderr
    assert f"held by pid {os.getpid()}" in proc.stderr
    assert not out.exists()  # nothing touched
    # Parts of a partitioned build run side by side: part 1 is not blocked by part 0's lock.
    prep = [sys.executable, "-m", "data_prep", "prepare", *cmd[4:]]
    subprocess.run(prep, cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    with FolderLock(tmp_path / ".shards.part-0-of-2.lock", "test"):
        part = subprocess.run(
            cmd + ["--num_partitions", "2", "--partition", "1"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        again = subprocess.run(
            cmd + ["--num_partitions", "2", "--partition", "0"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert part.returncode == 0, part.stderr
    assert again.returncode != 0 and "(part 0 of 2) is in use" in again.stderr
    assert not (tmp_path / ".shards.part-1-of-2.lock").exists()  # released on exit
    # A merge that crashed left its lock (a dead pid on this host): the last part takes it over
    # with a warning and merges, instead of waiting for a holder that will never finish.
    dead = _dead_pid()
    _plant(out / ".work" / "merge.lock", HOST, dead)
    last = subprocess.run(
        cmd + ["--num_partitions", "2", "--partition", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert last.returncode == 0, last.stderr
    assert f"taking over the lock of the merge of {out} from pid {dead}" in last.stdout
    assert (out / "manifest.json").is_file() and not (out / ".work").exists()


def test_merge_lock_refuses_a_live_holder_and_never_recreates_a_merged_work_folder(tmp_path):
    from bertforge.data_prep.partition import MergeLock

    out = tmp_path / "shards"
    (out / ".work").mkdir(parents=True)
    _plant(out / ".work" / "merge.lock", HOST, os.getppid())  # a live merge on this host
    with MergeLock(out) as lock:
        assert not lock.held
    assert json.loads((out / ".work" / "merge.lock").read_text())["pid"] == os.getppid()
    (out / ".work" / "merge.lock").unlink()
    with MergeLock(out) as lock:
        assert lock.held and json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert not (out / ".work" / "merge.lock").exists()
    (out / ".work").rmdir()  # merged: .work is gone
    with MergeLock(out) as lock:
        assert not lock.held
    assert not (out / ".work").exists()
