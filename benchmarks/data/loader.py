"""Loader throughput: pretrain.data.loader (shards + dynamic masking + collation) vs HF's collators.

    python -m benchmarks.data.loader CORPUS.txt [--shards DIR] [--seconds 5] [--batch 256]
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
two batched reads) with the same masking; target: within 10% of one build.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import build_shards

os.environ.setdefault("OMP_NUM_THREADS", "1")


def per_sample_read(dataset, plan):
    """The former read path, kept as the baseline: one reader call per sequence, then
    concatenation into the padded rectangle (same result as `ShardReader.get_batch`)."""
    import numpy as np

    from bertforge.data_prep.reader import SampleBatch

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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.data.loader",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
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
    return args


MASKINGS = ("token", "whole-word")


def masking(kind: str):
    """The masking settings of `kind` (token-level or whole-word, defaults otherwise)."""
    from bertforge.pretrain.data.masking import MaskingConfig

    return MaskingConfig(whole_word=kind == "whole-word")


def our_loaders(reader, batch: int) -> tuple[dict, dict]:
    """Ours with the batched read and with the former per-sample read, for each masking: the
    `next_batch()` callables, and per masking the (new, old) datasets to compare."""
    from bertforge.pretrain.data.loader import DataConfig, GlobalSampler, build_loader

    loaders, pairs = {}, {}
    for kind in MASKINGS:
        loader = build_loader(
            reader, DataConfig(num_workers=0), masking(kind), micro_batch_size=batch
        )
        it = iter(loader)
        loaders[f"ours, {kind} masking, batched read"] = lambda it=it: len(next(it)["input_ids"])
        # The same dataset and sampler, reading one sequence at a time (the former path).
        old = copy.copy(loader.dataset)
        old.read = lambda plan, ds=old: per_sample_read(ds, plan)
        pairs[kind] = (loader.dataset, old)
        plans = iter(GlobalSampler(len(reader), batch, seed=DataConfig().seed))
        loaders[f"ours, {kind} masking, per-sample read"] = lambda old=old, plans=plans: len(
            old.__getitems__(next(plans))["input_ids"]
        )
    return loaders, pairs


def hf_loader(reader, batch: int):
    """Baseline: HF's collator over the same sequences (pre-tokenized lists, as datasets gives)."""
    import numpy as np
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    tok = AutoTokenizer.from_pretrained(reader.tokenizer_path)
    examples = [{"input_ids": reader[i].input_ids.tolist()} for i in range(len(reader))]
    rng = np.random.default_rng(0)
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, pad_to_multiple_of=8)

    def step():
        idx = rng.integers(0, len(examples), size=batch)
        return len(collator([examples[i] for i in idx])["input_ids"])

    return step


def check_same_batches(reader, pairs: dict, batch: int) -> None:
    """Same batches from both read paths (a check that the comparison is fair)."""
    from bertforge.pretrain.data.loader import GlobalSampler

    plan = next(iter(GlobalSampler(len(reader), batch, seed=3)))
    for kind, (new_ds, old_ds) in pairs.items():
        a, b = new_ds.__getitems__(plan), old_ds.__getitems__(plan)
        if not all(a[key].equal(b[key]) for key in ("input_ids", "labels", "attention_mask")):
            raise SystemExit(f"{kind} masking: the two read paths give different batches")


def mixture_loaders(shards: Path, second: Path, batch: int) -> dict:
    """A 50/50 mixture of two builds, for each masking."""
    from bertforge.data_prep.sources import parse_mixture
    from bertforge.pretrain.data.loader import DataConfig, build_loader
    from bertforge.pretrain.data.mixture import open_training

    mix = open_training(parse_mixture([f"a={shards}:0.5", f"b={second}:0.5"]))
    print(f"mixture: {mix}")
    loaders = {}
    for kind in MASKINGS:
        it = iter(
            build_loader(mix, DataConfig(num_workers=0), masking(kind), micro_batch_size=batch)
        )
        loaders[f"mixture of 2 builds, {kind} masking"] = lambda it=it: len(next(it)["input_ids"])
    return loaders


def measure(args: argparse.Namespace, shards: Path) -> dict[str, tuple[float, float]]:
    """Every loader on `shards`, in rounds: sequences per wall and per CPU second."""
    from bertforge.data_prep.reader import ShardReader

    reader = ShardReader(shards)
    lengths = reader.sequence_lengths()
    n_shards = len(reader.manifest["splits"]["train"]["shards"])
    print(
        f"shards: {reader}; {n_shards} train shards; mean length {lengths.mean():.1f}, "
        f"{(lengths == reader.max_seq_len).mean():.0%} at max_seq_len {reader.max_seq_len}"
    )
    loaders, pairs = our_loaders(reader, args.batch)
    loaders["HF DataCollatorForLanguageModeling"] = hf_loader(reader, args.batch)
    check_same_batches(reader, pairs, args.batch)
    if args.mixture:
        loaders.update(mixture_loaders(shards, args.mixture, args.batch))
    return rounds(loaders, args.seconds)


def report(results: dict[str, tuple[float, float]], args: argparse.Namespace) -> None:
    """The table, the read-path and mixture ratios, and the target."""
    ours = results["ours, token masking, batched read"]
    print(
        f"\n{'loader (one process, batch ' + str(args.batch) + ')':<46} {'seq/s':>9} "
        f"{'seq/CPU-s':>10} {'vs HF LM':>9}"
    )
    base = results["HF DataCollatorForLanguageModeling"][1]
    for name, (wall, cpu) in results.items():
        print(f"{name:<46} {wall:>9,.0f} {cpu:>10,.0f} {cpu / base:>8.1f}x")
    for kind in MASKINGS:
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


def main(argv: list[str] | None = None) -> int:
    """Build (or take) the shards, time every loader, print the table."""
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)  # one process, one core: the loader's own budget
    with tempfile.TemporaryDirectory() as tmp:
        shards = args.shards or build_shards(
            args.corpus,
            Path(tmp) / "shards",
            quiet=False,
            vocab_size=30522,  # BERT's size
            max_seq_len=args.max_seq_len,
            validation_fraction=0.01,
            shard_docs=args.shard_docs,
        )
        results = measure(args, shards)
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
