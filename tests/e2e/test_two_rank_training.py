"""End-to-end training runs: two CPU ranks through the DeepSpeed launcher, tiny model, real text.

Runs are shared between assertions (module-scoped fixtures) because each launch costs ~15 s of
start-up. Every run uses ZeRO on gloo, fp32 unless stated, torch AdamW, no loader workers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.commands import REPO, run_cli
from helpers.launch import COMMON, assert_loss_falls, ds_config, launch, launch_cmd, losses
from helpers.shm import left_in_shm, port_of

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.run_folder.run_checkpoints import (
    MARKER,
    find_latest,
    list_complete,
    tag_for,
)

HELPERS = REPO / "tests" / "helpers"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def zero2_run(english_shards, tmp_path_factory) -> Path:
    """2 ranks, ZeRO-2, 8 steps, checkpoints at 4 and 8, validation at 4 and at the end."""
    run = tmp_path_factory.mktemp("zero2") / "run"
    proc = launch(
        [
            "--ds_config",
            str(REPO / "ds_configs" / "cpu.json"),
            "--data",
            str(english_shards),
            "--output_dir",
            str(run),
            "--max_steps",
            "8",
            "--save_interval",
            "4",
            "--eval_interval",
            "4",
            "--eval_batches",
            "4",
            "--keep_last",
            "5",
        ]
        + COMMON
    )
    (run.parent / "launch_output.txt").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return run


def test_no_rank_prints_deepspeeds_routine_chatter(zero2_run):
    out = (zero2_run.parent / "launch_output.txt").read_text(encoding="utf-8")
    assert "all_gather_into_tensor" not in out  # a user can do nothing about DeepSpeed's call
    assert "built successfully" not in out  # DeepSpeed's shm op line, each launch, each rank


def test_a_fresh_run_into_a_folder_that_holds_a_run_is_refused(zero2_run, english_shards):
    # before: it trained, replaced the run's metrics.jsonl and mixed its checkpoints with the
    # old run's, under the default --resume none (issue 55's second newcomer pass)
    before = {p: p.read_bytes() for p in (zero2_run / "metrics.jsonl", zero2_run / "config.json")}
    data = ["--data", str(english_shards), "--output_dir", str(zero2_run)]
    proc = run_cli("pretrain/main.py", *data, *COMMON, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        f"--output_dir {zero2_run} already holds a run (complete checkpoints up to step 8): "
        "continue it with --resume auto, or give another --output_dir"
    ) in proc.stderr
    assert {p: p.read_bytes() for p in before} == before
    assert [s for s, _ in list_complete(zero2_run / "checkpoints")] == [4, 8]
    assert run_cli("pretrain/main.py", *data, "--dry-run").returncode == 0  # it writes nothing


def test_zero2_trains_and_writes_run_folder(zero2_run):
    assert_loss_falls(zero2_run)
    train = read_metrics(zero2_run / "metrics.jsonl")
    assert [r["step"] for r in train] == list(range(1, 9))
    for key in (
        "step",
        "loss",
        "lr",
        "loss_scale",
        "skipped",
        "tokens_per_s",
        "mlm_accuracy",
        "grad_norm",
        "masked_tokens_per_s",
        "samples_per_s",
        "tflops",
        "data_wait_s",
        "mask_selected_fraction",
    ):
        assert key in train[0], key
    assert train[0]["samples"] == 16 and train[-1]["consumed_samples"] == 128
    assert train[0]["lr"] < train[1]["lr"] or train[1]["lr"] > train[-1]["lr"]  # warmup, decay
    val = read_metrics(zero2_run / "metrics.jsonl", "validation")
    assert [r["step"] for r in val] == [4, 8]
    assert val[-1]["val_perplexity"] == pytest.approx(2.718281828 ** val[-1]["val_loss"], rel=1e-6)
    assert val[-1]["val_loss"] < val[0]["val_loss"] + 0.05
    cfg = json.loads((zero2_run / "config.json").read_text())
    assert cfg["batch_plan"] == {
        "global_batch": 16,
        "micro_batch": 4,
        "grad_accum": 2,
        "world_size": 2,
    }
    assert cfg["deepspeed"]["gradient_accumulation_steps"] == 2
    assert [s for s, _ in list_complete(zero2_run / "checkpoints")] == [4, 8]
    # DeepSpeed's pointer, written by us after COMPLETE (issue 17): the newest complete tag
    assert (zero2_run / "checkpoints" / "latest").read_text() == tag_for(8)
    state = json.loads((zero2_run / "checkpoints" / tag_for(8) / "trainer_state.json").read_text())
    assert state["consumed_samples"] == 128 and state["world_size"] == 2
    assert sorted(p.name for p in (zero2_run / "checkpoints" / tag_for(8) / "rng").iterdir()) == [
        "rank_00000.pt",
        "rank_00001.pt",
    ]
    assert list((zero2_run / "tensorboard").rglob("events.out.tfevents.*"))
    from bertforge.pretrain.plot import plot

    pngs = plot(zero2_run / "metrics.jsonl", zero2_run / "plots")
    assert {"loss.png", "lr.png", "overview.png"} <= {p.name for p in pngs}


def test_exact_resume_matches_uninterrupted_run(zero2_run, english_shards, tmp_path):
    run = tmp_path / "resumed"
    shutil.copytree(zero2_run, run)
    shutil.rmtree(run / "checkpoints" / tag_for(8))  # as if the run had stopped after step 4
    proc = launch(
        [
            "--ds_config",
            str(REPO / "ds_configs" / "cpu.json"),
            "--data",
            str(english_shards),
            "--output_dir",
            str(run),
            "--max_steps",
            "8",
            "--save_interval",
            "4",
            "--eval_interval",
            "4",
            "--eval_batches",
            "4",
            "--keep_last",
            "5",
            "--resume",
            "auto",
        ]
        + COMMON
    )
    assert "at step 4 (64 samples consumed" in proc.stdout + proc.stderr
    ref, got = losses(zero2_run), losses(run)
    assert sorted(got) == list(range(1, 9))
    for step in range(5, 9):  # fp32 on CPU, same world size: identical
        assert got[step] == pytest.approx(ref[step], abs=1e-6), (step, ref, got)
    val_ref = read_metrics(zero2_run / "metrics.jsonl", "validation")[-1]["val_loss"]
    val_got = read_metrics(run / "metrics.jsonl", "validation")[-1]["val_loss"]
    assert val_got == pytest.approx(val_ref, abs=1e-6)


def test_resume_two_ranks_to_one(zero2_run, english_shards, tmp_path):
    run = tmp_path / "one_rank"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(zero2_run / "checkpoints" / tag_for(4), run / "checkpoints" / tag_for(4))
    proc = launch(
        [
            "--ds_config",
            str(REPO / "ds_configs" / "cpu.json"),
            "--data",
            str(english_shards),
            "--output_dir",
            str(run),
            "--max_steps",
            "6",
            "--eval_batches",
            "2",
            "--resume",
            "auto",
        ]
        + COMMON,
        nproc=1,
    )
    assert "saved on 2 ranks, now 1" in proc.stdout + proc.stderr
    assert (run / "checkpoints" / "universal" / tag_for(4) / MARKER).is_file()
    ref = {r["step"]: r for r in read_metrics(zero2_run / "metrics.jsonl")}
    got = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    assert sorted(got) == [5, 6]
    assert got[5]["consumed_samples"] == 80  # the data position carried over
    assert got[5]["lr"] == pytest.approx(ref[5]["lr"])  # schedule state carried over
    # Same weights, optimizer state and data; only dropout's random stream differs.
    assert got[5]["loss"] == pytest.approx(ref[5]["loss"], rel=0.02)
    assert find_latest(run / "checkpoints").name == tag_for(6)


def test_resume_on_one_process_with_the_runs_own_recipe(zero2_run, tmp_path):
    """docs/training.md: a run continues on another world size with `--recipe RUN/recipe.yaml
    --resume auto`. The 2-rank run's recipe pins accumulation 2 (16 = 4 x 2 x 2 ranks); on one
    process that was refused (issue 55: "global batch 16 != micro batch 4 x accumulation 2 x
    world size 1"). Now the global batch is kept and the accumulation derived again, said once."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(zero2_run / "recipe.yaml", run / "recipe.yaml")
    shutil.copytree(zero2_run / "checkpoints" / tag_for(4), run / "checkpoints" / tag_for(4))
    recipe = run / "recipe.yaml"
    assert "grad_accum: 2" in recipe.read_text()
    proc = launch(["--recipe", str(recipe), "--output_dir", str(run), "--resume", "auto"], nproc=1)
    out = proc.stdout + proc.stderr
    assert "global batch 16 kept on 1 rank(s) as micro batch 4 x accumulation 4" in out
    assert f"the recipe {recipe}'s batch.grad_accum 2 fits another world size" in out
    assert "saved on 2 ranks, now 1" in out
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["batch_plan"] == {
        "global_batch": 16,
        "micro_batch": 4,
        "grad_accum": 4,
        "world_size": 1,
    }
    assert "grad_accum: 4" in recipe.read_text()  # the next resume reads this launch's split
    ref = {r["step"]: r for r in read_metrics(zero2_run / "metrics.jsonl")}
    got = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    assert sorted(got) == [5, 6, 7, 8]  # the recipe's max_steps
    for step in got:
        assert got[step]["samples"] == 16 and got[step]["consumed_samples"] == 16 * step
        assert got[step]["lr"] == pytest.approx(ref[step]["lr"])
    assert got[5]["loss"] == pytest.approx(ref[5]["loss"], rel=0.02)  # dropout draws differ


def test_export_loads_in_transformers(zero2_run, tmp_path):
    import torch
    import transformers

    from bertforge.pretrain.export.hf_export import export
    from bertforge.pretrain.export.hf_extras import POOLER_KEYS
    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.registry import build_model
    from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict

    out = tmp_path / "hf"
    res = export(zero2_run, out)
    assert res["step"] == 8 and {"config.json", "model.safetensors"} <= set(os.listdir(out))
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    # the only unused keys: the masked-LM run's untrained pooler, for BertModel (issue 36.9)
    assert not info["missing_keys"] and info["unexpected_keys"] == set(POOLER_KEYS)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tok)  # vocabulary padding sliced off
    fill = transformers.pipeline("fill-mask", model=str(out), tokenizer=str(out), device="cpu")
    preds = fill(f"The {tok.mask_token} statement returns a value.", top_k=3)
    assert len(preds) == 3 and all(p["token_str"] for p in preds)
    # The exported model predicts what the training model predicts from the same checkpoint.
    state = json.loads((zero2_run / "checkpoints" / tag_for(8) / "trainer_state.json").read_text())
    ours = build_model(ModelConfig(**state["config"]["model_cfg"]), vocab_size=len(tok))
    ours.load_state_dict(
        consolidated_state_dict(zero2_run / "checkpoints" / tag_for(8)), strict=False
    )
    ours.eval()
    model.eval()
    enc = tok("A function definition is an executable statement.", return_tensors="pt")
    labels = torch.full_like(enc["input_ids"], -100)
    labels[0, 1:-1] = enc["input_ids"][0, 1:-1]
    with torch.no_grad():
        ref = ours.predict_masked(
            enc["input_ids"], enc["attention_mask"], enc["token_type_ids"], labels
        )
        hf = model(**enc).logits[0, 1:-1]
    torch.testing.assert_close(hf, ref, atol=1e-4, rtol=1e-4)


def test_zero3_with_activation_checkpointing_trains(english_shards, tmp_path):
    act = {
        "enabled": True,
        "partition_activations": False,
        "contiguous_memory_optimization": False,
        "cpu_checkpointing": False,
        "number_checkpoints": None,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }
    cfg = ds_config(
        tmp_path,
        "zero3.json",
        activation_checkpointing=act,
        zero_optimization={
            "stage": 3,
            "overlap_comm": False,
            "stage3_param_persistence_threshold": 1000,
        },
    )
    run = tmp_path / "run"
    launch(
        [
            "--ds_config",
            str(cfg),
            "--data",
            str(english_shards),
            "--output_dir",
            str(run),
            "--max_steps",
            "8",
            "--eval_batches",
            "2",
        ]
        + COMMON
    )
    assert_loss_falls(run)
    resolved = json.loads((run / "config.json").read_text())
    assert resolved["activation_checkpointing"] == "deepspeed"
    assert resolved["deepspeed"]["zero_optimization"]["stage"] == 3
    ckpt = run / "checkpoints" / tag_for(8)
    assert is_zero3_sharded(ckpt)


def is_zero3_sharded(ckpt: Path) -> bool:
    names = {p.name for p in ckpt.iterdir()}
    return {
        "zero_pp_rank_0_mp_rank_00_model_states.pt",
        "zero_pp_rank_1_mp_rank_00_model_states.pt",
    } <= names


def test_fp16_overflow_skips_lowers_scale_and_resumes(english_shards, tmp_path):
    fp16 = {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": 8,
        "loss_scale_window": 1000,
        "hysteresis": 1,
        "min_loss_scale": 1,
    }
    cfg = ds_config(tmp_path, "fp16.json", fp16=fp16)
    run = tmp_path / "run"
    args = [
        "--ds_config",
        str(cfg),
        "--data",
        str(english_shards),
        "--output_dir",
        str(run),
        "--eval_batches",
        "2",
    ] + COMMON
    launch(
        args + ["--max_steps", "4", "--save_interval", "2"],
        script=HELPERS / "fp16_main.py",
        env={"BERTFORGE_TEST_INF_AT_STEP": "2"},
    )
    m = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    assert m[1]["loss_scale"] == 256.0 and not m[1]["skipped"]
    assert m[2]["skipped"] and m[2]["loss_scale"] == 128.0 and m[2]["grad_norm"] in ("inf", "nan")
    assert m[2]["lr"] == m[1]["lr"]  # the schedule did not advance on the skipped step
    assert not m[3]["skipped"] and not m[4]["skipped"] and m[4]["skipped_total"] == 1
    assert m[4]["loss_scale"] == 128.0
    resolved = json.loads((run / "config.json").read_text())
    assert resolved["precision_resolved"] == "fp16"
    launch(args + ["--max_steps", "6", "--resume", "auto"], script=HELPERS / "fp16_main.py")
    m = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    assert m[5]["loss_scale"] == 128.0 and not m[5]["skipped"]  # the scaler state was restored
    assert m[6]["skipped_total"] == 1


def test_kill_a_rank_then_resume_auto(english_shards, tmp_path):
    import psutil

    run = tmp_path / "run"
    args = [
        "--ds_config",
        str(REPO / "ds_configs" / "cpu.json"),
        "--data",
        str(english_shards),
        "--output_dir",
        str(run),
        "--save_interval",
        "2",
        "--keep_last",
        "2",
        "--eval_batches",
        "2",
    ] + COMMON
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "killed_run.log", "w")  # noqa: SIM115 - closed in the finally below
    killed_cmd = launch_cmd("pretrain/main.py", 2) + args + ["--max_steps", "400"]
    launcher = subprocess.Popen(
        killed_cmd,
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and launcher.poll() is None:
            done = list_complete(run / "checkpoints")
            if done and done[-1][0] >= 4:
                break
            time.sleep(0.05)
        assert launcher.poll() is None, (
            "the run ended before it could be killed:\n" + (tmp_path / "killed_run.log").read_text()
        )
        ranks = [
            p
            for p in psutil.Process(launcher.pid).children(recursive=True)
            if any(a.startswith("--local_rank=1") for a in p.cmdline())
        ]
        assert ranks, "rank 1 not found"
        os.kill(ranks[0].pid, signal.SIGKILL)
        assert launcher.wait(timeout=60) != 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        log.close()
    # DeepSpeed's shared-memory all-reduce buffers were unlinked at start-up: kill -9 leaves none.
    assert left_in_shm(port_of(killed_cmd)) == []
    newest = list_complete(run / "checkpoints")[-1][0]
    # A crash while saving leaves a folder without the marker; resume must not pick it.
    partial = run / "checkpoints" / tag_for(newest + 1)
    partial.mkdir(exist_ok=True)
    (partial / "mp_rank_00_model_states.pt").write_bytes(b"truncated")
    proc = launch(args + ["--max_steps", str(newest + 2), "--resume", "auto"])
    assert (
        f"resumed from {run / 'checkpoints' / tag_for(newest)} at step {newest}"
        in proc.stdout + proc.stderr
    )
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
    assert steps == list(range(1, newest + 3))  # steps after the checkpoint were redone once
    assert find_latest(run / "checkpoints").name == tag_for(newest + 2)
    assert not partial.exists()  # the stale partial folder was cleaned up
    assert left_in_shm(port_of(proc.args)) == []  # nor does a clean exit


def test_fp16_overflow_at_min_scale_stops_cleanly(english_shards, tmp_path):
    fp16 = {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": 0,
        "loss_scale_window": 1000,
        "hysteresis": 1,
        "min_loss_scale": 1,
    }
    cfg = ds_config(tmp_path, "fp16_min.json", fp16=fp16)
    run = tmp_path / "run"
    proc = launch(
        [
            "--ds_config",
            str(cfg),
            "--data",
            str(english_shards),
            "--output_dir",
            str(run),
            "--max_steps",
            "4",
            "--save_interval",
            "1",
        ]
        + COMMON,
        nproc=1,
        script=HELPERS / "fp16_main.py",
        env={"BERTFORGE_TEST_INF_AT_STEP": "2"},
        check=False,
    )
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "kept overflowing at the minimum loss scale" in proc.stdout + proc.stderr
    assert [s for s, _ in list_complete(run / "checkpoints")] == [1]
    assert not (run / "checkpoints" / tag_for(2)).exists()
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1]
