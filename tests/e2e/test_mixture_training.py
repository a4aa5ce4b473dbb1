"""A weighted mixture through the trainer: per-source validation records next to the overall
one, the realised share of each source in every step, and incompatible sources refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.commands import (
    REPO,  # noqa: E402
    run_cli,
    train_cli,
)

from bertforge.pretrain.components.metrics import read_metrics

pytestmark = pytest.mark.slow


def _train(run: Path, *args: str, check: bool = True):
    return train_cli(
        run,
        "--model",
        "tiny",
        "--global_batch_size",
        "10",
        "--micro_batch_size",
        "10",
        *args,
        check=check,
    )


@pytest.fixture(scope="module")
def mixture_run(english_shards, english_second_source, tmp_path_factory) -> Path:
    """4 steps of a 0.7/0.3 mixture (the second source at its own mask rate), validating at 2
    and 4; its final checkpoint is also the one a resume under other weights starts from."""
    run = tmp_path_factory.mktemp("mixture") / "run"
    _train(
        run,
        "--data",
        f"en={english_shards}:0.7",
        f"docs={english_second_source}:0.3:0.25",
        "--max_steps",
        "4",
        "--eval_interval",
        "2",
    )
    return run


def test_mixture_trains_with_per_source_validation_and_shares(mixture_run, tmp_path):
    run = mixture_run
    train = read_metrics(run / "metrics.jsonl")
    assert len(train) == 4
    shares = [r["share_en"] for r in train]
    assert all(abs(s - 0.7) <= 0.1 for s in shares)  # 7 of every 10 samples, spread evenly
    assert all(r["share_en"] + r["share_docs"] == pytest.approx(1.0) for r in train)
    val = read_metrics(run / "metrics.jsonl", "validation")
    by_step = {}
    for r in val:
        by_step.setdefault(r["step"], []).append(r.get("source", "overall"))
    assert by_step == {2: ["en", "docs", "overall"], 4: ["en", "docs", "overall"]}
    per = {(r["step"], r.get("source")): r for r in val}
    overall, en, docs = per[(4, None)], per[(4, "en")], per[(4, "docs")]
    assert en["val_masked_tokens"] > 0 and docs["val_masked_tokens"] > 0
    assert overall["val_masked_tokens"] == en["val_masked_tokens"] + docs["val_masked_tokens"]
    mixed = en["val_loss"] * en["val_masked_tokens"] + docs["val_loss"] * docs["val_masked_tokens"]
    assert overall["val_loss"] == pytest.approx(mixed / overall["val_masked_tokens"])
    from bertforge.pretrain.plot import main as plot_main

    assert plot_main([str(run / "metrics.jsonl"), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "sources.png").stat().st_size > 10_000
    state = json.loads(next((run / "checkpoints").glob("step_*/trainer_state.json")).read_text())
    assert [s["name"] for s in state["data_mixture"]] == ["en", "docs"]
    assert state["data_mixture"][1]["mask_prob"] == 0.25


def test_mixture_of_other_tokenizers_is_refused(english_shards, chinese_shards, tmp_path):
    proc = _train(
        tmp_path / "run",
        "--data",
        f"en={english_shards}:0.5",
        f"zh={chinese_shards}:0.5",
        "--max_steps",
        "1",
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "tokenizer fingerprint differs" in proc.stderr and str(chinese_shards) in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_resume_under_another_mixture_warns(
    mixture_run, english_shards, english_second_source, tmp_path
):
    """The data position is one sample count: under other weights it points into another
    stream, so a resume that changes the mixture says so (and goes on). It resumes a copy of
    the mixture run (0.7/0.3) under 0.5/0.5."""
    run = tmp_path / "run"
    shutil.copytree(mixture_run, run)
    proc = _train(
        run, "--data", f"en={english_shards}:0.5", f"docs={english_second_source}:0.5",
        "--max_steps", "5", "--resume", "auto",
    )  # fmt: skip
    assert "--data differs from the checkpoint's" in proc.stdout
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4, 5]


def test_doctor_checks_every_source_of_a_mixture(english_shards, english_second_source, tmp_path):
    missing = tmp_path / "absent"
    proc = run_cli(
        "-m", "pretrain.doctor", "--json", "--ds_config", str(REPO / "ds_configs" / "cpu.json"),
        "--data", f"en={english_shards}:0.5", f"docs={english_second_source}:0.3",
        f"gone={missing}:0.2", "--output_dir", str(tmp_path / "run"), check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    rows = [r for r in json.loads(proc.stdout) if r["check"] == "data"]
    by_folder = {r["detail"].split(":")[0]: r["status"] for r in rows}
    assert by_folder == {
        str(english_shards): "ok",
        str(english_second_source): "ok",
        str(missing): "FAIL",
    }
