"""What the reproducible WordPiece training costs: `data_prep build` (training its vocabulary)
with the workaround of data_prep/tokenizer.py against the upstream trainer alone.

    python -m benchmarks.data.reproducible_vocab \
        --english /work/shared/corpora/tiny-shakespeare.txt \
        --chinese /work/shared/corpora/hongloumeng.txt --runs 5

The workaround (docs/data.md, "What is reproducible") runs the trainer once more, without merges,
to list the `##c` pieces, then trains with them as special tokens. The upstream arm is the same
build with that first pass left out (`continuation_pieces` returns nothing): the trainer then
numbers the pieces itself, in a hash map's order. Per corpus (the English file's blank-line
documents, the Chinese file one document a line): one untimed build of each arm, then `--runs`
builds of each, alternating, so that the load of a shared machine falls on both alike; every build
in this process (`data_prep.build.build`, `--workers W`, a fresh output folder).

Printed per arm: the median wall seconds of the whole build (min-max) and its CPU seconds (this
process and its pool workers, which the load of other jobs does not inflate), the same two of its
vocabulary training alone (CPU: this process, the trainer's threads); the ratios workaround /
upstream; and how many different tokenizer.json files and shard sets each arm wrote (1 is
reproducible).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

from benchmarks.common import each_corpus, write_corpus_results

ARMS = ("upstream", "reproducible")


def cpu_seconds() -> float:
    """User + system seconds of this process and its finished children (the pool's workers)."""
    return sum(
        resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )


def digest(folder: Path, subs: tuple[str, ...]) -> str:
    """sha256 over the files of `subs` under `folder` (names and bytes, in order)."""
    h = hashlib.sha256()
    for sub in subs:
        for p in sorted((folder / sub).rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(folder)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


@contextmanager
def arm(name: str, training: list[tuple[float, float]]):
    """The build's vocabulary training as arm `name` has it, its wall and CPU seconds (this
    process: the trainer's threads) appended to `training`."""
    from bertforge.data_prep import build as build_module
    from bertforge.data_prep import tokenizer

    train = tokenizer.train_wordpiece

    def timed(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.process_time()
        train(*args, **kwargs)
        training.append((time.perf_counter() - t0, time.process_time() - c0))

    with mock.patch.object(build_module, "train_wordpiece", timed):
        if name == "upstream":
            with mock.patch.object(tokenizer, "continuation_pieces", lambda texts, lowercase: []):
                yield
        else:
            yield


def timed_build(cfg, name: str) -> dict:
    """One build of `cfg` into a fresh folder as arm `name`: seconds, CPU seconds, training
    seconds and the digests of its tokenizer and shards."""
    from bertforge.data_prep.build import build

    shutil.rmtree(cfg.output, ignore_errors=True)
    training: list[tuple[float, float]] = []
    with arm(name, training):
        t0, c0 = time.perf_counter(), cpu_seconds()
        build(cfg, argv=["bench_reproducible_vocab"])
        seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    out = {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "training_seconds": training[0][0],
        "training_cpu_seconds": training[0][1],
        "tokenizer": digest(cfg.output, ("tokenizer",)),
        "shards": digest(cfg.output, ("train", "validation")),
    }
    shutil.rmtree(cfg.output, ignore_errors=True)
    return out


def measure(corpus: Path, one_per_line: bool, work: Path, args: argparse.Namespace) -> dict:
    """Upstream and reproducible builds of `corpus`, alternating (see the module doc)."""
    from bertforge.data_prep.build_config import BuildConfig
    from bertforge.data_prep.inputs import InputConfig
    from bertforge.data_prep.sequences import SequenceConfig

    cfg = BuildConfig(
        inputs=(str(corpus),),
        output=work / "shards",
        vocab_size=args.vocab_size,
        sequences=SequenceConfig(max_seq_len=args.max_seq_len),
        input=InputConfig(one_doc_per_line=one_per_line),
        workers=args.workers,
        progress="off",
    )
    for name in ARMS:  # untimed: first imports and pools
        timed_build(cfg, name)
    runs: dict[str, list[dict]] = {name: [] for name in ARMS}
    for run in range(args.runs):
        for name in ARMS if run % 2 == 0 else ARMS[::-1]:
            runs[name].append(timed_build(cfg, name))
    result: dict = {"corpus": corpus.name, "bytes": corpus.stat().st_size}
    for name, rs in runs.items():
        seconds = [r["seconds"] for r in rs]
        result[name] = {
            "runs": rs,
            "median_seconds": statistics.median(seconds),
            "min_seconds": min(seconds),
            "max_seconds": max(seconds),
            "median_training_seconds": statistics.median(r["training_seconds"] for r in rs),
            "median_training_cpu_seconds": statistics.median(r["training_cpu_seconds"] for r in rs),
            "median_cpu_seconds": statistics.median(r["cpu_seconds"] for r in rs),
            "different_tokenizers": len({r["tokenizer"] for r in rs}),
            "different_shards": len({r["shards"] for r in rs}),
        }
    up, rep = result["upstream"], result["reproducible"]
    for key in (
        "median_seconds",
        "median_training_seconds",
        "median_training_cpu_seconds",
        "median_cpu_seconds",
    ):
        result[f"ratio_{key}"] = rep[key] / up[key]
    return result


def report(r: dict) -> None:
    print(f"{r['corpus']} ({r['bytes'] / 1e6:.1f} MB)")
    for name in ARMS:
        a = r[name]
        print(
            f"  {name:12s} build median {a['median_seconds']:6.2f} s (min-max "
            f"{a['min_seconds']:.2f}-{a['max_seconds']:.2f}), CPU {a['median_cpu_seconds']:6.2f} s;"
            f" vocabulary training {a['median_training_seconds']:5.2f} s, CPU "
            f"{a['median_training_cpu_seconds']:5.2f} s; "
            f"{a['different_tokenizers']} different tokenizer.json, "
            f"{a['different_shards']} different shard sets in {len(a['runs'])} builds"
        )
    print(
        f"  reproducible / upstream: build x{r['ratio_median_seconds']:.3f} (CPU "
        f"x{r['ratio_median_cpu_seconds']:.3f}), vocabulary training "
        f"x{r['ratio_median_training_seconds']:.3f} (CPU "
        f"x{r['ratio_median_training_cpu_seconds']:.3f})"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.data.reproducible_vocab",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--english", type=Path, default=None, help="text, blank-line documents")
    p.add_argument("--chinese", type=Path, default=None, help="text, one document a line")
    p.add_argument("--runs", type=int, default=5, help="builds of each arm, alternating")
    p.add_argument("--workers", type=int, default=2)
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
        f"--vocab_size {args.vocab_size}, --workers {args.workers}, {args.runs} runs an arm, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )

    def measured(corpus: Path, one_per_line: bool, scratch: Path) -> dict:
        r = measure(corpus, one_per_line, scratch, args)
        report(r)
        return r

    results = each_corpus(args, "bench_reproducible_vocab_", measured)
    write_corpus_results(
        args.json,
        {
            "runs": args.runs,
            "workers": args.workers,
            "vocab_size": args.vocab_size,
            "max_seq_len": args.max_seq_len,
        },
        results,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
