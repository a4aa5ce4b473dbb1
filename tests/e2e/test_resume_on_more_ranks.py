"""Resume on a larger world size: a one-process checkpoint continued on two DeepSpeed ranks.

(tests/e2e/test_two_rank_training.py covers 2 -> 1.) The data order and the masks are functions of
the global sample position only, the same for any world size; with dropout off, nothing else draws
random numbers, so the two-rank continuation must give the one-process run's own losses, up to the
order of floating-point sums (gradients are all-reduced across ranks instead of accumulated in
one process): fp32, relative tolerance 1e-5 (measured differences are around 1e-7).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.commands import REPO
from helpers.launch import launch

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.run_folder.run_checkpoints import MARKER, find_latest, read_state, tag_for

pytestmark = pytest.mark.slow


def train_args(shards: Path, run: Path) -> list[str]:
    return [
        "--ds_config",
        str(REPO / "ds_configs" / "cpu.json"),
        "--data",
        str(shards),
        "--output_dir",
        str(run),
        "--model",
        "tiny",
        "--hidden_dropout_prob",
        "0",
        "--attention_probs_dropout_prob",
        "0",
        "--num_workers",
        "0",
        "--progress",
        "false",
        "--global_batch_size",
        "16",
        "--micro_batch_size",
        "4",
        "--lr",
        "1e-3",
        "--warmup_steps",
        "1",
        "--max_steps",
        "6",
        "--save_interval",
        "3",
        "--eval_batches",
        "2",
    ]


def test_resume_one_rank_onto_two(english_shards, tmp_path):
    one, two = tmp_path / "one_rank", tmp_path / "two_ranks"
    # --eval_batches counts global batches: 2 validate the same 32 sequences on 1 rank and on 2.
    launch(train_args(english_shards, one), nproc=1)  # checkpoints 3, 6
    (two / "checkpoints").mkdir(parents=True)
    shutil.copytree(one / "checkpoints" / tag_for(3), two / "checkpoints" / tag_for(3))
    proc = launch(train_args(english_shards, two) + ["--resume", "auto"], nproc=2)
    assert "at step 3 (48 samples consumed; saved on 1 ranks, now 2)" in proc.stdout + proc.stderr
    assert (two / "checkpoints" / "universal" / tag_for(3) / MARKER).is_file()
    ref = {r["step"]: r for r in read_metrics(one / "metrics.jsonl")}
    got = {r["step"]: r for r in read_metrics(two / "metrics.jsonl")}
    assert sorted(got) == [4, 5, 6]
    for step in (4, 5, 6):
        assert got[step]["consumed_samples"] == ref[step]["consumed_samples"] == 16 * step
        assert got[step]["lr"] == pytest.approx(ref[step]["lr"], rel=1e-12)
        for key in ("loss", "grad_norm", "mlm_accuracy"):
            assert got[step][key] == pytest.approx(ref[step][key], rel=1e-5), (step, key)
    val = [read_metrics(r / "metrics.jsonl", "validation")[-1]["val_loss"] for r in (one, two)]
    assert val[1] == pytest.approx(val[0], rel=1e-5)
    final = find_latest(two / "checkpoints")
    assert final.name == tag_for(6) and read_state(final)["world_size"] == 2
