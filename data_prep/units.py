"""The work units of a build: the input cut into runs of documents (deterministically), each
built by a worker process (or kept, when a resumed build finds it finished)."""

from __future__ import annotations

import json
import multiprocessing as mp
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from bertforge.data_prep.build_config import BuildConfig
from bertforge.data_prep.inputs import DropCounter, iter_located_documents
from bertforge.data_prep.partition import owns
from bertforge.data_prep.progress import Progress
from bertforge.data_prep.worker import WorkerSpec, done_record_path, init_worker, run_unit
from bertforge.logs import get_logger

log = get_logger(__name__)


Job = tuple[int, list[str], list[str]]  # unit number, its documents, where each comes from


def units(docs: Iterator[tuple[str, str]], cfg: BuildConfig) -> Iterator[Job]:
    """Consecutive (text, where) documents grouped into work units (deterministic given the
    inputs)."""
    unit, batch, wheres, size = 0, [], [], 0
    for text, where in docs:
        batch.append(text)
        wheres.append(where)
        size += len(text)
        if len(batch) >= cfg.shard_docs or size >= cfg.shard_bytes:
            yield unit, batch, wheres
            unit, batch, wheres, size = unit + 1, [], [], 0
    if batch:
        yield unit, batch, wheres


def finished(out: Path, unit: int) -> dict[str, Any] | None:
    """The done record of a unit whose shard files are all present with their sizes."""
    path = done_record_path(out, unit)
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    for split, info in record["splits"].items():
        if info["shard"]:
            for fname, meta in info["shard"]["files"].items():
                f = out / split / fname
                if not f.is_file() or f.stat().st_size != meta["bytes"]:
                    return None
    return record


def _abandon(pool: ProcessPoolExecutor) -> None:
    """Shut a broken pool down without waiting on it: its other workers are killed and reaped.
    Waiting (``shutdown(wait=True)``) after a worker was killed hung now and then in CPython
    3.11's executor, in the management thread's join, leaving the build waiting forever."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in workers:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=10)


def run_units(
    cfg: BuildConfig, files: list[Path], spec: WorkerSpec, drops: DropCounter
) -> tuple[list[dict], int]:
    """Build (or keep) this part's work units; returns their records and the total number of
    units in the input (every part cuts the whole input the same way)."""
    records: list[dict] = []
    skipped = 0
    bar = Progress(
        None, desc="data_prep", unit="shard", mode=cfg.progress, every_s=cfg.progress_interval_s
    )
    tokens = 0

    def collect(record: dict) -> None:
        nonlocal tokens
        records.append(record)
        for bad in record.get("bad_examples", ()):
            drops.report(bad["reason"], bad["where"], bad["detail"])
        tokens += sum(s["shard"]["tokens"] for s in record["splits"].values() if s["shard"])
        bar.update(1, tokens=f"{tokens:,}")

    total = 0

    def mine() -> Iterator[Job]:
        nonlocal total
        for job in units(iter_located_documents(files, cfg.input, drops), cfg):
            total = job[0] + 1
            if owns(job[0], cfg.num_partitions, cfg.partition):
                yield job

    jobs = mine()
    if cfg.workers == 1:
        init_worker(spec, pooled=False)
        for job in jobs:
            done = finished(cfg.output, job[0])
            skipped += done is not None
            collect(done or run_unit(job))
    else:
        ctx = mp.get_context("spawn")  # no fork after tokenizers/torch threads have started
        # not mp.Pool: a worker killed (OOM) there leaves its unit's result waited for forever
        pool = ProcessPoolExecutor(cfg.workers, ctx, initializer=init_worker, initargs=(spec,))
        pending: deque = deque()
        broken = False
        try:
            for job in jobs:
                done = finished(cfg.output, job[0])
                if done is not None:
                    skipped += 1
                    collect(done)
                    continue
                pending.append(pool.submit(run_unit, job))
                while len(pending) >= 2 * cfg.workers:  # bound the documents held in memory
                    collect(pending.popleft().result())
            while pending:
                collect(pending.popleft().result())
        except BrokenProcessPool as e:
            broken = True
            raise RuntimeError(
                "a data_prep worker process died (killed for memory? lower --workers or "
                "--shard_bytes)"
            ) from e
        finally:  # units already running finish before any clean-up; no new one starts
            if broken:
                _abandon(pool)
            else:
                pool.shutdown(wait=True, cancel_futures=True)
    bar.close()
    if skipped:
        log.info(f"resumed, {skipped} finished shard(s) kept")
    return sorted(records, key=lambda r: r["unit"]), total
