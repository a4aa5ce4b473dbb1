"""Validate a GPU node and measure every GPU claim of the project in one command (<= 8 minutes).

    python benchmarks/gpu_check.py --out runs/gpu_check          # `make gpu-check`
    python benchmarks/gpu_check.py --out /tmp/gc --dry-run       # the same code on CPU, tiny sizes

Parts, in this order, each in its own process group with its own time box (a part that fails or
runs out of time leaves the others' numbers; the whole run stays inside --budget_s):
  data           shards of CPython's pydoc text at sequence 128 and 512, vocabulary padded to 30522
  kernel_tests   the kernel tests on this device (pytest: CUDA tensors and the compiled kernel)
  kernel_sweep   the loss alone on [N_m x V] logits, bf16/fp16: eager, torch.compile, Liger, ours;
                 GB/s, % of the HBM peak, peak memory (benchmarks/bench_kernels.py --sweep)
  head           decoder + loss at BERT-base/large widths: all-position logits vs masked rows
  train          pretrain/main.py on one GPU, ZeRO-2: BERT-base/large x seq 128/512 x bf16/fp16,
                 tokens/s, sequences/s, TFLOP/s, MFU (vs the dense bf16 peak), peak memory
  hf_baseline    transformers' BertForMaskedLM + DataCollatorForLanguageModeling, bf16 autocast,
                 SDPA, fused AdamW, one process, on the BERT-base seq-128 batch
  resume         resume the BERT-base seq-128 bf16 run from its checkpoint; the losses after it
                 must equal the uninterrupted run's
Writes OUT/gpu_check.json and OUT/gpu_check.md (one table per part, and the targets), OUT/logs/
(one log per part) and each part's own files. Exit status 1 when a part failed or timed out.
--dry-run runs every part on the CPU with a tiny model, tiny shapes and a few steps (CI runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(REPO))

from data_prep.layout import write_bytes_atomic

PARTS = ("data", "kernel_tests", "kernel_sweep", "head", "train", "hf_baseline", "resume")
VOCAB = 30522  # BERT's WordPiece vocabulary: the decoder size every throughput number assumes


@dataclass(frozen=True)
class Plan:
    """Sizes of one gpu_check run: the GPU plan, or the dry-run plan (CPU, tiny)."""

    dry_run: bool
    seq_lens: tuple[int, ...]
    train_matrix: tuple[tuple[str, int, str], ...]  # (model preset, seq, precision), in order
    micro_batch: dict  # seq -> sequences per step (one GPU, no accumulation)
    warmup_steps: int  # steps left out of every throughput number
    measured_steps: int  # steps measured after the warm-up
    resume_steps: int  # steps after the checkpoint, compared between the two runs
    resume_config: tuple[str, int, str]  # the train run the resume part continues
    hf_config: tuple[str, int]  # (preset, seq) of the HF baseline, compared with ours
    boxes: dict  # part -> (time box s, floor s kept free for it while earlier parts run)
    kernel_test_args: tuple[str, ...]
    bench_args: tuple[str, ...]  # extra flags for bench_kernels (dry run: tiny shapes)
    head_widths: tuple[int, ...]
    ds_configs: dict  # precision -> the shipped DeepSpeed config it trains with
    vocab: int | None  # pad the trained vocabulary to this size (None: as trained)


GPU_PLAN = Plan(
    dry_run=False,
    seq_lens=(128, 512),
    train_matrix=tuple(
        (m, s, p)
        for p in ("bf16", "fp16")
        for m, s in (("large", 128), ("base", 128), ("base", 512), ("large", 512))
    ),
    micro_batch={128: 128, 512: 32},
    warmup_steps=5,
    measured_steps=40,
    resume_steps=5,
    resume_config=("base", 128, "bf16"),
    hf_config=("base", 128),
    boxes={
        "data": (60, 10),
        "kernel_tests": (90, 30),
        "kernel_sweep": (100, 30),
        "head": (40, 20),
        "train": (270, 60),
        "hf_baseline": (50, 30),
        "resume": (45, 30),
    },
    kernel_test_args=(
        "tests/test_kernels.py",
        "tests/test_kernels_ce.py",
        "tests/test_kernels_compile.py",
    ),
    bench_args=(),
    head_widths=(768, 1024),
    ds_configs={"bf16": "ds_configs/zero2_bf16.json", "fp16": "ds_configs/zero2.json"},
    vocab=VOCAB,
)

DRY_PLAN = Plan(
    dry_run=True,
    seq_lens=(64,),
    train_matrix=(("tiny", 64, "bf16"),),
    micro_batch={64: 8},
    warmup_steps=2,
    measured_steps=3,
    resume_steps=2,
    resume_config=("tiny", 64, "bf16"),
    hf_config=("tiny", 64),
    boxes={
        "data": (60, 10),
        "kernel_tests": (60, 20),
        "kernel_sweep": (60, 20),
        "head": (60, 20),
        "train": (90, 30),
        "hf_baseline": (60, 20),
        "resume": (60, 20),
    },
    kernel_test_args=("tests/test_kernels.py", "-k", "one_valid_row or auto_picks"),
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


def write_json(path: Path, obj: Any) -> None:
    """Atomic JSON write (the lead's write_json_atomic can replace this one call)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, json.dumps(obj, indent=2, default=str).encode())


def part_file(out: Path, name: str) -> Path:
    return out / "parts" / f"{name}.json"


def save_part(out: Path, result: PartResult) -> None:
    """Written after every row, so a part killed by its time box still leaves what it measured."""
    write_json(part_file(out, result.name), asdict(result))


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


# ---------------------------------------------------------------- data
def shards_dir(out: Path, seq: int) -> Path:
    return out / "data" / f"shards_{seq}"


def padded_vocab_file(tokenizer_json: Path, size: int, dest: Path) -> Path:
    """BERT-style vocab.txt: the trained WordPiece entries, then [unusedN] up to `size` entries."""
    vocab = json.loads(tokenizer_json.read_text(encoding="utf-8"))["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    tokens += [f"[unused{i}]" for i in range(size - len(tokens))]
    dest.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return dest


def part_data(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """Shards of the pydoc corpus for every sequence length of the plan (the same builder and
    corpus as benchmarks/bench_trainer.py); the vocabulary padded to BERT's size on a GPU."""
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import write_english_corpus

    from benchmarks.bench_trainer import build_shards

    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    corpus = write_english_corpus(data / "pydoc_topics.txt")
    tokenizer = None
    if plan.vocab:  # a 460 KB corpus trains ~4k entries; the head must be BERT's 30522 wide
        probe = build_shards([corpus], data / "vocab_probe", plan.vocab, plan.seq_lens[0])
        tokenizer = str(
            padded_vocab_file(
                probe / "tokenizer" / "tokenizer.json", plan.vocab, data / "vocab.txt"
            )
        )
    for seq in plan.seq_lens:
        shards = build_shards([corpus], shards_dir(out, seq), plan.vocab or 30522, seq, tokenizer)
        manifest = json.loads((shards / "manifest.json").read_text())
        res.rows.append(
            {
                "shards": str(shards),
                "seq": seq,
                "vocab": manifest["tokenizer"]["vocab_size"],
                "sequences": manifest["splits"]["train"]["sequences"],
                "tokens": manifest["splits"]["train"]["tokens"],
            }
        )
        save_part(out, res)
    res.details.update(prebuild_fused_adam())
    res.status = "ok"


def prebuild_fused_adam() -> dict:
    """On a GPU: compile DeepSpeed's fused Adam now (JIT, needs nvcc, ~1 min the first time on a
    node, then cached in ~/.cache/torch_extensions), so that no train run spends its time box on
    it. A failure is reported here and shows again in the train part's logs."""
    import torch

    if not torch.cuda.is_available():
        return {"fused_adam": "not needed (CPU: torch AdamW)"}
    t0 = time.perf_counter()
    try:
        from deepspeed.ops.op_builder import FusedAdamBuilder

        FusedAdamBuilder().load()
    except Exception as exc:  # noqa: BLE001  (no nvcc, no ninja...: say so, the rest still runs)
        return {"fused_adam": f"build failed: {type(exc).__name__}: {str(exc)[:300]}"}
    return {"fused_adam": f"ready ({time.perf_counter() - t0:.1f} s)"}


# ---------------------------------------------------------------- kernels
def part_kernel_tests(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """pytest of the kernel tests; conftest puts them on CUDA here when a GPU is visible."""
    import xml.etree.ElementTree as ET

    xml = out / "kernel_tests" / "junit.xml"
    rc = run_logged(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={xml}",
            *plan.kernel_test_args,
        ],
        out / "logs" / "kernel_tests.pytest.log",
        seconds_left(deadline) - 2,
    )
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{c.get('classname')}::{c.get('name')}"
        for c in suite.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ]
    res.rows.append(
        {
            **counts,
            "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "seconds": round(float(suite.get("time", 0)), 1),
        }
    )
    res.details["failed_tests"] = failed[:20]
    res.status = "ok" if rc == 0 and counts["tests"] > 0 else "failed"
    if res.status != "ok":
        res.error = f"pytest exit {rc}; failed: {', '.join(failed[:5]) or 'see the log'}"


def run_bench(plan: Plan, out: Path, name: str, flags: list[str], deadline: float) -> dict:
    """benchmarks/bench_kernels.py with `flags` into OUT/NAME; its report (rc in report["rc"])."""
    folder = out / name
    rc = run_logged(
        [
            sys.executable,
            str(REPO / "benchmarks" / "bench_kernels.py"),
            *flags,
            *plan.bench_args,
            "--out",
            str(folder),
        ],
        out / "logs" / f"{name}.bench.log",
        seconds_left(deadline) - 2,
    )
    report = json.loads((folder / "bench_kernels.json").read_text())
    report["rc"] = rc
    return report


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def part_kernel_sweep(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """The loss alone over the sweep grid: one row per (shape, variant)."""
    report = run_bench(plan, out, "kernel_sweep", ["--no-head", "--sweep"], deadline)
    res.details["hbm_peak_GBps"] = report["hbm_peak_GBps"]
    for r in report["results"]:
        shape, _, variant = r["name"].rpartition("/")
        e = r["extra"]
        res.rows.append(
            {
                "shape": shape.removeprefix("loss_only"),
                "variant": variant,
                "status": r["status"],
                "ms": _ms(r["time_ms"]),
                "GB/s": e.get("GBps_min_bytes"),
                "%HBM": _pct(e.get("frac_hbm_min_bytes")),
                "GB/s moved": e.get("GBps_moved"),
                "%HBM moved": _pct(e.get("frac_hbm_moved")),
                "peak MB": _ms(r["peak_mb"]),
                "note": r["note"],
            }
        )
    res.status = "ok" if report["rc"] == 0 else "failed"
    res.error = "" if report["rc"] == 0 else f"failed: {', '.join(report['failed_ours'])}"


def _pct(frac: float | None) -> float | None:
    return None if frac is None else round(100 * frac, 1)


def part_head(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """Decoder + loss at each width (BERT-base 768, BERT-large 1024): all positions vs masked rows.
    torch.compile is left to the sweep part (it would spend this part's time compiling)."""
    failed = []
    for width in plan.head_widths:
        report = run_bench(
            plan, out, f"head_{width}", ["--hidden", str(width), "--no-compile"], deadline
        )
        failed += report["failed_ours"]
        for r in report["results"]:
            e = r["extra"]
            res.rows.append(
                {
                    "H": width,
                    "positions": report["n_positions"],
                    "masked": report["n_masked"],
                    "variant": r["name"],
                    "status": r["status"],
                    "ms": _ms(r["time_ms"]),
                    "peak MB": _ms(r["peak_mb"]),
                    "speedup vs HF": e.get("speedup_vs_hf"),
                    "memory vs HF": e.get("memory_ratio_vs_hf"),
                    "note": r["note"],
                }
            )
        save_part(out, res)
    res.status = "failed" if failed else "ok"
    res.error = f"failed: {', '.join(failed)}" if failed else ""


# ---------------------------------------------------------------- training throughput
def run_name(model: str, seq: int, precision: str) -> str:
    return f"{model}-{seq}-{precision}"


def train_steps(plan: Plan, config: tuple[str, int, str]) -> tuple[int, int]:
    """(max_steps, save_interval): the resume part's run also saves after the measured steps."""
    measured = plan.warmup_steps + plan.measured_steps
    if config == plan.resume_config:
        return measured + plan.resume_steps, measured
    return measured, 0


def trainer_cmd(
    plan: Plan, out: Path, run_dir: Path, config: tuple[str, int, str], resume: bool = False
) -> list[str]:
    """The real trainer, one process (one GPU), ZeRO-2, no gradient accumulation."""
    model, seq, precision = config
    max_steps, save_interval = train_steps(plan, config)
    micro = str(plan.micro_batch[seq])
    cmd = [
        sys.executable,
        str(REPO / "pretrain" / "main.py"),
        "--ds_config",
        str(REPO / plan.ds_configs[precision]),
        "--precision",
        precision,
        "--data",
        str(shards_dir(out, seq)),
        "--model",
        model,
        "--output_dir",
        str(run_dir),
        "--max_steps",
        str(max_steps),
        "--global_batch_size",
        micro,
        "--micro_batch_size",
        micro,
        "--lr",
        "1e-4",
        "--warmup_steps",
        str(plan.warmup_steps),
        "--save_interval",
        str(save_interval),
        "--keep_last",
        "2",
        "--save_final",
        "false",
        "--progress",
        "false",
        "--eval_interval",
        "0",
        "--eval_batches",
        "1",
        "--num_workers",
        "2",
    ]
    if plan.dry_run:  # CPUs without bf16 train in fp32; the code path is the same
        cmd.append("--allow_precision_fallback")
    if resume:
        cmd += ["--resume", "auto"]
    return cmd


def train_records(run_dir: Path) -> list[dict]:
    """The training records of metrics.jsonl (one per optimizer step)."""
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [r for r in recs if r.get("split", "train") == "train"]


def throughput_row(plan: Plan, run_dir: Path, config: tuple[str, int, str]) -> dict:
    """Rates over the measured steps (after the warm-up): sums of tokens / sums of step times."""
    from pretrain.metrics import device_peak_tflops

    model, seq, _ = config
    first, last = plan.warmup_steps + 1, plan.warmup_steps + plan.measured_steps
    recs = [r for r in train_records(run_dir) if first <= r["step"] <= last]
    if len(recs) < plan.measured_steps:
        raise RuntimeError(f"{run_dir}/metrics.jsonl has {len(recs)} of steps {first}..{last}")
    secs = sum(r["step_time_s"] for r in recs)
    tflops = sum(r.get("tflops", 0.0) * r["step_time_s"] for r in recs) / secs
    peak = device_peak_tflops("bf16")  # MFU against the dense bf16 peak, for fp16 runs too
    mem = [r.get("mem_peak_gib", r.get("mem_rss_gib")) for r in recs]
    resolved = json.loads((run_dir / "config.json").read_text()).get("precision_resolved")
    return {
        "run": run_name(*config),
        "model": model,
        "seq": seq,
        "precision": resolved,
        "micro_batch": plan.micro_batch[seq],
        "steps": len(recs),
        "tokens/s": round(sum(r["tokens"] for r in recs) / secs),
        "seq/s": round(sum(r["samples"] for r in recs) / secs, 1),
        "TFLOP/s": round(tflops, 2),
        "MFU": None if not peak else round(tflops / peak, 3),
        "peak mem GiB": None if None in mem else round(max(mem), 2),
        "skipped steps": sum(bool(r.get("skipped")) for r in recs),
        "loss": round(recs[-1]["loss"], 4),
    }


def part_train(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """Each configuration of the matrix in turn; a run that fails or runs out of time is a row
    that says so, and the next one still runs while time is left."""
    failed = []
    per_run = plan.boxes["train"][0] / 2  # no single run may eat the whole part
    for config in plan.train_matrix:
        name = run_name(*config)
        run_dir = out / "train" / name
        shutil.rmtree(run_dir, ignore_errors=True)
        timeout = min(per_run, seconds_left(deadline) - 2)
        if timeout < 10:
            res.rows.append({"run": name, "status": "not run: part's time box spent"})
            continue
        try:
            rc = run_logged(
                trainer_cmd(plan, out, run_dir, config), out / "logs" / f"train.{name}.log", timeout
            )
            row = (
                throughput_row(plan, run_dir, config)
                if rc == 0
                else {"run": name, "status": f"failed: trainer exit {rc} (logs/train.{name}.log)"}
            )
        except subprocess.TimeoutExpired:
            row = {"run": name, "status": f"timed out after {timeout:.0f} s"}
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            row = {"run": name, "status": f"failed: {type(exc).__name__}: {exc}"}
        row.setdefault("status", "ok")
        failed += [name] if row["status"] != "ok" else []
        res.rows.append(row)
        save_part(out, res)
    res.status = "failed" if failed else "ok"
    res.error = f"runs not measured: {', '.join(failed)}" if failed else ""


# ---------------------------------------------------------------- HF baseline
def hf_model(preset: str, vocab_size: int):
    """transformers' BertForMaskedLM at our preset's size, SDPA attention."""
    from transformers import BertConfig, BertForMaskedLM

    from pretrain.model import PRESETS

    p = PRESETS[preset]
    conf = BertConfig(
        vocab_size=vocab_size,
        hidden_size=p.hidden_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        intermediate_size=p.intermediate_size,
        max_position_embeddings=p.max_position_embeddings,
        attn_implementation="sdpa",
    )
    return BertForMaskedLM(conf)


def hf_throughput(shards: Path, preset: str, micro: int, warmup: int, steps: int) -> dict:
    """A careful user's loop: DataCollatorForLanguageModeling in 2 loader workers, bf16 autocast,
    SDPA, fused AdamW (lr 1e-4, clipping 1.0 as ours); tokens = non-padding input tokens."""
    import torch
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    from data_prep.reader import ShardReader
    from pretrain.metrics import memory_stats

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reader = ShardReader(shards, "train")
    tok = AutoTokenizer.from_pretrained(str(reader.tokenizer_path))
    data = [{"input_ids": reader[i].input_ids.tolist()} for i in range(len(reader))]
    torch.manual_seed(0)
    model = hf_model(preset, len(tok)).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, pad_to_multiple_of=8)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=micro,
        shuffle=True,
        drop_last=True,
        collate_fn=collator,
        num_workers=2,
        persistent_workers=True,
        pin_memory=dev.type == "cuda",
    )
    batches, tokens, samples, done, t0 = _endless(loader), 0, 0, 0, 0.0
    while done < warmup + steps:
        if done == warmup:
            _sync(dev)
            t0, tokens, samples = time.perf_counter(), 0, 0
        batch = next(batches)
        tokens += int(batch["attention_mask"].sum())
        samples += batch["input_ids"].shape[0]
        batch = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done += 1
    _sync(dev)
    secs = time.perf_counter() - t0
    mem = memory_stats()
    return {
        "run": f"hf-{preset}",
        "attention": model.config._attn_implementation,
        "micro_batch": micro,
        "steps": steps,
        "tokens/s": round(tokens / secs),
        "seq/s": round(samples / secs, 1),
        "peak mem GiB": round(mem.get("mem_peak_gib", mem.get("mem_rss_gib", 0.0)), 2),
        "loss": round(float(loss), 4),
    }


def _endless(loader):
    while True:
        yield from loader


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()


def part_hf_baseline(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """HF on the BERT-base seq-128 batch, beside our bf16 run of the same size from `train`."""
    preset, seq = plan.hf_config
    row = hf_throughput(
        shards_dir(out, seq), preset, plan.micro_batch[seq], plan.warmup_steps, plan.measured_steps
    )
    row["run"] = f"hf-{preset}-{seq}-bf16-autocast"
    res.rows.append(row)
    ours_file = part_file(out, "train")
    if ours_file.is_file():
        ours = next(
            (
                r
                for r in json.loads(ours_file.read_text())["rows"]
                if r.get("run") == run_name(preset, seq, "bf16") and r["status"] == "ok"
            ),
            None,
        )
        if ours:
            res.rows.insert(
                0,
                {
                    k: ours[k]
                    for k in (
                        "run",
                        "micro_batch",
                        "steps",
                        "tokens/s",
                        "seq/s",
                        "peak mem GiB",
                        "loss",
                    )
                },
            )
            res.details["ours_over_hf_tokens_per_s"] = round(ours["tokens/s"] / row["tokens/s"], 2)
    res.status = "ok"


# ---------------------------------------------------------------- save + exact resume
def part_resume(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """Copy the resume configuration's run (checkpoint after the measured steps), resume it with
    --resume auto, and compare every later step's loss with the uninterrupted run's."""
    from pretrain.checkpoint import list_complete

    src = out / "train" / run_name(*plan.resume_config)
    saved_at = plan.warmup_steps + plan.measured_steps
    if not (src / "metrics.jsonl").is_file() or saved_at not in dict(
        list_complete(src / "checkpoints")
    ):
        raise RuntimeError(
            f"needs the train part's run {src} with its checkpoint at step {saved_at}"
        )
    dst = out / "resume" / "run"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    log = out / "logs" / "resume.train.log"
    rc = run_logged(
        trainer_cmd(plan, out, dst, plan.resume_config, resume=True),
        log,
        seconds_left(deadline) - 2,
    )
    if rc != 0:
        raise RuntimeError(f"resumed trainer exit {rc} (logs/resume.train.log)")
    resumed_from = f"at step {saved_at} " in log.read_text(errors="replace")
    ref = {r["step"]: r["loss"] for r in train_records(src)}
    got = {r["step"]: r["loss"] for r in train_records(dst)}
    after = range(saved_at + 1, saved_at + plan.resume_steps + 1)
    for step in after:
        res.rows.append(
            {
                "step": step,
                "uninterrupted loss": ref.get(step),
                "resumed loss": got.get(step),
                "abs diff": None
                if step not in got or step not in ref
                else abs(got[step] - ref[step]),
            }
        )
    diffs = [r["abs diff"] for r in res.rows]
    # The first step after the checkpoint must be bit-identical (same weights, data, masks and
    # RNG); later steps on a GPU may differ in the last bits where backward kernels use atomics.
    first_exact = diffs[0] == 0.0
    tol = 0.0 if plan.dry_run else 1e-2 * max(abs(ref[s]) for s in after)
    res.details.update(
        {
            "resumed_from_step": saved_at,
            "log_says_resumed": resumed_from,
            "first_step_bit_identical": first_exact,
            "tolerance_later_steps": tol,
        }
    )
    ok = resumed_from and first_exact and None not in diffs and max(diffs) <= tol
    res.status = "ok" if ok else "failed"
    res.error = "" if ok else "resumed losses differ from the uninterrupted run (see rows)"


# ---------------------------------------------------------------- one part, in its own process
PART_FUNCS = {
    "data": part_data,
    "kernel_tests": part_kernel_tests,
    "kernel_sweep": part_kernel_sweep,
    "head": part_head,
    "train": part_train,
    "hf_baseline": part_hf_baseline,
    "resume": part_resume,
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


# ---------------------------------------------------------------- the whole check
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
            sys.executable,
            str(Path(__file__).resolve()),
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


# ---------------------------------------------------------------- report
def environment() -> dict:
    """Device, peaks and package versions of this node."""
    import importlib.metadata as md

    import torch

    from benchmarks.bench_kernels_cuda import hbm_peak_gbps
    from pretrain.metrics import device_peak_tflops

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
    """>= 80 % of the HBM peak on the bytes the kernel pair moves; ours faster than each baseline."""
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
    """MFU of BERT-large seq 128 bf16 above 55 %; ours >= 1.5x HF's tokens/s; exact resume."""
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
    ]


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
        "targets": kernel_targets(by_name) + training_targets(by_name),
        "parts": {r.name: asdict(r) for r in results},
    }
    write_json(out / "gpu_check.json", report)
    write_bytes_atomic(out / "gpu_check.md", markdown(report).encode())
    return report


# ---------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    """The command line of `python benchmarks/gpu_check.py` (and `make gpu-check`)."""
    p = argparse.ArgumentParser(
        prog="python benchmarks/gpu_check.py",
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
        default=",".join(PARTS),
        help=f"comma-separated subset, run in this order (default: {','.join(PARTS)})",
    )
    p.add_argument(
        "--budget_s",
        type=float,
        default=470.0,
        help="overall time budget; later parts keep their minimum (default: 470)",
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
    parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = [s for s in parts if s not in PARTS]
    if unknown:
        p.error(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    import torch

    from kernels.api import enable_interpreter_without_cuda

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
