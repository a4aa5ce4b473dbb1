"""The doctor's view of a ``--max_time_hours`` budget (issue 52): the plan on the wall clock
(warmup, stable peak, decay, batch ramp) and the tokens the budget buys on the probed GPUs, from
their dense peak at the run's precision x :data:`~pretrain.schedule.budget_plan.PLANNED_MFU`
over the model's training FLOPs per token (6 x parameters + attention). Without a known GPU
peak (CPU nodes, an unlisted GPU) the row says so; ``--dry-run`` times a step on the machine."""

from __future__ import annotations

from bertforge.pretrain.components.metrics import peak_tflops_for
from bertforge.pretrain.doctor.checks import OK, WARN, Row
from bertforge.pretrain.schedule.budget_plan import PLANNED_MFU, budget_plan, format_plan


def flops_per_token(shape) -> float:
    """Training FLOPs per token: 6 x parameters for the weights, plus attention's scores and
    values, 12 x layers x hidden x sequence length (forward and backward)."""
    return 6.0 * shape.params + 12.0 * shape.layers * shape.hidden * shape.seq_len


def budget_rows(cfg, plan, shape, probes: dict, hosts: dict[str, int], ds: dict) -> list[Row]:
    """The budget's plan as rows ([] without --max_time_hours or a batch plan)."""
    if cfg.run.max_time_hours <= 0 or plan is None:
        return []
    precision = (
        "bf16"
        if ds.get("bf16", {}).get("enabled")
        else ("fp16" if ds.get("fp16", {}).get("enabled") else cfg.precision.precision)
    )
    peaks = []
    for host, pr in probes.items():
        name = pr.get("gpu_name") or ""
        peak = peak_tflops_for(name, precision) if pr.get("gpus") else None
        peaks.append((peak, hosts.get(host, 0), name))
    rate, source = None, "no GPU peak known here for this precision: --dry-run times a step"
    if peaks and all(p is not None for p, _, _ in peaks):
        flops = flops_per_token(shape)
        rate = sum(p * 1e12 * slots for p, slots, _ in peaks) * PLANNED_MFU / flops
        source = (
            f"{sum(s for _, s, _ in peaks)} x {peaks[0][2]} at {precision} peak x "
            f"{PLANNED_MFU:.0%} MFU, {flops / 1e9:.2f} GFLOPs per token"
        )
    unit = plan.micro_batch * plan.world_size
    found = budget_plan(cfg, plan.global_batch, unit, shape.seq_len, rate, source)
    lines = format_plan(found)
    rows = [Row("budget", "-", OK, lines[0].removeprefix("budget  "))]
    rows += [Row("budget", "-", OK, line.strip()) for line in lines[1:]]
    if found.get("note") and "cut short" in found["note"]:
        rows[-1] = Row("budget", "-", WARN, found["note"], "add --schedule_clock time")
    return rows
