"""A run's recipe reproduces it, a resume's dry run shows the schedule that will run, and every
shipped recipe resolves (issue 35). One-process CPU runs on the pydoc shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers.commands import REPO, train_cli
from helpers.launch import losses

from bertforge.pretrain.config.cli import parse_args

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
SMALL = ("--max_steps", "3", "--global_batch_size", "8", "--micro_batch_size", "8")


@pytest.fixture(scope="module")
def trained(english_shards, tmp_path_factory) -> Path:
    """A 3-step run at lr 2e-3 (cpu.json says 5e-4) with a checkpoint at its end."""
    run = tmp_path_factory.mktemp("recipe") / "a"
    train_cli(run, "--data", str(english_shards), *SMALL, "--lr", "2e-3", "--warmup_steps", "1")
    return run


def _dry_run(capsys, *argv: str) -> dict:
    from bertforge.pretrain.main import main

    assert main([*argv, "--dry-run", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_the_runs_recipe_yaml_reproduces_its_losses_exactly(trained, tmp_path):
    recipe = yaml.safe_load((trained / "recipe.yaml").read_text())
    assert recipe["optim"]["lr"] == 2e-3 and recipe["optim"]["warmup_steps"] == 1
    assert recipe["batch"] == {
        "global_batch_size": 8,
        "micro_batch_size": 8,
        "grad_accum": 1,
        "batch_ramp_start": 0,
        "batch_ramp_fraction": 0.6,
    }
    assert "output_dir" not in recipe["run"] and "resume" not in recipe["run"]
    again = tmp_path / "b"
    train_cli(again, "--recipe", str(trained / "recipe.yaml"))
    first, second = losses(trained), losses(again)
    assert sorted(first) == [1, 2, 3] and first == second  # bit-identical, step by step


def test_a_resumes_dry_run_shows_the_checkpoints_schedule(trained, capsys):
    # Before: it printed this launch's flags' schedule (here peak 1e-3, warmup 4), which a
    # resume does not follow.
    report = _dry_run(
        capsys,
        "--recipe",
        str(trained / "recipe.yaml"),
        "--output_dir",
        str(trained),
        "--resume",
        "auto",
        "--max_steps",
        "8",
        "--warmup_steps",
        "4",
        "--lr",
        "1e-3",
    )
    sched = report["lr_schedule"]
    assert sched["peak_lr"] == 2e-3
    assert [(p["phase"], p["start"], p["end"]) for p in sched["phases"]][0] == ("warmup", 0, 1)
    assert "its schedule continues (3 steps)" in sched["note"]
    assert "this launch stops at step 8" in sched["note"]
    lines = {e["key"]: e for e in report["recipe"]}
    assert lines["optim.lr"]["value"] == 2e-3
    assert lines["optim.lr"]["source"].startswith("checkpoint ")
    assert lines["run.max_steps"] == {
        "key": "run.max_steps",
        "value": 8,
        "source": "flag --max_steps",
    }


def test_an_override_without_lr_keeps_the_checkpoints_peak(trained, english_shards, capsys):
    # Before: the peak fell back to the DeepSpeed JSON's (0.0005 for a run trained at 0.002).
    report = _dry_run(
        capsys,
        "--data",
        str(english_shards),
        "--output_dir",
        str(trained),
        "--resume",
        "auto",
        "--override_lr_schedule",
        *SMALL[:2],
        "--max_steps",
        "6",
        *SMALL[2:],
    )
    assert report["lr_schedule"]["peak_lr"] == 2e-3
    lines = {e["key"]: e for e in report["recipe"]}
    assert lines["optim.lr"]["source"].startswith("checkpoint ")


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_every_shipped_recipe_resolves(recipe, english_shards, tmp_path, capsys):
    """Each recipe's settings resolve as a launch would (batch plan for its batch, precision,
    schedule, model, --init_from's architecture) on the test shards; the demo's is a full dry
    run. GPU precisions fall back to fp32 here; an --init_from folder is a tiny one."""
    from bertforge.pretrain.build import resolve_run

    values = yaml.safe_load(recipe.read_text())
    argv = ["--recipe", str(recipe), "--data", str(english_shards)]
    argv += ["--output_dir", str(tmp_path / "run"), "--allow_precision_fallback", "true"]
    init = values["run"].get("init_from")
    if init:
        from helpers.tiny_bert import build_tiny_bert, build_tiny_modernbert

        modern = values.get("model", {}).get("arch") == "modernbert"
        folder = (build_tiny_modernbert if modern else build_tiny_bert)(tmp_path / "init")
        argv += ["--init_from", str(folder)]
    if recipe.stem == "demo":
        report = _dry_run(capsys, *argv)
        lines = {e["key"]: e["source"] for e in report["recipe"]}
        assert lines["optim.lr"] == f"recipe {recipe}"
        assert report["lr_schedule"]["peak_lr"] == values["optim"]["lr"]
        return
    run = resolve_run(parse_args(argv))
    assert run.cfg.run.max_steps == values["run"]["max_steps"]
    assert run.setup.batch.global_batch == values["batch"]["global_batch_size"]
    assert run.setup.config["optimizer"]["params"]["lr"] == values["optim"]["lr"]
    for key, value in values.get("model", {}).items():
        assert getattr(run.cfg.model_cfg, key) == value, key
