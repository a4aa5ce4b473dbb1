"""What every part of the GPU check shares: the plans (GPU and dry run), a part's
result record, its atomic JSON file, and the time-boxed subprocess runner.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, precision_flags, write_results

PARTS = (
    "data",
    "kernel_tests",
    "kernel_sweep",
    "head",
    "train",
    "modernbert",
    "compile",
    "hf_baseline",
    "resume",
    "phases",
    "glue",
    "budget",
)
# `make gpu-check` on a GPU: every part but the budget part, whose two 10-minute runs would not
# fit the check's 9 minutes (run it with --parts data,budget --budget_s 1500)
GPU_DEFAULT_PARTS = tuple(p for p in PARTS if p != "budget")


VOCAB = 30522  # BERT's WordPiece vocabulary: the decoder size every throughput number assumes


@dataclass(frozen=True)
class Plan:
    """Sizes of one gpu_check run: the GPU plan, or the dry-run plan (CPU, tiny)."""

    dry_run: bool
    seq_lens: tuple[int, ...]
    train_matrix: tuple[tuple[str, int, str], ...]  # (model preset, seq, precision), in order
    modernbert: tuple[tuple[str, int, str], ...]  # the --arch modernbert runs, same layout
    compiled: tuple[tuple[str, int, str], ...]  # train / modernbert runs repeated with --compile
    micro_batch: dict  # seq -> sequences per step (one GPU, no accumulation)
    warmup_steps: int  # steps left out of every throughput number
    measured_steps: int  # steps measured after the warm-up
    resume_steps: int  # steps after the checkpoint, compared between the two runs
    resume_config: tuple[str, int, str]  # the train run the resume part continues
    hf_config: tuple[str, int]  # (preset, seq) of the HF baseline, compared with ours
    boxes: dict  # part -> (time box s, floor s kept free for it while earlier parts run)
    kernel_test_args: tuple[str, ...]
    bench_args: tuple[str, ...]  # extra flags for kernels.speed (dry run: tiny shapes)
    head_widths: tuple[int, ...]
    ds_configs: dict  # precision -> the shipped DeepSpeed config it trains with
    vocab: int | None  # pad the trained vocabulary to this size (None: as trained)
    glue_model: str  # preset whose shape the glue part fine-tunes (random init)
    glue_examples: int  # train examples of each synthetic GLUE-layout task
    glue_dev: int  # dev examples of each
    glue_max_examples: int  # the glue job's --max_examples on the train part's checkpoint
    budget_arm_s: float  # the budget part: wall-clock budget of each of its two runs


GPU_PLAN = Plan(
    dry_run=False,
    seq_lens=(128, 512),
    train_matrix=tuple(
        (m, s, p)
        for p in ("bf16", "fp16")
        for m, s in (("large", 128), ("base", 128), ("base", 512), ("large", 512))
    ),
    modernbert=(("modernbert-base", 1024, "bf16"), ("modernbert-base", 8192, "bf16")),
    compiled=(("base", 128, "bf16"), ("modernbert-base", 1024, "bf16")),
    micro_batch={128: 128, 512: 32, 1024: 16, 8192: 2},
    warmup_steps=5,
    measured_steps=40,
    resume_steps=5,
    resume_config=("base", 128, "bf16"),
    hf_config=("base", 128),
    boxes={
        "data": (90, 10),
        "kernel_tests": (90, 30),
        "kernel_sweep": (100, 30),
        "head": (40, 20),
        "train": (270, 60),
        "modernbert": (100, 40),
        "compile": (200, 60),
        "hf_baseline": (50, 30),
        "resume": (45, 30),
        "phases": (60, 30),
        "glue": (90, 30),
        "budget": (2 * 600 + 180, 60),
    },
    kernel_test_args=(
        "tests/kernels/test_masked_lm_loss.py",
        "tests/kernels/test_softmax_ce.py",
        "tests/kernels/test_compile.py",
    ),
    bench_args=(),
    head_widths=(768, 1024),
    ds_configs={"bf16": "ds_configs/zero2_bf16.json", "fp16": "ds_configs/zero2.json"},
    vocab=VOCAB,
    glue_model="base",
    glue_examples=2048,  # 3 epochs at batch 32: 192 steps, the model's build amortised
    glue_dev=256,
    glue_max_examples=512,
    budget_arm_s=600.0,  # the 10 minutes
)


DRY_PLAN = Plan(
    dry_run=True,
    seq_lens=(64, 128),  # 128: the phase part's long phase
    train_matrix=(("tiny", 64, "bf16"),),
    modernbert=(("modernbert-tiny", 128, "bf16"),),  # one launch: the real plan's two lengths
    # none: a cold inductor compilation takes 60-90 s of CI's 2 cores; the trainer's --compile
    # runs in tests/e2e/test_rtd_training.py (d), the report's rows in tests/benchmarks
    compiled=(),
    # take the same path (CI's time)
    micro_batch={64: 8, 128: 4},
    # the fewest steps that still leave each number its meaning (CI's time): one warm-up step
    # kept out of the rates, two measured, two compared after the resume; a phase of 3 steps
    # still ramps its batch 4 -> 8
    warmup_steps=1,
    measured_steps=2,
    resume_steps=2,
    resume_config=("tiny", 64, "bf16"),
    hf_config=("tiny", 64),
    boxes={
        "data": (60, 10),
        "kernel_tests": (60, 20),
        "kernel_sweep": (60, 20),
        "head": (60, 20),
        "train": (90, 30),
        "modernbert": (90, 30),
        "compile": (10, 5),
        "hf_baseline": (60, 20),
        "resume": (60, 20),
        "phases": (120, 20),  # a trainer launch and a doctor: 60 s was short on CI's 2 cores
        "glue": (90, 30),
        "budget": (90, 30),
    },
    kernel_test_args=("tests/kernels/test_masked_lm_loss.py", "-k", "one_valid_row or auto_picks"),
    bench_args=(
        "--batch",
        "2",
        "--seq",
        "16",
        "--hidden",
        "16",
        "--vocab",
        "301",
        "--repeat",
        "1",
        "--no-compile",
        "--sweep_rows",
        "5",
        "--sweep_vocabs",
        "64,72/70",
    ),
    head_widths=(16,),
    ds_configs={"bf16": "ds_configs/cpu.json", "fp16": "ds_configs/cpu.json"},
    vocab=None,
    glue_model="tiny",
    glue_examples=32,  # one batch of 32 an epoch: 3 steps
    glue_dev=8,
    glue_max_examples=16,
    budget_arm_s=12.0,  # start-up (~8 s) and a few steps
)


@dataclass
class PartResult:
    """What one part wrote: status, rows of its table, and free-form details."""

    name: str
    status: str = "not run"  # ok | failed | timed out | not run
    seconds: float = 0.0
    rows: list[dict] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    error: str = ""


def write_json(path: Path, obj: Any, out: Path) -> None:
    """Atomic JSON write, paths relative to the repository or written ``$OUT/...`` (`out`: the
    check's output folder), so a report copied off the node names no path of the node."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_results(path, obj, run=out, indent=2)


def part_file(out: Path, name: str) -> Path:
    return out / "parts" / f"{name}.json"


def save_part(out: Path, result: PartResult) -> None:
    """Written after every row, so a part killed by its time box still leaves what it measured."""
    write_json(part_file(out, result.name), asdict(result), out)


def run_logged(
    cmd: list[str], log: Path, timeout: float, env: dict | None = None, cwd: Path = REPO
) -> int:
    """Run cmd in its own process group with output to `log`; on timeout kill the whole group."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        f.write(f"\n$ {' '.join(cmd)}\n".encode())
        f.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise


def seconds_left(deadline: float) -> float:
    return deadline - time.time()


def all_seq_lens(plan: Plan) -> tuple[int, ...]:
    """Every sequence length the plan trains at (the data part builds shards for each)."""
    return tuple(sorted({*plan.seq_lens, *(seq for _, seq, _ in plan.modernbert)}))


def shards_dir(out: Path, seq: int) -> Path:
    return out / "data" / f"shards_{seq}"


def run_name(model: str, seq: int, precision: str) -> str:
    return f"{model}-{seq}-{precision}"


def engine_flags(plan: Plan, precision: str) -> dict[str, Any]:
    """--ds_config for ``precision``, and --precision only where that JSON enables none (the
    GPU configs carry theirs; a setting is given in one place, pretrain.config.one_home)."""
    return precision_flags(REPO / plan.ds_configs[precision], precision)
