"""Every shipped DeepSpeed config resolves at the world sizes users launch (issue 36, item 0).

The configs hold the engine only: the batch is the recipe's, and a launch that gives none trains
32 sequences per rank (the default micro batch), the global batch following the world size, so
the documented launch lines (hostfile.example: 2 nodes x 8, docs/launching.md:
16 and 32 ranks, a 4-node SLURM job) run as written. The resolved dict is then handed to
DeepSpeed's own config class at that data-parallel size: its batch assertion is the reference.
"""

from __future__ import annotations

import json

import pytest
from helpers.commands import REPO

from bertforge.pretrain.config.batching import BATCH_KEYS, BatchSizeError
from bertforge.pretrain.config.cli import parse_args
from bertforge.pretrain.config.ds_config import resolve_deepspeed_config
from bertforge.pretrain.config.train_config import DEFAULT_MICRO_BATCH

CONFIGS = sorted(p.name for p in (REPO / "ds_configs").glob("*.json"))
WORLDS = (1, 2, 8, 16, 32, 64)


class _DataParallel:
    """The one thing DeepSpeedConfig asks an mpu: the data-parallel world size."""

    def __init__(self, world: int):
        self.world = world

    def get_data_parallel_world_size(self) -> int:
        return self.world


def deepspeed_accepts(ds: dict, world: int, monkeypatch) -> tuple[int, int, int]:
    """DeepSpeed's own reading of ``ds`` on ``world`` ranks: (global, micro, accumulation)."""
    from deepspeed.runtime import config as ds_config_module

    monkeypatch.setattr(ds_config_module.dist, "get_rank", lambda *a, **k: 0)
    parsed = ds_config_module.DeepSpeedConfig(json.loads(json.dumps(ds)), mpu=_DataParallel(world))
    return (
        parsed.train_batch_size,
        parsed.train_micro_batch_size_per_gpu,
        parsed.gradient_accumulation_steps,
    )


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", CONFIGS)
def test_each_shipped_config_resolves_at_cluster_sizes(name, world, english_shards, monkeypatch):
    path = REPO / "ds_configs" / name
    shipped = json.loads(path.read_text())
    pinned = [k for k in BATCH_KEYS if k in shipped]
    assert not pinned, f"{name} gives {pinned}: the batch is the recipe's (one home)"
    cfg = parse_args(
        ["--ds_config", str(path), "--data", str(english_shards), "--allow_precision_fallback"]
    )
    setup = resolve_deepspeed_config(cfg, world, "cpu")
    micro, accum = DEFAULT_MICRO_BATCH, 1
    plan = setup.batch
    assert (plan.micro_batch, plan.grad_accum, plan.world_size) == (micro, accum, world)
    assert plan.global_batch == micro * accum * world
    assert deepspeed_accepts(setup.config, world, monkeypatch) == (
        plan.global_batch,
        micro,
        accum,
    )


def test_the_eight_rank_global_batch_of_the_gpu_configs_is_unchanged(english_shards):
    """Before issue 36 the GPU configs pinned 256 sequences a step (32 per rank on 8 GPUs):
    a one-node launch still trains with exactly that batch."""
    for name in ("zero2.json", "zero2_bf16.json", "zero3.json", "zero3_bf16.json"):
        cfg = parse_args(
            ["--ds_config", str(REPO / "ds_configs" / name), "--data", str(english_shards)]
            + ["--allow_precision_fallback"]  # this CPU has no fp16; the batch does not need it
        )
        assert resolve_deepspeed_config(cfg, 8, "cpu").batch.global_batch == 256, name


@pytest.mark.parametrize("world", (8, 16, 32, 64))
def test_a_fixed_global_batch_is_held_by_a_smaller_micro_batch(world, english_shards):
    """The documented way to keep 256 sequences a step on more ranks: pass the global batch and
    a micro batch that divides it (accumulation derived); one that cannot is refused with the
    flags to change."""
    path = str(REPO / "ds_configs" / "zero2.json")
    flags = ["--ds_config", path, "--data", str(english_shards), "--allow_precision_fallback"]
    flags += ["--global_batch_size", "256"]
    micro = 256 // world
    cfg = parse_args([*flags, "--micro_batch_size", str(micro)])
    plan = resolve_deepspeed_config(cfg, world, "cpu").batch
    assert (plan.global_batch, plan.micro_batch, plan.grad_accum) == (256, micro, 1)
    if world > 8:  # the default micro batch 32 cannot share 256 over more than 8 ranks
        with pytest.raises(BatchSizeError, match="--micro_batch_size") as e:
            resolve_deepspeed_config(parse_args(flags), world, "cpu")
        assert f"world size {world}" in str(e.value)
