"""What an exported folder needs beyond the trained weights for transformers to use it as is.

* The tokenizer's ``model_max_length``: the longest sequence the weights were trained on (the
  shards' ``max_seq_len``, the longest phase begun by the exported step, or, after
  ``--init_from``, the source's own length if it says a longer one), never more than the model's
  positions. transformers' default (1e30) makes ``truncation=True`` cut nothing, so a long text
  overran the positions (``pipeline("fill-mask")`` failed on a 647-token input).
* BERT's pooler. ``BertForMaskedLM`` has none, so ``BertModel``, ``BertForSequenceClassification``
  and sentence-transformers loading a masked-LM export reported its weights MISSING. A run with
  NSP trains it and exports it (``BertForPreTraining``); a masked-LM run gets BERT's own
  initialisation (normal(0, initializer_range) weights, zero bias, seeded), marked untrained in
  ``config.json`` (``bertforge_pooler``) and in the model card: fine-tune it with the task head.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from bertforge.data_prep.reader import ShardError, load_manifest
from bertforge.logs import get_logger

log = get_logger(__name__)

POOLER_KEYS = ("bert.pooler.dense.weight", "bert.pooler.dense.bias")
POOLER_NOTE = "initialised at export, untrained (masked-LM run): fine-tune it with your task head"
_UNSET = 1e6  # a model_max_length at or above this is transformers' "no limit" (1e30)


def _said_length(folder: Path) -> int | None:
    """The model_max_length a tokenizer folder's config says, when it says a real one."""
    try:
        value = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    length = value.get("model_max_length") if isinstance(value, dict) else None
    return int(length) if isinstance(length, int | float) and 0 < length < _UNSET else None


def _data_length(state: dict[str, Any]) -> int | None:
    """The exported step's sequence length: its phases' longest begun, else the shards'."""
    step = int(state.get("step", 0))
    phases = (state.get("phases") or {}).get("phases") or []
    begun = [int(ph["seq_len"]) for ph in phases if int(ph["start_step"]) < max(step, 1)]
    if begun:
        return max(begun)
    for src in state.get("data_mixture") or []:  # every source shares one max_seq_len
        try:
            return int(load_manifest(Path(str(src.get("path"))))["max_seq_len"])
        except (ShardError, KeyError, TypeError, ValueError):
            continue
    return None


def trained_length(state: dict[str, Any], positions: int, tokenizer) -> int:
    """The ``model_max_length`` of the exported tokenizer (see the module doc); warns when the
    run folder no longer tells and the model's positions are taken instead."""
    length = _data_length(state) or _said_length_of(tokenizer)
    source = (state.get("init_from") or {}).get("source")
    source_length = _said_length(Path(source)) if source else None
    if length is None and source_length is None:
        log.warning(
            "export: neither the checkpoint's phases nor its shards' manifest.json (moved?) nor "
            f"its tokenizer say the trained sequence length; the tokenizer's model_max_length "
            f"is the model's positions, {positions}"
        )
        return positions
    return min(positions, max(length or 0, source_length or 0))


def _said_length_of(tokenizer) -> int | None:
    length = getattr(tokenizer, "model_max_length", None)
    return int(length) if isinstance(length, int | float) and 0 < length < _UNSET else None


def initialised_pooler(conf, seed: int) -> dict[str, Any]:
    """BERT's pooler as ``BertPreTrainedModel._init_weights`` starts it, from ``seed``."""
    g = torch.Generator().manual_seed(int(seed))
    size = conf.hidden_size
    weight = torch.empty(size, size).normal_(0.0, conf.initializer_range, generator=g)
    return {POOLER_KEYS[0]: weight, POOLER_KEYS[1]: torch.zeros(size)}


def adds_pooler(arch: str, trained: bool) -> bool:
    """An untrained pooler goes into BERT masked-LM exports (an objective that ``trained`` it,
    NSP, exports the trained one; ModernBERT has no pooler: its classification head starts from
    the MLM head's weights)."""
    return arch == "bert" and not trained
