"""``--arch bert``: the 2018 BERT (model.py), its Hugging Face adapter (adapter.py) and its spec
(spec.py). The documented imports ``from bertforge.pretrain.model.bert import ModelConfig,
build_model, PRESETS`` keep working: build_model and the presets of every arch are the
registry's, looked up on first use (the registry imports this package)."""

from bertforge.pretrain.model.bert.model import (
    BertForPretrainingMasked,
    bert_config,
    build_bert,
    resolve_config,
)
from bertforge.pretrain.model.checkpointing import (
    CHECKPOINTING_MODES,
    apply_activation_checkpointing,
)
from bertforge.pretrain.model.model_config import ModelConfig, export_config, padded_vocab

__all__ = [
    "CHECKPOINTING_MODES",
    "PRESETS",
    "BertForPretrainingMasked",
    "ModelConfig",
    "apply_activation_checkpointing",
    "bert_config",
    "build_bert",
    "build_model",
    "export_config",
    "padded_vocab",
    "preset",
    "resolve_config",
]

_FROM_REGISTRY = ("PRESETS", "build_model", "preset")


def __getattr__(name: str):
    if name in _FROM_REGISTRY:
        from bertforge.pretrain.model import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
