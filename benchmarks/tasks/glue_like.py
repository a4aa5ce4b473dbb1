"""A folder in GLUE's layout with an RTE-like and an STS-B-like task, true by construction, from
the pydoc topic pages of CPython (no download).

    python -m benchmarks.tasks.glue_like --out DIR [--train 256] [--dev 64]

Writes ``DIR/RTE/{train,dev}.tsv`` (``index sentence1 sentence2 label``: sentence2 is a run of
words from sentence1, ``entailment``, or from a paragraph of another page, ``not_entailment``,
alternately) and ``DIR/STS-B/{train,dev}.tsv`` (GLUE's ten columns; sentence2 is sentence1 with
a share of its words replaced by words of another paragraph, and the score is 5 x the share
kept). Both read as download_glue_data.py's files do (``python -m pretrain.evaluate --glue DIR``,
``--downstream_eval glue:DIR``), at GLUE's lengths (sentence1 up to 60 words). What they
measure is speed and the plumbing: a model learns them quickly, and they say nothing of GLUE.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from benchmarks.tasks.pydoc_tasks import topic_paragraphs
from bertforge.cli import ArgumentParser
from bertforge.files import write_bytes_atomic

RTE_HEADER = ("index", "sentence1", "sentence2", "label")
STSB_HEADER = (
    "index",
    "genre",
    "filename",
    "year",
    "old_index",
    "source1",
    "source2",
    "sentence1",
    "sentence2",
    "score",
)
MAX_WORDS = 60


def _passages(n: int, seed: int) -> list[tuple[str, list[str]]]:
    """``n`` (page, words) pairs cycling through the pages' paragraphs, shuffled by ``seed``."""
    pages = topic_paragraphs(topics=16, per_topic=200)
    pool = [(page, text.split()[:MAX_WORDS]) for page in pages for text in pages[page]]
    random.Random(seed).shuffle(pool)
    return [pool[i % len(pool)] for i in range(n)]


def rte_rows(n: int, seed: int) -> list[tuple[str, ...]]:
    """RTE-like rows: entailment when sentence2 is a run of sentence1's words."""
    rng, rows = random.Random(seed), []
    passages = _passages(2 * n, seed)
    for i in range(n):
        page, words = passages[i]
        source = words
        label = "entailment"
        if i % 2:
            source = next(w for p, w in passages[n + i :] + passages if p != page)
            label = "not_entailment"
        size = min(len(source), rng.randint(6, 14))
        start = rng.randint(0, len(source) - size)
        rows.append((str(i), " ".join(words), " ".join(source[start : start + size]), label))
    return rows


def stsb_rows(n: int, seed: int) -> list[tuple[str, ...]]:
    """STS-B-like rows: sentence2 keeps a share of sentence1's words, score 5 x that share."""
    rng, rows = random.Random(seed), []
    passages = _passages(2 * n, seed + 1)
    for i in range(n):
        words = passages[i][1][:20]
        other = passages[n + i][1]
        kept = rng.randint(0, len(words))
        swap = set(rng.sample(range(len(words)), len(words) - kept))
        pair = [other[j % len(other)] if j in swap else w for j, w in enumerate(words)]
        score = f"{5.0 * kept / len(words):.3f}"
        meta = ("main-pydoc", "pydoc", "2026", str(i), "none", "none")
        rows.append((str(i), *meta, " ".join(words), " ".join(pair), score))
    return rows


def _tsv(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> bytes:
    return "".join("\t".join(r) + "\n" for r in [header, *rows]).encode("utf-8")


def write_glue_like(out: str | Path, train: int = 256, dev: int = 64, seed: int = 0) -> Path:
    """Write RTE/ and STS-B/ (train and dev) into ``out``; returns ``out``."""
    out = Path(out)
    for task, header, rows in (("RTE", RTE_HEADER, rte_rows), ("STS-B", STSB_HEADER, stsb_rows)):
        every = rows(train + dev, seed)
        (out / task).mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(out / task / "train.tsv", _tsv(header, every[:train]))
        write_bytes_atomic(out / task / "dev.tsv", _tsv(header, every[train:]))
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = ArgumentParser(
        prog="python -m benchmarks.tasks.glue_like",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True)
    p.add_argument("--train", type=int, default=256, help="train examples per task")
    p.add_argument("--dev", type=int, default=64, help="dev examples per task")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(write_glue_like(args.out, args.train, args.dev, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
