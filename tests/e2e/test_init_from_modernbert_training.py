"""--arch modernbert --init_from through the trainer: a run started from a transformers ModernBERT
folder (whose 64 positions the shards' 128 tokens exceed: a context extension) trains, and its
config.json's report lists every tensor of the folder as loaded; a second run started from that
run (our own checkpoint as the source) holds its weights exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers.commands import train_cli
from helpers.tiny_bert import build_tiny_modernbert
from safetensors.torch import load_file

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict, find_latest

pytestmark = pytest.mark.slow


def _train(shards: Path, run: Path, init_from: Path, *extra: str):
    # No --model: the architecture comes from the --init_from checkpoint.
    return train_cli(
        run,
        "--data",
        str(shards),
        "--arch",
        "modernbert",
        "--init_from",
        str(init_from),
        "--global_batch_size",
        "4",
        "--micro_batch_size",
        "2",
        *extra,
    )


def test_modernbert_run_from_a_transformers_folder_then_from_that_run(english_shards, tmp_path):
    hf = build_tiny_modernbert(tmp_path / "hf", tokenizer_dir=english_shards / "tokenizer")
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    run = tmp_path / "run"
    proc = _train(english_shards, run, hf, "--max_steps", "3")
    assert "initialised from" in proc.stdout and "context extension" in proc.stdout
    config = json.loads((run / "config.json").read_text())
    report = config["init_from"]
    assert sorted(report["loaded"]) == sorted(load_file(str(hf / "model.safetensors")))
    assert report["newly_initialised"] == [] and report["ignored"] == []
    assert report["vocabulary"]["relation"] == "identical"
    model_cfg = config["model_cfg"]  # the checkpoint's architecture, 128 positions now
    assert model_cfg["arch"] == "modernbert" and model_cfg["hidden_size"] == 32
    assert model_cfg["local_attention"] == 8 and model_cfg["max_position_embeddings"] == 128
    losses = [r["loss"] for r in read_metrics(run / "metrics.jsonl", "train")]
    assert len(losses) == 3 and all(math.isfinite(x) and 0 < x < 20 for x in losses)

    # our own run as the source; lr 0: its one step leaves the loaded weights as they were
    again = tmp_path / "again"
    _train(english_shards, again, run, "--max_steps", "1", "--lr", "0")
    report = json.loads((again / "config.json").read_text())["init_from"]
    assert report["kind"] == "run" and report["newly_initialised"] == []
    source = consolidated_state_dict(find_latest(run / "checkpoints"))
    loaded = consolidated_state_dict(find_latest(again / "checkpoints"))
    assert set(report["loaded"]) <= set(source)
    for key in report["loaded"]:
        assert torch.equal(loaded[key].float(), source[key].float()), key
