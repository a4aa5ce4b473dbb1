"""Loader throughput: pretrain.data.loader (shards + dynamic masking + collation) vs HF's collators.

    python benchmarks/bench_loader.py CORPUS.txt [--shards DIR] [--seconds 5] [--batch 256]
                                      [--shard_docs N]

Builds packed shards of length 128 from CORPUS with `python -m data_prep build` (or uses --shards),
then measures sequences/s in ONE process (num_workers=0) for token-level and whole-word masking:
ours with the batched read (`ShardReader.get_batch`, what build_loader uses), ours with the former
per-sample read (one `ShardReader.__getitem__` call per sequence, then concatenation), and
transformers' DataCollatorForLanguageModeling over the same sequences (its whole-word mode needs
the raw text's offset mapping, so it has no counterpart on token ids). The loaders alternate in
rounds so that a change in the machine's load hits them alike. --shard_docs N builds a shard per
N documents (many shards: a batch touches many of them, the case of a large corpus).
Target: >= 20,000 sequences/s for ours.

--mixture DIR2 (a second build with the same tokenizer) also times a 50/50 weighted mixture of
--shards and DIR2 (`pretrain.data.mixture`: two sources, per-source sample order, rows joined from
two
batched reads) with the same masking; target: within 10% of one build.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def build_shards(corpus: Path, out: Path, max_seq_len: int, shard_docs: int | None) -> Path:
    """Packed shards of `corpus` with a 30522-entry WordPiece vocabulary (BERT's size)."""
    extra = ["--shard_docs", str(shard_docs)] if shard_docs else []
    subprocess.run(
        [
            sys.executable,
            "-m",
            "data_prep",
            "build",
            "--input",
            str(corpus),
            "--output",
            str(out),
            "--vocab_size",
            "30522",
            "--max_seq_len",
            str(max_seq_len),
            "--validation_fraction",
            "0.01",
            "--workers",
            "2",
            *extra,
        ],
        cwd=REPO,
        check=True,
    )
    return out


def per_sample_read(dataset, plan):
    """The former read path, kept as the baseline: one reader call per sequence, then
    concatenation into the padded rectangle (same result as `ShardReader.get_batch`)."""
    import numpy as np

    from data_prep.reader import SampleBatch

    reader = dataset.reader
    samples = [reader[int(i)] for i in plan.indices]
    lengths = np.fromiter((len(s.input_ids) for s in samples), dtype=np.int64, count=len(samples))
    T = int(-(-int(lengths.max()) // dataset.multiple) * dataset.multiple)
    in_seq = np.arange(T)[None, :] < lengths[:, None]
    ids = np.full((len(samples), T), dataset.pad_id, dtype=np.int64)
    ids[in_seq] = np.concatenate([s.input_ids for s in samples])
    ws = None
    if dataset.masker.cfg.whole_word:
        ws = np.zeros((len(samples), T), dtype=bool)
        ws[in_seq] = np.concatenate([s.word_start for s in samples])
    return SampleBatch(ids, lengths, ws)


def rounds(loaders: dict, seconds: float, n_rounds: int = 5) -> dict[str, tuple[float, float]]:
    """Sequences per wall second and per CPU second of each loader's `next_batch()` (returns the
    batch size): `n_rounds` turns of seconds / n_rounds each, the loaders taking turns."""
    totals = {name: [0, 0.0, 0.0] for name in loaders}
    for f in loaders.values():
        f()  # warm-up
    for _ in range(n_rounds):
        for name, f in loaders.items():
            n, t0, c0 = 0, time.perf_counter(), time.process_time()
            while time.perf_counter() - t0 < seconds / n_rounds:
                n += f()
            t = totals[name]
            t[0] += n
            t[1] += time.perf_counter() - t0
            t[2] += time.process_time() - c0
    return {name: (n / wall, n / cpu) for name, (n, wall, cpu) in totals.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("corpus", type=Path, nargs="?", help="text file to build shards from")
    p.add_argument("--shards", type=Path, help="use this finished shard folder instead of building")
    p.add_argument("--seconds", type=float, default=5.0, help="measuring time per loader")
    p.add_argument("--batch", type=int, default=256, help="sequences per batch")
    p.add_argument("--max_seq_len", type=int, default=128)
    p.add_argument(
        "--shard_docs",
        type=int,
        default=None,
        help="documents per shard when building (default: data_prep's)",
    )
    p.add_argument(
        "--mixture",
        type=Path,
        default=None,
        help="a second build (same tokenizer): also time a 50/50 mixture with it",
    )
    args = p.parse_args(argv)
    if not args.shards and not args.corpus:
        p.error("give a corpus file to build shards from, or --shards DIR")

    import numpy as np
    import torch
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    from data_prep.reader import ShardReader
    from pretrain.data.loader import DataConfig, GlobalSampler, build_loader
    from pretrain.data.masking import MaskingConfig

    torch.set_num_threads(1)  # one process, one core: the loader's own budget
    with tempfile.TemporaryDirectory() as tmp:
        shards = args.shards or build_shards(
            args.corpus, Path(tmp) / "shards", args.max_seq_len, args.shard_docs
        )
        reader = ShardReader(shards)
        lengths = reader.sequence_lengths()
        n_shards = len(reader.manifest["splits"]["train"]["shards"])
        print(
            f"shards: {reader}; {n_shards} train shards; mean length {lengths.mean():.1f}, "
            f"{(lengths == reader.max_seq_len).mean():.0%} at max_seq_len {reader.max_seq_len}"
        )
        loaders, pairs = {}, {}
        for kind, masking in (
            ("token", MaskingConfig()),
            ("whole-word", MaskingConfig(whole_word=True)),
        ):
            loader = build_loader(
                reader, DataConfig(num_workers=0), masking, micro_batch_size=args.batch
            )
            it = iter(loader)
            loaders[f"ours, {kind} masking, batched read"] = lambda it=it: len(
                next(it)["input_ids"]
            )
            # The same dataset and sampler, reading one sequence at a time (the former path).
            old = copy.copy(loader.dataset)
            old.read = lambda plan, ds=old: per_sample_read(ds, plan)
            pairs[kind] = (loader.dataset, old)
            plans = iter(GlobalSampler(len(reader), args.batch, seed=DataConfig().seed))
            loaders[f"ours, {kind} masking, per-sample read"] = lambda old=old, plans=plans: len(
                old.__getitems__(next(plans))["input_ids"]
            )

        # Baseline: HF collators over the same sequences (pre-tokenized lists, as datasets gives).
        tok = AutoTokenizer.from_pretrained(reader.tokenizer_path)
        examples = [{"input_ids": reader[i].input_ids.tolist()} for i in range(len(reader))]
        rng = np.random.default_rng(0)
        collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, pad_to_multiple_of=8)

        def step():
            idx = rng.integers(0, len(examples), size=args.batch)
            return len(collator([examples[i] for i in idx])["input_ids"])

        loaders["HF DataCollatorForLanguageModeling"] = step
        # Same batches from both read paths (a check that the comparison is fair).
        plan = next(iter(GlobalSampler(len(reader), args.batch, seed=3)))
        for kind, (new_ds, old_ds) in pairs.items():
            a, b = new_ds.__getitems__(plan), old_ds.__getitems__(plan)
            if not all(a[key].equal(b[key]) for key in ("input_ids", "labels", "attention_mask")):
                raise SystemExit(f"{kind} masking: the two read paths give different batches")
        if args.mixture:
            from pretrain.data.mixture import open_training, parse_mixture

            mix = open_training(parse_mixture([f"a={shards}:0.5", f"b={args.mixture}:0.5"]))
            print(f"mixture: {mix}")
            for kind, masking in (
                ("token", MaskingConfig()),
                ("whole-word", MaskingConfig(whole_word=True)),
            ):
                it = iter(
                    build_loader(
                        mix, DataConfig(num_workers=0), masking, micro_batch_size=args.batch
                    )
                )
                loaders[f"mixture of 2 builds, {kind} masking"] = lambda it=it: len(
                    next(it)["input_ids"]
                )
        results = rounds(loaders, args.seconds)

    ours = results["ours, token masking, batched read"]
    print(
        f"\n{'loader (one process, batch ' + str(args.batch) + ')':<46} {'seq/s':>9} "
        f"{'seq/CPU-s':>10} {'vs HF LM':>9}"
    )
    base = results["HF DataCollatorForLanguageModeling"][1]
    for name, (wall, cpu) in results.items():
        print(f"{name:<46} {wall:>9,.0f} {cpu:>10,.0f} {cpu / base:>8.1f}x")
    for kind in ("token", "whole-word"):
        new = results[f"ours, {kind} masking, batched read"][1]
        old = results[f"ours, {kind} masking, per-sample read"][1]
        print(f"batched vs per-sample read, {kind} masking: {new / old:.2f}x per CPU second")
        if args.mixture:
            mixed = results[f"mixture of 2 builds, {kind} masking"]
            one = results[f"ours, {kind} masking, batched read"]
            print(
                f"mixture of 2 builds vs one build, {kind} masking: {mixed[0] / one[0]:.3f}x "
                f"wall, {mixed[1] / one[1]:.3f}x per CPU second"
            )
    print(
        f"\ntarget >= 20,000 seq/s: {'met' if ours[0] >= 20000 else 'NOT met'} wall "
        f"({ours[0]:,.0f}); {ours[1]:,.0f} per CPU second; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
