"""Leases on checkpoints: a job that reads a checkpoint in the background holds one, and pruning
(``--keep_last``) keeps a leased checkpoint until the job has read it.

A lease is a small JSON file ``CKPT/.leases/HOST-PID.json`` (``host``, ``pid``, the process's
``start`` time, ``what`` holds it, ``taken`` at), written atomically. It counts while its holder
lives, so no crash keeps a checkpoint forever:

- on this host: the pid exists, is not a zombie, and (where ``/proc`` tells) started at the
  recorded time, so a pid reused by another process does not keep the lease;
- on another host (a shared file system): for :data:`FOREIGN_LEASE_S` after it was taken, since
  its pid cannot be checked from here.

A lease that no longer counts is removed by whoever finds it. The holder removes its lease as
soon as it has read the checkpoint (``pretrain.evaluate.downstream``); the trainer removes it too
when the job ends, whatever way it ended (:mod:`pretrain.components.downstream_jobs`). The
checkpoint's ``COMPLETE`` manifest does not list ``.leases/``, and ``verify`` ignores files it
does not list, so a lease never makes a checkpoint look damaged.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from bertforge.files import write_json_atomic

LEASE_DIR = ".leases"
FOREIGN_LEASE_S = 6 * 3600.0  # another host's lease counts this long (its pid is not checkable)


def lease_path(ckpt: str | os.PathLike, pid: int, host: str | None = None) -> Path:
    """Where the lease of process ``pid`` on ``host`` (this one by default) on ``ckpt`` lives."""
    return Path(ckpt) / LEASE_DIR / f"{host or socket.gethostname()}-{pid}.json"


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), or None
    where ``/proc`` does not tell (not Linux, or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # the fields after "(comm)" start at field 3


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process of this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, someone else's
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state not in ("Z", "X")


def take(ckpt: str | os.PathLike, pid: int, what: str) -> Path:
    """Hold a lease on checkpoint ``ckpt`` for process ``pid`` of this host; returns its file."""
    path = lease_path(ckpt, pid)
    path.parent.mkdir(exist_ok=True)
    info = {
        "host": socket.gethostname(),
        "pid": pid,
        "start": process_start(pid),
        "what": what,
        "taken": time.time(),
    }
    write_json_atomic(path, info)
    return path


def release(lease: str | os.PathLike) -> None:
    """Give a lease back (nothing happens when it is gone already)."""
    Path(lease).unlink(missing_ok=True)
    try:
        Path(lease).parent.rmdir()  # the last one out removes the folder
    except OSError:
        pass


def counts(info: dict[str, Any], now: float | None = None) -> bool:
    """Whether a lease still holds its checkpoint (see the module doc)."""
    now = time.time() if now is None else now
    if info.get("host") != socket.gethostname():
        return now - float(info.get("taken", 0.0)) < FOREIGN_LEASE_S
    pid = int(info.get("pid", -1))
    if pid <= 0 or not _running(pid):
        return False
    recorded, actual = info.get("start"), process_start(pid)
    return recorded is None or actual is None or recorded == actual


def live_leases(ckpt: str | os.PathLike) -> list[dict[str, Any]]:
    """The leases that still hold ``ckpt``; the ones that no longer count (their holder died,
    or is another process now) are removed on the way, as are unreadable lease files."""
    folder = Path(ckpt) / LEASE_DIR
    live = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:  # released meanwhile
            continue
        except (OSError, ValueError):
            info = {}
        if counts(info):
            live.append(info)
        else:
            release(path)
    return live
