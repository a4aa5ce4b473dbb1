"""The checkpoints' part of a run, for :mod:`pretrain.build`: the checkpoint a launch continues
from, checked against its shards, model, objective and lr flags before any rendezvous."""

from __future__ import annotations

import dataclasses

from bertforge.pretrain.checkpoints.resume import ResumePoint, find_resume
from bertforge.pretrain.checkpoints.schedule_override import check_resume_clock
from bertforge.pretrain.config.ds_config import ConfigError
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.model.specs import ObjectiveSpec, check_resume_objective


def resume_point(cfg: TrainConfig, train_reader) -> ResumePoint | None:
    """The checkpoint --resume names, checked against the shards' vocabulary and tokenizer and
    the model's config; None for a fresh start."""
    return find_resume(
        cfg.run.resume,
        cfg.run.output_dir,
        vocab_size=train_reader.vocab_size,
        tokenizer_fingerprint=train_reader.manifest["tokenizer"]["fingerprint"],
        model_config=dataclasses.asdict(cfg.model_cfg),
    )


def check_resume(cfg: TrainConfig, point: ResumePoint, objective: ObjectiveSpec) -> TrainConfig:
    """A resume refused on a clock or objective its checkpoint cannot continue; the config as it
    resumes (the checkpoint's peak lr under --override_lr_schedule without --lr)."""
    check_resume_clock(cfg.optim, point.state)
    check_resume_objective(point.state.get("config", {}), objective)
    return _override_peak(cfg, point)


def _override_peak(cfg: TrainConfig, point: ResumePoint) -> TrainConfig:
    """--override_lr_schedule without a peak lr of its own keeps the checkpoint's peak (not the
    DeepSpeed JSON's placeholder lr): the override changes the schedule's shape."""
    if not cfg.optim.override_lr_schedule or cfg.optim.lr is not None:
        return cfg
    saved = point.state.get("config", {}).get("optim", {}).get("lr")
    if saved is None:
        raise ConfigError(
            f"--override_lr_schedule: {point.path} does not record its peak lr (written by an "
            "older version); give the peak with --lr (recipe optim.lr)"
        )
    sources = {**cfg.sources, "optim.lr": f"checkpoint {point.path}"}
    optim = dataclasses.replace(cfg.optim, lr=float(saved))
    return dataclasses.replace(cfg, optim=optim, sources=sources)
