"""The GPU check's phase-plan part: the real trainer under a two-phase ``--phases`` plan (a batch
ramp on the short sequences, then a 1-sqrt decay on the long ones), per-phase throughput and peak
memory, and the doctor's memory estimate for the same launch line beside the measured peak.

The micro-batch stays fixed in a plan, so it is the one that fits the long phase; the ramp and
the target batch are accumulation. The doctor sizes its estimate by the longest phase's sequences.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.gpu_check.common import (
    PartResult,
    Plan,
    engine_flags,
    run_logged,
    seconds_left,
    shards_dir,
)
from bertforge.files import write_json_atomic
from bertforge.pretrain.config import command_line


def phase_plan(plan: Plan, out: Path) -> tuple[dict, int]:
    """(the phase file's document, the micro-batch): warmup with a batch ramp micro -> 2 micro
    on the short shards (--data), then a decay on the long shards, each phase warm-up + measured
    steps long."""
    short, long = plan.seq_lens[0], plan.seq_lens[-1]
    micro = plan.micro_batch[long]
    steps = plan.warmup_steps + plan.measured_steps
    ramp = {"start": micro, "increment": micro, "ramp_tokens": 2 * micro * short}
    doc = {
        "phases": [
            {"name": f"seq{short}", "steps": steps, "lr": "warmup", "batch": ramp},
            {
                "name": f"seq{long}",
                "steps": steps,
                "lr": "1-sqrt",
                "data": str(shards_dir(out, long)),
            },
        ]
    }
    return doc, micro


def launch_flags(plan: Plan, out: Path, run_dir: Path, plan_file: Path, micro: int) -> dict:
    """The trainer's flags (the doctor takes the same ones)."""
    return {
        **engine_flags(plan, "bf16"),
        "data": shards_dir(out, plan.seq_lens[0]),
        "model": plan.train_matrix[0][0] if plan.dry_run else "base",
        "output_dir": run_dir,
        "phases": plan_file,
        "global_batch_size": 2 * micro,
        "micro_batch_size": micro,
        "lr": "1e-4",
        "save_interval": 0,
        "save_final": False,
        "progress": False,
        "eval_interval": 0,
        "eval_batches": 1,
        "num_workers": 2,
    }


def phase_rows(run_dir: Path, plan: Plan) -> list[dict]:
    """Per phase, over its steps after the first ``warmup_steps``: tokens/s, global batch, peak
    memory."""
    from bertforge.pretrain.components.metrics import read_metrics

    recs = read_metrics(run_dir / "metrics.jsonl")
    rows = []
    for name in dict.fromkeys(r["phase"] for r in recs):
        every = [r for r in recs if r["phase"] == name]
        mine = every[plan.warmup_steps :]
        secs = sum(r["step_time_s"] for r in mine)
        mem = [r.get("mem_peak_gib", r.get("mem_rss_gib")) for r in mine]
        rows.append(
            {
                "phase": name,
                "steps": len(mine),
                "global batch": f"{every[0]['samples']} -> {every[-1]['samples']}",
                "tokens/s": round(sum(r["tokens"] for r in mine) / secs) if secs else None,
                "peak mem GiB": None if None in mem or not mem else round(max(mem), 2),
                "loss": round(mine[-1]["loss"], 4) if mine else None,
            }
        )
    return rows


def doctor_estimate(flags: dict, out: Path, timeout: float) -> tuple[str, float | None]:
    """(the doctor's phases and memory rows for the launch line, its per-rank estimate in GiB)."""
    argv = command_line.trainer(**flags)[2:]  # the flags after `python pretrain/main.py`
    cmd = [sys.executable, "-m", "bertforge.pretrain.doctor", *argv, "--json"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    log = out / "logs" / "phases.doctor.log"
    log.write_text(f"$ {' '.join(cmd)}\n{done.stdout}\n{done.stderr}", encoding="utf-8")
    try:
        rows = json.loads(done.stdout)
    except json.JSONDecodeError:
        return f"no report (exit {done.returncode}, logs/phases.doctor.log)", None
    wanted = [r for r in rows if r["check"] in ("phases", "memory")]
    text = " | ".join(f"{r['check']}: {r['status']} {r['detail']}" for r in wanted)
    memory = next((r["detail"] for r in wanted if r["check"] == "memory"), "")
    found = re.match(r"~([\d.]+) GiB", memory)
    return text, float(found.group(1)) if found else None


def part_phases(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """One run under the plan; its per-phase rows and the doctor's estimate beside its peak."""
    run_dir, folder = out / "phases" / "run", out / "phases"
    folder.mkdir(parents=True, exist_ok=True)
    doc, micro = phase_plan(plan, out)
    plan_file = folder / "plan.json"
    write_json_atomic(plan_file, doc, indent=2)
    flags = launch_flags(plan, out, run_dir, plan_file, micro)
    cmd = command_line.trainer(**flags)
    if plan.dry_run:  # CPUs without bf16 train in fp32; the code path is the same
        cmd.append("--allow_precision_fallback")
    rc = run_logged(cmd, out / "logs" / "phases.train.log", max(10.0, seconds_left(deadline) - 20))
    if rc != 0:
        res.status, res.error = "failed", f"trainer exit {rc} (logs/phases.train.log)"
        return
    res.rows = phase_rows(run_dir, plan)
    text, estimate = doctor_estimate(flags, out, max(5.0, seconds_left(deadline) - 2))
    peaks = [r["peak mem GiB"] for r in res.rows if r["peak mem GiB"] is not None]
    res.details = {
        "plan": " -> ".join(p["name"] for p in doc["phases"]) + f", micro batch {micro}",
        "doctor": text or "no report",
        "estimate GiB": estimate,
        "measured peak GiB": max(peaks) if peaks else None,
    }
    res.status = "ok"
