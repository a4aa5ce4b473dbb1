"""What a failed `data_prep build` leaves behind (docs/data.md).

Bad input or configuration (a :class:`~bertforge.errors.UserError`) undoes this command: every
file and folder it created in OUT is removed, and OUT itself when the command created it, so
OUT is exactly as it was (a part of a partitioned build removes only its own units' files: the
other parts may be writing beside it). Anything else (Ctrl-C, SIGTERM, a worker that died, a
tokenizer or disk error) is an interruption: the finished units stay under OUT/.work for a resume
with the same command, and one line says so. A build that replaces another (``--overwrite``)
runs in a staging folder beside OUT, so the earlier build is never touched before the new one is
complete.
"""

from __future__ import annotations

import re
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bertforge.data_prep.layout import WORK_DIR
from bertforge.errors import UserError
from bertforge.logs import get_logger

log = get_logger(__name__)

_UNIT_FILE = re.compile(r"^(?:shard|unit)-(\d+)\.")  # shard-00003.tokens, unit-00003.json


def staging_path(out: Path) -> Path:
    """Where a build that replaces OUT is made (renamed to OUT once complete)."""
    return out.parent / f".{out.name}.new"


def _snapshot(out: Path) -> set[Path]:
    return set(out.rglob("*")) if out.is_dir() else set()


def _undo(out: Path, existed: bool, before: set[Path], owns: Callable[[str], bool] | None) -> int:
    """Remove what appeared in OUT since ``before``; returns how many paths went."""
    if not existed and owns is None:
        shutil.rmtree(out, ignore_errors=True)
        return 1
    created = sorted(_snapshot(out) - before, key=lambda p: len(p.parts), reverse=True)
    removed = 0
    for p in created:  # deepest first, so a created folder is empty when its turn comes
        if owns is not None and not owns(p.name):
            continue
        if p.is_dir() and not p.is_symlink():
            if owns is None and not any(p.iterdir()):
                p.rmdir()
                removed += 1
        else:
            p.unlink(missing_ok=True)
            removed += 1
    return removed


def part_owns(num_partitions: int, partition: int) -> Callable[[str], bool]:
    """File-name filter of what part K of N may remove: its units' files and its own record."""
    record = f"part-{partition}-of-{num_partitions}.json"

    def owns(name: str) -> bool:
        m = _UNIT_FILE.match(name)
        return name == record or (m is not None and int(m.group(1)) % num_partitions == partition)

    return owns


def _finished_units(out: Path) -> int:
    return len(list((out / WORK_DIR).glob("unit-*.json"))) if out.is_dir() else 0


@contextmanager
def undo_on_user_error(
    out: Path, owns: Callable[[str], bool] | None = None, resume_hint: str = ""
) -> Iterator[None]:
    """Run a build into ``out``: a UserError removes what it created (``owns``: only the files
    whose names it accepts), anything else keeps the resumable state and says so."""
    existed = out.exists()
    before = _snapshot(out)
    previous = signal.getsignal(signal.SIGTERM)
    swapped = previous == signal.SIG_DFL and threading.current_thread() is threading.main_thread()
    if swapped:  # a batch system's SIGTERM ends the build like Ctrl-C: this block still runs
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    except UserError:
        _undo(out, existed, before, owns)
        what = "left as it was" if existed else "removed (this command created it)"
        log.info(f"nothing kept: {out} {what}")
        raise
    except BaseException as e:
        why = "interrupted" if isinstance(e, KeyboardInterrupt) else f"failed ({type(e).__name__})"
        if (out / WORK_DIR).is_dir():
            log.warning(
                f"build {why}: {out} keeps {_finished_units(out)} finished work unit(s) under "
                f"{WORK_DIR}/ and no manifest (the trainer refuses it); rerun the same command "
                f"to resume{resume_hint}, or delete {out}"
            )
        raise
    finally:
        if swapped:
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
