"""BERT's Hugging Face checkpoints: their config.json as our fields, their keys as our names."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transformers import BertConfig, ElectraConfig

from bertforge.pretrain.model.bert.arch import ARCH_FIELDS, SHAPE_FIELDS
from bertforge.pretrain.model.errors import InitError
from bertforge.pretrain.model.specs import StateDictAdapter

WORD_EMB, MLM_BIAS = "bert.embeddings.word_embeddings.weight", "cls.predictions.bias"


def fields_from_hf(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig fields of a BERT config.json (keys it omits take transformers' defaults), or
    of an ELECTRA one (its encoder is BERT's; the embeddings must be as wide as the layers)."""
    if config.get("model_type") == "electra":
        full = ElectraConfig.from_dict(config)
        if full.embedding_size != full.hidden_size:
            raise InitError(
                f"--init_from {path}: embedding_size {full.embedding_size} != hidden_size "
                f"{full.hidden_size} in {path / 'config.json'} (a factorised embedding, as "
                "ELECTRA-Small's discriminator has); this trainer's encoders use embeddings as "
                "wide as their layers: start from an ELECTRA of equal widths (base, large)."
            )
        return {"arch": "bert", **{k: getattr(full, k) for k in ARCH_FIELDS}}
    pos = config.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise InitError(
            f"--init_from {path}: position_embedding_type {pos!r} in {path / 'config.json'}; "
            "this trainer's BERT uses absolute position embeddings only."
        )
    full = BertConfig.from_dict(config)
    return {"arch": "bert", **{k: getattr(full, k) for k in ARCH_FIELDS}}


#: an ELECTRA generator's MLM head (ElectraForMaskedLM) under BertForMaskedLM's names
_FROM_ELECTRA = {
    "generator_predictions.dense.weight": "cls.predictions.transform.dense.weight",
    "generator_predictions.dense.bias": "cls.predictions.transform.dense.bias",
    "generator_predictions.LayerNorm.weight": "cls.predictions.transform.LayerNorm.weight",
    "generator_predictions.LayerNorm.bias": "cls.predictions.transform.LayerNorm.bias",
    "generator_lm_head.weight": "cls.predictions.decoder.weight",
    "generator_lm_head.bias": MLM_BIAS,
}


def to_ours(key: str) -> str:
    """transformers BertFor* names: prefixes model./module. dropped, bare BertModel keys under
    bert., LayerNorm gamma/beta renamed weight/bias; an ELECTRA folder's encoder (electra.*)
    under bert., its generator's head (ElectraForMaskedLM) as BERT's MLM head."""
    k = key
    while k.startswith(("model.", "module.")):
        k = k.split(".", 1)[1]
    if k.startswith(("embeddings.", "encoder.", "pooler.")):
        k = "bert." + k
    k = _FROM_ELECTRA.get(k, k) if k.startswith("generator_") else k
    if k.startswith("electra."):  # an ELECTRA encoder is BERT's under another name
        k = "bert." + k[len("electra.") :]
    k = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", k)
    return re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)


ADAPTER = StateDictAdapter(
    model_types=("bert", "electra"),
    fields_from_hf=fields_from_hf,
    run_fields=ARCH_FIELDS,
    conflict_fields=SHAPE_FIELDS,
    to_ours=to_ours,
    word_emb=WORD_EMB,
    mlm_bias=MLM_BIAS,
    tied={"cls.predictions.decoder.weight": WORD_EMB, "cls.predictions.decoder.bias": MLM_BIAS},
    pos_emb="bert.embeddings.position_embeddings.weight",
)


def pair_adapter(embedding_sharing: str, embedding_keys: Iterable[str]) -> StateDictAdapter:
    """What ``--init_from`` loads specially into BERT's ELECTRA pair (``pretrain.model.init_from``,
    the keys under the pair's names, ``pretrain.model.init_pair``): the token table (vocabulary
    rows; the generator's under disentangled sharing, the discriminator's otherwise), the
    generator's output bias, the names tied to others. ``embedding_keys``: the names in the
    generator's embedding module (all of it shared under plain sharing)."""
    disc, gen = "discriminator.electra.embeddings", "generator.electra.embeddings"
    if embedding_sharing == "plain":
        table = f"{disc}.word_embeddings.weight"
        tied = {f"{gen}.{k}": f"{disc}.{k}" for k in embedding_keys}
    else:
        table = f"{gen}.word_embeddings.weight"
        tied = {f"{disc}.word_embeddings.weight": table}
    tied["generator.generator_lm_head.weight"] = table
    return dataclasses.replace(
        ADAPTER,
        to_ours=lambda key: key,
        word_emb=table,
        mlm_bias="generator.generator_lm_head.bias",
        tied=tied,
        pos_emb=f"{disc}.position_embeddings.weight",
    )
