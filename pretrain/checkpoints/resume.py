"""Which checkpoint a run continues from: ``--resume`` resolved to a verified checkpoint
(:func:`pretrain.run_folder.run_checkpoints.resolve_resume`) and checked against this run's data and
model (:func:`find_resume`); DeepSpeed's ``latest`` file, which names only a verified checkpoint.

Reading a run folder (its checkpoints, which verify, their trainer state) is
:mod:`pretrain.run_folder.run_checkpoints`; saving, loading and restoring live in
:mod:`pretrain.checkpoints.checkpoint`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.files import write_text_atomic
from bertforge.pretrain.run_folder.run_checkpoints import (
    CheckpointError,
    find_latest,
    read_state,
    resolve_resume,
)

LATEST_FILE = "latest"  # DeepSpeed's name (engine.load_checkpoint, zero_to_fp32 read it)


# Model settings a resumed run may change: they do not alter the weights' shapes or meaning.
_FREE_MODEL_FIELDS = {
    "name",
    "loss_impl",
    "config_json",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
}


def write_latest(ckpt_dir: str | os.PathLike) -> Path | None:
    """Point DeepSpeed's ``latest`` file at the newest verified checkpoint (atomic); returns it.

    Only a verified checkpoint is ever named: with none, the file is left as it is.
    """
    newest = find_latest(ckpt_dir, quiet=True)
    if newest is not None:
        write_text_atomic(Path(ckpt_dir) / LATEST_FILE, newest.name)  # no newline, as DeepSpeed
    return newest


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
