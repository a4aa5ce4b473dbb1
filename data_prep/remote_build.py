"""``data_prep build|prepare|merge`` with ``--output`` in object storage (``s3://bucket/shards``).

A build never writes into the store piece by piece: it runs as always into a local staging
folder (``$TMPDIR/bertforge-build/<name>-<hash of the URL>``, so an interrupted build resumes
from it), and what it finished is then uploaded, each object's stored size checked, the manifest
last: a reader of the URL sees a complete folder or none. Split builds work across machines:

- ``prepare --output URL`` uploads ``.work/build.json``, the tokenizer and the decontamination
  index;
- ``build ... --num_partitions N --partition K --output URL`` first fetches those into its own
  staging folder (when prepare ran elsewhere), builds its units, uploads their shards and unit
  records and its part record; the part that finds every part's record in the store writes the
  manifest (as the last local part does);
- ``merge URL`` checks every unit's shard files in the store (one listing per split), writes the
  manifest from the records and uploads it, and removes ``.work`` from the store.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bertforge.data_prep.build import DECONTAM_INDEX
from bertforge.data_prep.layout import MANIFEST, SPLITS, TOKENIZER_DIR, WORK_DIR
from bertforge.data_prep.object_store import Store, StoreError, is_url
from bertforge.data_prep.partition import PartitionError, complete_units
from bertforge.data_prep.worker import done_record_path
from bertforge.files import write_bytes_atomic
from bertforge.logs import get_logger

log = get_logger(__name__)

#: what ``prepare`` leaves in .work for the parts: the build's state, the decontamination index
PREPARED = ("build.json", DECONTAM_INDEX)
#: files of a staging folder that stay there (locks, temporaries)
_LOCAL_ONLY = (".lock", ".tmp-", "merge.lock")


def staging_folder(url: str) -> Path:
    """The local folder a build for ``url`` runs in (the same for every launch of it)."""
    name = url.rstrip("/").rsplit("/", 1)[-1] or "build"
    digest = hashlib.sha256(url.encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / "bertforge-build" / f"{name}-{digest}"


def output_url(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` with a URL ``--output`` (or ``merge URL``) replaced by its staging folder, and
    the URL (None when the output is a local folder)."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--output" and i + 1 < len(argv) and is_url(argv[i + 1]):
            url, argv[i + 1] = argv[i + 1], str(staging_folder(argv[i + 1]))
            return argv, url
        if arg.startswith("--output=") and is_url(arg.split("=", 1)[1]):
            url = arg.split("=", 1)[1]
            argv[i] = f"--output={staging_folder(url)}"
            return argv, url
    if argv[:1] == ["merge"] and len(argv) > 1 and is_url(argv[1]):
        url, argv[1] = argv[1], str(staging_folder(argv[1]))
        return argv, url
    return argv, None


def _local_only(path: Path) -> bool:
    return any(mark in path.name for mark in _LOCAL_ONLY)


def _fetch_tree(store: Store, rel: str, local: Path) -> None:
    """Copy folder ``rel`` of the store into ``local/rel`` (small files: records, tokenizer)."""
    for name in store.files_under(rel):
        dest = local / rel / name
        if not dest.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(dest, store.read_bytes(f"{rel}/{name}"))


def before(command: str, url: str, staging: Path, overwrite: bool, partitioned: bool) -> Store:
    """Checks and fetches before a build into ``staging`` for ``url``."""
    store = Store(url, flag="--output")
    if command == "build" and store.exists(MANIFEST) and not overwrite:
        raise StoreError(
            f"{store.url_of(MANIFEST)} exists: {store.url_of()} holds a finished build. Use "
            "another --output URL or pass --overwrite."
        )
    if command == "build" and partitioned and not (staging / WORK_DIR / "build.json").is_file():
        if not store.exists(f"{WORK_DIR}/build.json"):
            raise StoreError(
                f"{store.url_of(WORK_DIR + '/build.json')} not found: run `bertforge prep "
                f"prepare <the same arguments> --output {store.url_of()}` first"
            )
        # prepare's state, made on another machine (not the other parts' records: this
        # part's local build would try to merge them without their shards)
        for name in store.files_under(WORK_DIR):
            if name in PREPARED:
                dest = staging / WORK_DIR / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                write_bytes_atomic(dest, store.read_bytes(f"{WORK_DIR}/{name}"))
        _fetch_tree(store, TOKENIZER_DIR, staging)
    return store


def after(command: str, store: Store, staging: Path, manifest: dict[str, Any] | None) -> None:
    """Upload what the command finished in ``staging`` (see the module doc)."""
    sent = store.put_tree(staging, last=MANIFEST, keep_local=_local_only)
    log.info(f"uploaded {sent} files to {store.url_of()}")
    if command == "build" and manifest is None:
        try:
            merge_remote(store, staging)
        except PartitionError as e:
            log.info(f"{e} (the last part to finish writes the manifest)")


def merge_remote(store: Store, staging: Path) -> dict[str, Any]:
    """Write the manifest of a split build whose parts are all in the store (module doc)."""
    from bertforge.data_prep.manifest import build_manifest  # lazy: tokenizers

    if store.exists(MANIFEST):
        return json.loads(store.read_bytes(MANIFEST))
    _fetch_tree(store, WORK_DIR, staging)
    _fetch_tree(store, TOKENIZER_DIR, staging)
    key = json.loads((staging / WORK_DIR / "build.json").read_text(encoding="utf-8"))
    _, parts = complete_units(staging, key)
    sizes = {s: store.listing(s) if store.exists(s) else {} for s in SPLITS}
    records = []
    for unit in range(parts[0]["total_units"]):
        path = done_record_path(staging, unit)
        if not path.is_file():
            raise PartitionError(f"{store.url_of(WORK_DIR)}: work unit {unit} has no record")
        record = json.loads(path.read_text(encoding="utf-8"))
        for split, info in record["splits"].items():
            for fname, meta in ((info["shard"] or {}).get("files") or {}).items():
                if sizes.get(split, {}).get(fname) != meta["bytes"]:
                    raise PartitionError(
                        f"{store.url_of(split + '/' + fname)} is missing or of another size "
                        f"than unit {unit}'s record; rerun the part that owns that unit"
                    )
        records.append(record)
    manifest = build_manifest(staging, key, records, parts[0])
    text = json.dumps(manifest, indent=1, ensure_ascii=False, default=str) + "\n"
    store.put_bytes(text.encode("utf-8"), MANIFEST)
    store.remove(WORK_DIR, recursive=True)
    log.info(f"wrote {store.url_of(MANIFEST)}")
    return manifest


def verify_remote(url: str) -> list[str]:
    """``data_prep verify URL``: every shard file of every split fetched through a shard cache
    (each sha256 checked on arrival; the cache evicts as it goes), the tokenizer checked against
    the manifest's fingerprint when the folder opens. Returns the files checked; raises
    StoreError naming the first object that fails."""
    from bertforge.data_prep import shard_cache  # lazy: the cache and fsspec
    from bertforge.data_prep.reader import ShardReader

    fresh = Path(tempfile.mkdtemp(prefix="bertforge-verify-"))  # nothing taken from a cache
    shard_cache.configure(fresh, "2GB")
    checked = []
    try:
        for split in SPLITS:
            try:
                reader = ShardReader(url, split)
            except ValueError:  # no such split in this build
                continue
            for unit in reader.units_of(range(len(reader._units))):
                shard_cache.process_cache().ensure([unit])
                checked += [f"{split}/{name}" for name in unit.files]
    finally:
        shard_cache.close()
        shutil.rmtree(fresh, ignore_errors=True)
    return checked
