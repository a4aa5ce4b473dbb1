"""A shard folder at a URL as the shard cache sees it: its mirror, its shards as units.

:class:`RemoteFolder` fetches a folder's manifest and tokenizer (checked against the manifest's
fingerprint) into a mirror named after the manifest's sha256, checks with one listing per split
that every shard file is in the store at its manifest size, and hands out one :class:`Unit` per
shard: its files, fetched, counted and evicted together by :mod:`data_prep.shard_cache`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

from bertforge.data_prep.layout import MANIFEST, TOKENIZER_DIR
from bertforge.data_prep.object_store import Store, StoreError
from bertforge.errors import UserError
from bertforge.files import write_bytes_atomic
from bertforge.logs import get_logger

log = get_logger(__name__)

_UNITS = {
    "": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
#: a tokenizer folder's files where the store cannot list folders (plain https)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DEFAULT_LIMIT = "20GB"


def parse_size(text: str | int, flag: str = "--cache_limit") -> int:
    """Bytes of ``500MB``, ``20GB``, ``1.5GiB`` or a plain number of bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise UserError(f"{flag} {text!r}: give a size such as 500MB, 20GB or 1.5GiB")
    return int(float(m.group(1)) * _UNITS[unit])


def human(n: int) -> str:
    """Bytes for a message: 1.2 GB, 340 MB, 12 kB."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


class Unit:
    """One shard of a remote folder: its files, fetched and evicted together."""

    __slots__ = ("folder", "split", "name", "files", "nbytes")

    def __init__(self, folder: RemoteFolder, split: str, info: dict[str, Any]):
        self.folder, self.split, self.name = folder, split, str(info["name"])
        self.files: dict[str, dict[str, Any]] = dict(info["files"])
        self.nbytes = sum(int(f["bytes"]) for f in self.files.values())

    def __repr__(self) -> str:
        return f"Unit({self.folder.store.url_of(self.split + '/' + self.name)})"

    def local(self, fname: str) -> Path:
        return self.folder.local_root / self.split / fname

    def present(self) -> bool:
        """Whether every file is in the cache at its manifest size (it was checked on arrival)."""
        for fname, expected in self.files.items():
            try:
                if self.local(fname).stat().st_size != int(expected["bytes"]):
                    return False
            except OSError:
                return False
        return True


class RemoteFolder:
    """A shard folder at a URL and its mirror in the cache (see the module doc). ``cache``: the
    :class:`~data_prep.shard_cache.ShardCache` (its folder, retry policy and ``register``)."""

    def __init__(self, cache, url: str):
        self.cache = cache
        self.store = Store(url, cache.retry)
        raw = self.store.read_bytes(MANIFEST)
        try:
            self.manifest = json.loads(raw)
        except ValueError as e:
            raise StoreError(f"{self.store.url_of(MANIFEST)} is not valid JSON ({e})") from None
        self.key = hashlib.sha256(raw).hexdigest()[:16]
        self.local_root = cache.folder / self.key
        self._units: dict[tuple[str, str], Unit] = {}
        if not (self.local_root / MANIFEST).is_file():
            self._fetch_tokenizer()
            write_bytes_atomic(self.local_root / MANIFEST, raw)  # last: the mirror is complete

    def __getstate__(self) -> dict[str, Any]:
        """A copy in another process (a spawned DataLoader worker) reads the cache, never
        fetches: the rank's cache and its threads stay with the rank."""
        return {**self.__dict__, "cache": None, "_units": {}}

    def _fetch_tokenizer(self) -> None:
        """The tokenizer folder, checked against the manifest's fingerprint."""
        from bertforge.data_prep.tokenizer import describe  # lazy: tokenizers

        try:
            names = self.store.files_under(TOKENIZER_DIR)
        except StoreError:
            raise
        except Exception:  # noqa: BLE001 (a store that lists no folders: plain https)
            names = dict.fromkeys(_TOKENIZER_FILES, 0)
        target = self.local_root / TOKENIZER_DIR
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            try:
                data = self.store.read_bytes(f"{TOKENIZER_DIR}/{name}")
            except StoreError as e:
                if isinstance(e.__cause__, FileNotFoundError) and name != "tokenizer.json":
                    continue
                raise
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(target / name, data)
        want = self.manifest.get("tokenizer", {}).get("fingerprint")
        got = describe(target).fingerprint
        if want and got != want:
            shutil.rmtree(target, ignore_errors=True)
            raise StoreError(
                f"{self.store.url_of(TOKENIZER_DIR)}: its fingerprint {got[:12]} is not the "
                f"manifest's {want[:12]}; the folder was changed after its build: rebuild it"
            )

    def unit(self, split: str, info: dict[str, Any]) -> Unit:
        """The Unit of shard ``info`` of ``split`` (one object per shard, registered)."""
        key = (split, str(info["name"]))
        found = self._units.get(key)
        if found is None:
            found = self._units[key] = Unit(self, split, info)
            self.cache.register(found)
        return found

    def check_objects(self, split: str, shards: list[dict[str, Any]]) -> None:
        """Every shard file of ``split`` is in the store at its manifest size (one listing)."""
        if not shards:
            return
        try:
            sizes = self.store.listing(split)
        except StoreError:
            raise
        except Exception as e:  # noqa: BLE001 (plain https lists nothing: sizes on arrival)
            log.info(f"{self.store.url_of(split)}: not listed ({e}); sizes checked on arrival")
            return
        for info in shards:
            for fname, expected in info["files"].items():
                size = sizes.get(fname)
                if size != int(expected["bytes"]):
                    what = "missing" if size is None else f"{size} bytes"
                    raise StoreError(
                        f"{self.store.url_of(split + '/' + fname)}: {what}, the manifest says "
                        f"{expected['bytes']}; the upload is incomplete or was replaced. Upload "
                        "the shard folder again (manifest last)."
                    )
