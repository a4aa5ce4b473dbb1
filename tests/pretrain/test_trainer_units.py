"""Fast, in-process tests of the trainer's building blocks (no launcher)."""

from __future__ import annotations

import json
import re

import pytest
from helpers.commands import REPO

from bertforge.pretrain.config.batching import BatchSizeError, apply_batch, resolve_batch
from bertforge.pretrain.config.optimizer import OptimizerConfigError, configure_optimizer
from bertforge.pretrain.config.precision import PrecisionError, resolve_precision
from bertforge.pretrain.config.schedule import build_schedule, warmup_decay
from bertforge.pretrain.config.train_config import OptimConfig, PrecisionConfig
from bertforge.pretrain.run_folder.run_checkpoints import (
    MARKER,
    CheckpointError,
    find_latest,
    resolve_resume,
    tag_for,
)


# ---- batch sizes -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cfg,world,flags,expect",
    [
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8}, 2, {}, (32, 8, 2)),
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8}, 4, {}, (32, 8, 1)),
        ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 2, {}, (32, 8, 2)),
        ({"train_micro_batch_size_per_gpu": 4}, 3, {}, (12, 4, 1)),
        # the recipe's micro batch beside the config's global batch: accumulation derived
        ({"train_batch_size": 32}, 2, {"micro_batch": 4}, (32, 4, 4)),
        # nothing given: the default micro batch, accumulation 1; a global batch alone is
        # shared at the default micro batch
        ({}, 2, {}, (64, 32, 1)),
        ({}, 2, {"global_batch": 256}, (256, 32, 4)),
        (
            {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 8},
            2,
            {"global_batch": 64},
            (64, 8, 4),
        ),
    ],
)
def test_resolve_batch(cfg, world, flags, expect):
    plan = resolve_batch(cfg, world, **flags)
    assert (plan.global_batch, plan.micro_batch, plan.grad_accum) == expect
    assert plan.global_batch == plan.micro_batch * plan.grad_accum * world
    filled = apply_batch(cfg, plan)
    assert filled["train_batch_size"] == expect[0]
    assert filled["gradient_accumulation_steps"] == expect[2]


@pytest.mark.parametrize(
    "cfg,world,match",
    [
        ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 8}, 2, "not divisible"),
        (
            {
                "train_batch_size": 32,
                "train_micro_batch_size_per_gpu": 8,
                "gradient_accumulation_steps": 4,
            },
            2,
            r"!= micro batch 8 x accumulation 4",
        ),
        ({"train_batch_size": 0, "train_micro_batch_size_per_gpu": 8}, 2, "positive integer"),
        # the default micro batch over more ranks than the global batch can feed: "larger",
        # naming the flag and a value that fits (before: "not divisible", pointing at the JSON)
        ({"train_batch_size": 256}, 16, r"32 x world size 16 = 512 is larger than the global"),
        ({"train_batch_size": 30}, 4, "cannot be shared evenly by 4 ranks"),
    ],
)
def test_resolve_batch_errors(cfg, world, match):
    with pytest.raises(BatchSizeError, match=match) as e:
        resolve_batch(cfg, world, source="cfg.json")
    assert "cfg.json" in str(e.value) or "world size" in str(e.value)


def test_a_recipes_accumulation_yields_to_the_world_size_a_flags_does_not():
    """A run's RUN/recipe.yaml pins all three sizes for its world size (issue 55): on another one
    the global batch is kept and the accumulation derived again, with a note; given as a flag,
    the accumulation is kept and a mismatch refused naming it; a micro batch is never changed."""
    fields = ("global_batch_size", "micro_batch_size", "grad_accum")
    saved = {f: "recipe RUN/recipe.yaml" for f in fields}
    sizes = {"global_batch": 32, "micro_batch": 16, "grad_accum": 1}  # the demo's, on 2 ranks
    plan = resolve_batch({}, 1, **sizes, origins=saved)
    assert (plan.global_batch, plan.micro_batch, plan.grad_accum) == (32, 16, 2)
    assert "global batch 32 kept on 1 rank(s) as micro batch 16 x accumulation 2" in plan.note
    assert "RUN/recipe.yaml's batch.grad_accum 1" in plan.note
    assert resolve_batch({}, 2, **sizes, origins=saved).note == ""  # its own world size
    with pytest.raises(BatchSizeError, match="drop --grad_accum") as e:
        resolve_batch({}, 1, **sizes, origins={**saved, "grad_accum": "flag --grad_accum"})
    assert "the other two derive it: 2" in str(e.value)
    # 4 ranks: the recipe's micro batch 16 cannot share 32; the error names its flag and key
    with pytest.raises(BatchSizeError) as e:
        resolve_batch({}, 4, **sizes, origins=saved)
    problem = "micro batch 16 x world size 4 = 64 is larger than the global batch 32"
    assert e.value.problem == problem
    assert e.value.fix.startswith(
        "lower --micro_batch_size (recipe RUN/recipe.yaml: batch.micro_batch_size) to 8 or less"
    )
    with pytest.raises(BatchSizeError, match="set --global_batch_size .* to a multiple of 3"):
        resolve_batch({}, 3, **sizes, origins=saved)


# ---- optimizer / schedule ----------------------------------------------------------------------
def test_schedule_warmup_then_linear_decay():
    s = warmup_decay(warmup_steps=4, total_steps=14, decay="linear")
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s(4) == 1.0 and s(9) == pytest.approx(0.5) and s(14) == 0.0 and s(20) == 0.0
    p = warmup_decay(warmup_steps=0, total_steps=10, decay="poly", power=2.0, min_ratio=0.1)
    assert p(5) == pytest.approx(0.1 + 0.9 * 0.25)
    assert build_schedule(OptimConfig(warmup_ratio=0.1), 50).settings()["warmup steps"] == 5


def test_optimizer_block_filled_and_checked():
    ds = json.loads((REPO / "ds_configs" / "zero2.json").read_text())
    out = configure_optimizer(
        ds, OptimConfig(lr=3e-4, weight_decay=0.05, gradient_clipping=0.5), "cpu"
    )
    assert out["optimizer"]["params"]["lr"] == 3e-4
    assert out["optimizer"]["params"]["weight_decay"] == 0.05
    assert out["gradient_clipping"] == 0.5
    with pytest.raises(OptimizerConfigError, match="CUDA kernel"):
        configure_optimizer(ds, OptimConfig(optimizer="lamb"), "cpu")
    ds["optimizer"]["params"]["lr"] = "auto"  # HF's convention: the recipe's lr (or the default)
    assert configure_optimizer(ds, OptimConfig(lr=2e-3), "cpu")["optimizer"]["params"]["lr"] == 2e-3
    assert configure_optimizer(ds, OptimConfig(), "cpu")["optimizer"]["params"]["lr"] == 1e-4
    ds["optimizer"]["params"]["betas"] = "auto"  # no field of ours fills it
    with pytest.raises(OptimizerConfigError, match='optimizer.params.betas is "auto"'):
        configure_optimizer(ds, OptimConfig(), "cpu")


# ---- precision ---------------------------------------------------------------------------------
def test_fp16_unavailable_needs_explicit_fallback(monkeypatch):
    from deepspeed.accelerator import get_accelerator

    # As on a CPU without mkldnn fp16 (DeepSpeed would fail deep inside initialize there).
    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: False)
    ds = json.loads((REPO / "ds_configs" / "zero2.json").read_text())
    with pytest.raises(PrecisionError, match="--allow_precision_fallback"):
        resolve_precision(ds, PrecisionConfig())
    out, prec, note = resolve_precision(ds, PrecisionConfig(allow_precision_fallback=True))
    assert prec == "fp32" and not out["fp16"]["enabled"] and not out["bf16"]["enabled"]
    assert "Falling back to fp32" in note


# ---- checkpoint discovery ------------------------------------------------------------------------
def test_find_latest_ignores_incomplete(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    for step, complete in ((2, True), (4, True), (6, False)):
        (root / tag_for(step)).mkdir(parents=True)
        if complete:
            (root / tag_for(step) / MARKER).write_text("x")
    assert find_latest(root).name == tag_for(4)
    assert resolve_resume("auto", tmp_path / "run").name == tag_for(4)
    assert resolve_resume("none", tmp_path / "run") is None
    assert resolve_resume(str(tmp_path / "run"), tmp_path).name == tag_for(4)
    with pytest.raises(CheckpointError, match="incomplete"):
        resolve_resume(str(root / tag_for(6)), tmp_path / "run")


# ---- bad command lines fail before any work ----------------------------------------------------
def _run_main(args, capsys, monkeypatch, world=1):
    from bertforge.pretrain.main import main

    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", "0")
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_bad_config_fails_fast(english_shards, tmp_path, capsys, monkeypatch):
    base = [
        "--ds_config",
        str(REPO / "ds_configs" / "cpu.json"),
        "--output_dir",
        str(tmp_path / "run"),
        "--model",
        "tiny",
    ]
    code, err = _run_main(
        base
        + ["--data", str(english_shards), "--global_batch_size", "30", "--micro_batch_size", "8"],
        capsys,
        monkeypatch,
        world=2,
    )
    assert code == 2 and "not divisible by micro batch 8 x world size 2" in err
    code, err = _run_main(base + ["--data", str(tmp_path / "nowhere")], capsys, monkeypatch)
    assert code == 2 and "no such folder" in err and "bertforge prep build" in err
    code, err = _run_main(base[:-1] + ["huge", "--data", str(english_shards)], capsys, monkeypatch)
    assert code == 2 and "unknown model preset --model 'huge'" in err and "tiny" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"train_batch_size": 8,\n "fp16": {"enabled": true,}\n}')
    code, err = _run_main(
        ["--ds_config", str(bad)] + base[2:] + ["--data", str(english_shards)], capsys, monkeypatch
    )
    assert code == 2 and f"{bad}:2:" in err
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing was started


# ---- activation checkpointing ------------------------------------------------------------------
def test_activation_checkpointing_same_gradients_less_memory(english_shards, one_rank_group):
    """DeepSpeed's and torch's recomputation give the gradients of the plain model and keep
    fewer activations alive between forward and backward (bytes held by autograd)."""
    import deepspeed
    import torch

    from bertforge.data_prep.reader import ShardReader
    from bertforge.pretrain.data.loader import DataConfig, build_loader
    from bertforge.pretrain.data.masking import MaskingConfig
    from bertforge.pretrain.model.registry import PRESETS, build_model

    reader = ShardReader(english_shards, "train")
    batch = next(
        iter(build_loader(reader, DataConfig(num_workers=0), MaskingConfig(), micro_batch_size=4))
    )
    batch.pop("masking_stats", None)
    ds = json.loads((REPO / "ds_configs" / "zero2.json").read_text())
    ds["train_micro_batch_size_per_gpu"] = 4  # the batch is the recipe's; DeepSpeed wants one
    deepspeed.checkpointing.configure(None, deepspeed_config=ds)
    cfg = PRESETS["tiny"]
    cfg = type(cfg)(
        **{
            **cfg.__dict__,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "num_hidden_layers": 3,
        }
    )

    def run(mode: str) -> tuple[dict, int]:
        torch.manual_seed(0)
        model = build_model(cfg, vocab_size=reader.vocab_size)
        model.train()
        model.set_activation_checkpointing(mode)
        held = [0]

        def pack(t):
            held[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(**batch)["loss"]
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}, held[0]

    ref, ref_bytes = run("none")
    for mode in ("deepspeed", "torch"):
        grads, held = run(mode)
        assert held < 0.7 * ref_bytes, (mode, held, ref_bytes)
        for name, g in ref.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-6, msg=f"{mode} {name}")


def test_checkpoint_mismatch_is_a_clear_error(tmp_path):
    from bertforge.pretrain.checkpoints.resume import check_compatible

    state = {
        "tokenizer_fingerprint": "aaa",
        "vocab_size": 2000,
        "config": {"model_cfg": {"name": "tiny", "hidden_size": 128, "num_hidden_layers": 2}},
    }
    check_compatible(
        state,
        vocab_size=2000,
        tokenizer_fingerprint="aaa",
        path=tmp_path,
        model_config={"name": "custom", "hidden_size": 128, "num_hidden_layers": 2},
    )
    with pytest.raises(CheckpointError) as e:
        check_compatible(
            state,
            vocab_size=3000,
            tokenizer_fingerprint="bbb",
            path=tmp_path,
            model_config={"name": "small", "hidden_size": 512, "num_hidden_layers": 2},
        )
    msg = str(e.value)
    assert "tokenizer fingerprint aaa (checkpoint) != bbb" in msg
    assert "vocab size 2000 (checkpoint) != 3000" in msg
    assert "model.hidden_size = 128 (checkpoint) != 512" in msg
    assert "model.name" not in msg  # the preset's label is not part of the architecture


def test_help_prints_each_default_once():
    from helpers.commands import run_cli

    text = " ".join(run_cli("pretrain/main.py", "--help").stdout.split())
    assert "--max_steps MAX_STEPS optimizer steps to train" in text
    assert "(default: 100)" in text
    assert not re.search(r"\(default: [^()]*\) \(default:", text)  # argparse's and ours
    assert "--data DATA [DATA ...] shard folder" in text
    assert "--model MODEL_PRESET model preset" in text


def test_mfu_peak_matches_the_exact_card():
    from bertforge.pretrain.components.metrics import peak_tflops_for

    assert peak_tflops_for("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert peak_tflops_for("NVIDIA H100 PCIe", "bf16") == 756.0
    assert peak_tflops_for("NVIDIA H100 NVL", "fp16") == 835.0
    assert peak_tflops_for("NVIDIA H200", "bf16") == 989.0
    assert (
        peak_tflops_for("NVIDIA L40", "bf16") == 181.0
        and peak_tflops_for("NVIDIA L4", "bf16") == 121.0
    )
    assert peak_tflops_for("NVIDIA L40S", "bf16") == 362.0
    assert peak_tflops_for("NVIDIA A100-SXM4-80GB", "fp32") is None
