"""Typed training configuration: one dataclass per concern, flags override, saved into the run.

The trainer's own concerns live here (run, batch, optimizer/schedule, precision, checkpoints,
logging). The model, data and masking dataclasses belong to their modules; their fields get flags
automatically (``--<field>``, or ``--<group>_<field>`` when two groups share a field name).
The DeepSpeed JSON stays the source of ZeRO and precision settings; flags that touch it
(batch sizes, lr, precision) are applied to a copy in :mod:`pretrain.config.ds_config`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pretrain.data.loader import DataConfig
    from pretrain.data.masking import MaskingConfig
    from pretrain.model.bert import ModelConfig


@dataclass
class RunConfig:
    """Where the run reads and writes, and how long it lasts."""

    ds_config: str = "ds_configs/cpu.json"  # DeepSpeed JSON config (ZeRO stage, precision,
    # optimizer)
    data_sources: list[str] = field(default_factory=list)  # shard folder written by `python -m
    # data_prep build`, or a weighted mixture: name=DIR:weight[:mask_prob] per source (see
    # pretrain.data.mixture)
    model_preset: str = "tiny"  # model preset name (see pretrain.model.bert.PRESETS)
    output_dir: str = "runs/default"  # run folder: config.json, metrics.jsonl, checkpoints/,
    # tensorboard/
    max_steps: int = 100  # optimizer steps to train (including steps skipped on an fp16 overflow
    # or by the stability guard)
    max_time_hours: float = 0.0  # also end the run after this many hours of training time, added
    # up over its launches (final validation and checkpoint at the budget); 0 = no time limit
    seed: int = 1234  # seed for model init, dropout and data order
    resume: str = "none"  # "auto" (newest complete checkpoint in output_dir), "none", or a
    # checkpoint path
    init_from: str = ""  # initial weights only (fresh optimizer, schedule, step 0) from a HF BERT
    # folder or one of our runs; the architecture comes from it; a checkpoint to resume wins
    dist_timeout_s: float = 600.0  # how long ranks wait for each other at start-up and in
    # collectives
    dry_run: bool = False  # print the resolved plan (memory, batch sizes) and exit without training
    json: bool = False  # with --dry-run: print the plan as JSON
    show_masks: int = 0  # with --dry-run: print this many training sequences with each masked
    # position marked ([MASK], random, kept) and whole-word units grouped


@dataclass
class BatchConfig:
    """Batch-size overrides; unset values come from the DeepSpeed config (see
    pretrain.config.batching)."""

    global_batch_size: int | None = None  # sequences per optimizer step over all ranks
    micro_batch_size: int | None = None  # sequences per forward pass per rank
    grad_accum: int | None = None  # micro-batches per rank per optimizer step


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule."""

    optimizer: str | None = None  # "adamw" or "lamb" (GPU only); default: the DeepSpeed config's
    lr: float | None = None  # peak learning rate; default: the DeepSpeed config's optimizer lr
    weight_decay: float | None = None  # decoupled weight decay (not on biases/LayerNorm);
    # default: config's
    warmup_steps: int | None = None  # linear warmup steps; default: warmup_ratio x max_steps
    warmup_ratio: float = 0.06  # warmup as a fraction of max_steps when warmup_steps is unset
    decay: str = "linear"  # after warmup: "linear", "poly" or "constant"
    poly_power: float = 1.0  # exponent of the "poly" decay (1.0 = linear)
    min_lr_ratio: float = 0.0  # final lr as a fraction of the peak lr
    schedule_clock: str = "steps"  # "steps", or "time": warmup (--warmup_ratio) and decay follow
    # the elapsed fraction of --max_time_hours instead of the step count
    gradient_clipping: float | None = None  # max global grad norm (0 = off); default: config's


@dataclass
class PrecisionConfig:
    """Numeric precision; the DeepSpeed config's fp16/bf16 blocks decide unless overridden."""

    precision: str | None = None  # "fp32", "bf16" or "fp16"; default: from the DeepSpeed config
    allow_precision_fallback: bool = False  # when the precision is unavailable here, use fp32
    # instead of failing


@dataclass
class MemoryConfig:
    """Trading compute for memory."""

    activation_checkpointing: str | None = None  # "none", "torch" or "deepspeed"; default:
    # "deepspeed" when the config's activation_checkpointing.enabled is true


@dataclass
class CheckpointConfig:
    """When checkpoints are written and how many are kept."""

    save_interval: int = 0  # save every N optimizer steps (0 = only at the end and on signals)
    save_interval_minutes: float = 0.0  # also save when this many minutes passed since the last
    # save (0 = off)
    keep_last: int = 3  # complete checkpoints to keep (older ones are deleted)
    save_final: bool = True  # save when training ends


@dataclass
class GuardConfig:
    """The stability guard (pretrain.components.guard): skip a loss spike's update, roll back on
    divergence."""

    stability_guard: bool = True  # judge every step's loss and grad norm (skip spikes, roll back
    # on NaN/inf or repeated spikes); --no_stability_guard turns it off
    guard_window: int = 50  # recent healthy steps whose median and MAD judge the next step
    guard_min_history: int = 10  # healthy steps needed before spikes are judged
    guard_z: float = 6.0  # a spike's robust z-score, (x - median) / (1.4826 MAD), is above this
    guard_min_ratio: float = 1.5  # ... and its value is above this multiple of the median
    guard_spikes: int = 3  # this many spikes (loss or grad norm) within --guard_spike_window steps
    # roll back to the newest complete checkpoint
    guard_spike_window: int = 20  # steps over which --guard_spikes are counted
    guard_max_rollbacks: int = 3  # rollbacks allowed per run; the next divergence gives up (exit
    # status 6)
    guard_lr_factor: float = 1.0  # multiply the learning rate by this at each rollback (kept
    # across resumes; 1.0 = unchanged)


@dataclass
class LogConfig:
    """Metrics and validation cadence."""

    log_interval: int = 1  # console/TensorBoard every N steps (metrics.jsonl gets every step)
    eval_interval: int = 0  # validate every N steps (0 = only at the end)
    eval_batches: int = 50  # max validation micro-batches per rank per evaluation
    progress: str = "auto"  # rank 0's console: "bar" (tqdm), "lines" (one plain line per
    # --log_interval steps: step, loss, lr, tokens/s, ETA), "off", or "auto" (a bar when stderr is
    # a terminal, lines in a log file); true/false mean auto/off
    progress_interval_s: float = 0.0  # with lines: at most one line per this many seconds instead
    # of one per --log_interval steps (0 = by steps)
    downstream_eval: str = ""  # tasks JSON (python -m pretrain.evaluate's format): fine-tune and
    # score checkpoints in the background on rank 0 (records "split": "downstream")
    downstream_interval: int = 0  # evaluate the checkpoint of every N-th step (a multiple of
    # --save_interval)
    downstream_max_examples: int = 500  # train and test examples per task in those evaluations
    downstream_device: str = "cpu"  # device of the background evaluations (cpu keeps the GPUs
    # for training)


CONCERNS: dict[str, type] = {
    "run": RunConfig,
    "batch": BatchConfig,
    "optim": OptimConfig,
    "precision": PrecisionConfig,
    "memory": MemoryConfig,
    "checkpoint": CheckpointConfig,
    "guard": GuardConfig,
    "log": LogConfig,
}


def _foreign_concerns() -> dict[str, type]:
    """Dataclasses owned by the model and data modules (flags are generated from their fields)."""
    from pretrain.data.loader import DataConfig
    from pretrain.data.masking import MaskingConfig
    from pretrain.model.bert import ModelConfig

    return {"model_cfg": ModelConfig, "data_cfg": DataConfig, "masking": MaskingConfig}


# Flags spelled otherwise than their field: the launcher habit of dashes, and the short --data /
# --model for the fields that name a folder and a preset.
_ALIASES = {
    "dry_run": ["--dry-run", "--dry_run"],
    "data_sources": ["--data"],
    "model_preset": ["--model"],
}
_NEGATABLE = {"stability_guard"}  # bool flags that also get --no_<flag> (default on)
_REQUIRED = {"data_sources"}  # checked by parse_args; the doctor reports a missing one instead
_SKIP_FOREIGN = {"preset", "name"}  # model preset name comes from --model


def _base_type(tp: Any) -> tuple[type, bool]:
    """(scalar type, optional?) for int | None, str, float, bool ... annotations."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _base_type(args[0])[0], True
        return str, True
    return tp, False


def _str2bool(v: str) -> bool:
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {v!r}")


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


def _field_help(cls: type) -> dict[str, str]:
    """The comment after each field in the dataclass source is its --help text; comment-only
    lines right below a field continue it (so help text never needs a line over 100 chars)."""
    import inspect

    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    helps, last = {}, None
    for line in src.splitlines():
        s = line.strip()
        if s.startswith("#") and last is not None:
            helps[last] += " " + s.lstrip("#").strip()
        elif ":" in s and "#" in s:
            last = s.split(":", 1)[0].strip()
            helps[last] = s.split("#", 1)[1].strip()
        else:
            last = None
    return helps


def _add_bool_flag(grp, flags: list[str], dest: str, help_text: str) -> None:
    """``--flag [true|false]`` (bare: true), and ``--no_flag`` for those in _NEGATABLE."""
    grp.add_argument(
        *flags, dest=dest, nargs="?", const=True, default=None, type=_str2bool, help=help_text
    )
    if dest in _NEGATABLE:
        grp.add_argument(
            f"--no_{dest}", dest=dest, action="store_const", const=False, help=f"turn --{dest} off"
        )


def build_parser(
    groups: dict[str, type],
    prog: str = "pretrain/main.py",
    description: str = "Pretrain a BERT-style masked LM on DeepSpeed.",
) -> tuple[argparse.ArgumentParser, dict]:
    """Argument parser with one flag per dataclass field (defaults None: "not given").

    Each flag's help is the field's comment plus its dataclass default, written once here (the
    argparse value is None so that "given" and "not given" stay distinguishable).
    """
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument(
        "--local_rank",
        "--local-rank",
        type=int,
        default=None,
        help="set by the DeepSpeed launcher (LOCAL_RANK is read from the environment)",
    )
    names = _flag_names(groups)
    for g, cls in groups.items():
        grp = p.add_argument_group(g)
        helps = _field_help(cls)
        for f in dataclasses.fields(cls):
            if g != "run" and f.name in _SKIP_FOREIGN:
                continue
            tp, _opt = _base_type(
                f.type if not isinstance(f.type, str) else typing.get_type_hints(cls)[f.name]
            )
            dest = names[(g, f.name)]
            flags = _ALIASES.get(dest, [f"--{dest}"])
            default = (
                f.default
                if f.default is not dataclasses.MISSING
                else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            )
            h = f"{helps.get(f.name, '')} " + (
                "(required)"
                if f.name in _REQUIRED
                else f"(default: {default!r})"
                if default == ""
                else f"(default: {default})"
            )
            if typing.get_origin(tp) is list:  # one or more values after the flag
                grp.add_argument(
                    *flags,
                    dest=dest,
                    nargs="+",
                    type=typing.get_args(tp)[0],
                    default=None,
                    help=h,
                    metavar=flags[0].lstrip("-").upper(),
                )
            elif tp is bool:
                _add_bool_flag(grp, flags, dest, h)
            elif tp in (int, float, str):
                grp.add_argument(*flags, dest=dest, type=tp, default=None, help=h)
            else:  # tuples / lists: JSON on the command line
                grp.add_argument(
                    *flags, dest=dest, type=json.loads, default=None, help=h + " [JSON]"
                )
    return p, names


def _overrides(ns: argparse.Namespace, names: dict, group: str) -> dict[str, Any]:
    return {
        fname: getattr(ns, dest)
        for (g, fname), dest in names.items()
        if g == group and getattr(ns, dest, None) is not None
    }


@dataclass
class TrainConfig:
    """Everything the trainer needs, one field per concern."""

    run: RunConfig = field(default_factory=RunConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # Owned by their modules; filled by parse_args. Names kept as in config.json / checkpoints.
    model_cfg: ModelConfig | None = None  # the architecture: --model's preset plus flag overrides
    data_cfg: DataConfig | None = None  # loader settings (order, workers, padding)
    masking: MaskingConfig | None = None  # dynamic masking settings
    # ModelConfig fields the command line set on purpose (a given --model counts for all of its
    # architecture): --init_from lists those that disagree with the checkpoint.
    explicit_model: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every concern (saved as RUN/config.json and in checkpoints)."""
        return {
            k: dataclasses.asdict(v) for k, v in vars(self).items() if dataclasses.is_dataclass(v)
        }


def trainer_parser(
    prog: str = "pretrain/main.py",
    description: str = "Pretrain a BERT-style masked LM on DeepSpeed.",
) -> tuple[argparse.ArgumentParser, dict]:
    """The trainer's parser and its (group, field) -> dest map; the doctor extends the same one,
    so a launch line pastes into it unchanged."""
    return build_parser({**CONCERNS, **_foreign_concerns()}, prog, description)


def config_from_args(
    ns: argparse.Namespace, names: dict, parser: argparse.ArgumentParser
) -> TrainConfig:
    """The :class:`TrainConfig` of parsed flags, values checked; files are not looked at (the
    doctor reports a missing folder as a finding, the trainer's :func:`parse_args` fails on it)."""
    from pretrain.model.bert import preset

    cfg = TrainConfig(**{g: cls(**_overrides(ns, names, g)) for g, cls in CONCERNS.items()})
    foreign = _foreign_concerns()
    try:
        base = preset(cfg.run.model_preset)
    except ValueError as e:
        parser.error(str(e))
    flags = _overrides(ns, names, "model_cfg")
    cfg.model_cfg = dataclasses.replace(base, **flags)
    chosen = dataclasses.asdict(base) if getattr(ns, "model_preset", None) is not None else {}
    cfg.explicit_model = {**{k: v for k, v in chosen.items() if k != "name"}, **flags}
    data_over = _overrides(ns, names, "data_cfg")
    mask_over = _overrides(ns, names, "masking")
    # One --seed drives data order and masking too, unless they are given their own seeds.
    for over, cls in ((data_over, foreign["data_cfg"]), (mask_over, foreign["masking"])):
        if "seed" in {f.name for f in dataclasses.fields(cls)}:
            over.setdefault("seed", cfg.run.seed)
    try:
        cfg.data_cfg = foreign["data_cfg"](**data_over)
        cfg.masking = foreign["masking"](**mask_over)
    except ValueError as e:
        parser.error(str(e))
    _check_values(cfg, parser)
    return cfg


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Parse the command line into a :class:`TrainConfig` (flags override dataclass defaults)."""
    parser, names = trainer_parser()
    cfg = config_from_args(parser.parse_args(argv), names, parser)
    _check_paths(cfg, parser)
    return cfg


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
    from data_prep.progress import normalize_mode

    try:
        cfg.log.progress = normalize_mode(cfg.log.progress)
    except ValueError as e:
        parser.error(str(e))
    if cfg.run.show_masks < 0 or (cfg.run.show_masks and not cfg.run.dry_run):
        parser.error(
            "--show_masks N (N >= 0) goes with --dry-run: it prints masked sequences "
            "instead of training"
        )
    _check_guard(cfg.guard, parser)
    if cfg.checkpoint.keep_last < 1:
        parser.error("--keep_last must be at least 1")
    from pretrain.model.bert import (
        layer_groups,
    )  # (a --config_json depth is checked again at build)

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
    if cfg.optim.schedule_clock not in ("steps", "time"):
        parser.error(f"--schedule_clock must be steps or time, got {cfg.optim.schedule_clock!r}")
    if cfg.optim.schedule_clock == "time" and cfg.run.max_time_hours <= 0:
        parser.error("--schedule_clock time needs a budget: give --max_time_hours")
    if cfg.optim.schedule_clock == "time" and cfg.optim.warmup_steps is not None:
        parser.error(
            "--warmup_steps counts steps; with --schedule_clock time give the warmup as "
            "--warmup_ratio (a fraction of the time budget)"
        )


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


def _check_paths(cfg: TrainConfig, parser: argparse.ArgumentParser) -> None:
    """Fail before any work on files that are not there, naming the flag and the fix."""
    from pretrain.data.mixture import MixtureError, parse_mixture

    if not cfg.run.data_sources:
        parser.error("--data is required: the shard folder from `python -m data_prep build`")
    try:
        sources = parse_mixture(cfg.run.data_sources)
    except MixtureError as e:
        parser.error(str(e))
    for s in sources:
        if not Path(s.path, "manifest.json").is_file():
            parser.error(
                f"--data {s.path}: no manifest.json there (missing folder or an "
                "incomplete build); run `python -m data_prep build --output "
                f"{s.path} ...` first"
            )
    if not Path(cfg.run.ds_config).is_file():
        parser.error(f"--ds_config {cfg.run.ds_config}: file not found")
    if cfg.log.downstream_eval and not os.path.isfile(cfg.log.downstream_eval):
        parser.error(f"--downstream_eval {cfg.log.downstream_eval}: no such tasks file")
    if cfg.run.init_from and not os.path.exists(cfg.run.init_from):
        parser.error(f"--init_from {cfg.run.init_from}: no such folder (a HF BERT folder or a run)")
    r = cfg.run.resume
    if r not in ("auto", "none") and not os.path.exists(r):
        parser.error(f"--resume {r}: no such checkpoint (use auto, none, or a checkpoint folder)")
