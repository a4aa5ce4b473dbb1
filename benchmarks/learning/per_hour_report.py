"""The figures and tables of ``benchmarks.learning.per_hour``: each side's held-out loss at the
quarters of the budget, the time it needs to reach the other side's final loss, the step-0 gap of
continued mode, and the markdown tables docs/benchmarks.md keeps.
"""

from __future__ import annotations

from benchmarks.learning.evaluator import time_to_reach, value_at


def summary(sides: dict[str, list[dict]], budget: float) -> dict:
    """Per side: loss and steps at T/2 (linear between snapshots), at T (its last snapshot),
    and the time it needs to reach the other side's final loss (None: not reached; when its
    first snapshot is already below, that snapshot's time, an upper bound)."""
    out = {}
    for side, recs in sides.items():
        other = next((o for o in sides if o != side), None)
        curve = [(r["time_s"], r["loss"]) for r in recs]
        steps = [(r["time_s"], float(r["step"])) for r in recs]
        target = sides[other][-1]["loss"] if other and sides[other] else None
        reach = time_to_reach(curve, target) if target is not None else None
        half_steps = value_at(steps, budget / 2)
        out[side] = {
            "loss_at": {f"{q / 4:g}T": value_at(curve, budget * q / 4) for q in (1, 2, 3)},
            "loss_at_half": value_at(curve, budget / 2),
            "steps_at_half": round(half_steps) if half_steps is not None else None,
            "loss_at_end": recs[-1]["loss"],
            "time_at_end": recs[-1]["time_s"],
            "steps_at_end": recs[-1]["step"],
            "reaches_other_final_s": reach,
            "reach_is_upper_bound": reach is not None and reach == curve[0][0],
        }
    return out


def print_table(result: dict) -> None:
    """A markdown table (the one docs/benchmarks.md keeps) and the crossing times."""
    a = result["args"]
    print(
        "| side | precision | T (s) | loss at T/2 (steps) | loss at T (s, steps) | "
        "time to reach the other's final loss |"
    )
    print("|---|---|---:|---|---|---|")
    for side, s in result["summary"].items():
        half = "-"
        if s["loss_at_half"] is not None:
            half = f"{s['loss_at_half']:.3f} ({s['steps_at_half']})"
        end = f"{s['loss_at_end']:.3f} ({s['time_at_end']:.0f} s, {s['steps_at_end']})"
        reach = s["reaches_other_final_s"]
        bound = "<= " if s["reach_is_upper_bound"] else ""
        reach_txt = f"{bound}{reach:.0f} s" if reach is not None else "not reached"
        if len(result["summary"]) == 1:  # --sides with one side: nothing to compare with
            reach_txt = "-"
        print(f"| {side} | {a['precision']} | {a['budget_s']:.0f} | {half} | {end} | {reach_txt} |")
    print_quarters(result)


def print_quarters(result: dict) -> None:
    """Held-out loss at step 0 (continued mode), T/4, T/2, 3T/4 and T, one row per side."""
    print("\n| side | step 0 | T/4 | T/2 | 3T/4 | T (last snapshot) |")
    print("|---|---:|---:|---:|---:|---:|")
    for side, s in result["summary"].items():
        first = result["sides"][side][0]
        cells = [f"{first['loss']:.3f}" if first["step"] == 0 else "-"]
        cells += [f"{v:.3f}" if v is not None else "-" for v in s["loss_at"].values()]
        cells.append(f"{s['loss_at_end']:.3f}")
        print(f"| {side} | {' | '.join(cells)} |")


def step0_gap(sides: dict[str, list[dict]]) -> float | None:
    """Continued mode: the largest difference between the sides' step-0 held-out losses (both
    load the same folder: 0 up to float noise); None when a side has no step-0 snapshot."""
    first = [recs[0]["loss"] for recs in sides.values() if recs and recs[0]["step"] == 0]
    if len(first) < 2:
        return None
    return max(first) - min(first)
