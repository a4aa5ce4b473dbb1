"""--downstream_eval during pretraining: background evaluations of the checkpoints land in
metrics.jsonl at their steps and leave the training itself exactly as without them; with
glue:DIR:TASKS, GLUE's tasks scored the run_glue way, with tokens, hours and a plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.commands import train_cli

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.run_folder.run_checkpoints import list_complete, tag_for

pytestmark = pytest.mark.slow


def _train(shards: Path, run: Path, *extra: str):
    return train_cli(
        run,
        "--data",
        str(shards),
        "--model",
        "tiny",
        "--global_batch_size",
        "8",
        "--micro_batch_size",
        "8",
        "--max_steps",
        "4",
        "--save_interval",
        "2",
        *extra,
    )


def test_downstream_records_at_checkpoint_steps_and_training_unchanged(english_shards, tmp_path):
    from benchmarks.tasks.pydoc_tasks import write_tasks

    tasks = write_tasks(tmp_path / "tasks", topics=2, per_topic=20)
    spec = json.loads(tasks.read_text())
    spec["tasks"] = spec["tasks"][:1]  # the topic task only, a short recipe: keeps the test short
    spec["tasks"][0]["recipe"] = {"lrs": [1e-3], "min_steps": 10}
    tasks.write_text(json.dumps(spec))

    with_eval, without = tmp_path / "with", tmp_path / "without"
    proc = _train(
        english_shards,
        with_eval,
        "--downstream_eval",
        str(tasks),
        "--downstream_interval",
        "2",
        "--downstream_max_examples",
        "40",
        # Step 4's save prunes step 2 while step 2's job is still starting up: the job's lease
        # keeps it until the job has read it; the end of the run prunes it (leases.py).
        "--keep_last",
        "1",
    )
    assert "downstream evaluation of step 2 started" in proc.stdout
    assert f"keeping {with_eval / 'checkpoints' / tag_for(2)} beyond --keep_last" in proc.stdout
    assert [s for s, _ in list_complete(with_eval / "checkpoints")] == [4]
    assert not list((with_eval / "checkpoints").rglob(".leases"))
    _train(english_shards, without)

    down = read_metrics(with_eval / "metrics.jsonl", "downstream")
    assert sorted({r["step"] for r in down}) == [2, 4]
    assert {r["task"] for r in down} == {"pydoc_topic"}
    assert all(0.0 <= r["value"] <= 1.0 for r in down)
    ours = {r["step"]: r["loss"] for r in read_metrics(with_eval / "metrics.jsonl")}
    ref = {r["step"]: r["loss"] for r in read_metrics(without / "metrics.jsonl")}
    assert ours == ref  # bit for bit: the jobs read checkpoints, not the live run


def test_downstream_interval_must_fall_on_checkpoints(english_shards, tmp_path, capsys):
    from bertforge.pretrain.config.cli import parse_args

    tasks = tmp_path / "tasks.json"
    tasks.write_text("{}")
    with pytest.raises(SystemExit):
        parse_args(
            [
                "--data",
                str(english_shards),
                "--downstream_eval",
                str(tasks),
                "--downstream_interval",
                "3",
                "--save_interval",
                "2",
            ]
        )
    assert "must be a multiple of --save_interval" in capsys.readouterr().err


def test_glue_records_with_tokens_and_hours_and_the_plot(english_shards, tmp_path):
    """One checkpoint (step 2) scored on a tiny GLUE-layout folder: RTE's and STS-B's records
    with the reported names and evaluate's metric names, no GLUE score (2 of its 8 tasks)."""
    from benchmarks.tasks.glue_like import write_glue_like

    glue = write_glue_like(tmp_path / "glue", train=16, dev=8)
    run = tmp_path / "run"
    proc = _train(
        english_shards,
        run,
        "--max_steps",
        "2",
        "--downstream_eval",
        f"glue:{glue}:RTE,STS-B",
        "--downstream_interval",
        "2",
        "--downstream_max_examples",
        "12",
    )
    assert "downstream evaluation of step 2 started" in proc.stdout
    down = read_metrics(run / "metrics.jsonl", "downstream")
    assert [(r["task"], r["metric"]) for r in down] == [
        ("RTE", "accuracy"),
        ("STS-B", "pearson"),
        ("STS-B", "spearmanr"),
    ]
    train = read_metrics(run / "metrics.jsonl")
    for r in down:
        assert r["step"] == 2 and r["benchmark"] == "glue" and -1.0 <= r["value"] <= 1.0
        assert (r["train"], r["test"], r["lr"], r["seed"]) == (12, 8, 2e-5, 42)  # run_glue
        assert r["tokens"] == sum(x["tokens"] for x in train if x["step"] <= 2) > 0
        assert 0 < r["hours"] < 1
    assert (run / "downstream" / "glue_vs_tokens.png").stat().st_size > 10_000


def test_a_bad_glue_spec_is_refused_at_launch(english_shards, tmp_path, capsys):
    from benchmarks.tasks.glue_like import write_glue_like
    from bertforge.pretrain.config.cli import parse_args

    glue = write_glue_like(tmp_path / "glue", train=4, dev=2)
    for spec, says in (
        (f"glue:{glue}:RTE,QNLI", f"{glue} does not hold QNLI"),
        (f"clue:{glue}", "holds no CLUE task"),
        (str(tmp_path / "tasks.json"), "no such tasks file (or give glue:DIR"),
    ):
        argv = ["--data", str(english_shards), "--downstream_eval", spec]
        with pytest.raises(SystemExit):
            parse_args([*argv, "--downstream_interval", "2", "--save_interval", "2"])
        err = capsys.readouterr().err
        assert f"--downstream_eval {spec}: " in err and says in err
