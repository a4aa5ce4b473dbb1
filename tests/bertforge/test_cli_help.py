"""--help of the generated commands: every flag shows its default (or that it is required), and
--model lists the presets the model registry holds when the parser is built."""

from __future__ import annotations

import argparse

import pytest

from bertforge.data_prep.__main__ import _parser as data_prep_parser
from bertforge.pretrain.config.cli import trainer_parser
from bertforge.pretrain.model import registry


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _flag_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each flag's help as --help prints it (%(default)s expanded, lines joined)."""
    formatter = parser._get_formatter()
    return {
        a.option_strings[-1] if a.option_strings[0].startswith("--no_") else a.option_strings[0]: (
            " ".join(formatter._expand_help(a).split()) if a.help else ""
        )
        for a in parser._actions
        if a.option_strings and a.dest != "help"
    }


@pytest.mark.parametrize("command", ["build", "prepare"])
def test_every_data_prep_flag_shows_its_default(command):
    helps = _flag_helps(_subcommand(data_prep_parser(), command))
    missing = [
        flag
        for flag, text in helps.items()
        if not flag.startswith("--no_") and "(default" not in text and "(required)" not in text
    ]
    assert not missing, f"data_prep {command} --help shows no default for {missing}"
    assert "(default: 128)" in helps["--max_seq_len"]
    assert "(default: one per CPU core)" in helps["--workers"]
    assert "(required)" in helps["--output"]
    assert "(default: off)" in helps["--overwrite"]


def test_every_trainer_flag_shows_its_default():
    helps = _flag_helps(trainer_parser()[0])
    missing = {
        flag
        for flag, text in helps.items()
        if not flag.startswith("--no_") and "(default" not in text and "(required)" not in text
    }
    assert missing == {"--local_rank", "--recipe"}  # the launcher's, and the recipe file itself
    assert "(default: tiny)" in helps["--model"]


def test_model_help_lists_the_registry_as_it_is(monkeypatch):
    helps = _flag_helps(trainer_parser()[0])
    for name in registry.PRESETS:
        assert name in helps["--model"]
    monkeypatch.setitem(registry.PRESETS, "xl-test", registry.PRESETS["tiny"])
    assert "xl-test" in _flag_helps(trainer_parser()[0])["--model"]
