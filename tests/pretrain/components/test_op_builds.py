"""DeepSpeed's JIT op builds never hang a run silently (issue 36, item 1): each environment builds
into its own folder, a wait is reported and ends on a stop signal, a stale lock is refused with
the command that clears it, and a process killed during a build leaves a lock the next launch
names instead of waiting forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.commands import REPO, run_cli

from bertforge.preemption import PreemptionHandler
from bertforge.pretrain.components import op_builds
from bertforge.pretrain.doctor.op_rows import lock_rows

# Holds a file open the way torch's FileBaton does while it builds (O_CREAT | O_EXCL, fd open).
_HOLDER = (
    "import os, sys, time; os.open(sys.argv[1], os.O_CREAT | os.O_EXCL); "
    "print('held', flush=True); time.sleep(600)"
)


@pytest.fixture
def holder(tmp_path):
    """A live process holding ``tmp_path/op/lock`` open, like a build in progress."""
    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    yield lock, proc
    proc.kill()
    proc.wait()


def test_each_environment_gets_its_own_folder_unless_the_user_chose(monkeypatch, tmp_path):
    monkeypatch.delenv(op_builds.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = op_builds.use_environment_folder()
    assert os.environ[op_builds.ENV_VAR] == str(first)
    assert first.parent == tmp_path / "torch_extensions"
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "other-venv"))
    assert op_builds.default_extensions_dir() != first  # another environment, another folder
    monkeypatch.setenv(op_builds.ENV_VAR, str(tmp_path / "mine"))
    assert op_builds.use_environment_folder() == tmp_path / "mine"  # the user's choice wins


@pytest.mark.parametrize(
    "config, op",
    [
        ({"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}, None),
        ({"optimizer": {"type": "AdamW", "params": {}}}, "FusedAdamBuilder"),
        ({"optimizer": {"type": "Adam", "params": {}}}, "FusedAdamBuilder"),
        (
            {
                "optimizer": {"type": "AdamW"},
                "zero_optimization": {"offload_optimizer": {"device": "cpu"}},
            },
            "CPUAdamBuilder",
        ),
        ({"optimizer": {"type": "Lamb", "params": {}}}, "FusedLambBuilder"),
    ],
)
def test_needed_ops_follow_deepspeeds_optimizer_choice(config, op):
    assert op_builds.needed_ops(config) == ["ShareMemCommBuilder"] + ([op] if op else [])


def test_a_lock_held_by_a_live_build_is_not_stale(holder):
    lock_path, proc = holder
    lock = op_builds.inspect_lock(lock_path)
    assert lock.holders == (proc.pid,) and not lock.stale
    assert f"held by live pid {proc.pid}" in lock.describe()
    rows = lock_rows(lock_path.parent.parent)
    assert [r.status for r in rows] == ["WARN"] and str(lock_path) in rows[0].detail


def test_a_stale_lock_is_refused_with_the_command_that_clears_it(tmp_path):
    lock_path = tmp_path / "deepspeed_shm_comm" / "lock"
    lock_path.parent.mkdir()
    lock_path.touch()
    waiter = op_builds._Waiter("deepspeed_shm_comm", None)
    start = time.monotonic()
    with pytest.raises(op_builds.OpBuildError) as e:
        op_builds.wait_for_torch_lock(lock_path, waiter)
    assert time.monotonic() - start < 30
    assert f"rm -f {lock_path}" in str(e.value) and "held by no live process" in str(e.value)
    rows = lock_rows(tmp_path)
    assert [r.status for r in rows] == ["FAIL"] and f"rm -f {lock_path}" in rows[0].fix


def test_a_wait_is_reported_and_a_stop_signal_ends_it(holder, monkeypatch, capsys):
    """A run waiting on a live build says so (path, holder pid) and leaves with exit 0 on SIGTERM
    instead of waiting for the build as torch would."""
    lock_path, proc = holder
    monkeypatch.setattr(op_builds, "REPORT_AFTER_S", 0.5)
    preempt = PreemptionHandler("TERM,INT")
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        start = time.monotonic()
        with pytest.raises(SystemExit) as e:
            op_builds.wait_for_torch_lock(lock_path, op_builds._Waiter("fused_adam", preempt))
        assert e.value.code == 0 and time.monotonic() - start < 10
    finally:
        timer.cancel()
        preempt.restore()
    out = capsys.readouterr().out
    assert f"{lock_path}" in out and f"held by live pid {proc.pid}" in out
    assert "waited" in out and "SIGTERM while waiting to build op fused_adam" in out


def test_our_own_builders_take_turns_and_a_waiter_names_the_builder(tmp_path, monkeypatch):
    """Two processes of this project building one op: the second waits on the first's flock (the
    kernel drops it when the holder dies, so it cannot go stale) and names its pid."""
    monkeypatch.setattr(op_builds, "REPORT_AFTER_S", 0.3)
    folder = tmp_path / "op"
    first = op_builds._take_op_lock(folder, op_builds._Waiter("op", None))
    messages: list[str] = []
    monkeypatch.setattr(op_builds.log, "warning", lambda fmt, *a: messages.append(fmt % a))
    threading.Timer(1.0, os.close, (first,)).start()
    second = op_builds._take_op_lock(folder, op_builds._Waiter("op", None))
    os.close(second)
    assert any(f"pid {os.getpid()} building it" in m for m in messages), messages


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_killed_during_the_first_op_build_the_next_launch_names_the_lock(tmp_path):
    """The chaos moment "killed during the first op build": a process building DeepSpeed's CPU
    all-reduce op is SIGKILLed while torch's lock exists; the next `--build_ops` (what a run does
    first) fails within seconds naming the lock and the `rm` that clears it, the doctor FAILs it,
    and after that `rm` the lock is gone for good."""
    env = {**os.environ, op_builds.ENV_VAR: str(tmp_path / "ext")}
    lock = tmp_path / "ext" / "deepspeed_shm_comm" / "lock"
    build = subprocess.Popen(
        [sys.executable, "-m", "pretrain.doctor", "--build_ops"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its compiler too: the whole job is killed
    )
    deadline = time.monotonic() + 240
    while not lock.exists() and build.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(build.pid, signal.SIGKILL)
    build.wait()
    assert lock.exists(), "the build ended before its lock could be seen"
    # The stale judgement takes STALE_CONFIRM_S (2 s) once DeepSpeed is imported; the timeout
    # only bounds that import on a loaded machine (134 s seen beside 30 other processes).
    proc = run_cli("-m", "pretrain.doctor", "--build_ops", check=False, env=env, timeout=400)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"stale build lock {lock}" in proc.stderr and f"rm -f {lock}" in proc.stderr
    rows = lock_rows(Path(env[op_builds.ENV_VAR]))
    assert [r.status for r in rows] == ["FAIL"]
    subprocess.run(rows[0].fix.split(": ", 1)[1], shell=True, check=True)
    assert lock_rows(Path(env[op_builds.ENV_VAR])) == []
