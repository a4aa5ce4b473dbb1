"""What a run folder holds, read without changing it: its checkpoints, which of them verify, the
one ``--resume``, ``--init_from``, ``--anneal_from`` or the export names, its trainer state, its
consolidated weights and its tokenizer.

A checkpoint folder ``RUN/checkpoints/step_XXXXXXXX`` counts once its ``COMPLETE`` marker exists:
a JSON manifest of every file of the tag folder, relative path -> size in bytes
(:mod:`pretrain.checkpoints.checkpoint_files` writes it). :func:`verify` compares it with the
folder (``stat`` only, cheap enough to run before the rendezvous); ``--resume auto`` and a run or
``checkpoints/`` folder take the newest checkpoint that verifies and warn about each newer one
skipped; an explicit checkpoint folder that fails is an error naming its problems. An old
plain-text marker (``step_XXXXXXXX``) still counts as complete (no file list).

Here in the model package, the lowest of the trainer's, because ``--init_from`` reads runs
(:mod:`pretrain.model.init_source`); which checkpoint a run continues from, and the checks
against this run's data and model, are :mod:`pretrain.checkpoints.resume`; saving is
:mod:`pretrain.checkpoints.checkpoint`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any
from unittest import mock

from bertforge.data_prep.sources import parse_mixture
from bertforge.errors import UserError
from bertforge.logs import get_logger
from bertforge.pretrain.run_folder.layout import RunFolder

log = get_logger(__name__)

MARKER = "COMPLETE"
STATE_FILE = "trainer_state.json"
TAG_RE = re.compile(r"^step_(\d{8})$")


class CheckpointError(UserError, ValueError):
    """A checkpoint that does not exist, is incomplete, or does not fit this run."""


class CorruptCheckpointError(CheckpointError):
    """A complete checkpoint whose files do not match what its ``COMPLETE`` manifest records."""


def is_complete(path: str | os.PathLike) -> bool:
    """True when ``path`` is a checkpoint folder whose completion marker exists."""
    return Path(path, MARKER).is_file()


def verify(path: str | os.PathLike) -> list[str]:
    """What is wrong with checkpoint ``path`` against its ``COMPLETE`` manifest (empty: nothing).

    ``stat`` only: a missing marker, a missing file, a size that differs. A missing per-rank RNG
    file is not a problem here (the resume goes on, not bit-exact, and :meth:`load` says so). A
    legacy plain-text marker records no files and verifies as complete.
    """
    path = Path(path)
    try:
        text = (path / MARKER).read_text(encoding="utf-8")
    except FileNotFoundError:
        return [f"no {MARKER} marker (the save did not finish)"]
    except OSError as e:
        return [f"{MARKER} cannot be read ({e})"]
    if not text.lstrip().startswith("{"):
        return []  # legacy marker ("step_XXXXXXXX"): complete, files not recorded
    try:
        files = json.loads(text)["files"]
        assert isinstance(files, dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        return [f"{MARKER} is damaged (not a JSON manifest with a 'files' table)"]
    problems = []
    for rel, size in files.items():
        try:
            actual = (path / rel).stat().st_size
        except FileNotFoundError:
            if not rel.startswith("rng/"):  # a lost RNG file costs exactness only: load warns
                problems.append(f"{rel} is missing")
            continue
        except OSError as e:
            problems.append(f"{rel} cannot be read ({e.strerror})")
            continue
        if actual != size:
            problems.append(f"{rel} has {actual} bytes, {size} were written")
    return problems


def describe_problems(problems: list[str], limit: int = 3) -> str:
    """The first ``limit`` problems of :func:`verify` on one line, for a warning."""
    more = f" (and {len(problems) - limit} more)" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more


def tag_for(step: int) -> str:
    """Folder name of the checkpoint after ``step`` optimizer steps."""
    return f"step_{step:08d}"


def list_complete(ckpt_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint (marker present; see :func:`verify`) under
    ``ckpt_dir``, oldest first."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = TAG_RE.match(p.name)
        if m and is_complete(p):
            found.append((int(m.group(1)), p))
    return sorted(found)


def find_latest(ckpt_dir: str | os.PathLike, *, quiet: bool = False) -> Path | None:
    """The newest complete checkpoint under ``ckpt_dir`` that verifies, or None.

    Each newer one that does not verify is skipped with a warning naming it (unless ``quiet``).
    """
    for _step, p in reversed(list_complete(ckpt_dir)):
        problems = verify(p)
        if not problems:
            return p
        if not quiet:
            log.warning(
                f"skipping checkpoint {p}: its files do not match what was written "
                f"({describe_problems(problems)}); falling back to the previous complete checkpoint"
            )
    return None


def _newest_verified(root: Path, what: str) -> Path | None:
    """:func:`find_latest` of ``root``; an error when it holds complete checkpoints but none
    verifies (starting over silently would throw the run away)."""
    latest = find_latest(root)
    if latest is None and list_complete(root):
        raise CorruptCheckpointError(
            f"{what}: no checkpoint in {root} matches what was written (see the warnings "
            "above). Restore the files, or "
            + (
                "use --resume none to start over."
                if what.startswith("--resume")
                else "use another."
            )
        )
    return latest


def resolve_resume(
    resume: str, output_dir: str | os.PathLike, *, flag: str = "--resume"
) -> Path | None:
    """Turn ``--resume`` (auto | none | path) into a verified checkpoint folder or None.

    A path may be a checkpoint folder, a ``checkpoints/`` folder or a run folder (newest verified
    inside, skipping with a warning any newer one that does not verify). An explicit checkpoint
    folder that does not verify is an error naming its problems. ``flag`` names the option in
    messages (``--init_from`` reads our runs through this too).
    """
    if resume == "none":
        return None
    if resume == "auto":
        return _newest_verified(RunFolder(output_dir).checkpoints, f"{flag} auto")
    p = Path(resume)
    if is_complete(p):
        problems = verify(p)
        if problems:
            raise CorruptCheckpointError(
                f"{flag} {p}: the checkpoint's files do not match what was written:\n  "
                + "\n  ".join(problems[:10])
                + "\nUse an earlier checkpoint (a run folder or --resume auto skips this one)."
            )
        return p
    for root in (p, RunFolder(p).checkpoints):
        latest = _newest_verified(root, f"{flag} {p}")
        if latest is not None:
            return latest
    if TAG_RE.match(p.name):
        raise CheckpointError(
            f"{flag} {p}: the checkpoint is incomplete (no {MARKER} marker; "
            "the run stopped while saving). Use an earlier one or --resume auto."
        )
    raise CheckpointError(f"{flag} {p}: no complete checkpoint there")


def read_state(path: Path) -> dict[str, Any]:
    """The trainer state saved with a checkpoint."""
    with open(path / STATE_FILE, encoding="utf-8") as f:
        return json.load(f)


def consolidated_state_dict(ckpt: Path) -> dict[str, Any]:
    """fp32 weights of a ZeRO-2/3 checkpoint folder (all ranks' shards merged)."""
    # Lazy: deepspeed takes seconds to import; the commands that import this module without running
    # a job (--help, the doctor) do without it.
    from deepspeed.utils import zero_to_fp32

    # DeepSpeed's script prints its bookkeeping ("Processing zero checkpoint", the parameter
    # counts) and draws a progress bar per file: a script's output, not a command's, so both
    # are kept off ours (its errors are exceptions and still reach the caller)
    with (
        contextlib.redirect_stdout(io.StringIO()),
        mock.patch.object(zero_to_fp32, "tqdm", _no_bar),
    ):
        return zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(
            str(ckpt.parent), tag=ckpt.name
        )


def _no_bar(iterable, *args, **kwargs):
    """tqdm's call, without the bar."""
    return iterable


def run_tokenizer_dir(run: Path, state: dict[str, Any]) -> Path:
    """The tokenizer of run folder ``run`` (``state``: one of its checkpoints' trainer state): its
    ``tokenizer/`` copy, else (runs written before the copy) its first --data folder's."""
    copy = RunFolder(run).tokenizer
    if copy.is_dir():
        return copy
    run_cfg = state.get("config", {}).get("run", {})
    sources = run_cfg.get("data_sources") or [run_cfg.get("data")]  # "data": before mixtures
    data = parse_mixture(sources)[0].path if sources[0] else None  # all share one tokenizer
    if data and Path(data, "tokenizer").is_dir():
        return Path(data, "tokenizer")
    raise CheckpointError(f"no tokenizer found in {run}/tokenizer or the run's --data folder")
