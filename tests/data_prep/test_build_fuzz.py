"""Fuzzed data preparation (hypothesis): generated inputs of every bad-input class the readers
know, fed to `python -m data_prep build` in-process.

Each example is built twice: as bytes on disk and as an independent expectation (which
documents are good, which records are bad and why, with file and line, whether the build must
fail). The properties, per example:
- the build never ends in a traceback: exit status 0, or 2 with one `error:` line naming the file
  (or the first bad record) and what to do, and then no manifest;
- every bad record is warned about (the first 5 of each reason, with file and line) and counted:
  manifest["bad_records"] by reason equals the expectation, `inspect` prints the count;
- every good record is in the shards: the shards' token stream (specials removed), per split,
  equals a separate tokenisation of the expected good documents, in order.

Examples are derandomized (CI is reproducible) and few (the CI cost stays near a minute).
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import io
import json
import re
import tempfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from helpers.shards import content_stream
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from bertforge.data_prep import ShardReader
from bertforge.data_prep.__main__ import main
from bertforge.data_prep.worker import is_validation

FUZZ = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,  # nothing written to .hypothesis/
    phases=[Phase.explicit, Phase.generate],  # no shrinking: minutes on megabyte inputs
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_LINE = 1 << 20  # --max_line_bytes of the text property: its long lines are megabytes
REPORT_FIRST = 5  # DropCounter's warnings per reason
DAMAGE = {"truncated_file": "damaged_stream", "corrupt_file": "damaged_stream"}


# ---------------------------------------------------------------- the expectation of one input


@dataclass
class Expected:
    """What a build of the generated inputs must do."""

    docs: list[tuple[str, str]] = field(default_factory=list)  # (text, where), in input order
    bad: list[tuple[str, str]] = field(default_factory=list)  # (reason, where), input-level
    failure: str | None = None  # a regex the error line must match when the build must fail

    def fail_once(self, pattern: str) -> None:
        self.failure = self.failure or pattern  # the first file that fails stops the build


class Line:
    """One generated line: its bytes (without the line end), the kind the reader must give it
    ("good", "blank" or a bad-record reason) and its decoded text (good and blank lines)."""

    def __init__(self, raw: bytes, kind: str, text: str = ""):
        self.raw, self.kind, self.text = raw, kind, text

    def __repr__(self) -> str:  # megabyte lines stay readable in a falsifying example
        raw = self.raw if len(self.raw) < 80 else self.raw[:60] + b"...%d bytes" % len(self.raw)
        return f"Line({raw!r}, {self.kind!r})"


def eol_fixup(lines: list[Line], ends: list[bytes]) -> list[bytes]:
    """A lone CR followed by an empty LF line would read as one CRLF: make that CR too."""
    for i in range(1, len(lines)):
        if ends[i - 1] == b"\r" and not lines[i].raw and ends[i].startswith(b"\n"):
            ends[i] = b"\r"
    return ends


def serialize(lines: list[Line], ends: list[bytes], bom: bool) -> tuple[bytes, list[int]]:
    """The file's bytes and the end offset of each line (its line end included)."""
    out = bytearray(b"\xef\xbb\xbf" if bom else b"")
    stops = []
    for line, end in zip(lines, ends):
        out += line.raw + end
        stops.append(len(out))
    return bytes(out), stops


def complete_lines(lines: list[Line], ends: list[bytes], stops: list[int], avail: int) -> int:
    """How many lines a reader sees before a stream cut after `avail` bytes: a line whose end
    is complete (a lone CR only once the next byte shows it is not CRLF)."""
    n = 0
    for end, stop in zip(ends, stops):
        if not end or stop > avail or (end == b"\r" and stop == avail):
            break
        n += 1
    return n


def expect_text(
    path: str, lines: list[Line], n: int, cut: bool, one_per_line: bool, exp: Expected
) -> None:
    """The documents and bad records of the first `n` lines of a text file (cut: the stream
    breaks after them, and in blank-line mode the document in progress is dropped)."""
    block: list[str] = []
    first = 0
    for k, line in enumerate(lines[:n], start=1):
        if line.kind not in ("good", "blank"):
            exp.bad.append((line.kind, f"{path}:{k}"))
        elif one_per_line:
            if line.kind == "good":
                exp.docs.append((line.text.strip(), f"{path}:{k}"))
        elif line.kind == "good":
            first = first or k
            block.append(line.text)
        elif block:
            exp.docs.append(("\n".join(block).strip(), f"{path}:{first}"))
            block, first = [], 0
    if cut:
        exp.bad.append(("damaged_stream", f"{path}:{n + 1}"))
    elif block:
        exp.docs.append(("\n".join(block).strip(), f"{path}:{first}"))


def expect_jsonl(path: str, lines: list[Line], n: int, cut: bool, exp: Expected) -> None:
    """As expect_text for a jsonl file: good lines carry their record's expected text."""
    objects = missing = 0
    for k, line in enumerate(lines[:n], start=1):
        if line.kind == "blank":
            continue
        objects += line.kind in ("good", "jsonl_missing_field", "jsonl_field_not_text")
        objects += line.kind in ("invalid_unicode", "empty_document")
        missing += line.kind == "jsonl_missing_field"
        if line.kind == "good":
            exp.docs.append((line.text, f"{path}:{k}"))
        else:
            exp.bad.append((line.kind, f"{path}:{k}"))
    if cut:
        exp.bad.append(("damaged_stream", f"{path}:{n + 1}"))
    if objects and missing == objects:
        exp.fail_once(re.escape(path) + r".*has the field 'text'.*--text_field")


# ----------------------------------------------------------------------------- generators

WORDS = ["the", "data", "model", "Zürich", "naïve", "東京", "数据", "😀", "x1", "e=mc²", "ﬁne"]
ZERO_TOKEN = ["\u200b", "\x01\x02", "\u200b\u200d\x7f", "\u00ad"]  # the normaliser removes them
INVALID_UTF8 = [b"\xff", b"\xc3(", b"\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"]
LATIN1 = ["café", "señor", "Müller", "garçon", "über"]

# Printable text of any script (no surrogates, NUL, line ends or BOM: those are their own
# classes), including characters Python strips as whitespace and that the tokenizer drops.
any_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x00\ufeff"),
    min_size=1,
    max_size=20,
)
ascii_words = st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "omega"]), min_size=4)


@st.composite
def good_text(draw) -> str:
    """A line of text that Python does not strip to nothing (it may hold no token)."""
    kind = draw(st.sampled_from(["words", "words", "any", "zero"]))
    if kind == "zero":
        return draw(st.sampled_from(ZERO_TOKEN))
    if kind == "any":
        return draw(any_text.filter(str.strip))
    return " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=8)))


@st.composite
def bad_text_line(draw, allow_long: bool) -> Line:
    """A line a text reader must skip: NUL bytes, invalid UTF-8 or latin-1 (each in a line of
    mostly ASCII words, as in real files), or longer than MAX_LINE bytes."""
    words = " ".join(draw(ascii_words)).encode()
    kinds = ["nul", "invalid", "latin1"] + (["long_ascii", "long_cjk"] if allow_long else [])
    kind = draw(st.sampled_from(kinds))
    at = draw(st.integers(0, len(words)))
    if kind == "nul":
        return Line(words[:at] + b"\x00" + words[at:], "binary_line")
    if kind == "invalid":
        return Line(
            words[:at] + draw(st.sampled_from(INVALID_UTF8)) + words[at:], "invalid_utf8_line"
        )
    if kind == "latin1":
        return Line(
            words + b" " + draw(st.sampled_from(LATIN1)).encode("latin-1"), "invalid_utf8_line"
        )
    over = draw(st.integers(1, 3))
    if kind == "long_ascii":  # MAX_LINE + over bytes
        return Line((b"word " * (MAX_LINE // 5 + 1))[: MAX_LINE + over], "line_too_long")
    # Fewer characters than the limit, more bytes: 3-byte characters
    return Line("数".encode() * (MAX_LINE // 3) + b"x" * (over + 1), "line_too_long")


@st.composite
def long_good_line(draw) -> Line:
    """A line of exactly MAX_LINE bytes: the longest one kept."""
    if draw(st.booleans()):
        raw = (b"word " * (MAX_LINE // 5 + 1))[:MAX_LINE]
    else:
        raw = "数".encode() * (MAX_LINE // 3) + b"x" * (MAX_LINE % 3)
    return Line(raw, "good", raw.decode())


@st.composite
def text_lines(draw, allow_long: bool) -> list[Line]:
    """Blocks of good and bad lines between blank (or whitespace-only) lines; with allow_long,
    one block may be a single line of exactly MAX_LINE bytes (tokenizing it takes a second)."""
    lines: list[Line] = []
    blank = st.sampled_from(["", " ", "\t", "\u3000", "\x0c", "  \x85"])
    n_blocks = draw(st.integers(0, 6))
    long_at = draw(st.integers(0, n_blocks)) if allow_long and draw(st.booleans()) else -1
    for k in range(n_blocks):
        if k == long_at:
            lines.append(draw(long_good_line()))
        for _ in range(draw(st.integers(1, 3)) if k != long_at else 0):
            if draw(st.integers(0, 9)) < 6:
                t = draw(good_text())
                lines.append(Line(t.encode(), "good", t))
            else:
                lines.append(draw(bad_text_line(allow_long)))
        for _ in range(draw(st.integers(1, 2))):
            b = draw(blank)
            lines.append(Line(b.encode(), "blank", b))
    return lines


@st.composite
def line_ends(draw, n: int) -> list[bytes]:
    """LF, CRLF, lone CR or a mix; the last line may lack its line end."""
    style = draw(st.sampled_from([b"\n", b"\r\n", b"\r", None]))
    event(f"line ends {style or 'mixed'!r}")
    ends = [style or draw(st.sampled_from([b"\n", b"\r\n", b"\r"])) for _ in range(n)]
    if n and draw(st.booleans()):
        ends[-1] = b""
    return ends


def good_record(draw) -> Line:
    text = draw(good_text()) if draw(st.booleans()) else draw(any_text.filter(str.strip))
    text = draw(st.sampled_from(["", " ", "\n"])) + text + draw(st.sampled_from(["", "\r\n", "\t"]))
    rec = {"id": draw(st.integers(0, 99)), "text": text}
    if draw(st.booleans()):
        rec["meta"] = {"text": "nested, not the field", "tags": [1, None]}
    raw = json.dumps(rec, ensure_ascii=draw(st.booleans())).encode()
    return Line(raw, "good", text.strip())


BAD_RECORDS = {
    "jsonl_field_not_text": ['{"text": 5}', '{"text": 1.5}', '{"text": ["a", "b"]}',
                             '{"text": null}', '{"text": {"en": "nested"}}', '{"text": true}'],
    "jsonl_missing_field": ['{"title": "no text"}', '{"meta": {"text": "nested"}}', "{}"],
    "jsonl_not_object": ["[1, 2]", '"just a string"', "42", "null", "true"],
    "jsonl_invalid_json": ['{"text": "unterminated', "{'text': 'single quotes'}",
                           '{"text": "a"} trailing', "not json at all", '{"text": "a",}',
                           '{"text": "raw\ttab"}', '{"text": ' + "7" * 5000 + "}",
                           "[" * 100000 + "]" * 100000],
    "invalid_unicode": ['{"text": "lone \\ud800 high"}', '{"text": "lone \\udfff low"}'],
    "empty_document": ['{"text": ""}', '{"text": "  \\n\\t "}'],
}  # fmt: skip


@st.composite
def jsonl_lines(draw) -> list[Line]:
    lines: list[Line] = []
    for _ in range(draw(st.integers(0, 14))):
        pick = draw(st.integers(0, 9))
        if pick < 6:
            lines.append(good_record(draw))
        elif pick < 8:
            reason = draw(st.sampled_from(sorted(BAD_RECORDS)))
            lines.append(Line(draw(st.sampled_from(BAD_RECORDS[reason])).encode(), reason))
        elif pick < 9:
            raw = draw(st.sampled_from([b'{"text": "caf\xe9"}', b'{"text": "a\x00b"}']))
            lines.append(Line(raw, "binary_line" if b"\x00" in raw else "invalid_utf8_line"))
        else:
            lines.append(Line(b"  ", "blank"))
    return lines


# ------------------------------------------------------------------------------ the build


def run_build(inputs: Path, out: Path, *extra: str) -> tuple[int, str]:
    """`python -m data_prep build` in-process; (exit status, its log: warnings on stdout, errors
    on stderr, in order). A traceback fails."""
    err = io.StringIO()
    # Every generated line that is not UTF-8 is skipped and counted: the share of a file that
    # fails the build (--max_invalid_utf8_share, tests/data_prep/test_input_checks.py) is off.
    share = ("--max_invalid_utf8_share", "1")
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        rc = main(
            ["build", "--input", str(inputs), "--output", str(out), "--workers", "1"]
            + ["--progress", "off", *share, *extra]
        )
    return rc, err.getvalue()


_LONG_IDS: dict[str, list[int]] = {}  # the few megabyte documents, tokenized once per session


def ids_of(tokenizer, text: str) -> list[int]:
    """The oracle: the tokenizer's ids of one expected document, on its own."""
    if len(text) < 100_000:
        return tokenizer.encode(text, add_special_tokens=False).ids
    if text not in _LONG_IDS:
        _LONG_IDS[text] = tokenizer.encode(text, add_special_tokens=False).ids
    return _LONG_IDS[text]


def tokens_of(tokenizer, texts: list[str], specials: set[int]) -> np.ndarray:
    ids = np.array([i for t in texts for i in ids_of(tokenizer, t)], dtype=np.int64)
    return ids[~np.isin(ids, list(specials))]


def check_build(
    exp: Expected, rc: int, err: str, out: Path, tokenizer, fraction: float, bucket=None
) -> None:
    """The three properties of one build against its expectation."""
    assert "Traceback" not in err
    for reason in sorted({r for r, _ in exp.bad}):
        event(f"bad record: {reason}")
    n_tokens = {t: len(ids_of(tokenizer, t)) for t, _ in exp.docs}
    good = [(t, w) for t, w in exp.docs if n_tokens[t]]
    no_tokens = [("no_tokens", w) for t, w in exp.docs if not n_tokens[t]]
    if no_tokens:
        event("bad record: no_tokens")
    train = [t for t, _ in good if not is_validation(t, fraction)]
    if exp.failure is None and not train:
        exp.failure = "went to the validation split" if good else "no usable document"
    event(f"outcome: {'fails' if exp.failure else 'builds'}")
    if exp.failure:
        assert rc == 2, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("[data_prep] ERROR: ") and re.search(exp.failure, last), last
        assert not (out / "manifest.json").exists()
        return
    assert rc == 0, err
    m = json.loads((out / "manifest.json").read_text())
    bad = exp.bad + no_tokens
    by_reason = Counter((bucket or {}).get(r, r) for r, _ in bad)
    got = Counter()
    for reason, n in m["bad_records"]["by_reason"].items():
        got[(bucket or {}).get(reason, reason)] += n
    assert got == by_reason and m["bad_records"]["count"] == len(bad)
    # Warnings: the first REPORT_FIRST of each reason, each naming one of its records.
    where = {(bucket or {}).get(r, r): set() for r, _ in bad}
    for r, w in bad:
        where[(bucket or {}).get(r, r)].add(w)
    warned = re.findall(r"^\[data_prep\] WARNING: skipped (.+?): .* \[(\w+)\]", err, re.M)
    for reason, n in Counter((bucket or {}).get(r, r) for _, r in warned).items():
        assert n == min(by_reason[reason], REPORT_FIRST), (reason, err)
    for w, r in warned:
        assert w in where.get((bucket or {}).get(r, r), ()), (w, r)
    for e in m["bad_records"]["examples"]:
        assert e["where"] in where.get((bucket or {}).get(e["reason"], e["reason"]), ()), e
    # Every good record, in order, in its split.
    specials = {m["special_tokens"]["cls"], m["special_tokens"]["sep"]}
    val = [t for t, _ in good if is_validation(t, fraction)]
    for split, texts in (("train", train), ("validation", val)):
        assert m["splits"][split]["documents"] == len(texts), split  # the boundaries too
        got_ids = content_stream(ShardReader(out, split))
        np.testing.assert_array_equal(got_ids, tokens_of(tokenizer, texts, specials), split)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["verify", str(out)]) == 0


@pytest.fixture(scope="module")
def tok(english_shards) -> str:
    return str(english_shards / "tokenizer")


@pytest.fixture(scope="module")
def tokenizer(tok):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(f"{tok}/tokenizer.json")


# ------------------------------------------------------------------------------ properties


@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_fuzzed_text_files(tok, tokenizer, data):
    """Text files (blank-line blocks or one document a line): invalid UTF-8, latin-1, NUL bytes,
    UTF-8 BOM, LF/CRLF/lone CR, megabyte lines at and over --max_line_bytes, whitespace-only
    and no-token documents, empty files; UTF-16 with and without BOM."""
    one_per_line = data.draw(st.booleans(), "one_doc_per_line")
    with tempfile.TemporaryDirectory() as tmp:
        src, exp = Path(tmp) / "in", Expected()
        src.mkdir()
        allow_long = data.draw(st.integers(0, 3), "long lines") == 0
        for k in range(data.draw(st.integers(1, 3), "files")):
            path = src / f"{k:02d}.txt"
            kind = data.draw(st.sampled_from(["text"] * 4 + ["empty", "utf16", "utf16_nobom"]))
            event(f"file: {kind}")
            if kind != "text":
                sample = " ".join(["Unicode text in another encoding"] * 3) + "\n"
                raw = {"empty": b"", "utf16": sample.encode("utf-16"),
                       "utf16_nobom": sample.encode("utf-16-le")}[kind]  # fmt: skip
                path.write_bytes(raw)
                exp.bad.append(("empty_file" if kind == "empty" else "utf16_file", str(path)))
                continue
            lines = data.draw(text_lines(allow_long), f"lines {k}")
            ends = eol_fixup(lines, data.draw(line_ends(len(lines)), f"ends {k}"))
            raw, _ = serialize(lines, ends, data.draw(st.booleans(), "bom"))
            event(f"UTF-8 BOM: {raw.startswith(codecs.BOM_UTF8)}")
            event(f"megabyte line: {any(len(x.raw) >= MAX_LINE for x in lines)}")
            path.write_bytes(raw)
            if not raw:
                exp.bad.append(("empty_file", str(path)))
            expect_text(str(path), lines, len(lines), False, one_per_line, exp)
        extra = ["--max_line_bytes", str(MAX_LINE), "--validation_fraction", "0"]
        extra += ["--shard_docs", str(data.draw(st.sampled_from([2, 10000])))]
        out = Path(tmp) / "out"
        rc, err = run_build(
            src, out, *extra, *(["--one_doc_per_line"] if one_per_line else []), "--tokenizer", tok
        )
        check_build(exp, rc, err, out, tokenizer, 0.0)
        if rc == 0:
            shown = io.StringIO()
            with contextlib.redirect_stdout(shown):
                assert main(["inspect", str(out), "--samples", "1"]) == 0
            n = json.loads((out / "manifest.json").read_text())["bad_records"]["count"]
            assert (f"bad records: {n:,} skipped" if n else "bad records: none") in shown.getvalue()


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_fuzzed_jsonl_files(tok, tokenizer, data):
    """jsonl: good records (ASCII-escaped or raw UTF-8, surrogate pairs, nested objects beside
    the field), wrong types, missing field, records that are not objects, invalid JSON (a
    5000-digit number, 100000-deep nesting), lone surrogate escapes, blank texts, invalid UTF-8
    and NUL lines, BOM, LF/CRLF/lone CR; a file whose objects all lack the field fails."""
    fraction = data.draw(st.sampled_from([0.0, 0.3]), "validation_fraction")
    with tempfile.TemporaryDirectory() as tmp:
        src, exp = Path(tmp) / "in", Expected()
        src.mkdir()
        for k in range(data.draw(st.integers(1, 3), "files")):
            path = src / f"{k:02d}.jsonl"
            lines = data.draw(jsonl_lines(), f"lines {k}")
            ends = eol_fixup(lines, data.draw(line_ends(len(lines)), f"ends {k}"))
            raw, _ = serialize(lines, ends, data.draw(st.booleans(), "bom"))
            path.write_bytes(raw)
            if not raw:
                exp.bad.append(("empty_file", str(path)))
            expect_jsonl(str(path), lines, len(lines), False, exp)
        out = Path(tmp) / "out"
        rc, err = run_build(src, out, "--validation_fraction", str(fraction), "--tokenizer", tok)
        check_build(exp, rc, err, out, tokenizer, fraction)


def decodable(raw: bytes, compression: str) -> int:
    """Bytes of text a stream reader can get out of a (possibly cut) compressed file."""
    if compression == "gz":
        return len(zlib.decompressobj(wbits=31).decompress(raw))
    import zstandard

    n, rest = 0, raw
    while rest:  # frame by frame, as `cat a.zst b.zst` makes
        d = zstandard.ZstdDecompressor().decompressobj()
        n += len(d.decompress(rest))
        if not d.eof:
            break
        rest = d.unused_data
    return n


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_fuzzed_truncated_compressed_files(tok, tokenizer, data):
    """A good .gz/.zst text or jsonl file (zstd: several frames) cut at a random point: the
    records before the cut are kept, the cut is one bad record at its line, the rest is lost."""
    jsonl = data.draw(st.booleans(), "jsonl")
    compression = data.draw(st.sampled_from(["gz", "zst"]), "compression")
    with tempfile.TemporaryDirectory() as tmp:
        src, exp = Path(tmp) / "in", Expected()
        src.mkdir()
        path = src / f"00_cut.{'jsonl' if jsonl else 'txt'}.{compression}"
        lines = data.draw(jsonl_lines() if jsonl else text_lines(False), "lines")
        ends = eol_fixup(lines, data.draw(line_ends(len(lines)), "ends"))
        raw, stops = serialize(lines, ends, data.draw(st.booleans(), "bom"))
        if compression == "gz":
            packed = gzip.compress(raw, mtime=0)
        else:
            import zstandard

            cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=4), "frames"))
            bounds = [0, *cuts, len(raw)]
            packed = b"".join(
                zstandard.ZstdCompressor().compress(raw[a:b]) for a, b in zip(bounds, bounds[1:])
            )
        cut = data.draw(st.integers(0, len(packed)), "cut")
        path.write_bytes(packed[:cut])
        intact = cut == len(packed)
        event(f"{compression}: {'intact' if intact else 'cut' if cut else 'cut to 0 bytes'}")
        if not intact and not cut:
            exp.bad.append(("empty_file", str(path)))
        else:
            n = (
                len(lines)
                if intact
                else complete_lines(lines, ends, stops, decodable(packed[:cut], compression))
            )
            if jsonl:
                expect_jsonl(str(path), lines, n, not intact, exp)
            else:
                expect_text(str(path), lines, n, not intact, False, exp)
        after = src / "01_after.txt"  # the build goes on after a damaged file
        after.write_text("Text after the damaged file.\n\nIts second document.\n")
        exp.docs += [
            ("Text after the damaged file.", f"{after}:1"),
            ("Its second document.", f"{after}:3"),
        ]
        out = Path(tmp) / "out"
        rc, err = run_build(src, out, "--validation_fraction", "0", "--tokenizer", tok)
        check_build(exp, rc, err, out, tokenizer, 0.0, bucket=DAMAGE)


def good_file_bytes(ext: str) -> bytes:
    """A valid file of 60 jsonl records (parquet: 300 rows in 6 row groups) for `ext`."""
    body = "".join(json.dumps({"text": f"record {i} " * 5}) + "\n" for i in range(60)).encode()
    if ext == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = io.BytesIO()
        rows = pa.table({"text": [f"row {i} text" for i in range(300)]})
        pq.write_table(rows, sink, row_group_size=50)
        return sink.getvalue()
    if ext.endswith("gz"):
        return gzip.compress(body, mtime=0)
    if ext.endswith("zst"):
        import zstandard

        return zstandard.ZstdCompressor().compress(body)
    return body


@settings(FUZZ, max_examples=50)
@given(data=st.data())
def test_fuzzed_random_and_corrupt_files(tok, tokenizer, data):
    """Random bytes, and good compressed or parquet files with bytes flipped, under every input
    extension, after a good text file: never a traceback; a success keeps the good file's
    documents first in the shards and counts sum up; a failure is one error line."""
    good = ["First good document about data.", "Second one, with 東京 and naïve text."]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in"
        src.mkdir()
        (src / "00_good.txt").write_text("\n\n".join(good) + "\n", encoding="utf-8")
        for k in range(data.draw(st.integers(1, 2), "files")):
            ext = data.draw(st.sampled_from(["txt", "jsonl", "txt.gz", "jsonl.zst", "parquet"]))
            how = data.draw(st.sampled_from(["random", "flipped"]), "how")
            event(f"{how} .{ext}")
            if how == "random":
                raw = data.draw(st.binary(max_size=3000), "bytes")
            else:
                raw = bytearray(good_file_bytes(ext))
                for at in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=3)):
                    raw[at] ^= 0xFF
            (src / f"{k + 1:02d}_fuzz.{ext}").write_bytes(raw)
        out = Path(tmp) / "out"
        rc, err = run_build(src, out, "--validation_fraction", "0", "--tokenizer", tok)
        assert "Traceback" not in err
        if rc != 0:
            assert rc == 2
            last = err.strip().splitlines()[-1]
            assert last.startswith("[data_prep] ERROR: ") and str(src) in last, last
            assert not (out / "manifest.json").exists()
            return
        m = json.loads((out / "manifest.json").read_text())
        bad = m["bad_records"]
        assert bad["count"] == sum(bad["by_reason"].values()) == sum(m["dropped"].values())
        warned = re.findall(r"^\[data_prep\] WARNING: skipped .* \[(\w+)\]", err, re.M)
        for reason, n in Counter(warned).items():
            assert n == min(bad["by_reason"][reason], REPORT_FIRST)
        specials = {m["special_tokens"]["cls"], m["special_tokens"]["sep"]}
        stream = content_stream(ShardReader(out, "train"))
        want = tokens_of(tokenizer, good, specials)
        np.testing.assert_array_equal(stream[: len(want)], want)
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["verify", str(out)]) == 0
