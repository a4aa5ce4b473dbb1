"""--attention document through the trainer: three DeepSpeed steps of BERT on one process, the
training and validation batches carrying document ids, the mode recorded in the run's config."""

from __future__ import annotations

import json
import math

import pytest
from helpers.commands import train_cli

from bertforge.pretrain.components.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_bert_trains_with_document_attention(english_shards, tmp_path):
    run = tmp_path / "run"
    train_cli(
        run,
        "--data",
        str(english_shards),
        "--attention",
        "document",
        "--max_steps",
        "3",
        "--global_batch_size",
        "4",
        "--micro_batch_size",
        "2",
    )
    config = json.loads((run / "config.json").read_text())
    assert (config["model_cfg"]["arch"], config["model_cfg"]["attention"]) == ("bert", "document")
    losses = [r["loss"] for r in read_metrics(run / "metrics.jsonl", "train")]
    assert len(losses) == 3 and all(0 < x < 20 for x in losses)
    evals = read_metrics(run / "metrics.jsonl", "validation")
    assert evals and all(math.isfinite(r["val_loss"]) for r in evals)
