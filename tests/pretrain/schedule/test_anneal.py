"""--anneal_from RUN@STEP --anneal_tokens N (pretrain.schedule.anneal), as a user runs it.

One source run (wsd, a checkpoint every step) and one anneal from its step 2 of the stable phase:
the anneal's first step uses the source's lr at step 2 and the source's Adam state, data position
and RNG, so it must give bit for bit the weights the source itself had after its step 3; then the
lr follows the closed-form decay to the floor; the source folder is byte-identical afterwards; a
``--resume auto`` of the anneal with its last checkpoint gone ends with the same weights. Bad
inputs are unit tests, failing before any rendezvous with the flag named.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from helpers.commands import train_cli
from helpers.ema import check_ema_of_run

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config.cli import parse_args
from bertforge.pretrain.config.flag_checks import AnnealError, check_anneal_flags
from bertforge.pretrain.config.schedule import Schedule, anneal, decay_curve
from bertforge.pretrain.config.train_config import RunConfig
from bertforge.pretrain.export.model_card import _anneal, card_facts
from bertforge.pretrain.run_folder.run_checkpoints import CheckpointError
from bertforge.pretrain.schedule.anneal import parse_anneal_from, source_checkpoint

SIZES = ("--global_batch_size", "4", "--micro_batch_size", "4", "--eval_batches", "1")


def _train(shards, run, *extra: str):
    return train_cli(run, "--data", str(shards), "--model", "tiny", *SIZES, *extra)


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _module(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt / "mp_rank_00_model_states.pt", weights_only=False)["module"]


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = _module(a), _module(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_an_anneal_continues_the_source_exactly_then_decays_to_the_floor(
    english_shards, chinese_shards, tmp_path, capsys
):
    source = tmp_path / "source"
    _train(
        english_shards,
        source,
        *"--max_steps 4 --lr 1e-3 --warmup_steps 1 --schedule wsd --decay_steps 2".split(),
        *"--save_interval 1 --keep_last 10".split(),
    )
    before = _hashes(source)
    seq_len = json.loads((english_shards / "manifest.json").read_text())["max_seq_len"]
    tokens = 3 * 4 * seq_len - 5  # ceil: 3 steps of 4 sequences
    anneal = tmp_path / "anneal"
    flags = ["--anneal_from", f"{source}@2", "--anneal_tokens", str(tokens)]
    flags += ["--min_lr_ratio", "0.1", "--save_interval", "1", "--keep_last", "10"]
    flags += ["--ema", "0.9"]  # the EMA is checked on this launch too (helpers.ema)
    proc = _train(english_shards, anneal, *flags)
    assert f"anneal from {source} step 2: 3 steps" in proc.stdout

    assert _hashes(source) == before  # only read (the load's lease is gone again)
    assert not (source / "checkpoints" / "step_00000002" / ".leases").exists()
    src_ckpts, ann_ckpts = source / "checkpoints", anneal / "checkpoints"
    # Step 1 of the anneal is step 3 of the source: same weights, Adam state, data, RNG, lr.
    assert _same_weights(ann_ckpts / "step_00000001", src_ckpts / "step_00000003")
    assert not _same_weights(ann_ckpts / "step_00000002", src_ckpts / "step_00000004")

    src_lr = {r["step"]: r["lr"] for r in read_metrics(source / "metrics.jsonl")}
    got = {r["step"]: r["lr"] for r in read_metrics(anneal / "metrics.jsonl")}
    start, floor = src_lr[2], 0.1 * 1e-3  # the lr the source set after step 2: its peak
    assert start == pytest.approx(1e-3, rel=1e-12)
    # A record's lr is the one set for the next step: floor + (start - floor) c(k / 3).
    want = {k: floor + (start - floor) * decay_curve("1-sqrt", k / 3) for k in (1, 2, 3)}
    assert got == pytest.approx(want, rel=1e-12)
    assert got[3] == pytest.approx(floor, rel=1e-12)

    state = json.loads((ann_ckpts / "step_00000003" / "trainer_state.json").read_text())
    plan = state["anneal_from"]
    assert (plan["source_step"], plan["steps"], plan["same_data"]) == (2, 3, True)
    assert plan["consumed_samples"] == plan["start_samples"] == 8
    assert state["consumed_samples"] == 8 + 3 * 4
    assert json.loads((anneal / "config.json").read_text())["anneal_from"] == plan
    line = _anneal(card_facts(anneal, state)["anneal_from"])[0]
    assert line.startswith(f"- annealed from `{source}` step 2 for {tokens:,} tokens on ")

    # --resume auto of the anneal, its last checkpoint lost: the same end, bit for bit.
    again = tmp_path / "again"
    shutil.copytree(anneal, again, ignore=shutil.ignore_patterns("step_00000003", ".lock"))
    (again / "checkpoints" / "latest").write_text("step_00000002")
    resumed = _train(english_shards, again, *flags, "--resume", "auto")
    assert "ignored" not in resumed.stdout, resumed.stdout  # no flag is ignored: same schedule
    assert _same_weights(again / "checkpoints" / "step_00000003", ann_ckpts / "step_00000003")
    check_ema_of_run(anneal, again, steps=3, decay=0.9, no_ema=source)

    # The dry run prints the anneal: source, steps, lr start -> floor.
    from bertforge.pretrain import main as trainer_main

    dry = ["--data", str(english_shards), "--output_dir", str(tmp_path / "dry"), *SIZES, *flags]
    assert trainer_main.main([*dry, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert f"anneal from {source} step 2: 3 steps" in printed
    assert f"lr {start:.4g} -> {floor:.4g} (1-sqrt)" in printed

    # Before any rendezvous: another vocabulary, and a run folder that holds checkpoints.
    from bertforge.pretrain.build import resolve_run

    other = parse_args(
        ["--data", str(chinese_shards), "--output_dir", str(tmp_path / "zh")] + flags
    )
    with pytest.raises(CheckpointError, match="tokenizer fingerprint"):
        resolve_run(other)
    # a fresh anneal into the anneal's own folder is refused before anything is written
    with pytest.raises(SystemExit):
        parse_args(["--data", str(english_shards), "--output_dir", str(anneal)] + flags)
    assert "continue it with --resume auto" in capsys.readouterr().err


def test_the_anneal_schedule_starts_at_its_ratio_and_reaches_the_floor():
    s = anneal(start_ratio=0.8, total_steps=10, shape="linear", min_ratio=0.1)
    assert s(0) == 0.8 and s(10) == pytest.approx(0.1) and s(20) == pytest.approx(0.1)
    assert s(5) == pytest.approx(0.1 + 0.7 * 0.5)
    # A checkpoint's saved fields rebuild this schedule on resume, named an anneal.
    assert Schedule.from_saved(dict(vars(s))) == s and s.kind == "anneal"
    c = anneal(1.0, 4, "1-sqrt", 0.0)
    assert c(1) == pytest.approx(1.0 - math.sqrt(0.25))


def test_bad_anneal_inputs_name_the_flag(tmp_path):
    for spec in ("run", "run@", "@3", "run@x"):
        with pytest.raises(AnnealError, match="RUN@STEP"):
            parse_anneal_from(spec)
    with pytest.raises(AnnealError, match="not a run folder"):
        source_checkpoint(f"{tmp_path / 'nothing'}@2")
    partial = tmp_path / "run" / "checkpoints" / "step_00000002"
    partial.mkdir(parents=True)
    with pytest.raises(AnnealError, match="incomplete"):
        source_checkpoint(f"{tmp_path / 'run'}@2")
    with pytest.raises(AnnealError, match=r"no checkpoint of step 5.*steps none"):
        source_checkpoint(f"{tmp_path / 'run'}@5")
    with pytest.raises(AnnealError, match="drop --init_from"):
        check_anneal_flags(RunConfig(anneal_from="r@1", anneal_tokens=10, init_from="x"), False)
    with pytest.raises(AnnealError, match="drop --max_steps"):
        check_anneal_flags(RunConfig(anneal_from="r@1", anneal_tokens=10), True)
    with pytest.raises(AnnealError, match="needs --anneal_tokens"):
        check_anneal_flags(RunConfig(anneal_from="r@1"), False)
    with pytest.raises(AnnealError, match="goes with --anneal_from"):
        check_anneal_flags(RunConfig(anneal_tokens=10), False)


def test_the_command_line_refuses_max_steps_with_anneal_from(tmp_path, capsys):
    argv = ["--data", str(tmp_path), "--anneal_from", "r@1", "--anneal_tokens", "9"]
    with pytest.raises(SystemExit):
        parse_args([*argv, "--max_steps", "5"])
    assert "drop --max_steps" in capsys.readouterr().err
