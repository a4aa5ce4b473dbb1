"""``--arch modernbert``: transformers' ModernBERT block as a ModelSpec (pretrain.model.specs)."""

from __future__ import annotations

from typing import Any

from bertforge.pretrain.model.band_chunks import default_chunk, runs_dense_band
from bertforge.pretrain.model.model_config import ModelConfig
from bertforge.pretrain.model.modernbert.adapter import ADAPTER
from bertforge.pretrain.model.modernbert.arch import check_engine, layer_types, unsupported
from bertforge.pretrain.model.specs import ModelSpec, ObjectiveSpec, PretrainingModel


def _preset(name: str, hidden: int, layers: int, heads: int, ffn: int, max_pos: int):
    """A ModernBERT shape with its released defaults: no dropout, LayerNorm eps 1e-5, the
    vocabulary padded to a multiple of 64."""
    return ModelConfig(
        name=name,
        arch="modernbert",
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        max_position_embeddings=max_pos,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-5,
        vocab_multiple=64,
    )


# ModernBERT-base and -large as published (answerdotai/ModernBERT-*, config.json); tiny has
# three layers so that both a global and a local layer are in it.
PRESETS = {
    "modernbert-tiny": _preset("modernbert-tiny", 128, 3, 2, 192, 512),
    "modernbert-base": _preset("modernbert-base", 768, 22, 12, 1152, 8192),
    "modernbert-large": _preset("modernbert-large", 1024, 28, 16, 2624, 8192),
}


def build(
    cfg: ModelConfig, vocab_size: int, objective: ObjectiveSpec, max_seq_len: int | None
) -> PretrainingModel:
    """The model (``model.build_modernbert``; for replaced-token detection the pair). Imported
    here, not at the top: transformers' modeling code costs seconds of imports that the doctor,
    the dry run and the CLI skip."""
    from bertforge.pretrain.model.modernbert.model import build_modernbert  # heavy, only to build

    return build_modernbert(cfg, vocab_size, objective, max_seq_len)


def memory_terms(cfg: ModelConfig) -> dict[str, Any]:
    """The doctor's ModelShape fields of a ModernBERT: GeGLU width, global layers, and the keys
    a local layer's query chunk sees on the blocked path (pretrain.model.attention_paths)."""
    types = layer_types(cfg.num_hidden_layers, cfg.global_attn_every_n_layers)
    return {
        "intermediate": cfg.intermediate_size,
        "global_layers": types.count("full_attention"),
        "local_keys": 3 * default_chunk(cfg.local_attention // 2),
    }


def layer_activation_bytes(shape: Any, micro_batch: int, varlen: bool) -> list[int]:
    """16-bit activation bytes of each layer, global ones first (pretrain.doctor.memory_estimate's
    module doc): s·b·(16h + 8i) plus the attention scores of the path that runs (none kept but
    4 bytes of log-sum-exp per head and token on the unpadded varlen path)."""
    s, b, h, a = shape.seq_len, micro_batch, shape.hidden, shape.heads
    dense = s * b * (16 * h + 8 * shape.intermediate)
    if varlen:
        return [dense + 4 * a * s * b] * shape.layers
    chunk = shape.local_keys // 3
    padded_s = -(-s // chunk) * chunk  # the blocked path pads to whole chunks
    local = dense + 2 * a * b * padded_s * shape.local_keys
    glob = dense + 2 * a * b * s * s
    if runs_dense_band(s, chunk):  # short sequences: the local layers run the dense band
        local = glob
    return [glob] * shape.global_layers + [local] * (shape.layers - shape.global_layers)


def describe_layers(cfg: dict[str, Any]) -> str:
    """The dry run's line: where the layers attend and their rotary bases."""
    return (
        f"layers: global every {cfg['global_attn_every_n_layers']} layers, "
        f"the others a window of {cfg['local_attention']} tokens; rope theta "
        f"{cfg['global_rope_theta']:g} global, {cfg['local_rope_theta']:g} local"
    )


SPEC = ModelSpec(
    name="modernbert",
    display_name="ModernBERT",
    presets=PRESETS,
    default_preset="modernbert-tiny",
    build=build,
    adapter=ADAPTER,
    default_attention="document",
    objectives=("mlm", "rtd"),
    rotary=True,
    memory_terms=memory_terms,
    layer_activation_bytes=layer_activation_bytes,
    unsupported=unsupported,
    check_engine=check_engine,
    describe_layers=describe_layers,
    task_head_from_mlm=True,
)
