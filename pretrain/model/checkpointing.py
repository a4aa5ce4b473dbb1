"""Activation checkpointing of a transformers encoder, one function for every architecture."""

from __future__ import annotations

CHECKPOINTING_MODES = ("none", "torch", "deepspeed")


def apply_activation_checkpointing(model, mode: str, *, shares_layers: bool = False) -> None:
    """Recompute `model`'s encoder layers in backward: "none", "torch" (non-reentrant torch
    checkpoint) or "deepspeed" (deepspeed.checkpointing.checkpoint: the trainer must have called
    `deepspeed.checkpointing.configure(None, deepspeed_config=...)` after init_distributed).
    `model` is a transformers PreTrainedModel whose layers are GradientCheckpointingLayers."""
    if mode not in CHECKPOINTING_MODES:
        raise ValueError(f"activation checkpointing {mode!r}: choose one of {CHECKPOINTING_MODES}")
    if mode == "none":
        model._set_gradient_checkpointing(enable=False)
    elif mode == "torch":
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    else:
        # Lazy: deepspeed takes seconds to import; the commands that import this module without
        # running a job (--help, the doctor) do without it.
        import deepspeed

        # DeepSpeed's reentrant checkpoint runs a separate backward per layer, so a shared
        # weight would receive (and ZeRO reduce) one gradient per layer that uses it, which
        # ZeRO refuses; the non-reentrant variant keeps one backward graph (one gradient,
        # summed by autograd) and honours the same activation-checkpointing config.
        func = (
            deepspeed.checkpointing.non_reentrant_checkpoint
            if shares_layers
            else deepspeed.checkpointing.checkpoint
        )
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=func)
    model.checkpointing = mode
