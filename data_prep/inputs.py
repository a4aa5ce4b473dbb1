"""Streaming documents out of the input files: text, jsonl, gzip/zstd, and the table-shaped
inputs of :mod:`data_prep.tables` (parquet, CSV/TSV, saved HF datasets).

Everything is read in order and in bounded memory (one line, one record batch or one document at
a time). Input must be UTF-8; lines end in LF, CRLF or a lone CR (as Python's universal newlines)
and a UTF-8 byte-order mark is removed. A bad record is skipped, counted by reason in a
`DropCounter` (the counts and the first few records, with file and line, go into the manifest's
`bad_records`), and the first few of each reason are reported on stderr. What counts as one bad
record (decided per input class, tested by tests/data_prep/test_build_fuzz.py):

- a whole file: empty, UTF-16/32 text, or binary (over 30% of its first 8 KiB NUL bytes or
  invalid UTF-8; a file of fewer than 64 bytes is judged line by line); a parquet file that
  cannot be opened;
- a line (text, jsonl): NUL bytes, invalid UTF-8, longer than `max_line_bytes`;
- a jsonl record: not JSON, not an object, no text field, a text that is not a string, holds a
  lone surrogate escape (an invalid \\uD800-\\uDFFF) or is blank; a parquet/CSV/dataset value
  that is null, not a string or blank; a CSV/TSV row with another number of fields than its
  header;
- a damaged compressed stream (a .gz/.zst cut short or corrupt) or an unreadable parquet row
  group: everything read before the damage is kept, the damage is one bad record (file and line,
  or row), and the rest of the file, from the record in progress on (in blank-line text, the
  document in progress) is lost. The build goes on: a corpus of many files is not thrown away
  for one bad download, and the count in the manifest says what was lost.

The build fails instead (InputError, naming the file and what to do) on argument mistakes: a
path that does not exist, a jsonl file none of whose objects has `--text_field`, a parquet,
CSV/TSV or dataset without that column; and (EncodingError) on a text or jsonl file of which
more than `--max_invalid_utf8_share` of the lines are not UTF-8. What is said about a file as a
whole (its share of such lines, a text file that makes one document) is
:mod:`data_prep.input_checks`.
"""

from __future__ import annotations

import codecs
import glob
import io
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bertforge.cli import opt
from bertforge.data_prep.compressed import COMPRESSED, STREAM_DAMAGE, open_binary
from bertforge.data_prep.input_checks import InputError, check_encoding, one_document_hint
from bertforge.data_prep.tables import TABLE_KINDS, hf_documents, table_documents
from bertforge.logs import get_logger

log = get_logger(__name__)

_JSONL = {".jsonl", ".ndjson", ".json"}
_TEXT = {".txt", ".text", ".md", ".raw"}
_HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
_BINARY_PROBE = 8192
_BINARY_MIN_PROBE = 64  # fewer bytes than this are judged line by line, not as a whole file
_BINARY_SHARE = 0.3  # a file whose probe has more NUL / invalid UTF-8 bytes than this is binary
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # an invalid byte as surrogateescape decodes it
MAX_BAD_EXAMPLES = 20  # bad records kept (with file and line) in the manifest


@dataclass(frozen=True)
class InputConfig:
    """How documents are cut out of the input files."""

    text_field: str = opt("text", "jsonl key, or the column of a parquet, CSV/TSV or saved dataset")
    one_doc_per_line: bool = opt(
        False, "text files: one document per line (default: blank-line-separated blocks)"
    )
    max_line_bytes: int = opt(8 << 20, "longer input lines are skipped and counted")  # as
    # line_too_long in the manifest's bad_records
    max_doc_bytes: int = 64 << 20  # blank-line blocks longer than this (characters) are cut


class DropCounter:
    """Counts bad records by reason, keeps the first few (file and line) for the manifest and
    reports the first few of each reason on stderr."""

    def __init__(
        self,
        quiet: bool = False,
        report_first: int = 5,
        max_invalid_utf8_share: float | None = None,
    ):
        self.counts: Counter[str] = Counter()
        self.examples: list[dict[str, str]] = []  # the first MAX_BAD_EXAMPLES, in input order
        self.split_documents = 0  # oversized blank-line blocks cut into pieces (not dropped)
        self.quiet = quiet
        self.report_first = report_first
        self.max_invalid_utf8_share = max_invalid_utf8_share  # of a file's lines; None: no limit
        self._reported: Counter[str] = Counter()
        self._warned: Counter[str] = Counter()  # whole-file warnings printed, by kind

    def drop(self, reason: str, where: str, detail: str) -> None:
        """Count one skipped record; keep and print `where: detail` for the first few."""
        detail = " ".join(detail.split())  # one line per record (pyarrow's messages span lines)
        self.counts[reason] += 1
        if len(self.examples) < MAX_BAD_EXAMPLES:
            self.examples.append({"where": where, "reason": reason, "detail": detail})
        self.report(reason, where, detail)

    def report(self, reason: str, where: str, detail: str) -> None:
        """Print one bad record (counted elsewhere, e.g. by a build worker), the first
        `report_first` of each reason only."""
        detail = " ".join(detail.split())
        self._reported[reason] += 1
        n = self._reported[reason]
        if not self.quiet and n <= self.report_first:
            more = " (further ones are only counted)" if n == self.report_first else ""
            log.warning(f"skipped {where}: {detail} [{reason}]{more}")

    def file_read(self, path: str, lines: int, invalid_utf8: int) -> None:
        """A text or jsonl file read to its end, ``invalid_utf8`` of its ``lines`` non-blank lines
        skipped as not UTF-8: raises EncodingError above the share allowed, else warns (the
        first ``report_first`` files) naming the file and the conversion."""
        self.warn(check_encoding(path, lines, invalid_utf8, self.max_invalid_utf8_share), "utf8")

    def warn(self, message: str | None, kind: str) -> None:
        """Print a warning about a whole file (unless quiet or None), the first few of a kind."""
        if message is None or self.quiet:
            return
        self._warned[kind] += 1
        if self._warned[kind] <= self.report_first:
            log.warning(message)


def _kind(path: Path) -> tuple[str, str | None]:
    """(kind, compression) of a file from its suffixes: kind is text, jsonl, or a table kind
    (parquet, csv, tsv)."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSED.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    if last in TABLE_KINDS:
        return TABLE_KINDS[last], compression
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
            if suffixes and suffixes[-1] in COMPRESSED:
                suffixes = suffixes[:-1]
            if suffixes and suffixes[-1] in (_TEXT | _JSONL | set(TABLE_KINDS)):
                found.append(child)
            else:
                log.warning(
                    f"ignoring {child} (unknown extension; name it explicitly to read it as text)"
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


def _probe(head: bytes) -> tuple[str, str] | None:
    """(reason, detail) when the first 8 KiB of a file show it is not UTF-8 text, else None."""
    if not head:
        return "empty_file", "empty file, no documents"
    # UTF-16/32: a byte-order mark, or (Latin text without one) every other byte NUL.
    halves = (head[0::2], head[1::2])
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or (
        len(head) >= 16 and any(h.count(0) >= 0.9 * len(h) for h in halves)
    ):
        return (
            "utf16_file",
            "UTF-16/32 text, not UTF-8; convert it (iconv -f UTF-16 -t UTF-8) and rerun",
        )
    # Judged on enough bytes only (a damaged stream may yield a few), without a character cut
    # at the end of the probe.
    if len(head) < _BINARY_MIN_PROBE:
        return None
    escaped = head.decode("utf-8", "surrogateescape")
    bad = head.count(0) + len(_ESCAPED_BYTE.findall(escaped[:-3]))
    if bad > _BINARY_SHARE * len(head):
        return (
            "binary_file",
            f"binary data or not UTF-8 ({bad} of the first {len(head)} bytes are NUL or invalid "
            "UTF-8); remove it from --input, or convert it (iconv -f ENCODING -t UTF-8)",
        )
    return None


def _bad_line(line: str, max_bytes: int) -> tuple[str, str] | None:
    """(reason, detail) when a decoded line (line end removed) is not usable text."""
    if "\x00" in line:
        return "binary_line", "NUL bytes in the line"
    if line.isascii():
        return None
    try:
        size = len(line.encode("utf-8"))  # also what the line length limit counts
    except UnicodeEncodeError as e:  # a byte surrogateescape could not decode
        byte = ord(line[e.start]) - 0xDC00
        return "invalid_utf8_line", f"not UTF-8 (byte 0x{byte:02X} at column {e.start + 1})"
    if size > max_bytes:
        return "line_too_long", f"line longer than {max_bytes} bytes (--max_line_bytes)"
    return None


def _lines(
    path: Path, compression: str | None, cfg: InputConfig, drops: DropCounter
) -> Iterator[tuple[int, str | None]]:
    """(line number, line without its line end) of a text stream; bad lines are counted and
    skipped. A damaged compressed stream is counted and ends the file with (line, None): the
    line in progress there is lost and the caller drops what it was assembling."""
    where = str(path)
    lineno = nonblank = invalid = 0  # the encoding check counts non-blank lines
    limit = cfg.max_line_bytes
    try:
        with open_binary(path, compression) as raw:
            problem = _probe(raw.peek(_BINARY_PROBE)[:_BINARY_PROBE])
            if problem:
                drops.drop(problem[0], where, problem[1])
                return
            # Invalid bytes decode to lone surrogates (checked per line) instead of stopping
            # the file; newline=None reads LF, CRLF and CR; utf-8-sig drops a leading BOM.
            text = io.TextIOWrapper(
                raw, encoding="utf-8-sig", errors="surrogateescape", newline=None
            )
            while line := text.readline(limit + 1):
                lineno += 1
                if not line.endswith("\n") and len(line) > limit:  # cut at the limit
                    while (rest := text.readline(1 << 20)) and not rest.endswith("\n"):
                        pass  # skip the rest of the over-long line without holding it
                    problem = (
                        "line_too_long",
                        f"line longer than {limit} bytes (--max_line_bytes)",
                    )
                else:
                    line = line.removesuffix("\n")
                    problem = _bad_line(line, limit)
                nonblank += bool(problem) or bool(line.strip())
                if problem:
                    invalid += problem[0] == "invalid_utf8_line"
                    drops.drop(problem[0], f"{where}:{lineno}", problem[1])
                    continue
                yield lineno, line
            drops.file_read(where, nonblank, invalid)
    except FileNotFoundError as e:
        raise InputError(f"{where}: file disappeared during the build.") from e
    except STREAM_DAMAGE as e:
        cut = isinstance(e, EOFError)
        drops.drop(
            "truncated_file" if cut else "corrupt_file",
            f"{where}:{lineno + 1}",
            f"compressed stream {'cut short' if cut else 'corrupt'} ({type(e).__name__}: {e}); "
            f"the {lineno} lines before are kept, the rest of the file from the record in "
            "progress on is lost. Re-create or re-download it to keep the rest",
        )
        yield lineno + 1, None
    except OSError as e:
        raise InputError(
            f"{where}: cannot read after line {lineno} ({type(e).__name__}: {e}); check the "
            "disk or the file and rerun."
        ) from e


def _text_documents(
    path: Path, compression: str | None, cfg: InputConfig, drops: DropCounter
) -> Iterator[tuple[str, str]]:
    if cfg.one_doc_per_line:
        for lineno, line in _lines(path, compression, cfg, drops):
            if line is not None and line.strip():
                yield line.strip(), f"{path}:{lineno}"
        return
    block: list[str] = []
    size = first = lines = documents = 0
    for lineno, line in _lines(path, compression, cfg, drops):
        if line is None:  # a damaged stream: the document in progress may be incomplete
            return
        if line.strip():
            if not block:
                first = lineno
            block.append(line)
            size += len(line) + 1
            lines += 1
            if size >= cfg.max_doc_bytes:
                drops.split_documents += 1
                documents += 1
                yield "\n".join(block).strip(), f"{path}:{first}"
                block, size = [], 0
        elif block:
            documents += 1
            yield "\n".join(block).strip(), f"{path}:{first}"
            block, size = [], 0
    if block:
        documents += 1
        yield "\n".join(block).strip(), f"{path}:{first}"
    drops.warn(one_document_hint(str(path), lines, documents), "one_document")


def _json_text(line: str, field: str) -> tuple[str, str | None, str]:
    """(kind, text, detail) of one jsonl line: kind "ok" with the text, "object_without_field",
    or a bad-record reason with what is wrong."""
    try:
        record = json.loads(line.removeprefix("\ufeff"))  # a BOM where files were concatenated
    except json.JSONDecodeError as e:
        return "jsonl_invalid_json", None, f"not JSON ({e.msg} at column {e.colno})"
    except (ValueError, RecursionError) as e:  # a 5000-digit number, a 100000-deep nesting
        return "jsonl_invalid_json", None, f"not usable JSON ({type(e).__name__}: {e})"
    if not isinstance(record, dict):
        return "jsonl_not_object", None, f"a JSON {type(record).__name__}, not an object"
    if field not in record:
        keys = sorted(map(str, record))[:10]
        return "object_without_field", None, f"no {field!r} field (keys: {keys}; --text_field)"
    text = record[field]
    if not isinstance(text, str):
        return "jsonl_field_not_text", None, f"{field!r} is {type(text).__name__}, not a string"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return (
                "invalid_unicode",
                None,
                f"{field!r} holds a lone surrogate \\u{ord(text[e.start]):04x} at character "
                f"{e.start} (a broken UTF-16 escape)",
            )
    if not text.strip():
        return "empty_document", None, f"empty {field!r}"
    return "ok", text.strip(), ""


def _jsonl_documents(
    path: Path, compression: str | None, cfg: InputConfig, drops: DropCounter
) -> Iterator[tuple[str, str]]:
    field = cfg.text_field
    n_objects = n_missing = 0
    first_missing = ""
    for lineno, line in _lines(path, compression, cfg, drops):
        if line is None:
            break
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        kind, text, detail = _json_text(line, field)
        n_objects += kind not in ("jsonl_invalid_json", "jsonl_not_object")
        if kind == "ok":
            yield text, where
        elif kind == "object_without_field":
            n_missing += 1
            first_missing = first_missing or detail
            drops.drop("jsonl_missing_field", where, detail)
        else:
            drops.drop(kind, where, detail)
    if n_objects and n_missing == n_objects:
        raise InputError(
            f"{path}: none of its {n_objects} JSON objects has the field {field!r} (first: "
            f"{first_missing}); pass --text_field KEY."
        )


def iter_located_documents(
    files: list[Path], cfg: InputConfig, drops: DropCounter
) -> Iterator[tuple[str, str]]:
    """(text, where) of every document of every input file, in order: the text stripped and
    never empty; where is "FILE:LINE" (text: the document's first line) or "FILE row N"."""
    for path in files:
        if _is_hf_dataset(path):
            yield from hf_documents(path, cfg.text_field, drops)
            continue
        if path.is_dir():
            raise InputError(f"{path} is a folder, not a saved HF dataset; pass its files.")
        kind, compression = _kind(path)
        if kind in TABLE_KINDS.values():
            yield from table_documents(path, kind, compression, cfg.text_field, drops)
        elif kind == "jsonl":
            yield from _jsonl_documents(path, compression, cfg, drops)
        else:
            yield from _text_documents(path, compression, cfg, drops)


def iter_documents(files: list[Path], cfg: InputConfig, drops: DropCounter) -> Iterator[str]:
    """Every document of every input file, in order (stripped, never empty)."""
    return (text for text, _ in iter_located_documents(files, cfg, drops))
