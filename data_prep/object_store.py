"""Shard folders in object storage: any fsspec URL (``s3://``, ``gs://``, ``https://``, ...).

A :class:`Store` is one folder at a URL. Reads and writes go through fsspec with the store's own
client (s3fs, gcsfs; ``pip install 'bertforge[s3]'``), which finds credentials the standard way:
AWS's environment variables, profiles and instance roles, Google's application default
credentials; ``AWS_ENDPOINT_URL`` points s3fs at an S3-compatible server. A URL that carries
credentials (``https://user:pass@...``, a signed query) is refused: it would be written into
the run's config, recipe and checkpoints.

:meth:`Store.fetch` copies one object to a local file in ranged reads, hashing as it goes; the
file appears (renamed into place) only when its byte count and sha256 are the manifest's. A 5xx,
a timeout, a dropped connection, a short read or a wrong checksum is retried with exponential
backoff (a short read resumes where the bytes stopped; a wrong checksum starts over); a missing
object or refused credentials fail at once. After the last try a :class:`StoreError` names the
object and what went wrong. The backoff's jitter has a generator of its own: the training's RNG
states (saved in every checkpoint) are never touched from here.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from bertforge.errors import UserError
from bertforge.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")

#: bytes per ranged read of an object (one request each)
CHUNK_BYTES = 8 << 20
#: query keys of a signed URL (S3, GCS, Azure): credentials that would end up in the run's files
_SIGNED_QUERY = ("signature", "x-amz-", "x-goog-", "sig=", "token")
_CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError")


class StoreError(UserError, OSError):
    """Object storage that cannot be used as asked; the message names the object and the fix."""


class ShortRead(OSError):
    """Fewer bytes arrived than asked for (a connection cut short, a truncated object)."""


class ChecksumMismatch(OSError):
    """The bytes that arrived do not hash to the manifest's sha256."""


def is_url(text: str | os.PathLike) -> bool:
    """Whether ``text`` names a location in object storage (``scheme://...``), not a local path."""
    text = str(text)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isidentifier() and len(scheme) > 1 and scheme != "file"


def check_url(url: str, flag: str = "--data") -> str:
    """``url`` without a trailing slash; refuses credentials in it (see the module doc)."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise StoreError(
            f"{flag} {redact(url)}: the URL carries credentials, which would be written into the "
            "run's config, recipe and checkpoints. Give them the standard way instead "
            "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, GOOGLE_APPLICATION_"
            "CREDENTIALS, ~/.aws/credentials) and drop them from the URL."
        )
    query = parts.query.lower()
    if any(key in query for key in _SIGNED_QUERY):
        raise StoreError(
            f"{flag} {redact(url)}: a signed URL (its query holds a signature or token) expires "
            "and would be written into the run's files; give the bucket's URL and credentials "
            "the standard way (environment or profile)."
        )
    return url.rstrip("/")


def redact(url: str) -> str:
    """``url`` fit for a message: user, password and query left out."""
    parts = urlsplit(str(url))
    if not parts.scheme:
        return str(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


@dataclass(frozen=True)
class Retry:
    """How often and how patiently a request is tried again."""

    tries: int = 5  # attempts in all (the first one included)
    backoff_s: float = 0.5  # wait before the first retry; doubled before each next one
    max_backoff_s: float = 30.0

    def waits(self) -> list[float]:
        """The waits before tries 2..tries, each with up to 25% jitter off."""
        jitter = random.Random()  # never the global generator (checkpointed RNG states)
        return [
            min(self.backoff_s * 2**i, self.max_backoff_s) * jitter.uniform(0.75, 1.0)
            for i in range(max(self.tries - 1, 0))
        ]


def _permanent(error: BaseException) -> bool:
    """An error no retry can mend: a missing object, refused or missing credentials."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return True
    return type(error).__name__ in _CREDENTIAL_ERRORS


def _describe(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text if len(text) < 300 else text[:300] + "..."


def _filesystem(url: str):
    """(fsspec filesystem, path inside it) of ``url``; a missing client is named with its fix."""
    import fsspec  # lazy: a run over local shards never needs it

    try:  # an instance of its own: its endpoint and credentials as the environment says now
        return fsspec.core.url_to_fs(url, skip_instance_cache=True)
    except ImportError as e:
        scheme = url.partition("://")[0]
        extra = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}.get(scheme)
        fix = f"pip install 'bertforge[{extra}]'" if extra else "install its fsspec client"
        raise StoreError(f"{redact(url)}: no client for {scheme}:// here ({e}); {fix}") from None
    except ValueError as e:
        raise StoreError(f"{redact(url)}: not a URL fsspec can open ({e})") from None


class Store:
    """One folder in object storage (see the module doc); paths below it are ``a/b`` strings."""

    def __init__(self, url: str, retry: Retry | None = None, flag: str = "--data"):
        self.url = check_url(str(url), flag)
        self.retry = retry or Retry()
        self.fs, self.path = _filesystem(self.url)
        self.path = self.path.rstrip("/")
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"Store({redact(self.url)!r})"

    def url_of(self, rel: str = "") -> str:
        """The redacted URL of ``rel`` (for messages)."""
        return redact(f"{self.url}/{rel}" if rel else self.url)

    def _full(self, rel: str) -> str:
        return f"{self.path}/{rel}" if rel else self.path

    def _retrying(self, rel: str, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` tried up to ``retry.tries`` times; StoreError naming the object at the end."""
        waits = self.retry.waits()
        for attempt in range(len(waits) + 1):
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 (every client's errors: classified here)
                if _permanent(e):
                    raise StoreError(self._permanent_message(rel, what, e)) from e
                if attempt == len(waits):
                    raise StoreError(
                        f"{self.url_of(rel)}: {what} failed {attempt + 1} times, the last with: "
                        f"{_describe(e)}. Check the store and the network, then resume "
                        "(--resume auto)."
                    ) from e
                log.warning(
                    f"{self.url_of(rel)}: {what} failed ({_describe(e)}); try {attempt + 2} of "
                    f"{len(waits) + 1} in {waits[attempt]:.1f} s",
                    extra={"all_ranks": True},
                )
                time.sleep(waits[attempt])
        raise AssertionError("unreachable")

    def _permanent_message(self, rel: str, what: str, e: BaseException) -> str:
        where = self.url_of(rel)
        if isinstance(e, FileNotFoundError):
            return f"{where}: no such object ({what}); check the URL, or upload the shard folder"
        return (
            f"{where}: {what} refused ({_describe(e)}): check the credentials (AWS_PROFILE, "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS) and that "
            "they may read the bucket"
        )

    # reads
    def read_bytes(self, rel: str) -> bytes:
        """The whole object ``rel`` (small ones: the manifest, a tokenizer file)."""
        return self._retrying(rel, "reading", lambda: self.fs.cat_file(self._full(rel)))

    def exists(self, rel: str = "") -> bool:
        self.fs.invalidate_cache(self._full(rel))
        return bool(self._retrying(rel, "checking", lambda: self.fs.exists(self._full(rel))))

    def listing(self, rel: str) -> dict[str, int]:
        """{name: bytes} of the objects directly in folder ``rel``."""
        full = self._full(rel)
        self.fs.invalidate_cache(full)
        entries = self._retrying(rel, "listing", lambda: self.fs.ls(full, detail=True))
        return {
            e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
            for e in entries
            if e.get("type") == "file"
        }

    def files_under(self, rel: str) -> dict[str, int]:
        """{path relative to ``rel``: bytes} of every object below folder ``rel``."""
        full = self._full(rel)
        self.fs.invalidate_cache(full)
        found = self._retrying(rel, "listing", lambda: self.fs.find(full, detail=True))
        prefix = self.fs._strip_protocol(full).rstrip("/") + "/"
        return {
            name[len(prefix) :]: int(info.get("size") or 0)
            for name, info in found.items()
            if name.startswith(prefix) and info.get("type") == "file"
        }

    def fetch(self, rel: str, dest: Path, expected: dict[str, Any]) -> None:
        """Copy object ``rel`` to ``dest``, verified against ``expected`` {bytes, sha256} (see
        the module doc); ``dest`` exists afterwards only with exactly those bytes."""
        if os.getpid() != self._pid:
            raise RuntimeError(f"{self}: used in a forked process (fetch in the main process)")
        dest = Path(dest)
        size, want = int(expected["bytes"]), str(expected["sha256"])
        tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        state = {"got": 0, "hash": hashlib.sha256()}
        try:
            with open(tmp, "wb") as out:

                def attempt() -> None:
                    if state["got"] == size and state["hash"].hexdigest() != want:
                        out.seek(0)  # a wrong checksum: start over
                        out.truncate()
                        state.update(got=0, hash=hashlib.sha256())
                    self._read_into(rel, out, state, size)
                    digest = state["hash"].hexdigest()
                    if digest != want:
                        raise ChecksumMismatch(
                            f"wrong checksum: sha256 {digest[:16]}... of the {size} bytes "
                            f"read, the manifest says {want[:16]}...: the object is not the one "
                            "the manifest was written for (re-upload the shard folder) or was "
                            "damaged on the way"
                        )

                self._retrying(rel, "fetching", attempt)
                out.flush()
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def _read_into(self, rel: str, out, state: dict, size: int) -> None:
        """Ranged reads from byte ``state["got"]`` to ``size``, appended to ``out`` and hashed; a
        read that ends early raises ShortRead with the bytes so far kept (the retry resumes)."""
        full = self._full(rel)
        while state["got"] < size:
            start = state["got"]
            end = min(start + CHUNK_BYTES, size)
            try:
                data = self.fs.cat_file(full, start=start, end=end)
            except OSError as e:  # S3's 416 InvalidRange: a resumed read past the object's end
                if start == 0 or "range" not in str(e).lower():
                    raise
                raise ShortRead(
                    f"short read: the object ends before byte {start} of the manifest's {size} "
                    "(it is truncated)"
                ) from e
            if data:
                out.write(data)
                state["hash"].update(data)
                state["got"] += len(data)
            if len(data) < end - start:
                raise ShortRead(
                    f"short read: {start + len(data)} of the manifest's {size} bytes arrived "
                    "(the connection was cut, or the object is truncated)"
                )

    # writes
    def put_file(self, local: Path, rel: str) -> None:
        """Upload ``local`` as ``rel`` and check the stored size."""
        local = Path(local)
        size = local.stat().st_size
        full = self._full(rel)

        def attempt() -> None:
            self.fs.put_file(str(local), full)
            self.fs.invalidate_cache(full)
            stored = int(self.fs.info(full).get("size") or 0)
            if stored != size:
                raise ShortRead(f"{stored} bytes stored of {size}")

        self._retrying(rel, "uploading", attempt)

    def put_tree(self, local: Path, last: str = "", keep_local=lambda p: False) -> int:
        """Upload every file under ``local`` that is not in the store at its size yet, ``last``
        (a file name: a manifest) after all others; ``keep_local(path)``: files to leave out.
        Returns how many were uploaded."""
        local = Path(local)
        have = self.files_under("") if self.exists("") else {}
        files = sorted(p for p in local.rglob("*") if p.is_file() and not keep_local(p))
        files.sort(key=lambda p: p.name == last)
        sent = 0
        for path in files:
            rel = path.relative_to(local).as_posix()
            if have.get(rel) != path.stat().st_size:
                self.put_file(path, rel)
                sent += 1
        return sent

    def put_bytes(self, data: bytes, rel: str) -> None:
        """Write ``data`` as object ``rel``."""
        self._retrying(rel, "writing", lambda: self.fs.pipe_file(self._full(rel), data))

    def remove(self, rel: str, recursive: bool = False) -> None:
        """Delete object ``rel`` (or every object under it); absent ones are no error."""
        full = self._full(rel)
        try:
            self._retrying(rel, "deleting", lambda: self.fs.rm(full, recursive=recursive))
        except StoreError as e:
            if not isinstance(e.__cause__, FileNotFoundError):
                raise
