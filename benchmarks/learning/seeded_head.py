"""One ``BertForMaskedLM`` folder that every side of a continued-pretraining comparison loads.

A published encoder (e.g. all-MiniLM-L6-v2, a ``BertModel``) has no MLM head. Were each side to
initialise its own, the sides would differ at step 0. :func:`seeded_mlm_folder` loads the encoder
once, initialises the head from one seeded generator (BERT's init: transform weights normal(0,
initializer_range), biases 0, LayerNorm 1/0; the decoder is tied to the word embeddings) and
saves the whole model with the checkpoint's tokenizer files: both sides then load that folder
fully, and nothing differs at step 0.

With ``bf16_values=True`` every weight is rounded to the nearest bf16 value (stored as fp32):
DeepSpeed's bf16 mode casts the model to bf16 and builds its fp32 master weights from that cast,
so from an fp32 folder ours would start from rounded weights while HF's bf16 autocast keeps the
fp32 ones (a step-0 held-out loss 3.7e-3 apart with all-MiniLM-L6-v2). Rounded once here, the
cast is exact and both sides start from the same numbers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bertforge.files import publish_dir
from bertforge.logs import get_logger

log = get_logger(__name__)

TOKENIZER_FILES = (
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def _init_head(model, seed: int) -> None:
    """BERT's initialisation of the MLM head from one generator seeded with ``seed``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    head = model.cls.predictions
    std = model.config.initializer_range
    with torch.no_grad():
        dense = head.transform.dense
        dense.weight.copy_(torch.randn(dense.weight.shape, generator=gen) * std)
        dense.bias.zero_()
        head.transform.LayerNorm.weight.fill_(1.0)
        head.transform.LayerNorm.bias.zero_()
        head.bias.zero_()


def _round_to_bf16(model) -> None:
    """Every parameter and buffer of floating type to its nearest bf16 value, kept in fp32."""
    import torch

    with torch.no_grad():
        for t in (*model.parameters(), *model.buffers()):
            if t.is_floating_point():
                t.copy_(t.to(torch.bfloat16).float())


def seeded_mlm_folder(
    checkpoint: Path, out: Path, seed: int = 0, bf16_values: bool = False
) -> Path:
    """OUT: ``checkpoint``'s encoder as a ``BertForMaskedLM`` with a head seeded by ``seed``,
    plus its tokenizer files; ``bf16_values``: weights rounded to bf16 values. Written once (a
    folder with config.json is kept as it is)."""
    import torch
    from transformers import BertForMaskedLM

    if (out / "config.json").is_file():
        return out
    if not (checkpoint / "config.json").is_file():
        raise SystemExit(f"error: --init_from {checkpoint}: no config.json there")
    model = BertForMaskedLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    _init_head(model, seed)
    model.tie_weights()  # the decoder is the word embeddings, as in BERT
    if bf16_values:
        _round_to_bf16(model)
    with publish_dir(out, replace=True) as tmp:
        model.save_pretrained(str(tmp))
        for name in TOKENIZER_FILES:
            if (checkpoint / name).is_file():
                shutil.copy2(checkpoint / name, tmp / name)
        if not (tmp / "vocab.txt").is_file() and not (tmp / "tokenizer.json").is_file():
            raise SystemExit(f"error: --init_from {checkpoint}: no tokenizer files there")
    rounded = ", weights rounded to bf16 values" if bf16_values else ""
    log.info(f"{out}: {checkpoint.name} with an MLM head seeded by {seed}{rounded}")
    return out
