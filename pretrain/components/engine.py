"""The model's part of a run, for :mod:`pretrain.build`: the architecture and objective the shards
and flags give, checked against the engine, the model built (or loaded from --init_from) and
DeepSpeed's engine over it with the run's schedule.

DeepSpeed is imported inside the functions that use it (see :mod:`pretrain.build`).
"""

from __future__ import annotations

import torch

from bertforge.logs import get_logger
from bertforge.pretrain.checkpoints.resume import ResumePoint
from bertforge.pretrain.config.ds_config import DeepSpeedSetup
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.model.compiled import check_compile, compile_encoders
from bertforge.pretrain.model.init_from import load_initial_weights
from bertforge.pretrain.model.init_source import extend_context, init_architecture
from bertforge.pretrain.model.registry import build_model, check_engine, check_supported
from bertforge.pretrain.model.specs import ObjectiveSpec, resolve_objective
from bertforge.pretrain.schedule import anneal
from bertforge.pretrain.schedule.assembly import lr_scheduler_for, run_schedule
from bertforge.pretrain.schedule.optim import param_groups
from bertforge.pretrain.schedule.phases import PhaseTracker

log = get_logger(__name__)


def model_for_shards(cfg: TrainConfig, max_seq_len: int):
    """The architecture this run builds: --init_from's, or ModernBERT's positions grown to
    longer shards (rotary positions: no table to grow)."""
    if cfg.run.init_from:  # the architecture is the checkpoint's
        return init_architecture(cfg, max_seq_len)
    longer = extend_context(cfg.model_cfg, max_seq_len)
    if longer is not cfg.model_cfg:
        log.info(
            "--arch %s: max_position_embeddings %d -> %d, the shards' max_seq_len "
            "(rotary positions: nothing to grow)",
            cfg.model_cfg.arch,
            cfg.model_cfg.max_position_embeddings,
            longer.max_position_embeddings,
        )
    return longer


def objective_for(cfg: TrainConfig, reader) -> ObjectiveSpec:
    """What the run trains (--objective and the shards' format), refused before any rendezvous
    where the arch cannot train it."""
    objective = resolve_objective(cfg.objective_cfg, reader.format)
    check_supported(cfg.model_cfg, objective)
    return objective


def check_engine_fits(cfg: TrainConfig, setup: DeepSpeedSetup) -> None:
    """The arch and --compile against the ZeRO stage and activation checkpointing."""
    stage = int(setup.config.get("zero_optimization", {}).get("stage", 0))
    check_engine(cfg.model_cfg, stage, setup.activation_checkpointing)
    check_compile(cfg.speed.compile, stage)


def build_encoder(
    cfg: TrainConfig,
    reader,
    setup: DeepSpeedSetup,
    objective: ObjectiveSpec,
    *,
    init_from: str | None = None,
    max_seq_len: int | None = None,
):
    """(model, --init_from report or None): the model of ``objective`` (:func:`objective_for`),
    identical on every rank (seeded or loaded from ``init_from`` before DeepSpeed partitions it),
    ready for deepspeed.initialize.
    ``max_seq_len``: the longest sequence it must take (default the reader's; a phase plan's
    longest phase)."""
    import deepspeed  # lazy: see the module docstring

    max_seq_len = max_seq_len or reader.max_seq_len
    torch.manual_seed(cfg.run.seed)
    model = build_model(
        cfg.model_cfg,
        vocab_size=reader.vocab_size,
        objective=objective,
        max_seq_len=max_seq_len,
    )
    report = None
    if init_from:
        report = load_initial_weights(
            model,
            init_from,
            tokenizer_dir_of_shards=reader.tokenizer_path,
            max_seq_len=max_seq_len,
        )
    model.register_zero3_external_parameters()
    if setup.activation_checkpointing == "deepspeed":
        deepspeed.checkpointing.configure(None, deepspeed_config=setup.config)
    model.set_activation_checkpointing(setup.activation_checkpointing)
    if cfg.speed.compile:
        compile_encoders(model)
    return model, report


def build_engine(
    cfg: TrainConfig,
    model,
    ds_config: dict,
    plan: anneal.AnnealPlan | None = None,
    phases: PhaseTracker | None = None,
):
    """The DeepSpeed engine and the run's LR schedule (:func:`pretrain.schedule.assembly.
    run_schedule`). A time-clock schedule is not given to DeepSpeed: the trainer's TimeClockLR
    applies it."""
    import deepspeed  # lazy: see the module docstring

    schedule = run_schedule(cfg, plan, phases, ds_config)
    wd = float(ds_config["optimizer"]["params"].get("weight_decay", 0.0))
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=param_groups(model, wd),
        config=ds_config,
        lr_scheduler=lr_scheduler_for(cfg, schedule),
    )
    return engine, schedule


def announce_init(cfg: TrainConfig, init, point: ResumePoint | None) -> dict | None:
    """Say what --init_from did (or that a resume took precedence); the report for config.json
    and the checkpoints (a resumed run keeps the one its first launch made)."""
    if cfg.run.init_from:
        if init is not None:
            for line in init.summary().splitlines():
                log.info(line)
        else:
            log.info(f"--init_from {cfg.run.init_from} not applied: resuming from {point.path}")
    if init is not None:
        return init.to_dict()
    return point.state.get("init_from") if point is not None else None
