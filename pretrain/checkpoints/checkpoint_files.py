"""What a checkpoint folder is written with and how its writing fails: the ``COMPLETE`` manifest.

``COMPLETE`` (written last, atomically) is a JSON manifest ``{"format": 1, "tag": ..., "files":
{relative path: size in bytes}}`` of every file of the folder, made from what each rank reports
it wrote. Reading it back (:func:`~pretrain.run_folder.run_checkpoints.verify`, ``stat`` only:
it runs before the rendezvous) is :mod:`pretrain.run_folder.run_checkpoints`.

:class:`DeferredWriteErrors` wraps DeepSpeed's save so that a write error on one rank is recorded
rather than raised: the rank still runs every collective of the save, and the caller
(:meth:`pretrain.checkpoints.checkpoint.CheckpointManager.save`) tells all ranks with one
all-gather.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bertforge.files import write_text_atomic
from bertforge.pretrain.run_folder.run_checkpoints import MARKER


def written_sizes(folder: Path, files: Iterable[Path]) -> dict[str, int]:
    """{path relative to ``folder``: size in bytes} of ``files`` (written by this process)."""
    return {Path(f).relative_to(folder).as_posix(): Path(f).stat().st_size for f in files}


def folder_sizes(folder: Path) -> dict[str, int]:
    """Sizes of every file below ``folder`` but the marker (for a folder one process wrote)."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != MARKER]
    return written_sizes(folder, files)


def write_marker(folder: Path, files: dict[str, int], tag: str | None = None) -> None:
    """Write ``COMPLETE`` (atomic): the manifest :func:`verify` checks the folder against."""
    manifest = {"format": 1, "tag": tag or folder.name, "files": dict(sorted(files.items()))}
    write_text_atomic(folder / MARKER, json.dumps(manifest, indent=1) + "\n")


def explain_write_error(error: BaseException, path: Path) -> str:
    """A write error with the free space left where it happened (a full disk says so)."""
    try:
        free = shutil.disk_usage(path if path.exists() else path.parent).free
        room = f"; {free} bytes free there"
    except OSError:
        room = ""
    return f"{type(error).__name__}: {error}{room}"


def injected_enospc(written: Path) -> None:
    """The planned ``save_enospc`` fault: the file just written is cut to half, as a disk that
    filled up mid-write leaves it, and the write fails with ENOSPC."""
    with open(written, "r+b") as f:
        f.truncate(os.path.getsize(written) // 2)
    raise OSError(
        errno.ENOSPC, "No space left on device (planned by BERTFORGE_FAULTS)", str(written)
    )


class DeferredWriteErrors:
    """Around ``engine.save_checkpoint``: DeepSpeed's file writes (its checkpoint engine's
    ``save`` and ``makedirs``, the recovery-script copy) that fail are recorded, not raised.

    An exception out of DeepSpeed's save on one rank would leave the others waiting in its closing
    barrier; recorded, the rank skips its remaining writes and still runs every collective, and
    the caller shares the error with one all-gather. ``written``: the files saved whole.
    ``after_write``: called with each file saved (the planned fault); ``error``: an earlier error
    of this rank (then nothing more is written).
    """

    def __init__(
        self,
        engine,
        where: Path,
        after_write: Callable[[Path], None] | None = None,
        error: str | None = None,
    ):
        self.engine, self.where, self.after_write, self.error = engine, where, after_write, error
        self.written: list[Path] = []
        self._patched: list[tuple[Any, str, Any]] = []  # (owner, name, its own attribute)

    def _guard(self, owner: Any, name: str, records: bool) -> None:
        original = getattr(owner, name)

        def guarded(*args, **kwargs):
            if self.error is not None:
                return None
            try:
                result = original(*args, **kwargs)
                if records:
                    path = Path(kwargs.get("path", args[1] if len(args) > 1 else ""))
                    self.written.append(path)
                    if self.after_write is not None:
                        self.after_write, hook = None, self.after_write
                        hook(path)
                return result
            except (OSError, RuntimeError) as e:  # torch.save reports a full disk as RuntimeError
                self.error = f"writing {self.where}: {explain_write_error(e, self.where)}"
                return None

        self._patched.append((owner, name, owner.__dict__.get(name)))
        setattr(owner, name, guarded)  # an instance attribute: shadows the method until __exit__

    def __enter__(self) -> DeferredWriteErrors:
        ckpt_engine = self.engine.checkpoint_engine
        self._guard(ckpt_engine, "save", records=True)
        self._guard(ckpt_engine, "makedirs", records=False)
        self._guard(self.engine, "_copy_recovery_script", records=False)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, own in reversed(self._patched):
            if own is None:
                owner.__dict__.pop(name, None)
            else:
                setattr(owner, name, own)


README = "README.md"


def readme_text(tag: str, arch: str, vocab: int, rows: int) -> str:
    """What ``README.md`` of checkpoint ``tag`` tells a user: the export for Hugging Face weights,
    and what each of DeepSpeed's own tools gives on this checkpoint (``rows`` embedding rows for
    a ``vocab``-token vocabulary) and why it is not that."""
    padded = rows != vocab
    fp32_loads = (
        f"`from_pretrained` refuses it next to the exported `config.json` (size mismatch: "
        f"{rows} embedding and decoder rows here, {vocab} tokens in the vocabulary)"
        if padded
        else "it loads next to the exported `config.json` (no rows were padded here), "
        "but it has no config, tokenizer or model card"
    )
    return f"""# Checkpoint {tag} ({arch}): DeepSpeed training state, not a Hugging Face model

Complete only when `COMPLETE` exists (it lists every file with its size). It holds the ZeRO
shards (weights, optimizer, lr schedule), `trainer_state.json` (step, data position, config) and
`rng/` (each rank's random states). Resume with `--resume auto` (or this folder) on any number of
ranks.

## Hugging Face weights: use the export

    bertforge export RUN --checkpoint RUN/checkpoints/{tag} --output HF_DIR

(RUN: the run folder, two levels above this file.) It writes `config.json`, `model.safetensors`
with the vocabulary's {vocab} rows, the tokenizer and a model card, and checks that
transformers loads the folder.

## DeepSpeed's own tools on this checkpoint

- `python zero_to_fp32.py . OUT --tag {tag}` (in `RUN/checkpoints`) writes `OUT/pytorch_model.bin`:
  the training module's fp32 weights, {rows} embedding rows and the tied decoder as a key of its
  own; {fp32_loads}.
- `zero_to_fp32.py ... --safe_serialization` fails ("Some tensors share memory"): the decoder is
  tied to the word embeddings. The export writes safetensors with the tie.
- `python -m deepspeed.checkpoint.ds_to_universal` makes a universal checkpoint for resuming on
  another number of ranks, not weights to load elsewhere; the trainer makes it itself on such a
  resume (`RUN/checkpoints/universal/{tag}`).
"""


def write_readme(folder: Path, arch: str, vocab: int, rows: int) -> Path:
    """Write ``README.md`` into checkpoint ``folder`` (atomic); returns its path."""
    path = folder / README
    write_text_atomic(path, readme_text(folder.name, arch, vocab, rows))
    return path
