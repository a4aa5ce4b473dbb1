"""NSP shards on the shipped ZeRO-2 bf16 config, one process: Ctrl-C, resume, BertForPreTraining.

One interrupted run, its resume and an uninterrupted reference prove: ``ds_configs/zero2_bf16.json``
runs on the CPU accelerator; one SIGINT (Ctrl-C) saves at the next step boundary and exits 0
with the message to resume; ``--resume auto`` then gives the bit-identical MLM and NSP losses of
the run that was never stopped; and a model trained on NSP shards exports to a
``BertForPreTraining`` folder whose MLM and NSP outputs, computed by transformers itself, equal
our model's on a real masked batch.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers.commands import (
    REPO,  # noqa: E402
    run_cli,
)
from helpers.launch import COMMON, launch
from helpers.preemption import run_and_signal
from helpers.shards import validation_batch

from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.run_folder.run_checkpoints import STATE_FILE, find_latest, tag_for

pytestmark = pytest.mark.slow


def train_args(shards: Path, run: Path) -> list[str]:
    """The shipped ZeRO-2 bf16 config, tiny model, constant lr after warmup (the signalled run's
    --max_steps 400 does not change the schedule of its first steps)."""
    return [
        "--ds_config",
        str(REPO / "ds_configs" / "zero2_bf16.json"),
        "--data",
        str(shards),
        "--output_dir",
        str(run),
        *COMMON,  # tiny model, one-process-friendly batch and lr
        "--decay",
        "constant",
        "--eval_batches",
        "2",
    ]


def has_a_step(run: Path) -> bool:
    """True once metrics.jsonl holds a training step record: the loop runs."""
    path = run / "metrics.jsonl"
    return path.is_file() and bool(read_metrics(path))


@pytest.fixture(scope="module")
def nsp_bf16(english_nsp_shards, tmp_path_factory) -> dict:
    """A 400-step run given one SIGINT after its first step; its resume to 3 steps past the
    stop; a reference run of the same length."""
    tmp = tmp_path_factory.mktemp("nsp_bf16")
    run, ref = tmp / "run", tmp / "ref"
    code, out = run_and_signal(
        [sys.executable, "pretrain/main.py"]
        + train_args(english_nsp_shards, run)
        + ["--max_steps", "400"],
        tmp / "interrupted.log",
        ready=lambda: has_a_step(run),
        target=lambda proc: proc.pid,
        sig=signal.SIGINT,
    )
    stop = int(re.search(r"stopped by a signal after step (\d+)", out).group(1))
    end = ["--max_steps", str(stop + 3)]
    resumed = launch(train_args(english_nsp_shards, run) + end + ["--resume", "auto"], nproc=1)
    launch(train_args(english_nsp_shards, ref) + end, nproc=1)
    return {
        "code": code,
        "out": out,
        "stop": stop,
        "run": run,
        "ref": ref,
        "resumed": resumed.stdout + resumed.stderr,
    }


def test_one_sigint_saves_at_the_step_boundary_and_exits_0(nsp_bf16):
    stop, run = nsp_bf16["stop"], nsp_bf16["run"]
    assert nsp_bf16["code"] == 0, nsp_bf16["out"][-4000:]
    assert f"stopped by a signal after step {stop}; continue with --resume auto" in nsp_bf16["out"]
    state = json.loads((run / "checkpoints" / tag_for(stop) / STATE_FILE).read_text())
    assert state["reason"] == "signal" and state["consumed_samples"] == 16 * stop
    assert "KeyboardInterrupt" not in nsp_bf16["out"]


def test_resume_after_sigint_matches_the_uninterrupted_run(nsp_bf16):
    stop = nsp_bf16["stop"]
    assert f"at step {stop} ({16 * stop} samples consumed" in nsp_bf16["resumed"]
    got, ref = (
        {r["step"]: r for r in read_metrics(nsp_bf16[k] / "metrics.jsonl")} for k in ("run", "ref")
    )
    assert sorted(got) == list(range(1, stop + 4))
    for step in got:  # bf16 on CPU, one process: bit-identical, NSP included
        for key in ("loss", "mlm_loss", "nsp_loss", "nsp_accuracy"):
            assert got[step][key] == ref[step][key], (step, key)
    val = [read_metrics(nsp_bf16[k] / "metrics.jsonl", "validation")[-1] for k in ("run", "ref")]
    assert val[0]["val_loss"] == val[1]["val_loss"]
    cfg = json.loads((nsp_bf16["ref"] / "config.json").read_text())
    assert (
        cfg["precision_resolved"] == "bf16" and cfg["deepspeed"]["zero_optimization"]["stage"] == 2
    )


def test_nsp_export_is_bert_for_pretraining_with_our_mlm_and_nsp_outputs(
    nsp_bf16, english_nsp_shards, tmp_path
):
    import transformers

    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.registry import build_model
    from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict

    run, out = nsp_bf16["run"], tmp_path / "hf"
    proc = run_cli("-m", "pretrain.export", str(run), "--output", str(out))
    # DeepSpeed's zero_to_fp32 bookkeeping and bars are not the command's output
    said = proc.stdout + proc.stderr
    assert "exported" in said and "Processing zero checkpoint" not in said
    assert "Loading checkpoint shards" not in said and "Reconstructed" not in said
    # its check probes the run's own held-out text, one word masked
    assert "probe: validation text of" in said and "(the word: " in said
    hf, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ckpt = find_latest(run / "checkpoints")
    state = json.loads((ckpt / STATE_FILE).read_text())
    ours = build_model(
        ModelConfig(**state["config"]["model_cfg"]), int(state["vocab_size"]), nsp=True
    )
    ours.load_state_dict(consolidated_state_dict(ckpt), strict=False)
    ours.eval(), hf.eval()
    batch = validation_batch(english_nsp_shards, 8)
    labels, nsp_labels = batch["labels"], batch["next_sentence_label"]
    assert 0 < int(nsp_labels.sum()) < len(nsp_labels)  # both NSP classes in the batch
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        mine = ours(**inputs, labels=labels, next_sentence_label=nsp_labels)
        theirs = hf(**inputs)
        mlm_rows = ours.predict_masked(**inputs, labels=labels)
        nsp_logits = ours.cls.seq_relationship(ours.bert(**inputs).pooler_output)
    # transformers' own heads and losses are the reference.
    masked = labels != IGNORE_INDEX
    torch.testing.assert_close(theirs.prediction_logits[masked], mlm_rows, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(theirs.seq_relationship_logits, nsp_logits, atol=1e-5, rtol=1e-5)
    hf_mlm = F.cross_entropy(theirs.prediction_logits[masked], labels[masked])
    hf_nsp = F.cross_entropy(theirs.seq_relationship_logits, nsp_labels)
    assert float(mine["mlm_loss"]) == pytest.approx(float(hf_mlm), rel=1e-5)
    assert float(mine["nsp_loss"]) == pytest.approx(float(hf_nsp), rel=1e-5)
