"""``--arch modernbert``: transformers' ModernBERT block with our masked-rows head (model.py),
its Hugging Face adapter (adapter.py) and its spec (spec.py)."""

from bertforge.pretrain.model.errors import ArchError
from bertforge.pretrain.model.modernbert.adapter import set_tokenizer_ids
from bertforge.pretrain.model.modernbert.model import (
    VOCAB_KEYS,
    ModernBertForPretrainingMasked,
    build_modernbert,
    layer_types,
    modernbert_config,
    unsupported,
)

__all__ = [
    "VOCAB_KEYS",
    "ArchError",
    "ModernBertForPretrainingMasked",
    "build_modernbert",
    "layer_types",
    "modernbert_config",
    "set_tokenizer_ids",
    "unsupported",
]
