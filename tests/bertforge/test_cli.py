"""The command lines: parsers generated from the config dataclasses, short argparse errors.

Every entry point parses with bertforge.cli.ArgumentParser: prefixes of a flag are refused, an
error is two lines (the offending flag with a "did you mean", then the --help to read) with exit
status 2, and a subcommand's error names the subcommand.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.commands import REPO as ROOT

from bertforge.cli import ArgumentParser, add_fields, explain, from_args, opt, suggest


def _run(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def _exit_2(main, argv: list[str], capsys) -> list[str]:
    """Run ``main(argv)``, expect argparse's exit 2; return stderr's lines."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


# -- the parser class -------------------------------------------------------------------------


def test_suggest_prefers_the_flag_a_prefix_abbreviates():
    flags = ["--micro_batch_size", "--global_batch_size", "--max_steps"]
    assert suggest("--micro_batch", flags) == "--micro_batch_size"
    assert suggest("--max_step", flags) == "--max_steps"
    assert suggest("--global_bach_size", flags) == "--global_batch_size"
    assert suggest("--zzz", flags) is None


def test_explain_names_one_flag_and_its_fix():
    opts = ["--max_seq_len", "--input"]
    assert (
        explain("unrecognized arguments: --max_seq_length 8", opts)
        == "unrecognized argument --max_seq_length; did you mean --max_seq_len?"
    )
    assert explain("unrecognized arguments: --max_seq_length=8", opts).startswith(
        "unrecognized argument --max_seq_length;"
    )
    assert "not abbreviated" in explain("unrecognized arguments: --max_seq", opts)
    assert explain("unrecognized arguments: --nothing_like_it", opts) == (
        "unrecognized argument --nothing_like_it"
    )
    assert "unexpected argument 'stray'" in explain("unrecognized arguments: stray", opts)
    choice = "argument --format: invalid choice: 'nps' (choose from 'packed', 'nsp')"
    assert explain(choice, opts) == choice + "; did you mean 'nsp'?"
    assert explain("--max_steps must be positive, got 0", opts) == (
        "--max_steps must be positive, got 0"
    )


def test_abbreviations_are_refused(capsys):
    p = ArgumentParser(prog="prog")
    p.add_argument("--micro_batch_size", type=int)
    assert p.parse_args(["--micro_batch_size", "4"]).micro_batch_size == 4
    err = _exit_2(p.parse_args, ["--micro_batch", "4"], capsys)
    assert err == [
        "prog: error: unrecognized argument --micro_batch; did you mean --micro_batch_size? "
        "(flags are not abbreviated)",
        "see `prog --help`",
    ]


def test_a_subcommands_error_names_the_subcommand(capsys):
    p = ArgumentParser(prog="tool")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("build").add_argument("--max_seq_len", type=int)
    err = _exit_2(p.parse_args, ["build", "--max_seq_length", "8"], capsys)
    assert err == [
        "tool build: error: unrecognized argument --max_seq_length; did you mean --max_seq_len?",
        "see `tool build --help`",
    ]
    err = _exit_2(p.parse_args, ["biuld"], capsys)
    assert err[0].startswith("tool: error: argument command: invalid choice: 'biuld'")
    assert err[0].endswith("did you mean 'build'?")


def test_a_missing_required_flag_blames_the_misspelt_one(capsys):
    p = ArgumentParser(prog="prog")
    p.add_argument("--output", required=True)
    err = _exit_2(p.parse_args, ["--outptu", "x"], capsys)
    assert err[0] == "prog: error: unrecognized argument --outptu; did you mean --output?"
    err = _exit_2(p.parse_args, [], capsys)
    assert err[0] == "prog: error: the following arguments are required: --output"


# -- flags from dataclasses -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Inner:
    depth: int = opt(2, "how deep")
    hidden: int = 7  # no flag of the command line below


@dataclasses.dataclass(frozen=True)
class _Outer:
    paths: tuple[str, ...] = opt(help="inputs", flags=("--path",), metavar="P")
    name: str | None = opt(None, "a name", exclusive="who")
    number: int = opt(5, "a number (default %(default)s)", exclusive="who")
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    lower: bool | None = opt(None, "lowercase", negatable=True)
    force: bool = opt(False, "force")
    width: int = opt(1, cli_default=lambda: 3)


def test_add_fields_and_from_args_round_trip(capsys):
    p = ArgumentParser(prog="prog")
    add_fields(p, _Outer, exclude=("hidden",))
    cfg = from_args(_Outer, p.parse_args(["--path", "a", "b", "--depth", "4", "--no_lower"]))
    assert cfg == _Outer(paths=("a", "b"), inner=_Inner(depth=4), lower=False, width=3)
    assert from_args(_Outer, p.parse_args(["--path", "a", "--force"])).force is True
    assert "a number (default 5)" in p.format_help()
    assert "--hidden" not in p.format_help()
    err = _exit_2(p.parse_args, ["--path", "a", "--name", "x", "--number", "3"], capsys)
    assert "not allowed with argument" in err[0]
    err = _exit_2(p.parse_args, ["--depth", "1"], capsys)
    assert "required: --path" in err[0]


def test_track_given_keeps_unset_flags_none_and_shows_the_default_once():
    @dataclasses.dataclass
    class C:
        lr: float | None = opt(None, "peak lr", default_text="from the DeepSpeed config")
        steps: int = opt(10, "steps")
        on: bool = opt(True, "on", negatable=True)

    p = ArgumentParser(prog="prog")
    add_fields(p, C, track_given=True)
    assert vars(p.parse_args([])) == {"lr": None, "steps": None, "on": None}
    assert p.parse_args(["--on", "false"]).on is False and p.parse_args(["--no_on"]).on is False
    text = " ".join(p.format_help().split())
    assert "peak lr (default: from the DeepSpeed config)" in text
    assert "steps (default: 10)" in text and "(default: None)" not in text


# -- the project's entry points ---------------------------------------------------------------


def test_data_prep_build_flags_are_build_configs_fields():
    from bertforge.data_prep.__main__ import _parser
    from bertforge.data_prep.build_config import BuildConfig

    args = _parser().parse_args(["build", "--input", "a.txt", "b.txt", "--output", "out"])
    cfg = from_args(BuildConfig, args)
    assert cfg == BuildConfig(inputs=("a.txt", "b.txt"), output=Path("out"), workers=cfg.workers)
    assert cfg.workers == (os.cpu_count() or 1)  # the command line's default: one per CPU
    args = _parser().parse_args(
        ["prepare", "--input", "a", "--output", "o", "--format", "nsp", "--decontaminate"]
    )
    cfg = from_args(BuildConfig, args)
    assert (cfg.sequences.format, cfg.decontaminate, cfg.num_partitions) == ("nsp", 0.8, 1)
    assert not hasattr(args, "partition")  # prepare is made once for every part


def test_data_prep_build_error_is_short_and_names_the_subcommand():
    proc = _run("-m", "bertforge", "prep", "build", "--max_seq_length", "8")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "bertforge prep build: error: unrecognized argument --max_seq_length; "
        "did you mean --max_seq_len?",
        "see `bertforge prep build --help`",
    ]


def test_data_prep_user_error_is_logged_once_with_exit_2(tmp_path, capsys):
    from bertforge.data_prep.__main__ import main

    rc = main(["build", "--input", str(tmp_path / "nope.txt"), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("[data_prep] ERROR: ") and "nope.txt" in err[0]


def test_trainer_refuses_an_abbreviation(capsys):
    from bertforge.pretrain.config.cli import parse_args

    err = _exit_2(parse_args, ["--data", "x", "--micro_batch", "4"], capsys)
    assert err == [
        "pretrain/main.py: error: unrecognized argument --micro_batch; did you mean "
        "--micro_batch_size? (flags are not abbreviated)",
        "see `python pretrain/main.py --help`",
    ]
    err = _exit_2(parse_args, ["--data", "x", "--max_steps", "0"], capsys)
    assert err[0] == "pretrain/main.py: error: --max_steps must be positive, got 0"


def test_trainer_help_says_where_each_default_comes_from_once():
    from bertforge.pretrain.config.cli import trainer_parser

    parser, _ = trainer_parser()
    text = " ".join(parser.format_help().split())
    assert "DeepSpeed config's (default: None)" not in text
    assert "None" not in text  # Python's word for unset: "(default: unset)" and "unset: ..."
    assert "schedule; unset, mask_prob stays constant (default: unset)" in text
    assert "sequences per forward pass per rank (default: the DeepSpeed JSON's, else 32)" in text
    assert "peak learning rate (default: the DeepSpeed JSON's, else 0.0001)" in text
    for action in parser._actions:  # every flag has its field's help, not only a default
        if action.option_strings and action.dest != "help":
            assert action.help and not action.help.startswith(" ("), action.option_strings


@pytest.mark.parametrize(
    "module",
    [
        "bertforge.data_prep.__main__",
        "bertforge.pretrain.config.cli",
        "bertforge.pretrain.export.hf_export",
        "bertforge.pretrain.evaluate.__main__",
        "bertforge.pretrain.evaluate.downstream",
        "benchmarks.tasks.pydoc_tasks",
        "bertforge.pretrain.evaluate.passage_tasks",
        "benchmarks.tasks.snownlp_tasks",
        "benchmarks.tasks.glue_like",
        "bertforge.pretrain.attention",
        "bertforge.pretrain.doctor.cli",
        "bertforge.pretrain.plot",
        "bertforge.pretrain.demo",
    ],
)
def test_every_entry_point_gives_the_short_error(module, capsys):
    import importlib

    mod = importlib.import_module(module)
    main = mod.parse_args if module == "bertforge.pretrain.config.cli" else mod.main
    argv = ["build"] if module == "bertforge.data_prep.__main__" else []
    err = _exit_2(main, [*argv, "--no_such_flag_here"], capsys)
    assert len(err) == 2 and "usage:" not in "".join(err), err
    assert err[0].endswith("error: unrecognized argument --no_such_flag_here"), err
    assert err[1].startswith("see `") and err[1].endswith(" --help`"), err


def test_data_that_is_no_shard_folder_is_named_with_the_build_that_makes_one(
    english_shards, tmp_path, capsys
):
    # a newcomer's first try: --data pointed at the text (before, the advice was to build
    # *into* the text file: `data_prep build --output corpus.txt`)
    from bertforge.pretrain.config.cli import parse_args

    text = tmp_path / "corpus.txt"
    text.write_text("one paragraph\n\nanother\n", encoding="utf-8")
    unfinished = tmp_path / "half"
    (unfinished / ".work").mkdir(parents=True)
    expect = {
        text: f"a file, not a shard folder; --data takes the output of `bertforge prep "
        f"build --input {text} --output SHARDS`",
        tmp_path: f"a folder without a manifest.json, not a shard folder; --data takes the "
        f"output of `bertforge prep build --input {tmp_path} --output SHARDS`",
        english_shards.parent: f"it holds the shard folders ['{english_shards}']: give one",
        unfinished: "an unfinished build (its .work folder is there, no manifest.json yet)",
        tmp_path / "nope": "no such folder (or an incomplete build); run `bertforge prep "
        f"build --input TEXT --output {tmp_path / 'nope'}` first",
    }
    for data, message in expect.items():
        err = _exit_2(parse_args, ["--data", str(data), "--dry-run"], capsys)
        assert err[0].startswith(f"pretrain/main.py: error: --data {data}: "), err
        assert message in err[0], err
