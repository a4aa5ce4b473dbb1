"""pretrain.demo's argument handling and plan (the demo itself runs in CI as `make demo`)."""

from __future__ import annotations

import shlex

import pytest
from helpers.commands import run_cli

from pretrain.demo import MARKER, DemoError, prepare_output, write_corpus


def test_plan_lists_every_step_with_its_command(tmp_path):
    out = tmp_path / "demo"
    proc = run_cli("-m", "pretrain.demo", "--output_dir", str(out), "--plan", "--steps", "40")
    lines = proc.stdout.splitlines()
    names = [line[2:] for line in lines if line.startswith("# ")]
    assert names == [
        "shards",
        "doctor",
        "train steps 1-20",
        "resume steps 21-40",
        "export",
        "fill-mask",
        "plot",
    ]
    cmds = {n: shlex.split(c) for n, c in zip(names, (x for x in lines if not x.startswith("# ")))}
    train, resume = cmds["train steps 1-20"], cmds["resume steps 21-40"]
    assert (
        train[train.index("--max_steps") + 1] == "20"
        and train[train.index("--resume") + 1] == "none"
    )
    assert (
        resume[resume.index("--max_steps") + 1] == "40"
        and resume[resume.index("--resume") + 1] == "auto"
    )
    assert "--num_gpus" in train and train[train.index("--num_gpus") + 1] == "2"
    # Same schedule in both launches: constant lr after warmup, so stopping changes nothing.
    assert train[train.index("--decay") + 1] == "constant"
    assert not out.exists()  # --plan writes nothing


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "1"], "--steps must be at least 2"),
        (["--ranks", "3"], "--global_batch_size 32 must be a multiple of --ranks 3"),
        (["--ds_config", "/nonexistent.json"], "--ds_config /nonexistent.json: no such file"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, args, message):
    proc = run_cli("-m", "pretrain.demo", "--output_dir", str(tmp_path / "d"), *args, check=False)
    assert proc.returncode == 2 and message in proc.stderr


def test_output_dir_of_someone_else_is_not_overwritten(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "precious.txt").write_text("keep me")
    with pytest.raises(DemoError, match="was not made by the demo"):
        prepare_output(theirs)
    assert (theirs / "precious.txt").read_text() == "keep me"
    ours = tmp_path / "ours"
    prepare_output(ours)
    (ours / "old_run").mkdir()
    prepare_output(ours)  # a previous demo folder is redone from scratch
    assert sorted(p.name for p in ours.iterdir()) == [MARKER]


def test_corpus_is_the_pydoc_topics(tmp_path):
    from pydoc_data.topics import topics

    docs, size = write_corpus(tmp_path / "c.txt")
    text = (tmp_path / "c.txt").read_text()
    assert docs == sum(1 for t in topics.values() if t.strip()) and size > 300_000
    assert "\n\n\n" not in text and text.count("\n\n") == docs  # one blank line per document
    assert 'The "assert" statement' in text
