"""One log voice for ``data_prep``, ``pretrain``, ``benchmarks`` and ``experiments``.

Modules log through the standard :mod:`logging` module (``log = get_logger(__name__)``); every
line reads ``[package] message`` and, for warnings and errors, ``[package] WARNING: message``,
with the rank after the package when a job has several (``[pretrain rank 3] ERROR: ...``).
Rank 0 speaks for the job: other ranks print errors only, unless a record is marked
``extra={"all_ranks": True}``. Info and warnings go to stdout (beside the progress lines they
explain), errors to stderr. Progress bars and reports a user reads stay plain stdout output.
Other libraries' routine chatter stays off a command's output, their warnings on:
:func:`quiet_libraries` (DeepSpeed's note on a machine without a GPU) and
:func:`quiet_transformers` (transformers' progress bars), called by the commands;
:func:`transformers_errors_only` quiets one load whose report is expected.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, redirect_stdout

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


#: DeepSpeed's logger, and the note it gives at its import on a machine where torch sees no GPU
DEEPSPEED_LOGGER = "DeepSpeed"
DEEPSPEED_CPU_NOTE = "Setting accelerator to CPU."
#: torch's warning (a regular expression) when DeepSpeed's ZeRO gathers with a deprecated call
TORCH_GATHER_DEPRECATION = r"`torch\.distributed\.all_gather_into_tensor` is deprecated"


class _DropDeepSpeedCpuNote(logging.Filter):
    """Drops DeepSpeed's "Setting accelerator to CPU. If you have GPU ..." and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(DEEPSPEED_CPU_NOTE)


def quiet_libraries() -> None:
    """A command's first call: other libraries' routine chatter off its output, their warnings
    kept. DeepSpeed's note on a machine without a GPU ("Setting accelerator to CPU. If you have
    GPU or other accelerator, we were unable to detect it."), which every command that imports
    DeepSpeed printed, is dropped by a filter on DeepSpeed's logger, set before DeepSpeed makes
    it (``logging`` keeps a logger's filters when DeepSpeed configures it); every other record of
    DeepSpeed's passes. So does every warning but torch's deprecation of the gather DeepSpeed's
    ZeRO calls (each rank printed it at the first step). (The doctor says which devices a launch
    gets: "no GPU (CPU, N cores)".) Transformers' progress bars: :func:`quiet_transformers`,
    where a command uses transformers."""
    ds_logger = logging.getLogger(DEEPSPEED_LOGGER)
    if not any(isinstance(f, _DropDeepSpeedCpuNote) for f in ds_logger.filters):
        ds_logger.addFilter(_DropDeepSpeedCpuNote())
    # DeepSpeed's ZeRO calls a collective that torch has deprecated: every rank printed torch's
    # FutureWarning about DeepSpeed's code, which a user can do nothing about
    warnings.filterwarnings("ignore", message=TORCH_GATHER_DEPRECATION, category=FutureWarning)


def quiet_transformers() -> None:
    """Turn transformers' progress bars off (one per model it loads or writes: "Loading
    weights", "Writing model shards", a line of carriage returns in a log), its warnings kept;
    for a command that loads or writes models with transformers (importing it takes seconds, so
    only those call this)."""
    # Lazy: transformers (seconds to import) only in the commands that use it anyway.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


@contextmanager
def transformers_errors_only() -> Iterator[None]:
    """transformers' warnings off while a block runs (its load report of weights a caller drops
    on purpose), its verbosity restored after, so that later warnings still show."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


#: the line DeepSpeed prints (``print``, no logger) on every CPU rank at every launch, when its
#: shared-memory op loads from the cache as when it is built: a regular expression
DEEPSPEED_OP_LOADED = r"^DeepSpeed \S+ built successfully$"


@contextmanager
def without_printed(pattern: str) -> Iterator[None]:
    """The block's ``print`` output (stdout) minus the lines that match ``pattern``: for a
    library that prints routine chatter where it has no logger; every other line is written
    after the block, in order (also when the block raises)."""
    caught = io.StringIO()
    try:
        with redirect_stdout(caught):
            yield
    finally:
        kept = [ln for ln in caught.getvalue().splitlines() if not re.match(pattern, ln)]
        if kept:
            sys.stdout.write("\n".join(kept) + "\n")
            sys.stdout.flush()


def report(lines: str | Iterable[str], stream=None) -> None:
    """Write a report a user reads (a table, a summary, JSON, a path another command takes) as
    plain, unprefixed lines on stdout (or ``stream``): the one writer of such output, so that
    messages go through a logger and only reports bypass it. Every rank writes what it is given."""
    text = lines if isinstance(lines, str) else "\n".join(lines)
    out = stream or sys.stdout
    out.write(text + "\n")
    out.flush()
