"""Optimizer choice, and the learning-rate schedule (:mod:`pretrain.config.schedule`) as the
``LambdaLR`` DeepSpeed steps.

The optimizer itself is built by DeepSpeed from the config's ``optimizer`` block (FusedAdam on
GPUs, torch AdamW with ``torch_adam``, FusedLamb on GPUs); this module fills that block from the
flags, rejects what cannot run here, and builds the schedule as a :class:`ScheduleLR` (a
``LambdaLR``) whose state DeepSpeed saves and restores with the checkpoint.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch

from bertforge.errors import UserError
from bertforge.pretrain.config.schedule import Schedule
from bertforge.pretrain.config.train_config import OptimConfig

_NO_DECAY = ("bias", "LayerNorm.weight", "layernorm.weight", "layer_norm.weight", "norm.weight")


class OptimizerConfigError(UserError, ValueError):
    """An optimizer block that cannot run on this machine or has unset values."""


def configure_optimizer(
    ds_config: dict[str, Any], cfg: OptimConfig, device: str, source: str = "DeepSpeed config"
) -> dict[str, Any]:
    """Return a copy of ``ds_config`` whose optimizer block reflects the flags and has no "auto".

    ``device`` is the accelerator name ("cpu", "cuda", ...): LAMB exists only as a CUDA kernel,
    and on the CPU AdamW is torch's unless the config sets ``torch_adam`` itself.
    """
    out = copy.deepcopy(ds_config)
    opt = out.setdefault("optimizer", {"type": "AdamW", "params": {}})
    params = opt.setdefault("params", {})
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
                f"accelerator is {device!r}. Use --optimizer adamw."
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
    params.setdefault("lr", 1e-4)
    params.setdefault("weight_decay", 0.01)
    for k, v in params.items():
        if v == "auto":  # DeepSpeed raises a TypeError deep inside on "auto" in optimizer params
            raise OptimizerConfigError(
                f'{source}: optimizer.params.{k} is "auto"; only the HF '
                "Trainer fills that. Give a number or the matching flag."
            )
    if cfg.gradient_clipping is not None:
        out["gradient_clipping"] = cfg.gradient_clipping
    elif out.get("gradient_clipping") == "auto":
        out["gradient_clipping"] = 1.0
    return out


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: decayed weights, and biases/LayerNorm/embeddings-norm without decay."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or any(k in name for k in _NO_DECAY) else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


class ScheduleLR(torch.optim.lr_scheduler.LambdaLR):
    """The trainer's ``LambdaLR``; a checkpoint's schedule is restored as it was saved.

    ``LambdaLR.load_state_dict`` would write the saved fields into whatever object this launch's
    flags built (a warmup_decay checkpoint into a wsd object makes a mix of both); here the
    saved object is rebuilt instead. ``loaded_from_none``: the last checkpoint loaded had no step
    schedule (its run used ``--schedule_clock time``); the flags' schedule stays.
    """

    loaded_from_none = False

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.pop("loaded_from_none", None)  # about this launch's load, not the schedule
        return state

    def load_state_dict(self, state_dict: dict[str, Any] | None) -> None:
        if state_dict is not None:
            saved = state_dict["lr_lambdas"]
            self.__dict__.update({k: v for k, v in state_dict.items() if k != "lr_lambdas"})
            self.lr_lambdas = [
                Schedule.from_saved(fields) if fields is not None else fn
                for fn, fields in zip(self.lr_lambdas, saved)
            ]
        self.loaded_from_none = state_dict is None  # of the latest load


def lr_scheduler_factory(schedule: Schedule):
    """A callable DeepSpeed gives the optimizer it built: ``optimizer -> ScheduleLR``."""

    def make(optimizer: torch.optim.Optimizer) -> ScheduleLR:
        return ScheduleLR(optimizer, schedule)

    return make


def current_lr(optimizer: torch.optim.Optimizer | Iterable) -> float:
    """The first param group's learning rate."""
    groups = optimizer.param_groups if hasattr(optimizer, "param_groups") else optimizer
    return float(next(iter(groups))["lr"])
