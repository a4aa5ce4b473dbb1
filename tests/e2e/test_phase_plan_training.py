"""--phases end to end: a three-phase plan (batch ramp 8 -> 16, stable, linear decay on a new
mixture at another mask rate) on two CPU ranks (ZeRO-2), resumed from a checkpoint inside each
phase (the first just before the batch change): every following step's loss equals the
uninterrupted run's bit for bit. Four launches.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.commands import REPO, run_cli
from helpers.launch import COMMON, launch, losses

from data_prep.reader import ShardReader
from pretrain.components.metrics import read_metrics
from pretrain.components.resume import list_complete
from pretrain.config.phase_plan import load_phase_file, lr_multiplier, resolve

pytestmark = pytest.mark.slow
LR = 1e-3
# --warmup_steps would contradict the plan (refused): the plan's warmup phase replaces it
FLAGS = [a for i, a in enumerate(COMMON) if "--warmup_steps" not in COMMON[max(i - 1, 0) : i + 1]]


def plan_doc(seq_len: int, general: Path, domain: Path) -> dict:
    """Ramp, stable, then a decay on a general + domain mixture (its stream starts at its own
    beginning) at mask rate 0.3."""
    mixture = [f"general={general}:1", f"domain={domain}:1"]
    return {
        "phases": [
            {
                "name": "ramp",
                "steps": 3,
                "lr": "warmup",
                "batch": {"start": 8, "increment": 8, "ramp_tokens": 16 * seq_len},
            },
            {"name": "stable", "steps": 3, "lr": "constant"},
            {
                "name": "decay",
                "steps": 3,
                "lr": "linear",
                "min_lr_ratio": 0.1,
                "mask_prob": 0.3,
                "data": mixture,
            },
        ]
    }


def train(run: Path, shards: Path, plan: Path, *extra: str) -> None:
    launch(
        [
            "--ds_config",
            str(REPO / "ds_configs" / "cpu.json"),
            "--data",
            str(shards),
            "--output_dir",
            str(run),
            "--phases",
            str(plan),
            "--save_interval",
            "1",
            "--keep_last",
            "20",
            *FLAGS,
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def phased(english_shards, english_second_source, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("phases")
    seq_len = ShardReader(english_shards).max_seq_len
    plan = tmp / "plan.json"
    plan.write_text(json.dumps(plan_doc(seq_len, english_shards, english_second_source)))
    run = tmp / "run"
    train(run, english_shards, plan)
    return {"run": run, "plan": plan, "shards": english_shards, "tmp": tmp, "seq_len": seq_len}


def test_records_plan_file_and_lr_follow_the_plan(phased):
    run = phased["run"]
    recs = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in recs] == list(range(1, 10))
    assert [r["phase"] for r in recs] == ["ramp"] * 3 + ["stable"] * 3 + ["decay"] * 3
    # Megatron's ramp: 8, 8 (consumed 8 < 16 per increment), then the target 16
    assert [r["samples"] for r in recs] == [8, 8] + [16] * 7
    assert [r["consumed_samples"] for r in recs][-1] == 8 + 8 + 16 * 7
    # the decay phase masks at 0.3 (the rate of this step's masks, as the loader drew them)
    assert [r["mask_mask_prob"] for r in recs] == pytest.approx([0.15] * 6 + [0.3] * 3)
    # ... on its own mixture: both sources in each of its steps, none before it
    assert not any("share_domain" in r for r in recs[:6])
    for r in recs[6:]:
        assert r["share_general"] + r["share_domain"] == pytest.approx(1.0)
        assert 0.2 < r["share_domain"] < 0.8
    # validation covers --data and the phase's new source (the general one is --data's folder)
    val = read_metrics(run / "metrics.jsonl", "validation")
    assert {r.get("source") for r in val if r["step"] == 9} == {"shards", "domain", None}
    saved = json.loads((run / "phases.json").read_text())
    plan = resolve(
        load_phase_file(phased["plan"]),
        path=str(phased["plan"]),
        global_batch=16,
        micro_batch=4,
        world_size=2,
        seq_len=lambda data: phased["seq_len"],  # both builds: 128
    )
    assert saved["total_steps"] == 9 == plan[-1].end_step
    assert [(p["start_step"], p["end_step"]) for p in saved["phases"]] == [(0, 3), (3, 6), (6, 9)]
    # the decay's stream starts at its first step's consumed samples
    assert [p["data_start"] for p in saved["phases"]] == [0, 0, 8 + 8 + 16 * 4]
    assert json.loads((run / "config.json").read_text())["phases"] == saved
    # a record's lr is the optimizer's after its step: the next step's (0-based s = record step)
    for r in recs[:-1]:
        assert r["lr"] == pytest.approx(LR * lr_multiplier(plan, r["step"]))


@pytest.mark.parametrize("resume_after", [2, 4, 7])  # before the batch change; stable; decay
def test_resume_inside_each_phase_is_bit_identical(phased, resume_after):
    full = losses(phased["run"])
    run = phased["tmp"] / f"resumed_{resume_after}"
    shutil.copytree(phased["run"], run)
    for step, folder in list_complete(run / "checkpoints"):
        if step > resume_after:
            shutil.rmtree(folder)
    (run / "checkpoints" / "latest").unlink(missing_ok=True)
    (run / "metrics.jsonl").unlink()
    train(run, phased["shards"], phased["plan"], "--resume", "auto")
    again = losses(run)
    assert sorted(again) == list(range(resume_after + 1, 10))
    assert all(again[s] == full[s] for s in again), (again, full)


def test_export_of_the_final_checkpoint(phased, tmp_path):
    out = tmp_path / "hf"
    run_cli("-m", "pretrain.export", str(phased["run"]), "--output", str(out))
    assert (out / "config.json").is_file()
