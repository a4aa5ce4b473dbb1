"""Replaced-token detection (--objective rtd) through the trainer, in as few launches as possible.

(a) Two ranks, the shipped ZeRO-3 bf16 config, torch activation checkpointing, whole-word masking,
    document attention, a mixture of two shard folders, disentangled embedding sharing, dropout:
    six steps with a checkpoint every two, then --resume auto from step 4 in a copy: the resumed
    losses (the generator's sampling draws from the restored per-rank RNG) and the final
    validation are bit-identical. Every step logs the discriminator's metrics. The ZeRO-3
    checkpoint exports to a folder that transformers loads as ElectraForPreTraining (its logits
    ours to 1e-5) with the generator beside it as ElectraForMaskedLM.
(b) (a)'s step-4 checkpoint resumed on one rank (universal conversion of the ZeRO-3 shards):
    the data position and the lr carry over.
(c) Two ranks, ZeRO-2 fp16, DeepSpeed activation checkpointing, plain sharing, the stability
    guard with a planned loss spike (skipped, recorded).
(d) ModernBERT's pair with --compile (both encoders compiled; eager against compiled to 1e-5:
    tests/pretrain/model/test_compiled.py): the resume is bit-identical with the lever on.
(The time budget with --objective rtd: tests/experiments/test_mlm_vs_rtd.py.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.commands import REPO
from helpers.launch import copy_without_last_checkpoint, launch, losses

from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config import command_line
from bertforge.pretrain.run_folder.run_checkpoints import list_complete, tag_for

pytestmark = pytest.mark.slow

BATCH = 8  # global batch: 2 ranks x micro-batch 2 x accumulation 2


def rtd_args(run: Path, sources: list[str], *extra: str, **overrides) -> list[str]:
    """(a)'s launch into ``run``; ``overrides`` (flag names as keywords) replace its values."""
    values = {
        "ds_config": REPO / "ds_configs" / "zero3_bf16.json",
        "output_dir": run,
        "objective": "rtd",
        "embedding_sharing": "disentangled",
        "attention": "document",
        "activation_checkpointing": "torch",
        "whole_word": True,
        "num_workers": 0,
        "progress": False,
        "global_batch_size": BATCH,
        "micro_batch_size": 2,
        "lr": 1e-3,
        "warmup_steps": 1,
        "decay": "constant",
        "eval_batches": 1,
        "max_steps": 6,
        "save_interval": 2,
        "keep_last": 5,
        **overrides,
    }
    return ["--data", *sources, *command_line.flags(values, switches=False), *extra]


@pytest.fixture(scope="module")
def rtd_runs(english_shards, english_second_source, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("rtd")
    run, resumed = tmp / "run", tmp / "resumed"
    sources = [f"en={english_shards}:0.7", f"docs={english_second_source}:0.3"]
    launch(rtd_args(run, sources))
    copy_without_last_checkpoint(run, resumed, 6)
    proc = launch(rtd_args(resumed, sources, "--resume", "auto"))
    return {"run": run, "resumed": resumed, "sources": sources, "tmp": tmp,
            "out": proc.stdout + proc.stderr}  # fmt: skip


def test_a_rtd_run_logs_both_networks_and_resumes_bit_identically(rtd_runs):
    run = rtd_runs["run"]
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["objective_cfg"]["objective"] == "rtd"
    assert cfg["deepspeed"]["zero_optimization"]["stage"] == 3
    assert cfg["precision_resolved"] == "bf16"
    train = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    for r in train:
        assert r["loss"] == pytest.approx(r["mlm_loss"] + 50.0 * r["rtd_loss"], rel=1e-6)
        assert 0 < r["rtd_replaced_share"] < r["masked"] / r["tokens"] + 1e-9
        assert 0 <= r["rtd_precision"] <= 1 and 0 <= r["rtd_recall"] <= 1
    assert [s for s, _ in list_complete(run / "checkpoints")] == [2, 4, 6]
    from bertforge.pretrain.plot import plot

    assert (run / "plots" / "rtd.png") in plot(run / "metrics.jsonl")  # the discriminator's
    assert f"resumed from {rtd_runs['resumed'] / 'checkpoints' / tag_for(4)}" in rtd_runs["out"]
    ref, got = losses(run), losses(rtd_runs["resumed"])
    assert sorted(got) == [5, 6] and {s: ref[s] for s in got} == got  # exact
    val = [read_metrics(rtd_runs[r] / "metrics.jsonl", "validation") for r in ("run", "resumed")]
    assert val[1][-1]["val_loss"] == val[0][-1]["val_loss"]
    # the discriminator's held-out scores, from the validation's own sampling stream
    assert val[1][-1]["val_rtd_loss"] == val[0][-1]["val_rtd_loss"]
    assert 0.5 < val[0][-1]["val_rtd_accuracy"] <= 1


def test_a_export_is_electra_for_pretraining_with_its_generator(rtd_runs, tmp_path):
    import transformers

    from bertforge.pretrain.export.hf_export import export, find_checkpoint
    from bertforge.pretrain.export.verify import check_lines
    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.registry import build_model
    from bertforge.pretrain.model.specs import objective_of_run
    from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict, read_state

    out = tmp_path / "hf"
    res = export(rtd_runs["run"], out)  # also reloads both folders, fill-mask on the generator
    assert res["architecture"] == "ElectraForPreTraining" and res["step"] == 6
    # the discriminator's check is its detection; fill-mask is the generator's (issue 55)
    assert len(res["detection"]["pieces"]) > 2 and res["fill_mask"][0]["predictions"]
    lines = check_lines(res)
    assert lines[0].startswith("  probe: validation text of ")  # the run's own held-out text
    assert lines[1].startswith("  replaced-token detection on ")
    assert lines[2].startswith(f"  fill-mask (the generator, {out / 'generator'}) on ")
    disc, info = transformers.ElectraForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    gen, info = transformers.ElectraForMaskedLM.from_pretrained(
        out / "generator", output_loading_info=True
    )
    assert not any(info.values()), info
    ckpt = find_checkpoint(rtd_runs["run"])
    state = read_state(ckpt)
    ours = build_model(
        ModelConfig(**state["config"]["model_cfg"]),
        int(state["vocab_size"]),
        objective=objective_of_run(state["config"], nsp=False),
    )
    ours.load_state_dict(consolidated_state_dict(ckpt), strict=False)
    ours.eval(), disc.eval(), gen.eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok(["A class definition is an executable statement.", "Return a list."],
              return_tensors="pt", padding=True)  # fmt: skip
    ids, mask = enc["input_ids"], enc["attention_mask"]
    labels = torch.where(mask.bool(), ids, IGNORE_INDEX)
    with torch.no_grad():
        want = ours.discriminator_logits(ids, mask)
        got = disc(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=1e-5)
        want = ours.predict_masked(ids, mask, None, labels)
        got = gen(input_ids=ids, attention_mask=mask).logits[labels != IGNORE_INDEX]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_b_resume_two_ranks_to_one(rtd_runs):
    run = rtd_runs["tmp"] / "one_rank"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(rtd_runs["run"] / "checkpoints" / tag_for(4), run / "checkpoints" / tag_for(4))
    proc = launch(rtd_args(run, rtd_runs["sources"], "--resume", "auto"), nproc=1)
    assert "saved on 2 ranks, now 1" in proc.stdout + proc.stderr
    ref = {r["step"]: r for r in read_metrics(rtd_runs["run"] / "metrics.jsonl")}
    got = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    assert sorted(got) == [5, 6] and got[5]["consumed_samples"] == 5 * BATCH
    assert got[5]["lr"] == pytest.approx(ref[5]["lr"])
    # same weights, optimizer state and data; the generator's samples and bf16 sums differ
    assert got[5]["mlm_loss"] == pytest.approx(ref[5]["mlm_loss"], rel=0.05)


def test_c_zero2_fp16_deepspeed_checkpointing_and_the_guard(english_shards, tmp_path):
    """Two ranks, ZeRO-2 fp16 (the CPU capability patch of tests/helpers/fp16_main.py),
    DeepSpeed activation checkpointing over both networks, plain embedding sharing, and the
    stability guard with a planned loss spike: skipped and recorded, the run goes on."""
    from helpers.launch import ds_config, guard_actions

    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8,
            "loss_scale_window": 1000, "hysteresis": 1, "min_loss_scale": 1}  # fmt: skip
    run = tmp_path / "run"
    args = rtd_args(
        run, [str(english_shards)], ds_config=ds_config(tmp_path, "fp16.json", fp16=fp16),
        embedding_sharing="plain", activation_checkpointing="deepspeed", attention="full",
        guard_min_history=3, save_interval=3,
    )  # fmt: skip
    launch(
        args,
        script=REPO / "tests" / "helpers" / "fp16_main.py",
        env={"BERTFORGE_FAULTS": "loss_spike@5"},
    )
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["precision_resolved"] == "fp16" and cfg["activation_checkpointing"] == "deepspeed"
    assert cfg["deepspeed"]["zero_optimization"]["stage"] == 2
    (event,) = guard_actions(run)
    assert (event["step"], event["event"], event["action"]) == (5, "loss_spike", "skip")
    train = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    assert sorted(train) == list(range(1, 7)) and train[5]["skipped"]
    assert all(0 < r["rtd_accuracy"] <= 1 for r in train.values())


def test_d_modernbert_rtd_resumes_exactly_and_exports_a_token_classifier(english_shards, tmp_path):
    """--arch modernbert --objective rtd --compile: 2 ranks, ZeRO-2 bf16, document attention, a
    window below the sequence length; the resume from step 2 is bit-identical (compiled
    encoders, the validation at the end compiled again without gradients), and the export loads
    as ModernBertForTokenClassification (one label) whose logit is our discriminator's."""
    import transformers

    from bertforge.pretrain.export.hf_export import export

    def args(run: Path, *extra: str) -> list[str]:
        return rtd_args(
            run, [str(english_shards)], *extra, arch="modernbert", local_attention=32,
            ds_config=REPO / "ds_configs" / "zero2_bf16.json", activation_checkpointing="none",
            whole_word=False, max_steps=4, save_interval=2, compile=True,
        )  # fmt: skip

    run, resumed = tmp_path / "run", tmp_path / "resumed"
    proc = launch(args(run), timeout=420)
    copy_without_last_checkpoint(run, resumed, 4)
    launch(args(resumed, "--resume", "auto"), timeout=420)
    ref, got = losses(run), losses(resumed)
    assert sorted(got) == [3, 4] and {s: ref[s] for s in got} == got
    assert "--compile: 2 encoder stack(s) compiled" in proc.stdout + proc.stderr
    assert all("rtd_accuracy" in r for r in read_metrics(run / "metrics.jsonl"))
    out = tmp_path / "hf"
    res = export(run, out)
    assert res["architecture"] == "ModernBertForTokenClassification"
    hf, info = transformers.ModernBertForTokenClassification.from_pretrained(
        out, output_loading_info=True
    )
    assert not any(info.values()) and hf.config.num_labels == 1


def test_e_a_phase_plan_sets_the_rtd_runs_batch_lr_and_mask_rate(english_shards, tmp_path):
    """--phases with --objective rtd, one rank: a batch ramp (4 -> 8) under warmup, then a decay
    at mask rate 0.3; the generator replaces about twice the share of tokens in the second
    phase (it corrupts only masked positions), the lr follows the plan."""
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "phases": [
                    {"name": "ramp", "steps": 3, "lr": "warmup",
                     "batch": {"start": 4, "increment": 4, "ramp_tokens": 1024}},
                    {"name": "decay", "steps": 3, "lr": "linear", "min_lr_ratio": 0.1,
                     "mask_prob": 0.3},
                ]
            }
        )
    )  # fmt: skip
    run = tmp_path / "run"
    args = rtd_args(run, [str(english_shards)], ds_config=REPO / "ds_configs" / "cpu.json",
                    micro_batch_size=4, save_interval=0, warmup_steps=None, decay=None,
                    activation_checkpointing="none", embedding_sharing="plain")  # fmt: skip
    launch([*args, "--phases", str(plan)], nproc=1)
    train = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    assert [train[s]["phase"] for s in range(1, 7)] == ["ramp"] * 3 + ["decay"] * 3
    assert [train[s]["samples"] for s in (1, 6)] == [4, 8]
    assert train[2]["lr"] == pytest.approx(1e-3) and train[6]["lr"] == pytest.approx(1e-4)
    ramp = max(train[s]["rtd_replaced_share"] for s in (1, 2, 3))
    decay = min(train[s]["rtd_replaced_share"] for s in (4, 5, 6))
    assert decay > 1.5 * ramp
