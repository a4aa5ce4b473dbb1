"""Process-group start-up that never hangs silently.

`init_distributed` is the one call the trainer makes before building anything distributed:

1. A plain `bertforge train` (no launcher variables) gets single-process defaults.
2. Every rank registers in a TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 hosts it) and waits
   for the others up to `timeout_s`. When the group is incomplete, each waiting rank prints which
   ranks did not join, the rendezvous address and what to check, and exits with code
   `EXIT_RENDEZVOUS` instead of hanging at process-group init.
3. The same store then backs the torch process group (backend chosen by DeepSpeed's accelerator:
   nccl on GPUs, gloo/ccl on CPUs), which `deepspeed.init_distributed` adopts. Reusing the store
   means one port per job: no second port that could collide with a neighbouring job.
4. On the CPU accelerator, DeepSpeed's shared-memory all-reduce segments are unlinked as soon as
   every rank has mapped them (`pretrain.distributed.shm_buffers`), so no exit leaves them behind.
5. Before the rendezvous, every JIT-built op the run needs (DeepSpeed's CPU all-reduce, the
   optimizer's op) is built or loaded from this environment's build folder, one process at a
   time, a wait reported and ended by a stop signal, a stale build lock (a build killed midway)
   removed with a warning naming it (`pretrain.distributed.op_builds`).
6. Right after the rendezvous (before the process group, so also before DeepSpeed's CPU
   `shm_initialize`, which waits forever for a peer that died), each rank starts its heartbeat
   watchdog (`pretrain.distributed.watchdog`): a rank that stops beating makes the others exit
   with `EXIT_RENDEZVOUS` instead of waiting `timeout_s` in a collective.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

from bertforge import preemption
from bertforge.logs import DEEPSPEED_OP_LOADED, get_logger, without_printed
from bertforge.pretrain.distributed import op_builds, shm_buffers, watchdog

log = get_logger(__name__)

# Exit status of a rank whose group did not come up (distinct from Python's 1 for a traceback).
EXIT_RENDEZVOUS = 3
# Keys of our own rendezvous; torch's process group prefixes its keys with "default_pg/".
_PREFIX = "bertforge_rdzv/"
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int  # global rank, 0..world_size-1
    world_size: int  # number of processes in the job
    local_rank: int  # rank on this node (selects the GPU)
    master_addr: str = "127.0.0.1"  # rendezvous host (rank 0's node)
    master_port: int = 0  # rendezvous TCP port

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the one that logs and writes shared files)."""
        return self.rank == 0


class RendezvousError(RuntimeError):
    """The process group did not come up; the message says which ranks and what to check."""


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on `host` (the OS picks it; a tiny race with other jobs remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise RendezvousError(f"environment variable {name}={value!r} is not an integer") from None


def resolve_env() -> DistInfo:
    """Read the launcher's variables, filling single-process defaults when none is set.

    Partial settings (e.g. WORLD_SIZE without RANK) are an error: guessing would make two
    processes both think they are rank 0.
    """
    present = [v for v in ("RANK", "WORLD_SIZE") if v in os.environ]
    if not present:
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = "1"
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(free_port(os.environ["MASTER_ADDR"]))
    missing = [v for v in LAUNCHER_VARS if v not in os.environ]
    if missing:
        raise RendezvousError(
            f"launcher variables {', '.join(missing)} are missing while {', '.join(present)} "
            "are set: start with deepspeed, torchrun or srun (which set all five), or set "
            "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT yourself"
        )
    info = DistInfo(
        rank=_env_int("RANK"),
        world_size=_env_int("WORLD_SIZE"),
        local_rank=_env_int("LOCAL_RANK"),
        master_addr=os.environ["MASTER_ADDR"],
        master_port=_env_int("MASTER_PORT"),
    )
    if info.world_size < 1 or not 0 <= info.rank < info.world_size:
        raise RendezvousError(
            f"RANK={info.rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={info.world_size})"
        )
    return info


def _hints(info: DistInfo) -> str:
    addr = f"{info.master_addr}:{info.master_port}"
    return (
        "What to check:\n"
        "  - the logs of the missing ranks' nodes (did they start, or fail before this point?);\n"
        "  - the hostfile / --include / --num_nodes: the slots add up to "
        f"WORLD_SIZE={info.world_size};\n"
        f"  - every node resolves and reaches {addr} (MASTER_ADDR is rank 0's node; pass "
        "--master_addr explicitly with the DeepSpeed launcher);\n"
        f"  - no firewall blocks TCP port {info.master_port} between the nodes;\n"
        "  - `bertforge doctor --hostfile ...` checks ssh, versions and data on all nodes."
    )


def _connect(info: DistInfo, timeout_s: float):
    """Host (rank 0) or reach the rendezvous store; raise RendezvousError when impossible."""
    # Imports inside functions here: torch and deepspeed, so this module stays light to import (the
    # demo takes free_port from it; watchdog, op_builds and shm_buffers likewise).
    import torch.distributed as dist

    addr = f"{info.master_addr}:{info.master_port}"
    # Under torchrun the agent of node 0 already hosts a store on MASTER_PORT: join it as a client
    # (as torch's own env:// start-up does), otherwise rank 0 hosts it.
    host = info.rank == 0 and not _agent_store()
    try:
        return dist.TCPStore(
            info.master_addr,
            info.master_port,
            info.world_size,
            is_master=host,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            multi_tenant=True,
        )
    except Exception as e:  # noqa: BLE001  DistNetworkError, DistStoreError or TimeoutError by torch version
        if host:
            raise RendezvousError(
                f"rank 0 could not open the rendezvous store on port {info.master_port} "
                f"({type(e).__name__}: {e}). Another job may hold the port: pick another "
                "--master_port (or MASTER_PORT)."
            ) from None
        raise RendezvousError(
            f"rank {info.rank} could not reach rank 0's rendezvous store at {addr} within "
            f"{timeout_s:g} s ({type(e).__name__}). Rank 0 did not join or is unreachable.\n"
            + _hints(info)
        ) from None


def _agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def rendezvous(info: DistInfo, timeout_s: float):
    """Register this rank and wait until all `world_size` ranks have; returns the store."""
    store = _connect(info, timeout_s)
    # torchrun restarts workers against the same agent store: keep each attempt's keys apart.
    prefix = f"{_PREFIX}{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    deadline = time.monotonic() + timeout_s
    addr = f"{info.master_addr}:{info.master_port}"
    try:
        if store.add(f"{prefix}rank{info.rank}", 1) > 1:
            raise RendezvousError(
                f"rank {info.rank} joined the rendezvous at {addr} twice: two processes have "
                f"RANK={info.rank}. Check --node_rank (torchrun) or the hostfile's host names."
            )
        store.append(f"{prefix}members", f"{info.rank}@{socket.gethostname()};")
        # The last rank to arrive opens the gate; everyone else blocks on it (no polling, so a
        # thousand ranks do not flood rank 0's store).
        if store.add(f"{prefix}joined", 1) == info.world_size:
            store.set(f"{prefix}complete", "1")
        try:
            store.wait(
                [f"{prefix}complete"], timedelta(seconds=max(deadline - time.monotonic(), 0.001))
            )
        except Exception:  # noqa: BLE001  the wait timed out (the type differs by torch version)
            if store.check([f"{prefix}complete"]):  # opened just as the wait gave up
                return store
            members = dict(
                m.split("@", 1) for m in store.get(f"{prefix}members").decode().split(";") if m
            )
            missing = [r for r in range(info.world_size) if str(r) not in members]
            by_host: dict[str, list[int]] = {}
            for r, h in members.items():
                by_host.setdefault(h, []).append(int(r))
            raise RendezvousError(
                f"rank {info.rank}: the process group did not come up within {timeout_s:g} s at "
                f"{addr}: {len(members)} of {info.world_size} ranks joined.\n"
                f"  ranks that did not join: {_ranges(missing)}\n"
                f"  ranks that joined: "
                f"{'; '.join(f'{_ranges(sorted(rs))} on {h}' for h, rs in by_host.items())}\n"
                + _hints(info)
            ) from None
    except RendezvousError:
        raise
    except Exception as e:  # noqa: BLE001  the store vanished: rank 0 exited, or network loss
        raise RendezvousError(
            f"rank {info.rank} lost the rendezvous store at {addr} ({type(e).__name__}: {e}); "
            "rank 0 exited (see its log for the ranks that did not join) or the network dropped."
            "\n" + _hints(info)
        ) from None
    return store


def _ranges(ranks: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7' (a 512-rank job should not print 511 numbers)."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(out) or "none"


def init_distributed(
    timeout_s: float = 600.0, heartbeat_timeout_s: float = 0.0, ds_config: dict | None = None
) -> DistInfo:
    """Start the process group for this rank, or exit with `EXIT_RENDEZVOUS` and a clear message.

    `timeout_s` bounds the wait for the other ranks and is the process group's collective timeout.
    `heartbeat_timeout_s` > 0 starts the watchdog (`watchdog.stop()` ends it): a rank silent that
    long makes every other rank exit with `EXIT_RENDEZVOUS`, at any point of the run.
    `ds_config`: the final DeepSpeed dict, whose optimizer op is built with the others first.
    Works under the DeepSpeed launcher, torchrun, srun (with the variables exported) and plain
    `python` (a world of one on a free local port). A failed op build raises
    `op_builds.OpBuildError` (a UserError); a stop signal while waiting for a build, or during
    one, exits 0.
    """
    # Lazy: deepspeed and torch (see _connect).
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    backend = accel.communication_backend_name()
    timeout = timedelta(seconds=timeout_s)
    if dist.is_initialized():  # a second call in one process (tests, notebooks): reuse the group
        with without_printed(DEEPSPEED_OP_LOADED):
            deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
        return DistInfo(
            dist.get_rank(),
            dist.get_world_size(),
            int(os.environ.get("LOCAL_RANK", "0")),
            os.environ.get("MASTER_ADDR", "127.0.0.1"),
            int(os.environ.get("MASTER_PORT", "0")),
        )
    # Before the rendezvous: a rank waiting here for another's build honours stop signals.
    op_builds.prepare(op_builds.needed_ops(ds_config), preemption.installed())
    try:
        info = resolve_env()
        store = rendezvous(info, timeout_s)
    except RendezvousError as e:
        log.error(str(e))
        raise SystemExit(EXIT_RENDEZVOUS) from None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if heartbeat_timeout_s > 0 and info.world_size > 1:
        watchdog.start(
            info.master_addr,
            info.master_port,
            info.rank,
            info.world_size,
            heartbeat_timeout_s,
            namespace=f"bertforge_watchdog/{attempt}/",  # a torchrun restart reuses the store
            hosts_store=info.rank == 0 and not _agent_store(),
            keep=store,  # rank 0's store serves the beats until the watchdog stops
        )
    kwargs = {}
    if accel.device_name() == "cuda":
        accel.set_device(info.local_rank)
        # As DeepSpeed does: bind the device so NCCL communicators are created eagerly.
        if info.world_size > 1:
            kwargs["device_id"] = torch.device("cuda", info.local_rank)
    store.set_timeout(timeout)
    # Own namespace per attempt: a torchrun restart reuses the agent's store.
    store = dist.PrefixStore(f"bertforge_pg/{attempt}/", store)
    dist.init_process_group(
        backend,
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
        **kwargs,
    )
    # DeepSpeed adopts the initialised torch group (and picks the same backend name); on a CPU it
    # prints that its shared-memory op "built successfully" at every launch, on every rank
    with without_printed(DEEPSPEED_OP_LOADED):
        deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
    if accel.device_name() == "cpu":  # its shared-memory all-reduce: nothing left in /dev/shm
        shm_buffers.release_after_init(info.rank, info.world_size)
    return info


def sum_across_ranks(values: list[float], device) -> list[float]:
    """One all-reduce (sum) of a few numbers in float64 on ``device``; the identity on one rank.

    Used for the decisions every rank must take together (save now? stop evaluating?) and for
    global counts (masked tokens of the global batch).
    """
    # Lazy: torch (see _connect).
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()


def shutdown() -> None:
    """Leave the process group together (otherwise ranks linger in teardown for seconds). The
    watchdog stops after the last barrier: every rank got that far, none can hang any more."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        watchdog.stop(done=True)
