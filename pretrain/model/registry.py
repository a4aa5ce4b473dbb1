"""The one list of architectures, and what every caller asks of them by name.

``ARCHES`` maps ``--arch`` values to their :class:`~pretrain.model.specs.ModelSpec` (each defined
in its folder's ``spec.py``); the presets of all of them, ``build_model`` and the checks before
any rendezvous dispatch through it, so that adding an architecture is a folder plus one line
here (docs/extending.md).
"""

from __future__ import annotations

from bertforge.pretrain.model.bert.spec import SPEC as BERT
from bertforge.pretrain.model.document_attention import ATTENTION_MODES, AttentionError
from bertforge.pretrain.model.errors import ArchError
from bertforge.pretrain.model.model_config import ModelConfig
from bertforge.pretrain.model.modernbert.spec import SPEC as MODERNBERT
from bertforge.pretrain.model.specs import (
    MLM,
    MLM_NSP,
    OBJECTIVES,
    ModelSpec,
    ObjectiveSpec,
    PretrainingModel,
)

ARCHES: dict[str, ModelSpec] = {spec.name: spec for spec in (BERT, MODERNBERT)}
#: The preset ``--arch X`` picks when ``--model`` is not given.
DEFAULT_PRESET = {name: spec.default_preset for name, spec in ARCHES.items()}
#: Every arch's presets (``--model``), by name.
PRESETS: dict[str, ModelConfig] = {
    k: v for spec in ARCHES.values() for k, v in spec.presets.items()
}


def get_spec(arch: str) -> ModelSpec:
    """The spec of ``--arch arch``; an unknown name is an ArchError listing the choices."""
    if arch not in ARCHES:
        raise ArchError(f"--arch {arch!r}: choose one of {', '.join(ARCHES)}")
    return ARCHES[arch]


def spec_for_model_type(model_type: str | None) -> ModelSpec | None:
    """The spec whose Hugging Face checkpoints have config.json ``model_type``, or None."""
    for spec in ARCHES.values():
        if model_type in spec.adapter.model_types:
            return spec
    return None


def preset(name: str) -> ModelConfig:
    """The preset called ``name``; an unknown name is a ValueError that lists the choices."""
    if name not in PRESETS:
        raise ValueError(
            f"unknown model preset --model {name!r}: choose one of {', '.join(PRESETS)}"
        )
    return PRESETS[name]


def check_supported(cfg: ModelConfig, objective: ObjectiveSpec = MLM) -> None:
    """Refuse what ``cfg``'s arch cannot train (the objective the shards give, or a flag),
    naming the flag, before any rendezvous."""
    spec = get_spec(cfg.arch)
    refused = spec.unsupported(cfg, objective)
    chosen = objective.settings is not None and objective.settings.objective != "auto"
    if objective.name not in spec.objectives and chosen:
        refused.append(
            f"--objective {objective.name}: {spec.display_name} trains {', '.join(spec.objectives)}"
        )
    elif objective.name not in spec.objectives:
        missing = [
            h for h in objective.heads if all(h not in OBJECTIVES[o].heads for o in spec.objectives)
        ]
        formats = sorted({OBJECTIVES[o].data_format for o in spec.objectives})
        heads = "/".join(missing).upper()
        refused.append(
            f"{objective.data_format.upper()} shards (--data built with --format "
            f"{objective.data_format}): {spec.display_name} has no {heads} head; "
            f"build {' or '.join(formats)} shards"
        )
    if refused:
        able = [
            n
            for n, s in ARCHES.items()
            if objective.name in s.objectives
            and not s.unsupported(cfg, objective)
            and n != spec.name
        ]
        instead = f", or train with --arch {' or '.join(able)}" if able else ""
        raise ArchError(
            f"--arch {spec.name} does not support yet: {'; '.join(refused)}. Drop that{instead}."
        )


def check_engine(cfg: ModelConfig, zero_stage: int, checkpointing: str) -> None:
    """Refuse the engine settings ``cfg``'s arch cannot train with, naming the flags."""
    get_spec(cfg.arch).check_engine(cfg, zero_stage, checkpointing)


def build_model(
    model_cfg: ModelConfig,
    vocab_size: int,
    nsp: bool = False,
    *,
    objective: ObjectiveSpec | None = None,
    max_seq_len: int | None = None,
) -> PretrainingModel:
    """Build the pretraining model of ``model_cfg.arch`` for a tokenizer of `vocab_size` entries
    (from the manifest), for ``objective`` (``nsp=True`` is short for MLM+NSP). max_seq_len (the
    shards'): checked against max_position_embeddings. What the arch does not support is an
    ArchError (:func:`check_supported`)."""
    if objective is None:
        objective = MLM_NSP if nsp else MLM
    elif nsp and not objective.nsp:
        raise ValueError(f"build_model: nsp=True contradicts objective {objective.name!r}")
    spec = get_spec(model_cfg.arch)
    check_supported(model_cfg, objective)
    return spec.build(model_cfg, vocab_size, objective, max_seq_len)


def resolve_attention(mode: str, arch: str) -> str:
    """``document`` or ``full``: ``mode`` itself, or the arch's default for ``auto`` (its spec's
    ``default_attention``: ModernBERT packs without cross-document attention, as released; BERT
    keeps the 2018 behaviour its checkpoints were trained with)."""
    if mode not in ATTENTION_MODES:
        raise AttentionError(f"--attention {mode!r}: choose one of {', '.join(ATTENTION_MODES)}")
    if mode != "auto":
        return mode
    if arch not in ARCHES:
        raise AttentionError(f"--attention auto: no default for --arch {arch!r}")
    return ARCHES[arch].default_attention
