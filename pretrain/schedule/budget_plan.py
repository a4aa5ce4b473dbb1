"""The plan of a run with a time budget (``--max_time_hours``, issue 52), for the machine at hand.

What the dry run and the doctor print before anything trains: when each part of the schedule
starts on the wall clock (warmup, the stable peak, the decay, the end of the batch ramp), and,
from a rate in tokens per second (the dry run times a training step here; the doctor derives one
from the probed GPUs' peak and :data:`PLANNED_MFU`), the tokens and optimizer steps the budget
buys. On the step clock it also says where the budget will cut the step schedule: a run whose
budget ends before ``--max_steps`` never finishes its decay, the case ``--schedule_clock time``
exists for.
"""

from __future__ import annotations

from typing import Any

from bertforge.pretrain.config.schedule import build_schedule
from bertforge.pretrain.schedule.budget import ramp_batch_at

# The MFU the doctor plans with when it knows only the GPU: about what our trainer measured for
# BERT-base at 128 tokens on one H100 (docs/benchmarks.md, make gpu-check); a plan, not a promise.
PLANNED_MFU = 0.35
_SLICES = 1000  # the budget cut into this many slices to add up the steps of a batch ramp


def hm(seconds: float, total: float | None = None) -> str:
    """``1:05`` (hours:minutes) within a budget of an hour or more (``total``, default
    ``seconds``), ``2m30s`` within a shorter one."""
    if (seconds if total is None else total) < 3600:
        return f"{int(seconds // 60)}m{int(round(seconds % 60)):02d}s"
    minutes = int(round(seconds / 60))
    return f"{minutes // 60}:{minutes % 60:02d}"


def clock_parts(cfg) -> list[dict[str, Any]]:
    """The parts of a time-clock run as fractions of the budget: lr warmup, stable peak and
    decay, and the batch ramp (``cfg``: a TrainConfig)."""
    o, parts = cfg.optim, []
    w = o.warmup_ratio
    parts.append({"part": "lr warmup", "start": 0.0, "end": w})
    if o.schedule == "wsd":
        parts.append({"part": "lr stable (peak)", "start": w, "end": 1.0 - o.decay_fraction})
        parts.append(
            {"part": f"lr decay ({o.decay_shape})", "start": 1.0 - o.decay_fraction, "end": 1.0}
        )
    else:
        parts.append({"part": f"lr decay ({o.decay})", "start": w, "end": 1.0})
    return parts


def budget_plan(
    cfg, global_batch: int, unit: int, seq_len: int, tokens_per_s: float | None, rate_source: str
) -> dict[str, Any] | None:
    """The plan of ``cfg``'s budget (None without one). ``global_batch``: the run's target batch;
    ``unit``: micro-batch x ranks (a ramp's step); ``tokens_per_s``: all ranks together, or None
    when unknown (the plan then has no tokens); ``rate_source``: where that rate came from."""
    hours = cfg.run.max_time_hours
    if hours <= 0:
        return None
    total = hours * 3600.0
    b = cfg.batch
    ramp = b.batch_ramp_start > 0

    def batch_at(fraction: float) -> int:
        if not ramp:
            return global_batch
        start = -(-b.batch_ramp_start // unit) * unit
        return ramp_batch_at(fraction, start, global_batch, b.batch_ramp_fraction, unit)

    plan: dict[str, Any] = {
        "hours": hours,
        "clock": cfg.optim.schedule_clock,
        "global_batch": global_batch,
        "seq_len": seq_len,
        "tokens_per_s": tokens_per_s,
        "rate_source": rate_source,
    }
    parts = clock_parts(cfg) if cfg.optim.schedule_clock == "time" else []
    if ramp:
        start = batch_at(0.0)
        until = b.batch_ramp_fraction if cfg.optim.schedule_clock == "time" else None
        parts.append(
            {
                "part": f"batch ramp {start} -> {global_batch}",
                "start": 0.0,
                "end": until,
                "note": None
                if until is not None
                else f"first {b.batch_ramp_fraction:.0%} of steps",
            }
        )
    for p in parts:
        for k in ("start", "end"):
            if p[k] is not None:
                p[k + "_s"] = p[k] * total
    plan["parts"] = [p for p in parts if p["end"] is None or p["end"] > p["start"]]
    decay = next((p for p in plan["parts"] if p["part"].startswith("lr decay")), None)
    plan["decay_starts_s"] = decay["start_s"] if decay else None
    if tokens_per_s:
        plan["tokens_expected"] = tokens_per_s * total
        if cfg.optim.schedule_clock == "time":
            dt = total / _SLICES
            steps = sum(
                tokens_per_s * dt / (batch_at((i + 0.5) / _SLICES) * seq_len)
                for i in range(_SLICES)
            )
        else:
            steps = tokens_per_s * total / (global_batch * seq_len)
        plan["steps_expected"] = int(steps)
        if cfg.optim.schedule_clock == "steps":
            plan["note"] = step_clock_note(cfg, int(steps))
    elif cfg.optim.schedule_clock == "steps":
        plan["note"] = (
            "the lr follows --max_steps; whether the budget ends the run before the decay does "
            "depends on the step rate: --schedule_clock time ties the decay to the budget"
        )
    return plan


def step_clock_note(cfg, steps: int) -> str:
    """Where the budget cuts a step-clock schedule of ``cfg.run.max_steps``."""
    max_steps = cfg.run.max_steps
    if steps >= max_steps:
        return f"--max_steps {max_steps} ends the run before the budget (about {steps} steps fit)"
    sched = build_schedule(cfg.optim, max_steps)
    left = sched(steps)
    return (
        f"the budget ends the run near step {steps} of --max_steps {max_steps}, with the lr "
        f"still at {left:.0%} of its peak: the decay is cut short; --schedule_clock time ties "
        "warmup and decay to the budget"
    )


def format_plan(plan: dict[str, Any]) -> list[str]:
    """The plan as report lines (the dry run's ``budget`` lines, the doctor's row)."""
    total = plan["hours"] * 3600.0
    head = f"budget  {plan['hours']:g} h ({hm(total)}) on the {plan['clock']} clock"
    if plan.get("tokens_per_s"):
        head += (
            f"; {plan['tokens_per_s']:,.0f} tokens/s ({plan['rate_source']}) -> about "
            f"{plan['tokens_expected']:.3g} tokens, {plan['steps_expected']:,} optimizer steps "
            f"at {plan['seq_len']} tokens per sequence"
        )
    else:
        head += f"; tokens: unknown ({plan['rate_source']})"
    lines = [head]
    for p in plan["parts"]:
        if p.get("end") is None:
            lines.append(f"        {p['part']}: {p['note']}")
            continue
        lines.append(
            f"        {hm(p['start_s'], total)} - {hm(p['end_s'], total)}  {p['part']}"
            f"  ({p['start']:.0%} - {p['end']:.0%} of the budget)"
        )
    if plan.get("decay_starts_s") is not None:
        lines.append(
            f"        the decay starts at {hm(plan['decay_starts_s'])} and ends with the budget"
        )
    if plan.get("note"):
        lines.append(f"        {plan['note']}")
    return lines


def step_rate(model, loader, micro_batch_size: int, timed: int = 2) -> tuple[float, str]:
    """Tokens per second of one rank's forward and backward pass (no optimizer, no collective),
    timed here after a warm-up step: on a GPU at the run's micro-batch in bf16 autocast, on a
    CPU with at most 4 sequences (a BERT-base micro-batch would take minutes). The plan
    multiplies it by the ranks; an upper bound of the run's rate."""
    import time

    import torch

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model = model.to(device).train()
    batch = next(iter(loader))
    rows = batch["input_ids"].shape[0] if cuda else min(4, batch["input_ids"].shape[0])
    inputs = {
        k: v[:rows].to(device)
        for k, v in batch.items()
        if isinstance(v, torch.Tensor) and k not in ("source",)
    }
    tokens = (
        int(inputs["attention_mask"].sum())
        if "attention_mask" in inputs
        else inputs["input_ids"].numel()
    )
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else None
    seconds = []
    for i in range(1 + timed):
        start = time.perf_counter()
        if autocast is not None:
            with autocast:
                out = model(**inputs)
        else:
            out = model(**inputs)
        out["mlm_loss"].backward()
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if i:
            seconds.append(time.perf_counter() - start)
    where = torch.cuda.get_device_name() if cuda else "this CPU"
    rate = tokens / min(seconds)
    return rate, f"a forward+backward of {rows} sequences timed on {where}, x ranks"


def budget_planner(cfg, run):
    """With --max_time_hours: the budget's plan from a rate of one rank timed here (x ranks)."""
    if cfg.run.max_time_hours <= 0:
        return None
    b = run.setup.batch
    seq_len = run.train_reader.max_seq_len

    def plan(rate: float, source: str):
        return budget_plan(
            cfg, b.global_batch, b.micro_batch * b.world_size, seq_len, rate * b.world_size, source
        )

    return plan
