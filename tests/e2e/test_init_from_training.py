"""--init_from through the trainer: the first validation of a run started from a transformers
folder equals what transformers computes for that model on the same masked batches, the report
lands in config.json, and a later --resume auto wins over --init_from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.commands import (
    REPO,  # noqa: E402
    run_cli,
    train_cli,
)

from bertforge.pretrain.components.metrics import read_metrics

pytestmark = pytest.mark.slow


def _hf_folder(shards: Path, out: Path) -> Path:
    """A BertForMaskedLM written by transformers itself, with the shards' tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tok = AutoTokenizer.from_pretrained(str(shards / "tokenizer"))
    torch.manual_seed(7)
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            max_position_embeddings=128,
        )
    )
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def _train(shards: Path, run: Path, *extra: str):
    # No --model: the architecture comes from the --init_from checkpoint.
    return train_cli(
        run, "--data", str(shards), "--global_batch_size", "8", "--micro_batch_size", "8", *extra
    )


def _transformers_val_loss(hf: Path, shards: Path, run_config: dict, batches: int) -> float:
    """Summed token loss / masked tokens over the run's validation batches, by transformers."""
    import torch.nn.functional as F
    from transformers import BertForMaskedLM

    from bertforge.data_prep.reader import ShardReader
    from bertforge.kernels.constants import IGNORE_INDEX
    from bertforge.pretrain.data.loader import DataConfig, build_loader
    from bertforge.pretrain.data.masking import MaskingConfig

    model = BertForMaskedLM.from_pretrained(str(hf)).eval()
    loader = build_loader(
        ShardReader(shards, "validation"),
        DataConfig(**run_config["data_cfg"]),
        MaskingConfig(**run_config["masking"]),
        micro_batch_size=8,
        train=False,
    )
    total, count = 0.0, 0
    with torch.no_grad():
        for _, mb in zip(range(batches), loader):
            logits = model(
                input_ids=mb["input_ids"],
                attention_mask=mb["attention_mask"],
                token_type_ids=mb.get("token_type_ids"),
            ).logits
            labels = mb["labels"]
            total += float(
                F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]).double(),
                    labels.reshape(-1),
                    ignore_index=IGNORE_INDEX,
                    reduction="sum",
                )
            )
            count += int((labels != IGNORE_INDEX).sum())
    return total / count


def test_init_from_transformers_folder_then_resume_wins(english_shards, tmp_path):
    hf = _hf_folder(english_shards, tmp_path / "hf")
    run = tmp_path / "run"
    # lr 0: the one step leaves the weights as loaded, so the final validation scores them.
    proc = _train(english_shards, run, "--init_from", str(hf), "--max_steps", "1", "--lr", "0")
    assert "initialised from" in proc.stdout and "newly initialised" in proc.stdout
    config = json.loads((run / "config.json").read_text())
    report = config["init_from"]
    assert "bert.embeddings.word_embeddings.weight" in report["loaded"]
    assert config["model_cfg"]["hidden_size"] == 64  # the architecture came from the checkpoint
    val = read_metrics(run / "metrics.jsonl", "validation")[-1]
    expected = _transformers_val_loss(hf, english_shards, config, batches=2)
    assert val["val_loss"] == pytest.approx(expected, rel=1e-5)

    # A relaunch that still says --init_from resumes instead (weights are not re-applied).
    proc = _train(
        english_shards,
        run,
        "--init_from",
        str(hf),
        "--max_steps",
        "2",
        "--lr",
        "1e-3",
        "--resume",
        "auto",
    )
    assert "--init_from" in proc.stdout and "not applied: resuming" in proc.stdout
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]
    assert json.loads((run / "config.json").read_text())["init_from"] == report


def test_init_from_refuses_flags_that_disagree(english_shards, tmp_path):
    hf = _hf_folder(english_shards, tmp_path / "hf")
    proc = run_cli(
        str(REPO / "pretrain" / "main.py"),
        "--data",
        str(english_shards),
        "--output_dir",
        str(tmp_path / "run"),
        "--init_from",
        str(hf),
        "--hidden_size",
        "256",
        check=False,
    )
    assert proc.returncode == 2
    assert "hidden_size: checkpoint 64, flags 256" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
