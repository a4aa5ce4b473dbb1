"""What an architecture and a training objective are to the rest of the trainer.

An architecture is a folder of this package (``bert/``, ``modernbert/``) whose ``spec.py``
defines one :class:`ModelSpec`: its presets, how to build it, the adapter that reads a Hugging
Face checkpoint for ``--init_from`` and writes the export (:class:`StateDictAdapter`), its
default attention, its terms of the doctor's memory estimate and what it refuses. The one list of
them is :mod:`pretrain.model.registry`; nothing outside this package compares architecture names.

A training objective is an :class:`ObjectiveSpec`: the heads it adds to the encoder, the loss
terms the model returns (summed into ``loss``), the metrics the trainer logs for it, the shard
format and batch keys it needs, and the extra networks trained beside the encoder (none for MLM
and MLM+NSP; ELECTRA's replaced-token detection names its generator there). ``--objective``
chooses it (recipe section ``objective``); ``auto`` lets the shards decide: NSP shards train
MLM+NSP, packed ones MLM (:func:`resolve_objective`); MLM+SOP trains on NSP shards when chosen.
(In the spirit of torchtitan's ``protocols/model_spec.py`` and its
``models/<name>/state_dict_adapter.py``.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bertforge.pretrain.model.errors import ObjectiveError
from bertforge.pretrain.model.objective_config import ObjectiveConfig

if TYPE_CHECKING:
    import torch

    from bertforge.pretrain.model.model_config import ModelConfig


class PretrainingModel(Protocol):
    """What the trainer, export, dry run and doctor use of a built model (an ``nn.Module`` and a
    transformers ``PreTrainedModel`` of the arch, with the heads on masked rows only)."""

    arch: str  # the ModelSpec's name
    nsp: bool  # whether the NSP head is there (objective "mlm+nsp")
    true_vocab_size: int  # the tokenizer's vocabulary (padding rows excluded from the softmax)
    hf_architecture: str  # the transformers class whose state dict this model's matches
    tied_keys: tuple[str, ...]  # keys a consolidated checkpoint may omit (tied to others)
    config: Any  # the transformers config

    def __call__(self, **batch: Any) -> dict[str, Any]: ...
    def predict_masked(self, *args: Any, **kwargs: Any) -> torch.Tensor: ...
    def encode(self, *args: Any, **kwargs: Any) -> torch.Tensor: ...
    def set_activation_checkpointing(self, mode: str) -> None: ...
    def encoders(self) -> list[torch.nn.Module]: ...
    def flops_per_token(self, seq_len: int, masked_fraction: float = 0.15) -> float: ...
    def hf_config(self, unpad_vocab: bool = False) -> Any: ...
    def hf_state_dict(self, unpad_vocab: bool = False) -> dict[str, torch.Tensor]: ...
    def register_zero3_external_parameters(self) -> None: ...


@dataclass(frozen=True)
class StateDictAdapter:
    """How an arch's Hugging Face checkpoints map onto our model (``--init_from``, export)."""

    model_types: tuple[str, ...]  # config.json model_type values of this arch's checkpoints
    #: (folder, config.json dict) -> ModelConfig fields, "arch" included; InitError if unusable
    fields_from_hf: Callable[[Path, dict[str, Any]], dict[str, Any]]
    run_fields: tuple[str, ...]  # ModelConfig fields a checkpoint of this arch sets
    #: fields explicit flags must not contradict (the weights' shapes and the computation)
    conflict_fields: tuple[str, ...]
    to_ours: Callable[[str], str]  # a transformers key -> our (transformers' BertFor*-style) name
    word_emb: str  # word embeddings: vocabulary rows (the decoder's weight is tied to them)
    mlm_bias: str  # the MLM output bias: vocabulary rows
    tied: dict[str, str]  # key tied to another in our model -> that key: never loaded alone
    pos_emb: str | None  # the learned position table; None for rotary positions
    #: (exported transformers config, tokenizer) -> None: ids the config must name on export
    set_tokenizer_ids: Callable[[Any, Any], None] = lambda conf, tokenizer: None


@dataclass(frozen=True)
class ModelSpec:
    """One architecture (see the module doc); registered in :mod:`pretrain.model.registry`."""

    name: str  # --arch value and ModelConfig.arch
    display_name: str  # how messages name it ("BERT")
    presets: dict[str, ModelConfig]  # --model names of this arch
    default_preset: str  # the preset --arch picks without --model
    #: (cfg, vocab_size, objective, max_seq_len) -> the model; bad input is a ValueError
    build: Callable[[ModelConfig, int, ObjectiveSpec, int | None], PretrainingModel]
    adapter: StateDictAdapter
    default_attention: str  # what --attention auto means: "full" or "document"
    objectives: tuple[str, ...]  # ObjectiveSpec names it can train
    #: rotary positions (no table): runs may exceed max_position_embeddings (a context
    #: extension) and a phase may set the global rope theta
    rotary: bool
    #: ModelConfig -> extra ModelShape fields of the doctor's memory estimate
    memory_terms: Callable[[ModelConfig], dict[str, Any]]
    #: (ModelShape, micro_batch, varlen path) -> 16-bit activation bytes of each layer
    layer_activation_bytes: Callable[[Any, int, bool], list[int]]
    #: (cfg, objective) -> what it cannot do, each "what: why and what instead" (empty: fine)
    unsupported: Callable[[ModelConfig, ObjectiveSpec], list[str]] = lambda cfg, obj: []
    #: (cfg, ZeRO stage, activation checkpointing) -> None, or an ArchError naming the flags
    check_engine: Callable[[ModelConfig, int, str], None] = lambda cfg, stage, mode: None
    #: the dry run's extra line on how the layers attend (a ModelConfig dict -> text or "")
    describe_layers: Callable[[dict[str, Any]], str] = lambda cfg: ""
    #: transformers' task models of this arch put the MLM's prediction head before the
    #: classifier, so evaluation loads it from the masked-LM model (not the bare encoder)
    task_head_from_mlm: bool = False


@dataclass(frozen=True)
class ObjectiveSpec:
    """A training objective (see the module doc)."""

    name: str  # "mlm", "mlm+nsp", "mlm+sop", "rtd"
    description: str
    heads: tuple[str, ...]  # the heads it adds on top of the encoder
    loss_terms: tuple[str, ...]  # keys of the model's output summed into "loss"
    metrics: tuple[str, ...]  # keys the trainer logs for it in metrics.jsonl
    data_format: str  # the shard format it trains on (data_prep build --format)
    batch_keys: tuple[str, ...] = ()  # batch tensors it needs beyond input_ids / labels
    extra_networks: tuple[str, ...] = field(default=())  # trained beside the encoder
    #: the run's ObjectiveConfig (its knobs: rtd weight, generator size, embedding sharing);
    #: set by resolve_objective, None for a spec taken as it is
    settings: ObjectiveConfig | None = None

    @property
    def nsp(self) -> bool:
        """Whether the model carries the NSP head."""
        return "nsp" in self.heads

    @property
    def sentence_order(self) -> bool:
        """Whether it predicts the order of a pair's segments (ALBERT's SOP): the loader swaps
        half of the consecutive pairs and labels them (``sentence_order_label``)."""
        return "sentence_order_label" in self.batch_keys

    @property
    def pair_head(self) -> bool:
        """Whether the model carries BERT's pooler and two-way pair classifier (NSP or SOP)."""
        return self.nsp or self.sentence_order


MLM = ObjectiveSpec(
    name="mlm",
    description="masked language modelling (the head on masked rows only)",
    heads=("mlm",),
    loss_terms=("mlm_loss",),
    metrics=("loss", "mlm_loss", "mlm_accuracy"),
    data_format="packed",
)

MLM_NSP = ObjectiveSpec(
    name="mlm+nsp",
    description="masked language modelling and next-sentence prediction (BERT 2018)",
    heads=("mlm", "nsp"),
    loss_terms=("mlm_loss", "nsp_loss"),
    metrics=("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy"),
    data_format="nsp",
    batch_keys=("token_type_ids", "next_sentence_label"),
)

MLM_SOP = ObjectiveSpec(
    name="mlm+sop",
    description="masked language modelling and sentence-order prediction (ALBERT 2020): the "
    "pair classifier tells a consecutive pair in order from the same pair swapped",
    heads=("mlm", "sop"),
    loss_terms=("mlm_loss", "sop_loss"),
    metrics=("loss", "mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy"),
    data_format="nsp",  # BERT's sentence pairs; the random-next ones train MLM only
    batch_keys=("token_type_ids", "sentence_order_label"),
)

RTD = ObjectiveSpec(
    name="rtd",
    description="replaced-token detection (ELECTRA): a small generator's MLM fills the masked "
    "positions by sampling, the encoder (the discriminator) tells every token replaced or not",
    heads=("mlm", "rtd"),  # the generator's masked-LM head, the discriminator's
    loss_terms=("mlm_loss", "rtd_loss"),
    metrics=(
        "loss",
        "mlm_loss",
        "mlm_accuracy",
        "rtd_loss",
        "rtd_prior_loss",
        "rtd_accuracy",
        "rtd_precision",
        "rtd_recall",
        "rtd_replaced_share",
    ),
    data_format="packed",
    extra_networks=("generator",),
)

OBJECTIVES: dict[str, ObjectiveSpec] = {o.name: o for o in (MLM, MLM_NSP, MLM_SOP, RTD)}


def objective_for_format(data_format: str) -> ObjectiveSpec:
    """The objective the shards' format trains by default (manifest.json's ``format``)."""
    for name in ("mlm", "mlm+nsp"):
        if OBJECTIVES[name].data_format == data_format:
            return OBJECTIVES[name]
    formats = ", ".join(sorted({o.data_format for o in OBJECTIVES.values()}))
    raise ObjectiveError(
        f"shard format {data_format!r} (manifest.json): no objective trains it ({formats})"
    )


def resolve_objective(settings: ObjectiveConfig | None, data_format: str) -> ObjectiveSpec:
    """The objective a run trains: ``--objective`` (``auto``: the shards' format decides), with
    its settings; one the shards cannot train is an ObjectiveError naming both."""
    settings = settings or ObjectiveConfig()
    if settings.objective == "auto":
        spec = objective_for_format(data_format)
    else:
        spec = OBJECTIVES[settings.objective]
        if spec.data_format != data_format:
            raise ObjectiveError(
                f"--objective {spec.name} trains on {spec.data_format} shards, the shards are "
                f"{data_format} (manifest.json's format): build them with `bertforge prep "
                f"build --format {spec.data_format}`, or choose --objective auto"
            )
    return dataclasses.replace(spec, settings=settings)


def objective_of_run(config: dict[str, Any], nsp: bool) -> ObjectiveSpec:
    """The objective a run trained, from its recorded config (``RUN/config.json``, a
    checkpoint's ``config``; runs written before ``--objective`` existed have none: the shards
    decided) and whether its shards were NSP shards."""
    settings = ObjectiveConfig(**(config.get("objective_cfg") or {}))
    return resolve_objective(settings, "nsp" if nsp else "packed")


def check_resume_objective(saved_config: dict[str, Any], objective: ObjectiveSpec) -> None:
    """Before the rendezvous: a checkpoint holds the networks of the objective it trained (an
    RTD checkpoint its generator too), so resuming it under another objective, or another RTD
    generator or embedding sharing, is refused naming both."""
    saved = objective_of_run(saved_config, objective.data_format == "nsp")
    shape = ("generator_width", "generator_depth", "embedding_sharing")
    if saved.name == objective.name and (
        saved.name != "rtd"
        or all(getattr(saved.settings, k) == getattr(objective.settings, k) for k in shape)
    ):
        return
    was = {k: getattr(saved.settings, k) for k in ("objective", *shape)}
    now = {k: getattr(objective.settings, k) for k in ("objective", *shape)}
    diff = ", ".join(f"--{k} {was[k]} (now {now[k]})" for k in was if was[k] != now[k])
    raise ObjectiveError(
        f"the checkpoint to resume was trained with {diff or saved.name}: its weights are that "
        "objective's networks. Resume with the checkpoint's settings, or start a new run "
        "(--init_from the checkpoint keeps its encoder)."
    )
