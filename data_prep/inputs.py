"""Streaming documents out of the input files: text, jsonl, parquet, HF datasets, gzip/zstd.

Everything is read in order and in bounded memory (one line, one record batch or one document at
a time). Bad records are skipped, counted by reason in a `DropCounter` (the counts go into the
manifest), and the first few of each reason are reported with file and line.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

_COMPRESSED = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_JSONL = {".jsonl", ".ndjson", ".json"}
_TEXT = {".txt", ".text", ".md", ".raw"}
_HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
_BINARY_PROBE = 8192


class InputError(ValueError):
    """An input that cannot be used at all; the message names the file and what to do."""


@dataclass(frozen=True)
class InputConfig:
    """How documents are cut out of the input files."""

    text_field: str = "text"  # jsonl key / parquet or datasets column holding the text
    one_doc_per_line: bool = False  # text files: one document per line (else blank-line blocks)
    max_line_bytes: int = 8 << 20  # longer lines are skipped (counted as line_too_long)
    max_doc_bytes: int = 64 << 20  # blank-line blocks longer than this (characters) are cut


class DropCounter:
    """Counts skipped records by reason and reports the first few of each on stderr."""

    def __init__(self, quiet: bool = False, report_first: int = 5):
        self.counts: Counter[str] = Counter()
        self.split_documents = 0  # oversized blank-line blocks cut into pieces (not dropped)
        self.quiet = quiet
        self.report_first = report_first

    def drop(self, reason: str, where: str, detail: str) -> None:
        """Count one skipped record; print `where: detail` for the first few of each reason."""
        self.counts[reason] += 1
        if not self.quiet and self.counts[reason] <= self.report_first:
            last = self.counts[reason] == self.report_first
            more = " (further ones are only counted)" if last else ""
            print(f"data_prep: skipped {where}: {detail} [{reason}]{more}", file=sys.stderr)


def _kind(path: Path) -> tuple[str, str | None]:
    """(kind, compression) of a file from its suffixes: kind is text, jsonl or parquet."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = _COMPRESSED.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    if last == ".parquet":
        return "parquet", compression
    return ("jsonl" if last in _JSONL else "text"), compression


def _is_hf_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in _HF_MARKERS)


def _walk(folder: Path) -> list[Path]:
    """Input files under a folder, sorted; HF dataset folders count as one input."""
    found: list[Path] = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith("."):
            continue
        if _is_hf_dataset(child):
            found.append(child)
        elif child.is_dir():
            found.extend(_walk(child))
        else:
            suffixes = [s.lower() for s in child.suffixes]
            if suffixes and suffixes[-1] in _COMPRESSED:
                suffixes = suffixes[:-1]
            if suffixes and suffixes[-1] in (_TEXT | _JSONL | {".parquet"}):
                found.append(child)
            else:
                print(
                    f"data_prep: ignoring {child} (unknown extension; name it explicitly to "
                    "read it as text)",
                    file=sys.stderr,
                )
    return found


def expand_inputs(patterns: list[str]) -> list[Path]:
    """Resolve files, folders (recursively) and globs into a sorted, de-duplicated file list."""
    out: list[Path] = []
    for pattern in patterns:
        if any(c in pattern for c in "*?["):
            matches = sorted(glob.glob(pattern, recursive=True))
            if not matches:
                raise InputError(f"input glob {pattern!r} matches no file; check the pattern.")
            paths = [Path(m) for m in matches]
        else:
            p = Path(pattern)
            if not p.exists():
                raise InputError(f"input path {pattern!r} does not exist; check --input.")
            paths = [p]
        for p in paths:
            if p.is_dir() and not _is_hf_dataset(p):
                files = _walk(p)
                if not files:
                    raise InputError(
                        f"input folder {p} holds no readable file (.txt, .jsonl, "
                        ".parquet, optionally .gz/.zst, or a saved HF dataset)."
                    )
                out.extend(files)
            else:
                out.append(p)
    seen: set[Path] = set()
    unique = []
    for p in out:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(key)
    return unique


class _ZstdRaw(io.RawIOBase):
    """Streaming zstd decompression (any number of frames) that reports a truncated file;
    zstandard's stream_reader ends silently in the middle of a frame."""

    def __init__(self, path: Path):
        import zstandard

        self._zstd = zstandard
        self._src = open(path, "rb")
        self._new_frame()
        self._pending = b""
        self._pos = 0  # read position in _pending (no re-slicing of big buffers)

    def _new_frame(self) -> None:
        self._dobj = self._zstd.ZstdDecompressor().decompressobj()
        self._in_frame = False

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while self._pos >= len(self._pending):
            self._pending, self._pos = b"", 0
            chunk = self._src.read(1 << 20)
            if not chunk:
                if self._in_frame:
                    raise EOFError("compressed stream ends in the middle of a zstd frame")
                return 0
            try:
                while chunk:
                    self._in_frame = True
                    self._pending += self._dobj.decompress(chunk)
                    chunk = b""
                    if self._dobj.eof:  # frame complete; the rest is the next frame
                        chunk = self._dobj.unused_data
                        self._new_frame()
            except self._zstd.ZstdError as e:
                raise ValueError(f"zstd: {e}") from e
        n = min(len(buf), len(self._pending) - self._pos)
        buf[:n] = memoryview(self._pending)[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        self._src.close()
        super().close()


def _open_binary(path: Path, compression: str | None) -> IO[bytes]:
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "zstd":
        return io.BufferedReader(_ZstdRaw(path), buffer_size=1 << 20)
    return open(path, "rb", buffering=1 << 20)


def _lines(
    path: Path, compression: str | None, cfg: InputConfig, drops: DropCounter
) -> Iterator[tuple[int, str]]:
    """(line number, decoded line without its newline) of a text stream; bad lines are counted."""
    where = str(path)
    lineno = 0
    try:
        with _open_binary(path, compression) as f:
            head = f.peek(_BINARY_PROBE)[:_BINARY_PROBE] if hasattr(f, "peek") else b""
            if not head:
                drops.drop("empty_file", where, "empty file, no documents")
                return
            if b"\x00" in head:
                drops.drop(
                    "binary_file",
                    where,
                    "binary data (NUL bytes) in the first 8 KiB, "
                    "not text; remove it from --input or decompress it first",
                )
                return
            while True:
                raw = f.readline(cfg.max_line_bytes + 1)
                if not raw:
                    return
                lineno += 1
                if len(raw) > cfg.max_line_bytes and not raw.endswith(b"\n"):
                    while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                        pass  # skip the rest of the over-long line without holding it
                    drops.drop(
                        "line_too_long",
                        f"{where}:{lineno}",
                        f"line longer than {cfg.max_line_bytes} bytes (--max_line_bytes)",
                    )
                    continue
                if b"\x00" in raw:
                    drops.drop("binary_line", f"{where}:{lineno}", "NUL bytes in the line")
                    continue
                try:
                    yield lineno, raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as e:
                    drops.drop(
                        "invalid_utf8_line",
                        f"{where}:{lineno}",
                        f"not UTF-8 ({e.reason} at byte {e.start})",
                    )
    except (OSError, EOFError, ValueError) as e:
        if isinstance(e, FileNotFoundError):
            raise InputError(f"{where}: file disappeared during the build.") from e
        name = type(e).__name__
        raise InputError(
            f"{where}: cannot read after line {lineno} ({name}: {e}); the file is "
            "corrupt or truncated. Fix or remove it and rerun."
        ) from e


def _text_documents(
    path: Path, compression: str | None, cfg: InputConfig, drops: DropCounter
) -> Iterator[str]:
    if cfg.one_doc_per_line:
        for _, line in _lines(path, compression, cfg, drops):
            if line.strip():
                yield line.strip()
        return
    block: list[str] = []
    size = 0
    for _, line in _lines(path, compression, cfg, drops):
        if line.strip():
            block.append(line)
            size += len(line) + 1
            if size >= cfg.max_doc_bytes:
                drops.split_documents += 1
                yield "\n".join(block).strip()
                block, size = [], 0
        elif block:
            yield "\n".join(block).strip()
            block, size = [], 0
    if block:
        yield "\n".join(block).strip()


def _jsonl_documents(
    path: Path, compression: str | None, cfg: InputConfig, drops: DropCounter
) -> Iterator[str]:
    field = cfg.text_field
    n_records = n_missing = n_docs = 0
    first_keys: list[str] | None = None
    for lineno, line in _lines(path, compression, cfg, drops):
        if not line.strip():
            continue
        n_records += 1
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            drops.drop("jsonl_invalid_json", where, f"not JSON ({e.msg} at column {e.colno})")
            continue
        if not isinstance(record, dict) or field not in record:
            n_missing += 1
            if first_keys is None and isinstance(record, dict):
                first_keys = sorted(record)[:10]
            drops.drop("jsonl_missing_field", where, f"no {field!r} field (--text_field)")
            continue
        text = record[field]
        if not isinstance(text, str):
            drops.drop(
                "jsonl_field_not_text", where, f"{field!r} is {type(text).__name__}, not a string"
            )
            continue
        if not text.strip():
            drops.drop("empty_document", where, f"empty {field!r}")
            continue
        n_docs += 1
        yield text.strip()
    if n_records and n_missing == n_records:
        raise InputError(
            f"{path}: none of its {n_records} records has the field {field!r} "
            f"(first record's keys: {first_keys}); pass --text_field KEY."
        )


def _column_documents(batches: Iterator[list], where: str, drops: DropCounter) -> Iterator[str]:
    row = 0
    for batch in batches:
        for text in batch:
            row += 1
            if not isinstance(text, str):
                drops.drop("null_text", f"{where} row {row}", f"value is {type(text).__name__}")
            elif not text.strip():
                drops.drop("empty_document", f"{where} row {row}", "empty text")
            else:
                yield text.strip()


def _parquet_documents(path: Path, cfg: InputConfig, drops: DropCounter) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise InputError(f"{path}: not a readable parquet file ({e}).") from e
    names = pf.schema_arrow.names
    if cfg.text_field not in names:
        raise InputError(
            f"{path}: no column {cfg.text_field!r} (columns: {names}); pass --text_field COLUMN."
        )
    batches = (
        b.column(0).to_pylist() for b in pf.iter_batches(batch_size=1024, columns=[cfg.text_field])
    )
    yield from _column_documents(batches, str(path), drops)


def _hf_documents(path: Path, cfg: InputConfig, drops: DropCounter) -> Iterator[str]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    parts = (
        [(name, loaded[name]) for name in sorted(loaded)]
        if isinstance(loaded, datasets.DatasetDict)
        else [("", loaded)]
    )
    for name, ds in parts:
        if cfg.text_field not in ds.column_names:
            raise InputError(
                f"{path}{'/' + name if name else ''}: no column {cfg.text_field!r} "
                f"(columns: {ds.column_names}); pass --text_field COLUMN."
            )
        batches = (b[cfg.text_field] for b in ds.select_columns([cfg.text_field]).iter(1024))
        yield from _column_documents(batches, f"{path}{'/' + name if name else ''}", drops)


def iter_documents(files: list[Path], cfg: InputConfig, drops: DropCounter) -> Iterator[str]:
    """Every document of every input file, in order (stripped, never empty)."""
    for path in files:
        if _is_hf_dataset(path):
            yield from _hf_documents(path, cfg, drops)
            continue
        if path.is_dir():
            raise InputError(f"{path} is a folder, not a saved HF dataset; pass its files.")
        kind, compression = _kind(path)
        if kind == "parquet":
            yield from _parquet_documents(path, cfg, drops)
        elif kind == "jsonl":
            yield from _jsonl_documents(path, compression, cfg, drops)
        else:
            yield from _text_documents(path, compression, cfg, drops)


def _sample_hash(path: Path, size: int, window: int = 1 << 20) -> str:
    """sha256 of the first, middle and last MiB: cheap, and it changes when the content does."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for start in sorted({0, max(0, size // 2 - window // 2), max(0, size - window)}):
            f.seek(start)
            h.update(f.read(window))
    return h.hexdigest()


def input_signature(files: list[Path]) -> list[dict]:
    """Path, size and sampled content hash of each input: a resumed build must see the same
    files (a file rewritten with the same content still matches)."""
    sig = []
    for p in files:
        if p.is_dir():  # a saved dataset: its files' names and sizes
            parts = sorted(
                (str(f.relative_to(p)), f.stat().st_size) for f in p.rglob("*") if f.is_file()
            )
            sig.append(
                {
                    "path": str(p),
                    "bytes": sum(n for _, n in parts),
                    "sha256_sample": hashlib.sha256(repr(parts).encode()).hexdigest(),
                }
            )
        else:
            size = p.stat().st_size
            sig.append({"path": str(p), "bytes": size, "sha256_sample": _sample_hash(p, size)})
    return sig
