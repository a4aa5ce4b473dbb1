"""The one builder of the project's command lines: ``python -m data_prep build ...`` and the
trainer (``python pretrain/main.py ...`` on one process, ``deepspeed --num_gpus N
pretrain/main.py ...`` on N local ranks), as argv lists, from keyword arguments named as the flags
are.

    data_prep_build(corpus, shards, vocab_size=2000, max_seq_len=128, one_doc_per_line=True)
    trainer(ranks=2, master_port=29500, ds_config=..., data=shards, output_dir=run, progress=False)

A keyword ``name=value`` becomes ``--name value``; ``None`` leaves the flag out; a list or tuple
gives the flag its values in order. Booleans follow each command's convention: ``data_prep``
flags are switches (True: ``--name``, False: left out); the trainer's take a value
(``--progress false``). The demo, the benchmarks and the tests all build their command lines here,
so a flag is spelled in one place besides its parser.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "pretrain" / "main.py"
Value = str | int | float | bool | os.PathLike | Iterable | None


def flags(values: Mapping[str, Value], *, switches: bool) -> list[str]:
    """``--name value`` for each keyword; booleans as switches or as ``true``/``false``."""
    argv: list[str] = []
    for name, value in values.items():
        if value is None or (switches and value is False):
            continue
        if isinstance(value, bool):
            argv += [f"--{name}"] if switches else [f"--{name}", str(value).lower()]
        elif isinstance(value, (list, tuple)):
            argv += [f"--{name}", *map(str, value)]
        else:
            argv += [f"--{name}", str(value)]
    return argv


def data_prep_build(
    inputs: os.PathLike | str | Iterable[os.PathLike | str],
    output: os.PathLike | str,
    *,
    python: str = sys.executable,
    **options: Value,
) -> list[str]:
    """``python -m data_prep build --input INPUTS... --output OUTPUT --flag value ...``."""
    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    return [
        python,
        *("-m", "bertforge.data_prep", "build"),
        *("--input", *map(str, paths)),
        *("--output", str(output)),
        *flags(options, switches=True),
    ]


def trainer(
    *,
    ranks: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    python: str = sys.executable,
    script: os.PathLike | str = TRAINER,
    **options: Value,
) -> list[str]:
    """``python pretrain/main.py --flag value ...`` (``ranks=None``), or the DeepSpeed launcher
    on `ranks` local ranks (``deepspeed --num_gpus RANKS [--master_addr A] [--master_port P]
    pretrain/main.py ...``, run as ``python -m deepspeed.launcher.runner``). ``script``: another
    entry that wraps the trainer (a test's patched main)."""
    launcher: list[str] = [python]
    if ranks is not None:
        launcher += ["-m", "deepspeed.launcher.runner", "--num_gpus", str(ranks)]
        launcher += flags({"master_addr": master_addr, "master_port": master_port}, switches=False)
    return [*launcher, str(script), *flags(options, switches=False)]
