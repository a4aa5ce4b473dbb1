"""Precision choice: fp16 (dynamic loss scaling), bf16 or fp32, checked against the device.

DeepSpeed fails deep inside ``initialize`` ("Type fp16 is not supported on your device") when the
config asks for a precision the accelerator lacks; this module says so up front, and falls back
to fp32 only when the user passed ``--allow_precision_fallback``.
"""

from __future__ import annotations

import copy
from typing import Any

from bertforge.errors import UserError
from bertforge.pretrain.config.train_config import PrecisionConfig

DEFAULT_FP16 = {
    "enabled": True,
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}


class PrecisionError(UserError, RuntimeError):
    """The requested precision cannot run on this device."""


#: DeepSpeed's precision blocks (``bfloat16`` is its older name for ``bf16``) -> the precision
PRECISION_BLOCKS = {"fp16": "fp16", "bf16": "bf16", "bfloat16": "bf16"}


def enabled_precision_block(ds_config: dict[str, Any]) -> str | None:
    """The config's precision block whose ``enabled`` is true (fp16 first), or None: fp32."""
    return next((k for k in PRECISION_BLOCKS if ds_config.get(k, {}).get("enabled")), None)


def requested_precision(ds_config: dict[str, Any], cfg: PrecisionConfig) -> str:
    """fp16 / bf16 / fp32 from the flag, else from the config's enabled block."""
    if cfg.precision:
        return cfg.precision
    block = enabled_precision_block(ds_config)
    return PRECISION_BLOCKS[block] if block else "fp32"


def supported_precisions() -> dict[str, bool]:
    """What this process's DeepSpeed accelerator can train in."""
    # Lazy: deepspeed takes seconds to import; the commands that import this module without running
    # a job (--help, the doctor) do without it.
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    return {
        "fp32": True,
        "fp16": bool(accel.is_fp16_supported()),
        "bf16": bool(accel.is_bf16_supported()),
    }


def resolve_precision(
    ds_config: dict[str, Any], cfg: PrecisionConfig, source: str = "DeepSpeed config"
) -> tuple[dict[str, Any], str, str | None]:
    """Return (config copy with exactly one precision enabled, precision, fallback note or None)."""
    # Lazy: deepspeed (seconds to import) only when a job runs; see the first import here.
    from deepspeed.accelerator import get_accelerator

    want = requested_precision(ds_config, cfg)
    note = None
    if not supported_precisions()[want]:
        device = get_accelerator().device_name()
        msg = (
            f"{want} is not supported on this {device} device (asked for by "
            f"{'--precision' if cfg.precision else source})."
        )
        if not cfg.allow_precision_fallback:
            raise PrecisionError(
                f"{msg} Pass --allow_precision_fallback to train in fp32 instead, or choose "
                f"--precision fp32 / bf16, or use a config without '{want}' enabled."
            )
        note = f"{msg} Falling back to fp32 (--allow_precision_fallback)."
        want = "fp32"
    out = copy.deepcopy(ds_config)
    fp16 = {**DEFAULT_FP16, **out.get("fp16", {})}
    out.pop("bfloat16", None)
    fp16["enabled"] = want == "fp16"
    out["fp16"] = fp16
    out["bf16"] = {**out.get("bf16", {}), "enabled": want == "bf16"}
    return out, want, note
