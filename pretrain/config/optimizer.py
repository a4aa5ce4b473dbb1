"""The optimizer block of the DeepSpeed config, filled from the flags (:func:`configure_optimizer`).

DeepSpeed builds the optimizer from that block (FusedAdam on GPUs, torch AdamW with
``torch_adam``, FusedLamb on GPUs); this module fills it from the recipe and rejects what cannot
run here. A value is given in the recipe or in the JSON, never both (:mod:`.one_home`); given in
neither, it is the default here. :mod:`pretrain.config.ds_config` applies the block with the
batch sizes and the precision.
"""

from __future__ import annotations

import copy
from typing import Any

from bertforge.errors import UserError
from bertforge.pretrain.config.train_config import (
    DEFAULT_GRADIENT_CLIPPING,
    DEFAULT_LR,
    DEFAULT_OPTIMIZER,
    DEFAULT_WEIGHT_DECAY,
    OptimConfig,
)


class OptimizerConfigError(UserError, ValueError):
    """An optimizer block that cannot run on this machine or has unset values."""


def configure_optimizer(
    ds_config: dict[str, Any], cfg: OptimConfig, device: str, source: str = "DeepSpeed config"
) -> dict[str, Any]:
    """Return a copy of ``ds_config`` whose optimizer block holds the recipe's values (or the
    defaults where neither file gives one) and no "auto".

    ``device`` is the accelerator name ("cpu", "cuda", ...): LAMB exists only as a CUDA kernel,
    and on the CPU AdamW is torch's unless the config sets ``torch_adam`` itself.
    """
    out = copy.deepcopy(ds_config)
    opt = out.setdefault("optimizer", {})
    opt.setdefault("type", DEFAULT_OPTIMIZER)
    params = opt.setdefault("params", {})
    for key in ("lr", "weight_decay"):  # "auto" (HF's convention): the recipe's value
        if params.get(key) == "auto":
            del params[key]
    if cfg.optimizer == "adamw":
        opt["type"] = "AdamW"
    elif cfg.optimizer == "lamb":
        opt["type"] = "Lamb"
        params.pop("torch_adam", None)
    kind = str(opt.get("type", "")).lower()
    if kind not in ("adam", "adamw", "lamb"):
        raise OptimizerConfigError(
            f"{source}: optimizer.type {opt.get('type')!r} is not supported; use AdamW or Lamb"
        )
    if kind == "lamb":
        if device != "cuda":
            raise OptimizerConfigError(
                f"{source}: optimizer Lamb is DeepSpeed's FusedLamb, a CUDA kernel; this machine's "
                f"accelerator is {device!r}. Use AdamW ("
                + ("--optimizer adamw)." if cfg.optimizer else f"optimizer.type in {source}).")
            )
        if out.get("zero_optimization", {}).get("stage", 0) > 0:
            out["zero_allow_untested_optimizer"] = True  # FusedLamb under ZeRO needs this opt-in
    if kind in ("adam", "adamw") and device == "cpu":
        # DeepSpeed's CPU FusedAdam is a C++ op built by JIT at first use (g++ and ninja, tens
        # of seconds), and it tracks beta^t by multiplying once per step in float32 but
        # recomputes it with pow() after a resume: the first update after a resume then differs
        # in the last bit and exact resume is lost. torch.optim.AdamW has neither problem; an
        # explicit "torch_adam": false in the config keeps DeepSpeed's op.
        params.setdefault("torch_adam", True)
        if params["torch_adam"] and not params.get("foreach"):
            # torch's fused CPU AdamW: one kernel over all tensors. The for-each AdamW took 115 ms
            # per step on one rank's half of all-MiniLM-L6-v2 (fused: see docs/benchmarks.md,
            # "Continued from all-MiniLM-L6-v2"). An explicit "fused": false keeps the for-each.
            params.setdefault("fused", True)
    if cfg.lr is not None:
        params["lr"] = cfg.lr
    if cfg.weight_decay is not None:
        params["weight_decay"] = cfg.weight_decay
    params.setdefault("lr", DEFAULT_LR)
    params.setdefault("weight_decay", DEFAULT_WEIGHT_DECAY)
    for k, v in params.items():
        if v == "auto":  # DeepSpeed raises a TypeError deep inside on "auto" in optimizer params
            raise OptimizerConfigError(
                f'{source}: optimizer.params.{k} is "auto"; only the HF '
                "Trainer fills that. Give a number."
            )
    if cfg.gradient_clipping is not None:
        out["gradient_clipping"] = cfg.gradient_clipping
    elif out.get("gradient_clipping") in (None, "auto"):
        out["gradient_clipping"] = DEFAULT_GRADIENT_CLIPPING
    return out
