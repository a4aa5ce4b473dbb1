"""--phases end to end: a three-phase plan (batch ramp 8 -> 16 on --data; stable on a build of
the same text at sequence 256; linear decay on a new mixture at another mask rate) on two CPU
ranks (ZeRO-2), resumed from a checkpoint inside each phase (the first just before the batch
change): every following step's loss equals the uninterrupted run's bit for bit. Four launches;
the doctor's view of such a plan (no launch).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.commands import REPO, run_cli
from helpers.launch import COMMON, launch, losses
from helpers.shards import build_shards

from bertforge.data_prep.reader import ShardReader
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config.phase_plan import load_phase_file, plan_schedule, resolve
from bertforge.pretrain.run_folder.run_checkpoints import list_complete

pytestmark = pytest.mark.slow
LR = 1e-3
# --warmup_steps would contradict the plan (refused): the plan's warmup phase replaces it
FLAGS = [a for i, a in enumerate(COMMON) if "--warmup_steps" not in COMMON[max(i - 1, 0) : i + 1]]


def plan_doc(seq_len: int, general: Path, long: Path, domain: Path) -> dict:
    """Ramp on --data, stable on `long` (sequences of 256), then a decay on a general + domain
    mixture (each phase's stream starts at its own beginning) at mask rate 0.3."""
    mixture = [f"general={general}:1", f"domain={domain}:1"]
    return {
        "phases": [
            {
                "name": "ramp",
                "steps": 3,
                "lr": "warmup",
                "batch": {"start": 8, "increment": 8, "ramp_tokens": 16 * seq_len},
            },
            {"name": "stable", "steps": 3, "lr": "constant", "data": str(long)},
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
def long_shards(english_corpus, english_shards, tmp_path_factory) -> Path:
    """The same text at sequence 256, with english_shards' tokenizer."""
    out = tmp_path_factory.mktemp("long") / "shards_256"
    tok = str(english_shards / "tokenizer")
    return build_shards(english_corpus, out, tokenizer=tok, max_seq_len=256, workers=1)


@pytest.fixture(scope="module")
def phased(english_shards, long_shards, english_second_source, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("phases")
    seq_len = ShardReader(english_shards).max_seq_len
    plan = tmp / "plan.json"
    doc = plan_doc(seq_len, english_shards, long_shards, english_second_source)
    plan.write_text(json.dumps(doc))
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
    # the stable phase trains on sequences of 256 (more tokens per sample), the others on 128
    per_sample = [r["tokens"] / r["samples"] for r in recs]
    assert max(per_sample[3:6]) > 128 >= max(per_sample[:3] + per_sample[6:])
    # the decay on its own mixture: both sources in each of its steps, none before it
    assert not any("share_domain" in r for r in recs[:6])
    for r in recs[6:]:
        assert r["share_general"] + r["share_domain"] == pytest.approx(1.0)
        assert 0.2 < r["share_domain"] < 0.8
    # validation covers --data and the phase's new source (the general one is --data's folder)
    val = read_metrics(run / "metrics.jsonl", "validation")
    names = {"shards", "shards_256", "domain", None}
    assert {r.get("source") for r in val if r["step"] == 9} == names
    saved = json.loads((run / "phases.json").read_text())
    plan = resolve(
        load_phase_file(phased["plan"]),
        path=str(phased["plan"]),
        global_batch=16,
        micro_batch=4,
        world_size=2,
        seq_len=lambda data: 256 if data and "256" in data[0] else phased["seq_len"],
    )
    assert saved["total_steps"] == 9 == plan[-1].end_step
    assert [(p["start_step"], p["end_step"]) for p in saved["phases"]] == [(0, 3), (3, 6), (6, 9)]
    # each phase with data of its own starts its stream at its first step's consumed samples
    assert [p["data_start"] for p in saved["phases"]] == [0, 8 + 8 + 16, 8 + 8 + 16 * 4]
    assert [p["seq_len"] for p in saved["phases"]] == [128, 256, 128]
    assert json.loads((run / "config.json").read_text())["phases"] == saved
    # a record's lr is the optimizer's after its step: the next step's (0-based s = record step)
    for r in recs[:-1]:
        assert r["lr"] == pytest.approx(LR * plan_schedule(plan)(r["step"]))


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


def test_doctor_sizes_memory_by_the_longest_phase_and_checks_its_folders(phased, tmp_path):
    def doctor(plan: Path) -> list[dict]:
        proc = run_cli(
            "-m", "pretrain.doctor", "--json", "--ds_config", str(REPO / "ds_configs/cpu.json"),
            "--data", str(phased["shards"]), "--output_dir", str(tmp_path / "run"),
            "--global_batch_size", "16", "--micro_batch_size", "4", "--slots", "2",
            "--phases", str(plan), check=False,
        )  # fmt: skip
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        return json.loads(proc.stdout)

    rows = doctor(phased["plan"])
    (row,) = [r for r in rows if r["check"] == "phases"]
    assert row["status"] == "ok" and "global batch 8 to 16" in row["detail"]
    assert "longest sequences 256 tokens in phase 'stable'" in row["detail"]
    assert "x 256 tokens" in next(r["detail"] for r in rows if r["check"] == "memory")
    data = {r["detail"].split(":")[0]: r["status"] for r in rows if r["check"] == "data"}
    assert len(data) == 3 and set(data.values()) == {"ok"}  # --data and the phases' two folders
    # a phase's missing folder fails the data check; a bad key fails the phases check by name
    doc = json.loads(phased["plan"].read_text())
    doc["phases"][1]["data"] = str(tmp_path / "absent")
    (tmp_path / "gone.json").write_text(json.dumps(doc))
    rows = doctor(tmp_path / "gone.json")
    assert {"FAIL"} == {r["status"] for r in rows if str(tmp_path / "absent") in r["detail"]}
    doc["phases"][1] = {"name": "stable", "steps": 3, "lr": "flat"}
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    (row,) = [r for r in doctor(tmp_path / "bad.json") if r["check"] == "phases"]
    assert row["status"] == "FAIL" and "phase 2 ('stable'), key 'lr'" in row["detail"]
