"""``--arch bert``: the 2018 BERT as a :class:`~pretrain.model.specs.ModelSpec`."""

from __future__ import annotations

from typing import Any

from bertforge.pretrain.model.bert.adapter import ADAPTER
from bertforge.pretrain.model.model_config import ModelConfig
from bertforge.pretrain.model.specs import ModelSpec, ObjectiveSpec, PretrainingModel


def _preset(name: str, hidden: int, layers: int, heads: int, ffn: int) -> ModelConfig:
    return ModelConfig(
        name=name,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
    )


PRESETS = {
    "tiny": _preset("tiny", 128, 2, 2, 512),
    "small": _preset("small", 512, 4, 8, 2048),
    "base": _preset("base", 768, 12, 12, 3072),
    "large": _preset("large", 1024, 24, 16, 4096),
}


def build(
    cfg: ModelConfig, vocab_size: int, objective: ObjectiveSpec, max_seq_len: int | None
) -> PretrainingModel:
    """The model (``model.build_bert``; for replaced-token detection the ELECTRA pair). Imported
    here, not at the top: transformers' modeling code costs about 4 s of imports that the
    doctor, the dry run and the command line skip."""
    from bertforge.pretrain.model.bert.model import build_bert  # heavy, only to build

    return build_bert(cfg, vocab_size, objective, max_seq_len)


def unsupported(cfg: ModelConfig, objective: ObjectiveSpec) -> list[str]:
    """What BERT does not train: cross-layer sharing with replaced-token detection."""
    if objective.name == "rtd" and cfg.share_layers != "none":
        return [
            f"--share_layers {cfg.share_layers} with --objective rtd: the ELECTRA pair is built "
            "on transformers' Electra classes, which have no shared layers"
        ]
    return []


def layer_activation_bytes(shape: Any, micro_batch: int, varlen: bool) -> list[float]:
    """Korthikanti et al. 2022: s·b·h·(34 + 5·a·s/h) bytes per layer in 16 bit (an upper bound:
    fused attention does not keep the s×s scores); BERT has no unpadded path."""
    s, b, h, a = shape.seq_len, micro_batch, shape.hidden, shape.heads
    return [s * b * h * (34 + 5 * a * s / h)] * shape.layers


SPEC = ModelSpec(
    name="bert",
    display_name="BERT",
    presets=PRESETS,
    default_preset="tiny",
    build=build,
    adapter=ADAPTER,
    default_attention="full",
    objectives=("mlm", "mlm+nsp", "mlm+sop", "rtd"),
    rotary=False,
    memory_terms=lambda cfg: {},
    layer_activation_bytes=layer_activation_bytes,
    unsupported=unsupported,
)
