"""DeepSpeed's JIT op builds never hang a run silently (issue 36, item 1): each environment builds
into its own folder, a wait is reported and ends on a stop signal, a stale lock is removed with a
warning naming it (the doctor shows it with its ``rm``), and a stop signal during a build is a
stop, not a failed build. A job SIGKILLed during its first op build and launched again is the
chaos test's ``op_build`` moment (tests/e2e/test_chaos_kills.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bertforge.preemption import PreemptionHandler
from bertforge.pretrain.distributed import op_builds
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


def test_a_stale_lock_is_removed_saying_so_and_the_doctor_shows_the_rm(tmp_path, monkeypatch):
    """A lock nobody holds (a build killed midway) is removed within seconds, with a warning that
    names it, instead of hanging the run; before that the doctor shows it with its ``rm``."""
    lock_path = tmp_path / "deepspeed_shm_comm" / "lock"
    lock_path.parent.mkdir()
    lock_path.touch()
    rows = lock_rows(tmp_path)
    assert [r.status for r in rows] == ["WARN"] and f"rm -f {lock_path}" in rows[0].fix
    assert "a launch removes it" in rows[0].fix and "held by no live process" in rows[0].detail
    messages: list[str] = []
    monkeypatch.setattr(
        op_builds.log, "warning", lambda fmt, *a, **kw: messages.append((fmt % a, kw))
    )
    start = time.monotonic()
    op_builds.wait_for_torch_lock(lock_path, op_builds._Waiter("deepspeed_shm_comm", None))
    assert time.monotonic() - start < 30 and not lock_path.exists()
    said = [kw for m, kw in messages if f"removing the stale build lock {lock_path}" in m]
    assert said == [{"extra": {"all_ranks": True}}], messages  # not only rank 0: the remover
    assert lock_rows(tmp_path) == []


def test_a_stale_lock_that_cannot_be_removed_is_refused_with_the_rm(tmp_path, monkeypatch):
    lock_path = tmp_path / "op" / "lock"
    lock_path.parent.mkdir()
    lock_path.touch()

    def refuse(self, missing_ok=False):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "unlink", refuse)
    with pytest.raises(op_builds.OpBuildError) as e:
        op_builds.wait_for_torch_lock(lock_path, op_builds._Waiter("op", None))
    assert f"rm -f {lock_path}" in str(e.value) and "Permission denied" in str(e.value)


def test_a_stop_signal_that_ends_the_compiler_stops_with_exit_0(tmp_path, monkeypatch):
    """The job's SIGTERM reaches the compiler too, so the build fails: that is a stop during
    start-up (exit 0, resume later), not a failed build (exit 2 blaming g++). A rank that gets
    the op after the signal stops before building."""
    import deepspeed.accelerator
    import deepspeed.ops

    preempt = PreemptionHandler("TERM,INT")

    class Builder:
        NAME = "fake_op"
        signalled = False

        def load(self, verbose=False):
            if not Builder.signalled:  # the group's signal, mid-build, the first time
                Builder.signalled = True
                os.kill(os.getpid(), signal.SIGTERM)
            raise RuntimeError("Error building extension 'fake_op'")  # ninja was killed

    class Accelerator:
        def create_op_builder(self, name):
            return Builder()

    monkeypatch.setenv(op_builds.ENV_VAR, str(tmp_path))
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, "fake_op", True)  # (imports its ops)
    monkeypatch.setattr(deepspeed.accelerator, "get_accelerator", Accelerator)
    try:
        with pytest.raises(SystemExit) as e:
            op_builds.prepare(["FakeBuilder"], preempt)
        assert e.value.code == 0
        preempt.signal = None  # the same failure without a stop signal: a failed build
        with pytest.raises(op_builds.OpBuildError, match="op fake_op: the build in"):
            op_builds.prepare(["FakeBuilder"], preempt)
        # A signal that came while another rank held the op: no build is started (its compiler
        # would never get the job's signal).
        preempt.signal = signal.SIGTERM
        Builder.load = lambda self, verbose=False: pytest.fail("a build started after a stop")
        with pytest.raises(SystemExit) as e:
            op_builds.prepare(["FakeBuilder"], preempt)
        assert e.value.code == 0
    finally:
        preempt.restore()


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
