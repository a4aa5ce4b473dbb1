"""--arch modernbert through the trainer: three DeepSpeed steps on the CPU config, then an export
that transformers loads as ModernBertForMaskedLM with the trained model's masked-row logits; a
launch that asks for BERT refuses that run as --init_from (one without --arch takes the run's
architecture) and as a checkpoint to resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.commands import train_cli

from bertforge.errors import USER_ERROR_EXIT
from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.export.hf_export import export, find_checkpoint
from bertforge.pretrain.model.bert import ModelConfig
from bertforge.pretrain.model.registry import build_model
from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def modernbert_run(english_shards, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("modernbert") / "run"
    train_cli(
        run,
        "--data",
        str(english_shards),
        "--arch",
        "modernbert",
        "--local_attention",
        "32",  # shorter than the shards' 128 tokens: the local layers use their window
        "--max_steps",
        "3",
        "--global_batch_size",
        "4",
        "--micro_batch_size",
        "2",
    )
    return run


def test_trains_and_exports_a_folder_transformers_loads(modernbert_run, english_shards, tmp_path):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    config = json.loads((modernbert_run / "config.json").read_text())
    assert config["model_cfg"]["arch"] == "modernbert"
    assert config["model_cfg"]["name"] == "modernbert-tiny"
    assert config["model_cfg"]["attention"] == "document"  # --attention auto for modernbert
    losses = [r["loss"] for r in read_metrics(modernbert_run / "metrics.jsonl", "train")]
    assert len(losses) == 3 and all(0 < x < 20 for x in losses)

    res = export(modernbert_run, tmp_path / "hf")  # also reloads it and runs fill-mask
    assert res["architecture"] == "ModernBertForMaskedLM" and res["fill_mask"]
    assert '\n- "modernbert"\n' in (tmp_path / "hf" / "README.md").read_text()  # card's tags
    hf, info = AutoModelForMaskedLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert type(hf).__name__ == "ModernBertForMaskedLM" and not any(info.values()), info
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (hf.config.pad_token_id, hf.config.cls_token_id, hf.config.sep_token_id) == (
        tok.pad_token_id,
        tok.cls_token_id,
        tok.sep_token_id,
    )
    assert hf.config.local_attention == 32 and hf.config.vocab_size == len(tok)

    ckpt = find_checkpoint(modernbert_run)
    state = json.loads((ckpt / "trainer_state.json").read_text())
    ours = build_model(ModelConfig(**state["config"]["model_cfg"]), int(state["vocab_size"]))
    ours.load_state_dict(consolidated_state_dict(ckpt), strict=False)
    ours.eval()
    hf.eval()
    enc = tok(["The function returns a list of values.", "Raise an error."], padding=True)
    ids = torch.tensor(enc["input_ids"])
    mask = torch.tensor(enc["attention_mask"])
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, 1:4] = ids[:, 1:4]
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits[labels != IGNORE_INDEX]
    torch.testing.assert_close(
        ours.predict_masked(ids, mask, None, labels), ref, rtol=1e-5, atol=1e-5
    )


def test_a_bert_launch_refuses_the_modernbert_run(modernbert_run, english_shards, capsys):
    from bertforge.pretrain.main import main

    data = ["--data", str(english_shards), "--dry-run"]
    # --init_from a modernbert run into a launch that asks for bert names both archs; without
    # --arch the architecture comes from the run; resuming under another --arch is another model.
    init = ["--init_from", str(modernbert_run)]
    assert main([*data, *init, "--arch", "bert"]) == USER_ERROR_EXIT
    assert "is a --arch modernbert run, but this run is --arch bert" in capsys.readouterr().err
    assert main([*data, *init, "--json"]) == 0
    model = json.loads(capsys.readouterr().out)["config"]["model"]
    assert (model["arch"], model["attention"], model["local_attention"]) == (
        "modernbert",
        "document",
        32,
    )
    resume = ["--output_dir", str(modernbert_run), "--resume", "auto"]
    assert main([*data, *resume]) == USER_ERROR_EXIT
    assert "model.arch = 'modernbert' (checkpoint) != 'bert'" in capsys.readouterr().err


def test_a_phase_raises_the_global_rope_theta_and_resumes_exactly(english_shards, tmp_path):
    """--phases with rope_theta (ModernBERT's context extension: global theta 10k -> 160k):
    applied from the phase's first step, set again by a resume inside the phase (losses
    bit-identical), and the export's config carries the theta the weights were trained at."""
    from helpers.launch import losses

    from bertforge.pretrain.run_folder.run_checkpoints import list_complete

    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "phases": [
                    {"name": "short", "steps": 2, "lr": "constant"},
                    {"name": "extend", "steps": 3, "lr": "linear", "rope_theta": 160000},
                ]
            }
        )
    )
    flags = [
        "--data", str(english_shards), "--arch", "modernbert", "--local_attention", "32",
        "--global_rope_theta", "10000", "--phases", str(plan), "--global_batch_size", "4",
        "--micro_batch_size", "2", "--save_interval", "1", "--keep_last", "10",
    ]  # fmt: skip
    run = tmp_path / "run"
    proc = train_cli(run, *flags)
    assert "step 3: global rope theta 160000" in proc.stdout + proc.stderr
    full = losses(run)
    for step, folder in list_complete(run / "checkpoints"):
        if step > 3:
            import shutil

            shutil.rmtree(folder)
    (run / "checkpoints" / "latest").unlink(missing_ok=True)
    (run / "metrics.jsonl").unlink()
    train_cli(run, *flags, "--resume", "auto")
    again = losses(run)
    assert sorted(again) == [4, 5] and all(again[s] == full[s] for s in again), (again, full)
    out = tmp_path / "hf"
    export(run, out, verify=False)
    conf = json.loads((out / "config.json").read_text())
    assert conf["rope_parameters"]["full_attention"]["rope_theta"] == 160000
    assert conf["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000
