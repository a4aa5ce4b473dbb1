"""``--arch modernbert`` without building it: the layer pattern, the keys sized by the vocabulary,
and what the arch refuses before any rendezvous.

Light to import (no modeling code): the doctor, the dry run and the command line read the arch
through here and the spec; only a run that builds the model imports ``model.py``.
"""

from __future__ import annotations

from bertforge.pretrain.model.errors import ArchError
from bertforge.pretrain.model.model_config import ModelConfig
from bertforge.pretrain.model.specs import ObjectiveSpec

#: Rows sliced to the tokenizer's vocabulary on export (the decoder weight is the embedding's).
VOCAB_KEYS = ("model.embeddings.tok_embeddings.weight", "decoder.weight", "decoder.bias")


def unsupported(cfg: ModelConfig, objective: ObjectiveSpec) -> list[str]:
    """What only the BERT arch implements beyond the objectives (the spec lists the ones it
    trains), each "what: why" (empty: fine)."""
    if cfg.config_json:
        return [f"--config_json {cfg.config_json}: it reads a BERT config.json"]
    if objective.name == "rtd" and cfg.share_layers.strip().lower() != "none":
        return [
            f"--share_layers {cfg.share_layers} with --objective rtd: the generator and the "
            "discriminator would each need their own sharing"
        ]
    return []


def check_engine(cfg: ModelConfig, zero_stage: int, checkpointing: str) -> None:
    """Refuse the engine settings this arch cannot train with, naming the flags (before any
    rendezvous)."""
    shared = cfg.share_layers.strip().lower() != "none"
    if shared and zero_stage == 3 and checkpointing == "deepspeed":
        # Shared layers need DeepSpeed's non-reentrant checkpoint (pretrain.model.
        # checkpointing); under ZeRO-3 its recompute of ModernBERT's layers
        # meets released weights ("The size of tensor a (0) must match ... 192" in backward;
        # DeepSpeed 0.19.8, shared or not), while BERT's layers and torch's checkpoint train.
        raise ArchError(
            f"--arch modernbert with --share_layers {cfg.share_layers}, --activation_checkpointing "
            "deepspeed and ZeRO-3 (--ds_config) does not train: DeepSpeed's non-reentrant "
            "checkpoint, which shared layers need, loses ModernBERT's weights under ZeRO-3. "
            "Use --activation_checkpointing torch (the same recomputation), ZeRO-2, or "
            "--share_layers none."
        )


def layer_types(num_layers: int, every: int) -> list[str]:
    """ModernBERT's layer pattern: layer i attends globally when i % every == 0."""
    if every < 1:
        raise ArchError(f"--global_attn_every_n_layers must be at least 1, got {every}")
    return ["full_attention" if i % every == 0 else "sliding_attention" for i in range(num_layers)]
