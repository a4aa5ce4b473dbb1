"""What `data_prep build --key_sentences R` costs: input tokens per second, against a plain build.

    python -m benchmarks.data.key_sentences --english /work/shared/corpora/tiny-shakespeare.txt \
        --chinese /work/shared/corpora/hongloumeng.txt --runs 5

Per corpus (the English file's blank-line-separated documents, the Chinese file one document a
line), a plain build trains a WordPiece vocabulary and one build of each arm warms up (none timed);
then plain builds and builds with `--key_sentences R` alternate, `--runs` of each, so that the load
of a shared machine falls on both arms alike. Every build runs in this process
(`data_prep.build.build`, `--workers W`, work units of `--shard_docs` documents so that every
worker has some, the trained tokenizer, a fresh output folder). The input tokens are the plain
build's corpus tokens (the documents' own tokens, before any cut), the same number for both arms.
Printed per arm: the median seconds, their min-max spread, the median input tokens/s and the median
CPU seconds (this process and its pool workers, which the load of other jobs does not inflate);
then the ratios key / plain of tokens/s and of CPU seconds, and what the key-sentence builds kept
(manifest).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import each_corpus, write_corpus_results


def cpu_seconds() -> float:
    """User + system seconds of this process and its finished children (the pool's workers)."""
    return sum(
        resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )


def timed_build(cfg) -> tuple[float, float, dict]:
    """(wall seconds, CPU seconds, manifest) of one build of `cfg` into a fresh folder."""
    from bertforge.data_prep.build import build

    shutil.rmtree(cfg.output, ignore_errors=True)
    t0, c0 = time.perf_counter(), cpu_seconds()
    manifest = build(cfg, argv=["bench_key_sentences"])
    return time.perf_counter() - t0, cpu_seconds() - c0, manifest


def corpus_tokens(manifest: dict) -> int:
    return sum(s["corpus_tokens"] for s in manifest["splits"].values())


def measure(corpus: Path, one_per_line: bool, work: Path, args: argparse.Namespace) -> dict:
    """Plain and key-sentence builds of `corpus`, alternating (see the module doc)."""
    from dataclasses import replace

    from bertforge.data_prep.build_config import BuildConfig
    from bertforge.data_prep.inputs import InputConfig
    from bertforge.data_prep.sequences import SequenceConfig

    base = BuildConfig(
        inputs=(str(corpus),),
        output=work / "trained",
        vocab_size=args.vocab_size,
        sequences=SequenceConfig(max_seq_len=args.max_seq_len),
        input=InputConfig(one_doc_per_line=one_per_line),
        workers=args.workers,
        shard_docs=args.shard_docs,
        progress="off",
    )
    _, _, trained = timed_build(base)  # trains the vocabulary; warms the imports up
    tokens = corpus_tokens(trained)
    plain = replace(base, output=work / "plain", tokenizer=str(work / "trained" / "tokenizer"))
    key = replace(plain, output=work / "key", key_sentences=args.share)
    arms: dict[str, dict[str, list[float]]] = {
        n: {"seconds": [], "cpu_seconds": []} for n in ("plain", "key")
    }
    for cfg in (plain, key):  # untimed: the first use of the tokenizer's import and of scipy
        timed_build(cfg)
    kept = None
    for run in range(args.runs):
        order = (
            (("plain", plain), ("key", key)) if run % 2 == 0 else (("key", key), ("plain", plain))
        )
        for name, cfg in order:
            seconds, cpu, manifest = timed_build(cfg)
            arms[name]["seconds"].append(seconds)
            arms[name]["cpu_seconds"].append(cpu)
            if name == "plain":
                assert corpus_tokens(manifest) == tokens, "the plain builds differ"
            else:
                kept = manifest["key_sentences_kept"]
            shutil.rmtree(cfg.output, ignore_errors=True)
    result: dict = {"corpus": corpus.name, "input_tokens": tokens, "key_sentences_kept": kept}
    for name, arm in arms.items():
        med = statistics.median(arm["seconds"])
        result[name] = {
            **arm,
            "median_seconds": med,
            "min_seconds": min(arm["seconds"]),
            "max_seconds": max(arm["seconds"]),
            "median_tokens_per_s": statistics.median(tokens / s for s in arm["seconds"]),
            "median_cpu_seconds": statistics.median(arm["cpu_seconds"]),
        }
    result["tokens_per_s_ratio"] = (
        result["key"]["median_tokens_per_s"] / result["plain"]["median_tokens_per_s"]
    )
    result["cpu_seconds_ratio"] = (
        result["key"]["median_cpu_seconds"] / result["plain"]["median_cpu_seconds"]
    )
    return result


def report(r: dict, share: float) -> None:
    print(f"{r['corpus']}: {r['input_tokens']:,} input tokens")
    for name in ("plain", "key"):
        a = r[name]
        label = "plain" if name == "plain" else f"--key_sentences {share}"
        print(
            f"  {label:22s} median {a['median_seconds']:6.2f} s (min-max {a['min_seconds']:.2f}"
            f"-{a['max_seconds']:.2f})  {a['median_tokens_per_s'] / 1e6:6.3f} M input tokens/s"
            f"  CPU {a['median_cpu_seconds']:6.2f} s"
        )
    k = r["key_sentences_kept"]
    print(
        f"  key / plain: tokens/s x{r['tokens_per_s_ratio']:.3f}, CPU seconds "
        f"x{r['cpu_seconds_ratio']:.3f}; {k['documents_shortened']:,} of "
        f"{k['documents_over_length']:,} documents over the length shortened, sentences kept "
        f"{k['sentence_share_kept']}, tokens kept {k['token_share_kept']}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.data.key_sentences",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--english", type=Path, default=None, help="text, blank-line documents")
    p.add_argument("--chinese", type=Path, default=None, help="text, one document a line")
    p.add_argument("--runs", type=int, default=5, help="builds of each arm, alternating")
    p.add_argument("--share", type=float, default=0.5, help="--key_sentences R")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shard_docs", type=int, default=1000, help="documents a work unit")
    p.add_argument("--max_seq_len", type=int, default=128)
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.english is None and args.chinese is None:
        p.error("give --english and/or --chinese")
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure each corpus given, print (and --json) the results."""
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(
        f"--workers {args.workers}, --max_seq_len {args.max_seq_len}, {args.runs} runs an arm, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )

    def measured(corpus: Path, one_per_line: bool, scratch: Path) -> dict:
        r = measure(corpus, one_per_line, scratch, args)
        report(r, args.share)
        return r

    results = each_corpus(args, "bench_key_sentences_", measured)
    write_corpus_results(
        args.json,
        {
            "share": args.share,
            "runs": args.runs,
            "workers": args.workers,
            "max_seq_len": args.max_seq_len,
            "shard_docs": args.shard_docs,
        },
        results,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
