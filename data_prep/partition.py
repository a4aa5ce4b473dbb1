"""Builds split across machines: which work units a part owns, its completion record, the merge.

Every part streams the whole input (reading and splitting it costs ~1/15 of tokenizing it) and
cuts it into the same work units as a build of the whole; part K of N tokenizes and writes only
the units u with u % N == K. So the shards (one per unit and split) are byte-identical to those of
a single build, with the same boundaries, and no two parts ever write the same file. A part that
has written all its units records that under OUT/.work/ (`part-K-of-N.json`: its build key, the
units it owns, the total number of units); the manifest is written by `merge` once all N records
are there, agree on the build key and N, and together cover every unit. The last part to finish
merges by itself, under an exclusive lock file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Self

from bertforge.data_prep.layout import WORK_DIR
from bertforge.data_prep.lock import FolderLock, LockError
from bertforge.errors import UserError
from bertforge.files import write_json_atomic

MERGE_LOCK = "merge.lock"
_PART_FILE = re.compile(r"part-(\d+)-of-(\d+)\.json$")
_UNIT_OF_TEMP = re.compile(r"^(?:shard|unit)-(\d+)\..*\.tmp-\d+$")  # shard-00003.tokens.tmp-PID


class PartitionError(UserError, ValueError):
    """A partitioned build that cannot be merged yet or was run inconsistently."""


def owns(unit: int, num_partitions: int, partition: int) -> bool:
    """Whether part `partition` of `num_partitions` builds work unit `unit` (round robin)."""
    return unit % num_partitions == partition


def part_record_path(out: Path, num_partitions: int, partition: int) -> Path:
    """Where part K of N records that all its units are written."""
    return out / WORK_DIR / f"part-{partition}-of-{num_partitions}.json"


def write_part_record(out: Path, num_partitions: int, partition: int, record: dict) -> None:
    """Record a finished part (atomically; the name says K and N)."""
    write_json_atomic(part_record_path(out, num_partitions, partition), record)


def remove_own_temporaries(folders: list[Path], num_partitions: int, partition: int) -> int:
    """Delete `*.tmp-*` files of units this part owns (left by its interrupted run); other parts'
    temporaries may be files being written right now, so they are left alone."""
    n = 0
    for folder in folders:
        if not folder.is_dir():
            continue
        for p in folder.glob("*.tmp-*"):
            m = _UNIT_OF_TEMP.search(p.name)
            if m and owns(int(m.group(1)), num_partitions, partition):
                p.unlink(missing_ok=True)
                n += 1
    return n


def read_part_records(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """{(K, N): record} of every part record under OUT/.work."""
    found = {}
    for p in sorted((out / WORK_DIR).glob("part-*-of-*.json")):
        m = _PART_FILE.search(p.name)
        if m:
            found[(int(m.group(1)), int(m.group(2)))] = json.loads(p.read_text(encoding="utf-8"))
    return found


def complete_units(out: Path, key: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """(N, the part records in order) when all N parts of this build are recorded with `key`;
    raises PartitionError naming what is missing or inconsistent."""
    records = read_part_records(out)
    if not records:
        raise PartitionError(
            f"{out / WORK_DIR}: no finished part yet; run the parts "
            "(`bertforge prep build ... --num_partitions N --partition K`)."
        )
    sizes = sorted({n for _, n in records})
    if len(sizes) > 1:
        raise PartitionError(
            f"{out / WORK_DIR} holds parts of different --num_partitions "
            f"{sizes}; rerun every part with one value (delete the stray "
            "part-*-of-*.json records of the other)."
        )
    n = sizes[0]
    missing = [k for k in range(n) if (k, n) not in records]
    if missing:
        raise PartitionError(
            f"{out}: part(s) {missing} of {n} not finished yet; run "
            f"`bertforge prep build ... --num_partitions {n} --partition K` "
            "for each of them, then merge."
        )
    ordered = [records[(k, n)] for k in range(n)]
    for k, rec in enumerate(ordered):
        if rec["build_key"] != key:
            diffs = sorted(
                f for f in set(key) | set(rec["build_key"]) if key.get(f) != rec["build_key"].get(f)
            )
            raise PartitionError(
                f"{part_record_path(out, n, k)}: part {k} was built with other "
                f"arguments than {out / WORK_DIR}/build.json (differs in: "
                f"{', '.join(diffs)}); rerun that part with the same arguments."
            )
    totals = {rec["total_units"] for rec in ordered}
    if len(totals) > 1:
        raise PartitionError(
            f"{out}: the parts saw different inputs ({sorted(totals)} work "
            "units); the input files changed between parts: rebuild."
        )
    return n, ordered


class MergeLock:
    """The merge's exclusive lock: a :class:`~data_prep.lock.FolderLock` (names its holder; the
    lock of a holder that died on this host is taken over with a warning).

    ``held`` is False while another live job merges, or when ``.work`` is gone (merged already:
    the lock never recreates it).
    """

    def __init__(self, out: Path):
        self.path = out / WORK_DIR / MERGE_LOCK
        self._lock = FolderLock(self.path, f"the merge of {out}", make_parent=False)
        self.held = False

    def __enter__(self) -> Self:
        try:
            self._lock.acquire()
        except (LockError, FileNotFoundError):  # merging elsewhere, or .work gone: merged already
            return self
        self.held = True
        return self

    def __exit__(self, *exc) -> None:
        if self.held:
            self._lock.release()
