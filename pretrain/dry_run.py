"""`bertforge train --data DIR --dry-run [--json] [--show_masks N]`: build everything,
train nothing. Runs the checks a real launch runs before its rendezvous (the shards, --init_from,
the resume point, the DeepSpeed config for this world size; :func:`pretrain.build.resolve_run`)
and fails the same way, then builds the model and the training loader as a run would, draws the
first batches and reports the resolved configuration, parameters, FLOPs per token, the shards and
the realised masking (a wrong mask_prob or vocabulary shows before any GPU time is spent).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from bertforge.data_prep.sources import parse_mixture
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.logs import get_logger
from bertforge.pretrain.build import resolve_run
from bertforge.pretrain.checkpoints.schedule_override import guard_factor
from bertforge.pretrain.config.one_home import SHARED_KNOBS
from bertforge.pretrain.config.phase_plan import plan_dict, plan_table
from bertforge.pretrain.config.recipe import defaults, resolved_flags, value_sources
from bertforge.pretrain.config.schedule import TICKS_PER_BUDGET, build_schedule
from bertforge.pretrain.config.train_config import CONCERNS, OptimConfig, foreign_concerns
from bertforge.pretrain.data.cached_plans import CachedPlans
from bertforge.pretrain.data.loader import DataConfig, build_loader
from bertforge.pretrain.data.masking import MaskingConfig, mask_prob_at, merge_stats
from bertforge.pretrain.data.mixture import open_training
from bertforge.pretrain.data.show_masks import format_shown
from bertforge.pretrain.data.show_masks import show_masks as shown_masks
from bertforge.pretrain.model.bert import ModelConfig, padded_vocab, resolve_config
from bertforge.pretrain.model.objective_config import ObjectiveConfig
from bertforge.pretrain.model.registry import ARCHES, build_model, resolve_attention
from bertforge.pretrain.model.specs import resolve_objective
from bertforge.pretrain.objectives.registry import OBJECTIVES, objective_for
from bertforge.pretrain.schedule.budget_plan import budget_planner, format_plan, step_rate

log = get_logger(__name__)
DISPLAY_DIGITS = 10  # floats in the report: 0.2, not 0.19999999999999998 (from 1 - 0.8)


def rounded(value: Any) -> Any:
    """``value`` with every float rounded to :data:`DISPLAY_DIGITS` significant digits, for
    display (nested dicts and lists too)."""
    if isinstance(value, float):
        return float(f"{value:.{DISPLAY_DIGITS}g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def shards_summary(reader) -> dict[str, Any]:
    """The manifest's essentials: format, lengths, tokenizer and per-split counts."""
    m = reader.manifest
    return {
        "root": str(reader.root),
        "format": reader.format,
        "max_seq_len": reader.max_seq_len,
        "vocab_size": reader.vocab_size,
        "tokenizer_fingerprint": m["tokenizer"].get("fingerprint"),
        "lowercase": m["tokenizer"].get("lowercase"),
        "special_tokens": dict(reader.special_tokens),
        "splits": {
            name: {
                "sequences": s.get("sequences"),
                "tokens": s.get("tokens"),
                "documents": s.get("documents"),
                "shards": len(s.get("shards", [])),
            }
            for name, s in m["splits"].items()
        },
        "dropped": m.get("dropped", {}),
    }


def realised_masking(
    loader, num_batches: int, masking_cfg: MaskingConfig, micro_batch_size: int
) -> dict[str, Any]:
    """The masking statistics of the loader's first ``num_batches`` batches, merged from counts,
    with the batch shapes and the schedule's start and end rates."""
    stats, lengths = [], []
    for _, batch in zip(range(num_batches), loader):
        stats.append(batch["masking_stats"])
        lengths.append(int(batch["input_ids"].shape[1]))
    masking = merge_stats(stats)
    masking.update(
        {
            "batches": len(stats),
            "micro_batch_size": micro_batch_size,
            "padded_lengths": sorted(set(lengths)),
            "mask_prob_start": mask_prob_at(masking_cfg, 0),
        }
    )
    if masking_cfg.mask_prob_end is not None:
        masking["mask_prob_end"] = mask_prob_at(masking_cfg, masking_cfg.schedule_samples)
    return masking


def lr_phases(schedule, peak_lr: float, clock: str) -> dict[str, Any]:
    """The schedule's phases with the lr at each boundary (``peak_lr`` x the multiplier there);
    positions are optimizer steps, or percent of the time budget on the time clock."""

    def where(position: int) -> float:
        return position if clock == "steps" else 100.0 * position / TICKS_PER_BUDGET

    return {
        "schedule": schedule.kind,
        "decay_shape": schedule.decay_shape,
        "unit": "steps" if clock == "steps" else "% of the time budget",
        "peak_lr": peak_lr,
        "phases": [
            {
                "phase": name,
                "start": where(start),
                "end": where(end),
                "lr_start": peak_lr * schedule(start),
                "lr_end": peak_lr * schedule(end),
            }
            for name, start, end in schedule.phases()
        ],
    }


def run_dry_run(
    data: str | list[str],
    model_cfg: ModelConfig,
    masking_cfg: MaskingConfig,
    data_cfg: DataConfig,
    num_batches: int = 8,
    as_json: bool = False,
    *,
    micro_batch_size: int = 32,
    extra_config: dict | None = None,
    stream=None,
    show_masks: int = 0,
    reader=None,
    lr_schedule: dict[str, Any] | None = None,
    recipe: list[dict[str, Any]] | None = None,
    objective_cfg: ObjectiveConfig | None = None,
    budget=None,
) -> dict[str, Any]:
    """Build reader, model and loader; draw `num_batches` training batches; print and return
    the report. extra_config: further resolved settings (e.g. the trainer's) merged under "config".
    Output goes to `stream` (default stdout): JSON when as_json, else a human-readable report.
    show_masks: that many training sequences decoded, masks marked (pretrain.data.show_masks).
    reader: the training reader of ``data`` when the caller opened it already.
    lr_schedule: the phases of :func:`lr_phases` (under "lr_schedule").
    recipe: :func:`recipe_lines` (under "recipe": each non-default value and its source).
    objective_cfg: ``--objective`` and its knobs (default: the shards decide).
    budget: with --max_time_hours, ``budget(tokens_per_s, source)`` -> the plan (budget_plan).
    """
    stream = stream or sys.stdout
    if reader is None:
        reader = open_training(parse_mixture(data), verify=data_cfg.verify)
    resolved, model, loader = _model_and_loader(
        reader, model_cfg, masking_cfg, data_cfg, micro_batch_size, objective_cfg
    )
    masking = realised_masking(loader, num_batches, masking_cfg, micro_batch_size)
    report = {
        "config": {
            "model": dataclasses.asdict(resolved),
            "masking": dataclasses.asdict(masking_cfg),
            "data": dataclasses.asdict(data_cfg),
            **(extra_config or {}),
        },
        "model": _model_summary(model, resolved, reader, masking, objective_cfg),
        "shards": shards_summary(reader),
        "masking": masking,
        **({"lr_schedule": lr_schedule} if lr_schedule else {}),
        **({"recipe": recipe} if recipe is not None else {}),
    }
    if budget is not None:
        rate, source = step_rate(model, loader, micro_batch_size)
        report["budget"] = budget(rate, source)
    report = rounded(report)
    if show_masks > 0:
        report["show_masks"] = shown_masks(
            loader, show_masks, str(reader.tokenizer_path / "tokenizer.json")
        )
    if as_json:
        stream.write(json.dumps(report, indent=1, default=str) + "\n")
    else:
        stream.write(format_report(report))
    stream.flush()
    return report


def _model_and_loader(
    reader,
    model_cfg: ModelConfig,
    masking_cfg: MaskingConfig,
    data_cfg: DataConfig,
    micro_batch_size: int,
    objective_cfg: ObjectiveConfig | None = None,
) -> tuple[ModelConfig, Any, Any]:
    """The model config resolved for ``reader``'s data, the model it builds and a training loader
    that draws its batches in this process (the report needs no worker processes)."""
    resolved = resolve_config(model_cfg, reader.vocab_size)
    resolved = dataclasses.replace(
        resolved, attention=resolve_attention(resolved.attention, resolved.arch)
    )
    objective = resolve_objective(objective_cfg, reader.format)
    model = build_model(
        resolved, reader.vocab_size, objective=objective, max_seq_len=reader.max_seq_len
    )
    loader = build_loader(
        reader,
        dataclasses.replace(data_cfg, num_workers=0),
        masking_cfg,
        micro_batch_size=micro_batch_size,
        consumed_samples=0,
        train=True,
        attention=resolved.attention,
        sentence_order=objective.sentence_order,
    )
    if isinstance(loader.batch_sampler, CachedPlans):  # object storage: only what is drawn
        loader.batch_sampler.ahead = False
    return resolved, model, loader


def _model_summary(model, resolved: ModelConfig, reader, masking: dict, objective_cfg) -> dict:
    """The report's "model": its class, size (and the objective's: its networks beside the
    encoder), FLOPs per token at the realised masking, and sequence and vocabulary sizes."""
    seq_len = reader.max_seq_len
    objective = objective_for(resolve_objective(objective_cfg, reader.format))
    return {
        "architecture": model.hf_architecture,
        # Distinct parameters: weights shared between layers (--share_layers) count once.
        "parameters": int(model.num_parameters()),
        **objective.dry_run_terms(model),  # its networks beside the encoder
        "flops_per_token": model.flops_per_token(seq_len, masking["selected_fraction"]),
        "seq_len": seq_len,
        "vocab_size": reader.vocab_size,
        "padded_vocab_size": padded_vocab(reader.vocab_size, resolved.vocab_multiple),
    }


def _sharing(model_cfg: dict[str, Any]) -> str:
    """ " (weights shared: all)" for a model with --share_layers, else ""."""
    spec = model_cfg.get("share_layers", "none")
    return "" if spec == "none" else f" (weights shared: {spec})"


def _attention(model_cfg: dict[str, Any], fmt: str) -> str:
    """The --attention line: what a token sees (document or full) and, where the arch's spec
    says more (ModelSpec.describe_layers), how its layers attend."""
    mode = model_cfg.get("attention", "full")
    if mode == "document":
        seen = (
            "document: each sequence (NSP pair) as one document"
            if fmt == "nsp"
            else "document: a token sees its own document, positions restart per document"
        )
    else:
        seen = "full: a token sees its whole packed sequence"
    line = f"\n        attention {seen}"
    layers = ARCHES[model_cfg.get("arch", "bert")].describe_layers(model_cfg)
    return line + (f"\n        {layers}" if layers else "")


def format_report(r: dict[str, Any]) -> str:
    """Human-readable form of a dry-run report."""
    m, s, k = r["model"], r["shards"], r["masking"]
    cm = r["config"]["model"]
    lines = [
        "== dry run: nothing is trained ==",
        (
            f"model   {cm['name']}: {m['architecture']}, hidden {cm['hidden_size']}, layers "
            f"{cm['num_hidden_layers']}{_sharing(cm)}, heads {cm['num_attention_heads']}, "
            f"ffn {cm['intermediate_size']}{_attention(cm, s['format'])}"
        ),
        (
            f"        {m['parameters']:,} parameters; {m['flops_per_token'] / 1e9:.3f} GFLOPs per "
            f"token (train, seq {m['seq_len']}); vocab {m['vocab_size']} padded to "
            f"{m['padded_vocab_size']}"
        ),
        *(row for objective in OBJECTIVES.values() for row in objective.dry_run_rows(m)),
        (
            f"shards  {s['root']}: format {s['format']}, max_seq_len {s['max_seq_len']}, "
            f"tokenizer {str(s['tokenizer_fingerprint'])[:12]}"
        ),
    ]
    for name, sp in s["splits"].items():
        lines.append(
            f"        {name}: {sp['sequences']:,} sequences, {sp['tokens']:,} tokens, "
            f"{sp['shards']} shards"
        )
    mc = r["config"]["masking"]
    lines += [
        (
            f"masking mask_prob {k['mask_prob']:.4f} "
            f"({'whole words' if mc['whole_word'] else 'tokens'}, cap {mc['max_predictions']}), "
            f"over {k['batches']} batches of {k['micro_batch_size']}:"
        ),
        (
            f"        selected {k['selected_fraction']:.4f} of {k['maskable_tokens']:,} maskable "
            f"tokens; of the selected: [MASK] {k['mask_token_fraction']:.4f}, random "
            f"{k['random_fraction']:.4f}, kept {k['kept_fraction']:.4f}; "
            f"{k['whole_word_units']:,} units"
        ),
        "config  "
        + json.dumps(
            {key: v for key, v in r["config"].items() if key not in ("model", "masking")},
            default=str,
        ),
    ]
    if "lr_schedule" in r:  # before the long config line
        lines.insert(len(lines) - 1, format_lr_phases(r["lr_schedule"]))
    if r.get("budget"):
        lines += format_plan(r["budget"])
    if "recipe" in r:
        lines.append("recipe  the values that are not defaults, and where each came from:")
        lines += [
            f"        {e['key']} = {json.dumps(e['value'], default=str)}   ({e['source']})"
            for e in r["recipe"]
        ]
    if "show_masks" in r:
        lines.append(format_shown(r["show_masks"]).rstrip("\n"))
    return "\n".join(lines) + "\n"


def format_lr_phases(sched: dict[str, Any]) -> str:
    """``lr      wsd (1-sqrt), peak 0.001, by steps: warmup 0-6 1.67e-04 -> 1.00e-03 | ...``"""
    unit = "" if sched["unit"] == "steps" else "%"
    parts = [
        f"{p['phase']} {p['start']:g}{unit}-{p['end']:g}{unit} "
        + (
            f"{p['lr_start']:.2e}"
            if p["lr_start"] == p["lr_end"]
            else f"{p['lr_start']:.2e} -> {p['lr_end']:.2e}"
        )
        for p in sched["phases"]
    ]
    head = f"lr      {sched['schedule']} ({sched['decay_shape']}), peak {sched['peak_lr']:g}"
    head += ", by steps: " if sched["unit"] == "steps" else ", by the time budget: "
    note = f"\n        {sched['note']}" if sched.get("note") else ""
    return head + " | ".join(parts) + note


def _schedule_report(cfg, run) -> dict[str, Any] | None:
    """:func:`lr_phases` of the schedule this launch will follow: the anneal's, the phase
    plan's, on a resume the checkpoint's (unless --override_lr_schedule), else the flags'."""
    if run.anneal is not None:  # --anneal_from: the source's lr decays to the floor
        plan = run.anneal
        out = lr_phases(plan.schedule(), plan.peak_lr * plan.guard_factor, "steps")
        out["schedule"], out["note"] = "anneal", plan.summary()
        return out
    peak = float(run.setup.config["optimizer"]["params"]["lr"])
    if run.phases is not None:
        return phase_plan_report(run.phases.plan, peak)
    clock = cfg.optim.schedule_clock
    if run.point is not None and clock == "steps" and not cfg.optim.override_lr_schedule:
        return checkpoint_schedule(run.point, peak, cfg.run.max_steps)
    out = lr_phases(build_schedule(cfg.optim, cfg.run.max_steps), peak, clock)
    if run.point is not None and clock == "steps":
        out["note"] = (
            f"resuming {run.point.path}: these flags' schedule replaces the checkpoint's "
            "(--override_lr_schedule)"
        )
    return out


def checkpoint_schedule(point, launch_peak: float, max_steps: int) -> dict[str, Any]:
    """The schedule a resume continues: the one its checkpoint's run resolved (with the guard's
    lr cut it carries), not this launch's flags."""
    saved = point.state.get("config", {})
    names = {f.name for f in dataclasses.fields(OptimConfig)}
    optim = OptimConfig(**{k: v for k, v in saved.get("optim", {}).items() if k in names})
    total = int(saved.get("run", {}).get("max_steps", max_steps))
    peak = optim.lr
    unknown = peak is None  # a checkpoint written before its config recorded the resolved lr
    factor = guard_factor(point.state)
    shown = (launch_peak if unknown else peak) * factor
    out = lr_phases(build_schedule(optim, total), shown, "steps")
    out["note"] = (
        f"resuming {point.path}: its schedule continues ({total} steps"
        + (f", the guard's lr cut x{factor:g}" if factor != 1.0 else "")
        + f"); this launch stops at step {max_steps} (--max_steps); --override_lr_schedule "
        "takes the flags' schedule instead"
        + ("; its peak lr is not recorded: shown with this launch's" if unknown else "")
    )
    return out


def phase_plan_report(plan, peak_lr: float) -> dict[str, Any]:
    """--phases: the plan's phases in :func:`lr_phases`' form (lr at each boundary), with the
    table of steps, tokens, lr, batch, data and mask rate as the note, and the resolved plan."""
    return {
        "schedule": "phases",
        "decay_shape": "per phase",
        "unit": "steps",
        "peak_lr": peak_lr,
        "phases": [
            {
                "phase": ph.name,
                "start": ph.start_step,
                "end": ph.end_step,
                "lr_start": peak_lr * ph.lr_start,
                "lr_end": peak_lr * ph.lr_end,
            }
            for ph in plan
        ],
        "note": plan_table(plan).replace("\n", "\n        "),
        "plan": plan_dict(plan),
    }


def _import_deepspeed_quietly() -> None:
    """Import DeepSpeed with its logger bound to stderr: it writes to the ``sys.stdout`` it finds
    at import (an accelerator line on a CPU), and the report (``--json``) must be all of stdout."""
    saved, sys.stdout = sys.stdout, sys.stderr
    try:
        import deepspeed  # noqa: F401
    finally:
        sys.stdout = saved


def _unset_sources(cfg, setup) -> dict[str, str]:
    """Where a shared setting that neither the recipe nor the DeepSpeed JSON gives comes from:
    the default, or for a batch size, the others."""
    given = set(cfg.sources) | setup.from_json
    any_batch = any(f.startswith("batch.") for f in given)
    ranks = setup.batch.world_size
    out = {}
    for knob in SHARED_KNOBS:
        if knob.field in given:
            continue
        out[knob.field] = "default: neither the recipe nor the DeepSpeed JSON gives it"
        if knob.field == "batch.global_batch_size" or (
            any_batch and knob.field.startswith("batch.")
        ):
            out[knob.field] = f"derived from the other batch sizes for {ranks} rank(s)"
    return out


def recipe_lines(parsed, run, resolved: dict[str, Any]) -> list[dict[str, Any]]:
    """The resolved recipe's values that are not defaults, each with where it came from (a
    flag, the recipe file, the DeepSpeed JSON, the phase plan, the anneal, the checkpoint)."""
    by: dict[str, str] = _unset_sources(run.cfg, run.setup)
    if run.phases is not None:
        by["run.max_steps"] = f"phases {parsed.run.phases}"
    if run.anneal is not None:
        by["run.max_steps"] = by["optim.lr"] = f"anneal_from {parsed.run.anneal_from}"
    cfg = run.cfg
    # values resolution set (the checkpoint's peak lr for --override_lr_schedule)
    by.update({k: v for k, v in cfg.sources.items() if parsed.sources.get(k) != v})
    if run.point is not None and not cfg.optim.override_lr_schedule and run.phases is None:
        saved = run.point.state.get("config", {}).get("optim", {})
        for key, value in saved.items():  # the schedule that continues is the checkpoint's
            if key in resolved["optim"] and value is not None and value != resolved["optim"][key]:
                resolved["optim"][key] = value
                by[f"optim.{key}"] = f"checkpoint {run.point.path}"
    table = value_sources(
        resolved,
        parsed.to_dict(),
        cfg.sources,
        defaults({**CONCERNS, **foreign_concerns()}),
        by,
    )
    return [{"key": k, "value": v, "source": w} for k, v, w in table]


def main(cfg) -> int:
    """Dry run for the trainer's parsed TrainConfig (`pretrain/main.py --dry-run [--json]`)."""
    _import_deepspeed_quietly()
    try:
        run = resolve_run(cfg)  # the launch's own checks, before any rendezvous
        parsed, cfg = cfg, run.cfg  # the config as it will run
        flags = resolved_flags(cfg, run.setup)
        own = ("model_cfg", "masking", "data_cfg")
        extra = {k: v for k, v in flags.items() if k not in own}
        extra["world_size"] = run.setup.batch.world_size
        run_dry_run(
            cfg.run.data_sources,
            cfg.model_cfg,
            cfg.masking,
            cfg.data_cfg,
            as_json=cfg.run.json,
            recipe=recipe_lines(parsed, run, flags),
            micro_batch_size=run.setup.batch.micro_batch,
            extra_config=extra,
            show_masks=cfg.run.show_masks,
            reader=run.train_reader,
            lr_schedule=_schedule_report(cfg, run),
            objective_cfg=cfg.objective_cfg,
            budget=budget_planner(cfg, run),
        )
    # A shard found corrupt while drawing batches is the loader's ValueError.
    except (UserError, ValueError) as e:
        log.error(str(e))
        return USER_ERROR_EXIT
    return 0
