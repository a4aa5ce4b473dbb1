"""``--arch bert``: the 2018 BERT. ``arch.py`` (its config, light to import), ``model.py`` (the
module; transformers' modeling code, imported only to build a model), ``adapter.py`` (its Hugging
Face checkpoints) and ``spec.py`` (the registry's entry). ``build_model`` and the presets of every
arch are the registry's (``bertforge.pretrain.model.registry``)."""

from bertforge.pretrain.model.bert.arch import ARCH_FIELDS, bert_config, resolve_config
from bertforge.pretrain.model.model_config import ModelConfig, export_config, padded_vocab

__all__ = [
    "ARCH_FIELDS",
    "ModelConfig",
    "bert_config",
    "export_config",
    "padded_vocab",
    "resolve_config",
]
