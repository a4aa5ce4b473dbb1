"""The optimizer's parameter groups, and the learning-rate schedule
(:mod:`pretrain.config.schedule`) as the ``LambdaLR`` DeepSpeed steps.

The optimizer itself is built by DeepSpeed from the config's ``optimizer`` block (FusedAdam on
GPUs, torch AdamW with ``torch_adam``, FusedLamb on GPUs), which
:mod:`pretrain.config.optimizer` fills from the flags; this module builds the schedule as a
:class:`ScheduleLR` (a ``LambdaLR``) whose state DeepSpeed saves and restores with the checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from bertforge.pretrain.config.schedule import Schedule

_NO_DECAY = ("bias", "LayerNorm.weight", "layernorm.weight", "layer_norm.weight", "norm.weight")


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

    A checkpoint holds each schedule's lr curve (:meth:`Schedule.lr_state`: the kind and the
    segments, as every checkpoint has). ``LambdaLR.load_state_dict`` would write the saved fields
    into whatever object this launch's flags built (a warmup_decay checkpoint into a wsd object
    makes a mix of both); here the saved object is rebuilt instead. ``loaded_from_none``: the
    last checkpoint loaded had no step schedule (its run used ``--schedule_clock time``); the
    flags' schedule stays.
    """

    loaded_from_none = False

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.pop("loaded_from_none", None)  # about this launch's load, not the schedule
        state["lr_lambdas"] = [  # the lr curve only (a plan's phases go into the trainer state)
            fn.lr_state() if isinstance(fn, Schedule) else saved
            for fn, saved in zip(self.lr_lambdas, state["lr_lambdas"])
        ]
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
