"""The trainer's command line: one flag per field of its dataclasses, values checked.

``bertforge train --help`` lists the flags by concern; each one's help is its field's
(:func:`bertforge.cli.opt`) followed by its default, written once. Every argparse default is
None so that a flag "not given" stays apart from one given with the default's value (the
DeepSpeed config decides the former). The doctor extends the same parser, so a launch line
pastes into it unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from bertforge.cli import ArgumentParser, add_fields
from bertforge.data_prep.layout import WORK_DIR
from bertforge.data_prep.object_store import is_url
from bertforge.data_prep.progress import normalize_mode
from bertforge.data_prep.remote_folder import parse_size
from bertforge.data_prep.sources import MixtureError, parse_mixture
from bertforge.errors import UserError
from bertforge.files import checkout_file
from bertforge.preemption import parse_signals
from bertforge.pretrain.config.flag_checks import (
    AnnealError,
    EMAError,
    check_anneal_flags,
    check_ema_decay,
)
from bertforge.pretrain.config.recipe import RecipeError, load_recipe, section_of
from bertforge.pretrain.config.schedule import ScheduleError, build_schedule
from bertforge.pretrain.config.train_config import (
    CONCERNS,
    GuardConfig,
    RunConfig,
    TrainConfig,
    foreign_concerns,
)
from bertforge.pretrain.data.glue.readers import GlueDataError
from bertforge.pretrain.data.glue.spec import is_benchmark_spec, load_spec
from bertforge.pretrain.model.document_attention import AttentionError
from bertforge.pretrain.model.registry import ARCHES, DEFAULT_PRESET, preset, resolve_attention
from bertforge.pretrain.model.sharing import (
    layer_groups,  # (a --config_json depth: again at build)
)
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.run_folder.run_checkpoints import list_complete

_SKIP_FOREIGN = {"preset", "name"}  # the model preset's name comes from --model

#: Other trainers' names for our flags (Hugging Face, Megatron, DeepSpeed), for "did you mean".
ALIASES = {
    "--learning_rate": "--lr",
    "--learning-rate": "--lr",
    "--lr_warmup_steps": "--warmup_steps",
    "--lr_warmup_fraction": "--warmup_ratio",
    "--lr_decay_style": "--decay",
    "--lr_scheduler_type": "--schedule",
    "--min_lr": "--min_lr_ratio",
    "--train_iters": "--max_steps",
    "--num_train_steps": "--max_steps",
    "--max_train_steps": "--max_steps",
    "--train_batch_size": "--global_batch_size",
    "--global-batch-size": "--global_batch_size",
    "--per_device_train_batch_size": "--micro_batch_size",
    "--micro-batch-size": "--micro_batch_size",
    "--gradient_accumulation_steps": "--grad_accum",
    "--mlm_probability": "--mask_prob",
    "--mask-prob": "--mask_prob",
    "--clip_grad": "--gradient_clipping",
    "--max_grad_norm": "--gradient_clipping",
    "--save_steps": "--save_interval",
    "--save-interval": "--save_interval",
    "--eval_steps": "--eval_interval",
    "--eval-interval": "--eval_interval",
    "--logging_steps": "--log_interval",
    "--save_total_limit": "--keep_last",
    "--deepspeed": "--ds_config",
    "--deepspeed_config": "--ds_config",
    "--model_name_or_path": "--init_from",
    "--load": "--resume",
    "--save": "--output_dir",
    "--bf16": "--precision",
    "--fp16": "--precision",
    "--config": "--recipe",
}


def _flag_names(groups: dict[str, type]) -> dict[tuple[str, str], str]:
    """Map (group, field) -> dest; a field name used by two groups gets the group as prefix."""
    counts: dict[str, int] = {}
    for cls in groups.values():
        for f in dataclasses.fields(cls):
            counts[f.name] = counts.get(f.name, 0) + 1
    out = {}
    for g, cls in groups.items():
        for f in dataclasses.fields(cls):
            prefix = g.removesuffix("_cfg")
            # The trainer's own fields keep their plain names (--seed, --output_dir, ...).
            plain = counts[f.name] == 1 or g in CONCERNS
            out[(g, f.name)] = f.name if plain else f"{prefix}_{f.name}"
    return out


def build_parser(
    groups: dict[str, type],
    prog: str = "pretrain/main.py",
    description: str = "Pretrain a BERT-style masked LM on DeepSpeed.",
) -> tuple[argparse.ArgumentParser, dict]:
    """Argument parser with one flag per dataclass field, one argument group per dataclass, and
    its (group, field) -> dest map."""
    p = ArgumentParser(prog=prog, description=description)
    p.add_argument(
        "--local_rank",
        "--local-rank",
        type=int,
        default=None,
        help="set by the DeepSpeed launcher (LOCAL_RANK is read from the environment)",
    )
    p.add_argument(
        "--recipe",
        default=None,
        help="a YAML recipe of the run (recipes/, or a run's RUN/recipe.yaml): its values are "
        "the defaults of the flags below, a flag given here wins (docs/training.md)",
    )
    p.aliases = ALIASES
    names = _flag_names(groups)
    for g, cls in groups.items():
        skip = _SKIP_FOREIGN if g not in CONCERNS else ()
        dests = {f: d for (group, f), d in names.items() if group == g}
        add_fields(p.add_argument_group(g), cls, exclude=skip, dests=dests, track_given=True)
    return p, names


def _overrides(ns: argparse.Namespace, names: dict, group: str) -> dict[str, Any]:
    return {
        fname: getattr(ns, dest)
        for (g, fname), dest in names.items()
        if g == group and getattr(ns, dest, None) is not None
    }


def trainer_parser(
    prog: str = "pretrain/main.py",
    description: str = "Pretrain a BERT-style masked LM on DeepSpeed.",
) -> tuple[argparse.ArgumentParser, dict]:
    """The trainer's parser and its (group, field) -> dest map; the doctor extends the same one,
    so a launch line pastes into it unchanged."""
    return build_parser({**CONCERNS, **foreign_concerns()}, prog, description)


def config_from_args(
    ns: argparse.Namespace, names: dict, parser: argparse.ArgumentParser
) -> TrainConfig:
    """The :class:`TrainConfig` of parsed flags over the ``--recipe``'s values, values checked;
    files are not looked at (the doctor reports a missing folder as a finding, the trainer's
    :func:`parse_args` fails on it). Built in one go: the config is frozen from here on."""
    sources = _apply_recipe(ns, names, parser)
    flags = _overrides(ns, names, "model_cfg")
    model_given = getattr(ns, "model_preset", None) is not None
    base = _preset_for(ns, flags, model_given, parser)
    _normalize_progress(ns, names, parser)
    concerns = {g: cls(**_overrides(ns, names, g)) for g, cls in CONCERNS.items()}

    model = dataclasses.replace(base, **flags)
    try:  # the run's config.json records what auto meant for this arch
        model = dataclasses.replace(model, attention=resolve_attention(model.attention, model.arch))
    except AttentionError as e:
        parser.error(str(e))
    chosen = dataclasses.asdict(base) if model_given else {}
    foreign = foreign_concerns()
    data_over = _overrides(ns, names, "data_cfg")
    mask_over = _overrides(ns, names, "masking")
    # One --seed drives data order and masking too, unless they are given their own seeds.
    for over, cls in ((data_over, foreign["data_cfg"]), (mask_over, foreign["masking"])):
        if "seed" in {f.name for f in dataclasses.fields(cls)}:
            over.setdefault("seed", concerns["run"].seed)
    try:
        cfg = TrainConfig(
            **concerns,
            model_cfg=model,
            objective_cfg=foreign["objective_cfg"](**_overrides(ns, names, "objective_cfg")),
            data_cfg=foreign["data_cfg"](**data_over),
            masking=foreign["masking"](**mask_over),
            explicit_model={**{k: v for k, v in chosen.items() if k != "name"}, **flags},
            sources=sources,
        )
    except ValueError as e:
        parser.error(str(e))
    _check_values(cfg, parser)
    return cfg


def _normalize_progress(ns: argparse.Namespace, names: dict, parser) -> None:
    """--progress true/false as auto/off (checked before the config is built)."""
    dest = names[("log", "progress")]
    try:
        value = getattr(ns, dest, None)
        setattr(ns, dest, None if value is None else normalize_mode(value))
    except ValueError as e:
        parser.error(str(e))


def _apply_recipe(ns: argparse.Namespace, names: dict, parser) -> dict[str, str]:
    """Fill the flags not given from ``--recipe`` (a flag given wins); returns where each value
    that is not a default came from: {"section.field": "flag --x" | "recipe FILE"}."""
    spelled = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    sources = {
        f"{section_of(g)}.{f}": f"flag {spelled.get(dest, '--' + dest)}"
        for (g, f), dest in names.items()
        if getattr(ns, dest, None) is not None
    }
    path = getattr(ns, "recipe", None)
    if not path:
        return sources
    try:
        values = load_recipe(path, {**CONCERNS, **foreign_concerns()})
    except RecipeError as e:
        parser.error(str(e))
    for (g, f), value in values.items():
        dest = names[(g, f)]
        if getattr(ns, dest, None) is None and value is not None:
            setattr(ns, dest, value)
            sources[f"{section_of(g)}.{f}"] = f"recipe {path}"
    return sources


def _preset_for(ns: argparse.Namespace, flags: dict, model_given: bool, parser) -> Any:
    """The preset the model starts from: --model's, or --arch's tiny one when only --arch is
    given; a --model of the other arch is refused (naming both flags)."""
    arch = flags.get("arch")
    if arch is not None and arch not in ARCHES:
        parser.error(f"--arch must be one of {', '.join(ARCHES)}, got {arch!r}")
    if arch is not None and not model_given:
        ns.model_preset = DEFAULT_PRESET[arch]  # --arch alone: its tiny preset
    name = ns.model_preset or RunConfig().model_preset
    try:
        base = preset(name)
    except ValueError as e:
        parser.error(str(e))
    if arch is not None and base.arch != arch:
        parser.error(
            f"--model {name} is a {base.arch} preset but --arch is {arch}: "
            f"choose a {arch} preset (--model {DEFAULT_PRESET[arch]}, ...) or drop --arch"
        )
    return base


def parse_args(argv: list[str] | None = None, prog: str = "pretrain/main.py") -> TrainConfig:
    """Parse the command line into a :class:`TrainConfig` (flags override dataclass defaults)."""
    parser, names = trainer_parser(prog)
    cfg = config_from_args(parser.parse_args(argv), names, parser)
    _check_anneal(cfg, parser, sys.argv[1:] if argv is None else argv)
    _check_paths(cfg, parser)
    return cfg


def _check_anneal(cfg: TrainConfig, parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """--ema's value and --anneal_from's flag combinations (pretrain.config.flag_checks)."""
    try:
        check_ema_decay(cfg.optim.ema)
    except EMAError as e:
        parser.error(str(e))
    explicit = any(a == "--max_steps" or a.startswith("--max_steps=") for a in argv)
    try:
        check_anneal_flags(cfg.run, explicit)
    except AnnealError as e:
        parser.error(str(e))


def _check_values(cfg: TrainConfig, parser: argparse.ArgumentParser) -> None:
    """Fail on flag values that cannot work, naming the flag."""
    if cfg.run.max_steps <= 0:
        parser.error(f"--max_steps must be positive, got {cfg.run.max_steps}")
    if cfg.precision.precision not in (None, "fp32", "bf16", "fp16"):
        parser.error(f"--precision must be fp32, bf16 or fp16, got {cfg.precision.precision!r}")
    if cfg.memory.activation_checkpointing not in (None, "none", "torch", "deepspeed"):
        parser.error("--activation_checkpointing must be none, torch or deepspeed")
    if cfg.optim.decay not in ("linear", "poly", "constant"):
        parser.error(f"--decay must be linear, poly or constant, got {cfg.optim.decay!r}")
    if cfg.optim.optimizer not in (None, "adamw", "lamb"):
        parser.error(f"--optimizer must be adamw or lamb, got {cfg.optim.optimizer!r}")
    if cfg.run.show_masks < 0 or (cfg.run.show_masks and not cfg.run.dry_run):
        parser.error(
            "--show_masks N (N >= 0) goes with --dry-run: it prints masked sequences "
            "instead of training"
        )
    _check_guard(cfg.guard, parser)
    if cfg.checkpoint.keep_last < 1:
        parser.error("--keep_last must be at least 1")

    try:
        parse_signals(cfg.checkpoint.preemption_signals)
    except ValueError as e:
        parser.error(str(e))

    try:
        layer_groups(cfg.model_cfg.share_layers, cfg.model_cfg.num_hidden_layers)
    except ValueError as e:
        parser.error(str(e))
    log = cfg.log
    if bool(log.downstream_eval) != (log.downstream_interval > 0):
        parser.error("--downstream_eval and --downstream_interval go together")
    if log.downstream_interval and (
        cfg.checkpoint.save_interval <= 0 or log.downstream_interval % cfg.checkpoint.save_interval
    ):
        parser.error(
            f"--downstream_interval {log.downstream_interval} must be a multiple of "
            f"--save_interval (now {cfg.checkpoint.save_interval}): it evaluates checkpoints"
        )
    if cfg.run.max_time_hours < 0:
        parser.error(f"--max_time_hours must be >= 0, got {cfg.run.max_time_hours}")
    if cfg.batch.batch_ramp_start < 0:
        parser.error(
            f"--batch_ramp_start must be >= 0 (0 = no ramp), got {cfg.batch.batch_ramp_start}"
        )
    if cfg.batch.batch_ramp_start and not 0.0 < cfg.batch.batch_ramp_fraction <= 1.0:
        parser.error(
            f"--batch_ramp_fraction must be in (0, 1], got {cfg.batch.batch_ramp_fraction}"
        )
    if cfg.batch.batch_ramp_start and cfg.run.phases:
        parser.error(
            "--batch_ramp_start and --phases both set the batch of each step: give the ramp in "
            "the phase file (a phase's batch: {start, increment, ramp_tokens}) or drop --phases"
        )
    if not 0.0 <= cfg.log.eval_mask_prob <= 1.0:
        parser.error(
            f"--eval_mask_prob must be in [0, 1] (0 = the run's), got {cfg.log.eval_mask_prob}"
        )
    if cfg.run.heartbeat_timeout_s < 0:
        parser.error(
            f"--heartbeat_timeout_s must be >= 0 (0 = off), got {cfg.run.heartbeat_timeout_s}"
        )
    if cfg.optim.schedule_clock not in ("steps", "time"):
        parser.error(f"--schedule_clock must be steps or time, got {cfg.optim.schedule_clock!r}")
    if cfg.optim.schedule_clock == "time" and cfg.run.max_time_hours <= 0:
        parser.error("--schedule_clock time needs a budget: give --max_time_hours")
    if cfg.optim.schedule_clock == "time" and cfg.optim.warmup_steps is not None:
        parser.error(
            "--warmup_steps counts steps; with --schedule_clock time give the warmup as "
            "--warmup_ratio (a fraction of the time budget)"
        )
    _check_schedule(cfg, parser)


def _check_schedule(cfg: TrainConfig, parser: argparse.ArgumentParser) -> None:
    """Fail on --schedule flags that contradict each other or do not fit in the run (the
    schedule is built once here for that), and on an --override_lr_schedule with nothing to
    override."""
    try:
        build_schedule(cfg.optim, cfg.run.max_steps)
    except ScheduleError as e:
        parser.error(str(e))
    warmup = cfg.optim.warmup_steps
    if warmup is not None and warmup > cfg.run.max_steps and not cfg.run.phases:
        parser.error(
            f"--warmup_steps {warmup}{_where(cfg, 'optim.warmup_steps')} is longer than the run "
            f"(--max_steps {cfg.run.max_steps}{_where(cfg, 'run.max_steps')}): the lr would "
            "never reach its peak; shorten the warmup or lengthen the run"
        )

    if cfg.optim.override_lr_schedule and cfg.run.resume == "none":
        parser.error(
            "--override_lr_schedule replaces a resumed checkpoint's lr schedule: it goes with "
            "--resume auto or --resume PATH"
        )
    if cfg.optim.override_lr_schedule and cfg.optim.schedule_clock == "time":
        parser.error(
            "--override_lr_schedule is not needed with --schedule_clock time: the time clock "
            "keeps no schedule state, so a resume always follows this launch's flags; drop it"
        )


def _where(cfg: TrainConfig, key: str) -> str:
    """`` (from recipe FILE)`` when a value came from the recipe, so an error names the file."""
    source = cfg.sources.get(key, "")
    return f" (from {source})" if source.startswith("recipe") else ""


def _check_guard(g: GuardConfig, parser: argparse.ArgumentParser) -> None:
    """Fail on guard thresholds that cannot work, naming the flag."""
    if not 2 <= g.guard_min_history <= g.guard_window:
        parser.error(
            f"--guard_min_history ({g.guard_min_history}) must be at least 2 and at most "
            f"--guard_window ({g.guard_window})"
        )
    if g.guard_z <= 0 or g.guard_min_ratio < 1.0:
        parser.error("--guard_z must be positive and --guard_min_ratio at least 1.0")
    if g.guard_spikes < 1 or g.guard_spike_window < 1 or g.guard_max_rollbacks < 0:
        parser.error(
            "--guard_spikes and --guard_spike_window must be at least 1, "
            "--guard_max_rollbacks at least 0"
        )
    if not 0.0 < g.guard_lr_factor <= 1.0:
        parser.error(f"--guard_lr_factor must be in (0, 1], got {g.guard_lr_factor}")
    if g.guard_climb != 0 and g.guard_climb <= 1.0:
        parser.error(f"--guard_climb must be above 1.0 (or 0: off), got {g.guard_climb}")


def _refuse_run_urls(cfg: TrainConfig, parser: argparse.ArgumentParser) -> None:
    """A run folder, or a checkpoint, in object storage is refused with the reason: DeepSpeed
    saves with torch.save to file paths, and the run folder's lock, atomic renames and COMPLETE
    marker need a filesystem (docs/launching.md, "Data in object storage")."""
    r = cfg.run
    for flag, value in (
        ("--output_dir", r.output_dir),
        ("--resume", r.resume),
        ("--init_from", r.init_from),
        ("--anneal_from", r.anneal_from),
    ):
        if value and is_url(value):
            parser.error(
                f"{flag} {value}: a run folder or checkpoint in object storage is not supported "
                "(DeepSpeed writes checkpoints with torch.save to file paths; the run's lock, "
                "atomic renames and COMPLETE marker need a filesystem). Train into a local or "
                "shared folder and copy its checkpoints to the bucket after each save (aws s3 "
                "sync RUN/checkpoints ...), or mount the bucket as a filesystem; shards (--data) "
                "and exports (pretrain.export --output) may be URLs."
            )


def _not_shards(path: Path) -> str:
    """What --data names when it is no shard folder, and the build that makes one: a newcomer
    gives the text itself (before, the advice was to build *into* their text file)."""
    if (path / WORK_DIR).is_dir():
        return (
            f"--data {path}: an unfinished build (its {WORK_DIR} folder is there, no "
            "manifest.json yet); run the same `bertforge prep build` command again to "
            "finish it"
        )
    if path.is_file() or (path.is_dir() and not any(path.glob("*/manifest.json"))):
        what = "a file" if path.is_file() else "a folder without a manifest.json"
        return (
            f"--data {path}: {what}, not a shard folder; --data takes the output of "
            f"`bertforge prep build --input {path} --output SHARDS` (build it first, then "
            "--data SHARDS)"
        )
    if path.is_dir():  # a folder of builds: name them
        builds = sorted(str(m.parent) for m in path.glob("*/manifest.json"))
        return (
            f"--data {path}: no manifest.json there; it holds the shard folders {builds}: give "
            "one of them"
        )
    return (
        f"--data {path}: no such folder (or an incomplete build); run `bertforge prep "
        f"build --input TEXT --output {path}` first"
    )


def _check_paths(cfg: TrainConfig, parser: argparse.ArgumentParser) -> None:
    """Fail before any work on files that are not there, naming the flag and the fix."""
    if not cfg.run.data_sources:
        parser.error("--data is required: the shard folder from `bertforge prep build`")
    _refuse_run_urls(cfg, parser)
    try:
        sources = parse_mixture(cfg.run.data_sources)
        parse_size(cfg.data_cfg.cache_limit)
    except (MixtureError, UserError) as e:
        parser.error(str(e))
    for s in sources:
        if is_url(s.path):  # object storage: its manifest is read when the shards open
            continue
        if not Path(s.path, "manifest.json").is_file():
            parser.error(_not_shards(Path(s.path)))
    if not checkout_file(cfg.run.ds_config).is_file():
        parser.error(f"--ds_config {cfg.run.ds_config}: file not found")
    downstream = cfg.log.downstream_eval
    if downstream and is_benchmark_spec(downstream):  # glue:DIR[:TASKS]: every split read now
        try:
            load_spec(downstream)
        except GlueDataError as e:
            parser.error(str(e))
    elif downstream and not os.path.isfile(downstream):
        parser.error(
            f"--downstream_eval {downstream}: no such tasks file (or give glue:DIR[:TASK,...] "
            "or clue:DIR[:TASK,...], a GLUE or CLUE folder)"
        )
    if cfg.run.init_from and not os.path.exists(cfg.run.init_from):
        parser.error(
            f"--init_from {cfg.run.init_from}: no such folder "
            "(a HF BERT or ModernBERT folder, or a run)"
        )
    r = cfg.run.resume
    if r not in ("auto", "none") and not os.path.exists(r):
        parser.error(f"--resume {r}: no such checkpoint (use auto, none, or a checkpoint folder)")
    done = list_complete(RunFolder(cfg.run.output_dir).checkpoints) if r == "none" else []
    if done and not cfg.run.dry_run:
        # a fresh run there replaced the old one's metrics.jsonl and mixed their checkpoints
        parser.error(
            f"--output_dir {cfg.run.output_dir} already holds a run (complete checkpoints up to "
            f"step {done[-1][0]}): continue it with --resume auto, or give another --output_dir "
            "(to start over there, remove the folder first)"
        )
