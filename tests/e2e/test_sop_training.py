"""ALBERT's sentence-order prediction (``--objective mlm+sop``) on NSP shards, one process:
trained (its loss and accuracy logged beside the MLM's), resumed bit-identically, and exported as
``BertForPreTraining`` whose pair head, run by transformers itself, gives our SOP logits and loss
on a batch of swapped and in-order pairs.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers.commands import REPO, run_cli
from helpers.launch import COMMON, copy_without_last_checkpoint, launch
from helpers.shards import validation_batch

from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.run_folder.run_checkpoints import STATE_FILE, find_latest

pytestmark = pytest.mark.slow

SOP = ["--objective", "mlm+sop", "--decay", "constant", "--eval_batches", "1"]


def train_args(shards, run, steps: int) -> list[str]:
    cpu = ["--ds_config", str(REPO / "ds_configs" / "cpu.json"), "--data", str(shards)]
    return cpu + ["--output_dir", str(run), *COMMON, *SOP, "--max_steps", str(steps)]


@pytest.fixture(scope="module")
def sop_runs(english_nsp_shards, tmp_path_factory) -> dict:
    """A reference run of 5 steps saving at step 3; a copy of it as if stopped there (its step-5
    checkpoint and its metrics removed), resumed to 5: two launches, not three."""
    tmp = tmp_path_factory.mktemp("sop")
    run, ref = tmp / "run", tmp / "ref"
    args = ["--save_interval", "3"]
    launch(train_args(english_nsp_shards, ref, 5) + args, nproc=1)
    copy_without_last_checkpoint(ref, run, last_step=5)
    resumed = launch(train_args(english_nsp_shards, run, 5) + args + ["--resume", "auto"], nproc=1)
    return {"run": run, "ref": ref, "resumed": resumed.stdout + resumed.stderr}


def test_sop_trains_and_resumes_bit_identically(sop_runs):
    assert "at step 3 (48 samples consumed" in sop_runs["resumed"]
    got, ref = (
        {r["step"]: r for r in read_metrics(sop_runs[k] / "metrics.jsonl")} for k in ("run", "ref")
    )
    assert sorted(ref) == [1, 2, 3, 4, 5] and sorted(got) == [4, 5]
    for rec in [*ref.values(), *got.values()]:
        assert "nsp_loss" not in rec and 0.0 <= rec["sop_accuracy"] <= 1.0
        assert rec["loss"] == pytest.approx(rec["mlm_loss"] + rec["sop_loss"], rel=1e-9)
    for step, rec in got.items():
        for key in ("loss", "mlm_loss", "sop_loss", "sop_accuracy"):
            assert rec[key] == ref[step][key], (step, key)
    config = json.loads((sop_runs["ref"] / "config.json").read_text())
    assert config["objective_cfg"]["objective"] == "mlm+sop"


def test_sop_export_is_bert_for_pretraining_with_our_sop_head(
    sop_runs, english_nsp_shards, tmp_path
):
    import transformers

    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.registry import build_model
    from bertforge.pretrain.model.specs import MLM_SOP
    from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict

    run, out = sop_runs["run"], tmp_path / "hf"
    said = run_cli("-m", "bertforge", "export", str(run), "--output", str(out))
    assert "as BertForPreTraining" in said.stdout + said.stderr
    assert "sentence-order prediction" in (out / "README.md").read_text(encoding="utf-8")
    hf, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ckpt = find_latest(run / "checkpoints")
    state = json.loads((ckpt / STATE_FILE).read_text())
    ours = build_model(
        ModelConfig(**state["config"]["model_cfg"]), int(state["vocab_size"]), objective=MLM_SOP
    )
    ours.load_state_dict(consolidated_state_dict(ckpt), strict=False)
    ours.eval(), hf.eval()
    batch = validation_batch(english_nsp_shards, 16, sentence_order=True)
    order = batch["sentence_order_label"]
    assert {0, 1} <= set(order.tolist())  # in-order and swapped pairs in the batch
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        mine = ours(**inputs, labels=batch["labels"], sentence_order_label=order)
        theirs = hf(**inputs)
        logits = ours.cls.seq_relationship(ours.bert(**inputs).pooler_output)
    torch.testing.assert_close(theirs.seq_relationship_logits, logits, atol=1e-5, rtol=1e-5)
    hf_sop = F.cross_entropy(theirs.seq_relationship_logits, order, ignore_index=IGNORE_INDEX)
    assert float(mine["sop_loss"]) == pytest.approx(float(hf_sop), rel=1e-5)
    assert int(mine["sop_count"]) == int((order != IGNORE_INDEX).sum())
