"""DeepSpeed's JIT-built ops: one build folder per environment, built ahead, never a silent wait.

DeepSpeed compiles some ops on first use (on the CPU accelerator its shared-memory all-reduce,
``deepspeed_shm_comm``, at every start-up; ``fused_adam``, ``cpu_adam`` or ``fused_lamb`` when the
config's optimizer needs them) through torch's cpp_extension into ``TORCH_EXTENSIONS_DIR/<op>/``,
holding a file ``lock`` there while it builds. Torch waits for that file with no timeout and no
message, so a build killed midway used to hang every later run silently. Here:

* :func:`use_environment_folder` points ``TORCH_EXTENSIONS_DIR`` (when the user has not set it) at
  a folder of this Python environment's own, keyed by ``sys.prefix``: two environments on one
  machine no longer rebuild the same op in turns.
* :func:`prepare` builds or loads every op a run needs before DeepSpeed asks for it, one process at
  a time per op (an ``flock`` on ``<op>/bertforge.lock``, which the kernel drops when its holder
  dies, so it can never go stale). A process that waits says so within
  :data:`REPORT_AFTER_S` seconds, names the file and the pid building, and keeps honouring the
  job's stop signals (:mod:`bertforge.preemption`): it stops with exit 0, as any stop
  during start-up does.
* A torch ``lock`` is judged **stale** when no process on this machine holds it open (torch's
  builder keeps the file's descriptor open for the whole build) during :data:`STALE_CONFIRM_S`
  seconds, on a local filesystem, while this process holds the op's flock (no other process of
  this project builds it, in any container of this kernel). A run removes it, says so naming the
  file, and builds: a job killed during its first build (a preemption, the OOM killer, a
  scheduler's requeue) starts again by itself. The doctor shows it with the ``rm`` that clears it.
  On a network filesystem the holder may be another machine: the run waits and reports instead.
* A stop signal that reaches the job during a build (the group's SIGTERM also ends the compiler)
  stops the process with exit 0, as any stop during start-up does, not as a failed build.

``bertforge doctor --build_ops [--ds_config X]`` (run by ``make install``) builds the ops
ahead of the first run.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bertforge.errors import UserError
from bertforge.logs import get_logger

log = get_logger(__name__)

ENV_VAR = "TORCH_EXTENSIONS_DIR"
TORCH_LOCK = "lock"  # torch.utils.file_baton's file in the op's build folder
OUR_LOCK = "bertforge.lock"  # our flock: one builder per op among this project's processes
REPORT_AFTER_S = 10.0  # a wait longer than this is reported (the issue asks for <= 30 s)
REPORT_EVERY_S = 60.0  # and reported again this often
STALE_CONFIRM_S = 2.0  # a lock seen unheld this long (same file) is stale
POLL_S = 0.2
STALE_REMOVED = "removing the stale build lock"  # the warning's words (the chaos test reads them)
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "ceph", "glusterfs")


class OpBuildError(UserError):
    """An op cannot be built or loaded; the message names the file and what to do."""


def default_extensions_dir() -> Path:
    """This environment's build folder: ``~/.cache/torch_extensions/bertforge-pyXY-<key>``, the
    key a hash of the real ``sys.prefix`` (XDG_CACHE_HOME respected, as torch does)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:12]
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    return cache / "torch_extensions" / f"bertforge-{tag}-{key}"


def use_environment_folder() -> Path:
    """Set ``TORCH_EXTENSIONS_DIR`` to this environment's folder unless the user set it; the
    folder torch builds into from now on (subprocesses inherit it)."""
    if not os.environ.get(ENV_VAR):
        os.environ[ENV_VAR] = str(default_extensions_dir())
    return Path(os.environ[ENV_VAR])


def needed_ops(ds_config: dict | None) -> list[str]:
    """DeepSpeed op-builder class names a run with ``ds_config`` builds: the CPU all-reduce (the
    accelerator skips it where it has none) and the optimizer's op, as DeepSpeed's engine
    picks it."""
    ops = ["ShareMemCommBuilder"]
    opt = (ds_config or {}).get("optimizer") or {}
    kind, params = str(opt.get("type", "")).lower(), opt.get("params") or {}
    offload = ((ds_config or {}).get("zero_optimization") or {}).get("offload_optimizer") or {}
    if kind in ("adam", "adamw") and not params.get("torch_adam", False):
        on_cpu = offload.get("device") in ("cpu", "nvme")
        ops.append("CPUAdamBuilder" if on_cpu else "FusedAdamBuilder")
    elif kind == "lamb":
        ops.append("FusedLambBuilder")
    return ops


@dataclass(frozen=True)
class BuildLock:
    """Torch's build lock of one op, as this machine sees it."""

    path: Path
    age_s: float  # since the file was created (its mtime)
    holders: tuple[int, ...]  # pids on this machine that hold it open (the builder)
    network_fs: bool  # on NFS & co: a holder on another machine is invisible here
    inode: int

    @property
    def stale(self) -> bool:
        """Nobody builds: no holder here, and no other machine could hold it."""
        return not self.holders and not self.network_fs

    def describe(self) -> str:
        """One phrase: the file, its age, and who holds it."""
        if self.holders:
            who = f"held by live pid {', '.join(map(str, self.holders))} (building)"
        elif self.network_fs:
            who = "held by no process on this machine (network filesystem: maybe another machine)"
        else:
            who = "held by no live process (a build killed midway left it: stale)"
        return f"{self.path} (age {self.age_s:.0f} s), {who}"


def holders_of(path: Path) -> tuple[int, ...]:
    """Pids of this machine's readable processes with ``path`` open."""
    target, pids = str(path), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) == target for fd in (proc / "fd").iterdir()):
                pids.append(int(proc.name))
        except OSError:  # the process ended, or belongs to another user
            continue
    return tuple(sorted(pids))


def on_network_fs(path: Path) -> bool:
    """True when ``path`` lies on a network filesystem (longest mount point of /proc/mounts)."""
    real, best, fstype = os.path.realpath(path), "", ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, fstype = point, fields[2]
    return fstype.split(".")[0] in NETWORK_FS or fstype.startswith("fuse.sshfs")


def inspect_lock(path: Path) -> BuildLock | None:
    """The lock at ``path``, or None when there is none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    age = max(time.time() - st.st_mtime, 0.0)
    return BuildLock(path, age, holders_of(path), on_network_fs(path), st.st_ino)


def find_locks(root: Path) -> list[BuildLock]:
    """Every torch build lock under the extensions folder ``root`` (``root/<op>/lock``)."""
    found = (inspect_lock(p) for p in sorted(root.glob(f"*/{TORCH_LOCK}")))
    return [lock for lock in found if lock is not None]


def clear_command(locks: list[BuildLock]) -> str:
    """The shell command that removes stale locks."""
    return "rm -f " + " ".join(str(lock.path) for lock in locks)


class _Waiter:
    """Reports a wait (after REPORT_AFTER_S, then every REPORT_EVERY_S) and ends it on a stop
    signal: the process exits 0 before its first step, as any stop during start-up."""

    def __init__(self, op: str, preempt) -> None:
        self.op, self.preempt = op, preempt
        self.start = time.monotonic()
        self.reported: float | None = None

    def tick(self, what: str) -> None:
        now = time.monotonic()
        due = REPORT_AFTER_S if self.reported is None else self.reported + REPORT_EVERY_S
        if now - self.start >= due:
            log.warning(
                "op %s: waited %.0f s for %s; a stop signal ends the wait",
                self.op,
                now - self.start,
                what,
            )
            self.reported = now
        self.stop_if_signalled(f"while waiting to build op {self.op}")
        time.sleep(POLL_S)

    def stop_if_signalled(self, when: str) -> None:
        """Exit 0 if a stop signal has come (as any stop during start-up does); ``when`` says
        where it found the process, for the warning."""
        if self.preempt is not None and self.preempt.signal is not None:
            log.warning(
                "%s %s: stopped during start-up, before the first step; nothing to save "
                "(resume with --resume auto)",
                self.preempt.name,
                when,
            )
            raise SystemExit(0)


def _holder_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode().strip() or "?"
    except OSError:
        return "?"


def _take_op_lock(folder: Path, waiter: _Waiter) -> int:
    """Our flock on ``folder/OUR_LOCK`` (waiting, reported, signals honoured); its fd."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / OUR_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            waiter.tick(f"pid {_holder_pid(fd)} building it ({folder / OUR_LOCK})")
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def clear_stale(lock: BuildLock, op: str) -> None:
    """Remove a lock judged stale (torch would wait for it forever), saying so; OpBuildError when
    it cannot be removed."""
    log.warning(  # whichever rank takes the op first removes it: each says so
        "op %s: %s %s; building the op again",
        op,
        STALE_REMOVED,
        lock.describe(),
        extra={"all_ranks": True},
    )
    try:
        lock.path.unlink(missing_ok=True)
    except OSError as e:
        raise OpBuildError(
            f"op {op}: stale build lock {lock.describe()} cannot be removed ({e}). Torch would "
            f"wait for it forever. Remove it and launch again: {clear_command([lock])}"
        ) from None


def wait_for_torch_lock(path: Path, waiter: _Waiter) -> None:
    """Return once torch's lock at ``path`` is gone: a live build finished, or a stale lock was
    removed (:func:`clear_stale`). The caller holds the op's flock."""
    unheld: tuple[int, float] | None = None  # (inode, since) of a lock seen without a holder
    first = True
    while (lock := inspect_lock(path)) is not None:
        if first:  # not ours (we hold the op's flock): say so at once
            log.warning("op %s: build lock %s", waiter.op, lock.describe())
            first = False
        if lock.stale:
            if unheld is None or unheld[0] != lock.inode:
                unheld = (lock.inode, time.monotonic())
            elif time.monotonic() - unheld[1] >= STALE_CONFIRM_S:
                clear_stale(lock, waiter.op)
                return
        else:
            unheld = None
        waiter.tick(f"build lock {lock.describe()}")


def prepare(op_names: list[str], preempt=None) -> list[str]:
    """Build or load each op of ``op_names`` (DeepSpeed builder class names) that this
    accelerator has and supports, one process per op at a time; the names of those prepared.
    DeepSpeed's own later ``load()`` returns the module loaded here."""
    # Lazy: deepspeed takes seconds to import; the commands that import this module without running
    # a job (--help, the doctor) do without it.
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    root = use_environment_folder()
    done = []
    for name in op_names:
        builder = get_accelerator().create_op_builder(name)
        if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            continue  # this accelerator has no such op, or DeepSpeed would not use it here
        waiter = _Waiter(builder.NAME, preempt)
        folder = root / builder.NAME
        fd = _take_op_lock(folder, waiter)
        try:
            wait_for_torch_lock(folder / TORCH_LOCK, waiter)
            # A signal that came while another rank built: the compiler this rank would start
            # now would not get it (the job's group signal is gone), so stop before building.
            waiter.stop_if_signalled(f"before the build of op {builder.NAME}")
            started = time.monotonic()
            try:
                builder.load(verbose=False)
            except Exception as e:  # noqa: BLE001  compiler missing, build error: name the op
                waiter.stop_if_signalled(
                    f"during the build of op {builder.NAME} (it ended the compiler)"
                )
                raise OpBuildError(
                    f"op {builder.NAME}: the build in {folder} failed ({type(e).__name__}: {e}); "
                    "it needs g++ and ninja (`ds_report` lists what DeepSpeed sees)"
                ) from None
            took = time.monotonic() - started
            if took > 5:
                log.info("op %s: built in %.0f s into %s", builder.NAME, took, folder)
        finally:
            os.close(fd)  # drops the flock
        done.append(builder.NAME)
    return done
