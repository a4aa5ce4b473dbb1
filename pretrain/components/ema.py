"""An exponential moving average of the weights (``--ema DECAY``), kept on rank 0 in fp32.

After each applied optimizer step, ``ema = d * ema + (1 - d) * weights``; it starts as the
weights after the first applied step. A skipped step (fp16 overflow, the guard's veto) leaves it
as it is. Under ZeRO-3 every rank takes part in gathering the full parameters
(``deepspeed.zero.GatheredParameters``: one all-gather of the model per step); under ZeRO-0/1/2
every rank holds the full module already and only rank 0 reads it. Cost on rank 0: one fp32
copy of the model in host memory and one multiply-add over it per step.

Saved with each checkpoint as ``ema.safetensors`` inside the checkpoint folder before the
checkpoint is committed, so the ``COMPLETE`` manifest lists it (a torn write makes the checkpoint
incomplete); loaded back on resume and rollback, so a resumed run's EMA is the uninterrupted
run's. ``bertforge export RUN --ema`` exports it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from bertforge.files import write_bytes_atomic
from bertforge.pretrain.config.flag_checks import EMAError, check_ema_decay

EMA_FILE = "ema.safetensors"


def ema_step(shadow: dict[str, torch.Tensor] | None, weights, decay: float):
    """One update of ``shadow`` ({name: fp32 tensor}, or None before the first) by ``weights``
    ({name: tensor}); returns the shadow (updated in place once it exists)."""
    if shadow is None:
        return {k: w.detach().float().clone() for k, w in weights.items()}
    for k, w in weights.items():
        shadow[k].mul_(decay).add_(w.detach().float(), alpha=1.0 - decay)
    return shadow


class EMA:
    """The run's weight average (see the module doc); ``rank`` 0 holds it."""

    def __init__(self, decay: float, rank: int):
        check_ema_decay(decay)
        self.decay, self.rank = decay, rank
        self.shadow: dict[str, torch.Tensor] | None = None

    def after_step(self, engine, verdict=None) -> None:
        """Update from ``engine``'s module after a step (all ranks call it; under ZeRO-3 they
        gather together); a skipped step or a guard's veto (``verdict`` not ok) does nothing."""
        if not engine.was_step_applied() or (verdict is not None and verdict.action != "ok"):
            return
        module = engine.module
        params = dict(module.named_parameters())
        gather = contextlib.nullcontext()
        if engine.zero_optimization_stage() == 3:
            # Lazy: deepspeed takes seconds to import; the commands that import this module without
            # running a job (--help, the doctor) do without it.
            import deepspeed

            gather = deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None)
        with gather, torch.no_grad():
            if self.rank == 0:
                self.shadow = ema_step(self.shadow, params, self.decay)

    def save(self, ckpt: Path) -> Path | None:
        """Rank 0: write the EMA into checkpoint folder ``ckpt`` (atomic); returns the file."""
        if self.rank != 0 or self.shadow is None:
            return None

        path = ckpt / EMA_FILE
        write_bytes_atomic(path, save({k: v.contiguous() for k, v in self.shadow.items()}))
        return path

    def load(self, ckpt: Path) -> None:
        """Rank 0: the EMA saved with ``ckpt`` (none there: the checkpoint was saved before the
        first applied step, or without --ema, and the EMA starts again at the next step)."""
        if self.rank != 0:
            return
        path = ckpt / EMA_FILE
        self.shadow = load_ema(ckpt) if path.is_file() else None


def load_ema(ckpt: Path) -> dict[str, torch.Tensor]:
    """The EMA weights saved with checkpoint ``ckpt``; an error naming --ema when it has none."""
    path = Path(ckpt) / EMA_FILE
    if not path.is_file():
        raise EMAError(
            f"--ema: the checkpoint {ckpt} holds no {EMA_FILE} (its run was trained without "
            "--ema DECAY); export its weights without --ema"
        )

    return load_file(str(path))
