"""--ema's update and skip rules (pretrain.components.ema) against a float64 oracle. The launch
with --ema is the anneal test's (tests/pretrain/schedule/test_anneal.py, helpers.ema)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers.ema import ema_oracle

from bertforge.pretrain.components.ema import EMA, load_ema
from bertforge.pretrain.config.flag_checks import EMAError, check_ema_decay


class _Engine:
    """What EMA reads of a DeepSpeed engine: the module, whether the step applied, ZeRO stage."""

    def __init__(self, module):
        self.module, self.applied = module, True

    def was_step_applied(self) -> bool:
        return self.applied

    def zero_optimization_stage(self) -> int:
        return 2


def test_the_ema_follows_applied_steps_only_and_round_trips(tmp_path):
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2)
    engine, ema = _Engine(module), EMA(0.8, rank=0)
    applied, ok, veto = [], SimpleNamespace(action="ok"), SimpleNamespace(action="skip")
    for i in range(6):
        with torch.no_grad():
            for p in module.parameters():
                p.add_(torch.randn_like(p))
        engine.applied = i != 2  # an fp16 overflow at the third step
        verdict = veto if i == 4 else ok  # the guard vetoes the fifth
        ema.after_step(engine, verdict)
        if engine.applied and verdict is ok:
            applied.append({k: v.detach().clone() for k, v in module.named_parameters()})
    want = ema_oracle(applied, 0.8)
    for k, v in ema.shadow.items():
        torch.testing.assert_close(v.double(), want[k], rtol=1e-6, atol=1e-7)
    ema.save(tmp_path)
    again = EMA(0.8, rank=0)
    again.load(tmp_path)
    assert all(torch.equal(again.shadow[k], ema.shadow[k]) for k in ema.shadow)
    other = EMA(0.8, rank=1)  # only rank 0 holds it
    other.after_step(engine)
    assert other.shadow is None and other.save(tmp_path / "x") is None


def test_bad_ema_values_and_a_checkpoint_without_one(tmp_path):
    for bad in (1.0, -0.5, 1.5):
        with pytest.raises(EMAError, match="--ema must be between 0 and 1"):
            check_ema_decay(bad)
    check_ema_decay(0.0)
    with pytest.raises(EMAError, match="trained without --ema"):
        load_ema(tmp_path)
