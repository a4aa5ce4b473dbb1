"""The `bertforge` command: one subcommand per tool, each its module's own command line (the same
flags, exit status and --help, under the name `bertforge SUB`), from any folder."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers.commands import REPO

from bertforge import commands
from bertforge.files import checkout_file


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_console_script_names_a_callable():
    target = _pyproject()["project"]["scripts"]["bertforge"]
    module, _, function = target.partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_the_command_sits_in_the_top_layer():
    """The dispatcher imports every tool: above them in the layers, never in bertforge.cli's."""
    (layers,) = [c for c in _pyproject()["tool"]["importlinter"]["contracts"] if "layers" in c]
    assert layers["layers"][0] == "bertforge.commands"


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = commands.main(argv)
        except SystemExit as e:
            code = e.code or 0
    return code, out.getvalue(), err.getvalue()


def test_help_lists_every_subcommand_one_line_each():
    code, out, _ = _run(["--help"])
    assert code == 0
    for name in commands.SUBCOMMANDS:
        assert any(line.split()[:1] == [name] for line in out.splitlines()), name
    code, _, err = _run([])  # bare: the same list, as an error
    assert code == 2 and "subcommands:" in err


def test_unknown_subcommand_exits_2_naming_the_choices():
    code, _, err = _run(["exprt", "runs/x"])
    assert code == 2
    assert "unknown subcommand 'exprt'" in err and "did you mean 'export'?" in err
    assert all(name in err for name in commands.SUBCOMMANDS)


@pytest.mark.parametrize("name", list(commands.SUBCOMMANDS))
def test_each_subcommand_help_names_itself(name):
    code, out, _ = _run([name, "--help"])
    assert code == 0
    assert out.startswith(f"usage: bertforge {name} ")


def test_a_subcommand_keeps_its_errors_and_exit_status(tmp_path):
    """A bad flag: exit 2 and the subcommand's own did-you-mean, under its new name."""
    code, _, err = _run(["export", str(tmp_path), "--outptu", "x"])
    assert code == 2
    assert "bertforge export: error: unrecognized argument --outptu; did you mean --output?" in err
    assert "see `bertforge export --help`" in err
    code, _, err = _run(["inspect", str(tmp_path / "missing")])
    assert code == 2 and "manifest.json" in err


def test_help_starts_no_torch():
    """`bertforge --help` imports no tool (measured: ~0.3 s, torch alone takes seconds)."""
    probe = "import sys; from bertforge import commands; commands.main(['--help']); "
    probe += "assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, timeout=120)


def test_shipped_files_resolve_from_any_folder(tmp_path, monkeypatch):
    """The default --ds_config and the recipes are found from outside the checkout; a file of
    that name in the current folder wins."""
    monkeypatch.chdir(tmp_path)
    assert checkout_file("ds_configs/cpu.json") == REPO / "ds_configs" / "cpu.json"
    assert checkout_file("recipes/demo.yaml") == REPO / "recipes" / "demo.yaml"
    (tmp_path / "ds_configs").mkdir()
    (tmp_path / "ds_configs" / "cpu.json").write_text("{}")
    assert checkout_file("ds_configs/cpu.json") == Path("ds_configs/cpu.json")
    assert checkout_file("nothing/here.json") == Path("nothing/here.json")


def test_runs_from_any_folder(tmp_path, english_corpus):
    """`python -m bertforge` with neither the checkout as the current folder nor its root on
    sys.path: only `bertforge` itself is importable (as an editable install maps it; here a
    link to this checkout's, so the test runs this checkout's code whichever one is installed)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "bertforge").symlink_to(REPO / "bertforge")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "bertforge", *args],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    shown = run("export", "--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: bertforge export"), shown
    # a build with worker processes (they import the main module again: it must not rerun)
    shards = tmp_path / "shards"
    built = run(
        "prep",
        "build",
        "--input",
        str(english_corpus),
        "--output",
        str(shards),
        "--vocab_size",
        "2000",
        "--validation_fraction",
        "0.05",
        "--workers",
        "2",
    )
    assert built.returncode == 0, built.stderr
    assert "wrote" in built.stdout and (shards / "manifest.json").is_file()
    inspected = run("inspect", str(shards), "--samples", "1")
    assert inspected.returncode == 0, inspected.stderr
    assert "train" in inspected.stdout and "validation" in inspected.stdout


def test_a_model_card_repeats_the_command_as_typed():
    """A run launched as `bertforge train` (or `python -m bertforge train`) is shown so in the
    card, a script as `python SCRIPT`."""
    from bertforge.pretrain.export.model_card import _command

    script = ["/venv/bin/bertforge", "train", "--data", "s"]
    assert _command(script, 1) == "bertforge train --data s"
    module = ["/src/bertforge/__main__.py", "train", "--data", "s"]
    assert _command(module, 1) == "bertforge train --data s"
    assert _command(["pretrain/main.py", "--local_rank=0", "--data", "s"], 2).endswith(
        "\npython pretrain/main.py --data s"
    )
