"""``--compile`` (recipe ``speed.compile``): torch.compile the encoder stacks of a built model.

Each model names its encoder stacks (``encoders()``: the BERT or ModernBERT encoder; both of an
RTD pair). They are compiled in place (``nn.Module.compile``), so parameter names, state dicts,
checkpoints and exports stay those of the eager model, and a run may resume with or without it.
Only the encoders: the masked-row gather, the fused loss kernel and RTD's sampling have shapes
that change every step (the number of masked rows), which would make dynamo recompile or break
the graph there, and they are a small share of the step. The first step pays the compilation
(the trainer's log and the first step time in metrics.jsonl show it).
"""

from __future__ import annotations

import contextlib

import torch

from bertforge.logs import get_logger
from bertforge.pretrain.model.errors import ArchError

log = get_logger(__name__)


def check_compile(enabled: bool, zero_stage: int) -> None:
    """Refuse ``--compile`` where it is not tested to train: ZeRO-3 partitions the weights and
    gathers them in module hooks that a compiled encoder would bypass."""
    if enabled and zero_stage == 3:
        raise ArchError(
            "--compile with ZeRO-3 (--ds_config's zero_optimization.stage 3) is not supported: "
            "ZeRO-3 gathers each layer's weights in module hooks that the compiled encoder "
            "would bypass. Use ZeRO-2 (ds_configs/zero2.json), or drop --compile."
        )


def compile_encoders(model: torch.nn.Module) -> int:
    """Compile ``model.encoders()`` in place; the number of stacks compiled."""
    stacks = list(model.encoders())
    for stack in stacks:
        stack.compile()
    log.info(
        "--compile: %d encoder stack(s) compiled with torch.compile (inductor); the first "
        "step includes the compilation, validation runs them eagerly",
        len(stacks),
    )
    return len(stacks)


def eager() -> contextlib.AbstractContextManager:
    """Run compiled modules eagerly inside (validation): no compilation for its forwards."""
    return torch.compiler.set_stance("force_eager")
