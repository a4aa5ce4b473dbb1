"""``--arch bert``: the 2018 BERT (model.py), its Hugging Face adapter (adapter.py) and its spec
(spec.py). ``build_model`` and the presets of every arch are the registry's
(``bertforge.pretrain.model.registry``), which imports this package."""

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
    "BertForPretrainingMasked",
    "ModelConfig",
    "apply_activation_checkpointing",
    "bert_config",
    "build_bert",
    "export_config",
    "padded_vocab",
    "resolve_config",
]
