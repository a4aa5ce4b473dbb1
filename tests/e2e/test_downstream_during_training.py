"""--downstream_eval during pretraining: background evaluations of the checkpoints land in
metrics.jsonl at their steps and leave the training itself exactly as without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.commands import train_cli

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.model.run_checkpoints import list_complete, tag_for

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
