"""Every trainer feature with --arch modernbert (issue 24, item 5), in as few launches as possible.

(a) Two ranks, the shipped ZeRO-3 bf16 config, torch activation checkpointing, whole-word
    masking, a mixture of two shard folders, --share_layers all, dropout on: six steps with a
    checkpoint every two, then --resume auto from step 4 in a copy: the resumed losses and the
    final validation are bit-identical (dropout draws from the restored per-rank RNG, the data
    from the restored position). The ZeRO-3 checkpoint exports to a folder that transformers'
    ModernBertForMaskedLM loads and that predicts what our model predicts.
(b) Two ranks, ZeRO-2 fp16 (the CPU capability patch of tests/helpers/fp16_main.py), DeepSpeed
    activation checkpointing, the stability guard with a planned loss spike (skipped, recorded).
    (--share_layers with DeepSpeed's checkpoint under ZeRO-3 is refused: test_modernbert.py.)
(c) (a)'s step-4 checkpoint resumed on one rank (universal conversion of ZeRO-3 shards with
    shared layers) under a --max_time_hours budget: the data position and lr carry over, and the
    run ends at the budget with a final validation and a "budget" checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.commands import REPO
from helpers.launch import copy_without_last_checkpoint, ds_config, guard_actions, launch, losses

from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config import command_line
from bertforge.pretrain.run_folder.run_checkpoints import (
    STATE_FILE,
    consolidated_state_dict,
    find_latest,
    list_complete,
    read_state,
    tag_for,
)

pytestmark = pytest.mark.slow

HELPERS = REPO / "tests" / "helpers"
BATCH = 8  # global batch: 2 ranks x micro-batch 2 x accumulation 2


def modernbert_args(run: Path, config: Path, data: list[str], **flags) -> list[str]:
    """A modernbert-tiny launch (window 32 < the shards' 128 tokens) with small batches."""
    values = {
        "ds_config": config,
        "output_dir": run,
        "arch": "modernbert",
        "local_attention": 32,
        "num_workers": 0,
        "progress": False,
        "global_batch_size": BATCH,
        "micro_batch_size": 2,
        "lr": 1e-3,
        "warmup_steps": 1,
        "decay": "constant",
        "eval_batches": 1,
        **flags,
    }
    return ["--data", *data, *command_line.flags(values, switches=False)]


def zero3_args(folder: Path, sources: list[str], *extra: str) -> list[str]:
    """(a)'s launch into ``folder``: ZeRO-3 bf16, torch checkpointing, whole words, the
    mixture ``sources``, every layer sharing one set of weights, dropout on."""
    return modernbert_args(
        folder,
        REPO / "ds_configs" / "zero3_bf16.json",
        sources,
        activation_checkpointing="torch",
        whole_word=True,
        share_layers="all",
        hidden_dropout_prob=0.1,  # ModernBERT's presets have none: make the RNG matter
        attention_probs_dropout_prob=0.1,
        max_steps=6,
        save_interval=2,
        keep_last=5,
    ) + list(extra)


@pytest.fixture(scope="module")
def zero3(english_shards, english_second_source, tmp_path_factory) -> dict:
    """(a): the reference run to step 6 and its resume from step 4 in a copy."""
    tmp = tmp_path_factory.mktemp("modernbert_zero3")
    run, resumed = tmp / "run", tmp / "resumed"
    sources = [f"en={english_shards}:0.7", f"docs={english_second_source}:0.3"]
    launch(zero3_args(run, sources))
    copy_without_last_checkpoint(run, resumed, 6)
    proc = launch(zero3_args(resumed, sources, "--resume", "auto"))
    return {"run": run, "resumed": resumed, "sources": sources, "tmp": tmp,
            "out": proc.stdout + proc.stderr}  # fmt: skip


def test_a_zero3_bf16_run_with_every_data_and_model_feature(zero3):
    run = zero3["run"]
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["precision_resolved"] == "bf16"
    assert cfg["deepspeed"]["zero_optimization"]["stage"] == 3
    assert cfg["activation_checkpointing"] == "torch"
    assert cfg["model_cfg"]["arch"] == "modernbert" and cfg["model_cfg"]["share_layers"] == "all"
    assert cfg["masking"]["whole_word"] is True
    train = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert all(0 < r["loss"] < 20 and r["share_en"] + r["share_docs"] == 1 for r in train)
    # Whole words: multi-piece words are selected as one unit (a token per unit otherwise).
    units, selected = (
        sum(r[k] for r in train) for k in ("mask_whole_word_units", "mask_selected_tokens")
    )
    assert 0 < units < selected
    val = read_metrics(run / "metrics.jsonl", "validation")
    assert [r.get("source", "all") for r in val if r["step"] == 6] == ["en", "docs", "all"]
    assert [s for s, _ in list_complete(run / "checkpoints")] == [2, 4, 6]


def test_a_resume_is_bit_identical(zero3):
    assert f"resumed from {zero3['resumed'] / 'checkpoints' / tag_for(4)}" in zero3["out"]
    ref, got = losses(zero3["run"]), losses(zero3["resumed"])
    assert sorted(got) == [5, 6]
    assert {s: got[s] for s in got} == {s: ref[s] for s in got}  # bf16, same ranks: exact
    val = [read_metrics(zero3[r] / "metrics.jsonl", "validation") for r in ("run", "resumed")]
    assert val[1][-1]["val_loss"] == val[0][-1]["val_loss"]


def test_a_zero3_export_loads_in_transformers_and_predicts_like_our_model(zero3, tmp_path):
    import transformers

    from bertforge.pretrain.export.hf_export import export
    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.registry import build_model

    run, out = zero3["run"], tmp_path / "hf"
    res = export(run, out)  # also reloads the folder and runs fill-mask
    assert res["step"] == 6 and res["share_layers"] == "all"
    hf, info = transformers.ModernBertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    layers = hf.model.layers  # every layer's weights written out, the shared ones as copies
    torch.testing.assert_close(layers[2].attn.Wqkv.weight, layers[0].attn.Wqkv.weight)
    torch.testing.assert_close(layers[2].attn_norm.weight, layers[1].attn_norm.weight)
    ckpt = find_latest(run / "checkpoints")
    state = read_state(ckpt)
    ours = build_model(ModelConfig(**state["config"]["model_cfg"]), int(state["vocab_size"]))
    ours.load_state_dict(consolidated_state_dict(ckpt), strict=False)  # shared copies agree
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok(["A class definition is an executable statement.", "Return a list."],
              return_tensors="pt", padding=True)  # fmt: skip
    labels = torch.where(enc["attention_mask"].bool(), enc["input_ids"], IGNORE_INDEX)
    ours.eval(), hf.eval()
    with torch.no_grad():
        want = ours.predict_masked(enc["input_ids"], enc["attention_mask"], None, labels)
        got = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
    torch.testing.assert_close(got[labels != IGNORE_INDEX], want, atol=1e-5, rtol=1e-5)


def test_b_zero2_fp16_deepspeed_checkpointing_and_the_guard(english_shards, tmp_path):
    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8,
            "loss_scale_window": 1000, "hysteresis": 1, "min_loss_scale": 1}  # fmt: skip
    run = tmp_path / "run"
    args = modernbert_args(
        run, ds_config(tmp_path, "fp16.json", fp16=fp16), [str(english_shards)],
        activation_checkpointing="deepspeed", guard_min_history=3, max_steps=6, save_interval=3,
    )  # fmt: skip
    launch(args, script=HELPERS / "fp16_main.py", env={"BERTFORGE_FAULTS": "loss_spike@5"})
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["precision_resolved"] == "fp16" and cfg["activation_checkpointing"] == "deepspeed"
    assert cfg["deepspeed"]["zero_optimization"]["stage"] == 2
    (event,) = guard_actions(run)
    assert (event["step"], event["event"], event["action"]) == (5, "loss_spike", "skip")
    assert event["skipped_samples"] == [4 * BATCH, 5 * BATCH]
    train = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    assert sorted(train) == list(range(1, 7)) and train[1]["loss_scale"] == 256.0
    assert train[5]["skipped"] and not train[6]["skipped"] and train[6]["skipped_total"] == 1
    assert train[6]["loss"] < 1.2 * event["median"]  # the spike's update was not applied
    state = json.loads((run / "checkpoints" / tag_for(6) / STATE_FILE).read_text())
    assert [e["step"] for e in state["guard"]["events"]] == [5]


def test_c_resume_two_ranks_to_one_under_a_time_budget(zero3):
    run = zero3["tmp"] / "one_rank"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = zero3["run"] / "checkpoints" / tag_for(4)
    shutil.copytree(ckpt, run / "checkpoints" / tag_for(4))
    spent = read_state(ckpt)["elapsed_s"]
    hours = (spent + 12.0) / 3600  # 12 s more than the checkpoint had spent (start-up included)
    # (a)'s flags, the budget ending the run long before this later --max_steps would
    extra = ["--resume", "auto", "--max_steps", "100000", "--max_time_hours", f"{hours:.8f}"]
    proc = launch(zero3_args(run, zero3["sources"], *extra), nproc=1)
    out = proc.stdout + proc.stderr
    assert "saved on 2 ranks, now 1" in out and "time budget" in out
    ref = {r["step"]: r for r in read_metrics(zero3["run"] / "metrics.jsonl")}
    got = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    assert min(got) == 5 and got[5]["consumed_samples"] == 5 * BATCH  # the data position
    assert got[5]["lr"] == pytest.approx(ref[5]["lr"])
    # Same weights, optimizer state and data; dropout's stream and bf16 sums differ.
    assert got[5]["loss"] == pytest.approx(ref[5]["loss"], rel=0.03)
    last = max(got)
    final = find_latest(run / "checkpoints")
    assert final.name == tag_for(last) and read_state(final)["reason"] == "budget"
    assert read_state(final)["elapsed_s"] >= hours * 3600 and last < 100000
    assert read_metrics(run / "metrics.jsonl", "validation")[-1]["step"] == last
