"""Cross-layer sharing (``--share_layers``) side by side: none / all / groups:2 on the same budget.

Each variant trains ``--model small --num_hidden_layers 8`` through ``pretrain/main.py`` (one CPU
rank, one thread, ZeRO-2, fp32) for the same wall-clock budget (``--max_time_hours``), then
validates on the same batches and saves a final checkpoint. Reported per variant: distinct
parameters, the checkpoint folder's bytes, the process's peak RSS (``/usr/bin/time``), tokens/s
over the steps after the first two (and of the fastest step, the least disturbed on a shared
machine), steps done and the validation loss at the end.

    nice -n 5 python -m experiments.share_layers [--seconds 90]
        [--variants none all groups:2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import CPU_DS_CONFIG, REPO, build_shards, one_thread_env, vocab_size
from bertforge.data_prep.sample_corpus import write_english_corpus
from bertforge.pretrain.config import command_line


def train(shards: Path, run: Path, spec: str, args: argparse.Namespace) -> dict:
    """One budgeted run of ``spec``; its numbers from metrics.jsonl, the checkpoint and time -f."""
    from bertforge.pretrain.components.metrics import read_metrics

    cmd = command_line.trainer(
        ds_config=CPU_DS_CONFIG,
        data=shards,
        model="small",
        num_hidden_layers=args.layers,
        share_layers=spec,
        output_dir=run,
        max_steps=100000,
        max_time_hours=args.seconds / 3600,
        global_batch_size=args.batch,
        micro_batch_size=args.batch,
        num_workers=1,
        progress=False,
        eval_batches=args.eval_batches,
        lr="5e-4",
        warmup_steps=5,
        save_interval=0,
    )
    cmd = ["/usr/bin/time", "-f", "MAXRSS_KB %M", *cmd]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        env=one_thread_env(),
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{spec}: training failed\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rss_kb = int(proc.stderr.rsplit("MAXRSS_KB", 1)[1].split()[0])
    steps = read_metrics(run / "metrics.jsonl")
    timed = steps[2:]  # the first steps include allocator and thread-pool warm-up
    val = read_metrics(run / "metrics.jsonl", "validation")[-1]
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

    from bertforge.pretrain.doctor.memory_estimate import count_params
    from bertforge.pretrain.model.registry import preset

    vocab = vocab_size(shards)
    cfg = dataclasses.replace(preset("small"), num_hidden_layers=layers, share_layers=spec)
    return count_params(cfg, vocab, False)[0]


def main() -> int:
    """Run the variants one after another and print a markdown table."""
    p = argparse.ArgumentParser(
        prog="python -m experiments.share_layers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seconds", type=float, default=90.0, help="wall-clock budget per variant")
    p.add_argument("--variants", nargs="+", default=["none", "all", "groups:2"])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=8, help="global (= micro) batch, one rank")
    p.add_argument("--eval_batches", type=int, default=8)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_share_"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = write_english_corpus(work / "pydoc_topics.txt")
    shards = build_shards(
        corpus, work / "shards", vocab_size=8000, max_seq_len=128, validation_fraction=0.02
    )
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
