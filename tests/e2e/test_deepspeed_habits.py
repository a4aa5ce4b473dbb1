"""Habits users bring to a training run (issue 17): logs without carriage returns, DeepSpeed's own
``latest`` / ``zero_to_fp32.py`` on our checkpoints, a model card, the CSV monitor.

One single-rank ZeRO-2 run (plain lines, CSV monitor, validation every 2 steps) serves most
checks; a ZeRO-3 run serves the ZeRO-3 conversion. Both are tiny and one process each.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.commands import REPO

from bertforge.pretrain.checkpoints.resume import LATEST_FILE
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.run_folder.run_checkpoints import find_latest, list_complete

pytestmark = pytest.mark.slow
STEPS = 4


def _ds_config(tmp: Path, stage: int, csv_dir: str | None = None) -> Path:
    cfg = json.loads((REPO / "ds_configs" / "cpu.json").read_text())
    cfg["zero_optimization"] = {
        "stage": stage,
        "overlap_comm": False,
        "stage3_param_persistence_threshold": 1000,
    }
    cfg["tensorboard"] = {"enabled": False}
    if csv_dir is not None:
        cfg["csv_monitor"] = {"enabled": True, "output_path": csv_dir, "job_name": "run"}
    path = tmp / f"z{stage}.json"
    path.write_text(json.dumps(cfg))
    return path


def _train(shards: Path, tmp: Path, stage: int, *extra: str) -> subprocess.CompletedProcess:
    run = tmp / "run"
    cmd = [
        sys.executable,
        "pretrain/main.py",
        "--data",
        str(shards),
        "--output_dir",
        str(run),
        "--model",
        "tiny",
        "--num_workers",
        "0",
        "--global_batch_size",
        "4",
        "--micro_batch_size",
        "4",
        "--lr",
        "1e-3",
        "--warmup_steps",
        "1",
        "--max_steps",
        str(STEPS),
        "--save_interval",
        "2",
        "--keep_last",
        "1",
        "--eval_batches",
        "2",
        *extra,
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"training failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def zero2_run(english_shards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("habits_z2")
    # A relative csv_monitor path lands in the run folder, not in the launch directory.
    proc = _train(
        english_shards,
        tmp,
        2,
        "--ds_config",
        str(_ds_config(tmp, 2, "csv")),
        "--progress",
        "lines",
        "--log_interval",
        "2",
        "--eval_interval",
        "2",
    )
    return tmp / "run", proc, tmp / "run" / "csv" / "run"


@pytest.fixture(scope="module")
def zero3_run(english_shards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("habits_z3")
    _train(english_shards, tmp, 3, "--ds_config", str(_ds_config(tmp, 3)), "--progress", "false")
    return tmp / "run"


def test_a_log_gets_plain_lines_at_the_log_interval(zero2_run):
    _run, proc, _ = zero2_run
    assert "\r" not in proc.stderr and "\r" not in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("train ")]
    steps = [int(re.match(r"train (\d+)/4 step", ln).group(1)) for ln in lines]
    assert steps == [2, 4], lines
    for ln in lines:
        for field in ("loss ", "lr ", "tok_s ", "step/s", "elapsed", "ETA"):
            assert field in ln, ln
    loss_at_2 = next(r["loss"] for r in read_metrics(_run / "metrics.jsonl") if r["step"] == 2)
    assert f"loss {loss_at_2:.4g} " in lines[0]


def test_latest_names_the_newest_complete_checkpoint(zero2_run):
    run = zero2_run[0]
    ckpts = run / "checkpoints"
    assert [s for s, _ in list_complete(ckpts)] == [STEPS]  # keep_last 1 pruned step 2
    assert (ckpts / LATEST_FILE).read_text() == find_latest(ckpts).name


def _zero_to_fp32_without_tag(run: Path, out: Path) -> dict[str, torch.Tensor]:
    """DeepSpeed's copied script, as its users run it: in checkpoints/, no --tag."""
    ckpts = run / "checkpoints"
    proc = subprocess.run(
        [sys.executable, "zero_to_fp32.py", ".", str(out)],
        cwd=ckpts,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out / "pytorch_model.bin", map_location="cpu", weights_only=True)


def _matches_export(run: Path, sd: dict[str, torch.Tensor], tmp: Path) -> None:
    """The script's weights, mapped to transformers' names, equal the exported folder's."""
    from safetensors.torch import load_file

    from bertforge.pretrain.export.hf_export import export
    from bertforge.pretrain.export.hf_extras import POOLER_KEYS
    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.registry import build_model
    from bertforge.pretrain.run_folder.run_checkpoints import read_state

    export(run, tmp / "hf", verify=False)
    state = read_state(find_latest(run / "checkpoints"))
    model = build_model(ModelConfig(**state["config"]["model_cfg"]), int(state["vocab_size"]))
    model.load_state_dict(sd, strict=False)
    ours = model.hf_state_dict(unpad_vocab=True)
    exported = load_file(str(tmp / "hf" / "model.safetensors"))
    for key in POOLER_KEYS:  # initialised at export (issue 36.9), not trained
        exported.pop(key)
    assert exported.keys() <= ours.keys()
    for k, v in exported.items():
        torch.testing.assert_close(ours[k], v, rtol=0, atol=0, msg=k)


def test_zero_to_fp32_without_tag_matches_export_zero2(zero2_run, tmp_path):
    run = zero2_run[0]
    _matches_export(run, _zero_to_fp32_without_tag(run, tmp_path / "fp32"), tmp_path)


def test_zero_to_fp32_without_tag_matches_export_zero3(zero3_run, tmp_path):
    _matches_export(zero3_run, _zero_to_fp32_without_tag(zero3_run, tmp_path / "fp32"), tmp_path)


def test_model_card_numbers_equal_metrics(zero2_run, tmp_path):
    from bertforge.pretrain.export.hf_export import main as export_main

    run = zero2_run[0]
    out = tmp_path / "hf"
    assert (
        export_main(
            [
                str(run),
                "--output",
                str(out),
                "--no_verify",
                "--language",
                "en",
                "--dataset",
                "pydoc-corpus",
            ]
        )
        == 0
    )
    card = (out / "README.md").read_text()
    header = card.split("---")[1]
    assert '- "en"' in header and '- "pydoc-corpus"' in header and "license:" in header
    train = read_metrics(run / "metrics.jsonl")
    val = [r for r in read_metrics(run / "metrics.jsonl", "validation") if "source" not in r][-1]
    assert val["step"] == STEPS
    assert f"- steps: {STEPS:,}" in card
    assert f"- tokens seen: {int(sum(r['tokens'] for r in train)):,}" in card
    assert f"| {val['val_loss']} | {val['val_accuracy']} | {val['val_perplexity']} |" in card
    argv = json.loads((run / "config.json").read_text())["argv"]
    assert argv[0] == "pretrain/main.py" and "--max_steps" in argv
    assert "python pretrain/main.py --data " in card
    assert "mask_prob 0.15" in card


def test_csv_monitor_gets_validation_and_masking(zero2_run):
    run, _, csv_dir = zero2_run
    val = [r for r in read_metrics(run / "metrics.jsonl", "validation") if "source" not in r]
    with open(csv_dir / "Validation_loss.csv", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "loss"]
    assert [float(r[1]) for r in rows[1:]] == pytest.approx([r["val_loss"] for r in val])
    assert (csv_dir / "Validation_perplexity.csv").is_file()
    assert (csv_dir / "Train_mask_selected_fraction.csv").is_file()
    assert (csv_dir / "Train_loss.csv").is_file()
