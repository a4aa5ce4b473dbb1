"""Which checkpoints a run folder holds, which of them verify, and which one a run continues from.

A checkpoint folder ``RUN/checkpoints/step_XXXXXXXX`` counts once its ``COMPLETE`` marker exists
(:mod:`pretrain.components.checkpoint_files`: a JSON manifest of every file of the tag folder,
relative path -> size in bytes). :func:`verify` compares it with the folder (``stat`` only, cheap
enough to run before the rendezvous); ``--resume auto`` and a run or ``checkpoints/`` folder take
the newest checkpoint that verifies and warn about each newer one skipped; an explicit checkpoint
folder that fails is an error naming its problems; ``latest`` names only a verified checkpoint.
An old plain-text marker (``step_XXXXXXXX``) still counts as complete (no file list).

Saving, loading and restoring live in :mod:`pretrain.components.checkpoint`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.errors import UserError
from bertforge.files import write_text_atomic
from bertforge.logs import get_logger
from bertforge.pretrain.components.checkpoint_files import (
    MARKER,
    describe_problems,
    is_complete,
    verify,
)

log = get_logger(__name__)

LATEST_FILE = "latest"  # DeepSpeed's name (engine.load_checkpoint, zero_to_fp32 read it)
STATE_FILE = "trainer_state.json"
TAG_RE = re.compile(r"^step_(\d{8})$")


# Model settings a resumed run may change: they do not alter the weights' shapes or meaning.
_FREE_MODEL_FIELDS = {
    "name",
    "loss_impl",
    "config_json",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
}


class CheckpointError(UserError, ValueError):
    """A checkpoint that does not exist, is incomplete, or does not fit this run."""


class CorruptCheckpointError(CheckpointError):
    """A complete checkpoint whose files do not match what its ``COMPLETE`` manifest records."""


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


def write_latest(ckpt_dir: str | os.PathLike) -> Path | None:
    """Point DeepSpeed's ``latest`` file at the newest verified checkpoint (atomic); returns it.

    Only a verified checkpoint is ever named: with none, the file is left as it is.
    """
    newest = find_latest(ckpt_dir, quiet=True)
    if newest is not None:
        write_text_atomic(Path(ckpt_dir) / LATEST_FILE, newest.name)  # no newline, as DeepSpeed
    return newest


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
        return _newest_verified(Path(output_dir) / "checkpoints", f"{flag} auto")
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
    for root in (p, p / "checkpoints"):
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


def check_compatible(
    state: dict[str, Any],
    *,
    vocab_size: int,
    tokenizer_fingerprint: str,
    model_config: dict[str, Any],
    path: Path,
) -> None:
    """Raise CheckpointError when the checkpoint was trained with another model, vocabulary or
    tokenizer."""
    problems = []
    if state.get("tokenizer_fingerprint") != tokenizer_fingerprint:
        problems.append(
            f"tokenizer fingerprint {state.get('tokenizer_fingerprint')} (checkpoint) "
            f"!= {tokenizer_fingerprint} (--data)"
        )
    if state.get("vocab_size") != vocab_size:
        problems.append(
            f"vocab size {state.get('vocab_size')} (checkpoint) != {vocab_size} (--data)"
        )
    saved = dict(state.get("config", {}).get("model_cfg", {}))
    if saved and "attention" not in saved:  # written before --attention: every token saw all
        saved["attention"] = "full"
    for k, v in model_config.items():
        if k in saved and saved[k] != v and k not in _FREE_MODEL_FIELDS:
            problems.append(f"model.{k} = {saved[k]!r} (checkpoint) != {v!r} (this run)")
    if problems:
        raise CheckpointError(
            f"checkpoint {path} does not fit this run:\n  "
            + "\n  ".join(problems)
            + "\nUse the same --data/--model as the run that wrote it, or start "
            "a new --output_dir."
        )


@dataclass(frozen=True)
class ResumePoint:
    """A complete checkpoint this run continues from, and the trainer state saved with it."""

    path: Path
    state: dict[str, Any]

    def world_size_changed(self, world_size: int) -> bool:
        """True when the checkpoint was written by another number of ranks (universal load)."""
        return int(self.state["world_size"]) != world_size


def find_resume(
    resume: str,
    output_dir: str | os.PathLike,
    *,
    vocab_size: int,
    tokenizer_fingerprint: str,
    model_config: dict[str, Any],
) -> ResumePoint | None:
    """The checkpoint ``--resume`` names, checked against this run's data and model, or None."""
    path = resolve_resume(resume, output_dir)
    if path is None:
        return None
    state = read_state(path)
    check_compatible(
        state,
        vocab_size=vocab_size,
        tokenizer_fingerprint=tokenizer_fingerprint,
        model_config=model_config,
        path=path,
    )
    return ResumePoint(path, state)
