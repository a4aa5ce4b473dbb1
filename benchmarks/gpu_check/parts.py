"""The data and kernel parts of the GPU check: shards, kernel tests, kernel sweep, head.

Each part function takes (plan, out, result, deadline), fills result.rows / details / status and
may raise (gpu_check records the exception as the part's error).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.common import build_shards, shards_manifest
from benchmarks.gpu_check.common import (
    PartResult,
    Plan,
    all_seq_lens,
    run_logged,
    save_part,
    seconds_left,
    shards_dir,
)
from bertforge.data_prep.sample_corpus import write_english_corpus


def padded_vocab_file(tokenizer_json: Path, size: int, dest: Path) -> Path:
    """BERT-style vocab.txt: the trained WordPiece entries, then [unusedN] up to `size` entries."""
    vocab = json.loads(tokenizer_json.read_text(encoding="utf-8"))["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    tokens += [f"[unused{i}]" for i in range(size - len(tokens))]
    dest.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return dest


def part_data(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """Shards of the pydoc corpus for every sequence length of the plan (the same builder and
    corpus as benchmarks.training.trainer); the vocabulary padded to BERT's size on a GPU."""
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    corpus = write_english_corpus(data / "pydoc_topics.txt")
    tokenizer = None
    if plan.vocab:  # a 460 KB corpus trains ~4k entries; the head must be BERT's 30522 wide
        probe = build_shards(
            corpus,
            data / "vocab_probe",
            vocab_size=plan.vocab,
            max_seq_len=plan.seq_lens[0],
            validation_fraction=0.02,
        )
        tokenizer = str(
            padded_vocab_file(
                probe / "tokenizer" / "tokenizer.json", plan.vocab, data / "vocab.txt"
            )
        )
    for seq in all_seq_lens(plan):
        vocab = {"tokenizer": tokenizer} if tokenizer else {"vocab_size": plan.vocab or 30522}
        shards = build_shards(
            corpus, shards_dir(out, seq), max_seq_len=seq, validation_fraction=0.02, **vocab
        )
        manifest = shards_manifest(shards)
        tokenizer = tokenizer or str(shards / "tokenizer")  # one vocabulary: a plan mixes builds
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
    """benchmarks.kernels.speed with `flags` into OUT/NAME; its report (rc in report["rc"])."""
    folder = out / name
    rc = run_logged(
        [
            *(sys.executable, "-m", "benchmarks.kernels.speed"),
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
