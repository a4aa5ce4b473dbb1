"""One job per folder: an exclusive lock file that names its holder and does not outlive a crash.

The lock is a small JSON file {host, pid, started, command}. It is created whole with
``os.link`` of a fully written temporary file (atomic, fails if the lock exists, and honoured by
NFS v3+), so a reader never sees a half-written lock. When the lock exists:

- same host, holder's pid not alive: the holder crashed; the lock is taken over with a warning;
- same host, pid alive: refused (LockError) naming the host and pid;
- another host: refused naming the host, pid and the lock's age, with how to remove it if that
  job is really gone (its pid cannot be checked from here).

Release removes the file only while it still names this process. Used by ``data_prep build``
(one lock per part of an output, and the merge's lock), and by the trainer (one lock per run
folder, rank 0).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Self

from bertforge.errors import UserError
from bertforge.logs import get_logger

log = get_logger(__name__)


class LockError(UserError, RuntimeError):
    """The folder is in use by another job (the message names it and what to do)."""


def _pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (signal 0 checks, sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _read_holder(path: Path) -> dict[str, Any] | None:
    """The lock's content, or None when it vanished (released between our tries)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: treated as held by an unknown job (never taken silently)


def _age(path: Path, holder: dict[str, Any]) -> str:
    """How long ago the holder took the lock, for the message."""
    started = holder.get("started")
    if not isinstance(started, (int, float)):
        try:
            started = path.stat().st_mtime
        except OSError:
            return "unknown age"
    seconds = max(0, int(time.time() - started))
    hours, rest = divmod(seconds, 3600)
    return f"taken {hours} h {rest // 60} min {rest % 60} s ago"


class FolderLock:
    """An exclusive lock at ``path`` for the job described by ``what`` (used in messages).

    Use as a context manager, or call :meth:`acquire` and :meth:`release`.
    """

    def __init__(self, path: str | os.PathLike, what: str, *, make_parent: bool = True):
        self.path = Path(path)
        self.what = what
        self.make_parent = make_parent  # False: a missing folder raises FileNotFoundError
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.held = False

    def _try_create(self) -> bool:
        """Create the lock whole; False when it exists already."""
        if self.make_parent:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{self.host}.{self.pid}.tmp")
        record = {
            "host": self.host,
            "pid": self.pid,
            "started": time.time(),
            "command": list(sys.argv),
        }
        tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def acquire(self) -> Self:
        """Take the lock, taking over a crashed holder's; raises LockError while it is held."""
        for _ in range(3):  # the holder may release between our create and our read
            if self._try_create():
                self.held = True
                return self
            holder = _read_holder(self.path)
            if holder is None:
                continue
            self._take_over_or_refuse(holder)
        raise LockError(f"{self.path}: could not take the lock for {self.what}; try again.")

    def _take_over_or_refuse(self, holder: dict[str, Any]) -> None:
        """Remove a lock whose holder died on this host (so the caller retries), else raise."""
        host, pid = holder.get("host"), holder.get("pid")
        if host == self.host and isinstance(pid, int) and not _pid_alive(pid):
            log.warning(
                f"{self.path}: taking over the lock of {self.what} from pid {pid} on "
                f"{host}, which is no longer running (it crashed or was killed)"
            )
            self.path.unlink(missing_ok=True)
            return
        if host == self.host:
            raise LockError(
                f"{self.what} is in use: {self.path} is held by pid {pid} on this host "
                f"({host}, {_age(self.path, holder)}). Wait for that job to finish or stop it, "
                "or use another folder."
            )
        raise LockError(
            f"{self.what} is in use: {self.path} is held by pid {pid} on host {host} "
            f"({_age(self.path, holder)}); its liveness cannot be checked from {self.host}. "
            f"Wait for it or use another folder; if that job is really gone, remove {self.path} "
            "and start again."
        )

    def release(self) -> None:
        """Remove the lock if this process still holds it."""
        if not self.held:
            return
        self.held = False
        holder = _read_holder(self.path)
        if holder and holder.get("host") == self.host and holder.get("pid") == self.pid:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
