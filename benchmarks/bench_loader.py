"""Loader throughput: pretrain.data (shards + dynamic masking + collation) vs HF's collators.

    python benchmarks/bench_loader.py CORPUS.txt [--shards DIR] [--seconds 5] [--batch 256]

Builds packed shards of length 128 from CORPUS with `python -m data_prep build` (or uses --shards),
then measures sequences/s in ONE process (num_workers=0) for token-level and whole-word masking,
next to transformers' DataCollatorForLanguageModeling over the same sequences (its whole-word mode
needs the raw text's offset mapping, so it has no counterpart on token ids).
Target: >= 20,000 sequences/s for ours.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def build_shards(corpus: Path, out: Path, max_seq_len: int) -> Path:
    """Packed shards of `corpus` with a 30522-entry WordPiece vocabulary (BERT's size)."""
    subprocess.run([sys.executable, "-m", "data_prep", "build", "--input", str(corpus), "--output",
                    str(out), "--vocab_size", "30522", "--max_seq_len", str(max_seq_len),
                    "--validation_fraction", "0.01", "--workers", "2"], cwd=REPO, check=True)
    return out


def rate(next_batch, seconds: float) -> tuple[float, float]:
    """Sequences per wall second and per CPU second of this process, of `next_batch()` (which
    returns the batch size) over `seconds`. On a shared machine the CPU-time rate is what one
    process would deliver on a core of its own."""
    next_batch()  # warm-up
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        n += next_batch()
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("corpus", type=Path, nargs="?", help="text file to build shards from")
    p.add_argument("--shards", type=Path, help="use this finished shard folder instead of building")
    p.add_argument("--seconds", type=float, default=5.0, help="measuring time per loader")
    p.add_argument("--batch", type=int, default=256, help="sequences per batch")
    p.add_argument("--max_seq_len", type=int, default=128)
    args = p.parse_args(argv)
    if not args.shards and not args.corpus:
        p.error("give a corpus file to build shards from, or --shards DIR")

    import numpy as np
    import torch
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    from data_prep.reader import ShardReader
    from pretrain.data import DataConfig, build_loader
    from pretrain.masking import MaskingConfig

    torch.set_num_threads(1)  # one process, one core: the loader's own budget
    with tempfile.TemporaryDirectory() as tmp:
        shards = args.shards or build_shards(args.corpus, Path(tmp) / "shards", args.max_seq_len)
        reader = ShardReader(shards)
        lengths = reader.sequence_lengths()
        print(f"shards: {reader}; mean length {lengths.mean():.1f}, "
              f"{(lengths == reader.max_seq_len).mean():.0%} at max_seq_len {reader.max_seq_len}")
        results = {}
        for name, masking in (("ours, token masking", MaskingConfig()),
                              ("ours, whole-word masking", MaskingConfig(whole_word=True))):
            it = iter(build_loader(reader, DataConfig(num_workers=0), masking,
                                   micro_batch_size=args.batch))
            results[name] = rate(lambda it=it: len(next(it)["input_ids"]), args.seconds)

        # Baseline: HF collators over the same sequences (pre-tokenized lists, as datasets gives).
        tok = AutoTokenizer.from_pretrained(reader.tokenizer_path)
        examples = [{"input_ids": reader[i].input_ids.tolist()} for i in range(len(reader))]
        rng = np.random.default_rng(0)
        collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, pad_to_multiple_of=8)

        def step():
            idx = rng.integers(0, len(examples), size=args.batch)
            return len(collator([examples[i] for i in idx])["input_ids"])
        results["HF DataCollatorForLanguageModeling"] = rate(step, args.seconds)

    ours = results["ours, token masking"][0]
    print(f"\n{'loader (one process, batch ' + str(args.batch) + ')':<40} {'seq/s':>9} "
          f"{'seq/CPU-s':>10} {'vs HF LM':>9}")
    base = results["HF DataCollatorForLanguageModeling"][1]
    for name, (wall, cpu) in results.items():
        print(f"{name:<40} {wall:>9,.0f} {cpu:>10,.0f} {cpu / base:>8.1f}x")
    print(f"\ntarget >= 20,000 seq/s: {'met' if ours >= 20000 else 'NOT met'} ({ours:,.0f} wall; "
          f"{results['ours, token masking'][1]:,.0f} per CPU second)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
