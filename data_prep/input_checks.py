"""What a build says about an input file as a whole (issue 55).

Bad records are skipped and counted one by one (:mod:`data_prep.inputs`); a text or jsonl file in
another encoding than UTF-8 (Latin-1, cp1252, GBK ...) is wrong as a whole, and counting its lines
would hide it: only its lines with a non-ASCII character are invalid, so it loses a share of its
lines, not all of it. Above ``--max_invalid_utf8_share`` of a file's lines the build fails (exit
status 2; the failed build removes what it wrote, :mod:`data_prep.cleanup`), below it a warning
names the file; both give the ``iconv`` command that converts it, as the UTF-16 check of
:mod:`data_prep.inputs` does.
"""

from __future__ import annotations

from bertforge.errors import UserError


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
