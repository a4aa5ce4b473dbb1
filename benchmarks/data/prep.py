"""data_prep vs the run_mlm.py way, side by side in one run: tokens/s and bytes/token on disk.

    python -m benchmarks.data.prep --corpus path/to/tiny-shakespeare.txt --repeat 27

The corpus (blank-line-separated documents) is repeated to tens of MB. A WordPiece tokenizer is
trained once (not timed) and both pipelines use it:
- baseline, as transformers' examples/pytorch/language-modeling/run_mlm.py: `datasets`
  load_dataset("text"), `map` the fast tokenizer (batched, num_proc=W), `map` group_texts into
  max_seq_len blocks (num_proc=W), save_to_disk;
- ours: `data_prep` build with W workers (shards, word-start bits, manifest, checksums).
Both run in this process after their libraries are imported; each gets a fresh cache folder.
Throughput counts corpus tokens (the documents' own tokens, no [CLS]/[SEP]) per second.

    python -m benchmarks.data.prep --corpus tiny-shakespeare.txt --repeat 9 --partitions 4

--partitions N instead times a build of the whole against N parts built one after another into
another folder (`prepare`, then `build --num_partitions N --partition K` for each K; the last one
merges), with the same tokenizer and workers, checks that the shard files are byte-identical and
prints each part's time against the whole's (ideal: 1/N; every part still reads the whole input).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from itertools import chain
from pathlib import Path

from bertforge.files import write_json_atomic


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def make_corpus(src: Path, repeat: int, dst: Path) -> int:
    text = src.read_text(encoding="utf-8").strip() + "\n\n"
    with open(dst, "w", encoding="utf-8") as f:
        for _ in range(repeat):
            f.write(text)
    return dst.stat().st_size


def run_baseline(corpus: Path, tok_dir: Path, out: Path, workers: int, max_seq_len: int) -> dict:
    """run_mlm.py's data path (non line-by-line), timed end to end."""
    import datasets
    from transformers import AutoTokenizer

    cache = out.parent / "hf_cache"
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    raw = datasets.load_dataset("text", data_files={"train": str(corpus)}, cache_dir=str(cache))

    def tokenize_function(examples):
        return tokenizer(examples["text"], return_special_tokens_mask=True)

    tokenized = raw.map(tokenize_function, batched=True, num_proc=workers, remove_columns=["text"])

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total = len(concatenated[list(examples.keys())[0]])
        total = (total // max_seq_len) * max_seq_len
        return {
            k: [t[i : i + max_seq_len] for i in range(0, total, max_seq_len)]
            for k, t in concatenated.items()
        }

    grouped = tokenized.map(group_texts, batched=True, num_proc=workers)
    grouped.save_to_disk(str(out))
    seconds = time.perf_counter() - t0
    # Counted after the clock stops: corpus tokens = all tokens minus the 2 specials per line.
    lengths = [len(x) for x in tokenized["train"]["input_ids"]]
    corpus_tokens = sum(lengths) - 2 * len(lengths)
    stored = len(grouped["train"]) * max_seq_len
    return {
        "seconds": seconds,
        "corpus_tokens": corpus_tokens,
        "stored_tokens": stored,
        "bytes": folder_bytes(out),
    }


def run_ours(corpus: Path, tok_dir: Path, out: Path, workers: int, max_seq_len: int) -> dict:
    from bertforge.data_prep.build import build
    from bertforge.data_prep.build_config import BuildConfig
    from bertforge.data_prep.sequences import SequenceConfig

    cfg = BuildConfig(
        inputs=(str(corpus),),
        output=out,
        tokenizer=str(tok_dir),
        sequences=SequenceConfig(max_seq_len=max_seq_len),
        workers=workers,
        validation_fraction=0.01,
    )
    t0 = time.perf_counter()
    m = build(cfg, argv=["bench_data_prep"])
    seconds = time.perf_counter() - t0
    shard_bytes = sum(
        f["bytes"] for s in m["splits"].values() for sh in s["shards"] for f in sh["files"].values()
    )
    return {
        "seconds": seconds,
        "corpus_tokens": sum(s["corpus_tokens"] for s in m["splits"].values()),
        "stored_tokens": sum(s["tokens"] for s in m["splits"].values()),
        "bytes": shard_bytes,
    }


def run_partitions(
    corpus: Path, tok_dir: Path, work: Path, n: int, workers: int, max_seq_len: int, shard_docs: int
) -> dict:
    """Whole build vs n parts one after another (see the module doc); seconds of each."""
    from bertforge.data_prep.build import build, prepare
    from bertforge.data_prep.build_config import BuildConfig
    from bertforge.data_prep.sequences import SequenceConfig

    def cfg(out: Path, **kw) -> BuildConfig:
        return BuildConfig(
            inputs=(str(corpus),),
            output=out,
            tokenizer=str(tok_dir),
            sequences=SequenceConfig(max_seq_len=max_seq_len),
            workers=workers,
            validation_fraction=0.01,
            shard_docs=shard_docs,
            **kw,
        )

    def cpu() -> float:  # this process and its finished children (the pool's workers)
        return sum(
            resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
            for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        )

    t0, c0 = time.perf_counter(), cpu()
    whole = build(cfg(work / "whole"), argv=["bench"])
    whole_s, whole_cpu = time.perf_counter() - t0, cpu() - c0
    t0 = time.perf_counter()
    prepare(cfg(work / "parts"))
    prepare_s = time.perf_counter() - t0
    part_s, part_cpu = [], []
    for k in range(n):
        t0, c0 = time.perf_counter(), cpu()
        build(cfg(work / "parts", num_partitions=n, partition=k), argv=["bench"])
        part_s.append(time.perf_counter() - t0)
        part_cpu.append(cpu() - c0)
    files = sorted(p.relative_to(work / "whole") for p in (work / "whole").rglob("shard-*"))
    identical = all(
        (work / "whole" / f).read_bytes() == (work / "parts" / f).read_bytes() for f in files
    ) and len(files) == len(list((work / "parts").rglob("shard-*")))
    return {
        "whole_seconds": whole_s,
        "prepare_seconds": prepare_s,
        "part_seconds": part_s,
        "whole_cpu_seconds": whole_cpu,
        "part_cpu_seconds": part_cpu,
        "slowest_part_cpu_over_whole": max(part_cpu) / whole_cpu,
        "units": len(whole["splits"]["train"]["shards"]),
        "shard_files": len(files),
        "byte_identical": identical,
        "slowest_part_over_whole": max(part_s) / whole_s,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.data.prep",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--corpus", type=Path, required=True, help="UTF-8 text, blank-line documents")
    p.add_argument("--repeat", type=int, default=27, help="copies of the corpus (tens of MB)")
    p.add_argument("--workers", type=int, default=2, help="processes for both pipelines")
    p.add_argument("--max_seq_len", type=int, default=128)
    p.add_argument("--vocab_size", type=int, default=16000)
    p.add_argument("--work_dir", type=Path, default=None, help="default: a temporary folder")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="time N parts one after another against one build of the whole",
    )
    p.add_argument("--shard_docs", type=int, default=2000, help="--partitions: units' size")
    return p.parse_args(argv)


def report_partitions(r: dict, args: argparse.Namespace, size: int) -> int:
    """--partitions: the whole against its parts; 1 when the shard files differ."""
    print(
        f"whole build {r['whole_seconds']:.2f} s ({r['units']} work units); prepare "
        f"{r['prepare_seconds']:.2f} s; parts "
        + ", ".join(f"{t:.2f}" for t in r["part_seconds"])
        + f" s; slowest part / whole "
        f"{r['slowest_part_over_whole']:.3f} (ideal {1 / args.partitions:.3f}); "
        f"{r['shard_files']} shard files byte-identical: {r['byte_identical']}"
    )
    print(
        f"CPU seconds (process + workers): whole {r['whole_cpu_seconds']:.2f}, parts "
        + ", ".join(f"{t:.2f}" for t in r["part_cpu_seconds"])
        + f"; largest part / whole {r['slowest_part_cpu_over_whole']:.3f}; load "
        f"average {os.getloadavg()[0]:.1f}"
    )
    if args.json:
        write_json_atomic(args.json, {"corpus_bytes": size, **r})
    return 0 if r["byte_identical"] else 1


def report_sides(base: dict, ours: dict, args: argparse.Namespace, size: int) -> None:
    """The baseline against ours: tokens/s and bytes per token, printed (and --json)."""
    rows = {}
    for name, r in (("run_mlm.py way (datasets)", base), ("data_prep", ours)):
        r["tokens_per_s"] = r["corpus_tokens"] / r["seconds"]
        r["bytes_per_stored_token"] = r["bytes"] / r["stored_tokens"]
        r["bytes_per_corpus_token"] = r["bytes"] / r["corpus_tokens"]
        rows[name] = r
        print(
            f"{name:28s} {r['seconds']:7.2f} s  {r['tokens_per_s'] / 1e6:6.3f} M tokens/s  "
            f"{r['bytes_per_stored_token']:.3f} B/stored token  "
            f"{r['bytes_per_corpus_token']:.3f} B/corpus token  ({r['bytes'] / 1e6:.1f} MB)"
        )
    speedup = ours["tokens_per_s"] / base["tokens_per_s"]
    smaller = base["bytes_per_corpus_token"] / ours["bytes_per_corpus_token"]
    print(f"speed-up {speedup:.2f}x tokens/s; {smaller:.2f}x fewer bytes per corpus token")
    if args.json:
        result = {
            "corpus_bytes": size,
            "repeat": args.repeat,
            "workers": args.workers,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "results": rows,
            "speedup": speedup,
        }
        write_json_atomic(args.json, result)


def main(argv: list[str] | None = None) -> int:
    """Build the corpus and the tokenizer, time both pipelines (or the partitions), report."""
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets  # noqa: F401  (imports warmed up outside both clocks)
    import transformers  # noqa: F401

    from bertforge.data_prep.tokenizer import train_wordpiece

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_data_prep_"))
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    try:
        corpus, tok_dir = run / "corpus.txt", run / "tokenizer"
        size = make_corpus(args.corpus, args.repeat, corpus)
        text = args.corpus.read_text(encoding="utf-8")
        train_wordpiece(text.split("\n\n"), args.vocab_size, True, tok_dir)
        print(
            f"corpus: {args.corpus.name} x{args.repeat} = {size / 1e6:.1f} MB; "
            f"workers {args.workers}; max_seq_len {args.max_seq_len}",
            flush=True,
        )
        sizes = (args.workers, args.max_seq_len)
        if args.partitions:
            r = run_partitions(corpus, tok_dir, run, args.partitions, *sizes, args.shard_docs)
            return report_partitions(r, args, size)
        base = run_baseline(corpus, tok_dir, run / "hf_out", *sizes)
        ours = run_ours(corpus, tok_dir, run / "shards", *sizes)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    report_sides(base, ours, args, size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
