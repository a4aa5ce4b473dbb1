"""``--arch modernbert``: transformers' ModernBERT block with our masked-rows head. ``arch.py`` (the
layer pattern and what it refuses, light to import), ``model.py`` (the module; transformers'
modeling code, imported only to build a model), ``adapter.py`` (its Hugging Face checkpoints) and
``spec.py`` (the registry's entry)."""

from bertforge.pretrain.model.errors import ArchError
from bertforge.pretrain.model.modernbert.arch import (
    VOCAB_KEYS,
    check_engine,
    layer_types,
    unsupported,
)

__all__ = ["VOCAB_KEYS", "ArchError", "check_engine", "layer_types", "unsupported"]
