"""``--arch bert`` without building it: its config fields, a ``--config_json`` resolved against
the shards, and transformers' ``BertConfig`` for a ModelConfig.

Light to import (no modeling code): the doctor, the dry run and the command line read the arch
through here and the spec, and only a run that builds the model imports ``model.py``
(transformers' modeling_bert brings torch._dynamo and DTensor, about 4 s of imports).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from transformers import BertConfig

from bertforge.pretrain.model.model_config import ModelConfig, padded_vocab

ARCH_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "layer_norm_eps",
    "initializer_range",
)
#: the fields a run continuing a checkpoint must keep: all but the dropouts and the init scale
SHAPE_FIELDS = tuple(
    f
    for f in ARCH_FIELDS
    if f not in ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")
)


def resolve_config(cfg: ModelConfig, vocab_size: int) -> ModelConfig:
    """Fill the architecture from `cfg.config_json` when given; check it against the shards'
    vocabulary."""
    if not cfg.config_json:
        return cfg
    path = Path(cfg.config_json)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"model config JSON {path}: file not found") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"model config JSON {path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        msg = f"model config JSON {path}: expected an object of BERT config keys"
        raise ValueError(msg)  # noqa: TRY004 (bad file content: a ValueError like the others)
    if "vocab_size" in data and data["vocab_size"] not in (
        vocab_size,
        padded_vocab(vocab_size, cfg.vocab_multiple),
    ):
        raise ValueError(
            f"model config JSON {path}: vocab_size {data['vocab_size']} does not match the shards' "
            f"tokenizer ({vocab_size} in manifest.json). The vocabulary always comes from the "
            "shards: delete the vocab_size key, or rebuild the shards with the matching tokenizer."
        )
    updates = {k: data[k] for k in ARCH_FIELDS if k in data}
    return dataclasses.replace(cfg, **updates)


def bert_config(cfg: ModelConfig, vocab_size: int, kind: type = BertConfig, **more) -> BertConfig:
    """transformers' config of ``kind`` (BertConfig; ElectraConfig for replaced-token detection,
    whose encoder is BERT's, with ``more``: its ``embedding_size``) for `cfg`, with the
    vocabulary padded to cfg.vocab_multiple."""
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError(
            f"hidden_size {cfg.hidden_size} is not divisible by num_attention_heads "
            f"{cfg.num_attention_heads}"
        )
    arch = {k: getattr(cfg, k) for k in ARCH_FIELDS}
    conf = kind(vocab_size=padded_vocab(vocab_size, cfg.vocab_multiple), **arch, **more)
    conf._attn_implementation = "sdpa"
    return conf
