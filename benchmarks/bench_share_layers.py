"""Cross-layer sharing (``--share_layers``) side by side: none / all / groups:2 on the same budget.

Each variant trains ``--model small --num_hidden_layers 8`` through ``pretrain/main.py`` (one CPU
rank, one thread, ZeRO-2, fp32) for the same wall-clock budget (``--max_time_hours``), then
validates on the same batches and saves a final checkpoint. Reported per variant: distinct
parameters, the checkpoint folder's bytes, the process's peak RSS (``/usr/bin/time``), tokens/s
over the steps after the first two (and of the fastest step, the least disturbed on a shared
machine), steps done and the validation loss at the end.

    nice -n 5 python benchmarks/bench_share_layers.py [--seconds 90] [--variants none all groups:2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))


def train(shards: Path, run: Path, spec: str, args: argparse.Namespace) -> dict:
    """One budgeted run of ``spec``; its numbers from metrics.jsonl, the checkpoint and time -f."""
    cmd = [
        "/usr/bin/time",
        "-f",
        "MAXRSS_KB %M",
        sys.executable,
        str(REPO / "pretrain/main.py"),
        "--ds_config",
        str(REPO / "ds_configs" / "cpu.json"),
        "--data",
        str(shards),
        "--model",
        "small",
        "--num_hidden_layers",
        str(args.layers),
        "--share_layers",
        spec,
        "--output_dir",
        str(run),
        "--max_steps",
        "100000",
        "--max_time_hours",
        str(args.seconds / 3600),
        "--global_batch_size",
        str(args.batch),
        "--micro_batch_size",
        str(args.batch),
        "--num_workers",
        "1",
        "--progress",
        "false",
        "--eval_batches",
        str(args.eval_batches),
        "--lr",
        "5e-4",
        "--warmup_steps",
        "5",
        "--save_interval",
        "0",
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{spec}: training failed\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rss_kb = int(proc.stderr.rsplit("MAXRSS_KB", 1)[1].split()[0])
    recs = [json.loads(line) for line in (run / "metrics.jsonl").open(encoding="utf-8")]
    steps = [r for r in recs if r.get("split", "train") == "train"]
    timed = steps[2:]  # the first steps include allocator and thread-pool warm-up
    val = [r for r in recs if r.get("split") == "validation"][-1]
    ckpt = max((run / "checkpoints").glob("step_*"))
    return {
        "share_layers": spec,
        "parameters": _parameters(spec, shards, args.layers),
        "checkpoint_mb": sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()) / 1e6,
        "model_file_mb": sum(f.stat().st_size for f in ckpt.glob("*model_states.pt")) / 1e6,
        "peak_rss_gib": rss_kb / 2**20,
        "tokens_per_s": sum(r["tokens"] for r in timed) / sum(r["step_time_s"] for r in timed),
        # The fastest step: the least disturbed by other jobs on a shared machine.
        "best_step_tokens_per_s": max(r["tokens"] / r["step_time_s"] for r in timed),
        "steps": len(steps),
        "val_loss": val["val_loss"],
    }


def _parameters(spec: str, shards: Path, layers: int) -> int:
    import dataclasses

    from pretrain.doctor.memory_estimate import count_params
    from pretrain.model.bert import preset

    vocab = json.loads((shards / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    cfg = dataclasses.replace(preset("small"), num_hidden_layers=layers, share_layers=spec)
    return count_params(cfg, vocab, False)[0]


def main() -> int:
    """Run the variants one after another and print a markdown table."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seconds", type=float, default=90.0, help="wall-clock budget per variant")
    p.add_argument("--variants", nargs="+", default=["none", "all", "groups:2"])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=8, help="global (= micro) batch, one rank")
    p.add_argument("--eval_batches", type=int, default=8)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args()
    from bench_trainer import build_shards
    from conftest import write_english_corpus

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_share_"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = write_english_corpus(work / "pydoc_topics.txt")
    shards = build_shards([corpus], work / "shards", 8000, 128)
    rows = [train(shards, work / spec.replace(":", "_"), spec, args) for spec in args.variants]
    print(f"small, {args.layers} layers, seq 128, batch {args.batch}, {args.seconds:.0f} s each\n")
    print(
        "| share_layers | parameters | checkpoint (model file) | peak RSS "
        "| tokens/s (best step) | steps | val loss |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['share_layers']} | {r['parameters'] / 1e6:.2f} M "
            f"| {r['checkpoint_mb']:.0f} MB ({r['model_file_mb']:.0f} MB) "
            f"| {r['peak_rss_gib']:.2f} GiB "
            f"| {r['tokens_per_s']:.0f} ({r['best_step_tokens_per_s']:.0f}) "
            f"| {r['steps']} | {r['val_loss']:.3f} |"
        )
    print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
