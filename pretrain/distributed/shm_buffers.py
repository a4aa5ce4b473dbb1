"""DeepSpeed's shared-memory all-reduce buffers on the CPU accelerator: never left in /dev/shm.

When every rank of a job is on one machine (``LOCAL_SIZE == WORLD_SIZE``, as the DeepSpeed
launcher sets), `deepspeed.init_distributed` creates one 69 MB POSIX shared-memory segment per
rank, ``/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``
(deepspeed/ops/csrc/cpu/comm/shm.cpp, `shm_initialize`), then maps every other rank's segment,
and never unlinks any of them: each job leaves them behind, even on a clean exit.

`release_after_init` removes them at start-up instead of at exit: once every rank has returned
from `shm_initialize` (a barrier), every rank holds a mapping of every segment, and a mapping
stays valid after its name is unlinked (the memory is freed when the last mapping goes). So the
names vanish a second after the rendezvous, and nothing is left whatever way the job ends:
clean exit, Python error, or ``kill -9`` (which no exit hook could cover). DeepSpeed opens the
segments by name only inside `shm_initialize`, once per process, so nothing looks them up later.

`stale_buffers` is the doctor's view: the segments in /dev/shm that no live process maps (a
crash inside the one-second window, or jobs run by other programs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bertforge.logs import get_logger

log = get_logger(__name__)

SHM_DIR = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer"  # SHM_BUFFER_NAME in DeepSpeed's shm.cpp


def buffer_name(rank: int, addr: str, port: str | int, uid: int | None = None) -> str:
    """The segment name DeepSpeed gives ``rank``'s buffer (``%s_%d_%s_%s_%d`` in shm.cpp)."""
    uid = os.getuid() if uid is None else uid
    return f"{PREFIX}_{uid}_{addr}_{port}_{rank}"


def buffers_of_port(port: str | int, directory: Path = SHM_DIR) -> list[Path]:
    """Every DeepSpeed all-reduce segment of the job on rendezvous port ``port``."""
    return sorted(
        p for p in directory.glob(f"{PREFIX}_*") if p.name.rsplit("_", 2)[-2] == str(port)
    )


def release_after_init(rank: int, world_size: int) -> None:
    """Unlink this rank's segment once every rank has mapped every segment (see module doc).

    Called right after `deepspeed.init_distributed`; the names are read from the environment
    exactly as DeepSpeed read them. A no-op when DeepSpeed made no segment (ranks on several
    machines, torchrun without LOCAL_SIZE, a GPU accelerator).
    """
    # Lazy: torch; components.distributed imports this module and stays light (see there).
    import torch.distributed as dist

    path = SHM_DIR / buffer_name(
        rank, os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    )
    if world_size > 1 and os.environ.get("LOCAL_SIZE") == str(world_size):
        dist.barrier()  # every rank is past shm_initialize: all segments are mapped everywhere
    try:
        path.unlink()
    except FileNotFoundError:
        return
    log.debug("unlinked %s (mapped by every rank)", path)


@dataclass(frozen=True)
class StaleBuffer:
    """A segment in /dev/shm that no live process maps."""

    path: Path
    size: int  # bytes


def mapped_paths(directory: Path = SHM_DIR) -> set[str]:
    """Every path under ``directory`` some readable process of this machine maps or holds open."""
    root = f"{directory}/"
    seen: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                if root in line:
                    seen.add(line[line.index(root) :].removesuffix(" (deleted)"))
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(root):
                    seen.add(target)
        except OSError:  # the process ended, or belongs to another user
            continue
    return seen


def stale_buffers(directory: Path = SHM_DIR) -> list[StaleBuffer]:
    """DeepSpeed segments (``deepspeed_*``) left by jobs whose processes are all gone."""
    live = mapped_paths(directory)
    out = []
    for p in sorted(directory.glob("deepspeed_*")):
        if str(p) in live:
            continue
        try:
            out.append(StaleBuffer(p, p.stat().st_size))
        except FileNotFoundError:  # removed meanwhile
            continue
    return out
