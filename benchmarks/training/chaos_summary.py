"""The verdict of a chaos run (benchmarks.training.chaos): the killed run checked against the
uninterrupted one (losses, final history, weights, leftovers), each kill's cost (steps redone,
seconds lost), ``OUT/chaos_summary.json`` and its console report.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.training.chaos_job import leftovers, same_weights
from bertforge.pretrain.distributed import op_builds

if TYPE_CHECKING:
    from benchmarks.training.chaos import Launch, Settings

UNSURVIVED = ("hung", "unreachable", "missed", "ended_first")  # what makes a kill not count


def summarize(
    s: Settings,
    out: Path,
    ref: dict,
    ref_wall: float,
    step_s: float,
    launches: list[Launch],
    chaos_wall: float,
    pending: list[tuple[str, str]],
) -> dict:
    """The verdict and figures of a chaos run (``reference_run``'s ``ref``, the killed run's
    launches, the kinds never planned), also written as ``OUT/chaos_summary.json``."""
    problems, mismatched = check_against_reference(s, out, ref, launches)
    kills, kill_problems = cost_kills(launches, step_s)
    problems += kill_problems
    if launches and launches[-1].exit_code != 0:
        problems.append(f"the last launch exited {launches[-1].exit_code}")
    survived = [k for k in kills if not any(x in k for x in UNSURVIVED)]
    if pending or len(survived) < s.kills:
        problems.append(f"{len(survived)} of {s.kills} kills survived")
    by_kind: dict[str, int] = {}
    for k in survived:
        name = f"{k['moment']}/{k['signal']}"
        by_kind[name] = by_kind.get(name, 0) + 1
    summary = {
        "passed": not problems,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} CPU cores",
        "problems": problems,
        "settings": asdict(s),
        "command": launches[0].cmd if launches else None,
        "resume_command": launches[1].cmd if len(launches) > 1 else None,
        "kills_planned": s.kills,
        "kills_survived": len(survived),
        "survived_by_kind": dict(sorted(by_kind.items())),
        "steps_redone": sum(k["steps_redone"] for k in kills),
        "lost_s_per_kill_mean": round(sum(k["lost_s"] for k in kills) / max(1, len(kills)), 2),
        "reference_wall_s": round(ref_wall, 1),
        "reference_step_s": round(step_s, 3),
        "chaos_wall_s": round(chaos_wall, 1),
        "launches": len(launches),
        "kills": kills,
        "mismatched_losses": mismatched[:20],
        "run": "chaos",
        "reference": "reference",
        "logs": [f"chaos_logs/{la.log}" for la in launches],
        "launch_details": [
            {k: getattr(la, k) for k in ("index", "resume_expected", "resumed_at", "reached")}
            | {"exit_code": la.exit_code, "startup_s": la.startup_s, "exit_s": la.exit_s}
            for la in launches
        ],
    }
    (out / "chaos_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def check_against_reference(
    s: Settings, out: Path, ref: dict, launches: list[Launch]
) -> tuple[list[str], list[dict]]:
    """What the killed run got wrong against the uninterrupted one (a failed reference, logged
    losses that differ, a final history or weights that differ, leftovers): the problems and the
    mismatched loss records."""
    run, ref_run = out / "chaos", out / "reference"
    problems: list[str] = []
    ref_steps = sorted(step for split, step in ref["losses"] if split == "train")
    if ref["launch"].exit_code != 0 or ref_steps != list(range(1, s.steps + 1)):
        problems.append(f"the uninterrupted run failed (exit {ref['launch'].exit_code})")
    mismatched = []
    for launch in launches:
        for r in launch.records:
            want = ref["losses"].get((r["split"], r["step"]))
            if want is None or r["loss"] != want:
                mismatched.append({"launch": launch.index, **r, "reference": want})
    if mismatched:
        problems.append(f"{len(mismatched)} logged losses differ from the reference")
    from bertforge.pretrain.components.metrics import read_metrics

    final = [r["step"] for r in read_metrics(run / "metrics.jsonl")] if launches else []
    if final != list(range(1, s.steps + 1)):
        problems.append(f"the final history's steps are not 1..{s.steps} once each")
    diff = same_weights(run, ref_run, s.steps)
    if diff:
        problems.append(f"final weights differ: {diff[:5]}")
    ports = [ref["launch"].port] + [la.port for la in launches]
    left = leftovers(run, ports) + leftovers(ref_run, [])
    for folder in sorted((out / "op_builds").glob("*")):  # the op_build kills' build folders
        left += [str(lock.path.relative_to(out)) for lock in op_builds.find_locks(folder)]
    problems += [f"left behind: {x}" for x in left]
    return problems, mismatched


def cost_kills(launches: list[Launch], step_s: float) -> tuple[list[dict], list[str]]:
    """Each kill's record (what it hit, where the next launch resumed, the time it cost) and the
    problems of the launches: a resume from the wrong checkpoint, a hang, a kill not survived."""
    kills: list[dict] = []
    problems: list[str] = []
    for i, la in enumerate(launches):
        if la.index > 0 and la.resumed_at not in (None, la.resume_expected):
            problems.append(
                f"launch {la.index} resumed at {la.resumed_at}, "
                f"the newest verified checkpoint was {la.resume_expected}"
            )
        if la.kill is None:
            continue
        if "moment" not in la.kill:  # a launch with no kill planned that did not end
            problems.append(f"launch {la.index}: {la.kill['hung']}")
            continue
        nxt = launches[i + 1] if i + 1 < len(launches) else None
        for key in UNSURVIVED:
            if key in la.kill:
                problems.append(f"kill {len(kills) + 1} ({la.kill['moment']}): {la.kill[key]}")
        kills.append(kill_cost(la, nxt, step_s))
    return kills, problems


def kill_cost(la: Launch, nxt: Launch | None, step_s: float) -> dict:
    """One kill's record: the kill, where the next launch (None: none) resumed, what it cost."""
    redone = la.reached - nxt.resume_expected if nxt else 0
    # Lost: the wait for the job to end, the next start-up (up to its kill when it was
    # killed in start-up) and the steps redone.
    started = (nxt.startup_s or (nxt.kill or {}).get("delay_s") or 0) if nxt else 0
    relaunch = (la.exit_s or 0) + started
    return {
        **{k: v for k, v in la.kill.items() if k != "faults"},
        "planned_fault": la.kill.get("faults"),
        "launch": la.index,
        "reached_step": la.reached,
        "exit_code": la.exit_code,
        "resumed_at": nxt.resume_expected if nxt else None,
        "next_cleared_build_lock": nxt.cleared_build_lock if nxt else False,
        "steps_redone": redone,
        "exit_s": la.exit_s,
        "relaunch_s": round(relaunch, 2),
        "lost_s": round(relaunch + redone * step_s, 2),
    }


def report(summary: dict) -> str:
    """The summary as a few console lines."""
    lines = [
        f"chaos: {'PASS' if summary['passed'] else 'FAIL'}: {summary['kills_survived']} of "
        f"{summary['kills_planned']} kills survived in {summary['launches']} launches",
        "  by kind: " + ", ".join(f"{k} {n}" for k, n in summary["survived_by_kind"].items()),
        f"  steps redone {summary['steps_redone']}; lost per kill "
        f"{summary['lost_s_per_kill_mean']} s (relaunch + redone steps)",
        f"  wall time {summary['chaos_wall_s']} s vs {summary['reference_wall_s']} s uninterrupted",
    ]
    for k in summary["kills"]:
        lines.append(
            f"  kill {k['launch'] + 1}: {k['moment']}/{k['signal']} rank {k['rank']} "
            f"{k.get('planned_fault') or ''} reached {k['reached_step']} exit {k['exit_code']} "
            f"-> resumed {k['resumed_at']}, redone {k['steps_redone']}, lost {k['lost_s']} s"
            + (
                " (the next launch removed the stale build lock)"
                if k["next_cleared_build_lock"]
                else ""
            )
        )
    lines += [f"  problem: {p}" for p in summary["problems"]]
    return "\n".join(lines)
