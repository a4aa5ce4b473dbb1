"""The result of the GPU check: environment, targets, OUT/gpu_check.json and .md."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.common import portable
from benchmarks.gpu_check.common import PartResult, Plan, write_json
from bertforge.files import write_bytes_atomic


def environment() -> dict:
    """Device, peaks and package versions of this node."""
    import importlib.metadata as md

    import torch

    from benchmarks.kernels.cuda import hbm_peak_gbps
    from bertforge.pretrain.components.metrics import device_peak_tflops

    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name() if cuda else "CPU (dry run)"
    versions = {}
    for pkg in ("torch", "triton", "deepspeed", "transformers", "liger-kernel", "datasets"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": name,
        "cuda": torch.version.cuda,
        "hbm_peak_GBps": hbm_peak_gbps(name) if cuda else None,
        "dense_bf16_peak_TFLOPs": device_peak_tflops("bf16"),
        "versions": versions,
    }


def _rows(results: dict[str, PartResult], part: str) -> list[dict]:
    res = results.get(part)
    return res.rows if res else []


def kernel_targets(results: dict[str, PartResult]) -> list[dict]:
    """>= 80 % of the HBM peak on the bytes the kernel pair moves; ours faster than each
    baseline."""
    rows = [r for r in _rows(results, "kernel_sweep") if r["status"] == "ok"]
    moved = [r["%HBM moved"] for r in rows if r["variant"] == "ours_kernels_inplace"]
    slower = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        by = {r["variant"]: r["ms"] for r in rows if r["shape"] == shape}
        ours = by.get("ours_softmax_cross_entropy")
        slower += [
            f"{shape} {v}"
            for v in ("torch_eager", "torch_compile", "liger")
            if ours is not None and v in by and by[v] <= ours
        ]
    have = bool(moved) and None not in moved
    return [
        {
            "target": "kernel: >= 80 % of HBM peak on the bytes moved (every sweep shape)",
            "value": f"min {min(moved)} %" if have else None,
            "met": min(moved) >= 80.0 if have else None,
        },
        {
            "target": "kernel: faster than eager, torch.compile and Liger on the same logits",
            "value": "slower on: " + ", ".join(slower) if slower else ("yes" if rows else None),
            "met": (not slower) if rows else None,
        },
    ]


def training_targets(results: dict[str, PartResult]) -> list[dict]:
    """MFU of BERT-large seq 128 bf16 above 55 %; ours >= 1.5x HF's tokens/s; exact resume; the
    doctor's estimate for a phase plan covers the run's peak."""
    large = next(
        (
            r
            for r in _rows(results, "train")
            if r.get("run") == "large-128-bf16" and r["status"] == "ok"
        ),
        None,
    )
    mfu = large and large.get("MFU")
    hf = results.get("hf_baseline")
    ratio = hf.details.get("ours_over_hf_tokens_per_s") if hf else None
    resume = results.get("resume")
    phases = results.get("phases")
    est = phases.details.get("estimate GiB") if phases else None
    peak = phases.details.get("measured peak GiB") if phases else None
    budget = results.get("budget")
    gap = budget.details.get("budget - standard held-out loss") if budget else None
    return [
        {
            "target": "BERT-large seq 128 bf16: MFU above 55 %",
            "value": mfu,
            "met": None if mfu is None else mfu > 0.55,
        },
        {
            "target": "ours >= 1.5x HF tokens/s, BERT-base seq 128",
            "value": ratio,
            "met": None if ratio is None else ratio >= 1.5,
        },
        {
            "target": "save + resume: later losses equal the uninterrupted run's",
            "value": resume.status if resume else None,
            "met": None if not resume or resume.status == "not run" else resume.status == "ok",
        },
        {
            "target": "--phases: the doctor's memory estimate (longest phase) >= the measured peak",
            "value": None if est is None or peak is None else f"{est} vs {peak} GiB",
            "met": None if est is None or peak is None else est >= peak,
        },
        {
            "target": "budget recipe: lower held-out loss than the standard recipe's at one budget",
            "value": gap,
            "met": None if gap is None else gap < 0,
        },
    ]


def compile_targets(results: dict[str, PartResult]) -> list[dict]:
    """Each --compile row beside the eager row of the same name: its tokens/s over eager's (a
    lever of issue 38: faster than eager, the same launch line otherwise)."""
    eager = {r.get("run"): r for p in ("train", "modernbert") for r in _rows(results, p)}
    rows = []
    for r in _rows(results, "compile"):
        base = eager.get(r.get("run"), {})
        ok = r.get("status") == "ok" and base.get("status") == "ok"
        ratio = round(r["tokens/s"] / base["tokens/s"], 2) if ok else None
        rows.append(
            {
                "target": f"--compile faster than eager, {r.get('run')} (tokens/s ratio)",
                "value": ratio,
                "met": None if ratio is None else ratio > 1.0,
            }
        )
    return rows


def markdown(report: dict) -> str:
    """One table of targets, then one table per part."""
    env = report["environment"]
    lines = [
        f"# GPU check: {env['device']}, {env['date']}"
        + (" (DRY RUN, CPU)" if report["dry_run"] else ""),
        "",
        f"HBM peak {env['hbm_peak_GBps']} GB/s, dense bf16 peak "
        f"{env['dense_bf16_peak_TFLOPs']} TFLOP/s, CUDA {env['cuda']}; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        + f"; total {report['total_s']} s",
        "",
    ]
    lines += _table(
        [
            {
                "target": t["target"],
                "value": t["value"],
                "met": {True: "yes", False: "NO", None: "not measured"}[t["met"]],
            }
            for t in report["targets"]
        ]
    )
    for name, part in report["parts"].items():
        lines += ["", f"## {name}: {part['status']} ({part['seconds']} s)"]
        if part["error"]:
            lines += ["", f"Error: {part['error']}"]
        if part["details"]:
            lines += ["", "; ".join(f"{k}: {v}" for k, v in part["details"].items())]
        if part["rows"]:
            lines += [""] + _table(part["rows"])
    return "\n".join(lines) + "\n"


def _table(rows: list[dict]) -> list[str]:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append(
            "| "
            + " | ".join("" if r.get(c) is None else str(r.get(c)).replace("|", "/") for c in cols)
            + " |"
        )
    return out


def write_report(out: Path, plan: Plan, results: list[PartResult], total_s: float) -> dict:
    """OUT/gpu_check.json and OUT/gpu_check.md."""
    by_name = {r.name: r for r in results}
    report = {
        "dry_run": plan.dry_run,
        "environment": environment(),
        "total_s": round(total_s, 1),
        "targets": kernel_targets(by_name) + training_targets(by_name) + compile_targets(by_name),
        "parts": {r.name: asdict(r) for r in results},
    }
    write_json(out / "gpu_check.json", report, out)
    write_bytes_atomic(out / "gpu_check.md", markdown(portable(report, out)).encode())
    return report
