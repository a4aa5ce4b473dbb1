"""The ``bertforge`` command: one name, one subcommand per thing a user runs.

    bertforge prep build --input corpus.txt --output shards/   # data_prep's commands
    bertforge inspect shards/                                   # = bertforge prep inspect
    bertforge train --data shards/ --output_dir runs/x          # the trainer, in this process
    bertforge export runs/x --output runs/x/hf_model
    bertforge evaluate | doctor | demo | plot | attention | phases | passage-tasks ...

Each subcommand hands the rest of the command line to its module's ``main`` (the same flags, the
same exit status, ``bertforge SUB --help``); the module is imported only when its subcommand runs,
so ``bertforge --help`` starts no torch. ``python -m bertforge`` runs the same. Multi-rank launches
keep the trainer's script, ``deepspeed --hostfile hostfile pretrain/main.py ...``
(docs/launching.md); ``bertforge train`` is the trainer as one process, or as one rank of a
launcher that runs a command (``torchrun --no-python ... bertforge train ...``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from bertforge.cli import suggest
from bertforge.errors import USER_ERROR_EXIT

PROG = "bertforge"

#: subcommand -> (module, its entry function, the one line `bertforge --help` shows)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "prep": (
        "bertforge.data_prep.__main__",
        "main",
        "text -> tokenizer + shards (build, merge, verify, check-overlap, ...)",
    ),
    "inspect": (
        "bertforge.data_prep.__main__",
        "main",
        "a shard folder's counts, length histogram and decoded samples",
    ),
    "train": ("bertforge.pretrain.main", "main", "pretrain (one process, or one launcher rank)"),
    "export": (
        "bertforge.pretrain.export.hf_export",
        "main",
        "a run's checkpoint -> a Hugging Face model folder",
    ),
    "evaluate": (
        "bertforge.pretrain.evaluate.__main__",
        "main",
        "fine-tune and score models on labelled tasks, GLUE or CLUE",
    ),
    "doctor": (
        "bertforge.pretrain.doctor.cli",
        "main",
        "check a launch before it runs (nodes, data, config, kernels)",
    ),
    "demo": ("bertforge.pretrain.demo", "main", "shards, a 2-rank run, resume, export, fill-mask"),
    "plot": ("bertforge.pretrain.plot", "main", "a run's metrics.jsonl -> PNG plots"),
    "attention": (
        "bertforge.pretrain.attention",
        "main",
        "attention maps of one sentence and each head's kind",
    ),
    "phases": (
        "bertforge.pretrain.config.phase_plan",
        "main",
        "check a --phases plan file and print its steps, tokens, lr and batch",
    ),
    "passage-tasks": (
        "bertforge.pretrain.evaluate.passage_tasks",
        "main",
        "a labelled task from your own texts: which text is a passage from?",
    ),
}


def usage() -> str:
    """``bertforge --help``: the subcommands, one line each."""
    width = max(map(len, SUBCOMMANDS))
    rows = [f"  {name:<{width}}  {line}" for name, (_, _, line) in SUBCOMMANDS.items()]
    return "\n".join(
        [
            f"usage: {PROG} SUBCOMMAND [ARGS ...]",
            "",
            "BERT-style masked-LM pretraining on DeepSpeed (docs: README.md, docs/).",
            "",
            "subcommands:",
            *rows,
            "",
            f"`{PROG} SUBCOMMAND --help` lists a subcommand's flags.",
        ]
    )


def entry(name: str) -> Callable[..., int]:
    """The ``main`` of subcommand ``name`` (its module imported now)."""
    module, function, _ = SUBCOMMANDS[name]
    return getattr(importlib.import_module(module), function)


def run(name: str, argv: list[str]) -> int:
    """Subcommand ``name`` with its arguments; returns its exit status."""
    main = entry(name)
    if name == "prep":
        return main(argv, prog=f"{PROG} prep")
    if name == "inspect":  # data_prep's inspect; its usage line reads `bertforge inspect`
        return main(["inspect", *argv], prog=PROG)
    if name == "train":
        return main(argv, keep_handler=True, prog=f"{PROG} train")
    return main(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script and of ``python -m bertforge``; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):  # bare: the list, as the error of a missing one
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else USER_ERROR_EXIT
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        choices = ", ".join(SUBCOMMANDS)
        guess = suggest(name, SUBCOMMANDS)
        hint = f"; did you mean {guess!r}?" if guess else ""
        print(
            f"{PROG}: error: unknown subcommand {name!r} (choose from {choices}){hint}\n"
            f"see `{PROG} --help`",
            file=sys.stderr,
        )
        return USER_ERROR_EXIT
    return run(name, rest)


def script() -> None:
    """The console script: exit with the subcommand's status. After ``train``, as after
    ``pretrain/main.py``, everything is written and closed: the process ends without the native
    teardown (~7 s per run with a gloo group)."""
    argv = sys.argv[1:]
    code = main(argv)
    if argv[:1] == ["train"]:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
