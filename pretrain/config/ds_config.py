"""The one place the DeepSpeed config is edited: the user's JSON + the recipe -> the final dict.

The DeepSpeed JSON is the engine (ZeRO, precision, the optimizer's betas and eps); the
recipe is the learning. A setting both can hold (lr, batch sizes, ...) is given in one of them
or refused (:mod:`pretrain.config.one_home`). :func:`resolve_deepspeed_config` reads the file and
applies, in order, the batch sizes for this world size (:mod:`pretrain.config.batching`), the
precision checked against the device (:mod:`pretrain.config.precision`), the optimizer block
(:mod:`pretrain.config.optimizer`), the run's TensorBoard folder (a relative CSV-monitor folder
too) and, on a resume onto another world size, the universal-checkpoint load. Each of those
helpers returns an edited copy; nothing else in the trainer touches the dict.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.errors import UserError
from bertforge.files import checkout_file
from bertforge.pretrain.config.batching import FIELDS, BatchPlan, apply_batch, resolve_batch
from bertforge.pretrain.config.one_home import check_one_home, given_by_json
from bertforge.pretrain.config.optimizer import configure_optimizer
from bertforge.pretrain.config.precision import resolve_precision
from bertforge.pretrain.run_folder.layout import RunFolder

if TYPE_CHECKING:
    from bertforge.pretrain.config.train_config import TrainConfig

# DeepSpeed prints its own step lines every steps_per_print steps; our metrics replace them.
_QUIET_STEPS_PER_PRINT = 10**9


class ConfigError(UserError, ValueError):
    """A configuration file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class DeepSpeedSetup:
    """What the trainer needs from the DeepSpeed config, resolved for one world size."""

    config: dict[str, Any]  # the final dict handed to deepspeed.initialize
    batch: BatchPlan  # global / micro batch and accumulation steps
    precision: str  # "fp32", "bf16" or "fp16" (after any allowed fallback)
    precision_note: str | None  # why the precision fell back, when it did
    activation_checkpointing: str  # "none", "torch" or "deepspeed"
    # recipe fields whose value the user's JSON gave ({"optim.lr", ...}): RUN/recipe.yaml leaves
    # them to the JSON it names, so the two never both give one
    from_json: frozenset[str] = frozenset()


def load_user_config(path: str | Path) -> dict[str, Any]:
    """Read the DeepSpeed JSON with a message naming the file and line on a syntax error."""
    try:
        with open(checkout_file(path), encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None


def activation_checkpointing_mode(ds_config: dict[str, Any], flag: str | None) -> str:
    """The flag's mode, else "deepspeed" when the config's activation_checkpointing is enabled."""
    if flag:
        return flag
    return "deepspeed" if ds_config.get("activation_checkpointing", {}).get("enabled") else "none"


def batch_origins(cfg: TrainConfig) -> dict[str, str]:
    """Where each batch size of the recipe came from (``"flag --grad_accum"``, ``"recipe F"``)."""
    return {name: cfg.sources[f"batch.{name}"] for name in FIELDS if f"batch.{name}" in cfg.sources}


def with_derived_batch(cfg: TrainConfig, plan: BatchPlan) -> TrainConfig:
    """``cfg`` with the accumulation ``plan`` derived in place of a recipe's that fits another
    world size (``plan.note``), its source saying so (the dry run, RUN/recipe.yaml)."""
    if not plan.note:
        return cfg
    batch = dataclasses.replace(cfg.batch, grad_accum=plan.grad_accum)
    sources = {**cfg.sources, "batch.grad_accum": f"derived for {plan.world_size} rank(s)"}
    return dataclasses.replace(cfg, batch=batch, sources=sources)


def resolve_deepspeed_config(
    cfg: TrainConfig, world_size: int, device: str, *, load_universal: bool = False
) -> DeepSpeedSetup:
    """Read ``cfg.run.ds_config`` and apply the recipe for ``world_size`` ranks on ``device``.

    ``load_universal``: the run resumes a checkpoint written by another number of ranks.
    Raises ConfigError, TwoHomesError, BatchSizeError, PrecisionError or OptimizerConfigError,
    each naming the file or flag to fix, before any process group or model exists.
    """
    src = cfg.run.ds_config
    ds = load_user_config(src)
    check_one_home(ds, cfg, src)
    from_json = given_by_json(ds)
    opt = cfg.optim
    ours = [  # what only the trainer's own schedule can do
        flag
        for flag, wanted in (
            ("--schedule_clock time", opt.schedule_clock == "time"),
            ("--schedule wsd", opt.schedule == "wsd"),
            ("--override_lr_schedule", opt.override_lr_schedule),
        )
        if wanted
    ]
    if "scheduler" in ds:  # the lr schedule's one home is the recipe (docs/training.md)
        raise ConfigError(
            f'{src}: a "scheduler" block steps the lr by itself; remove it to use '
            + (" and ".join(ours) or "the recipe's schedule")
            + " (the schedule lives in the recipe: optim.lr, optim.schedule, "
            "optim.warmup_steps, optim.decay, or run.phases)"
        )
    plan = resolve_batch(
        ds,
        world_size,
        global_batch=cfg.batch.global_batch_size,
        micro_batch=cfg.batch.micro_batch_size,
        grad_accum=cfg.batch.grad_accum,
        source=src,
        origins=batch_origins(cfg),
    )
    if cfg.guard.stability_guard and int(ds.get("zero_optimization", {}).get("stage", 0)) < 1:
        # The guard drops a rejected update through the ZeRO optimizers' overflow path.
        raise ConfigError(
            f"{src}: the stability guard (on by default) needs ZeRO stage 1, 2 or 3 to skip an "
            'update; set "zero_optimization": {"stage": 1} or more, or pass --no_stability_guard'
        )
    ds = apply_batch(ds, plan)
    ds, precision, note = resolve_precision(ds, cfg.precision, source=src)
    ds = configure_optimizer(ds, cfg.optim, device, source=src)
    ds["steps_per_print"] = ds.get("steps_per_print", _QUIET_STEPS_PER_PRINT)
    if ds.get("tensorboard", {}).get("enabled"):
        ds["tensorboard"] = {
            **ds["tensorboard"],
            "output_path": str(RunFolder(cfg.run.output_dir).tensorboard),
        }
    csv = ds.get("csv_monitor", {})
    if csv.get("enabled") and not Path(csv.get("output_path") or "").is_absolute():
        # DeepSpeed would write relative to the launch directory: keep it in the run folder.
        ds["csv_monitor"] = {
            **csv,
            "output_path": str(Path(cfg.run.output_dir, csv.get("output_path") or "csv")),
        }
    if load_universal:
        ds["checkpoint"] = {**ds.get("checkpoint", {}), "load_universal": True}
    mode = activation_checkpointing_mode(ds, cfg.memory.activation_checkpointing)
    return DeepSpeedSetup(
        config=ds,
        batch=plan,
        precision=precision,
        precision_note=note,
        activation_checkpointing=mode,
        from_json=from_json,
    )
