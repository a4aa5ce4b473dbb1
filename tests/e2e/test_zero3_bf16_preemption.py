"""The shipped ZeRO-3 bf16 config on two CPU ranks: time saves, SIGTERM to one rank, resume, export.

One signalled run, its resume and an uninterrupted reference prove four README promises at once:
``ds_configs/zero3_bf16.json`` runs on the CPU accelerator; ``--save_interval_minutes`` writes
"time" checkpoints that every rank takes at the same step; a SIGTERM that reaches one rank only
(a preempted node) makes every rank save at the same step boundary and exit 0; ``--resume auto``
then continues to the bit-identical result of a run that was never stopped, and the ZeRO-3
checkpoint exports to a folder that transformers loads and that predicts what our model predicts.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
from pathlib import Path

import pytest
import torch
from helpers.commands import REPO
from helpers.launch import COMMON, launch, launch_cmd, losses
from helpers.preemption import rank_process, run_and_signal

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.run_folder.run_checkpoints import (
    STATE_FILE,
    find_latest,
    is_complete,
    list_complete,
    tag_for,
)

pytestmark = pytest.mark.slow

RANKS = 2


def train_args(shards: Path, run: Path) -> list[str]:
    """The shipped ZeRO-3 bf16 config, tiny model; a constant lr after warmup, so the length of
    the signalled run (--max_steps 400) does not change the schedule of its first steps."""
    return [
        "--ds_config",
        str(REPO / "ds_configs" / "zero3_bf16.json"),
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


def saved_reasons(ckpts: Path) -> dict[int, str]:
    """{step: reason} of the complete checkpoints in ``ckpts`` (tolerates a concurrent prune)."""
    out = {}
    for step, path in list_complete(ckpts):
        try:
            out[step] = json.loads((path / STATE_FILE).read_text())["reason"]
        except FileNotFoundError:
            continue
    return out


@pytest.fixture(scope="module")
def zero3_bf16(english_shards, tmp_path_factory) -> dict:
    """A 400-step run saving every 0.3 s, SIGTERM to rank 1 once two time saves exist; its
    checkpoints as they were then; the resume to 3 steps past the stop; a reference run."""
    tmp = tmp_path_factory.mktemp("zero3_bf16")
    run, ref = tmp / "run", tmp / "ref"
    code, out = run_and_signal(
        launch_cmd("pretrain/main.py", RANKS)
        + train_args(english_shards, run)
        + ["--max_steps", "400", "--save_interval_minutes", "0.005", "--keep_last", "3"],
        tmp / "signalled.log",
        ready=lambda: list(saved_reasons(run / "checkpoints").values()).count("time") >= 2,
        target=lambda launcher: rank_process(launcher, 1).pid,
        sig=signal.SIGTERM,
    )
    shutil.copytree(run / "checkpoints", tmp / "at_signal")  # before the resume prunes them
    stop = int(re.search(r"stopped by a signal after step (\d+)", out).group(1))
    resumed = launch(
        train_args(english_shards, run) + ["--max_steps", str(stop + 3)] + ["--resume", "auto"]
    )
    launch(train_args(english_shards, ref) + ["--max_steps", str(stop + 3)])
    return {
        "code": code,
        "out": out,
        "stop": stop,
        "run": run,
        "ref": ref,
        "at_signal": tmp / "at_signal",
        "resumed": resumed.stdout + resumed.stderr,
    }


def test_sigterm_to_one_rank_saves_every_rank_and_exits_0(zero3_bf16):
    stop, ckpts = zero3_bf16["stop"], zero3_bf16["at_signal"]
    assert zero3_bf16["code"] == 0, zero3_bf16["out"][-4000:]
    assert (
        f"stopped by a signal after step {stop}; continue with --resume auto" in zero3_bf16["out"]
    )
    # A signal that lands during a time save (one every 0.3 s here) stops the run on that save
    # instead of writing the same step again: either way the stop step has a complete checkpoint.
    assert saved_reasons(ckpts)[stop] in ("signal", "time")
    assert find_latest(ckpts).name == tag_for(stop)
    assert_every_rank_saved(ckpts / tag_for(stop), stop)
    # The run stopped at the step boundary after the signal, not 400 steps later.
    steps = [r["step"] for r in read_metrics(zero3_bf16["run"] / "metrics.jsonl")]
    assert steps[:stop] == list(range(1, stop + 1))


def test_save_interval_minutes_saves_time_checkpoints_on_every_rank(zero3_bf16):
    reasons = saved_reasons(zero3_bf16["at_signal"])
    timed = [s for s, why in reasons.items() if why == "time"]
    assert len(timed) >= 2, reasons
    for step in timed:
        assert_every_rank_saved(zero3_bf16["at_signal"] / tag_for(step), step)


def assert_every_rank_saved(ckpt: Path, step: int) -> None:
    """Each rank wrote its ZeRO-3 shard and RNG state, and its shard records the same step."""
    assert is_complete(ckpt)
    for rank in range(RANKS):
        assert (ckpt / "rng" / f"rank_{rank:05d}.pt").is_file()
        shard = torch.load(
            ckpt / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt",
            map_location="cpu",
            weights_only=False,
        )
        assert shard["global_steps"] == step, (rank, shard["global_steps"], step)
        assert shard["trainer_state"]["step"] == step


def test_resume_after_sigterm_matches_the_uninterrupted_run(zero3_bf16):
    stop = zero3_bf16["stop"]
    assert (
        f"resumed from {zero3_bf16['run'] / 'checkpoints' / tag_for(stop)}" in zero3_bf16["resumed"]
    )
    got, ref = losses(zero3_bf16["run"]), losses(zero3_bf16["ref"])
    assert sorted(got) == list(range(1, stop + 4))
    # bf16 on CPU, same world size: every loss of the interrupted-and-resumed run, before and
    # after the stop, is bit-identical to the reference (the CPU kernels are deterministic).
    assert got == ref
    val = [read_metrics(zero3_bf16[r] / "metrics.jsonl", "validation")[-1] for r in ("run", "ref")]
    assert val[0]["val_loss"] == val[1]["val_loss"]
    steps = read_metrics(zero3_bf16["ref"] / "metrics.jsonl")
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.15  # bf16 learns
    cfg = json.loads((zero3_bf16["ref"] / "config.json").read_text())
    assert (
        cfg["precision_resolved"] == "bf16" and cfg["deepspeed"]["zero_optimization"]["stage"] == 3
    )


def test_zero3_bf16_export_loads_in_transformers_and_predicts_like_our_model(zero3_bf16, tmp_path):
    import transformers

    from bertforge.pretrain.export.hf_export import export
    from bertforge.pretrain.export.hf_extras import POOLER_KEYS
    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.registry import build_model
    from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict

    run, out = zero3_bf16["run"], tmp_path / "hf"
    assert export(run, out)["step"] == zero3_bf16["stop"] + 3  # in-process: the CLI's function
    hf, info = transformers.BertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "mismatched_keys")), info
    assert info["unexpected_keys"] == set(POOLER_KEYS), info  # the untrained pooler (36.9)
    ckpt = find_latest(run / "checkpoints")
    state = json.loads((ckpt / STATE_FILE).read_text())
    ours = build_model(ModelConfig(**state["config"]["model_cfg"]), int(state["vocab_size"]))
    ours.load_state_dict(consolidated_state_dict(ckpt), strict=False)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok(
        ["A class definition is an executable statement.", "Return a list."],
        return_tensors="pt",
        padding=True,
    )
    labels = torch.where(enc["attention_mask"].bool(), enc["input_ids"], -100)
    ours.eval(), hf.eval()
    with torch.no_grad():
        want = ours.predict_masked(
            enc["input_ids"], enc["attention_mask"], enc["token_type_ids"], labels
        )
        logits = hf(**enc).logits
    torch.testing.assert_close(logits[labels != -100], want, atol=1e-4, rtol=1e-4)
