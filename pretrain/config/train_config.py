"""Typed training configuration: one dataclass per concern, flags override, saved into the run.

The trainer's own concerns live here (run, batch, optimizer/schedule, precision, checkpoints,
logging); each field's help is its flag's (:func:`bertforge.cli.opt`). The model, data and
masking dataclasses belong to their modules; :mod:`pretrain.config.cli` turns every field into a
flag (``--<field>``, or ``--<group>_<field>`` when two groups share a field name).
The DeepSpeed JSON stays the source of ZeRO and precision settings; a setting both can hold (batch
sizes, lr, precision) is given in one of them (:mod:`pretrain.config.one_home`) and applied to a
copy of the JSON in :mod:`pretrain.config.ds_config`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bertforge.cli import opt

if TYPE_CHECKING:
    from bertforge.pretrain.data.loader import DataConfig
    from bertforge.pretrain.data.masking import MaskingConfig
    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.objective_config import ObjectiveConfig


def _preset_names() -> list[str]:
    """The model registry's preset names, read when --help is built (never a copy of them)."""
    from bertforge.pretrain.model.registry import PRESETS  # lazy: the registry imports torch

    return list(PRESETS)


# The values used when neither the recipe nor the DeepSpeed JSON gives one (never both:
# pretrain.config.one_home). The optimizer block and the batch sizes are filled from these.
DEFAULT_OPTIMIZER = "AdamW"
DEFAULT_LR = 1e-4
DEFAULT_WEIGHT_DECAY = 0.01
DEFAULT_GRADIENT_CLIPPING = 1.0  # BERT's; 0 turns clipping off
# Sequences per rank per step, given no batch size (BERT's 128-token phase fits 32 per GPU); the
# global batch then follows the world size.
DEFAULT_MICRO_BATCH = 32


def _from_ds(default: object) -> str:
    """How --help names the default of a field the DeepSpeed JSON may give instead."""
    return f"the DeepSpeed JSON's, else {default}"


@dataclass(frozen=True)
class RunConfig:
    """Where the run reads and writes, and how long it lasts."""

    ds_config: str = opt(
        "ds_configs/cpu.json", "DeepSpeed JSON config (ZeRO stage, precision, optimizer)"
    )
    data_sources: list[str] = opt(
        factory=list,
        help="shard folder written by `bertforge prep build`, or a weighted mixture: "
        "name=DIR:weight[:mask_prob] per source (see pretrain.data.mixture)",
        flags=("--data",),
        required=True,  # checked by parse_args; the doctor reports a missing one instead
    )
    model_preset: str = opt("tiny", "model preset", flags=("--model",), help_choices=_preset_names)
    output_dir: str = opt(
        "runs/default", "run folder: config.json, metrics.jsonl, checkpoints/, tensorboard/"
    )
    max_steps: int = opt(
        100,
        "optimizer steps to train (including steps skipped on an fp16 overflow or by the "
        "stability guard)",
    )
    max_time_hours: float = opt(
        0.0,
        "also end the run after this many hours of training time, added up over its launches "
        "(final validation and checkpoint at the budget); 0 = no time limit",
    )
    phases: str = opt(
        "",
        "a phase plan (JSON): the length, lr shape and global batch of each phase; the run's "
        "length is the plan's (docs/training.md)",
    )
    seed: int = opt(1234, "seed for model init, dropout and data order")
    resume: str = opt(
        "none", '"auto" (newest complete checkpoint in output_dir), "none", or a checkpoint path'
    )
    init_from: str = opt(
        "",
        "initial weights only (fresh optimizer, schedule, step 0) from a HF BERT or ModernBERT "
        "folder or one of our runs; the architecture comes from it; a checkpoint to resume wins",
    )
    anneal_from: str = opt(
        "",
        "RUN@STEP or RUN@latest: a new run from that checkpoint's weights and optimizer state "
        "whose lr decays from the source's lr at STEP to --min_lr_ratio x its peak over "
        "--anneal_tokens (pretrain.schedule.anneal); the source folder is only read",
    )
    anneal_tokens: int = opt(
        0, "with --anneal_from: tokens (sequences x max_seq_len) to anneal over"
    )
    dist_timeout_s: float = opt(
        600.0, "how long ranks wait for each other at start-up and in collectives"
    )
    heartbeat_timeout_s: float = opt(
        60.0,
        "a rank that has not sent a heartbeat for this many seconds counts as gone: every other "
        "rank names it and exits with status 3 instead of waiting --dist_timeout_s in a "
        "collective (pretrain.distributed.watchdog); 0 = off",
    )
    dry_run: bool = opt(
        False,
        "print the resolved plan (memory, batch sizes) and exit without training",
        flags=("--dry-run", "--dry_run"),  # the launchers' habit of dashes, and ours
    )
    json: bool = opt(False, "with --dry-run: print the plan as JSON")
    show_masks: int = opt(
        0,
        "with --dry-run: print this many training sequences with each masked position marked "
        "([MASK], random, kept) and whole-word units grouped",
    )


@dataclass(frozen=True)
class BatchConfig:
    """Batch sizes: any two, the third derived (pretrain.config.batching); each given here or in
    the DeepSpeed JSON, not both."""

    global_batch_size: int | None = opt(
        None,
        "sequences per optimizer step over all ranks",
        default_text=_from_ds("micro batch x accumulation x world size"),
    )
    micro_batch_size: int | None = opt(
        None, "sequences per forward pass per rank", default_text=_from_ds(DEFAULT_MICRO_BATCH)
    )
    grad_accum: int | None = opt(
        None,
        "micro-batches per rank per optimizer step",
        default_text=_from_ds("derived, or 1"),
    )
    batch_ramp_start: int = opt(
        0,
        "ramp the global batch from this many sequences up to --global_batch_size over the "
        "first --batch_ramp_fraction of the run (of --max_time_hours with --schedule_clock time, "
        "else of --max_steps), in whole micro-batches of every rank; 0 = no ramp (Cramming)",
    )
    batch_ramp_fraction: float = opt(
        0.6, "with --batch_ramp_start: the share of the run the ramp takes (Cramming: 0.6)"
    )


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule."""

    optimizer: str | None = opt(
        None, '"adamw" or "lamb" (GPU only)', default_text=_from_ds(DEFAULT_OPTIMIZER)
    )
    lr: float | None = opt(None, "peak learning rate", default_text=_from_ds(DEFAULT_LR))
    weight_decay: float | None = opt(
        None,
        "decoupled weight decay (not on biases/LayerNorm)",
        default_text=_from_ds(DEFAULT_WEIGHT_DECAY),
    )
    warmup_steps: int | None = opt(
        None, "linear warmup steps", default_text="warmup_ratio x max_steps"
    )
    warmup_ratio: float = opt(0.06, "warmup as a fraction of max_steps when warmup_steps is unset")
    schedule: str = opt(
        "warmup_decay",
        '"warmup_decay" (warmup, then --decay over the rest of the run) or "wsd" (warmup, a '
        "stable peak, then a --decay_shape decay over the last --decay_fraction of the run)",
    )
    decay: str = opt("linear", 'warmup_decay, after warmup: "linear", "poly" or "constant"')
    poly_power: float = opt(1.0, 'exponent of the "poly" decay (1.0 = linear)')
    decay_fraction: float = opt(
        0.2, "wsd: the decay phase as a fraction of max_steps (or of the time budget)"
    )
    decay_steps: int | None = opt(
        None, "wsd: the decay phase in steps", default_text="decay_fraction x max_steps"
    )
    decay_shape: str = opt("1-sqrt", 'wsd: the decay\'s shape, "linear", "cosine" or "1-sqrt"')
    min_lr_ratio: float = opt(
        0.0, "final lr (the floor of either schedule) as a fraction of the peak"
    )
    schedule_clock: str = opt(
        "steps",
        '"steps", or "time": warmup (--warmup_ratio) and decay follow the elapsed fraction of'
        " --max_time_hours instead of the step count",
    )
    gradient_clipping: float | None = opt(
        None, "max global grad norm (0 = off)", default_text=_from_ds(DEFAULT_GRADIENT_CLIPPING)
    )
    ema: float = opt(
        0.0,
        "keep an exponential moving average of the weights with this decay (0 < DECAY < 1) on "
        "rank 0 in fp32, saved with each checkpoint (export it with --ema); 0 = off",
    )
    override_lr_schedule: bool = opt(
        False,
        "with --resume: the lr schedule (--schedule, --lr, warmup, --max_steps, decay) comes "
        "from this launch's flags instead of the checkpoint; a warning lists what changed",
    )


@dataclass(frozen=True)
class PrecisionConfig:
    """Numeric precision: here or the DeepSpeed JSON's enabled fp16/bf16 block, not both."""

    precision: str | None = opt(
        None,
        '"fp32", "bf16" or "fp16"',
        default_text="the DeepSpeed JSON's enabled fp16/bf16 block, else fp32",
    )
    allow_precision_fallback: bool = opt(
        False, "when the precision is unavailable here, use fp32 instead of failing"
    )


@dataclass(frozen=True)
class MemoryConfig:
    """Trading compute for memory."""

    activation_checkpointing: str | None = opt(
        None,
        '"none", "torch" or "deepspeed"',
        default_text='"deepspeed" when the DeepSpeed config\'s activation_checkpointing.enabled '
        'is true, else "none"',
    )


@dataclass(frozen=True)
class SpeedConfig:
    """How the step runs faster with the same result (pretrain.model.compiled)."""

    compile: bool = opt(
        False,
        "torch.compile the encoder stacks (inductor; the first step and the first evaluation "
        "pay the compilation, tens of seconds): ZeRO 0-2, not ZeRO-3",
    )


@dataclass(frozen=True)
class CheckpointConfig:
    """When checkpoints are written and how many are kept."""

    save_interval: int = opt(0, "save every N optimizer steps (0 = only at the end and on signals)")
    save_interval_minutes: float = opt(
        0.0, "also save when this many minutes passed since the last save (0 = off)"
    )
    keep_last: int = opt(3, "complete checkpoints to keep (older ones are deleted)")
    save_final: bool = opt(True, "save when training ends")
    preemption_signals: str = opt(
        "TERM,INT",
        "signals that stop the run after saving at the step boundary (exit 0), comma-separated:"
        " TERM, INT, USR1, USR2, HUP, XCPU; add USR1 for SLURM's --signal=USR1@120 warning "
        "before the time limit (docs/launching.md)",
    )


@dataclass(frozen=True)
class GuardConfig:
    """The stability guard (pretrain.stability.guard): skip a loss spike's update, roll back on
    divergence."""

    stability_guard: bool = opt(
        True,
        "judge every step's loss and grad norm (skip spikes, roll back on NaN/inf or repeated"
        " spikes); --no_stability_guard turns it off",
        negatable=True,
    )
    guard_window: int = opt(50, "recent healthy steps whose median and MAD judge the next step")
    guard_min_history: int = opt(10, "healthy steps needed before spikes are judged")
    guard_z: float = opt(
        6.0, "a spike's robust z-score, (x - median) / (1.4826 MAD), is above this"
    )
    guard_min_ratio: float = opt(1.5, "... and its value is above this multiple of the median")
    guard_spikes: int = opt(
        3,
        "this many spikes (loss or grad norm) within --guard_spike_window steps roll back to "
        "the newest complete checkpoint",
    )
    guard_spike_window: int = opt(20, "steps over which --guard_spikes are counted")
    guard_max_rollbacks: int = opt(
        3, "rollbacks allowed per run; the next divergence gives up (exit status 6)"
    )
    guard_lr_factor: float = opt(
        1.0,
        "multiply the learning rate by this at each rollback (kept across resumes; 1.0 = "
        "unchanged)",
    )
    guard_climb: float = opt(
        1.2,
        "a divergence (rollback): the median of the last --guard_min_history losses is above "
        "this multiple of the lowest such median of the run or its phase (0 = off)",
    )
    guard_anchor_checkpoint: bool = opt(
        True,
        "without --save_interval: save one checkpoint after the lr warmup and --guard_window "
        "steps (the later) when the run has none yet, so that a rollback has a target",
    )


@dataclass(frozen=True)
class LogConfig:
    """Metrics and validation cadence."""

    log_interval: int = opt(1, "console/TensorBoard every N steps (metrics.jsonl gets every step)")
    eval_interval: int = opt(0, "validate every N steps (0 = only at the end)")
    eval_mask_prob: float = opt(
        0.0,
        "validation masks at this rate instead of the run's (0 = the run's own): runs of "
        "different mask rates compared on one held-out measure",
    )
    eval_batches: int = opt(
        50,
        "max validation global batches per evaluation: the first N x --global_batch_size "
        "validation sequences, the same on any number of ranks (before 2026-12-02: "
        "micro-batches per rank)",
    )
    progress: str = opt(
        "auto",
        'rank 0\'s console: "bar" (tqdm), "lines" (one plain line per --log_interval steps: '
        'step, loss, lr, tokens/s, ETA), "off", or "auto" (a bar when stderr is a terminal, '
        "lines in a log file); true/false mean auto/off",
    )
    progress_interval_s: float = opt(
        0.0,
        "with lines: at most one line per this many seconds instead of one per --log_interval"
        " steps (0 = by steps)",
    )
    downstream_eval: str = opt(
        "",
        "tasks JSON (bertforge evaluate's format), or glue:DIR[:TASK,...] / "
        "clue:DIR[:TASK,...] (a GLUE or CLUE folder, the run_glue protocol): fine-tune and score "
        'checkpoints in the background on rank 0 (records "split": "downstream")',
    )
    downstream_interval: int = opt(
        0, "evaluate the checkpoint of every N-th step (a multiple of --save_interval)"
    )
    downstream_max_examples: int = opt(
        500,
        "train and test examples per task in those evaluations (glue:/clue: train examples; "
        "the dev splits are scored whole)",
    )
    downstream_device: str = opt(
        "cpu", "device of the background evaluations (cpu keeps the GPUs for training)"
    )


CONCERNS: dict[str, type] = {
    "run": RunConfig,
    "batch": BatchConfig,
    "optim": OptimConfig,
    "precision": PrecisionConfig,
    "memory": MemoryConfig,
    "speed": SpeedConfig,
    "checkpoint": CheckpointConfig,
    "guard": GuardConfig,
    "log": LogConfig,
}


def foreign_concerns() -> dict[str, type]:
    """Dataclasses owned by the model and data modules (flags are generated from their fields)."""
    # Lazy, as in _preset_names: the data and model modules import torch; these dataclasses don't.
    from bertforge.pretrain.data.loader import DataConfig
    from bertforge.pretrain.data.masking import MaskingConfig
    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.objective_config import ObjectiveConfig

    return {
        "model_cfg": ModelConfig,
        "objective_cfg": ObjectiveConfig,
        "data_cfg": DataConfig,
        "masking": MaskingConfig,
    }


@dataclass(frozen=True)
class TrainConfig:
    """Everything the trainer needs, one field per concern. Frozen, as each concern: built once
    by :func:`pretrain.config.cli.config_from_args`, resolution makes new ones
    (``dataclasses.replace``) and nothing edits a config afterwards."""

    run: RunConfig = field(default_factory=RunConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # Owned by their modules; filled by parse_args. Names kept as in config.json / checkpoints.
    model_cfg: ModelConfig | None = None  # the architecture: --model's preset plus flag overrides
    objective_cfg: ObjectiveConfig | None = None  # --objective and the rtd knobs
    data_cfg: DataConfig | None = None  # loader settings (order, workers, padding)
    masking: MaskingConfig | None = None  # dynamic masking settings
    # ModelConfig fields the command line set on purpose (a given --model counts for all of its
    # architecture): --init_from lists those that disagree with the checkpoint.
    explicit_model: dict[str, Any] = field(default_factory=dict)
    # Where each value that is not a default came from ({"optim.lr": "flag --lr"}; "recipe F",
    # "checkpoint C", the DeepSpeed JSON): the dry run prints it beside the value.
    sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every concern (saved as RUN/config.json and in checkpoints)."""
        return {
            k: dataclasses.asdict(v) for k, v in vars(self).items() if dataclasses.is_dataclass(v)
        }
