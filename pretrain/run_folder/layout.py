"""What a run folder (``--output_dir``) holds: the one definition of every name in it.

    RUN/
      checkpoints/step_NNNNNNNN/   a complete checkpoint a saved step (run_checkpoints.py)
      metrics.jsonl                every step, validation, guard, resume and downstream record
      config.json                  the run's resolved configuration (the model card quotes it)
      recipe.yaml                  the recipe that reproduces the run
      phases.json                  a --phases run's plan
      tokenizer/                   a copy of the shards' tokenizer: export needs no shard folder
      verified_shards.json         the shard folders whose sha256 this run checked once
      tensorboard/                 TensorBoard's events (DeepSpeed's monitor)
      downstream/                  --downstream_eval's jobs, a folder a checkpoint
      plots/                       ``bertforge plot``'s PNGs (its default --out)
      .lock                        held by the launch that trains in the folder

Every module that reads or writes a run folder names these through :class:`RunFolder`, so the
layout is changed here or nowhere (docs/training.md shows it to users).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunFolder:
    """The paths of one run folder (see the module doc)."""

    root: Path

    def __init__(self, root: str | os.PathLike) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def recipe(self) -> Path:
        return self.root / "recipe.yaml"

    @property
    def phases(self) -> Path:
        return self.root / "phases.json"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    @property
    def verified_shards(self) -> Path:
        return self.root / "verified_shards.json"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def downstream(self) -> Path:
        return self.root / "downstream"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"
