"""Validate a GPU node and measure every GPU claim of the project in one command (<= 9 minutes).

    python -m benchmarks.gpu_check --out runs/gpu_check          # `make gpu-check`
    python -m benchmarks.gpu_check --out /tmp/gc --dry-run       # the same code on CPU, tiny sizes

Parts, in this order, each in its own process group with its own time box (a part that fails or
runs out of time leaves the others' numbers; the whole run stays inside --budget_s):
  data           shards of CPython's pydoc text at sequence 128, 512, 1024 and 8192, vocabulary
                 padded to 30522
  kernel_tests   the kernel tests on this device (pytest: CUDA tensors and the compiled kernel)
  kernel_sweep   the loss alone on [N_m x V] logits, bf16/fp16: eager, torch.compile, Liger, ours;
                 GB/s, % of the HBM peak, peak memory (benchmarks.kernels.speed --sweep)
  head           decoder + loss at BERT-base/large widths: all-position logits vs masked rows
  train          pretrain/main.py on one GPU, ZeRO-2: BERT-base/large x seq 128/512 x bf16/fp16,
                 tokens/s, sequences/s, TFLOP/s, MFU (vs the dense bf16 peak), peak memory
  modernbert     the same for --arch modernbert --model modernbert-base, bf16, seq 1024 and 8192
                 (shards built at those lengths), and the attention mode/path the run used
  compile        BERT-base seq 128 and modernbert-base seq 1024 again with --compile: tokens/s
                 and MFU beside the eager rows, and the first step's seconds (the compilation)
  hf_baseline    transformers' BertForMaskedLM + DataCollatorForLanguageModeling, bf16 autocast,
                 SDPA, fused AdamW, one process, on the BERT-base seq-128 batch
  resume         resume the BERT-base seq-128 bf16 run from its checkpoint; the losses after it
                 must equal the uninterrupted run's
  phases         a --phases plan (batch ramp at seq 128, then a decay on the seq-512 shards),
                 BERT-base bf16: tokens/s and peak memory per phase, and the doctor's memory
                 estimate for the same launch line (sized by the longest phase) beside the peak
  glue           GLUE fine-tuning throughput (train examples/s) of a BERT-base-shaped model at
                 batch 32, 128 tokens, on a synthetic RTE-like task in GLUE's layout; and the
                 resume run's checkpoint scored by the --downstream_eval glue: job, beside its
                 tokens and GPU-hours
  budget         (not in the default parts: two 10-minute runs; --parts data,budget --budget_s
                 1500) the standard BERT recipe vs recipes/budget.yaml, BERT-base shape, 128
                 tokens, bf16, each ended by the same 10-minute --max_time_hours: tokens, steps,
                 held-out loss at 15% masking, tokens/s and MFU
Writes OUT/gpu_check.json and OUT/gpu_check.md (one table per part, and the targets), OUT/logs/
(one log per part) and each part's own files. Exit status 1 when a part failed or timed out.
--dry-run runs every part on the CPU with a tiny model, tiny shapes and a few steps (CI runs it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.gpu_check.budget import part_budget
from benchmarks.gpu_check.common import (
    DRY_PLAN,
    GPU_DEFAULT_PARTS,
    GPU_PLAN,
    PARTS,
    PartResult,
    Plan,
    part_file,
    run_logged,
    save_part,
    seconds_left,
)
from benchmarks.gpu_check.compiled import part_compile
from benchmarks.gpu_check.glue import part_glue
from benchmarks.gpu_check.modernbert import part_modernbert
from benchmarks.gpu_check.parts import (
    part_data,
    part_head,
    part_kernel_sweep,
    part_kernel_tests,
)
from benchmarks.gpu_check.phases import part_phases
from benchmarks.gpu_check.report import markdown, write_report
from benchmarks.gpu_check.train import part_hf_baseline, part_resume, part_train

PART_FUNCS = {
    "data": part_data,
    "kernel_tests": part_kernel_tests,
    "kernel_sweep": part_kernel_sweep,
    "head": part_head,
    "train": part_train,
    "modernbert": part_modernbert,
    "compile": part_compile,
    "hf_baseline": part_hf_baseline,
    "resume": part_resume,
    "phases": part_phases,
    "glue": part_glue,
    "budget": part_budget,
}


def run_part(name: str, plan: Plan, out: Path, deadline: float) -> int:
    """Body of `--part NAME`: run it, record an exception as the part's error, save the result."""
    res = PartResult(name)
    save_part(out, res)
    t0 = time.perf_counter()
    try:
        PART_FUNCS[name](plan, out, res, deadline)
    except subprocess.TimeoutExpired as exc:
        res.status, res.error = "timed out", f"{' '.join(map(str, exc.cmd))[:200]} ran out of time"
    except Exception as exc:  # noqa: BLE001  (any failure: recorded, the other parts still run)
        detail = getattr(exc, "stderr", None) or ""
        detail = detail.decode(errors="replace") if isinstance(detail, bytes) else detail
        res.status, res.error = "failed", f"{type(exc).__name__}: {exc} {detail[-1500:]}".strip()
    res.seconds = round(time.perf_counter() - t0, 1)
    save_part(out, res)
    return 0 if res.status == "ok" else 1


def plan_timeout(plan: Plan, parts: list[str], i: int, deadline: float) -> float:
    """Part i's time box, shortened so every later part keeps its floor before the deadline."""
    box, _ = plan.boxes[parts[i]]
    later = sum(plan.boxes[p][1] for p in parts[i + 1 :])
    return min(box, seconds_left(deadline) - later)


def run_check(plan: Plan, out: Path, parts: list[str], budget_s: float) -> list[PartResult]:
    """Every part in order, each a child process in its own group, inside one overall budget."""
    deadline = time.time() + budget_s
    results = []
    for i, name in enumerate(parts):
        timeout = plan_timeout(plan, parts, i, deadline)
        if timeout < plan.boxes[name][1]:
            results.append(PartResult(name, "not run", error="the overall --budget_s was spent"))
            print(f"{name:14s} not run (budget spent)", flush=True)
            continue
        cmd = [
            *(sys.executable, "-m", "benchmarks.gpu_check"),
            "--part",
            name,
            "--out",
            str(out),
            "--part_deadline",
            str(time.time() + timeout),
        ] + (["--dry-run"] if plan.dry_run else [])
        part_file(out, name).unlink(missing_ok=True)
        t0 = time.perf_counter()
        try:
            rc = run_logged(cmd, out / "logs" / f"{name}.log", timeout + 10)
        except subprocess.TimeoutExpired:
            rc = None
        res = _load_part(out, name)
        if rc is None:
            res.status, res.error = "timed out", res.error or f"killed after {timeout + 10:.0f} s"
        elif rc != 0 and res.status == "ok":
            res.status = "failed"
        res.seconds = round(time.perf_counter() - t0, 1)
        results.append(res)
        print(f"{name:14s} {res.status:9s} {res.seconds:6.1f} s  {res.error[:150]}", flush=True)
    return results


def _load_part(out: Path, name: str) -> PartResult:
    path = part_file(out, name)
    if not path.is_file():
        return PartResult(name, "failed", error=f"no result written (see logs/{name}.log)")
    return PartResult(**json.loads(path.read_text()))


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m benchmarks.gpu_check` (and `make gpu-check`)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="folder for every result and log")
    p.add_argument(
        "--dry-run",
        "--dry_run",
        dest="dry_run",
        action="store_true",
        help="run every part on the CPU with tiny sizes (what CI runs)",
    )
    p.add_argument(
        "--parts",
        default=None,
        help="comma-separated subset, run in this order (default: every part but budget on a "
        f"GPU, every part in the dry run; all: {','.join(PARTS)})",
    )
    p.add_argument(
        "--budget_s",
        type=float,
        default=540.0,
        help="overall time budget; later parts keep their minimum (default: 540)",
    )
    p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # child: run one part
    p.add_argument("--part_deadline", type=float, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the check (or, with the hidden --part, one part); 0 when every part is ok."""
    p = build_parser()
    args = p.parse_args(argv)
    plan = DRY_PLAN if args.dry_run else GPU_PLAN
    out = args.out.resolve()
    if args.part:
        return run_part(args.part, plan, out, args.part_deadline)
    chosen = args.parts or ",".join(PARTS if args.dry_run else GPU_DEFAULT_PARTS)
    parts = [s.strip() for s in chosen.split(",") if s.strip()]
    unknown = [s for s in parts if s not in PARTS]
    if unknown:
        p.error(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    import torch

    from bertforge.kernels.api import enable_interpreter_without_cuda

    if not args.dry_run and not torch.cuda.is_available():
        p.error(
            "no CUDA device is visible (torch.cuda.is_available() is False); on a CPU "
            "machine run with --dry-run to exercise the check itself"
        )
    enable_interpreter_without_cuda()  # before any child imports triton (CPU dry run only)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = run_check(plan, out, parts, args.budget_s)
    report = write_report(out, plan, results, time.perf_counter() - t0)
    print(markdown(report))
    print(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
