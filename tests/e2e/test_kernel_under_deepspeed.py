"""masked_lm_loss inside DeepSpeed: ZeRO-3 (decoder weight tied to the word embeddings and gathered
by DeepSpeed), fp16 with dynamic loss scaling, gradient accumulation; triton and torch impls agree.

Runs one DeepSpeed process in a subprocess (this file is also that script), on the test device:
one GPU with NCCL on a GPU node, the CPU with gloo and the Triton interpreter elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

# Not helpers.commands.REPO: this file also runs as a script, without tests/ on sys.path.
REPO = Path(__file__).resolve().parents[2]


def _train(impl: str) -> dict:
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    from bertforge.kernels import api as kernels

    if get_accelerator().device_name() == "cpu":
        # DeepSpeed refuses fp16 on CPUs without AVX512-FP16; loss scaling works the same anyway.
        type(get_accelerator()).is_fp16_supported = lambda self: True

    class TinyMLM(torch.nn.Module):
        def __init__(self, vocab: int = 1003, padded: int = 1008, hidden: int = 16):
            super().__init__()
            self.embed = torch.nn.Embedding(padded, hidden)
            self.layer = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.GELU())
            self.bias = torch.nn.Parameter(torch.zeros(padded))
            self.vocab = vocab
            # The decoder reuses the embedding matrix outside its module: tell ZeRO-3 to gather it.
            deepspeed.zero.register_external_parameter(self, self.embed.weight)

        def forward(self, ids, labels, normalizer):
            h = self.layer(self.embed(ids))
            return kernels.masked_lm_loss(
                h,
                self.embed.weight,
                self.bias,
                labels,
                vocab_size=self.vocab,
                normalizer=normalizer,
                impl=impl,
            )

    torch.manual_seed(0)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 12},
        "zero_optimization": {"stage": 3},
        "steps_per_print": 10**6,
    }
    model = TinyMLM()
    before = model.embed.weight.detach().clone()
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):  # optimizer steps
        batches = []
        for _ in range(2):  # micro-batches; the last has no masked token at all
            ids = torch.randint(0, 1003, (4, 12), generator=g)
            masked = torch.rand(4, 12, generator=g) < 0.3
            batches.append((ids, torch.where(masked, ids, kernels.IGNORE_INDEX)))
        batches[-1] = (batches[-1][0], torch.full((4, 12), kernels.IGNORE_INDEX))
        # Global normalisation: every masked token of the step weighs the same. engine.backward
        # divides by the accumulation steps, so multiply them back in.
        total = sum(int((y != kernels.IGNORE_INDEX).sum()) for _, y in batches) / 2
        for ids, labels in batches:  # on the engine's device: CUDA on a GPU node, else the CPU
            out = engine(ids.to(engine.device), labels.to(engine.device), total)
            engine.backward(out.loss)
            engine.step()
            losses.append(float(out.loss))
    with deepspeed.zero.GatheredParameters([engine.module.embed.weight]):
        moved = float((engine.module.embed.weight.detach().float() - before).abs().max())
    return {
        "losses": losses,
        "scale": float(engine.optimizer.cur_scale),
        "skipped": int(engine.skipped_steps),
        "moved": moved,
    }


@pytest.mark.slow
def test_zero3_fp16_tied_decoder_both_impls(tmp_path):
    from helpers.commands import run_cli

    from bertforge.pretrain.distributed.startup import free_port

    env = {  # TRITON_INTERPRET comes from conftest, which sets it only where no CUDA is usable
        "OMP_NUM_THREADS": "1",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": str(REPO),
    }
    proc = run_cli(__file__, str(tmp_path / "result.json"), env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((tmp_path / "result.json").read_text())
    torch_run, triton_run = res["torch"], res["triton"]
    for run in (torch_run, triton_run):
        assert run["skipped"] == 0 and run["scale"] == 2.0**12  # scaled, and no fp16 overflow
        assert run["moved"] > 0  # the tied weight was trained
        assert all(math.isfinite(loss) for loss in run["losses"])
        assert run["losses"][1::2] == [0.0, 0.0, 0.0]  # the all-ignored micro-batches
    for a, b in zip(torch_run["losses"], triton_run["losses"]):
        assert abs(a - b) <= 1e-4 * max(abs(a), 1.0)
    assert abs(torch_run["moved"] - triton_run["moved"]) <= 1e-3 * torch_run["moved"]


if __name__ == "__main__":
    result = {impl: _train(impl) for impl in ("torch", "triton")}
    tmp = sys.argv[1] + ".tmp"
    Path(tmp).write_text(json.dumps(result))
    os.replace(tmp, sys.argv[1])
