"""Full sha256 check of each shard folder once per run folder, remembered across launches.

At launch, after the rendezvous, the trainer's ranks recompute the sha256 of every shard file of
every split of each ``--data`` folder between them (rank r reads files r, r + world, ...) and
compare it with the folder's manifest; one all-reduce makes a mismatch on any rank stop every
rank (ShardError naming the file on the rank that read it). Split this way the read takes
1/world of the time; the all-reduce waits at most ``--dist_timeout_s`` for the slowest rank. A
folder that passed is recorded in ``RUN/verified_shards.json`` with the sha256 of its
manifest.json, so later launches and resumes of the same run skip the read. A rebuilt folder
(another manifest) is verified again. After the first check only the byte sizes are compared at
each launch (:class:`data_prep.reader.ShardReader` verify="size").
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

from bertforge.data_prep import layout
from bertforge.data_prep.layout import MANIFEST
from bertforge.data_prep.reader import ShardError, check_file, load_manifest
from bertforge.files import write_json_atomic
from bertforge.logs import get_logger
from bertforge.pretrain.run_folder.layout import RunFolder

log = get_logger(__name__)


def _read_record(path: Path) -> dict[str, Any]:
    """The remembered folders {resolved path: {manifest_sha256, verified}}; empty when absent."""
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        log.warning(f"{path} is unreadable; verifying the shards again")
        return {}
    return record.get("folders", {}) if isinstance(record, dict) else {}


def verify_folder(root: Path, rank: int = 0, world: int = 1) -> int:
    """Recompute the sha256 of this rank's share of the shard files of every split of ``root``
    (files rank, rank + world, ...); returns how many it read. Raises ShardError naming the
    first missing, truncated or corrupt file."""
    manifest = load_manifest(root)
    files = [
        (root / split / fname, expected)
        for split, info in manifest["splits"].items()
        for shard in info["shards"]
        for fname, expected in shard["files"].items()
    ]
    total = sum(int(expected.get("bytes", 0)) for _, expected in files)
    # Said first (rank 0 speaks): on a large corpus the read takes minutes.
    log.info(
        f"checking the sha256 of {len(files)} shard files ({total / 1e9:.2f} GB) "
        f"in {root} on {world} rank(s), once for this run folder"
    )
    mine = files[rank::world]
    for path, expected in mine:
        check_file(path, expected, "full")
    return len(mine)


def verify_once(
    folders: list[Path], run_dir: Path, rank: int = 0, world: int = 1, agree=None
) -> list[Path]:
    """Verify each shard folder not yet verified for this run (same manifest), split across the
    ranks; rank 0 records it. Returns the folders checked now (empty when every one was
    verified at an earlier launch). ``agree(failed) -> failures on all ranks`` is the
    all-reduce that makes every rank stop together (collective: all ranks call this)."""
    record_path = RunFolder(run_dir).verified_shards
    done = _read_record(record_path)
    checked = []
    for folder in folders:
        root = Path(folder).resolve()
        manifest_file = root / MANIFEST
        if not manifest_file.is_file():
            load_manifest(root)  # raises the reader's ShardError, which says what to do
        digest = layout.sha256_file(manifest_file)
        if done.get(str(root), {}).get("manifest_sha256") == digest:
            continue
        error = None
        try:
            verify_folder(root, rank, world)
        except ShardError as e:
            error = e
        failures = agree(error is not None) if agree else int(error is not None)
        if error is not None:
            raise error
        if failures:
            raise ShardError(
                f"{root}: a shard file failed its sha256 check on another rank "
                "(its log names the file); rebuild or re-copy the shard folder"
            )
        log.info(
            f"sha256 of the shard files in {root} verified (done once; remembered in {record_path})"
        )
        done[str(root)] = {
            "manifest_sha256": digest,
            "verified": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        checked.append(root)
    if checked and rank == 0:
        record_path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(record_path, {"folders": done}, indent=2, sort_keys=True)
    return checked


__all__ = ["ShardError", "verify_folder", "verify_once"]
