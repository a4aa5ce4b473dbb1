"""pretrain.demo: `make demo` end to end at 8 steps, its argument handling, plan and
frequent-token guesser (the 1,200-step demo's numbers in the README come from `make demo`)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from helpers.commands import REPO, run_cli
from helpers.tiny_bert import build_tiny_bert
from tokenizers import Tokenizer

from bertforge.data_prep.reader import ShardReader
from bertforge.pretrain.demo import (
    MARKER,
    DemoError,
    frequent_token_guess,
    prepare_output,
    write_corpus,
)


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_make_demo_runs_every_step_end_to_end(tmp_path):
    """The README's `make demo`, shortened to 8 steps of 8 sequences (the steps and the batch
    are the demo's flags; what is checked is that every step runs and writes its output, which
    needs no length): text -> shards -> doctor -> 2-rank training, stop and resume -> export ->
    fill-mask -> plots, each step's output where the summary says. (.ci/run checks /dev/shm
    after the whole suite: other tests' jobs run beside.)"""
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    proc = subprocess.run(
        ["make", "--no-print-directory", "demo", "INSTALL=", f"PYTHON={sys.executable}",
         f"DEMO_DIR={out}",
         "DEMO_ARGS=--steps 8 --eval_interval 4 --warmup_steps 2 --global_batch_size 8"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / MARKER).read_text())
    assert summary["status"] == "done"
    assert list(summary["timings_s"]) == [
        "shards", "doctor", "train steps 1-4", "resume steps 5-8", "export", "fill-mask", "plot"
    ]  # fmt: skip
    assert [v["step"] for v in summary["validation"]] == [4, 8]
    assert "resumed from" in (out / "logs" / "04_resume.log").read_text().lower()
    fills = json.loads(Path(summary["paths"]["fill_mask"]).read_text())
    assert len(fills) == 5 and all(len(f["predictions"]) == 3 for f in fills)
    assert summary["plots"] and all(Path(p).stat().st_size > 0 for p in summary["plots"])
    assert (Path(summary["paths"]["hf"]) / "model.safetensors").is_file()


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
    # Both launches run recipes/demo.yaml; the same schedule in both: constant lr after warmup,
    # so stopping changes nothing.
    recipe = Path(train[train.index("--recipe") + 1])
    assert recipe == REPO / "recipes" / "demo.yaml" and resume.count(str(recipe)) == 1
    assert yaml.safe_load(recipe.read_text())["optim"]["decay"] == "constant"
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


def test_frequent_token_guess_is_the_top_tokens_share_of_validation(english_shards):
    """With every maskable token masked, the guesser's accuracy is the validation share of the
    training split's most frequent non-special token, counted here straight from the shards."""
    reader = ShardReader(english_shards)
    special = set(reader.special_tokens.values())
    counts = Counter(t for sample in reader for t in sample.input_ids.tolist() if t not in special)
    top = counts.most_common(1)[0][0]
    val = [
        t
        for sample in ShardReader(english_shards, split="validation")
        for t in sample.input_ids.tolist()
        if t not in special
    ]
    masking = {"mask_prob": 1.0, "mask_token_frac": 0.8, "random_token_frac": 0.1}
    guess = frequent_token_guess(english_shards, masking)
    tokenizer = Tokenizer.from_file(str(english_shards / "tokenizer" / "tokenizer.json"))
    assert guess["token"] == tokenizer.id_to_token(top)
    assert guess["masked_tokens"] == len(val)
    assert guess["accuracy"] == pytest.approx(val.count(top) / len(val))


def test_fill_mask_on_your_own_sentences(tmp_path):
    """--fill_mask HF_DIR --sentences FILE: one result per sentence, top_k predictions each, the
    model's own mask token put in; a sentence without exactly one [MASK] is refused by line."""
    model = build_tiny_bert(tmp_path / "bert")
    sentences = tmp_path / "domain.txt"
    sentences.write_text(
        "# domain sentences\nThe [MASK] header names the character set.\n\n"
        "A dict {key: value} maps a [MASK] to a value.\n",
        encoding="utf-8",
    )
    out = tmp_path / "fill.json"
    run_cli(
        "-m", "pretrain.demo", "--fill_mask", str(model), "--sentences", str(sentences),
        "--top_k", "5", "--fill_mask_out", str(out),
    )  # fmt: skip
    results = json.loads(out.read_text())
    assert [r["sentence"] for r in results] == [
        "The [MASK] header names the character set.",
        "A dict {key: value} maps a [MASK] to a value.",
    ]
    assert all(len(r["predictions"]) == 5 for r in results)
    sentences.write_text("The [MASK] header.\nNo mask here.\n", encoding="utf-8")
    bad = run_cli("-m", "pretrain.demo", "--fill_mask", str(model), "--sentences", str(sentences),
                  check=False)  # fmt: skip
    assert bad.returncode == 2
    assert f"--sentences {sentences}, line 2: write exactly one [MASK]" in bad.stderr
