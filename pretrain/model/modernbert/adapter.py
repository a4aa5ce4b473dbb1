"""ModernBERT's Hugging Face checkpoints: their config.json as our fields (legacy
``global_rope_theta`` keys or ``rope_parameters``), their keys as our names, and the tokenizer
ids an exported config names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import ModernBertConfig

from bertforge.pretrain.model.errors import InitError
from bertforge.pretrain.model.modernbert.arch import VOCAB_KEYS, layer_types
from bertforge.pretrain.model.specs import StateDictAdapter

#: ModelConfig fields a ModernBERT checkpoint sets.
FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "layer_norm_eps",
    "initializer_range",
    "local_attention",
    "global_attn_every_n_layers",
    "global_rope_theta",
    "local_rope_theta",
)

#: ModernBertConfig keys whose other values our block cannot hold (no biases in the linear and
#: norm layers, a bias-free GELU head, the decoder tied to the token embeddings).
_FIXED = {
    "norm_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "classifier_bias": False,
    "classifier_activation": "gelu",
    "tie_word_embeddings": True,
}


def _global_every(types: list[str]) -> int | None:
    """The N of ModernBERT's layer pattern (layer i global when i % N == 0) that gives ``types``,
    or None when no N does (our config holds only that pattern)."""
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    every = full[1] if len(full) > 1 else max(len(types), 1)  # only layer 0 global: N >= layers
    return every if layer_types(len(types), every) == list(types) else None


def _unholdable(full: ModernBertConfig) -> tuple[list[str], int | None]:
    """What of ``full`` our block cannot hold (one line per key), and its global-layer period."""
    wrong = [
        f"{k}: {getattr(full, k)!r} (this trainer's ModernBERT block has {v!r})"
        for k, v in _FIXED.items()
        if getattr(full, k) != v
    ]
    rope = full.rope_parameters
    wrong += [
        f"rope_parameters.{t}.rope_type: {rope[t]['rope_type']!r} (only 'default' rotary here)"
        for t in ("full_attention", "sliding_attention")
        if rope[t].get("rope_type", "default") != "default"
    ]
    every = _global_every(full.layer_types)
    if every is None:
        wrong.append(
            f"layer_types: {full.layer_types} (here layer i attends globally exactly when "
            "i % global_attn_every_n_layers == 0)"
        )
    return wrong, every


def fields_from_hf(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig fields of a ModernBERT config.json; what our block cannot hold is an InitError
    naming the key. from_dict reads legacy files (global_rope_theta, global_attn_every_n_layers)
    and new ones (rope_parameters, layer_types) alike."""
    cfg_file = path / "config.json"
    try:
        full = ModernBertConfig.from_dict(config)
    except Exception as e:  # transformers' strict config raises several types for a bad value
        raise InitError(
            f"--init_from {path}: {cfg_file} is not a valid ModernBertConfig "
            f"({type(e).__name__}: {e})."
        ) from e
    wrong, every = _unholdable(full)
    if wrong:
        raise InitError(
            f"--init_from {path}: {cfg_file} describes a ModernBERT that this trainer's block "
            "cannot hold:\n  " + "\n  ".join(wrong) + "\nStart from a checkpoint with "
            "transformers' defaults for those keys (as answerdotai/ModernBERT-* have)."
        )
    rope = full.rope_parameters
    return {
        "arch": "modernbert",
        "hidden_size": full.hidden_size,
        "num_hidden_layers": full.num_hidden_layers,
        "num_attention_heads": full.num_attention_heads,
        "intermediate_size": full.intermediate_size,
        "max_position_embeddings": full.max_position_embeddings,
        "hidden_act": full.hidden_activation,
        "hidden_dropout_prob": full.mlp_dropout,  # our config has one rate for embeddings and MLP
        "attention_probs_dropout_prob": full.attention_dropout,
        "layer_norm_eps": full.norm_eps,
        "initializer_range": full.initializer_range,
        "local_attention": full.local_attention,
        "global_attn_every_n_layers": every,
        "global_rope_theta": float(rope["full_attention"]["rope_theta"]),
        "local_rope_theta": float(rope["sliding_attention"]["rope_theta"]),
    }


def to_ours(key: str) -> str:
    """transformers ModernBertForMaskedLM names, whose encoder *is* under model.: a DeepSpeed
    module. prefix dropped, bare ModernBertModel keys put under model."""
    k = key
    while k.startswith("module."):
        k = k[len("module.") :]
    if k.startswith(("embeddings.", "layers.", "final_norm.")):
        k = "model." + k
    return k


def set_tokenizer_ids(conf: ModernBertConfig, tokenizer) -> None:
    """Write the tokenizer's [PAD]/[CLS]/[SEP] ids into an exported config (transformers'
    defaults are those of ModernBERT's own 50k vocabulary)."""
    conf.pad_token_id = tokenizer.pad_token_id
    conf.cls_token_id = conf.bos_token_id = tokenizer.cls_token_id
    conf.sep_token_id = conf.eos_token_id = tokenizer.sep_token_id


_EMB, _DECODER, _BIAS = VOCAB_KEYS

ADAPTER = StateDictAdapter(
    model_types=("modernbert",),
    fields_from_hf=fields_from_hf,
    run_fields=FIELDS,
    # max_position_embeddings and the rope thetas are free: rotary positions have no table,
    # and a context extension raises the theta
    conflict_fields=(
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "layer_norm_eps",
        "local_attention",
        "global_attn_every_n_layers",
    ),
    to_ours=to_ours,
    word_emb=_EMB,
    mlm_bias=_BIAS,
    tied={_DECODER: _EMB},
    pos_emb=None,
    set_tokenizer_ids=set_tokenizer_ids,
)
