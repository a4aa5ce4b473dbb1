"""What a build says about an input file as a whole, and about a build without validation data.

Bad records are skipped and counted one by one (:mod:`data_prep.inputs`); some inputs are wrong
as a whole, and counting their lines would hide it (issue 55):

- a text or jsonl file in another encoding than UTF-8 (Latin-1, cp1252, GBK ...): only its lines
  with a non-ASCII character are invalid, so it loses a share of its lines, not all of it. Above
  ``--max_invalid_utf8_share`` of a file's lines the build fails (exit status 2; the failed build
  removes what it wrote, :mod:`data_prep.cleanup`), below it a warning names the file; both give
  the ``iconv`` command that converts it, as the UTF-16 check of :mod:`data_prep.inputs` does.
- a text file of many lines without a blank line between them reads as one document (blank
  lines separate documents unless ``--one_doc_per_line``): the shards are usable, so a warning
  names the file and the flag.
- a build whose validation split has no document: the trainer has nothing to validate on; a
  warning at the end of the build names the flags that give it some.
"""

from __future__ import annotations

from typing import Any

from bertforge.errors import UserError

MIN_LINES_FOR_ONE_DOC_HINT = 50  # a file of fewer lines may well be one document
# this many lines per document on average: (almost) no blank lines. A real document of
# blank-line text rarely has as many (the pydoc corpus of the tests: 110 on average, 1,174 at most)
LINES_PER_DOC_HINT = 1000


class InputError(UserError, ValueError):
    """An input that cannot be used at all; the message names the file and what to do."""


class EncodingError(UserError, ValueError):
    """A text file with more lines that are not UTF-8 than --max_invalid_utf8_share allows."""


def iconv_command(path: str) -> str:
    """The command that converts ``path`` from Latin-1 (the usual case) to UTF-8 beside it."""
    return f"iconv -f latin1 -t utf-8 {path} > {path}.utf8"


def _convert_hint(path: str) -> str:
    return (
        f"`{iconv_command(path)}` converts it to UTF-8 (after -f put the file's real encoding: "
        f"latin1 or cp1252 for Western European text, gb18030 for Chinese, ...); then pass "
        f"{path}.utf8 to --input"
    )


def check_encoding(path: str, lines: int, invalid: int, limit: float | None) -> str | None:
    """The warning for a file of which ``invalid`` of its ``lines`` non-blank lines were skipped
    as not UTF-8 (None when none were); raises EncodingError when their share is above
    ``limit`` (None: no limit)."""
    if not invalid:
        return None
    share = invalid / max(lines, 1)
    counted = f"{path}: {invalid:,} of its {lines:,} lines ({share:.1%}) are not UTF-8"
    if limit is not None and share > limit:
        raise EncodingError(
            f"{counted}, more than --max_invalid_utf8_share {limit:g} allows: the file is "
            f"probably in another encoding. {_convert_hint(path)}. Or raise "
            "--max_invalid_utf8_share to build without those lines"
        )
    return f"{counted} and were skipped. To keep them: {_convert_hint(path)}"


def one_document_hint(path: str, lines: int, documents: int) -> str | None:
    """The warning for a blank-line text file whose ``lines`` non-blank lines made only
    ``documents`` documents (None when that looks like documents separated by blank lines)."""
    if lines < MIN_LINES_FOR_ONE_DOC_HINT or documents > max(1, lines // LINES_PER_DOC_HINT):
        return None  # documents separated by blank lines (or a short file: one document)
    made = "one document" if documents == 1 else f"only {documents} documents"
    return (
        f"{path}: its {lines:,} lines made {made}: documents are separated by blank lines, and "
        "it has (almost) none. If each line is a document (one paragraph a line), rebuild with "
        "--one_doc_per_line (and --overwrite)"
    )


def no_validation_hint(manifest: dict[str, Any]) -> str | None:
    """The warning for a build whose validation split is empty although one was asked for."""
    args = manifest.get("args") or {}
    fraction = args.get("validation_fraction", 0)
    splits = manifest["splits"]
    if not fraction or splits["validation"]["documents"]:
        return None
    total = splits["train"]["documents"]
    of = f"{total:,} document{'s' * (total != 1)}"
    fix = "raise --validation_fraction or add documents, and rebuild (--overwrite)"
    if not (args.get("input") or {}).get("one_doc_per_line"):
        fix = f"if a text file has one document per line, pass --one_doc_per_line; otherwise {fix}"
    return (
        f"validation: 0 documents (--validation_fraction {fraction:g} of {of}, chosen by a hash "
        f"of each text): the trainer will have no validation data. {fix[0].upper()}{fix[1:]}"
    )
