"""No rank left hanging: heartbeats through the rendezvous store, and exit 3 when a rank is gone.

When one rank of a multi-node job dies (``kill -9``, a node failure) the others sit in a gloo or
NCCL collective until ``--dist_timeout_s``, and under torchrun or srun nobody kills them. Here
every rank runs a daemon thread, started right after the rendezvous (before the process group and
DeepSpeed's shared-memory set-up), with its own client connection to the rendezvous store:

- every ``interval_s`` it adds 1 to its own beat counter (its first beat also publishes its host
  name), and reads the counter of one other rank, the next one in a ring (so the store serves
  O(world size) requests per interval, not O(world size squared));
- when that counter has not moved for ``timeout_s`` (``--heartbeat_timeout_s``), it writes one
  abort message naming the rank and its host into the store; every rank reads that key at each
  beat, logs the one error and exits with :data:`EXIT_RANK_GONE` through ``os._exit`` from the
  thread, so it works while the main thread is blocked in a collective, a save or validation;
- a store that stops answering means rank 0 (its host) is gone: that is fatal too.

A rank that ends normally (:func:`stop`, after the final barrier) marks its counter done, and
the rank hosting the store waits until every rank has marked it (at most ``timeout_s``), so a
finished run never exits 3 because a peer finished first. An error exit stops the thread without
a mark: a peer still waiting for the rank then exits 3 after the timeout. A collective that
fails first because a dead peer's sockets closed (gloo sees that at once on one host) waits for
the watchdog's verdict (:func:`await_verdict`), so that exit is 3 with the rank named too.

Limits: the beats come from a Python thread, so a C call that holds the GIL for longer than the
timeout would look like a dead rank (collectives, file writes and subprocess waits release it;
while torch.save wrote 200 MB, a 10 ms beat thread's longest gap was 36 ms); a rank that dies
during the rendezvous itself is the rendezvous's to report (``--dist_timeout_s``).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from bertforge.logs import get_logger

log = get_logger(__name__)

#: The exit status of a rank whose peer stopped beating: the same 3 as a rendezvous that did not
#: come up (pretrain.distributed.startup.EXIT_RENDEZVOUS): the job's ranks are not all there.
EXIT_RANK_GONE = 3
#: Added to a beat counter by a rank that ended normally (far above any count of beats).
DONE = 1 << 40


class Watchdog:
    """One rank's heartbeat thread. ``on_lost(message)`` is called once when a rank is gone
    (default: log the error and ``os._exit(3)``); tests pass their own."""

    def __init__(
        self,
        addr: str,
        port: int,
        rank: int,
        world_size: int,
        timeout_s: float,
        *,
        namespace: str = "bertforge_watchdog/0/",
        hosts_store: bool = False,
        interval_s: float | None = None,
        on_lost: Callable[[str], None] | None = None,
        keep: object = None,
    ):
        self.addr, self.port, self.rank, self.world = addr, port, rank, world_size
        self.timeout_s = timeout_s
        self.interval_s = interval_s or min(5.0, max(0.1, timeout_s / 4))
        self.ns = namespace
        self.hosts_store = hosts_store  # this process serves the store: it leaves last
        self.on_lost = on_lost or exit_now
        self._keep = keep  # the hosting store object: its server must outlive the process group
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store = None
        self._watched: int | None = (rank + 1) % world_size if world_size > 1 else None
        self._seen: int | None = None  # the watched rank's last counter value
        self._seen_at = 0.0  # time.monotonic() when it last changed
        self._host0: str | None = None  # rank 0's host, for the message when the store is gone

    def _key(self, what: str, rank: int | None = None) -> str:
        return f"{self.ns}{what}" if rank is None else f"{self.ns}{what}/{rank}"

    def start(self) -> Watchdog:
        """Connect, beat once (publishing this host's name) and start the thread."""
        # Lazy: torch; components.distributed imports this module and stays light (see there).
        import torch.distributed as dist

        try:
            self._store = dist.TCPStore(
                self.addr,
                self.port,
                None,
                is_master=False,
                timeout=timedelta(seconds=max(self.timeout_s, 1.0)),
                wait_for_workers=False,
            )
            host = socket.gethostname()
            self._store.set(self._key("host", self.rank), host)
            self._host0 = host if self.rank == 0 else None
            self._store.add(self._key("beat", self.rank), 1)
        except Exception as e:  # noqa: BLE001  DistNetworkError / DistStoreError by torch version
            self.on_lost(self._store_gone(e))
            return self
        self._seen_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="bertforge-watchdog", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                problem = self._tick()
            except Exception as e:  # noqa: BLE001  the store is gone (its host died) or hangs
                problem = None if self._stop.is_set() else self._store_gone(e)
            if problem and not self._stop.is_set():
                self.on_lost(problem)
                return

    def _tick(self) -> str | None:
        """One beat: add to our counter, read the abort key and the watched rank's counter.
        Returns the message when a rank is gone."""
        store, now = self._store, time.monotonic()
        store.add(self._key("beat", self.rank), 1)
        if self._host0 is None and store.check([self._key("host", 0)]):
            self._host0 = store.get(self._key("host", 0)).decode()
        if store.check([self._key("abort")]):
            return store.get(self._key("abort")).decode() + f" (rank {self.rank} exits too)"
        while self._watched is not None:
            count = store.add(self._key("beat", self._watched), 0)
            if count >= DONE:  # it ended normally: watch the next one
                self._advance(now)
                continue
            if count != self._seen:
                self._seen, self._seen_at = count, now
                return None
            silent = now - self._seen_at
            if silent < self.timeout_s:
                return None
            message = (
                f"rank {self._watched} on {self._host(self._watched)} stopped beating: no "
                f"heartbeat for {silent:.0f} s (--heartbeat_timeout_s {self.timeout_s:g}); it "
                f"was killed or is frozen, or its node failed (noticed by rank {self.rank})"
            )
            store.compare_set(self._key("abort"), "", message)  # the first report wins
            return message
        return None

    def _advance(self, now: float) -> None:
        nxt = (self._watched + 1) % self.world
        self._watched = None if nxt == self.rank else nxt
        self._seen, self._seen_at = None, now

    def _host(self, rank: int) -> str:
        key = self._key("host", rank)
        if self._store.check([key]):
            return self._store.get(key).decode()
        return "an unknown host (it never beat)"

    def _store_gone(self, error: Exception) -> str:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        where = f"rank 0 on {self._host0}" if self._host0 else "rank 0"
        return (
            f"rank {self.rank} lost the rendezvous store at {self.addr}:{self.port} "
            f"({type(error).__name__}: {first}): the process hosting it ({where}, or torchrun's "
            "agent on that node) is gone or unreachable, so a rank is gone"
        )

    def stop(self, done: bool = True) -> None:
        """Stop beating. ``done``: this rank ended normally (mark it, so no peer reports it; the
        store's host then waits, at most ``timeout_s``, until every rank has marked its end)."""
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + self.interval_s)
        if not done:
            return
        try:
            self._store.add(self._key("beat", self.rank), DONE)
            ended = self._store.add(self._key("ended"), 1)
            deadline = time.monotonic() + self.timeout_s
            while self.hosts_store and ended < self.world and time.monotonic() < deadline:
                time.sleep(0.05)
                ended = self._store.add(self._key("ended"), 0)
        except Exception:  # noqa: BLE001  the store's host ended first: nothing left to tell
            pass


#: How a collective reports a peer that died (gloo, NCCL, the store): the watchdog then has the
#: last word (:func:`await_verdict`).
PEER_LOSS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
    "remote process exited",
    "failed to recv",
)


def looks_like_peer_loss(error: BaseException) -> bool:
    """True when ``error`` (or what caused it) says a peer's connection went away."""
    seen = 0
    while error is not None and seen < 10:
        text = str(error).lower()
        if type(error).__name__ == "DistNetworkError" or any(p in text for p in PEER_LOSS):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def await_verdict(error: BaseException) -> None:
    """The main thread ended with ``error``. When it says a peer is gone (gloo on one host sees a
    killed rank's sockets close at once), wait, at most the heartbeat timeout, for the watchdog
    to name that rank and exit 3, instead of a traceback that names no rank. Returns otherwise
    (another error, no watchdog, or no verdict in time: the caller re-raises)."""
    dog = _running
    if dog is None or dog._thread is None or not looks_like_peer_loss(error):
        return
    dog._thread.join(timeout=dog.timeout_s + 3 * dog.interval_s)


def exit_now(message: str) -> None:
    """Log ``message`` as the one error of this rank and end the process with status 3 now,
    from any thread (the main thread may be blocked in a collective)."""
    log.error(
        f"{message}. Exiting with status {EXIT_RANK_GONE}: the job cannot go on without it (no "
        "waiting --dist_timeout_s in a collective); the newest complete checkpoint is intact: "
        "restart the job with --resume auto."
    )
    for cleanup in _cleanups:  # e.g. rank 0's run-folder lock: a requeued job on another node
        try:  # would be refused by a lock left behind
            cleanup()
        except Exception:  # noqa: BLE001  exit anyway
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001  a closed pipe: exit anyway
            pass
    os._exit(EXIT_RANK_GONE)


_running: Watchdog | None = None
_cleanups: list[Callable[[], None]] = []  # run by exit_now before os._exit
_atexit_registered = False


def at_exit(cleanup: Callable[[], None]) -> None:
    """Have :func:`exit_now` call ``cleanup()`` (quick, idempotent) before it ends the process:
    ``os._exit`` runs no ``finally`` blocks of the main thread."""
    _cleanups.append(cleanup)


def start(*args, **kwargs) -> Watchdog:
    """Start this process's watchdog (arguments of :class:`Watchdog`); :func:`stop` ends it."""
    global _running, _atexit_registered
    stop(done=False)
    if not _atexit_registered:  # a traceback's exit: stop quietly, without the done mark
        atexit.register(stop, done=False)
        _atexit_registered = True
    _running = Watchdog(*args, **kwargs).start()
    return _running


def stop(done: bool = True) -> None:
    """Stop this process's watchdog, if one runs (see :meth:`Watchdog.stop`)."""
    global _running
    if _running is not None:
        _running.stop(done=done)
        _running = None
