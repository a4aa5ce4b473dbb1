"""Unit checks behind the shipped-config runs in tests/e2e/: what the CPU gets from each config."""

from __future__ import annotations

import json

import pytest
from helpers.commands import REPO

from bertforge.pretrain.config.optimizer import configure_optimizer
from bertforge.pretrain.config.train_config import OptimConfig


@pytest.mark.parametrize("name", ["zero2_bf16.json", "zero3_bf16.json", "zero2.json"])
def test_cpu_gets_torch_adamw_unless_the_config_chooses(name):
    """DeepSpeed's CPU FusedAdam breaks exact resume (beta^t by product, then by pow() after a
    resume) and needs a JIT build: on the CPU the shipped configs train with torch's AdamW."""
    ds = json.loads((REPO / "ds_configs" / name).read_text())
    assert "torch_adam" not in ds["optimizer"]["params"]
    assert configure_optimizer(ds, OptimConfig(), "cpu")["optimizer"]["params"]["torch_adam"]
    assert "torch_adam" not in configure_optimizer(ds, OptimConfig(), "cuda")["optimizer"]["params"]
    ds["optimizer"]["params"]["torch_adam"] = False  # an explicit choice is kept
    assert not configure_optimizer(ds, OptimConfig(), "cpu")["optimizer"]["params"]["torch_adam"]


def test_cpu_torch_adamw_is_the_fused_one_unless_the_config_chooses():
    """torch's fused CPU AdamW (one kernel) in place of the for-each one; DeepSpeed's own CPU
    Adam and an explicit "fused"/"foreach" are left as they are."""
    ds = json.loads((REPO / "ds_configs" / "cpu.json").read_text())
    assert configure_optimizer(ds, OptimConfig(), "cpu")["optimizer"]["params"]["fused"] is True
    for explicit in ({"fused": False}, {"foreach": True}, {"torch_adam": False}):
        ds["optimizer"]["params"].update(explicit)
        params = configure_optimizer(ds, OptimConfig(), "cpu")["optimizer"]["params"]
        assert not params.get("fused"), explicit
        ds = json.loads((REPO / "ds_configs" / "cpu.json").read_text())
