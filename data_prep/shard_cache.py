"""A bounded local cache of shards read from object storage, filled ahead of the sampler.

A shard folder at a URL (``ShardReader("s3://bucket/shards")``) is mirrored under this
process's cache folder (``--cache_dir``, one sub-folder per rank): the manifest and the tokenizer
are fetched when the reader opens (the tokenizer checked against the manifest's fingerprint),
the shards as they are needed. The mirror's folder is named after the manifest's sha256, so a
rebuilt folder at the same URL never mixes with the old one's shards, and a relaunch of the same
run finds the shards it had (a file in the cache was checked when it arrived: it is renamed into
place only then).

A shard (its ``.tokens``, ``.offsets``, ``.wordstart`` and ``.nsp`` files) is one :class:`Unit`:
fetched, counted and evicted together. What the cache holds never exceeds ``limit`` bytes:

- A training loader starts a :class:`Stream`: a planner thread walks this rank's coming batches
  (a copy of the sampler, from the same data position) and, in the order they first need them,
  fetches their shards on a few threads, as far ahead as the limit allows. The loader hands a
  batch's indices to the workers only once its shards are here (:meth:`ShardCache.wait`) and
  says when each batch has been delivered (:meth:`ShardCache.release`).
- A shard whose planned batches have all been delivered has been read: it is evicted when room
  is needed (the least recently needed first; leftovers of other folders before anything).
- Shards read outside a stream (validation, a dry run's samples) are fetched when touched;
  validation's stay (every evaluation reads the same sequences) and count towards the limit.
- When the limit cannot hold what the loader needs at once (the batches it has handed out plus
  the next one), the loader stops with an error saying by how much, instead of waiting forever.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import os
import queue
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.data_prep.layout import TOKENIZER_DIR
from bertforge.data_prep.lock import FolderLock
from bertforge.data_prep.object_store import Retry, redact
from bertforge.data_prep.remote_folder import DEFAULT_LIMIT, RemoteFolder, Unit, human, parse_size
from bertforge.errors import UserError
from bertforge.files import write_json_atomic
from bertforge.logs import get_logger, process_rank

log = get_logger(__name__)


#: how many batches the planner may run ahead of the consumer (room permitting): enough to reach
#: the next window of a window order early, few enough that planning costs nothing
MAX_AHEAD_BATCHES = 20_000


class CacheTooSmall(UserError, RuntimeError):
    """The cache limit cannot hold the shards a loader needs at once."""


@dataclass
class _Stream:
    """One training loader's pass: its planner thread and how far the consumer got."""

    chunks: Iterator[tuple[int, list[Unit], list[int]]]
    released: int = -1  # batches 0..released have been delivered
    stopped: bool = False
    error: BaseException | None = None
    thread: threading.Thread | None = None


class ShardCache:
    """This process's cache of remote shards (see the module doc)."""

    def __init__(
        self,
        folder: str | Path,
        limit: int | str = DEFAULT_LIMIT,
        threads: int = 4,
        retry: Retry | None = None,
    ):
        self.folder = Path(folder)
        self.limit = parse_size(limit)
        self.retry = retry or Retry()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock_file = FolderLock(self.folder / ".lock", f"shard cache {self.folder}").acquire()
        self._pid = os.getpid()
        self._cv = threading.Condition()
        # Daemon threads (not an executor's): a job that ends leaves a fetch in flight behind
        # instead of waiting for it (its temporary file is removed at the next launch).
        self._queue: queue.SimpleQueue[Unit] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._fetcher, name=f"shard-fetch-{i}", daemon=True)
            for i in range(max(1, threads))
        ]
        for t in self._threads:
            t.start()
        self._remotes: dict[str, RemoteFolder] = {}
        self._resident: dict[Unit, int] = {}  # unit -> order of arrival
        self._inflight: set[Unit] = set()
        self._failed: dict[Unit, BaseException] = {}
        self._kept: set[Unit] = set()
        self._need: dict[Unit, int] = {}  # the last planned batch that reads the unit
        self._stream: _Stream | None = None
        self._wanted: list[Unit] | None = None  # what the consumer waits for
        # the planner waits until the consumer has delivered this batch (inf: not for a
        # delivery): a release wakes it only then, not at every batch
        self._wake_at: float = math.inf
        self._arrivals = 0
        self.fetched_bytes = 0  # bytes that came over the network (for reports and tests)
        self.fetches = 0
        self._stale: dict[Path, int] = self._scan()
        self.used = sum(self._stale.values())
        self.peak = self.used  # the most bytes held (or being fetched) at once

    def __repr__(self) -> str:
        return f"ShardCache({str(self.folder)!r}, limit={human(self.limit)})"

    def _scan(self) -> dict[Path, int]:
        """Shard files left by earlier launches (until a reader claims them) and temporaries."""
        found = {}
        for path in self.folder.glob("*/*/*"):
            if path.parent.name == TOKENIZER_DIR or not path.is_file():
                continue
            if ".tmp-" in path.name:
                path.unlink(missing_ok=True)
                continue
            found[path] = path.stat().st_size
        return found

    def open_folder(self, url: str) -> RemoteFolder:
        """The mirror of the shard folder at ``url`` (fetched once per process)."""
        found = self._remotes.get(url)
        if found is None:
            found = self._remotes[url] = RemoteFolder(self, url)
        return found

    def register(self, unit: Unit) -> None:
        """Count a unit's files that an earlier launch left here as resident."""
        with self._cv:
            paths = [unit.local(f) for f in unit.files]
            if all(p in self._stale for p in paths) and unit.present():
                for p in paths:
                    self._stale.pop(p)
                self._arrivals += 1
                self._resident[unit] = self._arrivals

    def stats(self) -> dict[str, int]:
        """What the cache did: bytes and shards fetched, its peak and limit (bytes)."""
        with self._cv:
            return {
                "fetched_bytes": self.fetched_bytes,
                "fetches": self.fetches,
                "peak_bytes": self.peak,
                "limit_bytes": self.limit,
            }

    def close(self) -> None:
        """Stop the stream; write ``stats.json`` (:meth:`stats`); release the folder's lock."""
        self.stop_stream()
        if self._pid == os.getpid() and self._lock_file.held:
            write_json_atomic(self.folder / "stats.json", self.stats())
            self._lock_file.release()

    # -- room ------------------------------------------------------------------------------
    def _released(self) -> int:
        return self._stream.released if self._stream is not None else -1

    def _evictable(self, unit: Unit) -> bool:
        return unit not in self._kept and self._need.get(unit, -1) <= self._released()

    def _make_room(self, nbytes: int) -> bool:
        """Evict read shards (leftovers first, then the least recently needed) until ``nbytes``
        more fit under the limit; False when they cannot."""
        while self._stale and self.used + nbytes > self.limit:
            path, size = self._stale.popitem()
            path.unlink(missing_ok=True)
            self.used -= size
        if self.used + nbytes <= self.limit:
            return True
        candidates = sorted(
            (u for u in self._resident if self._evictable(u)),
            key=lambda u: (self._need.get(u, -1), self._resident[u]),
        )
        for unit in candidates:
            if self.used + nbytes <= self.limit:
                break
            self._evict(unit)
        return self.used + nbytes <= self.limit

    def _evict(self, unit: Unit) -> None:
        self._resident.pop(unit)
        for fname in unit.files:
            unit.local(fname).unlink(missing_ok=True)
        self.used -= unit.nbytes

    # -- fetching --------------------------------------------------------------------------
    def _start_fetch(self, unit: Unit) -> None:
        """Submit ``unit`` (room already made; lock held)."""
        self.used += unit.nbytes
        self.peak = max(self.peak, self.used)
        self._inflight.add(unit)
        self._failed.pop(unit, None)
        self._queue.put(unit)

    def _fetcher(self) -> None:
        while True:
            self._fetch(self._queue.get())

    def _fetch(self, unit: Unit) -> None:
        error = None
        try:
            (unit.folder.local_root / unit.split).mkdir(parents=True, exist_ok=True)
            for fname, expected in unit.files.items():
                unit.folder.store.fetch(f"{unit.split}/{fname}", unit.local(fname), expected)
        except BaseException as e:  # noqa: BLE001 (handed to the consumer, which raises it)
            error = e
            for fname in unit.files:
                unit.local(fname).unlink(missing_ok=True)
        with self._cv:
            self._inflight.discard(unit)
            if error is None:
                self._arrivals += 1
                self._resident[unit] = self._arrivals
                self.fetched_bytes += unit.nbytes
                self.fetches += 1
            else:
                self.used -= unit.nbytes
                self._failed[unit] = error
            self._cv.notify_all()

    def ensure(self, units: Iterable[Unit], keep: bool = False) -> None:
        """Fetch what of ``units`` is not here and wait for it (reads outside a stream);
        ``keep``: never evict them (validation)."""
        if os.getpid() != self._pid:
            missing = [u for u in units if not u.present()]
            if missing:
                raise RuntimeError(
                    f"{missing[0]} is not in the shard cache {self.folder}, and a DataLoader "
                    "worker cannot fetch (the rank fetches before it hands a batch out)"
                )
            return
        units = list(dict.fromkeys(units))
        with self._cv:
            if keep:
                self._kept.update(units)
            for unit in units:
                if unit in self._resident or unit in self._inflight:
                    continue
                if not self._make_room(unit.nbytes):
                    log.warning(
                        f"shard cache {self.folder}: {unit} goes over --cache_limit "
                        f"{human(self.limit)} (it holds {human(self.used)} that is still needed)"
                    )
                self._start_fetch(unit)
            self._wait_for(units, None)

    def _wait_for(self, units: list[Unit], stream: _Stream | None) -> None:
        """Block until every unit is resident (lock held); raise a fetch's or the stream's error."""
        if stream is not None:
            self._wanted = units  # the planner checks whether this wait can end
        try:
            while True:
                for unit in units:
                    if unit in self._failed:
                        raise self._failed[unit]
                if all(u in self._resident for u in units):
                    return
                if stream is not None and stream.error is not None:
                    raise stream.error
                self._cv.notify_all()
                self._cv.wait(timeout=1.0)
        finally:
            if stream is not None:
                self._wanted = None

    # -- the training stream ---------------------------------------------------------------
    def start_stream(self, chunks: Iterator[tuple[int, list[Unit], list[int]]]) -> None:
        """Plan ahead from ``chunks``: (the chunk's first batch number, its units in the order
        of first need, for each the last batch number that reads it), in batch order from batch
        0. Replaces the previous stream."""
        self.stop_stream()
        stream = _Stream(chunks)
        with self._cv:
            self._need.clear()
            self._failed.clear()
            self._stream = stream
        stream.thread = threading.Thread(
            target=self._plan, args=(stream,), name="shard-planner", daemon=True
        )
        stream.thread.start()

    def stop_stream(self) -> None:
        with self._cv:
            stream, self._stream = self._stream, None
            if stream is not None:
                stream.stopped = True
            self._cv.notify_all()
        if stream is not None and stream.thread is not None:
            stream.thread.join()

    def wait(self, units: list[Unit]) -> None:
        """The consumer: block until the units of its next batch are here."""
        with self._cv:
            self._wait_for(units, self._stream)

    def release(self, batch: int) -> None:
        """The consumer delivered batches up to ``batch``: their shards have been read."""
        with self._cv:
            if self._stream is not None and batch > self._stream.released:
                self._stream.released = batch
                if batch >= self._wake_at:  # waking the planner at every batch costs
                    self._cv.notify_all()  # thread switches on a busy machine

    def _plan(self, stream: _Stream) -> None:
        try:
            for first, units, last in stream.chunks:
                with self._cv:
                    while not stream.stopped and first - stream.released > MAX_AHEAD_BATCHES:
                        self._wake_at = first - MAX_AHEAD_BATCHES  # far enough ahead
                        self._cv.wait(timeout=1.0)
                    self._wake_at = math.inf
                    if stream.stopped:
                        return
                    for unit, batch in zip(units, last):
                        self._need[unit] = max(self._need.get(unit, -1), batch)
                for unit in units:
                    if not self._plan_one(stream, unit):
                        return
        except BaseException as e:  # noqa: BLE001 (the consumer raises it)
            with self._cv:
                stream.error = e
                self._cv.notify_all()

    def _plan_one(self, stream: _Stream, unit: Unit) -> bool:
        """Fetch ``unit`` once room allows; False when the stream was stopped."""
        with self._cv:
            while True:
                if stream.stopped:
                    return False
                if unit in self._resident or unit in self._inflight:
                    return True
                if unit in self._failed:
                    return True  # the consumer raises it when it reaches that batch
                if self._make_room(unit.nbytes):
                    self._start_fetch(unit)
                    return True
                wanted = self._wanted
                if (
                    wanted is not None
                    and not self._inflight
                    and any(u not in self._resident for u in wanted)
                ):
                    held = [u for u in self._resident if not self._evictable(u)]
                    kept = sum(u.nbytes for u in held if u in self._kept)
                    raise CacheTooSmall(
                        f"--cache_limit {human(self.limit)} cannot hold what rank "
                        f"{process_rank()} reads at once: {len(held)} shards "
                        f"({human(sum(u.nbytes for u in held))}, of which validation keeps "
                        f"{human(kept)}) still to be read by the batches handed out, plus "
                        f"{unit} ({human(unit.nbytes)}). Raise --cache_limit, "
                        "or use --data_order window with fewer --window_shards (and fewer "
                        "--num_workers x --prefetch_factor batches in flight)."
                    )
                # a delivery frees room once it passes the last batch of a held shard
                needs = [self._need.get(u, -1) for u in self._resident if u not in self._kept]
                self._wake_at = min((n for n in needs if n > self._released()), default=math.inf)
                self._cv.wait(timeout=1.0)
                self._wake_at = math.inf


_CACHE: ShardCache | None = None
_SETTINGS: dict[str, Any] = {}


def default_folder(output_dir: str | None = None) -> Path:
    """The cache folder when --cache_dir is not given: one per run folder under the system's
    temporary folder (a relaunch of the run finds its shards; two runs never share one)."""
    base = Path(tempfile.gettempdir()) / "bertforge-shards"
    if not output_dir:
        return base / "default"
    real = os.path.realpath(output_dir)
    return base / f"{Path(real).name}-{hashlib.sha256(real.encode()).hexdigest()[:8]}"


def configure(
    cache_dir: str | Path | None = None,
    limit: int | str = DEFAULT_LIMIT,
    threads: int = 4,
    retry: Retry | None = None,
    output_dir: str | None = None,
) -> None:
    """Settle this process's cache before a remote folder is opened (the trainer calls this
    with its flags; other commands get the defaults)."""
    global _CACHE
    folder = Path(cache_dir) if cache_dir else default_folder(output_dir)
    _SETTINGS.update(
        folder=folder / f"rank-{process_rank()}",
        limit=parse_size(limit),
        threads=threads,
        retry=retry,
    )
    if _CACHE is not None:
        _CACHE.close()
        _CACHE = None


def process_cache() -> ShardCache:
    """This process's ShardCache (made on first use, with :func:`configure`'s settings)."""
    global _CACHE
    if _CACHE is None:
        if not _SETTINGS:
            configure()
        _CACHE = ShardCache(
            _SETTINGS["folder"], _SETTINGS["limit"], _SETTINGS["threads"], _SETTINGS["retry"]
        )
        atexit.register(_CACHE.close)
        log.info(f"shards from object storage are cached in {_CACHE.folder} "
                 f"(--cache_limit {human(_CACHE.limit)})")  # fmt: skip
    return _CACHE


def close() -> None:
    """Close this process's cache, if it made one (its stats written, its lock released)."""
    global _CACHE
    if _CACHE is not None:
        _CACHE.close()
        _CACHE = None


def describe_url(url: str) -> str:
    """The URL as messages and checkpoints show it."""
    return redact(url)
