"""One log voice for ``data_prep``, ``pretrain``, ``benchmarks`` and ``experiments``.

Modules log through the standard :mod:`logging` module (``log = get_logger(__name__)``); every
line reads ``[package] message`` and, for warnings and errors, ``[package] WARNING: message``,
with the rank after the package when a job has several (``[pretrain rank 3] ERROR: ...``).
Rank 0 speaks for the job: other ranks print errors only, unless a record is marked
``extra={"all_ranks": True}``. Info and warnings go to stdout (beside the progress lines they
explain), errors to stderr. Progress bars and reports a user reads stay plain stdout output.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable

#: The top-level packages whose loggers get the project's handler.
PACKAGES = ("bertforge", "benchmarks", "experiments", "pretrain", "data_prep")


def process_rank() -> int:
    """This process's global rank as the launcher set it (0 alone or before any launcher)."""
    return int(os.environ.get("RANK", "0") or 0)


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def format_line(name: str, levelno: int, message: str) -> str:
    """One line in the project's format, for a logger ``name`` (its package is shown) and a
    ``logging`` level; also for lines that must go through a progress bar instead of a handler."""
    who = name.removeprefix("bertforge.").split(".", 1)[0]
    if _world_size() > 1:
        who += f" rank {process_rank()}"
    level = "" if levelno < logging.WARNING else f"{logging.getLevelName(levelno)}: "
    return f"[{who}] {level}{message}"


class RankFormatter(logging.Formatter):
    """``[package] LEVEL: message``; the rank appears when the job has more than one."""

    def format(self, record: logging.LogRecord) -> str:
        text = format_line(record.name, record.levelno, record.getMessage())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _StdStreams(logging.Handler):
    """Writes to the *current* sys.stdout / sys.stderr (so redirection and capture see it)."""

    def emit(self, record: logging.LogRecord) -> None:
        if process_rank() != 0 and record.levelno < logging.ERROR:
            if not getattr(record, "all_ranks", False):
                return
        try:
            stream = sys.stderr if record.levelno >= logging.ERROR else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # a closed pipe must not take the run down
            self.handleError(record)


_HANDLER = _StdStreams()
_HANDLER.setFormatter(RankFormatter())


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (pass ``__name__``), its package wired to the one handler."""
    if name == "__main__":  # `python -m pkg.mod` names the module __main__; its spec knows better
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        name = spec.name if spec is not None else "pretrain"  # a script: pretrain/main.py
    top = name.split(".", 1)[0]
    root = logging.getLogger(top)
    if _HANDLER not in root.handlers:
        root.addHandler(_HANDLER)
        root.setLevel(logging.INFO)
        root.propagate = False  # one line per record, whatever the root logger does
    return logging.getLogger(name)


def report(lines: str | Iterable[str], stream=None) -> None:
    """Write a report a user reads (a table, a summary, JSON, a path another command takes) as
    plain, unprefixed lines on stdout (or ``stream``): the one writer of such output, so that
    messages go through a logger and only reports bypass it. Every rank writes what it is given."""
    text = lines if isinstance(lines, str) else "\n".join(lines)
    out = stream or sys.stdout
    out.write(text + "\n")
    out.flush()
