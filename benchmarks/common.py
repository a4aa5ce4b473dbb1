"""What several benchmarks share: where the repository is, its shipped CPU config, and how a
benchmark builds shards, launches a command and reads what a run wrote.

Every benchmark runs from the repository root as ``python -m benchmarks.<family>.<name>``, so the
project's packages import as they do in the tests, with no edit of the import path. Command lines
come from ``pretrain.config.command_line``, the sample corpus from ``data_prep.sample_corpus``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from pretrain.config import command_line

REPO = Path(__file__).resolve().parents[1]
CPU_DS_CONFIG = REPO / "ds_configs" / "cpu.json"  # the shipped ZeRO-2 CPU config
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # one thread per rank: the 2-core CPU measurements


def build_shards(corpus: Path | list[Path], out: Path, *, quiet: bool = True, **options) -> Path:
    """``python -m data_prep build`` of `corpus` into `out` with `options` as its flags (two
    workers unless given); an `out` that already holds a finished build is kept as it is."""
    if (Path(out) / "manifest.json").is_file():
        return out
    options.setdefault("workers", 2)
    subprocess.run(
        command_line.data_prep_build(corpus, out, **options),
        cwd=REPO,
        check=True,
        capture_output=quiet,
    )
    return out


def shards_manifest(shards: Path) -> dict[str, Any]:
    """The manifest of a finished build, read and checked by ``data_prep``."""
    from data_prep.reader import load_manifest

    return load_manifest(shards)


def vocab_size(shards: Path) -> int:
    """The vocabulary size of a build's tokenizer."""
    return shards_manifest(shards)["tokenizer"]["vocab_size"]


def one_thread_env(**extra: str) -> dict[str, str]:
    """This process's environment with one thread per rank (and `extra`)."""
    return {**os.environ, **ONE_THREAD, **extra}
