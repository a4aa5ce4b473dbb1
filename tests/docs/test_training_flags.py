"""Every ``--flag`` docs/training.md names is a flag that exists: on a ``pretrain/main.py``
command line, one the trainer's parser knows; in the prose, one the trainer knows (or answers as
another trainer's name for one of its flags), else one of the page's other commands knows, else
one of the outside tools the page names (issue 55: the page named
``--model_hidden_dropout_prob``, which no command knows; the trainer's flag is
``--hidden_dropout_prob``)."""

from __future__ import annotations

import contextlib
import importlib
import io
import re

import pytest
from helpers.commands import REPO

PAGE = REPO / "docs" / "training.md"
_FLAG = re.compile(r"(?<![\w-])--[a-zA-Z][\w-]*")
_FENCE = re.compile(r"^\s*(```|~~~)")

# The page's other commands (module, argv whose --help lists the flags).
OTHER_COMMANDS = [
    ("bertforge.pretrain.export.hf_export", []),
    ("bertforge.pretrain.plot", []),
    ("bertforge.pretrain.doctor.cli", []),
    ("bertforge.pretrain.evaluate.__main__", []),
    ("bertforge.pretrain.config.phase_plan", []),
    ("bertforge.data_prep.__main__", ["build"]),
]
# Flags of outside tools the page shows, with the tool (which the page must name).
OUTSIDE = {
    "--num_gpus": "deepspeed",
    "--input_folder": "ds_to_universal",
    "--output_folder": "ds_to_universal",
    "--inject_missing_state": "ds_to_universal",
    "--safe_serialization": "zero_to_fp32",
    "--rampup-batch-size": "Megatron",
}


def trainer_flags() -> tuple[set[str], set[str]]:
    """The flags ``pretrain/main.py`` accepts, and the other trainers' names it answers."""
    from bertforge.pretrain.config.cli import trainer_parser

    parser, _ = trainer_parser()
    return set(parser.option_strings()), set(parser.aliases)


def help_flags(module: str, argv: list[str]) -> set[str]:
    """The flags ``python -m MODULE ARGV --help`` lists."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        importlib.import_module(module).main([*argv, "--help"])
    return set(_FLAG.findall(out.getvalue()))


def trainer_command_lines(text: str) -> list[str]:
    """The ``pretrain/main.py`` and ``bertforge train`` command lines of the page's code blocks
    (continuation lines joined, comments dropped), from the script's name on."""
    found, fenced, line = [], False, ""
    for raw in text.splitlines():
        if _FENCE.match(raw):
            fenced, line = not fenced, ""
            continue
        if not fenced:
            continue
        line += " " + raw.split(" #", 1)[0].rstrip().removesuffix("\\")
        if raw.rstrip().endswith("\\"):
            continue
        trainer = re.search(r"pretrain/main\.py|bertforge train\b", line)
        if trainer:
            found.append(line[trainer.end() :])
        line = ""
    return found


def test_every_flag_on_a_trainer_command_line_is_the_trainers():
    known, _ = trainer_flags()
    lines = trainer_command_lines(PAGE.read_text(encoding="utf-8"))
    assert len(lines) >= 5  # the page's commands were found
    bad = {f: line.strip() for line in lines for f in _FLAG.findall(line) if f not in known}
    assert not bad, f"docs/training.md: trainer command lines with unknown flags: {bad}"


def test_every_flag_the_page_names_exists():
    text = PAGE.read_text(encoding="utf-8")
    known, aliases = trainer_flags()
    others = set().union(*(help_flags(m, argv) for m, argv in OTHER_COMMANDS))
    unknown = []
    for flag in sorted(set(_FLAG.findall(text))):
        if flag in known or flag in aliases or flag in others:
            continue
        if flag in OUTSIDE and OUTSIDE[flag] in text:
            continue
        line = text[: text.index(flag)].count("\n") + 1
        unknown.append(f"{flag} (line {line})")
    assert not unknown, f"docs/training.md names flags no command knows: {unknown}"


def test_the_check_catches_the_flag_the_issue_found():
    known, aliases = trainer_flags()
    assert "--hidden_dropout_prob" in known and "--model_hidden_dropout_prob" not in known
    assert "--model_hidden_dropout_prob" not in aliases
    page = "```bash\npython pretrain/main.py --data D \\\n    --model_dropout 0.1  # --lr\n```\n"
    assert trainer_command_lines(page) == [" --data D      --model_dropout 0.1"]
